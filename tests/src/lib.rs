//! Helpers of the privileged end-to-end tests: memory cgroups, the
//! recorder and workload processes, each an RAII guard that cleans up even
//! when a test panics. Only what a test created is ever touched.

use std::{
    ffi::CString,
    fs,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

/// Where build.rs put the simulated CUDA libraries (`libcudart.so.12`,
/// `libcuda.so.1`) and the `cudaload` / `cudaload-static` workloads.
pub fn simcuda_dir() -> PathBuf {
    PathBuf::from(env!("SIMCUDA_DIR"))
}

/// A memory snapshot as PyTorch's own reader (`torch/cuda/_memory_viz.py`,
/// which `cargo xtask setup` takes out of PyTorch's wheel) reads it: see
/// tests/py/read_torch_snapshot.py.
pub fn torch_memory_viz(snapshot: &Path) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let viz = root.join("target/torch-viz/_memory_viz.py");
    assert!(
        viz.exists(),
        "{} is missing: run `cargo xtask setup`",
        viz.display()
    );
    let out = Command::new("python3")
        .arg(root.join("tests/py/read_torch_snapshot.py"))
        .arg(&viz)
        .arg(snapshot)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "PyTorch's reader failed on {}: {}",
        snapshot.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the reader's JSON")
}

/// `go tool pprof ARGS PROFILE`'s output: Go's own pprof reading a profile
/// (`cargo xtask setup` installs Debian's Go).
pub fn go_pprof(args: &[&str], profile: &Path) -> String {
    assert!(
        Path::new("/usr/bin/go").exists(),
        "/usr/bin/go is missing: run `cargo xtask setup` (Debian's golang-go)"
    );
    let tmp = tempfile::tempdir().expect("a directory for pprof");
    let out = Command::new("/usr/bin/go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .env("HOME", tmp.path())
        .env("PPROF_TMPDIR", tmp.path())
        .output()
        .expect("go tool pprof");
    assert!(
        out.status.success(),
        "go tool pprof failed on {}: {}",
        profile.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Attaches with `args` (and `--pid`) to a `sleep` of `life_ms` started
/// `after_ms` before: the process exits while tracer attaches, which it
/// must say (or not find it), whatever the timing.
pub fn attach_to_an_exiting_process(args: &[&str], life_ms: u64, after_ms: u64) {
    let mut short = Command::new("sleep")
        .arg(format!("{}", life_ms as f64 / 1000.0))
        .spawn()
        .expect("spawn sleep");
    thread::sleep(Duration::from_millis(after_ms));
    let pid = short.id().to_string();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--pid", &pid]);
    let out = tracer(&all);
    let _ = short.wait();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("exited") || text.contains("no process with pid"),
        "{out:?}"
    );
}

/// Runs the tracer binary with `args` as uid/gid 65534 (not root).
pub fn tracer_as_nobody(args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt as _;
    Command::new(tracer_bin())
        .args(args)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run tracer as uid 65534")
}

/// The heap benchmark's workload (tests/c/allocbench.c).
pub fn allocbench() -> PathBuf {
    simcuda_dir().join("allocbench")
}

/// The growth tests' program (tests/c/grower.c).
pub fn grower() -> PathBuf {
    simcuda_dir().join("grower")
}

/// The heap tests' program (tests/c/heapsites.c), built by build.rs as
/// `fp` (frame pointers), `nofp` (none) or `static` (static, stripped).
pub fn heapsites(variant: &str) -> PathBuf {
    simcuda_dir().join(format!("heapsites-{variant}"))
}

/// The real `libcudart.so.12` from the `nvidia-cuda-runtime-cu12` wheel that
/// `cargo xtask setup` installs (`TRACER_CUDART` overrides the path).
pub fn real_cudart() -> PathBuf {
    if let Some(p) = std::env::var_os("TRACER_CUDART") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/cuda-wheel/nvidia/cuda_runtime/lib/libcudart.so.12")
}

/// The NVIDIA driver's user-space libraries (`libcuda.so.1`,
/// `libnvidia-ml.so.1`, release 535) that `cargo xtask setup` unpacks from
/// Debian's non-free archive; in CI they must be there.
pub fn driver_libs() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/nvidia-driver/root/usr/lib/x86_64-linux-gnu/nvidia/current");
    if dir.join("libcuda.so.1").exists() && dir.join("libnvidia-ml.so.1").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} lacks the driver libraries: cargo xtask setup unpacks them",
        dir.display()
    );
    eprintln!(
        "skipped: no driver libraries in {} (run cargo xtask setup)",
        dir.display()
    );
    None
}

