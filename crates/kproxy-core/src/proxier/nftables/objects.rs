//! The objects kube-proxy adds to its table (knftables `Table`, `Chain`, `Set`, `Map`, `Rule`,
//! `Element`) and their text: one `add …` line each, exactly as knftables writes them for
//! `nft -f` and as kube-proxy's tests compare them (knftables `objects.go` `writeOperation`).

use serde::Serialize;
use std::fmt;

/// The table family: `ip` or `ip6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TableFamily {
    /// IPv4.
    Ip,
    /// IPv6.
    Ip6,
}

impl TableFamily {
    /// `ip` / `ip6`.
    pub fn as_str(self) -> &'static str {
        match self {
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
        }
    }
}

/// A name written as prefix + base (`endpoint-` + `HASH-…`), so per-endpoint names are not
/// allocated for every object that mentions them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Name<'a> {
    /// `endpoint-`, `service-`, … or "" for a whole name.
    pub prefix: &'a str,
    /// The rest.
    pub base: &'a str,
}

impl<'a> Name<'a> {
    /// A name given whole.
    pub fn whole(name: &'a str) -> Name<'a> {
        Name {
            prefix: "",
            base: name,
        }
    }

    /// `prefix` + `base`.
    pub fn prefixed(prefix: &'a str, base: &'a str) -> Name<'a> {
        Name { prefix, base }
    }

    fn push_to(self, out: &mut String) {
        out.push_str(self.prefix);
        out.push_str(self.base);
    }
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix)?;
        f.write_str(self.base)
    }
}

impl Serialize for Name<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A base chain's type, hook and (numeric) priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BaseChain {
    /// `filter` or `nat`.
    #[serde(rename = "type")]
    pub chain_type: &'static str,
    /// `prerouting`, `input`, `forward`, `output` or `postrouting`.
    pub hook: &'static str,
    /// knftables writes symbolic priorities as numbers (`dstnat - 10` → -110).
    pub priority: i32,
}

/// One object of the table, borrowed from the emitter's buffers.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "add", rename_all = "lowercase")]
pub enum Object<'a> {
    /// The table.
    Table {
        /// The table comment.
        comment: &'a str,
    },
    /// A chain (regular, or base when `base` is set).
    Chain {
        /// Chain name.
        name: Name<'a>,
        /// Type, hook and priority of a base chain.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        base: Option<BaseChain>,
        /// Chain comment.
        #[serde(skip_serializing_if = "Option::is_none")]
        comment: Option<&'a str>,
    },
    /// A set.
    Set {
        /// Set name.
        name: Name<'a>,
        /// Element type (`ipv4_addr`).
        #[serde(rename = "type")]
        set_type: &'a str,
        /// Flags (`dynamic`, `timeout`).
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        flags: &'a [&'a str],
        /// Element timeout in seconds.
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_seconds: Option<i32>,
        /// Set comment.
        #[serde(skip_serializing_if = "Option::is_none")]
        comment: Option<&'a str>,
    },
    /// A verdict map.
    Map {
        /// Map name.
        name: &'a str,
        /// `key types : verdict`.
        #[serde(rename = "type")]
        map_type: &'a str,
        /// Map comment.
        #[serde(skip_serializing_if = "Option::is_none")]
        comment: Option<&'a str>,
    },
    /// A named counter (1.37: the localhost NodePort reject counters).
    Counter {
        /// Counter name.
        name: &'a str,
    },
    /// A rule appended to a chain.
    Rule {
        /// The chain.
        chain: Name<'a>,
        /// The rule text (tokens joined by single spaces).
        rule: &'a str,
        /// Rule comment.
        #[serde(skip_serializing_if = "Option::is_none")]
        comment: Option<&'a str>,
    },
    /// A set or map element.
    Element {
        /// The set or map.
        container: &'a str,
        /// Key fields joined with ` . ` (kube-proxy's `joinNFTSlice`).
        key: &'a str,
        /// Map value (a verdict), `None` for a set element.
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<&'a str>,
        /// Element comment.
        #[serde(skip_serializing_if = "Option::is_none")]
        comment: Option<&'a str>,
    },
}

