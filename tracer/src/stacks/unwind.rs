//! Unwinding sampled user stacks in userspace.
//!
//! Distro libraries and most programs are built without frame pointers, so
//! the kernel's frame-pointer walk stops after a frame or two. Each sample
//! carries the caller's registers and a copy of the top of its stack;
//! framehop walks that copy with the `.eh_frame` rules of the mapped files.
//! Where the copy runs out and the kernel's frame-pointer walk agrees with
//! every frame so far, the kernel's walk supplies the rest.

use std::{
    collections::HashMap,
    fs,
    ops::Range,
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    ExplicitModuleSectionInfo, Module, Unwinder as _,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use super::maps::{Mapping, exec_mappings};

/// Frames kept per stack.
pub const MAX_FRAMES: usize = 128;
/// A process's maps are read again when a sample's code is not in them:
/// at once the first time (a first sample may come while the dynamic
/// loader is still mapping the libraries), then after this, doubling up to
/// [`REFRESH`] (code that is in no file, a JIT's, is never found there).
const FIRST_RETRY: Duration = Duration::from_millis(10);
/// The longest wait between two readings of a process's maps.
const REFRESH: Duration = Duration::from_secs(1);

/// What unwinding needs of one file, shared by every process that maps it.
/// Where an address is in its file.
#[derive(Clone, Debug)]
pub struct Located {
    /// A path that opens the file while tracer runs.
    pub held: String,
    /// The address's offset in the file.
    pub offset: u64,
    /// The file's path as the process sees it.
    pub path: String,
    /// Whether the file carries its own DWARF: only then is it named with
    /// file and line (see `symbols::Symbols::resolve`).
    pub own_dwarf: bool,
}

struct FileInfo {
    /// Executable PT_LOAD segments: (p_offset, p_filesz, p_vaddr).
    exec: Vec<(u64, u64, u64)>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame_svma: Option<Range<u64>>,
    eh_frame_hdr_svma: Option<Range<u64>>,
    eh_frame: Option<Arc<[u8]>>,
    eh_frame_hdr: Option<Arc<[u8]>>,
    debug_frame: Option<Arc<[u8]>>,
    /// Whether the file carries its own DWARF (`.debug_info`).
    own_dwarf: bool,
    /// The file, held open: it is named through this descriptor even
    /// after every process that mapped it is gone.
    held: fs::File,
}

impl FileInfo {
    fn read(path: &str) -> Option<Self> {
        // Read on demand: a process may map a file of gigabytes, and only
        // the headers and the unwind sections are wanted.
        let file = fs::File::open(path).ok()?;
        let held = file.try_clone().ok()?;
        let cache = object::ReadCache::new(file);
        let obj = object::File::parse(&cache).ok()?;
        let sect = |name: &str| {
            obj.section_by_name(name).map(|s| {
                let data: Option<Arc<[u8]>> = s.uncompressed_data().ok().map(|d| Arc::from(&*d));
                (s.address()..s.address() + s.size(), data)
            })
        };
        let exec = obj
            .segments()
            .filter(|s| {
                matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0)
            })
            .map(|s| {
                let (off, len) = s.file_range();
                (off, len, s.address())
            })
            .collect();
        let (eh_frame_svma, eh_frame) = sect(".eh_frame").unzip();
        let (eh_frame_hdr_svma, eh_frame_hdr) = sect(".eh_frame_hdr").unzip();
        Some(Self {
            exec,
            text_svma: sect(".text").map(|s| s.0),
            got_svma: sect(".got").map(|s| s.0),
            eh_frame_svma,
            eh_frame_hdr_svma,
            eh_frame: eh_frame.flatten(),
            eh_frame_hdr: eh_frame_hdr.flatten(),
            debug_frame: sect(".debug_frame").and_then(|s| s.1),
            own_dwarf: obj
                .section_by_name(".debug_info")
                .is_some_and(|s| s.size() > 0),
            held,
        })
    }

    /// A path that opens this very file while tracer runs.
    fn held_path(&self) -> String {
        use std::os::fd::AsRawFd as _;
        format!("/proc/self/fd/{}", self.held.as_raw_fd())
    }

    /// The load bias of a mapping of this file: where its address 0 is.
    fn base_avma(&self, m: &Mapping) -> Option<u64> {
        self.exec.iter().find_map(|&(off, len, vaddr)| {
            (m.offset >= off & !0xfff && m.offset < off + len).then(|| {
                m.start
                    .wrapping_sub(m.offset)
                    .wrapping_sub(vaddr.wrapping_sub(off))
            })
        })
    }

    fn module(&self, m: &Mapping) -> Option<Module<Arc<[u8]>>> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: self.eh_frame_svma.clone(),
            eh_frame_hdr_svma: self.eh_frame_hdr_svma.clone(),
            eh_frame: self.eh_frame.clone(),
            eh_frame_hdr: self.eh_frame_hdr.clone(),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        };
        Some(Module::new(
            m.path.clone(),
            m.start..m.end,
            self.base_avma(m)?,
            info,
        ))
    }
}

