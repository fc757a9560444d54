//! The cgroup sampler: usage, limit, failcnt, OOM counters and pressure of
//! the memory cgroups that matter, once a second, in a rolling window, so a
//! kill can be shown with the minute that led to it.

use std::{
    collections::{HashMap, VecDeque},
    fs,
    path::Path,
};

use serde::{Deserialize, Serialize};

use super::cgroup::{CgroupLayout, dir_id};

/// One sample of one memory cgroup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupSample {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// Memory charged, bytes.
    pub usage_bytes: u64,
    /// Limit, bytes (`None`: unlimited).
    pub limit_bytes: Option<u64>,
    /// Times the limit was hit (v1 `memory.failcnt`, v2 `memory.events` max).
    pub failcnt: Option<u64>,
    /// OOM kills in this cgroup so far.
    pub oom_kills: Option<u64>,
    /// PSI `some avg10` (v2 only), percent.
    pub psi_some_avg10: Option<f64>,
    /// PSI `full avg10` (v2 only), percent.
    pub psi_full_avg10: Option<f64>,
    /// Pages scanned by reclaim in this cgroup so far (from the reclaim probe).
    pub reclaim_scanned: Option<u64>,
    /// Major faults so far (`pgmajfault` of memory.stat: this cgroup's own
    /// on v1, with its descendants' on v2).
    pub major_faults: Option<u64>,
    /// Inactive file cache, bytes (reclaimed first: usage minus this is
    /// the working set, as the kubelet counts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_file: Option<u64>,
    /// Times usage went over `memory.high` and the cgroup was throttled
    /// into reclaim (v2 `memory.events` high).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_events: Option<u64>,
}

impl CgroupSample {
    /// Usage the kernel cannot simply drop: usage minus inactive file cache.
    pub fn working_set(&self) -> u64 {
        self.usage_bytes
            .saturating_sub(self.inactive_file.unwrap_or(0))
    }
}

/// Limits at or above this are "no limit" (v1 prints PAGE_COUNTER_MAX pages).
const UNLIMITED: u64 = 1 << 62;

/// The node's memory: /proc/meminfo's `MemTotal` and `MemAvailable`
/// (bytes), and PSI `some avg10` of /proc/pressure/memory where the kernel
/// has PSI.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeMemory {
    /// MemTotal.
    pub total: u64,
    /// MemAvailable: what can be had without swapping or killing.
    pub available: u64,
    /// PSI `some avg10`, percent.
    pub psi_some_avg10: Option<f64>,
}

/// Reads the node's memory (`None` without a readable /proc/meminfo).
pub fn read_node() -> Option<NodeMemory> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let (total, available) = parse_meminfo(&meminfo)?;
    let psi = fs::read_to_string("/proc/pressure/memory")
        .ok()
        .and_then(|t| parse_psi(&t).0);
    Some(NodeMemory {
        total,
        available,
        psi_some_avg10: psi,
    })
}

/// `MemTotal` and `MemAvailable` of /proc/meminfo's text, bytes.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let kb = |key: &str| -> Option<u64> {
        let rest = text.lines().find_map(|l| l.strip_prefix(key))?;
        Some(
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024,
        )
    };
    Some((kb("MemTotal:")?, kb("MemAvailable:")?))
}

/// Reads one memory cgroup directory.
pub fn read_cgroup(dir: &Path, v1: bool, ts_ns: i64) -> Option<CgroupSample> {
    read_with(v1, ts_ns, None, |f| fs::read_to_string(dir.join(f)).ok())
}

/// A memory cgroup's files, held open between samples and read again from
/// the start: one `pread` a file a sample, where opening, reading to the
/// end and closing take four or five system calls (a node of 200 limited
/// cgroups is 1,000 file reads a second).
struct HeldFiles {
    dir: std::path::PathBuf,
    files: Vec<(&'static str, fs::File)>,
    /// Whether files are kept open between reads (else each is closed
    /// after its read: past the limit of held cgroups).
    keep: bool,
}

/// Bytes read from a cgroup file at once: memory.stat is 1.5 to 4 KiB.
const READ_BYTES: usize = 16 << 10;

impl HeldFiles {
    fn new(dir: std::path::PathBuf, keep: bool) -> Self {
        Self {
            dir,
            files: Vec::new(),
            keep,
        }
    }

