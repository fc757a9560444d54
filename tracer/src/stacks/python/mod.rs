//! CPython frames in sampled stacks, seen from outside the process.
//!
//! The stack programs walk a sampled thread's Python frames (see
//! `tracer_common::python`) once userspace has told them where the
//! process's interpreter is. This module finds the interpreter in a
//! process's mappings (`_PyRuntime` and the version, from the ELF file of
//! `python3.N` or `libpython3.N.so`), reads the frames' code objects from
//! the process's memory (name, file and line table; checked to be code
//! objects), turns each frame's instruction into its line, and puts the
//! Python frames where the native stack ran the interpreter's loop.
//!
//! The field offsets are per CPython version, read from the DWARF of real
//! builds (`docs/dev/python.md` says how). A version not in the table, or
//! a walk or read that fails, gives a `<python frames unavailable: ...>`
//! frame: never a guessed line.

mod code;
mod layout;
mod memory;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tracer_common::{
    heap::HeapAlloc,
    python::{self as py, instr_of, owner_of},
};

pub use self::layout::{Detector, Interpreter};
use self::{
    code::{Code, line_310, line_311, line_lnotab, read_code},
    layout::OWNED_BY_CSTACK,
};
use super::symbols::Frame;

/// The walk's statuses, and this side's own.
mod status {
    pub use tracer_common::python::status::*;
    /// The programs walked frames of an interpreter this side no longer
    /// knows.
    pub const NO_INTERPRETER: u16 = 100;
}

/// Marks where a sample's Python words start in its frames' key: native
/// return addresses, then `MARK`, the walk's status, and a (code object,
/// line word) pair per frame (see [`Interpreters::append`]). No user
/// address is `MARK`.
pub const MARK: u64 = u64::MAX;

/// A line word's flag: the frame's code object could not be read (the
/// low bits say why, as an index into [`WHY`]).
const UNREADABLE: u64 = 1 << 55;
/// A line word's flag: the frame is the shim of a C entry (3.12+).
const SHIM: u64 = 1 << 54;
/// Why a code object could not be read, by index.
const WHY: [&str; 5] = [
    "its code object could not be read",
    "a frame's code is not a code object",
    "a code object's name or file could not be read",
    "a line table could not be read",
    "its code object was not read in time, or too many were",
];

/// A key's native addresses, and its Python status and words.
pub fn split(frames: &[u64]) -> (&[u64], Option<(u16, &[u64])>) {
    match frames.iter().position(|&w| w == MARK) {
        Some(i) => {
            let st = frames.get(i + 1).copied().unwrap_or(0) as u16;
            let words = frames.get(i + 2..).unwrap_or(&[]);
            (&frames[..i], Some((st, words)))
        }
        None => (frames, None),
    }
}

/// Code objects read per process at most (a process's code rarely has
/// more); past it, frames say so.
const CODES_PER_PROCESS: usize = 65_536;

/// Processes' interpreters and the code objects read from them, shared by
/// the threads that find interpreters and read code objects (while the
/// process lives: a sample may be named after its process was killed) and
/// the one that names samples. No lock is held while another process's
/// memory is read.
#[derive(Clone, Default)]
pub struct Interpreters(Arc<Mutex<Known>>);

#[derive(Default)]
struct Known {
    procs: HashMap<u32, Proc>,
    /// Processes running an interpreter tracer cannot walk, with why.
    failed: HashMap<u32, String>,
    /// Bytes of names and line tables kept, all processes.
    bytes: usize,
}

/// Bytes of code objects' names and line tables kept at most, all
/// processes together: a process can make code objects at will, and any
/// local user can run one.
const CODE_BYTES: usize = 64 << 20;

impl Code {
    fn bytes(&self) -> usize {
        self.name.len() + self.file.len() + self.table.len()
    }
}

impl Known {
    fn remove(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            let freed: usize = p.codes.values().flatten().map(Code::bytes).sum();
            self.bytes = self.bytes.saturating_sub(freed);
        }
        self.failed.remove(&pid);
    }
}

struct Proc {
    interp: Interpreter,
    codes: HashMap<u64, Result<Code, usize>>,
}

/// One Python frame, named, and whether a C entry into the interpreter's
/// loop is just outside it (the native frame that ran it comes next).
struct Named {
    frame: Frame,
    entry: bool,
}

