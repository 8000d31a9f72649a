//! nom parsers for the text that kube-proxy nodes print: `iptables-save`/`iptables-restore` input/
//! `iptables -S`, `ipvsadm` listings and save form, `ipset` save/list output, and nftables
//! rulesets (`nft list` text, `nft -j` JSON, `nft -f` command lines).
//!
//! This crate knows grammar and nothing of Kubernetes. Parsers are zero-copy over `&str`; errors carry
//! `line:col`, what was expected and what was found, and never expose nom types.
#![deny(missing_docs)]

pub mod error;
pub mod ipset;
pub mod iptables;
pub mod ipvsadm;
pub mod nft;

pub use error::ParseError;
