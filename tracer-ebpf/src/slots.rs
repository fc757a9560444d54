//! Per-thread state of the uprobe families (CUDA, heap): the call a thread
//! has open, and what it keeps between calls. Each thread has a slot in an
//! array, at its id modulo the array's size: the verifier inlines an
//! array's lookup, where a hash map's cost about 30 ns a call on the test
//! VM and an LRU insert and delete per call about 40 % of what the CUDA
//! programs added to a call. A slot is owned by the thread that called
//! last; a thread whose slot holds another thread's open call (two ids
//! equal modulo the size, in calls at once) uses a small LRU spill map
//! instead, where its nested calls and its return find it.

use aya_ebpf::maps::{Array, LruHashMap};

/// A thread's state as the slots keep it.
pub trait Frame: Copy + Default {
    /// The thread (pid_tgid) it belongs to.
    fn owner(&self) -> u64;
    /// Probed calls open (0: none).
    fn depth(&mut self) -> &mut u32;
    /// When the outermost open call entered.
    fn ts_ns(&self) -> u64;
    /// Makes it thread `tid`'s, with no call open and what a thread keeps
    /// between calls as the thread last left it.
    fn claim(&mut self, tid: u64);
}

/// The accessors of [`Frame`] for a type with `owner`, `depth` and `ts_ns`
/// fields.
macro_rules! frame_fields {
    () => {
        #[inline(always)]
        fn owner(&self) -> u64 {
            self.owner
        }

        #[inline(always)]
        fn depth(&mut self) -> &mut u32 {
            &mut self.depth
        }

        #[inline(always)]
        fn ts_ns(&self) -> u64 {
            self.ts_ns
        }
    };
}
pub(crate) use frame_fields;

/// The slots of one family, its spill map, and how old an open call may be
/// before it counts as lost (its thread died in it).
pub struct PerThread<T: 'static> {
    pub slots: &'static Array<T>,
    pub spill: &'static LruHashMap<u64, T>,
    pub stale_ns: u64,
    /// Slots in `slots`, a power of two.
    pub count: u32,
}

impl<T: Frame> PerThread<T> {
    /// Thread `tid`'s slot, whoever owns it now.
    #[inline(always)]
    fn slot(&self, tid: u64) -> Option<*mut T> {
        self.slots.get_ptr_mut(tid as u32 & (self.count - 1))
    }

    /// Whether `f` holds a call that is still open.
    ///
    /// # Safety
    /// `f` points at a live map value.
    #[inline(always)]
    pub unsafe fn open(&self, f: *mut T, now: u64) -> bool {
        // SAFETY: the caller's contract.
        unsafe { *(*f).depth() > 0 && now.saturating_sub((*f).ts_ns()) < self.stale_ns }
    }

    /// At a return, on the state `current` gave: the outermost call's
    /// state when this return closes it (left with no call open); `None`
    /// for a nested call's return (one fewer open) or when no call is open
    /// (a return whose entry ran before the probe was attached).
    ///
    /// # Safety
    /// `f` points at a live map value.
    #[inline(always)]
    pub unsafe fn leave(&self, f: *mut T) -> Option<T> {
        // SAFETY: the caller's contract.
        unsafe {
            let depth = (*f).depth();
            match *depth {
                0 => None,
                1 => {
                    *depth = 0;
                    Some(*f)
                }
                _ => {
                    *depth -= 1;
                    None
                }
            }
        }
    }

    /// At an entry, on the state `entry` gave: true when a call is open
    /// already, which this one only deepens.
    ///
    /// # Safety
    /// `f` points at a live map value.
    #[inline(always)]
    pub unsafe fn nested(&self, f: *mut T, now: u64) -> bool {
        // SAFETY: the caller's contract.
        unsafe {
            if self.open(f, now) {
                *(*f).depth() += 1;
                return true;
            }
        }
        false
    }

    /// Thread `tid`'s state as it stands (at a return, or to ask whether it
    /// is inside a call): its slot when it owns it, else its spill entry.
    #[inline(always)]
    pub fn current(&self, tid: u64) -> Option<*mut T> {
        let slot = self.slot(tid)?;
        // SAFETY: reading a live map value.
        if unsafe { (*slot).owner() } == tid {
            Some(slot)
        } else {
            self.spill.get_ptr_mut(&tid)
        }
    }

    /// Thread `tid`'s state for a call entering `now`: its slot, which it
    /// takes when the thread there has no call open; else its spill entry,
    /// made here if it has none.
    #[inline(always)]
    pub fn entry(&self, tid: u64, now: u64) -> Option<*mut T> {
        let slot = self.slot(tid)?;
        // SAFETY: live map values. A slot is written by the programs of
        // the threads that share it; two of them entering at the same
        // instant on two CPUs can mix their states, never reach outside
        // the value.
        unsafe {
            if (*slot).owner() == tid {
                return Some(slot);
            }
            let spilled = self.spill.get_ptr_mut(&tid);
            if let Some(s) = spilled
                && self.open(s, now)
            {
                return Some(s);
            }
            if !self.open(slot, now) {
                (*slot).claim(tid);
                return Some(slot);
            }
            if let Some(s) = spilled {
                (*s).claim(tid);
                return Some(s);
            }
            let mut fresh = T::default();
            fresh.claim(tid);
            self.spill.insert(&tid, &fresh, 0).ok()?;
            self.spill.get_ptr_mut(&tid)
        }
    }
}
