//! End-to-end test of `tracer report --html`: a real recorded memcg OOM
//! kill (a grower and a small neighbour), rendered to one HTML page and
//! opened in headless Chromium (Debian's): the DOM the browser built has
//! the usage series, the kill marker, the limit line where the scale puts
//! the limit, a bar per task and the growth flame graph; the screenshot is
//! kept as a CI artifact (target/ci-artifacts/report.png).

use std::{path::PathBuf, process::Command, time::Duration};

use tracer_e2e::{Proc, Recorder, Scenario, TestCgroup, chromium, explain_json, tracer};

const MIB: u64 = 1 << 20;

/// The opening tag of the element with `id` in `dom`.
fn tag<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    Some(&dom[start..=end])
}

/// An attribute of a tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    Some(&tag[at..at + tag[at..].find('"')?])
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {tag}"))
}

#[test]
fn a_recorded_kill_renders_in_a_real_browser_with_its_plot_tasks_and_growth() {
    let Some(sc) = Scenario::new() else {
        return;
    };
    let Some(chromium) = chromium() else { return };
    let (dir, store) = (&sc.dir, sc.store.clone());
    let limit = 96 * MIB;
    let cg = TestCgroup::new("report", limit);
    let rec = Recorder::on(&store)
        .args(&["--growth-cgroup", &cg.path])
        .start();
    let mut small = cg.command(env!("CARGO_BIN_EXE_memhog"));
    small.args(["--step-mib", "8", "--interval-ms", "10", "--max-mib", "16"]);
    let mut small = Proc::spawn(small);
    small.wait_line("held 16 MiB");
    // The victim's name carries a right-to-left override, as a hostile
    // user's program may: the page must not reorder what follows it.
    let hostile = dir.path().join("m\u{202e}hog");
    std::fs::copy(env!("CARGO_BIN_EXE_memhog"), &hostile).unwrap();
    let mut big = cg.command(&hostile);
    big.args(["--step-mib", "2", "--interval-ms", "100"]);
    let mut big = Proc::spawn(big);
    let pid = big.pid();
    assert_eq!(
        big.wait_signal(Duration::from_secs(60)),
        Some(libc::SIGKILL)
    );
    let store_s = store.to_str().unwrap();
    explain_json(&["--store", store_s, "--pid", &pid.to_string()], |v| {
        v["kill"]["source"]
            .as_str()
            .is_some_and(|s| s.contains("kmsg"))
            && !v["kill"]["growth"].is_null()
    });
    rec.stop();

    let page = dir.path().join("kill.html");
    let out = tracer(&[
        "report",
        "--store",
        store_s,
        "--pid",
        &pid.to_string(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let url = format!("file://{}", page.display());
    let browser = |extra: &[String]| {
        let out = Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--window-size=900,1800",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("profile").display()
            ))
            .args(extra)
            .arg(&url)
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "{out:?}");
        out
    };
    let dom = String::from_utf8(browser(&["--dump-dom".into()]).stdout).unwrap();
    // Element ids are prefixed with their kill's section id.
    let section = dom
        .find("class=\"kill\" id=\"")
        .map(|at| {
            let rest = &dom[at + "class=\"kill\" id=\"".len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .unwrap_or_else(|| panic!("no kill section: {dom}"));
    let id = |name: &str| format!("{section}-{name}");

    // The name is shown with its override made visible, the pid in order.
    assert!(!dom.contains('\u{202e}'), "a raw U+202E reaches the page");
    assert!(
        dom.contains(&format!("m\\u{{202e}}hog (pid {pid}) killed")),
        "{dom}"
    );
    // The usage series: one point per sample it says it has, several.
    let usage = tag(&dom, &id("memcg-usage")).unwrap_or_else(|| panic!("no usage series: {dom}"));
    let samples = num(usage, "data-samples") as usize;
    assert!(samples >= 3, "{usage}");
    assert_eq!(attr(usage, "points").unwrap().split(' ').count(), samples);
    // The limit line sits where the plot's scale puts the limit.
    let plot = tag(&dom, &id("memcg-plot")).unwrap();
    let (top, height, y_max) = (
        num(plot, "data-plot-top"),
        num(plot, "data-plot-height"),
        num(plot, "data-y-max"),
    );
    let line = tag(&dom, &id("memcg-limit")).unwrap();
    assert_eq!(num(line, "data-bytes"), limit as f64, "{line}");
    let want_y = top + height * (1.0 - limit as f64 / y_max);
    let y1 = num(line, "y1");
    assert!(
        (y1 - want_y).abs() < 0.11,
        "limit at y {y1}, the scale says {want_y}"
    );
    assert_eq!(num(line, "y1"), num(line, "y2"));
    // The kill is marked inside the plot, right of every sample.
    let marker = tag(&dom, &id("kill-marker")).unwrap();
    let x = num(marker, "x1");
    let last_x = attr(usage, "points")
        .unwrap()
        .split(' ')
        .filter_map(|p| p.split(',').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(
        x > 80.0 && x < 760.0 && x + 0.11 >= last_x,
        "kill at x {x}, last sample at {last_x}"
    );
    // A bar per task, the victim's marked.
    let bars: Vec<&str> = dom
        .match_indices("class=\"task\"")
        .map(|(i, _)| &dom[i..i + 200])
        .collect();
    assert_eq!(bars.len(), 2, "{dom}");
    assert!(
        dom.contains(&format!("data-pid=\"{pid}\"")) && dom.contains("data-victim=\"true\""),
        "{dom}"
    );
    // Where it grew, as a flame graph naming memhog's code.
    let flame = dom
        .find(&format!("id=\"{}\"", id("growth-flame")))
        .expect("a flame graph");
    assert!(dom[flame..].contains("memhog::main"), "{}", &dom[flame..]);

    // Written as root: never through a link planted where the page goes.
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "keep").unwrap();
    let link = dir.path().join("link.html");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = tracer(&[
        "report",
        "--store",
        store_s,
        "--html",
        link.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symbolic link"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    // The screenshot, kept for the CI run's artifacts.
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci-artifacts");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("report.png");
    let _ = std::fs::remove_file(&shot);
    browser(&[format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}

#[test]
fn a_report_of_a_missing_store_says_so_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("missing.db");
    let page = dir.path().join("x.html");
    let out = tracer(&[
        "report",
        "--store",
        store.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no store at"));
    assert!(!page.exists());
}
