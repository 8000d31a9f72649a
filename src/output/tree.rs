//! An indented tree printer in the style of `tree(1)`: `├── `, `└── `, `│   `.
//! Labels may be multi-line (continuation lines are indented under their node) and may carry
//! ANSI styles from a [`crate::output::color::Painter`].

/// A node of a printable tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeNode {
    /// The node's text (may contain `\n` for detail lines).
    pub label: String,
    /// Child nodes, printed in order.
    pub children: Vec<TreeNode>,
}

impl TreeNode {
    /// A leaf.
    pub fn new(label: impl Into<String>) -> Self {
        TreeNode {
            label: label.into(),
            children: Vec::new(),
        }
    }

    /// Adds a child and returns `self` (builder style).
    pub fn with(mut self, child: TreeNode) -> Self {
        self.children.push(child);
        self
    }

    /// Adds a child in place and returns a mutable reference to it.
    pub fn push(&mut self, child: TreeNode) -> &mut TreeNode {
        self.children.push(child);
        let last = self.children.len() - 1;
        &mut self.children[last]
    }

    /// Renders the tree; the root label is printed flush left. Ends with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut lines = self.label.lines();
        if let Some(first) = lines.next() {
            out.push_str(first);
            out.push('\n');
        }
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
        render_children(&self.children, "", &mut out);
        out
    }
}

fn render_children(children: &[TreeNode], prefix: &str, out: &mut String) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, cont) = if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        let mut lines = child.label.lines();
        let first = lines.next().unwrap_or("");
        out.push_str(prefix);
        out.push_str(branch);
        out.push_str(first);
        out.push('\n');
        let child_prefix = format!("{prefix}{cont}");
        let detail_bar = if child.children.is_empty() {
            "    "
        } else {
            "│   "
        };
        for l in lines {
            out.push_str(&child_prefix);
            out.push_str(detail_bar);
            out.push_str(l);
            out.push('\n');
        }
        render_children(&child.children, &child_prefix, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_branches() {
        let t = TreeNode::new("root")
            .with(TreeNode::new("a").with(TreeNode::new("a1")))
            .with(TreeNode::new("b\ndetail"));
        assert_eq!(
            t.render(),
            "root\n├── a\n│   └── a1\n└── b\n        detail\n"
        );
    }
}
