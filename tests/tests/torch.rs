//! End-to-end tests of PyTorch's caching allocator seen from outside: a C
//! program (tests/c/torchalloc.c) built with `<sys/sdt.h>` that declares
//! the same USDT provider, probe names, argument layout and semaphores as
//! PyTorch's CUDA caching allocator, and hands out blocks inside segments
//! it gets from the simulated CUDA runtime, as PyTorch does.

use std::{process::Command, time::Duration};

use serde_json::Value;
use tracer_e2e::{
    Attach, CudaLoad, Recorder, Scenario, explain_json, simcuda_dir, tracer, wait_for,
};

const MIB: u64 = 1 << 20;

fn torchalloc(env: &[(&str, String)]) -> CudaLoad {
    let d = simcuda_dir();
    let bin = d.join("torchalloc");
    assert!(
        bin.exists(),
        "{} was not built: <sys/sdt.h> was missing (cargo xtask setup installs systemtap-sdt-dev)",
        bin.display()
    );
    let mut cmd = Command::new(bin);
    cmd.arg(d.join("libcudart.so.12"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    CudaLoad::spawn(cmd)
}

/// The program's own figures: (reserved, allocated, largest free block).
fn stats(t: &mut CudaLoad) -> (u64, u64, u64) {
    let w = t.ok("stats");
    let n = |i: usize| w[i].parse::<u64>().unwrap();
    (n(0), n(1), n(2))
}

fn semaphores(t: &mut CudaLoad) -> Vec<String> {
    t.ok("sem")
}

#[test]
fn a_caching_allocator_attached_live_matches_its_own_figures() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let snapshot = sc.dir.path().join("allocator.pickle");
    let mut t = torchalloc(&[("SIMCUDA_DEVICES", "2".into())]);
    assert_eq!(semaphores(&mut t), ["0", "0"], "no tracer yet");
    let doctor = |pid: u32| {
        let out = tracer(&[
            "doctor",
            "--pid",
            &pid.to_string(),
            "--store",
            "/nonexistent/x.db",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with(&format!("allocator probes in pid {pid}")))
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&out.stdout)))
            .to_string()
    };
    let line = doctor(t.pid());
    assert!(
        line.contains("torchalloc: 2 sites (pytorch:malloc, pytorch:free), semaphores now [0, 0]"),
        "{line}"
    );
    // Every block's stack (`--sample-bytes 0`), for the snapshot.
    let attach = Attach::start(
        t.pid(),
        &[
            "--snapshot",
            snapshot.to_str().unwrap(),
            "--sample-bytes",
            "0",
        ],
    );
    let log = attach.stderr();
    assert!(
        log.contains("attached to 2 USDT probes (pytorch:malloc, pytorch:free)"),
        "{log}"
    );
    assert!(log.contains("2 semaphores raised"), "{log}");
    assert_eq!(semaphores(&mut t), ["1", "1"], "raised while traced");
    assert!(doctor(t.pid()).contains("semaphores now [1, 1]"));
    // The device argument is a global the compiler reads rip-relative.
    t.ok("device 1");
    // Small blocks in 2 MiB segments, mid-sized ones in 20 MiB segments,
    // a large one in its own; frees return blocks to the cache only.
    let mut live = Vec::new();
    for (i, size) in [
        1000u64,
        4096,
        700 * 1024,
        3 * MIB,
        5 * MIB + 17,
        12 * MIB,
        512,
        9 * MIB,
    ]
    .into_iter()
    .enumerate()
    {
        let p = t.ok(&format!("alloc {size}"))[0].clone();
        if i % 3 == 1 {
            t.ok(&format!("free {p}"));
        } else {
            live.push(p);
        }
    }
    t.ok(&format!("free {}", live[1]));
    let (reserved, allocated, largest) = stats(&mut t);
    assert!(
        reserved > allocated && allocated > 10 * MIB,
        "{reserved} {allocated}"
    );
    let summary = wait_for(Duration::from_secs(10), || {
        attach.of_type("summary").into_iter().rev().find(|s| {
            s["ledger"]["allocator"]["allocated"] == allocated
                && s["ledger"]["allocator"]["reserved"] == reserved
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "no summary with allocated {allocated} and reserved {reserved}: {:?}",
            attach.of_type("summary").last()
        )
    });
    let a = &summary["ledger"]["allocator"];
    assert_eq!(a["free_in_cache"], reserved - allocated);
    assert_eq!(a["largest_free_block"], largest);
    assert_eq!(a["blocks"], 4);
    assert!(a["peak_allocated"].as_u64().unwrap() >= allocated);
    let blocks = attach.of_type("block");
    let mallocs: Vec<&Value> = blocks
        .iter()
        .filter(|b| b["probe"] == "pytorch:malloc")
        .collect();
    assert_eq!(mallocs.len(), 8);
    assert_eq!(mallocs[0]["size"], 1000);
    assert_eq!(mallocs[0]["device"], 1);
    assert_eq!(mallocs[7]["size"], 9 * MIB);
    let report = attach.stop();
    assert_eq!(report["ledger"]["allocator"]["allocated"], allocated);
    // PyTorch's own reader: the segments hold what the allocator reserved,
    // its blocks in use what it allocated (its stats check that each
    // segment's blocks, in use and free, add up to the segment).
    let viz = tracer_e2e::torch_memory_viz(&snapshot);
    let segments = viz["segments"].as_array().expect("segments");
    let sum = |f: &dyn Fn(&Value) -> u64| segments.iter().map(f).sum::<u64>();
    assert_eq!(
        sum(&|s| s["total_size"].as_u64().unwrap()),
        reserved,
        "{viz:#}"
    );
    let active = |s: &Value| -> Vec<u64> {
        s["active_sizes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect()
    };
    assert_eq!(sum(&|s| active(s).iter().sum()), allocated, "{viz:#}");
    assert_eq!(sum(&|s| active(s).len() as u64), 4, "{viz:#}");
    assert!(segments.iter().all(|s| s["device"] == 1), "{viz:#}");
    // Each block in use with the stack that asked for it: the allocator's
    // alloc(), where the probe is, called from main.
    let block_frames: Vec<&Value> = segments
        .iter()
        .flat_map(|s| s["active_frames"].as_array().unwrap())
        .collect();
    assert_eq!(block_frames.len(), 4, "{viz:#}");
    for f in block_frames {
        let names: Vec<&str> = f
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("torchalloc.c:") && n.ends_with(":alloc"))
                && names.iter().any(|n| n.ends_with(":main")),
            "{names:?}"
        );
    }
    assert!(
        segments.iter().any(|s| s["states"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b == "inactive")),
        "blocks given back to the cache are free in their segment: {viz:#}"
    );
    assert_eq!(
        semaphores(&mut t),
        ["0", "0"],
        "lowered again once detached"
    );
    // Untraced, the program runs on and its figures are its own.
    t.ok("alloc 4096");
}

