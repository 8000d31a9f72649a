//! Text and JSON renderings of simulation results.
//!
//! Kernel model JSON: `{"model": "kernel", "packet", "from", "outcomes": [{"probability",
//! "dnat", "verdict" (`ACCEPT`, `DROP`, `REJECT`, or `UNKNOWN` past a statement of kube-proxy's
//! this build does not know, named by `decided_by`: then `dnat` is only what happened before it,
//! and `masquerade`/`snat` are not concluded), "decided_by", "route", "masquerade", "snat",
//! "mark", "path": [{"step":
//! "table/chain#n", "result": "matched"|"skipped"|"policy", "probability"?, "rule", "because"?}]}],
//! "notes": […]}`. Test model JSON: exactly `{"output", "masq"}`.

use super::outcome::{Distribution, Outcome, Route, Step, StepResult, TestTrace, Verdict};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::net::IpAddr;

/// `ip:port`, or `[ip6]:port`.
pub fn socket_text(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V6(a) => format!("[{a}]:{port}"),
        IpAddr::V4(a) => format!("{a}:{port}"),
    }
}

fn result_name(r: &StepResult) -> &'static str {
    match r {
        StepResult::Matched | StepResult::MatchedRandom(_) => "matched",
        StepResult::Skipped { .. } | StepResult::SkippedRandom(_) => "skipped",
        StepResult::Policy => "policy",
    }
}

/// Why a step was skipped: the failing criterion (and why it was undecidable), or the dice.
fn because(step: &Step<'_, '_>) -> Option<String> {
    match step.result {
        StepResult::Skipped { at, undecidable } => {
            let what = step.rule.and_then(|r| r.describe(at)).unwrap_or_default();
            Some(match undecidable {
                Some(why) => format!("{what} (undecidable: {why})"),
                None => format!("{what} does not match"),
            })
        }
        StepResult::SkippedRandom(p) => Some(format!("statistic did not fire (p={p:.4})")),
        _ => None,
    }
}

fn step_json(step: &Step<'_, '_>) -> Value {
    let mut v = json!({
        "step": step.location(),
        "result": result_name(&step.result),
    });
    if let Some(rule) = step.rule {
        v["rule"] = json!(rule.text());
    }
    if let Some(policy) = step.policy {
        v["policy"] = json!(policy);
    }
    if let StepResult::MatchedRandom(p) | StepResult::SkippedRandom(p) = step.result {
        v["probability"] = json!(p);
    }
    if let Some(b) = because(step) {
        v["because"] = json!(b);
    }
    v
}

fn outcome_json(o: &Outcome<'_, '_>) -> Value {
    json!({
        "probability": o.probability,
        "dnat": o.dnat.map(|(ip, port)| socket_text(ip, port)),
        "verdict": o.verdict,
        "decided_by": o.decided_by,
        "route": o.route,
        "masquerade": o.masquerade,
        "snat": o.snat.map(|ip| ip.to_string()),
        "mark": format!("{:#x}", o.mark),
        "path": o.path.iter().map(step_json).collect::<Vec<_>>(),
    })
}

/// The kernel model's result as JSON.
pub fn distribution_json(d: &Distribution<'_, '_>) -> Value {
    json!({
        "model": "kernel",
        "packet": d.packet.to_string(),
        "from": d.origin.name(),
        "outcomes": d.outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
        "notes": d.notes,
    })
}

