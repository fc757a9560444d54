//! The CUDA family on the user side: which files are CUDA libraries. The
//! rest (finding them in a process through /proc/PID/root, placing and
//! attaching the probes) is the generic code of [`super::uprobe`].

use std::path::Path;

pub use tracer_common::cuda::{FUNCTIONS, name};

/// Whether a mapped file's name makes it a CUDA runtime or driver library.
pub fn is_cuda_library_name(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("libcudart") || base.starts_with("libcuda.so") || base.starts_with("libcuda-")
}

/// The release in a library's file name: `libnvidia-ml.so.535.261.03` ->
/// `535.261.03`, `libcudart.so.12.9.79` -> `12.9.79`; `None` for a bare
/// soname (`libcuda.so.1`).
pub fn release_in_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let (_, version) = name.split_once(".so.")?;
    (version.contains('.') && version.split('.').all(|p| p.parse::<u32>().is_ok()))
        .then(|| version.to_string())
}

/// The release of a CUDA library file (`host_path`, as tracer opens it):
/// from its name, else, for a runtime installed from a wheel
/// (`site-packages/nvidia/cuda_runtime/lib/libcudart.so.12`), from the
/// wheel's `nvidia_cuda_runtime_cu12-12.9.79.dist-info` beside `nvidia/`.
pub fn library_release(host_path: &Path) -> Option<String> {
    if let Some(v) = release_in_name(host_path) {
        return Some(v);
    }
    if !host_path.file_name()?.to_str()?.starts_with("libcudart") {
        return None;
    }
    let site = host_path.ancestors().nth(4)?;
    std::fs::read_dir(site).ok()?.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let stem = name.strip_suffix(".dist-info")?;
        let (dist, version) = stem.split_once('-')?;
        dist.starts_with("nvidia_cuda_runtime_cu")
            .then(|| version.to_string())
    })
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

    #[test]
    fn releases_from_names_and_wheels() {
        for (name, want) in [
            (
                "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03",
                Some("535.261.03"),
            ),
            ("libcuda.so.550.54.15", Some("550.54.15")),
            ("libcuda.so.1", None),
            ("libcudart.so.12.9.79", Some("12.9.79")),
            ("libnvidia-ml.so", None),
            ("libcuda.so.1.bak", None),
        ] {
            assert_eq!(release_in_name(Path::new(name)).as_deref(), want, "{name}");
        }
        let dir = std::env::temp_dir().join(format!("tracer-release-{}", std::process::id()));
        let lib = dir.join("site-packages/nvidia/cuda_runtime/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(
            dir.join("site-packages/nvidia_cuda_runtime_cu12-12.9.79.dist-info"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("site-packages/nvidia_cublas_cu12-12.4.5.8.dist-info"))
            .unwrap();
        assert_eq!(
            library_release(&lib.join("libcudart.so.12")).as_deref(),
            Some("12.9.79")
        );
        assert_eq!(library_release(&lib.join("libcuda.so.1")), None);
        assert_eq!(
            library_release(Path::new("/usr/lib/libcuda.so.550.54.15")).as_deref(),
            Some("550.54.15")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