fn unavailable(why: &str) -> Frame {
    Frame {
        function: Some(format!("<python frames unavailable: {why}>")),
        ..Default::default()
    }
}

/// Whether a native frame is the interpreter's loop.
fn is_eval(f: &Frame) -> bool {
    f.function.as_deref() == Some("_PyEval_EvalFrameDefault")
}

/// A sample's frames that name a code object (not a C entry's shim).
fn code_frames(minor: u8, a: &HeapAlloc) -> impl Iterator<Item = &tracer_common::python::PyFrame> {
    a.py.iter()
        .take((a.py_len as usize).min(py::FRAMES))
        .filter(move |f| !(minor >= 12 && owner_of(f.instr) == OWNED_BY_CSTACK))
}

impl Interpreters {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What [`Detector::detect`] found for `pid`.
    pub fn set(&self, pid: u32, found: &Result<Option<Interpreter>, String>) {
        let mut k = self.known();
        // The same interpreter found again (its maps are read again as it
        // runs): its code objects stay.
        if let (Ok(Some(i)), Some(p)) = (found, k.procs.get(&pid))
            && p.interp.layout == i.layout
        {
            return;
        }
        k.remove(pid);
        match found {
            Ok(Some(i)) => {
                k.procs.insert(
                    pid,
                    Proc {
                        interp: i.clone(),
                        codes: HashMap::new(),
                    },
                );
            }
            Ok(None) => {}
            Err(why) => {
                k.failed.insert(pid, why.clone());
            }
        }
    }

    /// Forgets a process (it exited, or exec'd another program).
    pub fn forget(&self, pid: u32) {
        self.known().remove(pid);
    }