/// The semaphores are the kernel's to keep: raised while a tracer is
/// attached, lowered when it ends, however it ends (SIGINT, SIGKILL). The
/// kernel raises a semaphore once per installed probe site, however many
/// tracers share the site: one of two tracers ending leaves it raised for
/// the other.
#[test]
fn the_kernel_lowers_the_semaphores_however_attach_ends() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    let mut t = torchalloc(&[]);
    let settle = |t: &mut CudaLoad, want: [&str; 2], what: &str| {
        let t0 = std::time::Instant::now();
        wait_for(Duration::from_secs(10), || {
            (semaphores(t) == want).then_some(())
        })
        .unwrap_or_else(|| panic!("{what}: semaphores {:?}, not {want:?}", semaphores(t)));
        println!("{what}: {want:?} after {:?}", t0.elapsed());
    };
    // A tracer killed outright detaches nothing itself.
    let a = Attach::start(t.pid(), &[]);
    settle(&mut t, ["1", "1"], "attached");
    a.kill();
    settle(&mut t, ["0", "0"], "attach SIGKILLed");
    // Two tracers share the sites; one ending leaves them for the other.
    let a = Attach::start(t.pid(), &[]);
    let b = Attach::start(t.pid(), &[]);
    settle(&mut t, ["1", "1"], "two attached");
    a.kill();
    std::thread::sleep(Duration::from_millis(500));
    settle(&mut t, ["1", "1"], "one of two SIGKILLed");
    // The one left still sees the allocator's calls.
    let p = t.ok("alloc 4096")[0].clone();
    wait_for(Duration::from_secs(10), || {
        (!b.of_type("block").is_empty()).then_some(())
    })
    .unwrap_or_else(|| panic!("no block seen by the tracer left: {}", b.stderr()));
    t.ok(&format!("free {p}"));
    b.stop();
    settle(&mut t, ["0", "0"], "the other stopped by SIGINT");
    // Untraced, the program runs on and computes no probe arguments.
    t.ok("alloc 4096");
}

