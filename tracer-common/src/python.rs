//! CPython frames read by the stack programs: where a sampled thread's
//! interpreter is in Python code. Userspace finds a process's interpreter
//! (`_PyRuntime` and its version) and writes its layout into
//! [`crate::maps::PY_PROCS`]; the programs that copy a user stack then walk
//! the thread's frame chain and send each frame's code object and
//! instruction. Userspace reads the code objects' names and line tables.

/// Python frames kept per sample (the innermost).
pub const FRAMES: usize = 32;
/// Threads of an interpreter looked at to find the sampled one.
pub const THREADS: usize = 64;
/// Processes with a known interpreter at once.
pub const PROCS: u32 = 4096;
/// An offset this version's layout lacks.
pub const NONE: u16 = u16::MAX;

/// Where an interpreter's state is in a process, and the offsets of the
/// fields the walk reads (they differ by CPython version).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// `_PyRuntimeState.interpreters.head`.
    pub interp_head: u16,
    /// `PyInterpreterState.threads.head` (`tstate_head` before 3.11).
    pub threads_head: u16,
    /// `PyThreadState.next`.
    pub ts_next: u16,
    /// The thread state's id of its thread: `native_thread_id` (the
    /// kernel's tid), or `thread_id` (`pthread_self()`) where
    /// [`PyLayout::id_is_pthread`] is set.
    pub ts_id: u16,
    /// `PyThreadState.frame` (to 3.10), `.cframe` (3.11, 3.12),
    /// `.current_frame` (3.13).
    pub ts_frame: u16,
    /// `_PyCFrame.current_frame` where `ts_frame` is the cframe; [`NONE`].
    pub cframe_frame: u16,
    /// The frame's caller: `f_back` (to 3.10), `previous`.
    pub f_back: u16,
    /// The frame's code object: `f_code`, `f_executable` (3.13).
    pub f_code: u16,
    /// `f_lasti` (an int, to 3.10), `prev_instr` (3.11, 3.12), `instr_ptr`.
    pub f_instr: u16,
    /// The byte that marks a C entry: `is_entry` (3.11), `owner` (3.12+);
    /// [`NONE`] before 3.11.
    pub f_owner: u16,
    /// 1: `ts_id` holds `pthread_self()`, matched against the task's
    /// `fsbase` (x86_64's thread pointer, which glibc's and musl's
    /// `pthread_self()` return).
    pub id_is_pthread: u8,
    /// 1: `f_instr` is a pointer; 0: a 32-bit instruction index.
    pub instr_is_ptr: u8,
    /// Explicit padding.
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<PyLayout>() == 32);

/// One frame: its code object and its instruction (pointer, or index),
/// with its owner byte in the top 8 bits ([`owner_of`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    /// `PyCodeObject *`.
    pub code: u64,
    /// Instruction (low 56 bits) and owner byte (top 8).
    pub instr: u64,
}
const _: () = assert!(size_of::<PyFrame>() == 16);

/// The owner (or `is_entry`) byte of a frame's `instr` word.
pub const fn owner_of(instr: u64) -> u8 {
    (instr >> 56) as u8
}

/// The instruction of a frame's `instr` word.
pub const fn instr_of(instr: u64) -> u64 {
    instr & ((1 << 56) - 1)
}

/// What the walk found ([`crate::heap::HeapAlloc::py_status`]).
pub mod status {
    /// The process has no known interpreter.
    pub const NONE: u16 = 0;
    /// Every frame up to the thread's first was read.
    pub const OK: u16 = 1;
    /// The sampled thread is no thread of the interpreter (it never ran
    /// Python, or it is past the threads looked at).
    pub const NO_THREAD: u16 = 2;
    /// A read of the interpreter's memory failed (a page not present).
    pub const READ_FAILED: u16 = 3;
    /// More frames than [`super::FRAMES`]: the outermost are left out.
    pub const TRUNCATED: u16 = 4;
}
