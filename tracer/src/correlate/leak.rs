//! Slow leaks over hours: a memory cgroup's working set, one point a step
//! (a minute unless told), split into runs at restarts and at drops, the
//! longest run fitted by least squares. A leak is a run long enough, steady
//! enough and steep enough, whose tail still climbs: at least 1 % of the
//! limit an hour (16 MiB an hour without a limit).
//!
//! The early warning fits the last 10 s and sees a cgroup about to hit its
//! limit; a leak of a few MiB an hour is lost in its noise. This sees the
//! other end: slow, steady growth that would hit the limit in hours.

use std::ops::Range;

/// A drop of the working set to this share of the point before it or
/// less starts a new run: a restart, a cache or a pool given back.
pub const DROP_SPLIT: f64 = 0.75;

/// What makes a run a leak.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// A run spans at least this long, seconds.
    pub min_span_s: f64,
    /// Points in the run, at least.
    pub min_points: usize,
    /// With a limit: growth of at least this share of it an hour, percent.
    pub percent_per_hour: f64,
    /// Without one: at least these bytes an hour.
    pub bytes_per_hour: f64,
    /// Over the run, the fit rises at least this many bytes (a small
    /// cgroup's noise is not a leak).
    pub min_rise_bytes: f64,
    /// How much of the run's variance the line explains (R²), at least.
    pub min_r2: f64,
}

impl Rule {
    /// The rule for runs of at least `min_span_s` seconds.
    pub fn new(min_span_s: f64) -> Self {
        Self {
            min_span_s,
            min_points: 8,
            percent_per_hour: 1.0,
            bytes_per_hour: 16.0 * 1024.0 * 1024.0,
            min_rise_bytes: 4.0 * 1024.0 * 1024.0,
            min_r2: 0.6,
        }
    }
}

/// One point of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    /// Seconds since the series' start.
    pub t_s: u32,
    /// The working set, KiB (the step's least: a spike is not kept memory).
    pub kib: u32,
    /// The run it belongs to: a new one at each restart seen (another
    /// container of the same pod, the cgroup's oldest process gone).
    pub run: u32,
}

/// A line fitted through points: KiB = intercept + slope × seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    /// KiB a second.
    pub slope: f64,
    /// The share of the variance the line explains (1 for a flat run).
    pub r2: f64,
}

/// Least squares through `points` (at least two, not all at one time).
pub fn fit(points: &[Point]) -> Option<Line> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let t0 = f64::from(points[0].t_s);
    let xs = points.iter().map(|p| f64::from(p.t_s) - t0);
    let mx = xs.clone().sum::<f64>() / n;
    let my = points.iter().map(|p| f64::from(p.kib)).sum::<f64>() / n;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for (x, p) in xs.zip(points) {
        let (dx, dy) = (x - mx, f64::from(p.kib) - my);
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    Some(Line { slope, r2 })
}

/// The runs of `points`: split where the run number changes and where the
/// working set drops to [`DROP_SPLIT`] of the point before or less.
pub fn runs(points: &[Point]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..points.len() {
        let (a, b) = (points[i - 1], points[i]);
        if a.run != b.run || f64::from(b.kib) <= f64::from(a.kib) * DROP_SPLIT {
            out.push(start..i);
            start = i;
        }
    }
    if !points.is_empty() {
        out.push(start..points.len());
    }
    out
}

/// A leak found in a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Found {
    /// Growth of the longest run, bytes a second.
    pub bytes_per_second: f64,
    /// When the last run started, seconds since the series' start: how
    /// long it has leaked since its last restart or drop.
    pub since_s: u32,
    /// The span of the run fitted, seconds.
    pub fit_span_s: u32,
    /// The fit's R².
    pub r2: f64,
}

/// What [`judge`] says of a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Judged {
    /// Leaking.
    Leak(Found),
    /// Not leaking, and the first rule it failed.
    No(&'static str),
}

fn span(points: &[Point]) -> u32 {
    match (points.first(), points.last()) {
        (Some(a), Some(b)) => b.t_s - a.t_s,
        _ => 0,
    }
}