/// Makes `cmd` run without CAP_MKNOD: the real driver libraries, run as
/// root, create /dev/nvidiactl when it is missing, and the tests leave the
/// machine's /dev as they found it.
pub fn without_mknod(cmd: &mut Command) -> &mut Command {
    /// linux/capability.h
    const CAP_MKNOD: libc::c_ulong = 27;
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_CAPBSET_DROP, CAP_MKNOD, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Whether privileged tests can run; in CI (`CI=true`) they must.
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var("CI").is_err(),
            "privileged end-to-end tests need root and BPF; CI machines have both"
        );
        eprintln!("skipped: not root (the end-to-end tests load eBPF programs and make cgroups)");
    }
    root
}

/// pyenv's CPython 3.`minor` (`bin/python3.MINOR`) on this machine kind;
/// `None` where it is missing, which fails in CI.
pub fn pyenv_python(minor: u8) -> Option<PathBuf> {
    let v = format!("3.{minor}.");
    let found = std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&v))
        })
        .map(|p| p.join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "CPython 3.{minor} is missing from pyenv"
        );
    }
    found
}

/// The tracer binary under test.
pub fn tracer_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TRACER_BIN") {
        return p.into();
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/tracer");
    assert!(
        p.exists(),
        "build tracer first (cargo build -p tracer) or set TRACER_BIN; looked at {}",
        p.display()
    );
    p
}

/// Runs `tracer ARGS` to completion.
pub fn tracer(args: &[&str]) -> Output {
    Command::new(tracer_bin())
        .args(args)
        .output()
        .expect("run tracer")
}

