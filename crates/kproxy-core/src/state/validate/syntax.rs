//! The string and number rules of `k8s.io/apimachinery/pkg/util/validation` (`validation.go`)
//! that the API server applies to the objects kube-proxy reads. Each returns why a value is
//! invalid, or `None`; the messages follow apimachinery's.

/// The longest DNS-1123 label (`DNS1123LabelMaxLength`).
pub const LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain (`DNS1123SubdomainMaxLength`).
pub const SUBDOMAIN_MAX: usize = 253;
/// The longest IANA service name (`IsValidPortName`).
pub const PORT_NAME_MAX: usize = 15;

const LABEL_MSG: &str = "must be a lowercase RFC 1123 label: at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit";
const SUBDOMAIN_MSG: &str = "must be a lowercase RFC 1123 subdomain: at most 253 characters of a-z, 0-9, '-' and '.', each dot-separated part starting and ending with a letter or digit";
const PORT_NAME_MSG: &str = "must be an IANA service name: at most 15 characters of a-z, 0-9 and '-', with at least one letter, no '-' first, last or twice in a row";
const QUALIFIED_MSG: &str = "must be a qualified name: an optional DNS subdomain prefix and '/', then at most 63 characters of A-Z, a-z, 0-9, '-', '_' and '.', starting and ending with a letter or digit";
const LABEL_VALUE_MSG: &str = "must be a label value: empty, or at most 63 characters of A-Z, a-z, 0-9, '-', '_' and '.', starting and ending with a letter or digit";
/// `InclusiveRangeError(1, 65535)`.
pub const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

fn lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` without the length limit.
fn label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            lower_alnum(f) && lower_alnum(l) && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// `IsDNS1123Label`: namespaces, Service names (the relaxed rule of current API servers; older
/// ones asked for RFC 1035, which is stricter), port names, endpoint hostnames.
pub fn dns1123_label(s: &str) -> Option<&'static str> {
    (s.len() > LABEL_MAX || !label_shape(s)).then_some(LABEL_MSG)
}

/// `IsDNS1123Subdomain`: EndpointSlice, Node and ServiceCIDR names, node names.
pub fn dns1123_subdomain(s: &str) -> Option<&'static str> {
    (s.len() > SUBDOMAIN_MAX || !s.split('.').all(label_shape)).then_some(SUBDOMAIN_MSG)
}

/// `IsValidPortName` (IANA_SVC_NAME): a Service port's `targetPort` given by name.
pub fn port_name(s: &str) -> Option<&'static str> {
    let b = s.as_bytes();
    let valid = !b.is_empty()
        && b.len() <= PORT_NAME_MAX
        && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && !s.contains("--")
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-');
    (!valid).then_some(PORT_NAME_MSG)
}

/// `IsValidPortNum`.
pub fn port_number(n: i32) -> Option<&'static str> {
    (!(1..=65535).contains(&n)).then_some(PORT_RANGE_MSG)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters (empty is no match).
fn qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= LABEL_MAX
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter()
            .all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

/// `IsQualifiedName`: label keys, `appProtocol`.
pub fn qualified_name(s: &str) -> Option<&'static str> {
    let valid = match s.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty() && dns1123_subdomain(prefix).is_none() && qualified_part(name)
        }
        None => qualified_part(s),
    };
    (!valid).then_some(QUALIFIED_MSG)
}

/// `IsValidLabelValue`: label values, topology zone hints.
pub fn label_value(s: &str) -> Option<&'static str> {
    (!s.is_empty() && !qualified_part(s)).then_some(LABEL_VALUE_MSG)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases of apimachinery's `validation_test.go`, and the names of the injections.
    #[test]
    fn apimachinery_cases() {
        for good in [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "1-2",
            "a".repeat(63).as_str(),
        ] {
            assert_eq!(dns1123_label(good), None, "{good}");
        }
        for bad in [
            "",
            "A",
            "ABC",
            "aBc",
            "A1",
            "a-1-",
            "-a",
            "a.b",
            "a_b",
            "a b",
            "a\n-A INPUT",
            &"a".repeat(64),
        ] {
            assert!(dns1123_label(bad).is_some(), "{bad:?}");
        }
        for good in ["a.b", "a.b.c", "1.2.3", "a-1.b-2", &"a".repeat(253)] {
            assert_eq!(dns1123_subdomain(good), None, "{good}");
        }
        for bad in [
            "",
            "a..b",
            ".a",
            "a.",
            "A.b",
            "a_b",
            "a.-b",
            &"a".repeat(254),
        ] {
            assert!(dns1123_subdomain(bad).is_some(), "{bad:?}");
        }
        for good in [
            "telnet",
            "re-mail-ck",
            "pop3",
            "a",
            "a-1",
            "1-a",
            "a-1-b-2-c",
            "1-a-2-b-3",
        ] {
            assert_eq!(port_name(good), None, "{good}");
        }
        for bad in [
            "",
            "a".repeat(16).as_str(),
            "Port",
            "1234",
            "-a",
            "a-",
            "a--b",
            "a_b",
            "a b",
            ":MYCHAIN",
        ] {
            assert!(port_name(bad).is_some(), "{bad:?}");
        }
        for (n, ok) in [
            (0, false),
            (1, true),
            (65535, true),
            (65536, false),
            (-1, false),
            (99999, false),
        ] {
            assert_eq!(port_number(n).is_none(), ok, "{n}");
        }
        for good in [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "example.com/Uppercase_And.Dots",
            "kubernetes.io/service-name",
            "a/b",
        ] {
            assert_eq!(qualified_name(good), None, "{good}");
        }
        for bad in [
            "",
            "/simple",
            "simple/",
            "nospecialchars%^=@",
            "Tama-nui-te-rā.com/ea",
            "a/b/c",
            "-x",
            "x-",
            &"a".repeat(64),
        ] {
            assert!(qualified_name(bad).is_some(), "{bad:?}");
        }
        for good in [
            "",
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "end-with-num-1",
            "1234",
            "Upper_Case.1",
        ] {
            assert_eq!(label_value(good), None, "{good}");
        }
        for bad in [
            "nospecialchars%^=@",
            "Tama-nui-te-rā",
            "a b",
            "-x",
            "x\"y",
            &"a".repeat(64),
        ] {
            assert!(label_value(bad).is_some(), "{bad:?}");
        }
    }
}
