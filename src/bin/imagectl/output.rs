//! The three ways `imagectl` prints an answer (`-o table|json|yaml`), and
//! the plain table every table view is drawn with.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::ValueEnum;
use comfy_table::{CellAlignment, Table};
use imaged::error::AppError;
use serde::Serialize;

/// `-o`: how answers are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable tables and lines.
    Table,
    /// JSON: the answer's message with the API's field names (events: one
    /// object per line).
    Json,
    /// YAML: the same document as JSON (events: one document each).
    Yaml,
}

/// Set once stdout's reader has gone (`imagectl … | head`).
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// A failed write to the output, as the error to report.
pub fn out(e: std::io::Error) -> AppError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
    AppError::Other(format!("writing output: {e}"))
}

/// Whether a write failed because nobody reads stdout any more: not worth
/// an error message (the reader stopped on purpose, as `head` does).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

fn encoding(what: &str, e: impl std::fmt::Display) -> AppError {
    AppError::Other(format!("encoding the answer as {what}: {e}"))
}

impl Format {
    /// Whether this format is a document (JSON or YAML) rather than a table.
    pub fn is_document(self) -> bool {
        self != Format::Table
    }

    /// Prints `value` as one JSON (indented) or YAML document; nothing for
    /// [`Format::Table`] (the caller draws its own).
    pub fn document<T: Serialize + ?Sized>(self, value: &T, o: &mut impl Write) -> Result<(), AppError> {
        match self {
            Format::Table => Ok(()),
            Format::Json => {
                let text = serde_json::to_string_pretty(value).map_err(|e| encoding("JSON", e))?;
                writeln!(o, "{text}").map_err(out)
            }
            Format::Yaml => {
                let text = serde_yaml_ng::to_string(value).map_err(|e| encoding("YAML", e))?;
                o.write_all(text.as_bytes()).map_err(out)
            }
        }
    }

    /// Prints `value` as one item of a stream: a JSON object on one line,
    /// or a YAML document opened by `---`.
    pub fn stream_item<T: Serialize + ?Sized>(self, value: &T, o: &mut impl Write) -> Result<(), AppError> {
        match self {
            Format::Table => Ok(()),
            Format::Json => {
                let text = serde_json::to_string(value).map_err(|e| encoding("JSON", e))?;
                writeln!(o, "{text}").map_err(out)
            }
            Format::Yaml => {
                let text = serde_yaml_ng::to_string(value).map_err(|e| encoding("YAML", e))?;
                write!(o, "---\n{text}").map_err(out)
            }
        }
    }
}

/// A table as kubectl and crictl print them: upper-case headers, columns
/// three spaces apart, no borders, no wrapping (so `awk` can read it).
pub struct Plain {
    table: Table,
}

impl Plain {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Self {
        let mut table = Table::new();
        table.load_style(comfy_table::presets::NOTHING);
        table.set_header(header.to_vec());
        let last = header.len().saturating_sub(1);
        for (i, column) in table.column_iter_mut().enumerate() {
            column.set_padding((0, if i == last { 0 } else { 3 }));
        }
        Plain { table }
    }

    /// Right-aligns the columns at these indexes (sizes, counts).
    pub fn right(mut self, columns: &[usize]) -> Self {
        for &i in columns {
            if let Some(c) = self.table.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        self
    }

    /// Adds a row.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<comfy_table::Cell>,
    {
        self.table.add_row(cells.into_iter().map(Into::into).collect::<Vec<comfy_table::Cell>>());
    }

    /// Writes the table (header included) without trailing blanks.
    pub fn write(&self, o: &mut impl Write) -> Result<(), AppError> {
        for line in self.table.lines() {
            writeln!(o, "{}", line.trim_end()).map_err(out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    #[test]
    fn tables_are_plain_aligned_columns() {
        let mut t = Plain::new(&["IMAGE ID", "SIZE", "TAGS"]).right(&[1]);
        t.row(["abc", "4.3MB", "busybox:1.36"]);
        t.row(["defdefdef", "12B", "<none>"]);
        let mut o = Vec::new();
        t.write(&mut o).unwrap();
        assert_eq!(
            String::from_utf8(o).unwrap(),
            "IMAGE ID     SIZE   TAGS\nabc         4.3MB   busybox:1.36\ndefdefdef     12B   <none>\n"
        );
    }

    #[test]
    fn documents_and_stream_items() {
        #[derive(Serialize)]
        struct Doc {
            name: &'static str,
            size: u64,
        }
        let doc = Doc { name: "a", size: 3 };
        let mut o = Vec::new();
        Format::Json.document(&doc, &mut o).unwrap();
        assert_eq!(String::from_utf8(o).unwrap(), "{\n  \"name\": \"a\",\n  \"size\": 3\n}\n");
        let mut o = Vec::new();
        Format::Yaml.document(&doc, &mut o).unwrap();
        assert_eq!(String::from_utf8(o).unwrap(), "name: a\nsize: 3\n");
        let mut o = Vec::new();
        Format::Json.stream_item(&doc, &mut o).unwrap();
        Format::Yaml.stream_item(&doc, &mut o).unwrap();
        assert_eq!(String::from_utf8(o).unwrap(), "{\"name\":\"a\",\"size\":3}\n---\nname: a\nsize: 3\n");
        let mut o = Vec::new();
        Format::Table.document(&doc, &mut o).unwrap();
        assert!(o.is_empty());
    }
}