    /// The whole of file `name`, opened at its first read.
    fn read(&mut self, name: &'static str, buf: &mut Vec<u8>) -> Option<String> {
        use std::os::unix::fs::FileExt as _;
        let i = match self.files.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                let f = fs::File::open(self.dir.join(name)).ok()?;
                self.files.push((name, f));
                self.files.len() - 1
            }
        };
        buf.resize(READ_BYTES, 0);
        // A kernfs file is produced whole by one read from offset 0 when
        // the buffer holds it; a full buffer is read on in order.
        let mut n = 0;
        loop {
            match self.files[i].1.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => {
                    n += k;
                    if n < buf.len() {
                        break;
                    }
                    buf.resize(buf.len() * 2, 0);
                }
                Err(_) => {
                    // Removed, or no longer readable: opened again next time.
                    self.files.swap_remove(i);
                    return None;
                }
            }
        }
        if !self.keep {
            self.files.swap_remove(i);
        }
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

/// One sample of a memory cgroup, its files read by `read` (a file's
/// whole text, by name).
///
/// With `carried`, memory.stat (and v1's memory.oom_control) are not read:
/// their figures are carried over from that earlier sample. They are the
/// dearest files by far (the kernel formats some 40 to 60 counters, v1's
/// summed over the subtree), and they change what a sample says only for
/// a cgroup near its limit.
fn read_with(
    v1: bool,
    ts_ns: i64,
    carried: Option<&CgroupSample>,
    mut read: impl FnMut(&'static str) -> Option<String>,
) -> Option<CgroupSample> {
    let mut num = |f: &'static str| -> Option<u64> { read(f)?.trim().parse().ok() };
    let mut s = CgroupSample {
        ts_ns,
        ..Default::default()
    };
    if v1 {
        s.usage_bytes = num("memory.usage_in_bytes")?;
        // Far from its limit, only the usage is read every sample: the
        // limit, failcnt (which rises only at the limit) and the rest are
        // carried over, and read again once half the limit is charged.
        if let Some(c) = carried {
            (
                s.limit_bytes,
                s.failcnt,
                s.oom_kills,
                s.major_faults,
                s.inactive_file,
            ) = (
                c.limit_bytes,
                c.failcnt,
                c.oom_kills,
                c.major_faults,
                c.inactive_file,
            );
            return Some(s);
        }
        s.limit_bytes = num("memory.limit_in_bytes").filter(|&l| l < UNLIMITED);
        s.failcnt = num("memory.failcnt");
        let oc = read("memory.oom_control").unwrap_or_default();
        s.oom_kills = keyed(&oc, "oom_kill");
        let stat = read("memory.stat").unwrap_or_default();
        s.major_faults = keyed(&stat, "pgmajfault");
        s.inactive_file = keyed(&stat, "total_inactive_file");
    } else {
        s.usage_bytes = num("memory.current")?;
        s.limit_bytes = num("memory.max").filter(|&l| l < UNLIMITED);
        let ev = read("memory.events").unwrap_or_default();
        s.failcnt = keyed(&ev, "max");
        s.high_events = keyed(&ev, "high");
        s.oom_kills = keyed(&ev, "oom_kill");
        if let Some(c) = carried {
            (s.major_faults, s.inactive_file) = (c.major_faults, c.inactive_file);
        } else {
            let stat = read("memory.stat").unwrap_or_default();
            s.major_faults = keyed(&stat, "pgmajfault");
            s.inactive_file = keyed(&stat, "inactive_file");
        }
        let psi = read("memory.pressure").unwrap_or_default();
        (s.psi_some_avg10, s.psi_full_avg10) = parse_psi(&psi);
    }
    Some(s)
}

/// `key value` lines (memory.events, memory.oom_control).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `some avg10=1.23 avg60=... total=...` / `full avg10=...`
fn parse_psi(text: &str) -> (Option<f64>, Option<f64>) {
    let avg10 = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))?
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("avg10="))?
            .parse()
            .ok()
    };
    (avg10("some "), avg10("full "))
}

