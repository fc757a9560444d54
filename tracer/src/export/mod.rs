//! Exports. An [`Exporter`] gets what the store already holds, with its
//! row id, on a thread of its own through a bounded channel: the recorder
//! only ever `try_send`s, so a slow or dead exporter costs a counted drop,
//! never a late kill. JSON lines (`jsonl`) is the first exporter.

pub mod families;
pub mod feeds;
pub mod http;
pub mod jsonl;
pub mod otlp;
pub mod pprof;
pub mod prometheus;
pub mod redact;
pub mod torch_snapshot;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError, sync_channel},
    },
    thread::JoinHandle,
};

use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    record::{GpuOomRecord, KillRecord},
    store::EventRow,
    util::time::format_wall,
};

/// Something the store now holds, as exporters see it.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Exported {
    /// A kill, once durable.
    Kill {
        /// Its row id in the store.
        id: i64,
        /// The record.
        record: Box<KillRecord>,
    },
    /// A kill's record completed after it was first stored (the kernel's
    /// report joined: constraint, cgroup paths, task table), once durable.
    KillUpdated {
        /// Its row id in the store.
        id: i64,
        /// The record as it is now.
        record: Box<KillRecord>,
    },
    /// An early warning about a memory cgroup, or its end.
    Pressure {
        /// The event.
        record: Box<crate::record::PressureEvent>,
    },
    /// A CUDA out-of-memory failure, once durable.
    GpuOom {
        /// Its row id in the store.
        id: i64,
        /// The record.
        record: Box<GpuOomRecord>,
    },
}

impl Exported {
    /// This item with the command lines it carries redacted by `r`, or
    /// None when there was nothing to hide.
    pub fn redacted(&self, r: &redact::Redactor) -> Option<Exported> {
        self.map_cmdlines(|l| match r.cmdline(l) {
            std::borrow::Cow::Borrowed(_) => None,
            std::borrow::Cow::Owned(o) => Some(Some(o)),
        })
    }

    /// This item without any command line, or None when it carries none.
    pub fn without_cmdlines(&self) -> Option<Exported> {
        self.map_cmdlines(|_| Some(None))
    }

    /// This item with each command line `l` for which `f(l)` is
    /// `Some(new)` replaced by `new`, or None when none was.
    fn map_cmdlines(&self, f: impl Fn(&str) -> Option<Option<String>>) -> Option<Exported> {
        let line = |c: &mut Option<String>| -> bool {
            let Some(new) = c.as_deref().and_then(&f) else {
                return false;
            };
            *c = new;
            true
        };
        match self {
            Exported::Kill { id, record } | Exported::KillUpdated { id, record } => {
                let mut k = record.clone();
                let mut changed = line(&mut k.victim.cmdline);
                if let Some(s) = &mut k.killer.sender {
                    changed |= line(&mut s.cmdline);
                }
                if let Some(t) = &mut k.trigger {
                    changed |= line(&mut t.task.cmdline);
                }
                let item = match self {
                    Exported::Kill { .. } => Exported::Kill { id: *id, record: k },
                    _ => Exported::KillUpdated { id: *id, record: k },
                };
                changed.then_some(item)
            }
            Exported::GpuOom { id, record } => {
                let mut g = record.clone();
                let mut changed = line(&mut g.process.cmdline);
                for o in &mut g.others {
                    changed |= line(&mut o.process.cmdline);
                }
                changed.then_some(Exported::GpuOom { id: *id, record: g })
            }
            Exported::Pressure { .. } => None,
        }
    }
}

/// A destination for what the recorder stores.
pub trait Exporter: Send + 'static {
    /// Its name, for logs and drop counters.
    fn name(&self) -> &str;
    /// Hands one item on. An error is logged and the item is lost; the
    /// exporter keeps running.
    fn export(&mut self, item: &Exported) -> std::io::Result<()>;
    /// The recorder stops: hands on what it still holds, and says how many
    /// items it lost on its own (a destination that did not take them).
    fn finish(&mut self) -> u64 {
        0
    }
    /// What it has lost if it is left behind at stop (see
    /// [`Exporters::finish`]): the items its destination refused so far and
    /// those handed on and not answered for yet, for an exporter that sends
    /// in batches of its own. None: only what is still queued.
    fn lost_if_left(&self) -> Option<LostIfLeft> {
        None
    }
}

/// Reads what an exporter left behind at stop has lost.
pub type LostIfLeft = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Items offered to an exporter's queue at once, at most.
pub const QUEUE: usize = 1024;

struct Lane {
    name: String,
    tx: SyncSender<Arc<Exported>>,
    dropped: Arc<AtomicU64>,
    /// Items queued or being handed on, not yet done.
    pending: Arc<AtomicU64>,
    /// What it has lost if left behind (see [`Exporter::lost_if_left`]).
    lost_if_left: Option<LostIfLeft>,
    /// Ends with what the exporter lost on its own.
    thread: Option<JoinHandle<u64>>,
}

/// The exporters of a recorder, each on its own thread.
#[derive(Default)]
pub struct Exporters {
    lanes: Vec<Lane>,
    /// How command lines are redacted before they leave (None: sent whole,
    /// `--no-redact`).
    redactor: Option<redact::Redactor>,
}

