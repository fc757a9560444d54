//! The JSON-lines exporter: one line per stored kill or GPU OOM, with its
//! row id, appended to a file (created 0600, never through a link).

use std::{
    io::{BufWriter, Write},
    path::Path,
};

use super::{Exported, Exporter};

/// Appends one JSON object per line to a file.
pub struct JsonLines {
    out: BufWriter<std::fs::File>,
}

impl JsonLines {
    /// Opens `path` for appending (creating it 0600; links and other
    /// users' files are refused).
    pub fn open(path: &Path) -> Result<Self, crate::util::fsafe::UnsafePath> {
        use std::io::Seek as _;
        let mut f = crate::util::fsafe::open_private(path)?;
        f.seek(std::io::SeekFrom::End(0))
            .map_err(|source| crate::util::fsafe::UnsafePath::Io {
                path: path.into(),
                source,
            })?;
        Ok(Self {
            out: BufWriter::new(f),
        })
    }
}

impl Exporter for JsonLines {
    fn name(&self) -> &str {
        "jsonl"
    }

    fn export(&mut self, item: &Exported) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, item)?;
        self.out.write_all(b"\n")?;
        // A line is whole on disk before the next item: readers tail it.
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_one_line_per_item() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kills.jsonl");
        std::fs::write(&path, "{\"earlier\":1}\n").unwrap();
        let mut j = JsonLines::open(&path).unwrap();
        for id in [1, 2] {
            j.export(&Exported::Kill {
                id,
                record: Box::default(),
            })
            .unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "appended: {text}");
        assert_eq!(lines[2]["id"], 2);
        assert_eq!(lines[2]["type"], "kill");
    }
}
