//! An Xid line with its meaning (the catalogue is
//! `collect::kmsg::catalogue`), as `explain --xid` shows it.

use serde::Serialize;

use crate::collect::kmsg::Xid;
pub use crate::collect::kmsg::catalogue::{Meaning, meaning, meaning_of};

/// An Xid with its meaning, as `explain --xid` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Explained {
    /// The line, read.
    #[serde(flatten)]
    pub xid: Xid,
    /// Wall time, ns since the epoch, when the log gives it.
    pub wall_ns: Option<i64>,
    /// Whether its line had no time stamp at all.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub untimed: bool,
    /// The host that logged it, when the log names it.
    pub host: Option<String>,
    /// Its meaning (None: not in tracer's table).
    pub meaning: Option<Meaning>,
}

/// One line of text for `x`.
pub fn render(e: &Explained) -> String {
    let x = &e.xid;
    let when = match e.wall_ns {
        Some(ns) => crate::util::time::format_wall(ns),
        None if e.untimed => "[time not known]".to_string(),
        None => format!("{:.6} s after boot", x.ts_us as f64 / 1e6),
    };
    let host = e
        .host
        .as_deref()
        .map(|h| format!(" on {h}"))
        .unwrap_or_default();
    let kind = if x.sxid { "SXid" } else { "Xid" };
    let who = match (&x.name, x.pid) {
        (Some(n), Some(p)) => format!(", process {n} (pid {p})"),
        (None, Some(p)) => format!(", pid {p}"),
        _ => String::new(),
    };
    let meaning = match &e.meaning {
        Some(m) => {
            let hit = match m.apps_affected {
                Some(true) => " Applications on it were hit.",
                Some(false) => " No application was hit.",
                None => "",
            };
            format!("{}.{hit} Usual action: {}.", m.what, m.action)
        }
        None => format!(
            "not in tracer's table: see NVIDIA's Xid catalogue for {kind} {}",
            x.code
        ),
    };
    crate::util::term::escape_invisible(&format!(
        "{when}{host}: GPU {} {kind} {}{who}: {meaning}\n    {}\n",
        x.pci, x.code, x.message
    ))
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::kmsg::catalogue::TABLE;

    #[test]
    fn known_codes_have_a_meaning_and_others_say_so() {
        let x = |code, sxid| Xid {
            code,
            sxid,
            pci: "0000:3b:00".into(),
            ..Default::default()
        };
        let fell = meaning(&x(79, false)).unwrap();
        assert!(fell.what.contains("fallen off the bus"));
        assert_eq!(fell.apps_affected, Some(true));
        assert_eq!(meaning(&x(63, false)).unwrap().apps_affected, Some(false));
        assert_eq!(meaning(&x(9999, false)), None);
        assert!(meaning(&x(12028, true)).unwrap().what.contains("NVSwitch"));
        // One entry per code.
        let mut codes: Vec<u32> = TABLE.iter().map(|(c, _)| *c).collect();
        codes.dedup();
        assert_eq!(codes.len(), TABLE.len());
        let text = render(&Explained {
            xid: x(4242, false),
            wall_ns: None,
            untimed: true,
            host: None,
            meaning: None,
        });
        assert!(text.starts_with("[time not known]"), "{text}");
        assert!(text.contains("not in tracer's table"), "{text}");
    }
}
