//! `verify --npd`: node-problem-detector's custom-plugin contract (`pkg/custompluginmonitor`):
//! exit 0 when the node is OK, 1 when it has the problem, 2 when the check could not tell
//! (kube-proxy's rules drifted: `KubeProxyRulesDrift`), and one line of at most 80 characters
//! on stdout, which NPD puts in the condition's message. `deploy/npd/` runs it.

use crate::compare::Report;
use crate::exit::Outcome;

/// The longest line NPD keeps (its `max_output_length` default).
pub const MAX_LINE: usize = 80;

/// The line and exit status of a verify that ran.
pub fn report_line(report: &Report) -> (String, Outcome) {
    let s = &report.summary;
    if report.outcome() == Outcome::Clean {
        let line = format!(
            "kube-proxy rules match the API ({} service ports)",
            s.service_ports
        );
        return (fit(&line), Outcome::Clean);
    }
    let first = report
        .findings
        .iter()
        .find(|f| f.severity != crate::compare::Severity::Info)
        .map(|f| format!(" {} {}", f.id, f.service.as_deref().unwrap_or("")))
        .unwrap_or_default();
    let line = format!(
        "drift: {} errors, {} warnings;{}",
        s.errors, s.warnings, first
    );
    (fit(line.trim_end()), Outcome::Drift)
}

/// The line and exit status of a verify that could not run.
pub fn error_line(e: &anyhow::Error) -> (String, Outcome) {
    let first = e.to_string();
    (fit(&format!("unknown: {first}")), Outcome::Error)
}

/// One line of at most [`MAX_LINE`] characters.
fn fit(line: &str) -> String {
    let one: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= MAX_LINE {
        one
    } else {
        let cut: String = one.chars().take(MAX_LINE - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::catalogue as cat;

    #[test]
    fn lines_fit_and_exit_codes_follow_the_contract() {
        let clean = Report::new("n", crate::state::mode::ProxyMode::Iptables, 14, vec![]);
        assert_eq!(
            report_line(&clean),
            (
                "kube-proxy rules match the API (14 service ports)".to_string(),
                Outcome::Clean
            )
        );
        let drift = Report::new(
            "n",
            crate::state::mode::ProxyMode::Iptables,
            14,
            vec![cat::ENDPOINT_MISSING.finding("x").service("shop/web:http")],
        );
        let (line, outcome) = report_line(&drift);
        assert_eq!(outcome, Outcome::Drift);
        assert!(
            line.starts_with("drift: 1 errors, 0 warnings; KP"),
            "{line}"
        );
        let e = anyhow::anyhow!("{}\nsecond line", "x".repeat(200));
        let (line, outcome) = error_line(&e);
        assert_eq!(outcome, Outcome::Error);
        assert_eq!(line.chars().count(), MAX_LINE);
        assert!(!line.contains('\n'));
    }
}
