//! What the heap worker's maps readers do while a sampled process lives:
//! read its maps (again, as it runs), find its interpreter, and take where
//! its perf map is.

use crate::{
    probes::python::PyProcs,
    stacks::{
        maps::Mapping,
        perfmap::Root,
        python::{Detector, Interpreters},
    },
};

/// When a sampled process's maps are read again: 20 ms after the first
/// read, then at doubling intervals up to 10 s, while samples come. The
/// first read may come before the dynamic loader mapped the program's
/// libraries, or between fork and exec; a program loads more as it runs.
pub(super) struct MapsAgain {
    next: std::time::Instant,
    gap: std::time::Duration,
}

impl MapsAgain {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(20);
    const MAX: std::time::Duration = std::time::Duration::from_secs(10);

    pub(super) fn from(now: std::time::Instant) -> Self {
        Self {
            next: now + Self::FIRST,
            gap: Self::FIRST,
        }
    }

    /// Whether a read is due at `now` (and the next one set).
    pub(super) fn due(&mut self, now: std::time::Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.gap = (self.gap * 2).min(Self::MAX);
        self.next = now + self.gap;
        true
    }
}

/// A process's executable mappings, read while it lives, and where its
/// perf map is; `None` when it has ended. With `python`, its interpreter is
/// found too and the programs told, which walk its Python frames from then
/// on.
pub(super) fn first_read(
    pid: u32,
    python: Option<&PyProcs>,
    interpreters: &Interpreters,
    detector: &Detector,
) -> Option<(Vec<Mapping>, Option<Root>)> {
    // An ended process reads as no mappings: nothing to send.
    let maps = crate::stacks::maps::exec_mappings(pid).ok()?;
    if maps.is_empty() {
        return None;
    }
    if let Some(p) = python {
        let found = detector.detect(pid, &maps);
        interpreters.set(pid, &found);
        if let Ok(Some(i)) = &found {
            p.set(pid, &i.layout);
        }
    }
    Some((maps, Root::of(pid)))
}