struct Window {
    id: Option<u64>,
    samples: VecDeque<CgroupSample>,
    seen_ns: i64,
    /// Its files, held open for the first [`HELD_CGROUPS`] cgroups.
    files: HeldFiles,
    /// Samples since memory.stat was last read.
    since_full: u32,
    /// Samples still to skip while it is idle.
    idle_skips: u32,
}

/// An idle cgroup (see [`idle`]) is read every this many samples: on a
/// node of hundreds of containers most are idle, and their reads were
/// most of the recorder's CPU.
const IDLE_EVERY: u32 = 4;

/// Whether a window's cgroup is idle: its usage moved by at most a
/// thousandth of its limit (256 KiB without one) over its last three
/// samples, and it is far from its limit. The first change brings it
/// back to every sample (at most IDLE_EVERY samples late).
fn idle(samples: &VecDeque<CgroupSample>) -> bool {
    let Some(last) = samples.back() else {
        return false;
    };
    if samples.len() < 3 || near_limit(last) {
        return false;
    }
    let tolerance = last.limit_bytes.map_or(256 << 10, |l| l / 1024);
    let (lo, hi) = samples
        .iter()
        .rev()
        .take(3)
        .fold((u64::MAX, 0), |(lo, hi), s| {
            (lo.min(s.usage_bytes), hi.max(s.usage_bytes))
        });
    hi - lo <= tolerance
}

/// A cgroup far from its limit has its memory.stat read every this many
/// samples; the ones between carry its figures over.
const FULL_EVERY: u32 = 5;

/// Whether a cgroup is near enough its limit to be read in full every
/// sample: half of it charged.
fn near_limit(s: &CgroupSample) -> bool {
    s.limit_bytes.is_some_and(|l| s.usage_bytes >= l / 2)
}

/// Cgroups whose files the sampler holds open (six each at most), where
/// the limit of open files leaves room; the others' files are opened at
/// each sample.
const HELD_CGROUPS: usize = 512;

/// Rolling windows of samples per memory cgroup path.
pub struct Sampler {
    layout: CgroupLayout,
    windows: HashMap<String, Window>,
    keep_ns: i64,
    /// The reclaim counters' keys of the scan items.
    scan_items: Vec<i32>,
    /// Cgroups whose files are held open now, and at most.
    held: usize,
    held_cap: usize,
    /// The read buffer of held files.
    buf: Vec<u8>,
}

impl Sampler {
    /// A sampler keeping `keep_ns` of history per cgroup. `scan_items` say
    /// which reclaim counters mean pages scanned.
    pub fn new(layout: CgroupLayout, keep_ns: i64, scan_items: Vec<i32>) -> Self {
        Self {
            layout,
            windows: HashMap::new(),
            keep_ns,
            scan_items,
            held: 0,
            // Six files a cgroup, a thousand descriptors left for the rest.
            held_cap: (crate::util::sys::open_files_limit().saturating_sub(1024) as usize / 6)
                .min(HELD_CGROUPS),
            buf: Vec::new(),
        }
    }

