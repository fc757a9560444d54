//! The CUDA family on the user side: which files are CUDA libraries. The
//! rest (finding them in a process through /proc/PID/root, placing and
//! attaching the probes) is the generic code of [`super::uprobe`].

pub use tracer_common::cuda::{FUNCTIONS, name};

/// Whether a mapped file's name makes it a CUDA runtime or driver library.
pub fn is_cuda_library_name(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libcudart") || base.starts_with("libcuda.so") || base.starts_with("libcuda-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use tracer_common::cuda;

    #[test]
    fn every_function_has_a_shape_and_a_unique_id() {
        let mut ids = HashSet::new();
        for (id, sym) in FUNCTIONS {
            assert!(cuda::shape(*id).is_some(), "{sym}");
            assert!(ids.insert(*id), "{sym}");
            assert_eq!(*id < cuda::DRIVER, sym.starts_with("cuda"), "{sym} layer");
        }
        assert_eq!(name(cuda::MEM_ALLOC), "cuMemAlloc_v2");
        assert!(cuda::allocates(cuda::MALLOC) && cuda::allocates(cuda::MEM_CREATE));
        assert!(!cuda::allocates(cuda::FREE) && !cuda::allocates(cuda::MEM_ADDRESS_RESERVE));
    }

    #[test]
    fn library_names_and_maps() {
        for (p, want) in [
            (
                "/usr/local/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
                true,
            ),
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", true),
            ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", true),
            ("/opt/conda/lib/libcudart-d0da41ae.so.11.0", true),
            ("/usr/lib/x86_64-linux-gnu/libcudnn.so.9", false),
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", false),
        ] {
            assert_eq!(is_cuda_library_name(p), want, "{p}");
        }
    }
}