/// Runs `tracer ARGS`, asserts success, and parses stdout as JSON.
pub fn tracer_json(args: &[&str]) -> serde_json::Value {
    let out = tracer(args);
    assert!(
        out.status.success(),
        "tracer {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tracer {args:?}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + scaled(timeout);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// `d` stretched by `TRACER_E2E_TIME_SCALE` (a number from 1 to 100, 1
/// unless set):
/// a guest under software emulation (`cargo xtask vm-test`) runs the same
/// tests some twenty times slower, and waits for them that much longer.
pub fn scaled(d: Duration) -> Duration {
    let scale = std::env::var("TRACER_E2E_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 1.0)
        // Bounded: a huge factor would overflow Duration and panic.
        .map(|s| s.min(100.0))
        .unwrap_or(1.0);
    d.mul_f64(scale)
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A memory cgroup made by a test, removed (with any process a test put in
/// it) when dropped.
pub struct TestCgroup {
    dir: PathBuf,
    /// The path as /proc/PID/cgroup and the kernel report name it.
    pub path: String,
    v1: bool,
    /// Directories made above it, deepest first, removed after it.
    parents: Vec<PathBuf>,
}

impl TestCgroup {
    /// Makes a memory cgroup with `limit` bytes, named after the test.
    pub fn new(tag: &str, limit: u64) -> Self {
        let name = format!(
            "tracer-e2e-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        Self::at(&name, &[], limit)
    }

    /// Makes a cgroup named as docker's systemd driver names a container's
    /// (`docker-<64 hex>.scope`), under a parent of the test's own.
    pub fn container(id: &str, limit: u64) -> Self {
        let parent = format!(
            "tracer-e2e-ctr-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        Self::at(&format!("{parent}/docker-{id}.scope"), &[&parent], limit)
    }

    /// Makes a cgroup laid out as the kubelet's cgroupfs driver lays out a
    /// Burstable pod's container (`kubepods/burstable/pod<uid>/<64 hex>`),
    /// under `top`, a directory of the test's own: the same `top` and `uid`
    /// give the same pod cgroup to a replaced container. The last of the
    /// pod's containers to go removes the directories above it.
    pub fn in_pod(top: &str, uid: &str, id: &str, limit: u64) -> Self {
        let kubepods = format!("{top}/kubepods");
        let qos = format!("{kubepods}/burstable");
        let pod = format!("{qos}/pod{uid}");
        Self::in_levels(&[top, &kubepods, &qos, &pod], id, limit)
    }

    /// The same pod as the kubelet's systemd driver (the default on cgroup
    /// v2) names it: `kubepods.slice/kubepods-burstable.slice/
    /// kubepods-burstable-pod<uid, `_` for `-`>.slice/cri-containerd-<64
    /// hex>.scope`, under `top`.
    pub fn in_systemd_pod(top: &str, uid: &str, id: &str, limit: u64) -> Self {
        let kubepods = format!("{top}/kubepods.slice");
        let qos = format!("{kubepods}/kubepods-burstable.slice");
        let pod = format!(
            "{qos}/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        );
        let scope = format!("cri-containerd-{id}.scope");
        Self::in_levels(&[top, &kubepods, &qos, &pod], &scope, limit)
    }

    /// A cgroup `leaf` below `levels` (outermost first, the last its
    /// parent), each level made if missing and removed by the last cgroup
    /// below it to go.
    fn in_levels(levels: &[&str], leaf: &str, limit: u64) -> Self {
        let parent = levels.last().expect("a level");
        let mut cg = Self::at(&format!("{parent}/{leaf}"), levels, limit);
        let root = memory_root().0;
        cg.parents = levels.iter().rev().map(|p| root.join(p)).collect();
        cg
    }

    fn at(name: &str, parents: &[&str], limit: u64) -> Self {
        let (root, v1) = memory_root();
        let mut made = Vec::new();
        for p in parents {
            let d = root.join(p);
            if !d.exists() {
                fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {p}: {e}"));
                // On v2 a child has a memory controller only where its
                // parent hands it down.
                if !v1 {
                    fs::write(d.join("cgroup.subtree_control"), "+memory")
                        .unwrap_or_else(|e| panic!("enable +memory in {p}: {e}"));
                }
                made.push(d);
            }
        }
        made.reverse();
        let dir = root.join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let cg = Self {
            dir,
            path: format!("/{name}"),
            v1,
            parents: made,
        };
        let limit_file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        fs::write(cg.dir.join(limit_file), limit.to_string()).expect("set memory limit");
        if !v1 {
            let _ = fs::write(cg.dir.join("memory.swap.max"), "0");
        }
        cg
    }

    /// The cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command that starts inside this cgroup (it joins before exec).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let procs = self.procs_path();
        let mut cmd = Command::new(program);
        // SAFETY: the closure only calls async-signal-safe libc functions
        // (open, write, close) on memory prepared before fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Its `cgroup.procs` file, for a child to join it before its exec.
    fn procs_path(&self) -> CString {
        CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .expect("path")
    }

    /// Starts `argv` in this cgroup as process id `pid` (which must be free),
    /// through clone3's `set_tid`: a test reuses the pid of a process that
    /// ended, as a pid space that wrapped would. Returns once started; the
    /// caller reaps it with [`wait_pid`].
    pub fn spawn_as_pid(&self, pid: u32, argv: &[&str]) -> std::io::Result<u32> {
        let procs = self.procs_path();
        let args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(*a).expect("arg"))
            .collect();
        let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let env: [*const libc::c_char; 1] = [std::ptr::null()];
        let set_tid = [pid as libc::pid_t];
        // struct clone_args up to set_tid_size (CLONE_ARGS_SIZE_VER1).
        let mut cl = [0u64; 10];
        cl[4] = libc::SIGCHLD as u64; // exit_signal
        cl[8] = set_tid.as_ptr() as u64; // set_tid
        cl[9] = 1; // set_tid_size
        // SAFETY: clone3 without CLONE_VM gives the child a copy of this
        // address space; the child only calls async-signal-safe functions
        // (open, write, close, execve, _exit) on memory prepared before.
        let r = unsafe { libc::syscall(libc::SYS_clone3, cl.as_mut_ptr(), size_of_val(&cl)) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if r == 0 {
            // SAFETY: as above, in the child.
            unsafe {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    libc::_exit(126);
                }
                libc::close(fd);
                libc::execve(ptrs[0], ptrs.as_ptr(), env.as_ptr());
                libc::_exit(127);
            }
        }
        Ok(r as u32)
    }

    /// What the cgroup and its processes are doing, for a failure's
    /// message: its usage and limit, and each process's state, resident
    /// memory and where it waits in the kernel.
    pub fn describe(&self) -> String {
        let read = |f: &str| fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let (usage, limit) = if self.v1 {
            (read("memory.usage_in_bytes"), read("memory.limit_in_bytes"))
        } else {
            (read("memory.current"), read("memory.max"))
        };
        let mut out = format!(
            "{}: usage {} limit {} oom_kills {}",
            self.path,
            usage.trim(),
            limit.trim(),
            self.oom_kills()
        );
        for pid in read("cgroup.procs").split_whitespace() {
            let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
                    .unwrap_or_default()
            };
            let wchan = fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            out.push_str(&format!(
                "; pid {pid} {} state {} rss {} wchan {wchan}",
                field("Name:"),
                field("State:"),
                field("VmRSS:")
            ));
        }
        out
    }

    /// Memory charged to the cgroup now, bytes.
    pub fn usage(&self) -> u64 {
        let file = if self.v1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// OOM kills counted by the kernel for this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Only processes a test started are in here; end them, then remove.
        for _ in 0..50 {
            let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: plain syscall; the pid is in a cgroup this test made.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if fs::remove_dir(&self.dir).is_ok() {
                for p in &self.parents {
                    let _ = fs::remove_dir(p);
                }
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not remove {}", self.dir.display());
    }
}

/// A pod's names, for the kubelet's files a test lays out.
pub struct KubePod {
    /// Namespace.
    pub namespace: &'static str,
    /// Pod name.
    pub pod: &'static str,
    /// Container name.
    pub container: &'static str,
}

/// The kubelet's files for container `id` (its `restart`th) of pod `uid`
/// under a test host root: its log directory and its /var/log/containers
/// link.
pub fn kubelet_files(root: &Path, p: KubePod, uid: &str, restart: u32, id: &str) {
    let dir = root.join(format!(
        "var/log/pods/{}_{}_{uid}/{}",
        p.namespace, p.pod, p.container
    ));
    fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("{restart}.log"));
    fs::write(&log, "").unwrap();
    let links = root.join("var/log/containers");
    fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(
        &log,
        links.join(format!(
            "{}_{}_{}-{id}.log",
            p.pod, p.namespace, p.container
        )),
    )
    .unwrap();
}

/// Where new memory cgroups go: the v1 memory hierarchy if mounted, else
/// the v2 root (which must have the memory controller).
pub fn memory_root() -> (PathBuf, bool) {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return (v1.into(), true);
    }
    for v2 in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let ctl =
            fs::read_to_string(Path::new(v2).join("cgroup.subtree_control")).unwrap_or_default();
        if ctl.split_whitespace().any(|c| c == "memory") {
            return (v2.into(), false);
        }
    }
    panic!(
        "no memory cgroup controller on this machine (v1 /sys/fs/cgroup/memory or v2 with +memory)"
    );
}

/// Started as root, becomes uid and gid `uid` (group first, then user);
/// otherwise stays who it is.
pub fn drop_to_uid(uid: u64) {
    let uid = uid as libc::uid_t;
    // SAFETY: plain syscalls; order matters (group first, then user).
    unsafe {
        if libc::getuid() == 0 {
            assert_eq!(libc::setgid(uid), 0, "setgid");
            assert_eq!(libc::setuid(uid), 0, "setuid");
        }
    }
}

/// The numeric flags of a workload (`--name N`), each with its default.
/// `--help` prints `usage` and the flags and exits 0; an unknown flag, a
/// missing value or one that is not a number prints the same help on
/// stderr and exits 2, so a mistyped flag never runs the workload with its
/// defaults.
pub fn flags<const N: usize>(usage: &str, defaults: [(&str, u64); N]) -> [u64; N] {
    match parse_flags(std::env::args().skip(1), defaults) {
        Ok(v) => v,
        Err(why) => {
            let help = flag_help(usage, &defaults);
            if why.is_empty() {
                println!("{help}");
                std::process::exit(0);
            }
            eprintln!("{why}\n{help}");
            std::process::exit(2);
        }
    }
}

fn flag_help(usage: &str, defaults: &[(&str, u64)]) -> String {
    let mut help = format!("usage: {usage}");
    for (name, default) in defaults {
        help.push_str(&format!("\n  {name} N  (default {default})"));
    }
    help
}

/// The values of `defaults` as `args` set them; `Err("")` for `--help`.
fn parse_flags<const N: usize>(
    args: impl IntoIterator<Item = String>,
    defaults: [(&str, u64); N],
) -> Result<[u64; N], String> {
    let mut values = defaults.map(|(_, d)| d);
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            return Err(String::new());
        }
        let Some(i) = defaults.iter().position(|(name, _)| *name == a) else {
            return Err(format!("unknown argument {a:?}"));
        };
        let v = args.next().ok_or_else(|| format!("{a} needs a number"))?;
        values[i] = v
            .parse()
            .map_err(|_| format!("{a} takes a number, got {v:?}"))?;
    }
    Ok(values)
}

/// Runs `memhog` (the binary at `bin`) in `cg`, growing `step_mib` every
/// `interval_ms`, until the kernel OOM-kills it; returns the dead process.
pub fn oom_killed(cg: &TestCgroup, bin: &Path, step_mib: u64, interval_ms: u64) -> Proc {
    let mut cmd = cg.command(bin);
    cmd.args([
        "--step-mib",
        &step_mib.to_string(),
        "--interval-ms",
        &interval_ms.to_string(),
    ]);
    let mut hog = Proc::spawn(cmd);
    assert_eq!(
        hog.wait_signal(Duration::from_secs(30)),
        Some(libc::SIGKILL),
        "memhog {} was not OOM-killed in {}",
        hog.pid(),
        cg.path
    );
    hog
}

/// Waits for our child `pid` to end (up to `timeout`); the signal that
/// ended it, if one did. Panics if it does not end.
pub fn wait_pid(pid: u32, timeout: Duration) -> Option<i32> {
    let status = wait_for(timeout, || {
        let mut st = 0;
        // SAFETY: plain syscall on our own child.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut st, libc::WNOHANG) };
        (r == pid as libc::pid_t).then_some(st)
    })
    .unwrap_or_else(|| panic!("pid {pid} did not end"));
    libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status))
}

/// The count a `killstorm` prints when it ends (`killed N`).
pub fn storm_count(p: &mut Proc) -> u64 {
    let mut line = String::new();
    BufReader::new(p.child.stdout.as_mut().expect("piped stdout"))
        .read_line(&mut line)
        .expect("read killstorm stdout");
    line.trim()
        .strip_prefix("killed ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("killstorm said {line:?}"))
}

/// A child process a test started; killed and reaped on drop.
pub struct Proc {
    /// The child.
    pub child: Child,
}

impl Proc {
    /// Starts `cmd` with stdout piped.
    pub fn spawn(mut cmd: Command) -> Self {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn workload");
        Self { child }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads stdout lines until one contains `needle`.
    pub fn wait_line(&mut self, needle: &str) {
        let out = self.child.stdout.as_mut().expect("piped stdout");
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).expect("read workload stdout");
            assert!(n > 0, "workload ended before printing {needle:?}");
            if line.contains(needle) {
                return;
            }
        }
    }

    /// Waits for it to end; returns the signal that ended it, if any.
    pub fn wait_signal(&mut self, timeout: Duration) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let status = wait_for(timeout, || self.child.try_wait().expect("wait"))?;
        status.signal()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The setting of a privileged end-to-end test: a private directory that
/// goes with it, and a store path in it.
pub struct Scenario {
    /// The directory.
    pub dir: tempfile::TempDir,
    /// `DIR/t.db`.
    pub store: PathBuf,
}

impl Scenario {
    /// A new setting, or `None` where privileged tests cannot run here
    /// (never in CI: there that fails, see [`privileged`]).
    pub fn new() -> Option<Self> {
        privileged().then(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let store = dir.path().join("t.db");
            Self { dir, store }
        })
    }
}

/// Debian's headless Chromium, or `None` where it is not installed (never
/// in CI: there that fails).
pub fn chromium() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/chromium");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "chromium missing: cargo xtask setup installs it"
    );
    eprintln!("skipped: no chromium (cargo xtask setup)");
    None
}

