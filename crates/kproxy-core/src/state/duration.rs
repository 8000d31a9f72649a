//! Durations as kube-proxy's configuration and kubectl write them: Go's `time.ParseDuration`
//! syntax (`500ms`, `1s`, `1m`, `1h2m`, `1.5s`, `0`), the one parser of every duration the
//! tools read. kube-proxy decodes its `metav1.Duration` fields with `time.ParseDuration`, so a
//! value it rejects is rejected here too, with the reason, never read as zero.

use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a duration ({reason}; e.g. 500ms, 30s, 1m, 1h2m)")]
pub struct DurationError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a Go duration: an optional `+`, then one or more decimal numbers (with an optional
/// fraction) each followed by a unit `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m` or `h`; a lone `0`
/// is zero. Negative durations are refused (no setting the tools read takes one).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let bad = |reason| DurationError {
        text: text.to_string(),
        reason,
    };
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(bad("negative"));
    }
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(bad("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("a number without a unit"))?;
        let (number, tail) = rest.split_at(digits);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad("a unit without a number"));
        }
        let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad("unknown unit")),
        };
        total += Duration::try_from_secs_f64(value * seconds_per_unit)
            .map_err(|_| bad("out of range"))?;
        rest = next;
    }
    Ok(total)
}

/// Formats a duration as Go prints one, for messages: `1m30s`, `500ms`, `0s`.
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        let ms = d.as_secs_f64() * 1000.0;
        return if ms.fract() == 0.0 {
            format!("{ms}ms")
        } else {
            format!("{ms:.3}ms")
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let frac = d.subsec_millis();
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac > 0 {
        out.push_str(&format!("{s}.{frac:03}s"));
    } else {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms() {
        let ok = |t: &str| parse(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1s"), Duration::from_secs(1));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("1h2m"), Duration::from_secs(3720));
        assert_eq!(ok("1h2m3s"), Duration::from_secs(3723));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("+30s"), Duration::from_secs(30));
        assert_eq!(ok("250us"), Duration::from_micros(250));
        assert_eq!(ok("250µs"), Duration::from_micros(250));
        assert_eq!(ok("10ns"), Duration::from_nanos(10));
    }

    #[test]
    fn bad_input_is_an_error_not_zero() {
        for t in [
            "", "5", "30", "s", "5x", "1d", "-1s", "1..5s", ".s", "ms5", "1 s",
        ] {
            let e = parse(t).expect_err(t);
            assert!(e.to_string().contains("is not a duration"), "{t}: {e}");
        }
    }

    #[test]
    fn formats_as_go_prints() {
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::from_millis(2500)), "2.500s");
    }
}
