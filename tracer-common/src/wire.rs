//! The records the probes write to the rings, in one registry: each record
//! type, the kinds it carries and their stable names. The reader's size
//! check ([`MAX_EVENT_SIZE`]), the decoder's names and `tracer events
//! --kind` all come from it, so a new kind is added here once.

use core::mem::size_of;

use crate::{
    CgroupDir, CudaCall, EventHeader, MemcgEvent, OomVictim, ProcExec, ProcExit, ProcFork, Reap,
    SignalKill,
    growth::GrowthReturn,
    heap::{HeapAlloc, HeapFree},
    kind,
    usdt::UsdtEvent,
};

/// A record type the probes write to a ring, which the reader views as
/// bytes (and tests build from bytes).
///
/// # Safety
///
/// An implementor is `#[repr(C)]` and `Copy`, has no padding the compiler
/// adds (every gap is a named `_pad` field, so every byte is initialized),
/// and every bit pattern of its size is a valid value (integers and byte
/// arrays only: no `bool`, `char`, enum, reference or pointer field).
/// Reading one from a ring's bytes, and writing one as bytes, is then
/// sound.
pub unsafe trait WireEvent: Copy + 'static {}

// SAFETY: the header every record starts with: `#[repr(C)]`, integers and
// a byte array, no implicit padding (its size assertion pins it).
unsafe impl WireEvent for EventHeader {}

/// One kind of event on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventKindInfo {
    /// Its value in `EventHeader::kind`.
    pub kind: u32,
    /// Its stable name, in the store and in JSON.
    pub name: &'static str,
    /// The size of its record.
    pub size: usize,
    /// Whether the recorder stores it as an event row (heap, growth and
    /// allocator samples go to the heap worker and the ledgers instead).
    pub stored: bool,
}

macro_rules! registry {
    ($($ty:ty => [$(($kind:expr, $name:literal, $stored:literal)),+ $(,)?]),+ $(,)?) => {
        // SAFETY: each type listed is a `#[repr(C)]` record of fixed-width
        // integers and byte arrays with explicit `_pad` fields; the size
        // assertions next to each definition pin its layout.
        $(unsafe impl WireEvent for $ty {})+

        /// Every kind of event on the wire, by record type.
        pub const EVENT_KINDS: &[EventKindInfo] = &[
            $($(EventKindInfo {
                kind: $kind,
                name: $name,
                size: size_of::<$ty>(),
                stored: $stored,
            },)+)+
        ];
    };
}

registry! {
    OomVictim => [(kind::OOM_VICTIM, "oom_victim", true)],
    Reap => [
        (kind::REAP_START, "reap_start", true),
        (kind::REAP_FINISH, "reap_finish", true),
    ],
    MemcgEvent => [(kind::MEMCG_OOM, "memcg_oom", true)],
    ProcExec => [(kind::PROC_EXEC, "exec", true)],
    ProcFork => [(kind::PROC_FORK, "fork", true)],
    ProcExit => [(kind::PROC_EXIT, "exit", true)],
    SignalKill => [(kind::SIGNAL_KILL, "signal_kill", true)],
    CudaCall => [(kind::CUDA_CALL, "cuda_call", true)],
    HeapAlloc => [
        (kind::HEAP_ALLOC, "heap_alloc", false),
        (kind::GROWTH_FAULT, "growth_fault", false),
        (kind::OOM_TIP, "oom_tip", false),
        (kind::CUDA_STACK, "cuda_stack", false),
    ],
    HeapFree => [(kind::HEAP_FREE, "heap_free", false)],
    GrowthReturn => [(kind::GROWTH_RETURN, "growth_return", false)],
    UsdtEvent => [(kind::USDT, "usdt", false)],
    CgroupDir => [
        (kind::CGROUP_MKDIR, "cgroup_mkdir", false),
        (kind::CGROUP_RMDIR, "cgroup_rmdir", false),
    ],
}

/// The registry's entry of `kind`.
pub fn kind_info(kind: u32) -> Option<&'static EventKindInfo> {
    EVENT_KINDS.iter().find(|k| k.kind == kind)
}

/// The largest record on the wire; a reader rejects anything bigger.
pub const MAX_EVENT_SIZE: usize = {
    let mut max = 0;
    let mut i = 0;
    while i < EVENT_KINDS.len() {
        if EVENT_KINDS[i].size > max {
            max = EVENT_KINDS[i].size;
        }
        i += 1;
    }
    max
};

/// Views a wire record as its bytes.
pub fn as_bytes<T: WireEvent>(v: &T) -> &[u8] {
    // SAFETY: `WireEvent` promises no uninitialized (padding) bytes; the
    // slice borrows `v` for its size.
    unsafe { core::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Reads a wire record from the start of `bytes`, or `None` when they are
/// too few.
pub fn read<T: WireEvent>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length is checked above; `WireEvent` promises that every
    // bit pattern is a valid `T`; `read_unaligned` copes with the ring's
    // 8-byte alignment not being `T`'s.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names_are_unique() {
        for (i, a) in EVENT_KINDS.iter().enumerate() {
            for b in &EVENT_KINDS[i + 1..] {
                assert!(a.kind != b.kind && a.name != b.name, "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn the_largest_record_bounds_the_reader() {
        assert_eq!(MAX_EVENT_SIZE, size_of::<HeapAlloc>());
        assert!(EVENT_KINDS.iter().all(|k| k.size <= MAX_EVENT_SIZE));
    }

    #[test]
    fn a_record_reads_back_from_its_bytes() {
        let v = ProcFork {
            child_pid: 77,
            child_start_ns: 12_345,
            ..Default::default()
        };
        let back: ProcFork = read(as_bytes(&v)).unwrap();
        assert_eq!(back, v);
        assert!(read::<ProcFork>(&as_bytes(&v)[1..]).is_none());
    }
}
