//! Exit codes are an API: 0 clean, 1 drift found, 2 could not run.

/// The process outcome of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Nothing to report (or only informational findings).
    Clean = 0,
    /// Drift found (any warning or error finding).
    Drift = 1,
    /// The command could not run.
    Error = 2,
}

impl From<Outcome> for std::process::ExitCode {
    fn from(o: Outcome) -> Self {
        std::process::ExitCode::from(o as u8)
    }
}
