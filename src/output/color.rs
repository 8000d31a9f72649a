//! The colour policy, in one place: colour only when stdout is a terminal and `NO_COLOR` is unset
//! (or empty). Everything that styles text goes through a [`Painter`] obtained here, so piped output,
//! files and `NO_COLOR=1` are always plain.

use owo_colors::OwoColorize;
use std::io::IsTerminal;

/// Whether text written to stdout should be coloured: stdout is a TTY and `NO_COLOR` is unset or empty.
pub fn stdout_enabled() -> bool {
    !no_color() && std::io::stdout().is_terminal()
}

/// Whether text written to stderr (warnings, errors) should be coloured: the same policy.
pub fn stderr_enabled() -> bool {
    !no_color() && std::io::stderr().is_terminal()
}

fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// What a piece of text means; the palette maps it to a style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Healthy / as expected (green).
    Ok,
    /// Worth attention (yellow).
    Warn,
    /// Broken / traffic dropped or rejected (red, bold).
    Error,
    /// Secondary detail: rule lines, counters (dimmed).
    Dim,
    /// Names the eye should find: services, chains (bold).
    Strong,
    /// Addresses and ports (cyan).
    Addr,
}

/// Applies (or, when disabled, does not apply) styles. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Painter {
    enabled: bool,
}

impl Painter {
    /// A painter following the policy for stdout ([`stdout_enabled`]).
    pub fn for_stdout() -> Self {
        Painter {
            enabled: stdout_enabled(),
        }
    }

    /// A painter following the policy for stderr ([`stderr_enabled`]).
    pub fn for_stderr() -> Self {
        Painter {
            enabled: stderr_enabled(),
        }
    }

    /// A painter that never colours (tests, files, machine output).
    pub fn plain() -> Self {
        Painter { enabled: false }
    }

    /// A painter that always colours (only for tests of the coloured form).
    pub fn forced() -> Self {
        Painter { enabled: true }
    }

    /// Whether this painter emits ANSI styles.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// `text` styled for `role`, or unchanged when colour is off.
    pub fn paint(&self, role: Role, text: &str) -> String {
        if !self.enabled {
            return text.to_string();
        }
        match role {
            Role::Ok => text.green().to_string(),
            Role::Warn => text.yellow().to_string(),
            Role::Error => text.red().bold().to_string(),
            Role::Dim => text.dimmed().to_string(),
            Role::Strong => text.bold().to_string(),
            Role::Addr => text.cyan().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_painter_leaves_text_alone() {
        assert_eq!(Painter::plain().paint(Role::Error, "x"), "x");
    }

    #[test]
    fn forced_painter_emits_ansi() {
        let s = Painter::forced().paint(Role::Ok, "x");
        assert!(s.contains("\u{1b}["), "{s:?}");
        assert!(s.contains('x'));
    }
}
