//! Growth attribution on risk, on the kernel side: the page-fault programs
//! attached while a memory cgroup is armed and detached when the last one
//! disarms, and the map of armed cgroup ids they follow.
//!
//! The programs are attached here with `BPF_RAW_TRACEPOINT_OPEN` on a
//! duplicate of their fd, not through aya's `RawTracePoint::attach`: the
//! `Ebpf` object that owns the programs stays with the probes (or with the
//! library watcher's thread), and the engine that arms and disarms needs
//! only the program and a link it can drop. A link is a file descriptor:
//! closing it detaches the program.

use std::{
    collections::BTreeSet,
    ffi::CString,
    io,
    os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
};

use aya::{
    maps::{HashMap, MapData},
    programs::ProgramFd,
};

/// `BPF_RAW_TRACEPOINT_OPEN` (include/uapi/linux/bpf.h).
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;

/// `union bpf_attr`'s `raw_tracepoint` member, without the `cookie` that
/// 6.x added after it (the kernel reads what is given, zero for the rest).
#[repr(C)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// Attaches program `prog` to raw tracepoint `name`; the link.
fn raw_tracepoint_open(name: &str, prog: &ProgramFd) -> io::Result<OwnedFd> {
    let name = CString::new(name)?;
    let attr = RawTracepointAttr {
        name: name.as_ptr() as u64,
        prog_fd: prog.as_fd().as_raw_fd() as u32,
        _pad: 0,
    };
    // SAFETY: `attr` is a valid bpf_attr prefix of the size passed, and
    // `name` outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            &raw const attr,
            size_of::<RawTracepointAttr>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The page-fault programs, loaded, attached only on demand.
pub struct FaultHooks {
    progs: Vec<(&'static str, ProgramFd)>,
    links: Vec<OwnedFd>,
}

impl FaultHooks {
    /// The programs, each with the raw tracepoint it goes on.
    pub(super) fn new(progs: Vec<(&'static str, ProgramFd)>) -> Self {
        Self {
            progs,
            links: Vec::new(),
        }
    }

    /// Whether they are attached now.
    pub fn is_attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Attaches every program (none when one fails).
    pub fn attach(&mut self) -> io::Result<()> {
        if self.is_attached() {
            return Ok(());
        }
        for (name, prog) in &self.progs {
            match raw_tracepoint_open(name, prog) {
                Ok(link) => self.links.push(link),
                Err(e) => {
                    self.links.clear();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("raw tracepoint {name}: {e}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Detaches them.
    pub fn detach(&mut self) {
        self.links.clear();
    }
}

/// The ids of the armed memory cgroups, as the programs read them.
pub struct ArmedMap {
    map: HashMap<MapData, u64, u32>,
    ids: BTreeSet<u64>,
}

impl ArmedMap {
    pub(super) fn new(map: HashMap<MapData, u64, u32>) -> Self {
        Self {
            map,
            ids: BTreeSet::new(),
        }
    }

    /// Makes the map hold exactly `ids` (at most the map's size of them);
    /// whether it changed.
    pub fn set(&mut self, ids: &BTreeSet<u64>) -> Result<bool, aya::maps::MapError> {
        let gone: Vec<u64> = self.ids.difference(ids).copied().collect();
        let new: Vec<u64> = ids.difference(&self.ids).copied().collect();
        for id in &gone {
            super::absent_is_ok(self.map.remove(id))?;
            self.ids.remove(id);
        }
        for id in &new {
            if self.ids.len() >= tracer_common::growth::ARMED_ENTRIES as usize {
                break;
            }
            self.map.insert(id, 1, 0)?;
            self.ids.insert(*id);
        }
        Ok(!gone.is_empty() || !new.is_empty())
    }

    /// Ids armed now.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether none is armed.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}
