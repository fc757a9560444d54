//! Fails early, with a fix, when bpf-linker is missing; reruns when it changes.
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => panic!("bpf-linker not found ({e}); run `cargo xtask setup`"),
    }
}
