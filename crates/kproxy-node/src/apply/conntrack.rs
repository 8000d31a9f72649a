//! Clearing stale conntrack entries: the `conntrack -D` of each stale UDP/SCTP group
//! ([`crate::compare::conntrack::StaleGroup::delete_args`]: protocol, original destination and
//! reply source — never a flush), run after the rules are right, then the same filter listed
//! again to confirm no entry is left (a new entry there means the rules still send new flows to
//! the gone endpoint).
//!
//! [`ConntrackHost`] runs the `conntrack` tool: on this host ([`LocalConntrack`], optionally in a
//! network namespace) or elsewhere. Arguments are argv vectors, never shell strings.

use super::host::{HostError, run_local_output};
use crate::collect::CommandOutput;
use crate::compare::conntrack::{ConntrackCheck, StaleGroup};
use kproxy_parsers::conntrack::{ParseOptions, parse};
use serde::Serialize;

/// Where `conntrack` runs.
pub trait ConntrackHost {
    /// `this host`, `network namespace NAME`, `pod NS/NAME`.
    fn location(&self) -> String;
    /// Runs `conntrack args…`; the exit status and both outputs, whatever the status.
    fn conntrack(&self, args: &[&str]) -> Result<CommandOutput, HostError>;
}

/// `conntrack` on this host, in the network namespace `netns` when given.
#[derive(Debug, Clone, Default)]
pub struct LocalConntrack {
    /// `ip netns exec NAME …`.
    pub netns: Option<String>,
}

impl ConntrackHost for LocalConntrack {
    fn location(&self) -> String {
        match &self.netns {
            Some(ns) => format!("network namespace {ns}"),
            None => "this host".into(),
        }
    }

    fn conntrack(&self, args: &[&str]) -> Result<CommandOutput, HostError> {
        run_local_output(self.netns.as_deref(), "conntrack", args, None)
    }
}

/// The argv of the listing a repair reads the table with.
pub const LIST_ARGS: &[&str] = &["-L", "-o", "extended"];

/// Errors of the conntrack step.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// `conntrack` could not be run.
    #[error("running conntrack on {location}: {source}")]
    Run {
        /// Where.
        location: String,
        /// Why.
        #[source]
        source: HostError,
    },
    /// `conntrack` failed.
    #[error("`conntrack {command}` on {location} failed (exit {code}): {stderr}")]
    Failed {
        /// The arguments.
        command: String,
        /// Where.
        location: String,
        /// Exit status.
        code: i32,
        /// Its stderr, trimmed.
        stderr: String,
    },
    /// The listing could not be parsed.
    #[error("reading the listing of `conntrack {command}` on {location}: {source}")]
    Parse {
        /// The arguments.
        command: String,
        /// Where.
        location: String,
        /// The parse error.
        #[source]
        source: Box<kproxy_parsers::ParseError>,
    },
}

/// Lists the host's whole table (`conntrack -L -o extended`).
pub fn list(host: &impl ConntrackHost) -> Result<String, ConntrackError> {
    let out = run(host, LIST_ARGS)?;
    if out.exit_code != 0 {
        return Err(failed(host, LIST_ARGS, &out));
    }
    Ok(out.stdout)
}

fn run(host: &impl ConntrackHost, args: &[&str]) -> Result<CommandOutput, ConntrackError> {
    host.conntrack(args).map_err(|source| ConntrackError::Run {
        location: host.location(),
        source,
    })
}

fn failed(host: &impl ConntrackHost, args: &[&str], out: &CommandOutput) -> ConntrackError {
    ConntrackError::Failed {
        command: args.join(" "),
        location: host.location(),
        code: out.exit_code,
        stderr: out.stderr.trim().to_string(),
    }
}

/// The count conntrack printed on stderr for `verb` (`… 3 flow entries have been deleted.`).
fn summary_count(stderr: &str, verb: &str) -> Option<u64> {
    let listing = parse(stderr, ParseOptions::lenient()).ok()?;
    listing
        .summaries
        .iter()
        .rev()
        .find(|s| s.verb == verb)
        .map(|s| s.count)
}

