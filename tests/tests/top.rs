//! End-to-end test of the full-screen `tracer top`, driven as a person
//! would: in a tmux of its own (a private server socket), keys sent with
//! send-keys, the screen read with capture-pane. A memory cgroup growing
//! at a steady rate shows its growth and "OOM in ~N s" (highlighted);
//! `s` sorts, `/` filters by container, Enter opens its sparkline, `q` quits.

use std::{process::Command, time::Duration};

use tracer_e2e::{Proc, Scenario, TestCgroup, tracer_bin, wait_for};

const MIB: u64 = 1 << 20;

/// A tmux server of this test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux")
    }

    /// The screen (with `-e`, its colours and attributes as escapes).
    fn screen(&self, escapes: bool) -> String {
        let mut args = vec!["capture-pane", "-p", "-t", "top"];
        if escapes {
            args.push("-e");
        }
        String::from_utf8_lossy(&self.run(&args).stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    fn wait_screen(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        wait_for(Duration::from_secs(20), || {
            let s = self.screen(false);
            f(&s).then_some(s)
        })
        .unwrap_or_else(|| panic!("{what}; the screen:\n{}", self.screen(false)))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn top_on_a_terminal_warns_sorts_filters_and_shows_a_cgroups_sparkline() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "tmux missing: cargo xtask setup installs it"
        );
        eprintln!("skipped: no tmux");
        return;
    }
    let cg = TestCgroup::new("top", 256 * MIB);
    // 1 MiB every 200 ms: 5 MiB/s, some 50 s from its limit.
    let mut cmd = cg.command(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(["--step-mib", "1", "--interval-ms", "200"]);
    let _hog = Proc::spawn(cmd);
    let tmux = Tmux {
        socket: format!("tracer-test-{}", std::process::id()),
    };
    let dir = &sc.dir;
    let top = format!(
        "{} top --store {} --interval 1s",
        tracer_bin().display(),
        dir.path().join("none.db").display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "220",
        "-y",
        "50",
        &top,
    ]);
    assert!(started.status.success(), "{started:?}");
    // The grower: its rate and time left, once a few seconds are seen.
    let screen = tmux.wait_screen("no growth and time left for the cgroup", |s| {
        s.lines()
            .any(|l| l.contains(&cg.path) && l.contains("OOM in ~") && l.contains("/s"))
    });
    let line = screen
        .lines()
        .find(|l| l.contains(&cg.path) && l.contains("OOM in ~"))
        .unwrap();
    let secs: f64 = line
        .split("OOM in ~")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((10.0..=60.0).contains(&secs), "{line}");
    assert!(screen.contains("sort: closeness to a limit"), "{screen}");
    // The node's own line: in use, available, and PSI where the kernel has it.
    let node = screen
        .lines()
        .find(|l| l.contains("node: "))
        .unwrap_or_else(|| panic!("no node line: {screen}"));
    assert!(
        node.contains(" in use (") && node.contains(" available"),
        "{node}"
    );
    assert_eq!(
        node.contains("PSI some"),
        std::path::Path::new("/proc/pressure/memory").exists(),
        "{node}"
    );
    assert!(
        screen.contains(" USE ") && screen.contains(" PSI "),
        "{screen}"
    );
    // Under a minute from its limit: drawn in red and bold.
    let colored = tmux.screen(true);
    let warned = colored
        .lines()
        .find(|l| l.contains(&cg.path) && l.contains("OOM in ~"))
        .unwrap_or_else(|| panic!("{colored}"));
    let red = |l: &str| l.contains("38;5;1m") || l.contains("[31m") || l.contains(";31m");
    assert!(red(warned), "the warned row is not red: {warned:?}");
    assert!(
        !colored
            .lines()
            .filter(|l| l.contains("process") && !l.contains(&cg.path))
            .any(red),
        "only rows near their limit are red: {colored:?}"
    );
    // `s`: sorted by time left, the grower first.
    tmux.keys(&["s"]);
    let screen = tmux.wait_screen("no sort by time left", |s| s.contains("sort: time left"));
    let first = screen
        .lines()
        .skip_while(|l| !l.contains("TYPE"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.contains("OOM in ~"),
        "the nearest limit first: {screen}"
    );
    // `/` and a container name: only its rows.
    tmux.keys(&["/"]);
    let name = cg.path.trim_start_matches('/');
    tmux.keys(&["-l", name]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_screen("filter not applied", |s| {
        s.contains(&format!("filter: {name}")) && !s.contains("process_api")
    });
    let rows: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.contains("TYPE"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!(
        !rows.is_empty() && rows.iter().all(|l| l.contains(&cg.path)),
        "{screen}"
    );
    // Enter: the cgroup's detail, with its sparkline.
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_screen("no detail", |s| s.contains("usage over the last"));
    assert!(
        screen.chars().any(|c| ('▁'..='█').contains(&c)),
        "a sparkline: {screen}"
    );
    // Scaled to the 256 MiB limit: a cgroup well under it never reaches
    // the top of the chart.
    let usage_mib: f64 = screen
        .split("usage over the last")
        .nth(1)
        .and_then(|r| r.split(": ").nth(1))
        .and_then(|r| r.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{screen}"));
    if usage_mib < 128.0 {
        let detail: String = screen
            .lines()
            .skip_while(|l| !l.contains("usage over the last"))
            .collect();
        assert!(!detail.contains('█'), "not scaled to the limit: {screen}");
    }
    assert!(screen.contains("growing"), "{screen}");
    // `q`: top ends, and the terminal is given back.
    tmux.keys(&["q"]);
    let gone = wait_for(Duration::from_secs(10), || {
        (!tmux.run(&["has-session", "-t", "top"]).status.success()).then_some(())
    });
    assert!(gone.is_some(), "top did not quit: {}", tmux.screen(false));
}