/// The DOM headless `chromium` builds of the page at `page`, with its
/// profile in `profile`.
pub fn browser_dom(chromium: &Path, page: &Path, profile: &Path) -> String {
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("a DOM in UTF-8")
}

/// A running `tracer record`, stopped with SIGINT on drop.
pub struct Recorder {
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    /// Its store.
    pub store: PathBuf,
}

/// How to start a `tracer record`: built from [`Recorder::on`] or
/// [`Scenario`], started with [`RecorderBuilder::start`].
#[must_use]
pub struct RecorderBuilder {
    bin: PathBuf,
    store: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    echo: bool,
}

impl RecorderBuilder {
    /// Extra arguments after `record --store STORE`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Environment of the recorder (the simulated NVML reads its scenario
    /// from it).
    pub fn envs(mut self, env: &[(&str, String)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        self
    }

    /// Another tracer binary (a release build, in the benchmarks).
    pub fn bin(mut self, bin: &Path) -> Self {
        self.bin = bin.into();
        self
    }

    /// Its start-up log lines are not copied to stderr (a failing test
    /// still prints the last ones).
    pub fn quiet(mut self) -> Self {
        self.echo = false;
        self
    }

    /// Starts it and waits until it records.
    pub fn start(self) -> Recorder {
        Recorder::spawn(self)
    }
}

impl Recorder {
    /// A recorder on `store`, to be started.
    pub fn on(store: &Path) -> RecorderBuilder {
        RecorderBuilder {
            bin: tracer_bin(),
            store: store.into(),
            args: Vec::new(),
            env: Vec::new(),
            echo: true,
        }
    }

