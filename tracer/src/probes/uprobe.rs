//! A family of user-space functions probed by uprobes: which functions
//! (ids and symbols), which files may hold them, and the programs that
//! serve them. CUDA is one; a new family (libc's allocator) is one more
//! constant, and the library watcher and the attach code serve it as is.

use tracer_common::programs;

/// One family of probed functions.
#[derive(Debug)]
pub struct UprobeFamily {
    /// Its name in logs.
    pub name: &'static str,
    /// Every probed function: (id, symbol). The id is the attach cookie.
    pub functions: &'static [(u32, &'static str)],
    /// Whether a mapped file, by its name, may hold the functions (the
    /// executable is always looked at: the code can be linked in).
    pub library: fn(&str) -> bool,
    /// The layer a function belongs to (a library exports a whole layer,
    /// so a function of a layer it has but does not export is missing).
    pub layer: fn(u32) -> u32,
    /// The (entry, return) programs.
    pub programs: [&'static str; 2],
    /// The empty (entry, return) twins, for benchmarks of the floor cost.
    pub floor: [&'static str; 2],
}

impl UprobeFamily {
    /// The programs to attach: the real ones, or the empty floor twins.
    pub fn programs(&self, floor: bool) -> [&'static str; 2] {
        if floor { self.floor } else { self.programs }
    }

    /// The id of a symbol of this family.
    pub fn id_of(&self, symbol: &str) -> Option<u32> {
        self.functions
            .iter()
            .find(|(_, s)| *s == symbol)
            .map(|(id, _)| *id)
    }
}

/// The CUDA runtime and driver allocation APIs.
pub const CUDA: UprobeFamily = UprobeFamily {
    name: "CUDA",
    functions: tracer_common::cuda::FUNCTIONS,
    library: super::cuda::is_cuda_library_name,
    layer: |id| u32::from(id >= tracer_common::cuda::DRIVER),
    programs: [programs::CUDA_ENTRY, programs::CUDA_RETURN],
    floor: [programs::CUDA_FLOOR_ENTRY, programs::CUDA_FLOOR_RETURN],
};