/// Appends `s` quoted as Go's `%q` does for the text kube-proxy writes (printable ASCII kept,
/// `\` escaped, anything else as `\xNN` / `\u` escapes), except `"`: nft reads a quoted string
/// up to the next `"` and knows no escapes, so `\"` would end it and let the rest of the value
/// be read as commands; it is written as the visible text `\x22` instead.
pub fn push_go_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\x22"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (' '..='~').contains(&c) => out.push(c),
            c if (c as u32) < 0x80 => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if !c.is_control() => out.push(c),
            c => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
        }
    }
    out.push('"');
}

impl Object<'_> {
    /// Appends the `add …` line (with its newline) for table `family kube-proxy`.
    pub fn push_line(&self, family: TableFamily, out: &mut String) {
        let head = |out: &mut String, what: &str| {
            out.push_str("add ");
            out.push_str(what);
            out.push(' ');
            out.push_str(family.as_str());
            out.push(' ');
            out.push_str(super::names::TABLE);
        };
        match *self {
            Object::Table { comment } => {
                head(out, "table");
                out.push_str(" { comment ");
                push_go_quoted(out, comment);
                out.push_str(" ; }");
            }
            Object::Chain {
                name,
                base,
                comment,
            } => {
                head(out, "chain");
                out.push(' ');
                name.push_to(out);
                if base.is_some() || comment.is_some() {
                    out.push_str(" {");
                    if let Some(b) = base {
                        out.push_str(" type ");
                        out.push_str(b.chain_type);
                        out.push_str(" hook ");
                        out.push_str(b.hook);
                        out.push_str(" priority ");
                        crate::state::ip::push_int(out, i64::from(b.priority));
                        out.push_str(" ;");
                    }
                    if let Some(c) = comment {
                        out.push_str(" comment ");
                        push_go_quoted(out, c);
                        out.push_str(" ;");
                    }
                    out.push_str(" }");
                }
            }
            Object::Set {
                name,
                set_type,
                flags,
                timeout_seconds,
                comment,
            } => {
                head(out, "set");
                out.push(' ');
                name.push_to(out);
                out.push_str(" { type ");
                out.push_str(set_type);
                out.push_str(" ;");
                if !flags.is_empty() {
                    out.push_str(" flags ");
                    for (i, f) in flags.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(f);
                    }
                    out.push_str(" ;");
                }
                if let Some(t) = timeout_seconds {
                    out.push_str(" timeout ");
                    crate::state::ip::push_int(out, i64::from(t));
                    out.push_str("s ;");
                }
                if let Some(c) = comment {
                    out.push_str(" comment ");
                    push_go_quoted(out, c);
                    out.push_str(" ;");
                }
                out.push_str(" }");
            }
            Object::Map {
                name,
                map_type,
                comment,
            } => {
                head(out, "map");
                out.push(' ');
                out.push_str(name);
                out.push_str(" { type ");
                out.push_str(map_type);
                out.push_str(" ;");
                if let Some(c) = comment {
                    out.push_str(" comment ");
                    push_go_quoted(out, c);
                    out.push_str(" ;");
                }
                out.push_str(" }");
            }
            Object::Counter { name } => {
                head(out, "counter");
                out.push(' ');
                out.push_str(name);
            }
            Object::Rule {
                chain,
                rule,
                comment,
            } => {
                head(out, "rule");
                out.push(' ');
                chain.push_to(out);
                out.push(' ');
                out.push_str(rule);
                if let Some(c) = comment {
                    out.push_str(" comment ");
                    push_go_quoted(out, c);
                }
            }
            Object::Element {
                container,
                key,
                value,
                comment,
            } => {
                head(out, "element");
                out.push(' ');
                out.push_str(container);
                out.push_str(" { ");
                out.push_str(key);
                if let Some(c) = comment {
                    out.push_str(" comment ");
                    push_go_quoted(out, c);
                }
                if let Some(v) = value {
                    out.push_str(" : ");
                    out.push_str(v);
                }
                out.push_str(" }");
            }
        }
        out.push('\n');
    }
}