    fn spawn(b: RecorderBuilder) -> Self {
        let RecorderBuilder {
            bin,
            store,
            args: extra,
            env,
            echo,
        } = b;
        let mut child = Command::new(&bin)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("record")
            .arg("--store")
            .arg(&store)
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tracer record");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("piped");
        let sink = stderr.clone();
        thread::spawn(move || {
            // The first lines (start-up) are echoed live; the rest only as
            // a tail when the test fails (Drop), so that a storm of log
            // lines cannot bury the failure's own message.
            for (n, line) in BufReader::new(pipe)
                .lines()
                .map_while(Result::ok)
                .enumerate()
            {
                if echo && n < ECHO_LIVE_LINES {
                    eprintln!("[recorder] {line}");
                }
                sink.lock().expect("lock").push_str(&(line + "\n"));
            }
        });
        let mut rec = Self {
            child: Some(child),
            stderr,
            store,
        };
        let ready = wait_for(Duration::from_secs(30), || {
            if rec.log().contains("tracer: recording") {
                return Some(true);
            }
            match rec.child.as_mut().expect("child").try_wait() {
                Ok(Some(status)) => panic!("recorder exited ({status}): {}", rec.log()),
                _ => None,
            }
        });
        assert!(
            ready.is_some(),
            "recorder not ready after {:?}: {}",
            scaled(Duration::from_secs(30)),
            rec.log()
        );
        rec
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// What it printed so far.
    pub fn log(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Stops it with SIGINT and waits; returns its final log.
    pub fn stop(mut self) -> String {
        self.stop_inner();
        self.log()
    }

    /// Sends it SIGTERM and returns how long it took to end (to be gone,
    /// or a zombie: its probes are removed by then). Panics after 10 s.
    pub fn terminate_timed(&self) -> Duration {
        let pid = self.pid();
        let t0 = std::time::Instant::now();
        // SAFETY: plain syscall on the recorder this test started.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let stat = format!("/proc/{pid}/stat");
        wait_for(Duration::from_secs(10), || {
            match std::fs::read_to_string(&stat) {
                Err(_) => true,
                Ok(s) => s.contains(") Z "),
            }
            .then(|| t0.elapsed())
        })
        .unwrap_or_else(|| panic!("the recorder did not stop on SIGTERM: {}", self.log()))
    }

    /// Kills it with SIGKILL, as a crash would.
    pub fn crash(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop_inner(&mut self) {
        if let Some(mut c) = self.child.take() {
            assert!(
                interrupt(&mut c, Duration::from_secs(20)),
                "recorder did not stop on SIGINT: {}",
                self.log()
            );
            // Give the log thread a moment to drain.
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Log lines of a recorder echoed as they come (its start-up).
const ECHO_LIVE_LINES: usize = 20;
/// Log lines echoed when a test using it fails.
const ECHO_TAIL_LINES: usize = 40;

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            interrupt(&mut c, Duration::from_secs(20));
        }
        if thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let from = lines.len().saturating_sub(ECHO_TAIL_LINES);
            eprintln!(
                "[recorder] the last {} of its {} log lines:",
                lines.len() - from,
                lines.len()
            );
            for l in &lines[from..] {
                eprintln!("[recorder] {l}");
            }
        }
    }
}

/// Sends SIGINT to a child of ours and waits up to `timeout` for it to end;
/// kills it if it does not. Returns whether it ended on SIGINT.
pub fn interrupt(child: &mut Child, timeout: Duration) -> bool {
    // One already waited for is not signalled: its pid may be another's now.
    if child.try_wait().ok().flatten().is_some() {
        return true;
    }
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    if wait_for(timeout, || child.try_wait().ok().flatten()).is_some() {
        return true;
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// A `cudaload` workload: commands on stdin, one reply line each.
pub struct CudaLoad {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl CudaLoad {
    /// Starts `cmd` (a cudaload) and waits for its "ready".
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cudaload");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut me = Self {
            child,
            stdin,
            stdout,
        };
        assert_eq!(me.line(), "ready");
        me
    }

    /// The simulated runtime and driver, loaded at start.
    pub fn sim(env: &[(&str, &str)]) -> Self {
        let d = simcuda_dir();
        let mut cmd = Command::new(d.join("cudaload"));
        cmd.arg(d.join("libcudart.so.12"))
            .arg(d.join("libcuda.so.1"))
            .envs(env.iter().copied());
        Self::spawn(cmd)
    }

    fn line(&mut self) -> String {
        self.try_line().expect("cudaload ended")
    }

    fn try_line(&mut self) -> Option<String> {
        let mut s = String::new();
        self.stdout.read_line(&mut s).ok()?;
        (!s.is_empty()).then(|| s.trim_end().to_string())
    }

    /// Sends one command and returns its reply.
    pub fn cmd(&mut self, line: &str) -> String {
        self.try_cmd(line).expect("cudaload ended")
    }

    /// Sends one command; `None` when the process ended instead of replying.
    pub fn try_cmd(&mut self, line: &str) -> Option<String> {
        use std::io::Write as _;
        writeln!(self.stdin, "{line}").ok()?;
        self.stdin.flush().ok()?;
        self.try_line()
    }

    /// Sends one command without waiting for its reply (a long `rate` run
    /// that a test attaches to while it runs).
    pub fn send(&mut self, line: &str) {
        use std::io::Write as _;
        writeln!(self.stdin, "{line}").expect("cudaload stdin");
        self.stdin.flush().expect("cudaload stdin");
    }

    /// Sends a command that must succeed; returns the words after "ok".
    pub fn ok(&mut self, line: &str) -> Vec<String> {
        let r = self.cmd(line);
        let mut w = r.split_whitespace().map(String::from);
        assert_eq!(w.next().as_deref(), Some("ok"), "{line}: {r}");
        w.collect()
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells it to exit and waits.
    pub fn exit(mut self) {
        use std::io::Write as _;
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

impl Drop for CudaLoad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `tracer attach --json`.
pub struct Attach {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Attach {
    /// Starts `tracer attach --pid PID --json EXTRA...` and waits until it
    /// has attached to every library (or is waiting for one).
    pub fn start(pid: u32, extra: &[&str]) -> Self {
        Self::start_bin(&tracer_bin(), pid, extra)
    }

    /// Same, with the tracer binary at `bin`.
    pub fn start_bin(bin: &Path, pid: u32, extra: &[&str]) -> Self {
        let pid = pid.to_string();
        let mut args = vec!["attach", "--json", "--pid", &pid];
        args.extend_from_slice(extra);
        Self::live(bin, &args)
    }

    /// Starts `tracer growth --json EXTRA...` and waits until it follows.
    pub fn growth(extra: &[&str]) -> Self {
        let mut args = vec!["growth", "--json"];
        args.extend_from_slice(extra);
        Self::live(&tracer_bin(), &args)
    }

    /// Starts a live subcommand and waits until it says it is tracing.
    fn live(bin: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tracer attach");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let (out, err) = (
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let sink = lines.clone();
        thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().expect("lock").push(l);
            }
        });
        let sink = stderr.clone();
        thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[attach] {l}");
                sink.lock().expect("lock").push_str(&(l + "\n"));
            }
        });
        let mut me = Self {
            child,
            lines,
            stderr,
        };
        let ok = wait_for(Duration::from_secs(30), || {
            let e = me.stderr();
            // Every library of the process is attached once it says "tracing".
            if e.contains("tracer: tracing pid")
                || e.contains("tracer: tracing the heap of pid")
                || e.contains("tracer: following the growth of")
                || e.contains("waiting for one")
            {
                return Some(());
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("tracer attach exited ({status}): {e}");
            }
            None
        });
        assert!(
            ok.is_some(),
            "tracer attach did not attach: {}",
            me.stderr()
        );
        me
    }

    /// What it printed on stderr.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Its JSON lines so far of `type`.
    pub fn of_type(&self, ty: &str) -> Vec<serde_json::Value> {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["type"] == ty)
            .collect()
    }

