//! A small Graphviz DOT writer: nodes, edges and clusters with attributes, escaped correctly.
//! Output is deterministic (insertion order), so it can be snapshot-tested.

use std::fmt::Write;

/// Escapes a string for use inside a double-quoted DOT ID (`"` and `\` escaped, newlines as `\n`).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out
}

fn attrs(list: &[(String, String)]) -> String {
    if list.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = list
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!(" [{}]", inner.join(", "))
}

/// One statement of a graph or cluster body.
#[derive(Debug, Clone)]
enum Stmt {
    Node(String, Vec<(String, String)>),
    Edge(String, String, Vec<(String, String)>),
    Cluster(Cluster),
}

/// A `subgraph cluster_…` box.
#[derive(Debug, Clone)]
pub struct Cluster {
    id: String,
    label: String,
    body: Vec<Stmt>,
}

impl Cluster {
    /// A cluster with an ID (made DOT-safe) and a visible label.
    pub fn new(id: &str, label: &str) -> Self {
        Cluster {
            id: id.to_string(),
            label: label.to_string(),
            body: Vec::new(),
        }
    }

    /// Adds a node with attributes (`label`, `shape`, `color`, …).
    pub fn node(&mut self, id: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.body.push(Stmt::Node(id.to_string(), own(attrs)));
        self
    }

    /// Adds an edge.
    pub fn edge(&mut self, from: &str, to: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.body
            .push(Stmt::Edge(from.to_string(), to.to_string(), own(attrs)));
        self
    }
}

fn own(a: &[(&str, &str)]) -> Vec<(String, String)> {
    a.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A directed graph.
#[derive(Debug, Clone)]
pub struct Digraph {
    name: String,
    graph_attrs: Vec<(String, String)>,
    node_defaults: Vec<(String, String)>,
    body: Vec<Stmt>,
}

impl Digraph {
    /// A graph named `name`, laid out left to right, with box nodes by default.
    pub fn new(name: &str) -> Self {
        Digraph {
            name: name.to_string(),
            graph_attrs: own(&[("rankdir", "LR")]),
            node_defaults: own(&[("shape", "box"), ("fontname", "Helvetica")]),
            body: Vec::new(),
        }
    }

    /// Sets a graph attribute.
    pub fn graph_attr(&mut self, key: &str, value: &str) -> &mut Self {
        self.graph_attrs.push((key.to_string(), value.to_string()));
        self
    }

    /// Adds a node with attributes.
    pub fn node(&mut self, id: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.body.push(Stmt::Node(id.to_string(), own(attrs)));
        self
    }

    /// Adds an edge.
    pub fn edge(&mut self, from: &str, to: &str, attrs: &[(&str, &str)]) -> &mut Self {
        self.body
            .push(Stmt::Edge(from.to_string(), to.to_string(), own(attrs)));
        self
    }

    /// Adds a cluster (drawn as a box around its nodes).
    pub fn cluster(&mut self, c: Cluster) -> &mut Self {
        self.body.push(Stmt::Cluster(c));
        self
    }

    /// The DOT text, ending with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "digraph \"{}\" {{", escape(&self.name));
        for (k, v) in &self.graph_attrs {
            let _ = writeln!(out, "  {k}=\"{}\";", escape(v));
        }
        let _ = writeln!(out, "  node{};", attrs(&self.node_defaults));
        write_body(&mut out, &self.body, 1);
        out.push_str("}\n");
        out
    }
}

fn write_body(out: &mut String, body: &[Stmt], depth: usize) {
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            Stmt::Node(id, a) => {
                let _ = writeln!(out, "{pad}\"{}\"{};", escape(id), attrs(a));
            }
            Stmt::Edge(f, t, a) => {
                let _ = writeln!(
                    out,
                    "{pad}\"{}\" -> \"{}\"{};",
                    escape(f),
                    escape(t),
                    attrs(a)
                );
            }
            Stmt::Cluster(c) => {
                let _ = writeln!(out, "{pad}subgraph \"cluster_{}\" {{", escape(&c.id));
                let _ = writeln!(out, "{pad}  label=\"{}\";", escape(&c.label));
                write_body(out, &c.body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_renders() {
        let mut g = Digraph::new("g");
        let mut c = Cluster::new("ns/svc", "ns/svc:\"p\"");
        c.node("a", &[("label", "A\nb")]);
        g.cluster(c);
        g.edge("a", "b", &[]);
        let s = g.render();
        assert!(s.contains("subgraph \"cluster_ns/svc\" {"), "{s}");
        assert!(s.contains("label=\"ns/svc:\\\"p\\\"\";"), "{s}");
        assert!(s.contains("\"a\" [label=\"A\\nb\"];"), "{s}");
        assert!(s.contains("\"a\" -> \"b\";"), "{s}");
        assert!(s.ends_with("}\n"));
    }
}