#[test]
fn a_gpu_oom_with_plenty_reserved_but_free_in_the_cache_is_fragmentation() {
    let Some(_scenario) = Scenario::new() else {
        return;
    };
    // A 64 MiB device: three 20 MiB segments fit, a fourth does not.
    let mut t = torchalloc(&[("SIMCUDA_DEVICE_MEM", (64 * MIB).to_string())]);
    let attach = Attach::start(t.pid(), &["--summary-only"]);
    // Every other block back to the cache (the first, third and fifth of
    // each segment): 27 MiB in blocks and 33 MiB free, in pieces of 3 MiB
    // and the segments' 2 MiB tails, none of them 8 MiB.
    let blocks = fragment(&mut t);
    let (reserved, allocated, largest) = stats(&mut t);
    assert_eq!(
        (reserved, allocated, largest),
        (60 * MIB, 27 * MIB, 3 * MIB)
    );
    assert_eq!(t.cmd(&format!("alloc {}", 8 * MIB)), "err 2");
    let oom = wait_for(Duration::from_secs(10), || {
        attach.of_type("gpu_oom").into_iter().next()
    })
    .expect("a gpu_oom line");
    let verdict = oom["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("this process reserved it but has not allocated it: fragmentation (33.0 MiB reserved and free inside the allocator, 27.0 MiB of 60.0 MiB reserved in live tensors, the largest free block 3.0 MiB"),
        "{verdict}"
    );
    assert!(
        verdict.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{verdict}"
    );
    assert_eq!(
        oom["size"],
        20 * MIB,
        "the segment the allocator asked CUDA for"
    );
    // With the blocks given back, the same request fits again.
    for p in blocks.iter().skip(1).step_by(2) {
        t.ok(&format!("free {p}"));
    }
    assert!(t.cmd(&format!("alloc {}", 8 * MIB)).starts_with("ok "));
    drop(attach);
}

/// Fills a 64 MiB device with three 20 MiB segments of 3 MiB blocks and
/// gives every other block back: 27 MiB in live blocks, 33 MiB free in
/// pieces of at most 3 MiB. Returns the blocks.
fn fragment(t: &mut CudaLoad) -> Vec<String> {
    let blocks: Vec<String> = (0..18)
        .map(|_| t.ok(&format!("alloc {}", 3 * MIB))[0].clone())
        .collect();
    for p in blocks.iter().step_by(2) {
        t.ok(&format!("free {p}"));
    }
    blocks
}

#[test]
fn record_cuda_raises_the_semaphores_of_a_new_process_and_explains_its_fragmentation() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let store = sc.store.clone();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let rec = Recorder::on(&store)
        .args(&["--cuda", "--metrics", &metrics])
        .start();
    // Started after the recorder: found at its exec's rescans.
    let mut t = torchalloc(&[("SIMCUDA_DEVICE_MEM", (64 * MIB).to_string())]);
    wait_for(Duration::from_secs(15), || {
        (semaphores(&mut t) == ["1", "1"]).then_some(())
    })
    .unwrap_or_else(|| panic!("semaphores never raised: {}", rec.log()));
    assert!(
        rec.log()
            .contains("caching allocator: attached to 2 USDT probes"),
        "{}",
        rec.log()
    );
    fragment(&mut t);
    assert_eq!(stats(&mut t), (60 * MIB, 27 * MIB, 3 * MIB));
    assert_eq!(t.cmd(&format!("alloc {}", 8 * MIB)), "err 2");
    let store_s = store.to_str().unwrap();
    let v = explain_json(&["--gpu-oom", "--store", store_s], |_| true);
    let r = &v["gpu_oom"];
    assert_eq!(r["process"]["pid"], t.pid());
    assert_eq!(r["size"], 20 * MIB);
    let a = &r["held"]["allocator"];
    assert_eq!(a["allocated"], 27 * MIB);
    assert_eq!(a["reserved"], 60 * MIB);
    assert_eq!(a["free_in_cache"], 33 * MIB);
    assert_eq!(a["largest_free_block"], 3 * MIB);
    assert_eq!(a["peak_allocated"], 54 * MIB);
    let verdict = v["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("this process reserved it but has not allocated it: fragmentation (33.0 MiB reserved and free inside the allocator"),
        "{verdict}"
    );
    let text =
        String::from_utf8_lossy(&tracer(&["explain", "--gpu-oom", "--store", store_s]).stdout)
            .to_string();
    assert!(
        text.contains("  allocator  27.0 MiB allocated in 9 blocks of 60.0 MiB reserved (peaks 54.0 MiB and 60.0 MiB); 33.0 MiB free in its cache, reserved/allocated 2.22, largest free block 3.0 MiB"),
        "{text}"
    );
    // The metrics have the allocator's figures, per container (here the
    // test's own cgroup: torchalloc is in no container).
    let scrape = || -> Option<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let line = wait_for(Duration::from_secs(10), || {
        scrape()?
            .lines()
            .find(|l| {
                l.starts_with("tracer_gpu_allocator_allocated_bytes{")
                    && l.ends_with(&format!(" {}.0", 27 * MIB))
            })
            .map(String::from)
    })
    .unwrap_or_else(|| panic!("no allocator series: {:?}", scrape()));
    let reserved = format!(
        "{} {}.0",
        line.replace("allocated", "reserved")
            .rsplit_once(' ')
            .unwrap()
            .0,
        60 * MIB
    );
    assert!(
        scrape().unwrap().lines().any(|l| l == reserved),
        "{reserved}"
    );
    // The recorder stops: the semaphores go back to zero.
    rec.stop();
    assert_eq!(semaphores(&mut t), ["0", "0"]);
}