    /// Waits until `n` call lines satisfy `pred`; returns them.
    pub fn wait_calls(
        &self,
        n: usize,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let got = wait_for(Duration::from_secs(10), || {
            let v: Vec<_> = self
                .of_type("call")
                .into_iter()
                .filter(|c| pred(c))
                .collect();
            (v.len() >= n).then_some(v)
        });
        got.unwrap_or_else(|| {
            panic!(
                "fewer than {n} matching calls in {:?}",
                self.of_type("call")
            )
        })
    }

    /// Waits for it to end by itself (the target exited); returns the final report.
    pub fn wait_end(mut self) -> serde_json::Value {
        let status = wait_for(Duration::from_secs(15), || {
            self.child.try_wait().ok().flatten()
        })
        .expect("attach ended");
        assert!(status.success(), "attach failed: {}", self.stderr());
        thread::sleep(Duration::from_millis(100));
        self.final_report()
    }

    /// Stops it with SIGINT; returns the final report.
    pub fn stop(mut self) -> serde_json::Value {
        assert!(
            interrupt(&mut self.child, Duration::from_secs(15)),
            "attach did not stop"
        );
        thread::sleep(Duration::from_millis(100));
        self.final_report()
    }

    /// Kills it with SIGKILL (it detaches nothing itself) and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn final_report(&self) -> serde_json::Value {
        let mut all = self.of_type("exit");
        all.extend(self.of_type("detach"));
        all.extend(self.of_type("end"));
        all.pop()
            .unwrap_or_else(|| panic!("no final report; stderr: {}", self.stderr()))
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        interrupt(&mut self.child, Duration::from_secs(10));
    }
}