    /// Samples every path in `paths` now; forgets cgroups not sampled for
    /// longer than the window. `counters` are the memcg probe's totals.
    pub fn sample<'a>(
        &mut self,
        paths: impl IntoIterator<Item = &'a str>,
        counters: &HashMap<(u64, i32), u64>,
        now_ns: i64,
    ) {
        let v1 = self.layout.memory_is_v1();
        for path in paths {
            let Some(dir) = self.layout.memcg_dir(path) else {
                continue;
            };
            let held = &mut self.held;
            let cap = self.held_cap;
            let w = self.windows.entry(path.to_string()).or_insert_with(|| {
                let keep = *held < cap;
                *held += usize::from(keep);
                let files = HeldFiles::new(dir.clone(), keep);
                Window {
                    id: dir_id(&dir),
                    samples: VecDeque::new(),
                    seen_ns: now_ns,
                    files,
                    since_full: 0,
                    idle_skips: 0,
                }
            });
            w.seen_ns = now_ns;
            // An idle cgroup far from its limit is read every IDLE_EVERY-th
            // sample.
            if w.idle_skips > 0 {
                w.idle_skips -= 1;
                continue;
            }
            // memory.stat every sample near the limit, else every
            // FULL_EVERY-th (its figures carried over between).
            let carried = w
                .samples
                .back()
                .filter(|last| w.since_full + 1 < FULL_EVERY && !near_limit(last));
            let (files, buf) = (&mut w.files, &mut self.buf);
            let read = read_with(v1, now_ns, carried, |name| files.read(name, buf));
            w.since_full = if carried.is_some() {
                w.since_full + 1
            } else {
                0
            };
            let Some(mut s) = read else {
                continue;
            };
            if let Some(id) = w.id {
                let scans: Vec<u64> = self
                    .scan_items
                    .iter()
                    .filter_map(|i| counters.get(&(id, *i)).copied())
                    .collect();
                s.reclaim_scanned = (!scans.is_empty()).then(|| scans.iter().sum());
            }
            w.samples.push_back(s);
            if idle(&w.samples) {
                w.idle_skips = IDLE_EVERY - 1;
            }
            while w
                .samples
                .front()
                .is_some_and(|f| now_ns - f.ts_ns > self.keep_ns)
            {
                w.samples.pop_front();
            }
        }
        let keep = self.keep_ns;
        let held = &mut self.held;
        self.windows.retain(|_, w| {
            let kept = now_ns - w.seen_ns <= keep;
            if !kept && w.files.keep {
                *held -= 1;
            }
            kept
        });
    }

    /// The samples of `path` from `since_ns` on.
    pub fn window(&self, path: &str, since_ns: i64) -> Vec<CgroupSample> {
        self.windows
            .get(path)
            .map(|w| {
                w.samples
                    .iter()
                    .filter(|s| s.ts_ns >= since_ns)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Adds `s` to `path`'s window, as a sample read from its files would
    /// be (tests of what reads the windows).
    #[cfg(test)]
    pub fn push(&mut self, path: &str, s: CgroupSample) {
        let w = self
            .windows
            .entry(path.to_string())
            .or_insert_with(|| Window {
                id: None,
                samples: VecDeque::new(),
                seen_ns: s.ts_ns,
                files: HeldFiles::new(std::path::PathBuf::new(), false),
                since_full: 0,
                idle_skips: 0,
            });
        w.seen_ns = s.ts_ns;
        w.samples.push_back(s);
    }

    /// The latest sample of `path`, if it has a window.
    pub fn latest(&self, path: &str) -> Option<&CgroupSample> {
        self.windows.get(path)?.samples.back()
    }

    /// Reads `path` right now (not stored in the window).
    pub fn read_now(&self, path: &str, now_ns: i64) -> Option<CgroupSample> {
        read_cgroup(
            &self.layout.memcg_dir(path)?,
            self.layout.memory_is_v1(),
            now_ns,
        )
    }

    /// Number of cgroups with a window.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether no cgroup has a window.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_memory_is_read_from_this_kernels_meminfo() {
        // This machine's own file: the keys are there, in kB.
        let real = fs::read_to_string("/proc/meminfo").unwrap();
        let (total, available) = parse_meminfo(&real).unwrap();
        assert!(
            total > 64 << 20 && available <= total,
            "{total} {available}"
        );
        assert_eq!(
            parse_meminfo(
                "MemTotal:       24590440 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n"
            ),
            Some((24_590_440 * 1024, 20_000_000 * 1024))
        );
        assert_eq!(
            parse_meminfo("MemTotal: 1 kB\n"),
            None,
            "a kernel before 3.14 has no MemAvailable"
        );
        assert!(read_node().is_some());
    }

    /// A v1 hierarchy in a temporary directory with cgroup /job at 100
    /// bytes of a 1,000-byte limit, its sampler, and a writer of its files.
    fn v1_job() -> (tempfile::TempDir, Sampler, impl Fn(&str, &str)) {
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("job");
        fs::create_dir(&cg).unwrap();
        let w = move |f: &str, v: &str| fs::write(cg.join(f), v).unwrap();
        w("memory.usage_in_bytes", "100\n");
        w("memory.limit_in_bytes", "1000\n");
        let layout = CgroupLayout {
            memory_v1: Some(root.path().into()),
            ..Default::default()
        };
        (root, Sampler::new(layout, 60_000_000_000, Vec::new()), w)
    }

    #[test]
    fn held_files_are_read_afresh_each_sample_and_a_real_removed_cgroup_reads_nothing() {
        // Files written in place: the held descriptors read what they hold now.
        let (_root, mut s, w) = v1_job();
        s.held_cap = 1;
        s.sample(["/job"], &HashMap::new(), 1);
        assert_eq!(s.latest("/job").map(|x| x.usage_bytes), Some(100));
        assert_eq!(s.held, 1);
        w("memory.usage_in_bytes", "200\n");
        s.sample(["/job"], &HashMap::new(), 2);
        assert_eq!(s.latest("/job").map(|x| x.usage_bytes), Some(200));
        // Forgotten after the window: its files closed.
        s.sample(Vec::<&str>::new(), &HashMap::new(), 70_000_000_000);
        assert_eq!((s.len(), s.held), (0, 0));

        // A real memory cgroup (root): once removed, its held files read
        // nothing, and one made again at the same path is read anew.
        let layout = CgroupLayout::detect();
        let Some(dir) = layout.memcg_dir(&format!("/tracer-unit-held-{}", std::process::id()))
        else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no memory cgroup hierarchy"
            );
            return;
        };
        let path = format!("/{}", dir.file_name().unwrap().to_string_lossy());
        if fs::create_dir(&dir).is_err() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "cannot make {dir:?}: not root?"
            );
            return;
        }
        let mut s = Sampler::new(layout, 60_000_000_000, Vec::new());
        s.held_cap = 1;
        s.sample([path.as_str()], &HashMap::new(), 1);
        let first = s.latest(&path).map(|x| x.ts_ns);
        fs::remove_dir(&dir).unwrap();
        s.sample([path.as_str()], &HashMap::new(), 2);
        let after_removal = s.latest(&path).map(|x| x.ts_ns);
        fs::create_dir(&dir).unwrap();
        s.sample([path.as_str()], &HashMap::new(), 3);
        let again = s.latest(&path).map(|x| x.ts_ns);
        fs::remove_dir(&dir).unwrap();
        assert_eq!(first, Some(1));
        assert_eq!(after_removal, Some(1), "a removed cgroup gave a sample");
        assert_eq!(again, Some(3), "the cgroup made again was not read");
    }

    #[test]
    fn memory_stat_is_read_every_sample_near_the_limit_and_every_fifth_far_from_it() {
        let (_root, mut s, w) = v1_job();
        w("memory.stat", "pgmajfault 1\ntotal_inactive_file 10\n");
        w("memory.failcnt", "0\n");
        let (mut inactive, mut failcnt, mut usage) = (Vec::new(), Vec::new(), Vec::new());
        for t in 1..=7 {
            s.sample(["/job"], &HashMap::new(), t);
            let last = s.latest("/job").unwrap();
            inactive.push(last.inactive_file.unwrap());
            failcnt.push(last.failcnt.unwrap());
            usage.push(last.usage_bytes);
            w(
                "memory.stat",
                &format!("pgmajfault 1\ntotal_inactive_file {}\n", 10 * (t + 1)),
            );
            w("memory.failcnt", &format!("{t}\n"));
            w("memory.usage_in_bytes", &format!("{}\n", 100 + t));
        }
        // Far from the limit: memory.stat, failcnt (and the limit) read at
        // the first sample and the sixth; the usage every sample.
        assert_eq!(inactive, [10, 10, 10, 10, 10, 60, 60]);
        assert_eq!(failcnt, [0, 0, 0, 0, 0, 5, 5]);
        assert_eq!(usage[1..], [101, 102, 103, 104, 105, 106]);
        // Half the limit charged: every sample.
        w("memory.usage_in_bytes", "600\n");
        s.sample(["/job"], &HashMap::new(), 8);
        w("memory.stat", "pgmajfault 1\ntotal_inactive_file 500\n");
        w("memory.failcnt", "9\n");
        s.sample(["/job"], &HashMap::new(), 9);
        assert_eq!(s.latest("/job").unwrap().inactive_file, Some(500));
        assert_eq!(s.latest("/job").unwrap().failcnt, Some(9));
    }

    #[test]
    fn an_idle_cgroup_is_read_every_fourth_sample_until_it_moves() {
        let (_root, mut s, w) = v1_job();
        let mut read_at = Vec::new();
        for t in 1..=12 {
            if t == 10 {
                w("memory.usage_in_bytes", "300\n");
            }
            s.sample(["/job"], &HashMap::new(), t);
            let last = s.latest("/job").unwrap().ts_ns;
            if read_at.last() != Some(&last) {
                read_at.push(last);
            }
        }
        // Three samples make it idle; then every fourth; the change is
        // read at the next read, and every sample after it.
        assert_eq!(read_at, [1, 2, 3, 7, 11, 12]);
    }

    #[test]
    fn v1_and_v2_files() {
        let dir = tempfile::tempdir().unwrap();
        let w = |f: &str, v: &str| fs::write(dir.path().join(f), v).unwrap();
        w("memory.usage_in_bytes", "67108864\n");
        w("memory.limit_in_bytes", "67108864\n");
        w("memory.failcnt", "3543\n");
        w(
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        );
        let s = read_cgroup(dir.path(), true, 7).unwrap();
        assert_eq!(
            (s.usage_bytes, s.limit_bytes, s.failcnt, s.oom_kills),
            (67108864, Some(67108864), Some(3543), Some(1))
        );
        w("memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(
            read_cgroup(dir.path(), true, 7).unwrap().limit_bytes,
            None,
            "v1 'unlimited'"
        );

        w("memory.current", "1048576\n");
        w("memory.max", "max\n");
        w(
            "memory.events",
            "low 0\nhigh 40\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n",
        );
        w(
            "memory.pressure",
            "some avg10=1.50 avg60=0.20 avg300=0.00 total=123\nfull avg10=0.75 avg60=0.00 avg300=0.00 total=45\n",
        );
        let s = read_cgroup(dir.path(), false, 7).unwrap();
        assert_eq!(
            (s.usage_bytes, s.limit_bytes, s.failcnt, s.oom_kills),
            (1048576, None, Some(12), Some(1))
        );
        assert_eq!(s.high_events, Some(40));
        assert_eq!(
            (s.psi_some_avg10, s.psi_full_avg10),
            (Some(1.5), Some(0.75))
        );
        assert!(read_cgroup(&dir.path().join("gone"), false, 0).is_none());
    }

    #[test]
    fn window_rolls() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        fs::create_dir(&cg).unwrap();
        fs::write(cg.join("memory.usage_in_bytes"), "100").unwrap();
        fs::write(cg.join("memory.stat"), "pgfault 90\npgmajfault 3\n").unwrap();
        let layout = CgroupLayout {
            memory_v1: Some(dir.path().into()),
            ..Default::default()
        };
        let id = dir_id(&cg).unwrap();
        let mut s = Sampler::new(layout, 10, vec![20, 21]);
        let counters = HashMap::from([((id, 20), 5), ((id, 21), 7), ((id, 24), 9)]);
        for t in 0..20 {
            // Moving, so read every sample (an idle one is read less).
            fs::write(
                cg.join("memory.usage_in_bytes"),
                ((t + 1) << 20).to_string(),
            )
            .unwrap();
            s.sample(["/cg"], &counters, t);
        }
        let w = s.window("/cg", 0);
        assert_eq!(w.len(), 11, "keeps 10 ns of samples");
        assert_eq!(w[0].reclaim_scanned, Some(12));
        assert_eq!(w[0].major_faults, Some(3));
        s.sample(std::iter::empty(), &counters, 100);
        assert!(s.is_empty(), "forgotten when no longer sampled");
    }
}
