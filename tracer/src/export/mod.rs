//! Exports: JSON lines for scripts.

use serde_json::{Value, json};

use crate::{store::EventRow, util::time::format_wall};

/// One event as a flat JSON object: time, kind, task, then the kind's fields.
pub fn event_json(r: &EventRow) -> Value {
    let mut v = json!({
        "time": format_wall(r.ts_ns),
        "ts_ns": r.ts_ns,
        "kind": r.kind,
        "pid": r.pid,
        "tid": r.tid,
        "comm": r.comm,
    });
    if let (Some(obj), Some(data)) = (v.as_object_mut(), r.data.as_object()) {
        for (k, val) in data {
            obj.insert(k.clone(), val.clone());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_details() {
        let r = EventRow {
            ts_ns: 1_700_000_000_000_000_000,
            kind: "exit".into(),
            pid: 5,
            tid: 6,
            comm: "sh".into(),
            data: json!({"pid": 5}),
        };
        let v = event_json(&r);
        assert_eq!(v["kind"], "exit");
        assert_eq!(v["time"], "2023-11-14T22:13:20.000Z");
        assert_eq!(v["tid"], 6);
    }
}