/// Every kill `store` holds, latest first (`tracer explain --all --store
/// STORE --format json`).
pub fn explain_all(store: &Path) -> Vec<serde_json::Value> {
    let all = tracer_json(&[
        "explain",
        "--all",
        "--store",
        store.to_str().unwrap(),
        "--format",
        "json",
    ]);
    match all {
        serde_json::Value::Array(a) => a,
        other => panic!("not a list of kills: {other}"),
    }
}

/// `tracer explain ARGS --format json`, polled (15 s at most) until it
/// succeeds and `ready` says the answer is complete (joins happen after
/// the first commit).
pub fn explain_json(
    args: &[&str],
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json"]);
    let got = wait_for(Duration::from_secs(15), || {
        let out = tracer(&all);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (out.status.success() && ready(&v)).then_some(v)
    });
    got.unwrap_or_else(|| {
        let out = tracer(&all);
        // On one line: a guest's failure shows only its last lines.
        let last = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| String::from_utf8_lossy(&out.stdout).into_owned());
        panic!(
            "tracer {all:?} gave no complete answer; the last: {last} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The JSON summary a recorder prints when it stops (`tracer: stopped; {...}`).
pub fn summary_of(log: &str) -> Option<serde_json::Value> {
    serde_json::from_str(
        log.lines()
            .find_map(|l| l.strip_prefix("tracer: stopped; "))?,
    )
    .ok()
}

impl Recorder {
    /// Stops it and returns the summary it printed.
    pub fn stop_summary(self) -> serde_json::Value {
        let log = self.stop();
        summary_of(&log).unwrap_or_else(|| panic!("no summary in the recorder's log: {log}"))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_flags;

    fn parse(args: &[&str]) -> Result<[u64; 2], String> {
        parse_flags(args.iter().map(|a| a.to_string()), [("--a", 1), ("--b", 2)])
    }

    #[test]
    fn flags_take_defaults_values_help_and_refuse_the_rest() {
        assert_eq!(parse(&[]), Ok([1, 2]));
        assert_eq!(parse(&["--b", "7", "--a", "5"]), Ok([5, 7]));
        assert_eq!(parse(&["--help"]), Err(String::new()));
        assert_eq!(parse(&["--a", "1", "-h"]), Err(String::new()));
        assert!(
            parse(&["--c", "1"])
                .unwrap_err()
                .contains("unknown argument")
        );
        assert!(parse(&["--a"]).unwrap_err().contains("needs a number"));
        assert!(parse(&["--a", "x"]).unwrap_err().contains("takes a number"));
        assert!(parse(&["5"]).unwrap_err().contains("unknown argument"));
    }
}