/// Judges a series against `rule`, for a cgroup of `limit` bytes (None:
/// no limit). `leaking`: whether it was a leak at the last judgement (its
/// tail then only has to still climb, not climb a quarter as fast as the
/// run, so a leak does not flicker).
pub fn judge(points: &[Point], limit: Option<u64>, rule: &Rule, leaking: bool) -> Judged {
    let runs = runs(points);
    let Some(last) = runs.last().cloned() else {
        return Judged::No("no samples");
    };
    // The longest run; of equal ones, the later.
    let Some(longest) = runs
        .iter()
        .rev()
        .max_by_key(|r| span(&points[(*r).clone()]))
        .cloned()
    else {
        return Judged::No("no samples");
    };
    let run = &points[longest];
    if f64::from(span(run)) < rule.min_span_s || run.len() < rule.min_points {
        return Judged::No("too short");
    }
    let Some(line) = fit(run) else {
        return Judged::No("too short");
    };
    let rate = line.slope * 1024.0;
    if rate <= 0.0 {
        return Judged::No("not climbing");
    }
    if line.r2 < rule.min_r2 {
        return Judged::No("not steady");
    }
    let per_hour = rate * 3600.0;
    let enough = match limit {
        Some(l) => per_hour * 100.0 >= l as f64 * rule.percent_per_hour,
        None => per_hour >= rule.bytes_per_hour,
    };
    if !enough {
        return Judged::No("too slow");
    }
    if rate * f64::from(span(run)) < rule.min_rise_bytes {
        return Judged::No("too small");
    }
    // The tail: the last third of the last run, three points at least.
    let tail_run = &points[last];
    if tail_run.len() < 3 {
        return Judged::No("restarted");
    }
    let cut = tail_run[0].t_s + span(tail_run) * 2 / 3;
    let from = tail_run
        .iter()
        .position(|p| p.t_s >= cut)
        .unwrap_or(0)
        .min(tail_run.len() - 3);
    let tail = fit(&tail_run[from..]).map_or(0.0, |l| l.slope * 1024.0);
    let needed = if leaking { 0.0 } else { rate / 4.0 };
    if tail <= needed {
        return Judged::No("stopped climbing");
    }
    Judged::Leak(Found {
        bytes_per_second: rate,
        since_s: tail_run[0].t_s,
        fit_span_s: span(run),
        r2: line.r2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB_KIB: f64 = 1024.0;
    const LIMIT: u64 = 1 << 30;

    /// A series of `minutes` points a minute apart: `at(minute)` KiB, in
    /// run `run(minute)`.
    fn series(minutes: u32, at: impl Fn(u32) -> f64, run: impl Fn(u32) -> u32) -> Vec<Point> {
        (0..minutes)
            .map(|m| Point {
                t_s: m * 60,
                kib: at(m).max(0.0) as u32,
                run: run(m),
            })
            .collect()
    }

    /// Deterministic noise in -1..1.
    fn noise(i: u32) -> f64 {
        let x = (i as f64 * 12.9898).sin() * 43_758.545;
        (x - x.floor()) * 2.0 - 1.0
    }

    fn rule() -> Rule {
        Rule::new(30.0 * 60.0)
    }

    #[test]
    fn a_steady_leak_with_noise_is_found_at_its_rate() {
        // 200 MiB, growing 60 MiB an hour (about 6 % of 1 GiB an hour),
        // with ±8 MiB of noise, for 3 hours.
        let s = series(
            180,
            |m| (200.0 + f64::from(m)) * MIB_KIB + 8.0 * MIB_KIB * noise(m),
            |_| 0,
        );
        let Judged::Leak(f) = judge(&s, Some(LIMIT), &rule(), false) else {
            panic!("{:?}", judge(&s, Some(LIMIT), &rule(), false));
        };
        let per_hour = f.bytes_per_second * 3600.0 / (1 << 20) as f64;
        assert!((per_hour - 60.0).abs() < 6.0, "{per_hour} MiB/h");
        assert_eq!(f.since_s, 0);
        assert_eq!(f.fit_span_s, 179 * 60);
    }

    #[test]
    fn a_time_compressed_series_with_two_restarts_fits_the_longest_run_and_dates_the_last() {
        // Three lives of one container: it leaks 40 MiB an hour each time,
        // from a fresh 100 MiB; the second life is the longest. A restart
        // shows as a new run (another container of the pod) once, and as
        // a drop alone once (the process restarted in its cgroup).
        let life = |m: u32| match m {
            0..60 => (m, 0),
            60..200 => (m - 60, 1),
            _ => (m - 200, 1),
        };
        let s = series(
            250,
            |m| (100.0 + f64::from(life(m).0) * 40.0 / 60.0) * MIB_KIB + MIB_KIB * noise(m),
            |m| life(m).1,
        );
        assert_eq!(runs(&s), vec![0..60, 60..200, 200..250]);
        let Judged::Leak(f) = judge(&s, Some(LIMIT), &rule(), false) else {
            panic!("{:?}", judge(&s, Some(LIMIT), &rule(), false));
        };
        let per_hour = f.bytes_per_second * 3600.0 / (1 << 20) as f64;
        assert!((per_hour - 40.0).abs() < 4.0, "{per_hour} MiB/h");
        assert_eq!(f.fit_span_s, 139 * 60, "the longest life");
        assert_eq!(f.since_s, 200 * 60, "leaking since the last restart");
        // Right after a restart there is nothing to say yet.
        assert_eq!(
            judge(&s[..201], Some(LIMIT), &rule(), true),
            Judged::No("restarted")
        );
    }

    #[test]
    fn what_is_not_a_leak() {
        let r = rule();
        // Flat with noise.
        let flat = series(240, |m| 500.0 * MIB_KIB + 20.0 * MIB_KIB * noise(m), |_| 0);
        assert!(matches!(
            judge(&flat, Some(LIMIT), &r, false),
            Judged::No("not steady" | "not climbing" | "too slow")
        ));
        // A sawtooth: a cache that fills and is dropped every 20 minutes.
        let saw = series(240, |m| (300.0 + f64::from(m % 20) * 10.0) * MIB_KIB, |_| 0);
        assert!(matches!(
            judge(&saw, Some(LIMIT), &r, false),
            Judged::No("too short")
        ));
        // Warming up, then a plateau: the tail no longer climbs.
        let warm = series(
            240,
            |m| (100.0 + f64::from(m.min(150)) * 2.0) * MIB_KIB,
            |_| 0,
        );
        assert_eq!(
            judge(&warm, Some(LIMIT), &r, false),
            Judged::No("stopped climbing")
        );
        // Slower than 1 % of the limit an hour (6 MiB/h of 1 GiB).
        let slow = series(240, |m| (100.0 + f64::from(m) * 0.1) * MIB_KIB, |_| 0);
        assert_eq!(judge(&slow, Some(LIMIT), &r, false), Judged::No("too slow"));
        // The same without a limit is under 16 MiB/h, and 20 MiB/h is over.
        assert_eq!(judge(&slow, None, &r, false), Judged::No("too slow"));
        let faster = series(240, |m| (100.0 + f64::from(m) / 3.0) * MIB_KIB, |_| 0);
        assert!(matches!(judge(&faster, None, &r, false), Judged::Leak(_)));
        // Too short a span: 20 minutes.
        let short = series(20, |m| (100.0 + f64::from(m) * 5.0) * MIB_KIB, |_| 0);
        assert_eq!(
            judge(&short, Some(LIMIT), &r, false),
            Judged::No("too short")
        );
        // A small cgroup: 1 % of 64 MiB an hour is a leak by rate, but
        // 3 MiB over the run is too small to tell from noise.
        let tiny = series(60, |m| (10.0 + f64::from(m) * 0.05) * MIB_KIB, |_| 0);
        assert_eq!(
            judge(&tiny, Some(64 << 20), &r, false),
            Judged::No("too small")
        );
        assert_eq!(judge(&[], None, &r, false), Judged::No("no samples"));
    }

    #[test]
    fn a_leak_that_slows_stays_a_leak_while_it_climbs() {
        // Two hours at 60 MiB/h, then an hour at 10 MiB/h: the tail (the
        // last third) climbs at a sixth of the run's rate. Newly judged
        // that is not enough; for a leak already found, it still climbs.
        let s = series(
            180,
            |m| {
                let m = f64::from(m);
                (100.0 + m.min(120.0) + (m - 120.0).max(0.0) / 6.0) * MIB_KIB
            },
            |_| 0,
        );
        assert_eq!(
            judge(&s, Some(LIMIT), &rule(), false),
            Judged::No("stopped climbing")
        );
        assert!(matches!(
            judge(&s, Some(LIMIT), &rule(), true),
            Judged::Leak(_)
        ));
    }
}
