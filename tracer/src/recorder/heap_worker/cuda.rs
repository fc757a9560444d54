//! The heap worker's part in CUDA allocations' stacks: the allocations
//! that sent one go to its queue, frees only of those pointers, and the
//! device memory by stack comes back.

use tracer_common::heap::HeapAlloc;

use super::{HeapWorker, Msg, Of};
use crate::record::HeapSnapshot;

impl HeapWorker {
    /// The mean bytes between the CUDA allocations under 1 MiB that send
    /// a stack, as the programs were told (0: every one).
    pub fn set_cuda_sample_bytes(&self, bytes: u64) {
        self.cuda_sample_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// A CUDA allocation's stack, or a caching allocator's block's (wall
    /// time `ts_ns`).
    pub fn cuda_alloc(&self, a: Box<HeapAlloc>, ts_ns: u64) {
        let ptrs = match a.func {
            tracer_common::cuda::CACHING_BLOCK => &self.block_ptrs,
            _ => &self.cuda_ptrs,
        };
        if let Ok(mut ptrs) = ptrs.lock() {
            ptrs.insert((a.header.pid, a.addr));
        }
        self.notice(a.header.pid);
        self.read_codes(&a);
        let sample_bytes = self
            .cuda_sample_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        self.send(Msg::CudaAlloc(a, ts_ns, sample_bytes));
    }

    /// A traced CUDA free: only the frees of pointers with stacks are the
    /// worker's (a process may free small blocks hundreds of thousands of
    /// times a second, which must not crowd samples out of its queue).
    /// With `Of::Blocks`, a block given back to a caching allocator.
    pub fn cuda_free(&self, of: Of, pid: u32, ptr: u64) {
        let ptrs = match of {
            Of::Blocks => &self.block_ptrs,
            _ => &self.cuda_ptrs,
        };
        if ptrs.lock().is_ok_and(|mut p| p.remove(&(pid, ptr))) {
            self.send(Msg::CudaFree(of, pid, ptr));
        }
    }

    /// The device memory `pid`'s traced allocations hold, by stack (with
    /// `Of::Blocks`, its caching allocator's blocks); `None` when the
    /// worker is gone or its queue is full.
    pub fn request_cuda(
        &self,
        of: Of,
        pid: u32,
    ) -> Option<tokio::sync::oneshot::Receiver<HeapSnapshot>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .as_ref()?
            .try_send(Msg::CudaSnapshot(of, pid, tx))
            .ok()
            .map(|_| rx)
    }

    /// The device memory `pid`'s traced CUDA allocations held at the last
    /// second, by stack. Never waits.
    pub fn latest_cuda(&self, pid: u32) -> Option<HeapSnapshot> {
        self.latest_cuda.try_lock().ok()?.get(&pid).cloned()
    }
}
