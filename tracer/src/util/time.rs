//! Clocks: the probes stamp events with CLOCK_BOOTTIME
//! (`bpf_ktime_get_boot_ns`), the kernel log with the monotonic clock; the
//! store and every report use wall-clock nanoseconds since the epoch.

/// Nanoseconds of a clock.
fn clock_ns(id: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids used here
    // exist on every Linux since 2.6.39.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Wall-clock now, ns since the epoch.
pub fn wall_now_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_MONOTONIC now, ns.
pub fn mono_now_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_BOOTTIME now, ns.
pub fn boot_now_ns() -> i64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// How far the kernel log's clock runs ahead of CLOCK_MONOTONIC, ns
/// (negative: behind). The kernel stamps its log with `local_clock()`, a
/// clock of its own that drifts from the monotonic clock: on a VM up for
/// ten hours here, 86 ms behind. Measured once by the recorder
/// ([`crate::collect::kmsg::measure_clock_skew`]); 0 until then.
static KMSG_SKEW_NS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets the kernel log's clock skew (see [`KMSG_SKEW_NS`]); clocks made
/// from now on convert kernel log stamps with it.
pub fn set_kmsg_skew_ns(ns: i64) {
    KMSG_SKEW_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// Offsets that turn kernel timestamps into wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    boot_to_wall: i64,
    mono_to_wall: i64,
}

impl Clock {
    /// Measures the offsets now (the wall clock can be stepped by NTP, so a
    /// long-running recorder refreshes this periodically).
    pub fn now() -> Self {
        let offset = |id| {
            let w1 = clock_ns(libc::CLOCK_REALTIME);
            let k = clock_ns(id);
            let w2 = clock_ns(libc::CLOCK_REALTIME);
            w1 + (w2 - w1) / 2 - k
        };
        Self {
            boot_to_wall: offset(libc::CLOCK_BOOTTIME),
            mono_to_wall: offset(libc::CLOCK_MONOTONIC)
                - KMSG_SKEW_NS.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A clock with given offsets (wall = boot + `boot_to_wall`, wall =
    /// monotonic + `mono_to_wall`): for joins fed recorded stamps.
    pub const fn fixed(boot_to_wall: i64, mono_to_wall: i64) -> Self {
        Self {
            boot_to_wall,
            mono_to_wall,
        }
    }

    /// Wall time of a `bpf_ktime_get_boot_ns` stamp.
    pub fn boot_to_wall(&self, boot_ns: u64) -> i64 {
        boot_ns as i64 + self.boot_to_wall
    }

    /// Wall time of a /dev/kmsg stamp (microseconds of the kernel log's
    /// clock, which is the monotonic clock less its skew).
    pub fn kmsg_to_wall(&self, ts_us: u64) -> i64 {
        ts_us as i64 * 1000 + self.mono_to_wall
    }
}

/// Formats wall ns as RFC 3339 with milliseconds, UTC.
pub fn format_wall(ns: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A span for people: `45 s`, `1 min 35 s`, `12 min`, `6 h 40 min`, `3 d 4 h`.
pub fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    let (d, h, m) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    match s {
        0..60 => format!("{s} s"),
        60..600 if !s.is_multiple_of(60) => format!("{m} min {} s", s % 60),
        60..3600 => format!("{m} min"),
        3600..172_800 => {
            let h = s / 3600;
            if m == 0 {
                format!("{h} h")
            } else {
                format!("{h} h {m} min")
            }
        }
        _ if h == 0 => format!("{d} d"),
        _ => format!("{d} d {h} h"),
    }
}

/// Parses a look-back window such as `10m`, `6h`, `2d`, `90s`.
pub fn parse_window(s: &str) -> Result<std::time::Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn spans_read_as_people_say_them() {
        use super::human_secs as h;
        assert_eq!(h(-3.0), "0 s");
        assert_eq!(h(59.4), "59 s");
        assert_eq!(h(60.0), "1 min");
        assert_eq!(h(95.0), "1 min 35 s");
        assert_eq!(h(605.0), "10 min");
        assert_eq!(h(3599.0), "59 min");
        assert_eq!(h(3600.0), "1 h");
        assert_eq!(h(6.0 * 3600.0 + 40.0 * 60.0), "6 h 40 min");
        assert_eq!(h(47.0 * 3600.0), "47 h");
        assert_eq!(h(2.0 * 86_400.0), "2 d");
        assert_eq!(h(3.0 * 86_400.0 + 4.0 * 3600.0 + 59.0), "3 d 4 h");
    }

    use super::*;

    #[test]
    fn boot_stamps_map_to_now() {
        let c = Clock::now();
        let wall = c.boot_to_wall(boot_now_ns() as u64);
        assert!((wall - wall_now_ns()).abs() < 50_000_000, "within 50 ms");
    }

    #[test]
    fn formats_and_parses() {
        assert_eq!(
            format_wall(1_700_000_000_123_000_000),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(parse_window("6h").unwrap().as_secs(), 6 * 3600);
        assert_eq!(parse_window("10m").unwrap().as_secs(), 600);
        assert!(parse_window("soon").is_err());
    }
}
