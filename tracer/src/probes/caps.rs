//! Privilege: loading BPF programs and attaching tracepoints needs root, or
//! CAP_BPF + CAP_PERFMON (5.8+), or CAP_SYS_ADMIN.

/// Not enough privilege to trace.
#[derive(Debug, thiserror::Error)]
#[error(
    "tracer needs root to load eBPF programs (running as uid {uid}; missing {missing}); \
     run it with sudo, or grant CAP_BPF and CAP_PERFMON"
)]
pub struct PrivilegeError {
    /// Effective uid.
    pub uid: u32,
    /// The capabilities that are missing.
    pub missing: String,
}

const CAP_SYS_RESOURCE: u32 = 24;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set, from /proc/self/status.
pub fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_cap_eff(&s))
        .unwrap_or(0)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Whether the capability set allows loading and attaching our programs.
pub fn can_trace(eff: u64) -> Result<(), String> {
    let has = |c: u32| eff & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| n)
        .collect();
    Err(missing.join(" and "))
}

/// Whether the process may lower its own oom_score_adj (to -1000).
pub fn can_protect_from_oom(eff: u64) -> bool {
    eff & (1u64 << CAP_SYS_RESOURCE) != 0
}

/// Fails with a clear message unless this process may trace.
pub fn require_bpf() -> Result<(), PrivilegeError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    can_trace(effective()).map_err(|missing| PrivilegeError { uid, missing })
}

/// Whether the kernel has the perf event source `name` (`uprobe`,
/// `kprobe`): the probes of that kind can be made.
pub fn has_event_source(name: &str) -> bool {
    std::path::Path::new("/sys/bus/event_source/devices")
        .join(name)
        .join("type")
        .exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_sets() {
        let cases: &[(u64, Result<(), &str>)] = &[
            (0x1ff_ffff_ffff, Ok(())),
            (1 << CAP_SYS_ADMIN, Ok(())),
            ((1 << CAP_BPF) | (1 << CAP_PERFMON), Ok(())),
            (1 << CAP_BPF, Err("CAP_PERFMON")),
            (0, Err("CAP_BPF and CAP_PERFMON")),
        ];
        for &(eff, expect) in cases {
            assert_eq!(can_trace(eff), expect.map_err(String::from), "{eff:#x}");
        }
    }

    #[test]
    fn parses_status() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(s), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }
}