struct Process {
    /// How long after `read_at` a sample outside the maps reads them again.
    retry: Duration,
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    /// Executable mappings: (addresses, path as the process sees it, file
    /// offset of the start, the file).
    ranges: Vec<(Range<u64>, String, u64, Arc<FileInfo>)>,
    read_at: Instant,
}

impl Process {
    fn covers(&self, addr: u64) -> bool {
        self.file_at(addr).is_some()
    }

    fn file_at(&self, addr: u64) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(r, ..)| r.contains(&addr))
            .map(|(_, f, ..)| f.as_str())
    }
}

/// One sample to unwind.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer register.
    pub bp: u64,
    /// The stack from `sp` up.
    pub stack: &'a [u8],
    /// The kernel's frame-pointer walk (first entry = `ip`).
    pub fp: &'a [u64],
}

/// Unwinders of every traced process, over files parsed once each.
#[derive(Default)]
pub struct Unwinders {
    files: HashMap<(u64, u64), Option<Arc<FileInfo>>>,
    procs: HashMap<u32, Process>,
    cache: Option<CacheX86_64>,
    /// Samples unwound only as far as the kernel's frame pointers.
    pub fp_only: u64,
}

impl Unwinders {
    fn load(&mut self, pid: u32) -> Option<Process> {
        let maps = exec_mappings(pid).ok()?;
        Some(self.process(pid, &maps))
    }

    /// Takes `maps` as `pid`'s, read elsewhere a moment ago (a process that
    /// may be gone by the time its sample is unwound). Files parsed before
    /// for any process need no opening.
    pub fn set_maps(&mut self, pid: u32, maps: &[Mapping]) {
        let p = self.process(pid, maps);
        self.procs.insert(pid, p);
    }

    fn process(&mut self, pid: u32, maps: &[Mapping]) -> Process {
        let mut unwinder = UnwinderX86_64::new();
        let mut ranges = Vec::new();
        for m in maps {
            let info = self
                .files
                .entry(m.file)
                .or_insert_with(|| FileInfo::read(&m.host_path(pid)).map(Arc::new))
                .clone();
            if let Some(info) = info
                && let Some(module) = info.module(m)
            {
                unwinder.add_module(module);
                ranges.push((m.start..m.end, m.path.clone(), m.offset, info));
            }
        }
        Process {
            retry: Duration::ZERO,
            unwinder,
            ranges,
            read_at: Instant::now(),
        }
    }

    /// Forgets a process.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Where `addr` of `pid` is in its file: a path that opens the file
    /// (held open by tracer), the offset in it, and the path as the process
    /// sees it. Known as long as the process's maps were read once.
    pub fn locate(&self, pid: u32, addr: u64) -> Option<Located> {
        let p = self.procs.get(&pid)?;
        let (r, path, off, info) = p.ranges.iter().find(|(r, ..)| r.contains(&addr))?;
        Some(Located {
            held: info.held_path(),
            offset: addr - r.start + off,
            path: path.clone(),
            own_dwarf: info.own_dwarf,
        })
    }

    /// The path (as `pid` sees it) of the file whose code holds `addr`.
    pub fn file_at(&self, pid: u32, addr: u64) -> Option<&str> {
        self.procs.get(&pid)?.file_at(addr)
    }