/// A one-line summary of an outcome.
pub fn outcome_summary(o: &Outcome<'_, '_>) -> String {
    let mut s = format!("{:>7.3}%  ", o.probability * 100.0);
    if o.verdict == Verdict::Unknown {
        // Nothing past the statement is concluded: neither the DNAT nor the masquerade.
        if let Some((ip, port)) = o.dnat {
            s += &format!("DNAT {}, then ", socket_text(ip, port));
        }
        s += "UNKNOWN";
        if let Some(by) = &o.decided_by {
            s += &format!(" past {by}: a statement this build does not know");
        }
        return s;
    }
    match o.dnat {
        Some((ip, port)) => s += &format!("DNAT {}", socket_text(ip, port)),
        None => s += "no DNAT",
    }
    s += &format!("  {}", o.verdict.name());
    if let Some(route) = o.route {
        s += match route {
            Route::Local => " (delivered locally)",
            Route::Forward => " (forwarded)",
            Route::Output => " (sent)",
        };
    }
    if let Some(by) = &o.decided_by {
        s += &format!(" by {by}");
    }
    match (o.masquerade, o.snat) {
        (true, Some(ip)) => s += &format!("  masquerade to {ip}"),
        (true, None) => s += "  masquerade",
        (false, Some(ip)) => s += &format!("  SNAT to {ip}"),
        (false, None) => s += "  not masqueraded",
    }
    s
}

/// The kernel model's result as text: a summary line per outcome, then each path with runs of
/// skipped rules in one chain folded into one line.
pub fn distribution_text(d: &Distribution<'_, '_>) -> String {
    let mut out = String::new();
    let n = d.outcomes.len();
    let _ = writeln!(
        out,
        "packet {} from {} (model kernel): {n} outcome{}",
        d.packet,
        d.origin.name(),
        if n == 1 { "" } else { "s" }
    );
    for (i, o) in d.outcomes.iter().enumerate() {
        let _ = writeln!(out, "  #{:<3} {}", i + 1, outcome_summary(o));
    }
    if !d.notes.is_empty() {
        let _ = writeln!(out, "notes:");
        for note in &d.notes {
            let _ = writeln!(out, "  - {note}");
        }
    }
    for (i, o) in d.outcomes.iter().enumerate() {
        let _ = writeln!(out, "\noutcome #{} ({:.3}%):", i + 1, o.probability * 100.0);
        write_path(&mut out, &o.path);
    }
    out
}

fn write_path(out: &mut String, path: &[Step<'_, '_>]) {
    let mut i = 0;
    while let Some(step) = path.get(i) {
        let plain_skip = matches!(
            step.result,
            StepResult::Skipped {
                undecidable: None,
                ..
            }
        );
        // Fold a run of ordinary skips in one chain.
        let mut j = i + 1;
        if plain_skip {
            while path.get(j).is_some_and(|s| {
                matches!(
                    s.result,
                    StepResult::Skipped {
                        undecidable: None,
                        ..
                    }
                ) && s.table == step.table
                    && s.chain == step.chain
            }) {
                j += 1;
            }
        }
        if j - i > 1 {
            let last = path.get(j - 1).map_or(step.number, |s| s.number);
            let _ = writeln!(
                out,
                "  {:<44} skipped  ({} rules)",
                format!("{}/{}#{}-#{last}", step.table, step.chain, step.number),
                j - i
            );
        } else {
            let label = match step.result {
                StepResult::MatchedRandom(p) => format!("matched (p={p:.4})"),
                StepResult::SkippedRandom(p) => format!("skipped (p={p:.4})"),
                StepResult::Policy => format!("policy {}", step.policy.unwrap_or("ACCEPT")),
                _ => result_name(&step.result).to_string(),
            };
            let text = step.rule.map(|r| r.text()).unwrap_or_default();
            let mut line = format!("  {:<44} {label:<8} {text}", step.location());
            if let Some(b) =
                because(step).filter(|_| !matches!(step.result, StepResult::SkippedRandom(_)))
            {
                let _ = write!(line, "  [{b}]");
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        i = j;
    }
}

/// The test model's result as JSON: exactly `{"output", "masq"}`.
pub fn test_trace_json(t: &TestTrace) -> Value {
    json!({ "output": t.output, "masq": t.masq })
}

/// The test model's result as text.
pub fn test_trace_text(t: &TestTrace) -> String {
    let mut out = format!(
        "output: {}\nmasq: {}\n",
        if t.output.is_empty() {
            "(none)"
        } else {
            &t.output
        },
        t.masq
    );
    if !t.matched.is_empty() {
        let _ = writeln!(out, "matched rules: {}", t.matched.join(", "));
    }
    out
}
