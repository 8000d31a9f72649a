//! The iptables mode's comparison: [`run::verify`] is the whole of `verify` for one node —
//! [`nodewide`] checks on the parsed dump (KP0xx), [`graph_level`] per service port against the
//! service graph (KP1xx–KP4xx) from what the API implies ([`expected`]), and [`rule_level`] per
//! chain against `render` (KP9xx), each reporting only what the previous level has not explained.

pub mod expected;
pub mod graph_level;
pub mod nodewide;
pub mod rule_level;
pub mod run;
pub mod scope;

pub use run::{
    DumpText, NodePlans, ReleaseCheck, VerifyError, VerifyInput, WriterRelease, verify,
    verify_release,
};