    /// The return addresses of a sample, innermost first; the first is the
    /// caller's own position. Addresses are raw (a caller subtracts 1 to
    /// look up the call instruction).
    pub fn unwind(&mut self, pid: u32, s: &Sample) -> Vec<u64> {
        let old = self.procs.get(&pid);
        let stale = old.is_none_or(|p| !p.covers(s.ip) && p.read_at.elapsed() >= p.retry);
        let retry = old.map_or(Duration::ZERO, |p| {
            (p.retry * 2).clamp(FIRST_RETRY, REFRESH)
        });
        if stale && let Some(mut p) = self.load(pid) {
            p.retry = retry;
            self.procs.insert(pid, p);
        }
        let mut frames = Vec::new();
        if let Some(p) = self.procs.get(&pid) {
            let cache = self.cache.get_or_insert_with(CacheX86_64::new);
            let stack = s.stack;
            let sp = s.sp;
            let mut read = |addr: u64| -> Result<u64, ()> {
                let off = addr.checked_sub(sp).ok_or(())? as usize;
                let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
                Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
            };
            let regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
            let mut it = p.unwinder.iter_frames(s.ip, regs, cache, &mut read);
            while frames.len() < MAX_FRAMES {
                match it.next() {
                    Ok(Some(f)) => frames.push(f.address()),
                    _ => break,
                }
            }
        }
        merge(frames, s.fp)
    }
}

/// The unwound frames, continued by the kernel's frame-pointer walk when
/// that walk agrees with every one of them and goes further.
fn merge(mut frames: Vec<u64>, fp: &[u64]) -> Vec<u64> {
    if fp.len() > frames.len() && fp[..frames.len()] == frames[..] {
        frames.extend_from_slice(&fp[frames.len()..fp.len().min(MAX_FRAMES)]);
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_walk_continues_only_an_agreeing_unwind() {
        assert_eq!(merge(vec![1, 2], &[1, 2, 3, 4]), [1, 2, 3, 4]);
        assert_eq!(merge(vec![], &[1, 2]), [1, 2]);
        // Disagreeing (a frame-pointer walk through code without frame
        // pointers goes astray): the unwind stands.
        assert_eq!(merge(vec![1, 5], &[1, 2, 3]), [1, 5]);
        assert_eq!(merge(vec![1, 2, 3], &[1, 2]), [1, 2, 3]);
    }

    #[test]
    fn a_huge_mapped_file_is_read_only_where_needed() {
        // libc, made a 64 GiB (sparse) file: its unwind sections are read,
        // not the file (which would not fit in memory).
        let Ok(libc) = fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            eprintln!("skipped: no glibc at /lib/x86_64-linux-gnu");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.so");
        fs::write(&path, &libc).unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(64 << 30)
            .unwrap();
        let info = FileInfo::read(path.to_str().unwrap()).expect("parsed");
        assert!(info.eh_frame.is_some() && !info.exec.is_empty());
    }

    #[inline(never)]
    fn here(depth: u32, out: &mut Vec<u64>) {
        // Unwind this very thread: the registers and stack of this frame.
        if depth > 0 {
            return here(depth - 1, out);
        }
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers; no memory or flags are touched.
        unsafe {
            std::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
                ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp,
                options(nomem, nostack, preserves_flags));
        }
        // The thread's stack ends a few KiB above this frame: copy up to
        // the end of its mapping, 16 KiB at most.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let end = maps
            .lines()
            .filter_map(|l| {
                let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                let (a, b) = (
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                );
                (a <= sp && sp < b).then_some(b)
            })
            .next()
            .expect("the stack's mapping");
        let len = (end - sp).min(16 * 1024) as usize;
        // SAFETY: `len` bytes from sp lie in this thread's live, mapped stack.
        let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
        let mut u = Unwinders::default();
        *out = u.unwind(
            std::process::id(),
            &Sample {
                ip,
                sp,
                bp,
                stack: &stack,
                fp: &[],
            },
        );
    }

    #[test]
    fn unwinds_this_process_from_eh_frame() {
        let mut frames = Vec::new();
        here(3, &mut frames);
        // The frame itself and its three recursive callers, then the test
        // function and the harness beyond, through to the thread's start.
        assert!(frames.len() >= 6, "{frames:x?}");
        let me = here as *const () as u64;
        let near = |a: u64| a >= me && a < me + 4096;
        assert!(
            frames[..4].iter().all(|&a| near(a)),
            "{frames:x?} vs here at {me:x}"
        );
        assert!(!near(frames[4]), "{frames:x?}");
    }
}