    /// The code objects of a sample not read yet.
    pub fn unread(&self, pid: u32, a: &HeapAlloc) -> Vec<u64> {
        if a.py_status == status::NONE {
            return Vec::new();
        }
        let k = self.known();
        let Some(p) = k.procs.get(&pid) else {
            return Vec::new();
        };
        let mut out: Vec<u64> = code_frames(p.interp.minor, a)
            .map(|f| f.code)
            .filter(|c| !p.codes.contains_key(c))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Reads these code objects of `pid` (none read twice).
    pub fn read(&self, pid: u32, codes: &[u64]) {
        let Some(interp) = self.known().procs.get(&pid).map(|p| p.interp.clone()) else {
            return;
        };
        let read: Vec<(u64, Result<Code, usize>)> = codes
            .iter()
            .map(|&c| (c, read_code(pid, &interp, c)))
            .collect();
        let mut k = self.known();
        let mut total = k.bytes;
        let Some(p) = k.procs.get_mut(&pid) else {
            return;
        };
        for (c, code) in read {
            let size = code.as_ref().map(Code::bytes).unwrap_or(0);
            if p.codes.len() >= CODES_PER_PROCESS || total + size > CODE_BYTES {
                break;
            }
            // A failed read is kept only where none succeeded before.
            if code.is_ok() || !p.codes.contains_key(&c) {
                total += size;
                if let Some(Ok(old)) = p.codes.insert(c, code) {
                    total -= old.bytes();
                }
            }
        }
        k.bytes = total;
    }

    /// Appends a sample's Python frames to its native return addresses
    /// (see [`MARK`]): each frame as its code object and its line, so that
    /// samples of one line are one site, whatever instruction of it ran.
    /// Code objects not read yet are read now.
    pub fn append(&self, pid: u32, a: &HeapAlloc, frames: &mut Vec<u64>) {
        if a.py_status == status::NONE {
            return;
        }
        let unread = self.unread(pid, a);
        if !unread.is_empty() {
            self.read(pid, &unread);
        }
        frames.push(MARK);
        let k = self.known();
        let Some(p) = k.procs.get(&pid) else {
            // The programs walked with a layout this side has forgotten
            // (an exec raced the sample): nothing of it can be trusted.
            frames.push(status::NO_INTERPRETER as u64);
            return;
        };
        frames.push(a.py_status as u64);
        let o = p.interp.offsets;
        for f in a.py.iter().take((a.py_len as usize).min(py::FRAMES)) {
            let (instr, owner) = (instr_of(f.instr), owner_of(f.instr));
            let owner_bits = (owner as u64) << 56;
            if o.minor >= 12 && owner == OWNED_BY_CSTACK {
                frames.extend([0, SHIM | owner_bits]);
                continue;
            }
            let word = match p.codes.get(&f.code) {
                Some(Ok(c)) => {
                    let lasti = if o.instr_is_ptr {
                        (instr as i64 - (f.code + o.co_code as u64) as i64) / 2
                    } else {
                        instr as u32 as i32 as i64
                    };
                    let line = if lasti < 0 {
                        Some(c.first)
                    } else {
                        match o.minor {
                            9 => line_lnotab(c.first, &c.table, lasti),
                            10 => line_310(c.first, &c.table, lasti * 2),
                            _ => line_311(c.first, &c.table, lasti),
                        }
                    };
                    // 0: no line.
                    line.and_then(|l| u32::try_from(l).ok()).unwrap_or(0) as u64
                }
                Some(Err(why)) => UNREADABLE | *why as u64,
                None => UNREADABLE | 4,
            };
            frames.extend([f.code, word | owner_bits]);
        }
    }

    /// Names the Python frames of a sample's words.
    fn named(&self, pid: u32, words: &[u64]) -> Result<Vec<Named>, String> {
        let k = self.known();
        let p = k
            .procs
            .get(&pid)
            .ok_or("the interpreter is no longer known")?;
        let minor = p.interp.minor;
        let mut out: Vec<Named> = Vec::new();
        for pair in words.chunks_exact(2) {
            let (code, word) = (pair[0], pair[1]);
            let owner = owner_of(word);
            if word & SHIM != 0 {
                if let Some(last) = out.last_mut() {
                    last.entry = true;
                }
                continue;
            }
            let frame = match p.codes.get(&code) {
                _ if word & UNREADABLE != 0 => {
                    unavailable(WHY.get((word & 0xff) as usize).copied().unwrap_or(WHY[0]))
                }
                Some(Ok(c)) => Frame {
                    function: Some(c.name.clone()),
                    file: Some(c.file.clone()),
                    line: Some((word & 0xffff_ffff) as u32).filter(|&l| l != 0),
                    module: None,
                    python: true,
                },
                _ => unavailable(WHY[0]),
            };
            out.push(Named {
                frame,
                // To 3.10 each frame has its own run of the loop; 3.11
                // marks the frame a C entry ran first.
                entry: minor <= 10 || (minor == 11 && owner != 0),
            });
        }
        Ok(out)
    }

    /// Puts the Python frames of a sample among its named native frames:
    /// each run of the interpreter's loop (`_PyEval_EvalFrameDefault`) is
    /// replaced by the Python frames it ran; frames of runs the native
    /// unwind did not reach go after the native ones (they are outer).
    pub fn interleave(&self, pid: u32, native: Vec<Frame>, st: u16, words: &[u64]) -> Vec<Frame> {
        let ran_python = native.iter().any(is_eval);
        let named = match st {
            status::NO_INTERPRETER => Err("the process exec'd as it was sampled".into()),
            status::OK | status::TRUNCATED | status::READ_FAILED => self.named(pid, words),
            status::NO_THREAD if ran_python => Err(format!(
                "the thread is not among the interpreter's first {} threads",
                py::THREADS
            )),
            _ => Ok(Vec::new()),
        };
        let named = match named {
            Ok(n) => n,
            Err(why) => {
                let mut out = native;
                out.push(unavailable(&why));
                return out;
            }
        };
        let mut runs: Vec<Vec<Frame>> = vec![Vec::new()];
        for n in named {
            runs.last_mut().expect("a run").push(n.frame);
            if n.entry {
                runs.push(Vec::new());
            }
        }
        runs.retain(|r| !r.is_empty());
        let mut runs = runs.into_iter();
        let mut out = Vec::with_capacity(native.len() + words.len() / 2);
        for f in native {
            if is_eval(&f)
                && let Some(r) = runs.next()
            {
                out.extend(r);
                continue;
            }
            out.push(f);
        }
        out.extend(runs.flatten());
        match st {
            status::TRUNCATED => out.push(unavailable(&format!(
                "more than {} Python frames; the outer ones are left out",
                py::FRAMES
            ))),
            status::READ_FAILED => out.push(unavailable(
                "a read of the interpreter's memory failed; outer frames are left out",
            )),
            _ => {}
        }
        out
    }

    /// Why `pid`'s interpreter cannot be walked, when it cannot.
    pub fn failed(&self, pid: u32) -> Option<String> {
        self.known().failed.get(&pid).cloned()
    }
}

/// pyenv's install of CPython 3.`minor` on this machine kind (the tests'
/// real interpreters); `None` where it is missing, which fails in CI.
#[cfg(test)]
pub(crate) fn pyenv(minor: u8) -> Option<std::path::PathBuf> {
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
        });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CPython 3.{minor} is missing from pyenv"
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> Frame {
        Frame {
            function: Some(name.into()),
            module: Some("libpython3.so".into()),
            ..Default::default()
        }
    }

    /// Interpreters that know three code objects of pid 7.
    fn known(minor: u8) -> Interpreters {
        let i = Interpreters::default();
        i.set(7, &Ok(Some(layout::for_test(minor))));
        let mut k = i.known();
        let p = k.procs.get_mut(&7).unwrap();
        for (code, name) in [(0x10, "grow"), (0x20, "main"), (0x30, "<module>")] {
            p.codes.insert(
                code,
                Ok(Code {
                    name: name.into(),
                    file: "/srv/app.py".into(),
                    first: 1,
                    table: Vec::new(),
                }),
            );
        }
        drop(k);
        i
    }

    fn labels(frames: &[Frame]) -> Vec<String> {
        frames.iter().map(Frame::chain_label).collect()
    }

    /// Each run of the interpreter's loop gives way to the Python frames
    /// it ran: 3.12's shim frames part the runs (and are not shown), 3.11
    /// marks the first frame of each run; a run the native unwind did not
    /// reach goes last.
    #[test]
    fn python_frames_take_the_place_of_the_loop_that_ran_them() {
        let stack = || {
            vec![
                native("list_repeat"),
                native("_PyEval_EvalFrameDefault"),
                native("PyObject_Call"),
                native("_PyEval_EvalFrameDefault"),
                native("Py_RunMain"),
            ]
        };
        let shim = [0, SHIM | ((OWNED_BY_CSTACK as u64) << 56)];
        let v312: Vec<u64> = [[0x10, 9], [0x20, 15]]
            .into_iter()
            .flatten()
            .chain(shim)
            .chain([0x30, 18])
            .chain(shim)
            .collect();
        let want = [
            "list_repeat",
            "grow (app.py:9)",
            "main (app.py:15)",
            "PyObject_Call",
            "<module> (app.py:18)",
            "Py_RunMain",
        ];
        let got = known(12).interleave(7, stack(), status::OK, &v312);
        assert_eq!(labels(&got), want);
        let entry = 1u64 << 56;
        let v311 = [0x10, 9, 0x20, 15 | entry, 0x30, 18 | entry];
        let got = known(11).interleave(7, stack(), status::OK, &v311);
        assert_eq!(labels(&got), want);
        // The unwind stopped before the outer run: it goes last.
        let short = stack()[..3].to_vec();
        let got = known(11).interleave(7, short, status::TRUNCATED, &v311);
        assert_eq!(
            labels(&got),
            [
                "list_repeat",
                "grow (app.py:9)",
                "main (app.py:15)",
                "PyObject_Call",
                "<module> (app.py:18)",
                "<python frames unavailable: more than 32 Python frames; the outer ones are left out>",
            ]
        );
    }

    /// A frame whose code object could not be read, or a process whose
    /// interpreter is unknown, says so; it never shows another line.
    #[test]
    fn what_cannot_be_read_says_so() {
        let i = known(12);
        let got = i.interleave(
            7,
            vec![native("_PyEval_EvalFrameDefault")],
            status::OK,
            &[0x40, UNREADABLE | 1],
        );
        assert_eq!(
            labels(&got),
            ["<python frames unavailable: a frame's code is not a code object>"]
        );
        let got = i.interleave(
            8,
            vec![native("_PyEval_EvalFrameDefault")],
            status::OK,
            &[0x10, 9],
        );
        assert_eq!(
            labels(&got),
            [
                "_PyEval_EvalFrameDefault",
                "<python frames unavailable: the interpreter is no longer known>"
            ]
        );
        assert_eq!(
            split(&[1, 2, MARK, 1, 0x10, 9]),
            (&[1u64, 2][..], Some((1, &[0x10u64, 9][..])))
        );
        assert_eq!(split(&[1, 2]), (&[1u64, 2][..], None));
    }
}