impl Exporters {
    /// Exporters that get command lines redacted by `r` (None: whole).
    pub fn redacting(r: Option<redact::Redactor>) -> Self {
        Self {
            lanes: Vec::new(),
            redactor: r,
        }
    }

    /// Starts `exporter` on a thread of its own.
    pub fn add(&mut self, mut exporter: Box<dyn Exporter>) -> std::io::Result<()> {
        let (tx, rx) = sync_channel::<Arc<Exported>>(QUEUE);
        let name = exporter.name().to_string();
        let pending = Arc::new(AtomicU64::new(0));
        let left = pending.clone();
        let lost_if_left = exporter.lost_if_left();
        let thread = std::thread::Builder::new()
            .name(format!("export-{name}"))
            .spawn(move || {
                for item in rx {
                    if let Err(e) = exporter.export(&item) {
                        tracing::warn!("exporter {}: {e}", exporter.name());
                    }
                    left.fetch_sub(1, Ordering::Relaxed);
                }
                exporter.finish()
            })?;
        self.lanes.push(Lane {
            name,
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            pending,
            lost_if_left,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Whether there is no exporter (nothing to build items for).
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Offers `item` to every exporter without waiting: a full queue drops
    /// it for that exporter and counts the drop.
    pub fn publish(&self, item: Exported) {
        if self.lanes.is_empty() {
            return;
        }
        let item = match self.redactor.as_ref().and_then(|r| item.redacted(r)) {
            Some(hidden) => Arc::new(hidden),
            None => Arc::new(item),
        };
        for lane in &self.lanes {
            lane.pending.fetch_add(1, Ordering::Relaxed);
            match lane.tx.try_send(item.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    lane.pending.fetch_sub(1, Ordering::Relaxed);
                    lane.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Items each exporter lost (queue full or exporter gone), by name.
    pub fn dropped(&self) -> Vec<(String, u64)> {
        self.lanes
            .iter()
            .map(|l| (l.name.clone(), l.dropped.load(Ordering::Relaxed)))
            .collect()
    }

    /// Closes the queues and waits until `deadline` for the exporters to
    /// hand on what they hold; what each lost (its queue full, its
    /// destination not taking it, or still held at the deadline: an
    /// exporter stuck on a slow destination is left behind, said and
    /// counted, so that it never holds up the stop), by name.
    pub fn finish(mut self, deadline: std::time::Instant) -> Vec<(String, u64)> {
        let mut dropped = self.dropped();
        // Every queue is closed before any is waited for: they drain at
        // once.
        let threads: Vec<_> = self
            .lanes
            .drain(..)
            .map(|mut l| {
                drop(l.tx);
                (l.thread.take(), (l.pending, l.lost_if_left))
            })
            .collect();
        for ((thread, (pending, lost_if_left)), d) in threads.into_iter().zip(dropped.iter_mut()) {
            let Some(t) = thread else { continue };
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if t.is_finished() {
                d.1 += t.join().unwrap_or(0);
            } else {
                let left = pending.load(Ordering::Relaxed) + lost_if_left.map_or(0, |f| f());
                tracing::warn!(
                    "exporter {}: its destination is too slow to take what it holds at stop; {left} item(s) lost",
                    d.0
                );
                d.1 += left;
            }
        }
        dropped
    }
}

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

    /// An exporter that blocks until the test lets it go.
    struct Stuck(std::sync::mpsc::Receiver<()>, Arc<AtomicU64>);
    impl Exporter for Stuck {
        fn name(&self) -> &str {
            "stuck"
        }
        fn export(&mut self, _item: &Exported) -> std::io::Result<()> {
            let _ = self.0.recv();
            self.1.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn kill(id: i64) -> Exported {
        Exported::Kill {
            id,
            record: Box::default(),
        }
    }

    #[test]
    fn a_stuck_exporter_costs_counted_drops_never_a_wait() {
        let (go, gate) = std::sync::mpsc::channel();
        let done = Arc::new(AtomicU64::new(0));
        let mut ex = Exporters::default();
        ex.add(Box::new(Stuck(gate, done.clone()))).unwrap();
        let t0 = std::time::Instant::now();
        let n = QUEUE as i64 + 500;
        for id in 0..n {
            ex.publish(kill(id));
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(1),
            "publishing waited on the exporter"
        );
        let dropped = ex.dropped()[0].1;
        // The exporter holds one item, the queue QUEUE more; the rest drop.
        assert!((499..=500).contains(&dropped), "dropped {dropped}");
        for _ in 0..n {
            let _ = go.send(());
        }
        let dropped = ex.finish(std::time::Instant::now() + std::time::Duration::from_secs(10));
        assert_eq!(
            done.load(Ordering::Relaxed) + dropped[0].1,
            n as u64,
            "each item handed on or counted"
        );
    }

    #[test]
    fn exported_items_say_what_they_are() {
        let v = serde_json::to_value(kill(7)).unwrap();
        assert_eq!(v["type"], "kill");
        assert_eq!(v["id"], 7);
        assert_eq!(v["record"]["killer"]["kind"], "kernel_oom");
    }

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
