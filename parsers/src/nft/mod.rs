//! nftables rulesets: `nft list` text, `nft -j` JSON and `nft -f` command lines, read into one
//! typed tree ([`Ruleset`]) and printed back as the command lines kube-proxy writes.
//!
//! # Input forms
//!
//! [`parse`] detects the form (JSON when the first non-blank character is `{`, else text):
//!
//! 1. **Listings** (`nft list ruleset`, `nft list table ip kube-proxy`, `nft -a list …`): nested
//!    `table { chain { … } set { … } map { … } }` blocks in any indentation; `# handle N` comments
//!    give [`Rule::handle`] and friends; `# Warning: table ip nat is managed by iptables-nft, do
//!    not touch!` sets [`Table::managed_by_iptables_nft`]; the `xt match`/`xt target` forms of
//!    iptables-nft tables, including nft's `# Warning: XT target DNAT not found` + next-line
//!    `xt target "DNAT"`, are [`Stmt::Xt`]. `define`s are ignored with a warning.
//! 2. **JSON** (`nft -j list …`, libnftables-json schema 1): objects map to the same tree;
//!    command objects (`{"add": {"rule": …}}`) apply as in command input.
//! 3. **Command lines** (`nft -f` input; knftables' transactions and kube-proxy's test dumps):
//!    `add table|chain|set|map|rule|element …`, `insert`/`replace rule`, `flush`, `delete`,
//!    `destroy`, applied in order. Dumps that are not in loadable order (rules before their
//!    chain's `add chain`) create what they use, with a [`Warning`].
//!
//! Statements and expressions are typed ([`Stmt`], [`Expr`]); a statement the grammar does not
//! model is kept as [`Stmt::Verbatim`] (the rest of the rule's text, or the statement's JSON),
//! never an error. Errors carry `line:col` ([`ParseError`], with the file name added by
//! [`ParseError::in_source`]); with [`ParseOptions::lenient`] a line or block that does not parse
//! is recorded in [`Ruleset::skipped`] and reading goes on (an unterminated block at the end of a
//! cut paste becomes a warning). Nesting of sets and parentheses is limited to 32 levels per
//! statement, so hostile input cannot exhaust the stack; memory stays proportional to the input.
//!
//! # Equality across forms
//!
//! Parsing already reads constants by value (`0x00004000`, `0x4000`, `16384` and JSON `16384`
//! are one [`Expr::Number`]), `mark` and `meta mark` as one [`Expr::Meta`], `and`/`&`,
//! `or`/`|`, `xor`/`^` as one [`BinOp`], an implicit relation, `==` and JSON `in` as
//! [`RelOp::Eq`], priorities as numbers (`dstnat - 10` = `-110`), and time values as durations
//! (`3h` = `10800s` = JSON `10800`). [`Ruleset::normalize`] then removes what differs between
//! what kube-proxy writes, what `nft list` prints and what `nft -j` prints:
//!
//! * handles, source lines, counter values (`counter packets 0 bytes 0` → `counter`), element
//!   `expires`, element counter values and the values of named counters (`counter c { packets
//!   0 bytes 0 }`) are cleared;
//! * table and chain comments are dropped (`nft -j` 1.0.6 does not print them), and so is the
//!   iptables-nft mark of a table;
//! * a base chain without a policy gets `policy accept` (the kernel default nft lists); its
//!   `device` is dropped (`nft -j` 1.0.6 does not print it);
//! * the set flag `dynamic` and set `size` are dropped (JSON omits `dynamic`; the kernel adds
//!   `size 65535` to dynamic sets); `typeof ip daddr` becomes `type ipv4_addr` where nft names
//!   the type (JSON has no `typeof`);
//! * elements of sets, maps and anonymous sets are sorted (the kernel lists them in its own
//!   order) and a one-element anonymous set on the right of a match becomes its element
//!   (`ip daddr { 172.30.0.0/16 }` is listed `ip daddr 172.30.0.0/16`);
//! * `meta l4proto tcp th dport 80` becomes `tcp dport 80` (as nft lists it);
//! * `reject with icmp port-unreachable` (`icmpv6` in `ip6`, `icmpx` in `inet`) becomes
//!   `reject`, `log level warn` becomes `log`, `dnat ip to …` in an `ip` table becomes
//!   `dnat to …` (kube-proxy's `dnat ip addr . port to … map { … }` is read as `dnat ip to …`:
//!   nft takes address and port from the map's values and lists it so); NAT flags and flag
//!   lists (`established,related`) are sorted;
//! * tables, chains, sets and objects are sorted by name; rule order is kept.
//!
//! Not equal after normalising: iptables-nft tables (text shows translated statements, JSON
//! `xt` objects), statements kept verbatim (text vs JSON spelling), `typeof` of expressions nft
//! has no type name for.
//!
//! # Printing
//!
//! `Display` of [`Rule`], [`Stmt`], [`Expr`] and [`Element`] gives the knftables text
//! (`mark and 0x4000 == 0 return`, `numgen random mod 2 vmap { 0 : goto A , 1 : goto B }`);
//! `Display` of [`Ruleset`] (and [`Table::write_commands`]) gives `add …` command lines in the
//! order of knftables' fake dump, which `nft -f` loads. Printing then parsing gives the same
//! tree.

pub mod ast;
mod build;
mod decl;
mod dump;
mod expr;
mod json;
mod lexer;
mod normalize;
mod print;
mod text;
mod values;

#[cfg(test)]
mod tests;

pub use ast::*;

use crate::error::ParseError;
use lexer::{Kind, Lexer};

/// How to read an input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseOptions {
    /// Skip lines and blocks that do not parse (shell prompts, cut pastes, `....`), recording
    /// each in [`Ruleset::skipped`], instead of failing; an input that ends inside a block is a
    /// warning instead of an error.
    pub lenient: bool,
}

impl ParseOptions {
    /// Strict parsing (the default).
    pub fn strict() -> Self {
        ParseOptions::default()
    }

    /// Lenient parsing.
    pub fn lenient() -> Self {
        ParseOptions { lenient: true }
    }
}

/// Parses a ruleset in any of the three forms (see the module doc).
pub fn parse<'a>(text: &'a str, opts: &ParseOptions) -> Result<Ruleset<'a>, ParseError> {
    let body = text.trim_start_matches('\u{feff}');
    if body.trim_start().starts_with('{') {
        json::parse_json(body, opts)
    } else {
        text::parse_text(body, opts)
    }
}

/// Parses one rule's text (what follows `add rule FAMILY TABLE CHAIN`, or one line of a
/// listing, optionally with `# handle N`). Only an unterminated string is an error; statements
/// that are not modelled become [`Stmt::Verbatim`].
pub fn parse_rule(text: &str) -> Result<Rule<'_>, ParseError> {
    let mut lex = Lexer::new(text);
    let mut toks = Vec::new();
    let mut handle = None;
    while let Some(t) = lex.next_token().map_err(|f| text::to_error(text, f))? {
        match t.kind {
            Kind::Newline => {}
            Kind::Comment => handle = text::handle_of(t.raw).or(handle),
            _ => toks.push(t),
        }
    }
    let (stmts, comment) = expr::rule_body(&toks, text);
    Ok(Rule {
        stmts,
        comment,
        handle,
        line: 1,
    })
}
