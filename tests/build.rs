//! Builds the simulated CUDA libraries and the `cudaload` workload (C, in
//! simcuda/) into OUT_DIR/simcuda, and tells the crate where they are.
use std::{env, path::PathBuf, process::Command};

fn cc(args: &[&str]) {
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&compiler)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(status.success(), "{compiler} {args:?} failed");
}

/// Debian's systemtap-sdt-dev header.
const SDT_H: &str = "/usr/include/x86_64-linux-gnu/sys/sdt.h";

fn main() {
    let src = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("simcuda");
    let out = PathBuf::from(env::var("OUT_DIR").expect("out dir")).join("simcuda");
    std::fs::create_dir_all(&out).expect("mkdir OUT_DIR/simcuda");
    let s = |f: &str| src.join(f).display().to_string();
    let o = |f: &str| out.join(f).display().to_string();
    let flags = ["-O2", "-g", "-Wall", "-Wextra", "-Werror"];
    let args: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let run = |extra: &[String]| {
        let all: Vec<&str> = args.iter().chain(extra).map(String::as_str).collect();
        cc(&all);
    };
    run(&[
        "-shared".into(),
        "-fPIC".into(),
        "-Wl,-soname,libcuda.so.1".into(),
        "-o".into(),
        o("libcuda.so.1"),
        s("driver.c"),
        "-lpthread".into(),
    ]);
    run(&[
        "-shared".into(),
        "-fPIC".into(),
        "-Wl,-soname,libcudart.so.12".into(),
        "-o".into(),
        o("libcudart.so.12"),
        s("runtime.c"),
        "-ldl".into(),
        "-lpthread".into(),
    ]);
    run(&[
        "-shared".into(),
        "-fPIC".into(),
        "-Wl,-soname,libnvidia-ml.so.1".into(),
        "-o".into(),
        o("libnvidia-ml.so.1"),
        s("nvml.c"),
    ]);
    run(&[
        "-o".into(),
        o("cudaload"),
        s("cudaload.c"),
        "-ldl".into(),
        "-lpthread".into(),
    ]);
    run(&[
        "-DSIMCUDA_STATIC".into(),
        "-DCUDALOAD_STATIC".into(),
        "-o".into(),
        o("cudaload-static"),
        s("cudaload.c"),
        s("runtime.c"),
        s("driver.c"),
        "-ldl".into(),
        "-lpthread".into(),
    ]);
    // The heap tests' program, with and without frame pointers, and a
    // stripped static build (an allocator tracer cannot see).
    let heap = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("c/heapsites.c")
        .display()
        .to_string();
    for (name, extra) in [
        ("heapsites-fp", &["-fno-omit-frame-pointer"][..]),
        ("heapsites-nofp", &["-fomit-frame-pointer"][..]),
        ("heapsites-static", &["-static", "-s"][..]),
    ] {
        let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        a.extend(["-o".into(), o(name), heap.clone()]);
        run(&a);
    }
    let bench = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("c/allocbench.c")
        .display()
        .to_string();
    run(&["-o".into(), o("allocbench"), bench, "-lpthread".into()]);
    // The growth tests' program: no frame pointers, as distributions build.
    let grower = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("c/grower.c")
        .display()
        .to_string();
    run(&[
        "-fomit-frame-pointer".into(),
        "-o".into(),
        o("grower"),
        grower,
    ]);
    // A caching allocator with PyTorch's USDT probes (<sys/sdt.h>, Debian's
    // systemtap-sdt-dev, which `cargo xtask setup` installs). setup itself
    // is built with this crate on a fresh machine, before the header is
    // there: then the program is left out (its test says so) and this
    // script runs at every build until it is built. (Watching the header
    // would not do: dpkg gives it the package's mtime, older than this
    // script's last run, and cargo would call the script fresh.)
    let torch = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("c/torchalloc.c")
        .display()
        .to_string();
    if std::path::Path::new(SDT_H).exists() {
        run(&["-o".into(), o("torchalloc"), torch, "-ldl".into()]);
    } else {
        let missing = out.join("torchalloc");
        let _ = std::fs::remove_file(&missing);
        println!("cargo:warning=no {SDT_H} (cargo xtask setup installs it): torchalloc not built");
        // A path that does not exist makes cargo run this script again.
        println!("cargo:rerun-if-changed={}", missing.display());
    }
    println!("cargo:rustc-env=SIMCUDA_DIR={}", out.display());
    println!("cargo:rerun-if-changed=c");
    println!("cargo:rerun-if-changed=simcuda");
    println!("cargo:rerun-if-env-changed=CC");
}
