//! nom parsers for the text that kube-proxy nodes print: `iptables-save`/`iptables-restore` input/
//! `iptables -S`, `ipvsadm` listings and save form, `ipset` save/list output, nftables
//! rulesets (`nft list` text, `nft -j` JSON, `nft -f` command lines), `conntrack -L` listings and
//! `/proc/net/nf_conntrack`, and the pastes that wrap them.
//!
//! This crate knows grammar and nothing of Kubernetes. Parsers are zero-copy over `&str`; errors carry
//! `line:col`, what was expected and what was found, and never expose nom types.
#![deny(missing_docs)]

pub mod conntrack;
pub mod error;
pub mod input;
pub mod ip_addr;
pub mod ipset;
pub mod iptables;
pub mod ipvsadm;
pub mod nft;
pub mod paste;

pub use error::ParseError;
