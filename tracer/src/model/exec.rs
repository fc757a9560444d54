//! New programs: what an exec event says of one, and the read of its
//! /proc entries once it has run a while.

use super::{EXEC_READ_DELAY_NS, ProcInfo, ProcessTable, StartTime, proc, same_start};

impl ProcessTable {
    /// A new program, in the memory cgroup with kernel id `memcg_id` at
    /// exec (0: unknown), at wall time `ts_ns`, with the command line the
    /// event read (`args`; else its file name stands in): known from the
    /// event's fields and what its parent was, and read from /proc once it
    /// has run for [`EXEC_READ_DELAY_NS`] (see [`Self::read_due`]). The
    /// kernel's cgroup wins over /proc's: /proc is read later, perhaps
    /// from a zombie.
    pub fn on_exec(
        &mut self,
        pid: u32,
        comm: &str,
        (filename, args): (&str, Option<String>),
        memcg_id: u64,
        ts_ns: i64,
        start: Option<StartTime>,
    ) {
        self.stats.execs += 1;
        let kernel_memcg = self.memcg_by_id(memcg_id, false);
        // The entry of this process (its fork copy), not that of an
        // earlier holder of the pid whose successor's fork was not seen.
        let (prev, prev_started, prev_exited, prev_start) = match self.holder(pid, ts_ns, start) {
            (Some(p), _) => (p.info.clone(), p.started_ns, p.exited_ns, p.start),
            (None, _) => (ProcInfo::default(), None, None, None),
        };
        // Its exit may be known already: exits travel on the critical
        // ring, read before the data ring's forks and execs. The program
        // it exec'd has ended then, and its pid may be another's by now:
        // no /proc read.
        let ended = prev_exited.or_else(|| {
            self.early_exits
                .get(&pid)
                .copied()
                .filter(|&(t, s)| same_start(s, start).unwrap_or(t >= ts_ns))
                .map(|(t, _)| t)
                .inspect(|_| {
                    self.early_exits.remove(&pid);
                })
        });
        let info = ProcInfo {
            pid,
            comm: comm.into(),
            cmdline: args.unwrap_or_else(|| filename.into()).into(),
            exe: Some(filename.into()),
            ..prev
        };
        let mut p = self.make(info, kernel_memcg);
        p.started_ns = p.started_ns.or(prev_started);
        p.start = start.or(prev_start);
        p.exited_ns = ended;
        self.insert(pid, p);
        if ended.is_none() {
            self.reads.push_back((pid, ts_ns));
            self.unread.insert(pid, ts_ns);
        }
    }

    /// Reads /proc for the programs exec'd at least [`EXEC_READ_DELAY_NS`]
    /// before `now_ns` that are still running. Cheap when none is due.
    pub fn read_due(&mut self, now_ns: i64) {
        while let Some(&(pid, ts)) = self.reads.front() {
            if now_ns - ts < EXEC_READ_DELAY_NS {
                break;
            }
            self.reads.pop_front();
            if self.unread.get(&pid) == Some(&ts) {
                self.read_pending(pid);
            }
        }
    }

    /// When the next pending read falls due (wall ns), if any is pending.
    pub fn next_read_ns(&self) -> Option<i64> {
        self.reads.front().map(|(_, ts)| ts + EXEC_READ_DELAY_NS)
    }

    /// Reads a process's /proc entries now if its exec's read is pending.
    pub fn read_pending(&mut self, pid: u32) {
        if self.unread.remove(&pid).is_none() {
            return;
        }
        let Some(old) = self.procs.get(&pid) else {
            return;
        };
        if old.exited_ns.is_some() {
            return;
        }
        let Ok(mut info) = proc::read(pid) else {
            return;
        };
        // Another process's, where the pid was handed on meanwhile.
        if same_start(old.start, StartTime::ticks(info.start_ticks)) == Some(false) {
            return;
        }
        // A process that ended meanwhile (a zombie, its exit not read yet)
        // shows no command line and no file in /proc: what its exec said
        // stays.
        if info.cmdline.is_empty() {
            info.cmdline = old.info.cmdline.clone();
        }
        if info.exe.is_none() {
            info.exe = old.info.exe.clone();
        }
        let (start, started_ns) = (old.start, old.started_ns);
        let kernel_memcg = old.memcg.clone();
        let mut p = self.make(info, kernel_memcg);
        // The kernel's start (from the exec event) is the finer one.
        p.start = start.or(p.start);
        p.started_ns = started_ns.or(p.started_ns);
        self.insert(pid, p);
    }
}
