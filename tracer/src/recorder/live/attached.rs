//! The probes a live view attaches in one process, as its files appear:
//! a uprobe family's (CUDA, the heap) and caching allocators' USDT probes.

use std::collections::HashSet;

use anyhow::bail;

use crate::{
    probes::{
        Probes,
        uprobe::{Attachment, UprobeFamily, libraries_of},
    },
    util::term,
};

/// A family's files attached in one process, as they appear.
pub struct Attached {
    family: &'static UprobeFamily,
    pid: u32,
    floor: bool,
    entry_sites: bool,
    seen: HashSet<(u64, u64)>,
    list: Vec<Attachment>,
}

impl Attached {
    /// `family`'s files in `pid`, with empty programs (`floor`), and at the
    /// functions' first instructions (`entry_sites`) rather than the
    /// placed sites.
    pub fn new(family: &'static UprobeFamily, pid: u32, floor: bool, entry_sites: bool) -> Self {
        Self {
            family,
            pid,
            floor,
            entry_sites,
            seen: HashSet::new(),
            list: Vec::new(),
        }
    }

    /// Attaches to the family's files of the process not attached yet.
    pub fn scan(&mut self, probes: &mut Probes) -> anyhow::Result<()> {
        let Ok(libs) = libraries_of(self.family, self.pid) else {
            return Ok(()); // the process is going away; the pidfd says so
        };
        for mut lib in libs {
            if !self.seen.insert(lib.id) {
                continue;
            }
            if self.entry_sites {
                lib.sites.iter_mut().for_each(|s| s.shift = 0);
            }
            let att = probes.attach_family(self.family, &lib, Some(self.pid), self.floor)?;
            // Failures because the process went away mid-attach are said
            // as that, not as the file system's error.
            if !att.failed.is_empty()
                && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
            {
                bail!("pid {} exited while tracer was attaching", self.pid);
            }
            if att.attached() == 0 && !att.failed.is_empty() {
                bail!(
                    "attaching to {}: {}",
                    term::escape(&lib.path),
                    att.failed[0].1
                );
            }
            crate::say!(
                "tracer: attached to {} in pid {} ({} functions, {} probes past a single-stepped first instruction{})",
                term::escape(&lib.path),
                self.pid,
                att.attached(),
                lib.placed(),
                if lib.executable {
                    ", linked into the executable"
                } else {
                    ""
                }
            );
            for sym in &lib.missing {
                tracing::info!("{} has no {sym}: not traced", term::escape(&lib.path));
            }
            for (sym, why) in &att.failed {
                tracing::warn!("{sym} in {}: {why}", term::escape(&lib.path));
            }
            self.list.push(att);
        }
        Ok(())
    }

    /// Functions attached, and in how many files.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.list.iter().map(|a| a.attached()).sum(),
            self.list.len(),
        )
    }

    /// Removes every probe (the kernel waits for grace periods, one
    /// removal at a time, however many are dropped together; callers
    /// report first).
    pub fn detach(self, probes: &mut Probes) {
        let n: usize = self.list.iter().map(|a| a.probes()).sum();
        if n > 0 {
            crate::say!("tracer: removing {n} probes from pid {}", self.pid);
        }
        probes.detach_families(self.list);
    }
}

/// A caching allocator's USDT probes in one process (PyTorch's
/// `pytorch:malloc` and `pytorch:free`), attached as its files appear.
/// The kernel raises their semaphores while they are attached and lowers
/// them when they go, however tracer ends.
pub struct AllocatorProbes {
    pid: u32,
    seen: HashSet<(u64, u64)>,
    list: Vec<crate::probes::usdt::UsdtAttachment>,
}

impl AllocatorProbes {
    /// The allocator probes of `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            seen: HashSet::new(),
            list: Vec::new(),
        }
    }

    /// Attaches to the files with known probes not attached yet.
    pub fn scan(&mut self, probes: &mut Probes) -> anyhow::Result<()> {
        use crate::probes::usdt;
        let Ok(candidates) =
            crate::probes::uprobe::candidates(self.pid, usdt::is_usdt_library_name)
        else {
            return Ok(()); // the process is going away; the pidfd says so
        };
        // Each file is read once, probes or not.
        for c in candidates {
            if !self.seen.insert(c.id) {
                continue;
            }
            let Some(f) = usdt::inspect(&c) else {
                continue;
            };
            let path = term::escape(&f.file.path).into_owned();
            for (probe, why) in &f.refused {
                tracing::warn!("{probe} in {path}: not attached: {why}");
            }
            let att = probes.attach_usdt(&f, Some(self.pid))?;
            for (probe, why) in &att.failed {
                tracing::warn!("{probe} in {path}: {why}");
            }
            let names = f.probe_names();
            crate::say!(
                "tracer: attached to {} USDT probes ({}) in {path} in pid {}, {} semaphores raised by the kernel while attached",
                att.attached(),
                names.join(", "),
                self.pid,
                if att.attached() > 0 {
                    f.semaphores()
                } else {
                    0
                }
            );
            self.list.push(att);
        }
        Ok(())
    }

    /// Removes the probes (the kernel lowers the semaphores).
    pub fn detach(self, probes: &mut Probes) {
        probes.detach_usdt(self.list);
    }
}
