//! Builds the eBPF programs (tracer-ebpf) for bpfel with aya-build and
//! nightly; `tracer` embeds the resulting object.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tracer has no parent directory"))?
        .join("tracer-ebpf");
    let root_dir = root
        .to_str()
        .ok_or_else(|| anyhow!("non UTF-8 path {root:?}"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
