//! kubectl-like tables: no borders, UPPERCASE headers, columns separated by three spaces,
//! left-aligned, never wrapped (lists stack on a narrow terminal, [`KubeTable::render_within`]);
//! `--no-headers` drops the header line.

use comfy_table::{ContentArrangement, Table, presets};

/// A table under construction. Cells are plain strings (already painted if colour is wanted:
/// the width of ANSI sequences is ignored by comfy-table's `custom_styling`-less measurement, so
/// only paint tables whose painter is plain, or accept slightly wider columns).
#[derive(Debug, Clone, Default)]
pub struct KubeTable {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Columns of lists (`a, b` or `a,b`) that [`KubeTable::render_within`] stacks, one item a
    /// line, when the table is wider than the terminal.
    lists: Vec<usize>,
}

impl KubeTable {
    /// A table with these column headers (upper-cased when rendered).
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        KubeTable {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            lists: Vec::new(),
        }
    }

    /// Marks the columns `cols` as lists, which [`KubeTable::render_within`] stacks.
    pub fn lists(&mut self, cols: &[usize]) -> &mut Self {
        self.lists.extend_from_slice(cols);
        self
    }

    /// Appends a row; missing cells are rendered empty, extra cells are kept.
    pub fn row<I, S>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the table has no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Renders the table, one line per row, each line ending in `\n`, trailing spaces trimmed.
    /// An empty table renders as an empty string (kubectl prints "No resources found" on stderr instead).
    pub fn render(&self, no_headers: bool) -> String {
        self.render_within(no_headers, None)
    }

    /// [`KubeTable::render`] for a terminal `width` columns wide: when the table is wider, the
    /// items of its list columns are stacked, one a line, within their cells (no item is cut;
    /// a pipe still gets one line per row).
    pub fn render_within(&self, no_headers: bool, width: Option<usize>) -> String {
        if self.rows.is_empty() {
            return String::new();
        }
        let text = self.render_rows(no_headers, &self.rows);
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        match width {
            Some(w) if widest > w && !self.lists.is_empty() => {
                let stacked: Vec<Vec<String>> = self
                    .rows
                    .iter()
                    .map(|row| {
                        row.iter()
                            .enumerate()
                            .map(|(i, cell)| match self.lists.contains(&i) {
                                true => cell.replace(", ", "\n").replace(',', "\n"),
                                false => cell.clone(),
                            })
                            .collect()
                    })
                    .collect();
                self.render_rows(no_headers, &stacked)
            }
            _ => text,
        }
    }

    fn render_rows(&self, no_headers: bool, rows: &[Vec<String>]) -> String {
        let mut t = Table::new();
        t.load_style(presets::NOTHING);
        t.set_content_arrangement(ContentArrangement::Disabled);
        t.force_no_tty();
        if !no_headers {
            t.set_header(self.headers.iter().map(|h| h.to_uppercase()));
        }
        for r in rows {
            t.add_row(r.clone());
        }
        let ncols = t.column_count();
        for (i, col) in t.column_iter_mut().enumerate() {
            let right = if i + 1 == ncols { 0 } else { 3 };
            col.set_padding((0, right));
        }
        let mut out = String::new();
        for line in t.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_kubectl() {
        let mut t = KubeTable::new(["name", "ready"]);
        t.row(["web", "1/1"]).row(["database-0", "0/1"]);
        assert_eq!(
            t.render(false),
            "NAME         READY\nweb          1/1\ndatabase-0   0/1\n"
        );
        assert_eq!(t.render(true), "web          1/1\ndatabase-0   0/1\n");
    }

    #[test]
    fn lists_stack_when_the_table_is_wider_than_the_terminal() {
        let mut t = KubeTable::new(["name", "endpoints", "masquerade"]);
        t.lists(&[1, 2]);
        t.row([
            "web",
            "10.244.1.10:8080 33.3%, 10.244.1.11:8080 33.3%",
            "hairpin,off-cluster",
        ]);
        let whole = t.render(false);
        assert_eq!(t.render_within(false, Some(200)), whole);
        let narrow = t.render_within(false, Some(60));
        let want = [
            "NAME   ENDPOINTS                MASQUERADE",
            "web    10.244.1.10:8080 33.3%   hairpin",
            "       10.244.1.11:8080 33.3%   off-cluster",
        ];
        assert_eq!(narrow.lines().collect::<Vec<_>>(), want);
    }

    #[test]
    fn empty_table_is_empty() {
        assert_eq!(KubeTable::new(["a"]).render(false), "");
    }
}
