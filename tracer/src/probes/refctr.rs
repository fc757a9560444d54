//! Uprobes whose USDT semaphore the kernel keeps.
//!
//! A USDT probe behind a semaphore fires only while that semaphore (a
//! `u16` in the process's data) is not zero. Given the semaphore's file
//! offset (`ref_ctr_offset`, Linux 4.20+), the uprobe PMU adds one to it
//! in every process where it installs the probe (including processes that
//! map the file later) and takes it back when the probe goes, however the
//! tracer ends: a crash or a SIGKILL closes its descriptors, and closing
//! them removes the probe. A tracer that writes the semaphore itself,
//! through /proc/PID/mem, races with the process's own writes to that page
//! and leaves the probe raised when it dies.
//!
//! aya 0.14 opens uprobe perf events without that offset, so the event is
//! opened here, and the program linked to it with `BPF_LINK_CREATE` and
//! the attach cookie, as aya does for its own uprobes (Linux 5.15+).

use std::{
    ffi::CString,
    fs, io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
    sync::OnceLock,
};

use aya_obj::generated::{
    PERF_FLAG_FD_CLOEXEC, bpf_attach_type::BPF_PERF_EVENT, bpf_attr, bpf_cmd::BPF_LINK_CREATE,
    perf_event_attr,
};

/// Where the uprobe PMU takes the semaphore's offset: the high half of
/// `config` (its `format/ref_ctr_offset` says `config:32-63`).
const REF_CTR_SHIFT: u32 = 32;

/// One probe attached: the link and its perf event. Dropping it removes
/// the probe and gives its semaphore count back.
#[derive(Debug)]
pub struct CountedLink {
    _link: OwnedFd,
    _perf: OwnedFd,
}

/// The uprobe PMU's type, if it takes a semaphore offset.
fn uprobe_pmu() -> io::Result<u32> {
    static PMU: OnceLock<Result<u32, String>> = OnceLock::new();
    PMU.get_or_init(|| {
        let dir = Path::new("/sys/bus/event_source/devices/uprobe");
        if !dir.join("format/ref_ctr_offset").exists() {
            return Err(
                "this kernel's uprobes take no USDT semaphore offset (Linux 4.20 or later does)"
                    .into(),
            );
        }
        fs::read_to_string(dir.join("type"))
            .map_err(|e| format!("reading the uprobe PMU's type: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("the uprobe PMU's type: {e}"))
    })
    .clone()
    .map_err(io::Error::other)
}

/// Attaches `prog` (a uprobe program) at byte `offset` of the file at
/// `path`, for process `pid` or, with `None`, every process; with
/// `semaphore` (its file offset) counted by the kernel while attached.
/// `cookie` is what the program's `bpf_get_attach_cookie` returns.
pub fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offset: u64,
    semaphore: Option<u64>,
    pid: Option<u32>,
    cookie: u64,
) -> io::Result<CountedLink> {
    let ref_ctr = semaphore.unwrap_or(0);
    if ref_ctr >> (64 - REF_CTR_SHIFT) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("semaphore offset {ref_ctr:#x} past 4 GiB"),
        ));
    }
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a plain C struct; all zeros is its empty value.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = uprobe_pmu()?;
    attr.size = size_of::<perf_event_attr>() as u32;
    attr.config = ref_ctr << REF_CTR_SHIFT;
    attr.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = offset;
    // One process, on any CPU; or every process (perf requires a CPU then;
    // the program runs wherever the probe is hit).
    let (pid, cpu) = match pid {
        Some(p) => (p as libc::pid_t, -1),
        None => (-1, 0),
    };
    // SAFETY: attr and the path it points to outlive the call; a
    // non-negative result is a new descriptor this process owns.
    let perf = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            pid,
            cpu,
            -1,
            libc::c_ulong::from(PERF_FLAG_FD_CLOEXEC),
        )
    };
    if perf < 0 {
        return Err(with_call("perf_event_open", io::Error::last_os_error()));
    }
    // SAFETY: just returned by the kernel, owned by nothing else.
    let perf = unsafe { OwnedFd::from_raw_fd(perf as i32) };
    // SAFETY: as above, a plain C union.
    let mut la: bpf_attr = unsafe { std::mem::zeroed() };
    la.link_create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    la.link_create.__bindgen_anon_2.target_fd = perf.as_raw_fd() as u32;
    la.link_create.attach_type = BPF_PERF_EVENT as u32;
    la.link_create.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    // SAFETY: la is a valid bpf_attr of the size passed.
    let link = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE as libc::c_int,
            &la as *const bpf_attr,
            size_of::<bpf_attr>() as u32,
        )
    };
    if link < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EINVAL) {
            io::Error::other(
                "bpf_link_create: this kernel cannot link a program to a perf event with a cookie (Linux 5.15 or later can)",
            )
        } else {
            with_call("bpf_link_create", e)
        });
    }
    Ok(CountedLink {
        // SAFETY: just returned by the kernel, owned by nothing else.
        _link: unsafe { OwnedFd::from_raw_fd(link as i32) },
        _perf: perf,
    })
}

fn with_call(call: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{call}: {e}"))
}
