//! Facts about the running system.

/// The system page size, KiB.
pub fn page_kb() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (if size > 0 { size as u64 } else { 4096 }) / 1024
}

/// Hands large freed heap blocks back to the kernel, so the recorder's
/// steady RSS stays small after a burst. glibc's allocator keeps them;
/// musl's (the static build) returns them itself and has no such call.
pub fn give_back_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Every process id in /proc now.
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The kernel release (`uname -r`), empty when unreadable.
pub fn kernel_release() -> String {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// The host name, empty when unreadable.
pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname")
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Raises this process's soft limit of open files to its hard limit (the
/// sampler holds cgroup files open); the soft limit now.
pub fn raise_open_files() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    r.rlim_cur
}

/// This process's soft limit of open files.
pub fn open_files_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: getrlimit writes the struct given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    r.rlim_cur
}

/// How a process ended, from its `task_struct.exit_code` (wait(2)'s
/// status): `exited with status 1`, `killed by SIGSEGV (core dumped)`.
pub fn exit_text(code: i32) -> String {
    let sig = code & 0x7f;
    if sig == 0 {
        return format!("exited with status {}", (code >> 8) & 0xff);
    }
    // libc exports no signal abbreviations (strsignal says "Aborted"):
    // the ones a crash or a kill ends with are named here.
    let name = match sig {
        libc::SIGHUP => "SIGHUP".to_string(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGILL => "SIGILL".into(),
        libc::SIGTRAP => "SIGTRAP".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGFPE => "SIGFPE".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGALRM => "SIGALRM".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGXCPU => "SIGXCPU".into(),
        libc::SIGXFSZ => "SIGXFSZ".into(),
        libc::SIGSYS => "SIGSYS".into(),
        n => format!("signal {n}"),
    };
    let core = if code & 0x80 != 0 {
        " (core dumped)"
    } else {
        ""
    };
    format!("killed by {name}{core}")
}

#[cfg(test)]
mod exit_tests {
    #[test]
    fn exit_codes_read_as_wait_status() {
        assert_eq!(super::exit_text(0), "exited with status 0");
        assert_eq!(super::exit_text(1 << 8), "exited with status 1");
        assert_eq!(
            super::exit_text(6 | 0x80),
            "killed by SIGABRT (core dumped)"
        );
        assert_eq!(super::exit_text(9), "killed by SIGKILL");
        assert_eq!(super::exit_text(40), "killed by signal 40");
    }
}
