//! The module graph is one-way: each top-level module of `tracer/src` may
//! import only modules that come before it in [`ORDER`] (the data flow of
//! ../shared/ARCHITECTURE.md). An import that points back up fails here,
//! naming the file and line.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// The layers, first to last. A module may use itself and any module before it.
const ORDER: &[&str] = &[
    "util",
    "probes",
    "collect",
    "model",
    "stacks",
    "nvml",
    "record",
    "correlate",
    "store",
    "export",
    "recorder",
    "explain",
    "report",
    "cli",
];

/// Macros exported at the crate root, and the layer that defines them.
const MACROS: &[(&str, &str)] = &[("say", "util")];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("read src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules a line of code names through `crate::`, including
/// the items of a `use crate::{a::.., b, c::{..}}` group (which may span
/// lines: `rest` is the text from the line on).
fn imports(rest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let line_end = rest.find('\n').unwrap_or(rest.len());
    let mut from = 0;
    while let Some(i) = rest[from..line_end].find("crate::") {
        let at = from + i + "crate::".len();
        let tail = &rest[at..];
        if let Some(group) = tail.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 1 => {
                        out.push(ident(&group[j..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(tail).to_string());
        }
        from = at;
    }
    out
}

#[test]
fn no_module_imports_one_that_comes_after_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("utf-8 path")
            .trim_end_matches(".rs");
        if top == "lib" || top == "main" {
            continue;
        }
        let layer = ORDER
            .iter()
            .position(|m| *m == top)
            .unwrap_or_else(|| panic!("{} is in no layer of ORDER", rel.display()));
        let text = fs::read_to_string(f).expect("read source");
        let mut offset = 0;
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if !code.starts_with("//") {
                for m in imports(&text[offset..]) {
                    seen += 1;
                    let m = MACROS
                        .iter()
                        .find(|(name, _)| *name == m)
                        .map_or(m.as_str(), |(_, layer)| layer);
                    match ORDER.iter().position(|x| *x == m) {
                        Some(l) if l <= layer => {}
                        Some(_) => wrong.push(format!(
                            "{}:{}: {top} imports {m}, which comes after it",
                            rel.display(),
                            n + 1
                        )),
                        None => wrong.push(format!(
                            "{}:{}: crate::{m} is in no layer of ORDER",
                            rel.display(),
                            n + 1
                        )),
                    }
                }
            }
            offset += line.len() + 1;
        }
    }
    assert!(
        seen > 50,
        "the scan found only {seen} imports: it is broken"
    );
    assert!(
        wrong.is_empty(),
        "imports that point back up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_scan_reads_groups_and_paths() {
    assert_eq!(imports("use crate::store::Store;"), ["store"]);
    assert_eq!(
        imports(
            "use crate::{\n    collect::{a, b},\n    model::X,\n    util::{time::Clock, units::bytes},\n};"
        ),
        ["collect", "model", "util"]
    );
    assert_eq!(
        imports("let x = crate::util::sys::page_kb() + crate::model::y();"),
        ["util", "model"]
    );
}

#[test]
fn the_correlators_are_pure() {
    // Time and /proc come in through `correlate::Context`; the store, the
    // probes and explain are the recorder's and the CLI's business.
    let forbidden = [
        "crate::probes",
        "crate::store",
        "crate::explain",
        "std::fs",
        "fs::read",
        "wall_now_ns",
        "Instant::now",
        "SystemTime::now",
        "read_status_mem",
        "proc::read",
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/correlate");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 4, "{files:?}");
    let mut wrong = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).expect("read source");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for word in forbidden.iter().filter(|w| line.contains(*w)) {
                wrong.push(format!("{}:{}: {word}", f.display(), n + 1));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "correlate reads the world:\n{}",
        wrong.join("\n")
    );
}
