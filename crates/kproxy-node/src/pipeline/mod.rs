//! Each job kproxy does on a node, as library calls: [`verify::verify_node`] decides the proxy
//! mode ([`mode`]), the kube-proxy release ([`release`]) and the node facts, runs the comparison
//! of that mode, checks the conntrack table ([`conntrack`]) and returns the report; `repair`
//! and `resync` take the mode they write from [`mode::for_writing`] and the release from
//! [`release::choose`]; `trace`'s path view shows a node's rules against [`trace::plan`]. The
//! command line, the watch mode and fleet verification call the same functions with the inputs
//! they read.
//!
//! Nothing here reads a file, runs a program or calls the API: the API state and the node's
//! dumps come in (read by [`crate::collect`] or by the caller), and what the user should be told
//! goes out as [`Note`]s, in order, for the caller to show or drop. Every call stands alone:
//! no state is kept between calls.
//!
//! ```text
//! NodeSnapshot + API state ──mode──▶ ProxyMode ──compare (per mode) + conntrack──▶ Report
//! ```

pub mod conntrack;
mod ipvs;
pub mod mode;
pub mod release;
pub mod trace;
pub mod verify;

use mode::ModeDecision;

/// Something a job tells its caller besides its result, in the order it came up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A problem with an input worth showing (the command line prints `warning: …`).
    Warning(String),
    /// How something the result depends on was chosen: the kube-proxy release compared with
    /// (the command line prints `note: …`).
    Choice(String),
    /// A line of an input skipped under lenient reading (the command line logs it).
    Skipped(String),
    /// The mode the job worked in, and why (the command line logs it).
    Mode(ModeDecision),
    /// The kube-proxy release the job worked with (the watch mode labels its metrics with it).
    Release(crate::state::version::KubeProxyVersion),
}

/// An input's text and the name messages give it (a path, or `COMMAND (COLLECTOR)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedText {
    /// The text.
    pub text: String,
    /// Its name.
    pub label: String,
}
