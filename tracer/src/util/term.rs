//! Text that is safe to print on a terminal.
//!
//! Process names, command lines, cgroup and library paths are chosen by
//! whoever runs the process: a name such as `\e]0;pwn\a\e[2J` would retitle
//! and clear the admin's terminal, and a newline would forge a line of a
//! report. Every such string goes through [`escape`] before text output;
//! JSON output keeps the exact bytes (JSON escapes control characters).

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is: C0 and C1 controls, DEL,
/// and the invisible format characters: the bidirectional marks,
/// overrides and isolates that reorder what is shown (U+202E makes pid
/// 20660 read 06602), zero-width spaces and joiners, invisible operators,
/// the byte order mark and the interlinear annotation marks.
fn is_hostile(c: char) -> bool {
    c.is_control() || is_invisible_format(c)
}

/// Unicode's invisible format characters (category Cf, as far as they
/// change or hide what is shown).
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// `s` (a whole HTML page, a multi-line text) with every invisible format
/// character and every control but newline, tab and carriage return
/// written as a visible escape, as [`escape`] does; `s` itself when it
/// has none.
pub fn escape_invisible(s: &str) -> Cow<'_, str> {
    let keep = |c: char| matches!(c, '\n' | '\t' | '\r');
    if !s.chars().any(|c| is_hostile(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut buf = [0u8; 4];
    for c in s.chars() {
        if keep(c) {
            out.push(c);
        } else {
            out.push_str(&escape(c.encode_utf8(&mut buf)));
        }
    }
    Cow::Owned(out)
}

/// `s` with every hostile character written as a visible escape (`\n`,
/// `\t`, `\r`, `\e`, `\x07`, `\u{202e}`); `s` itself when it has none.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hostile) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            c if (c as u32) < 0x100 && is_hostile(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if is_hostile(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Escapes every string (and object key) in a JSON value, in place.
pub fn escape_json(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if let Cow::Owned(e) = escape(s) {
                *s = e;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(escape_json),
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut val) in old {
                escape_json(&mut val);
                m.insert(escape(&k).into_owned(), val);
            }
        }
        _ => {}
    }
}

/// A copy of `v` with every string in it escaped for a terminal: what text
/// renderers are given, so no field of a record can slip through unescaped.
pub fn printable<T: serde::Serialize + serde::de::DeserializeOwned>(v: T) -> T {
    let Ok(mut json) = serde_json::to_value(&v) else {
        return v;
    };
    escape_json(&mut json);
    serde_json::from_value(json).unwrap_or(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escape("python3 train.py"), Cow::Borrowed(_)));
        assert!(matches!(escape("naïve/日本"), Cow::Borrowed(_)));
        assert_eq!(escape("\x1b]0;pwn\x07\x1b[2J"), "\\e]0;pwn\\x07\\e[2J");
        assert_eq!(escape("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(escape("x\u{9b}31m\x7f"), "x\\x9b31m\\x7f");
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
    }

    #[test]
    fn every_string_of_a_value_is_escaped() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct R {
            comm: String,
            path: Option<String>,
            tags: std::collections::BTreeMap<String, u32>,
            n: u64,
        }
        let r = R {
            comm: "a\x1b[2Jb".into(),
            path: Some("/x\ny".into()),
            tags: [("k\x07".to_string(), 1)].into(),
            n: u64::MAX,
        };
        let p = printable(r);
        assert_eq!(p.comm, "a\\e[2Jb");
        assert_eq!(p.path.as_deref(), Some("/x\\ny"));
        assert_eq!(p.tags.keys().next().unwrap(), "k\\x07");
        assert_eq!(p.n, u64::MAX);
    }
}
