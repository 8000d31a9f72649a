//! Expected vs actual, into findings: one module per proxy mode ([`iptables`], [`ipvs`],
//! [`nftables`]) beside what every mode shares — the [`finding`] type and [`report`], the
//! [`catalogue`] of every check, the folding of mass drift ([`grouping`]), which release wrote
//! the rules ([`version`]), the objects the API state left out ([`left_out`]) and the node's
//! flows ([`conntrack`]).

pub mod catalogue;
pub mod conntrack;
pub mod finding;
pub mod grouping;
pub mod iptables;
pub mod ipvs;
pub mod left_out;
pub mod nftables;
pub mod report;
pub mod version;

#[cfg(test)]
mod fixture;

pub use finding::{Finding, Severity};
pub use report::{Report, Summary};
