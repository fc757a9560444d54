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

/// The recorder's files, relative to `tracer/src/recorder`, with their text.
fn recorder_files() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/recorder");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&dir).expect("under recorder");
            (
                rel.display().to_string(),
                fs::read_to_string(f).expect("read source"),
            )
        })
        .collect()
}

/// Code lines of `text` (comments left out), numbered from 1.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(n, l)| (n + 1, l))
}

#[test]
fn features_see_no_store_no_exporter_no_journal_and_no_engine() {
    let files = recorder_files();
    let features: Vec<_> = files
        .iter()
        .filter(|(f, _)| f.starts_with("features/"))
        .collect();
    assert!(features.len() >= 4, "{files:?}");
    let forbidden = [
        "crate::store",
        "crate::export",
        "journal",
        "engine",
        "Store",
        "Exporters",
    ];
    let mut wrong = Vec::new();
    for (f, text) in features {
        for (n, line) in code_lines(text) {
            let words: Vec<&str> = line
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .flat_map(|w| w.split("::"))
                .collect();
            let named = |w: &str| match w.split_once("::") {
                Some((a, b)) => line.contains(&format!("{a}::{b}")),
                None => words.contains(&w),
            };
            for w in forbidden.iter().filter(|w| named(w)) {
                wrong.push(format!("recorder/{f}:{n}: {w}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "features reach past their outputs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn only_the_journal_and_upkeep_write_the_store() {
    // Store writes by name, from the store's own source: every public
    // method that adds, changes or removes rows.
    let store = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut files = Vec::new();
    rust_files(&store, &mut files);
    let prefixes = [
        "insert_",
        "update_",
        "delete_",
        "enforce_",
        "downsample_",
        "import",
        "heartbeat",
        "end_session",
        "start_session",
        "session_",
        "copy_",
        "shed",
        "vacuum",
        "checkpoint",
        "make_room",
        "ensure_reserve",
    ];
    let mut writes = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).expect("read source");
        for l in text.lines() {
            if let Some(rest) = l.trim_start().strip_prefix("pub fn ") {
                let name = ident(rest);
                if prefixes.iter().any(|p| name.starts_with(p)) {
                    writes.push(name.to_string());
                }
            }
        }
    }
    assert!(
        writes.len() >= 10,
        "found only {writes:?}: the scan is broken"
    );
    let mut wrong = Vec::new();
    for (f, text) in recorder_files() {
        if f.starts_with("journal/") || f == "upkeep.rs" {
            continue;
        }
        for (n, line) in code_lines(&text) {
            for w in &writes {
                let call = format!(".{w}(");
                if let Some(i) = line.find(&call)
                    && !line[..i].trim_end().ends_with("journal")
                {
                    wrong.push(format!("recorder/{f}:{n}: {w}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "store writes outside the journal:\n{}",
        wrong.join("\n")
    );
}

/// Files allowed over the bound, and their length (none today: the last
/// ones were split along their seams).
const OVER_900: &[(&str, usize)] = &[];

#[test]
fn no_source_file_grows_past_900_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        let n = fs::read_to_string(f).expect("read source").lines().count();
        let bound = OVER_900
            .iter()
            .find(|(p, _)| *p == rel)
            .map_or(900, |(_, n)| *n);
        if n > bound {
            wrong.push(format!("{rel}: {n} lines (bound {bound})"));
        }
    }
    assert!(wrong.is_empty(), "files too long:\n{}", wrong.join("\n"));
}

/// Two-file import circles inside a folder that are allowed: none. A new
/// one fails the test; one added here must say why.
const CIRCLES: &[&str] = &[];

/// The sibling modules a file names through `super::`.
fn siblings(text: &str, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (_, line) in code_lines(text) {
        let mut from = 0;
        while let Some(i) = line[from..].find("super::") {
            let at = from + i + "super::".len();
            let tail = &line[at..];
            let mut found: Vec<&str> = Vec::new();
            if let Some(group) = tail.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                found.extend(group[..end].split(',').map(|s| ident(s.trim())));
            } else {
                found.push(ident(tail));
            }
            out.extend(
                found
                    .into_iter()
                    .filter(|n| names.iter().any(|x| x == n))
                    .map(String::from),
            );
            from = at;
        }
    }
    out
}

#[test]
fn no_two_files_of_a_folder_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Module name -> (folder, what it names of its siblings).
    let mut by_dir: std::collections::BTreeMap<PathBuf, Vec<(String, String)>> = Default::default();
    for f in &files {
        let (dir, name) = if f.file_name().is_some_and(|n| n == "mod.rs") {
            continue;
        } else {
            (
                f.parent().expect("a folder").to_path_buf(),
                f.file_stem()
                    .and_then(|s| s.to_str())
                    .expect("utf-8")
                    .to_string(),
            )
        };
        by_dir
            .entry(dir)
            .or_default()
            .push((name, fs::read_to_string(f).expect("read source")));
    }
    let mut circles = Vec::new();
    let mut edges = 0;
    for (dir, mods) in &by_dir {
        let names: Vec<String> = mods.iter().map(|(n, _)| n.clone()).collect();
        let uses: Vec<(String, Vec<String>)> = mods
            .iter()
            .map(|(n, t)| (n.clone(), siblings(t, &names)))
            .collect();
        edges += uses.iter().map(|(_, u)| u.len()).sum::<usize>();
        for (a, ua) in &uses {
            for (b, ub) in &uses {
                if a < b && ua.contains(b) && ub.contains(a) {
                    let d = dir.strip_prefix(&src).unwrap_or(dir).display().to_string();
                    circles.push(format!("{d}: {a}.rs <-> {b}.rs"));
                }
            }
        }
    }
    assert!(
        edges > 10,
        "the scan found {edges} sibling imports: it is broken"
    );
    let new: Vec<_> = circles
        .iter()
        .filter(|c| !CIRCLES.contains(&c.as_str()))
        .collect();
    let gone: Vec<_> = CIRCLES
        .iter()
        .filter(|c| !circles.iter().any(|x| x == *c))
        .collect();
    assert!(new.is_empty(), "new import circles: {new:?}");
    assert!(
        gone.is_empty(),
        "circles fixed: take them off CIRCLES: {gone:?}"
    );
}

#[test]
fn the_cli_parses_calls_and_prints() {
    // The loops, the ring readers and the node's files are the recorder's
    // (recorder/live for the live views) and the lower layers'.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 8, "{files:?}");
    let forbidden = ["select!", "read_ring", "\"/proc", "\"/sys"];
    let mut wrong = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).expect("read source");
        for (n, line) in code_lines(&text) {
            for w in forbidden.iter().filter(|w| line.contains(*w)) {
                wrong.push(format!("{}:{n}: {w}", f.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "cli/ does more than parse, call and print:\n{}",
        wrong.join("\n")
    );
}