/// Receives the objects of a render in order.
pub trait Sink {
    /// One more object.
    fn add(&mut self, object: Object<'_>);
}

/// Writes `add …` lines to a writer; the first write error is kept and later objects are
/// dropped.
pub struct TextSink<W: std::io::Write> {
    family: TableFamily,
    out: W,
    line: String,
    error: Option<std::io::Error>,
}

impl<W: std::io::Write> TextSink<W> {
    /// Lines for table `family kube-proxy` into `out`.
    pub fn new(family: TableFamily, out: W) -> TextSink<W> {
        TextSink {
            family,
            out,
            line: String::with_capacity(512),
            error: None,
        }
    }

    /// The writer back, or the first write error.
    pub fn finish(self) -> std::io::Result<W> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.out),
        }
    }
}

impl<W: std::io::Write> Sink for TextSink<W> {
    fn add(&mut self, object: Object<'_>) {
        if self.error.is_some() {
            return;
        }
        self.line.clear();
        object.push_line(self.family, &mut self.line);
        if let Err(e) = self.out.write_all(self.line.as_bytes()) {
            self.error = Some(e);
        }
    }
}

/// Appends `add …` lines to a string.
pub struct StringSink {
    /// The table family written.
    pub family: TableFamily,
    /// The lines so far.
    pub text: String,
}

impl Sink for StringSink {
    fn add(&mut self, object: Object<'_>) {
        object.push_line(self.family, &mut self.text);
    }
}

/// Collects each object's JSON form (the `-o json` document's `objects`).
#[derive(Debug, Default)]
pub struct JsonSink {
    /// The objects so far.
    pub objects: Vec<serde_json::Value>,
}

impl Sink for JsonSink {
    fn add(&mut self, object: Object<'_>) {
        let mut v = serde_json::to_value(object).unwrap_or(serde_json::Value::Null);
        // Keys and values as their fields (`["10.0.0.1", "tcp", "80"]`), as knftables holds them.
        if let (Object::Element { key, .. }, Some(map)) = (object, v.as_object_mut()) {
            map.insert("key".into(), key.split(" . ").collect::<Vec<_>>().into());
        }
        self.objects.push(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(o: Object<'_>) -> String {
        let mut s = String::new();
        o.push_line(TableFamily::Ip, &mut s);
        s
    }

    #[test]
    fn knftables_text() {
        assert_eq!(
            line(Object::Table {
                comment: "rules for kube-proxy"
            }),
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n"
        );
        assert_eq!(
            line(Object::Chain {
                name: Name::whole("nat-output"),
                base: Some(BaseChain {
                    chain_type: "nat",
                    hook: "output",
                    priority: -100
                }),
                comment: None
            }),
            "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }\n"
        );
        assert_eq!(
            line(Object::Set {
                name: Name::prefixed("affinity-", "X"),
                set_type: "ipv4_addr",
                flags: &["dynamic", "timeout"],
                timeout_seconds: Some(10800),
                comment: None
            }),
            "add set ip kube-proxy affinity-X { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n"
        );
        assert_eq!(
            line(Object::Element {
                container: "no-endpoint-nodeports",
                key: "tcp . 3001",
                value: Some("drop"),
                comment: Some("ns2/svc2:p80")
            }),
            "add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment \"ns2/svc2:p80\" : drop }\n"
        );
        let mut q = String::new();
        push_go_quoted(&mut q, "a\"b\\c\u{1}é");
        assert_eq!(q, "\"a\\x22b\\\\c\\x01é\"");
    }
}
