//! iptables text: `iptables-save` output, `iptables-restore` input, `iptables -S [-v]` listings.
//!
//! Entry points: [`parse_dump`] for a whole input (form auto-detected, [`ParseOptions`] for
//! lenient reading and the table of `-S` input) and [`parse_rule_line`] for one `-A CHAIN …` line.

pub mod ast;
mod code;
mod dump;
pub(crate) mod lexer;
pub mod listing;
mod matches;
mod rule;
mod targets;
mod values;

pub use ast::*;
pub use dump::{
    NameHash, ParseOptions, for_each_rule, infer_spec_table, parse_dump, parse_rule_line,
};