/// One planned (and maybe run) deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deletion {
    /// The finding ID of the group (`KP601` …).
    pub id: &'static str,
    /// The service port, when one still has the destination.
    pub service: Option<String>,
    /// `udp 10.96.0.10:53`.
    pub destination: String,
    /// `10.244.1.5:53`.
    pub reply_source: String,
    /// The exact command (`conntrack -D -f ipv4 -p udp --orig-dst … --reply-port-src 53`).
    pub command: String,
    /// Flows the listing had in the group.
    pub flows: usize,
    /// Flows `conntrack -D` said it deleted (after `--apply`).
    pub deleted: Option<u64>,
    /// Flows the same filter lists afterwards (after `--apply`; 0 when clean).
    pub remaining: Option<usize>,
}

impl Deletion {
    fn of(g: &StaleGroup) -> Deletion {
        Deletion {
            id: g.check().id,
            service: g.service.clone(),
            destination: g.destination(),
            reply_source: g.reply_source(),
            command: format!("conntrack {}", g.delete_args().join(" ")),
            flows: g.flows,
            deleted: None,
            remaining: None,
        }
    }
}

/// The conntrack part of a repair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConntrackRepair {
    /// Where the listing came from (a file, `conntrack -L -o extended on this host`).
    pub source: String,
    /// Flows in the listing.
    pub flows: usize,
    /// The deletions (UDP/SCTP stale groups), in finding order.
    pub deletions: Vec<Deletion>,
    /// Stale TCP groups left alone (they end on their own).
    pub tcp_left: usize,
    /// Whether the deletions were run.
    pub applied: bool,
}

impl ConntrackRepair {
    /// The plan for `check` (nothing run yet).
    pub fn plan(source: impl Into<String>, check: &ConntrackCheck) -> ConntrackRepair {
        ConntrackRepair {
            source: source.into(),
            flows: check.flows,
            deletions: check.deletions().map(Deletion::of).collect(),
            tcp_left: check.groups.len() - check.deletions().count(),
            applied: false,
        }
    }

    /// Nothing to delete.
    pub fn is_empty(&self) -> bool {
        self.deletions.is_empty()
    }

    /// Flows the same filters still list after applying (0 when every deletion held).
    pub fn remaining(&self) -> usize {
        self.deletions.iter().filter_map(|d| d.remaining).sum()
    }
}

/// Runs every deletion of `plan` on `host`, then lists each filter again to confirm. A filter
/// that matched nothing any more (the flows expired meanwhile) is not an error.
pub fn apply(
    host: &impl ConntrackHost,
    plan: &mut ConntrackRepair,
    check: &ConntrackCheck,
) -> Result<(), ConntrackError> {
    let groups: Vec<&StaleGroup> = check.deletions().collect();
    for (d, g) in plan.deletions.iter_mut().zip(&groups) {
        let args = g.delete_args();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(host, &argv)?;
        let deleted = summary_count(&out.stderr, "deleted");
        // `conntrack -D` exits 1 when nothing matched ("0 flow entries have been deleted.").
        if out.exit_code != 0 && deleted != Some(0) {
            return Err(failed(host, &argv, &out));
        }
        d.deleted = Some(deleted.unwrap_or(0));
    }
    for (d, g) in plan.deletions.iter_mut().zip(&groups) {
        let args = g.list_args();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(host, &argv)?;
        if out.exit_code != 0 {
            return Err(failed(host, &argv, &out));
        }
        let listing =
            parse(&out.stdout, ParseOptions::strict()).map_err(|source| ConntrackError::Parse {
                command: argv.join(" "),
                location: host.location(),
                source: Box::new(source),
            })?;
        d.remaining = Some(listing.flows.len());
    }
    plan.applied = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_conntrack_stderr() {
        let e = "conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.\n";
        assert_eq!(summary_count(e, "deleted"), Some(3));
        assert_eq!(summary_count(e, "shown"), None);
        assert_eq!(summary_count("oops\n", "deleted"), None);
    }
}
