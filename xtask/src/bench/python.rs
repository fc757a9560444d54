//! What a Python walk costs a growth sample: the fault programs' own
//! run-time statistics with every fault sampled, for a C program and for
//! CPython faulting in pages the same way, and for CPython with the walk
//! off (`record --python-frames false`).

use super::*;

/// The CPython the benchmark runs: pyenv's 3.12 where it is, else Debian's.
fn python() -> std::path::PathBuf {
    std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/python3.12"))
        .find(|p| p.exists())
        .unwrap_or_else(|| "/usr/bin/python3.11".into())
}

/// One line per configuration: ns per run of the growth programs over one
/// page-touch round of `mib` MiB with every fault sampled.
pub(super) fn python_cost(bins: &crate::Bins, mib: u64) -> anyhow::Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/py/touch_pages.py");
    let python = python();
    let cg = TestCgroup::new("bench-python", (mib + 512) * MIB);
    let c = || {
        let mut cmd = cg.command(tracer_e2e::grower());
        cmd.args(["touch", &mib.to_string()]);
        cmd
    };
    let py = || {
        let mut cmd = cg.command(&python);
        cmd.arg(&script).arg(mib.to_string());
        cmd
    };
    let configs: [(&str, Command, &[&str]); 3] = [
        ("C (grower touch)", c(), &[]),
        ("CPython, Python frames walked", py(), &[]),
        (
            "CPython, --python-frames false",
            py(),
            &["--python-frames", "false"],
        ),
    ];
    let stats = ProgStats::start()?;
    let mut out = format!(
        "### Python frames: growth programs' ns per run, every fault sampled ({mib} MiB touched page by page, {})\n\n\
         | workload | in the kernel | ns/page in the workload |\n|---|---|---|\n",
        python.display()
    );
    for (name, cmd, extra) in configs {
        let dir = tempfile::tempdir()?;
        let mut args = vec!["--growth-sample-bytes", "4096"];
        args.extend_from_slice(extra);
        let rec = Recorder::on(&dir.path().join("python.db"))
            .bin(&bins.tracer)
            .args(&args)
            .quiet()
            .start();
        let mut toucher = CudaLoad::spawn(cmd);
        // Warm-up: the recorder finds the interpreter and reads its code
        // objects at the first samples.
        toucher.cmd("go");
        thread::sleep(Duration::from_millis(300));
        let mut reply = String::new();
        let ran = stats.around(&["growth_"], || {
            reply = toucher.cmd("round");
            Ok(())
        })?;
        toucher.exit();
        rec.stop();
        out.push_str(&format!(
            "| {name} | {ran} | {} |\n",
            reply.trim_start_matches("ns/page ")
        ));
    }
    out.push_str(
        "\nThe kernel's run-time statistics add about 45 ns to every run. The walk's cost is \
         the CPython rows' difference; the C row is a native sample's cost.\n",
    );
    Ok(out)
}
