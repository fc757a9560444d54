//! Why the kernel refused a program, in one line a user can act on.
//!
//! The verifier's log runs to thousands of lines; the reason is usually
//! one of them. A helper the kernel does not have (older than the program
//! needs) is named with the release that brought it; anything else is the
//! log's last line. The whole log goes to the debug log.

use aya::programs::ProgramError;

/// BPF helpers the programs call that came after the ring buffer (5.8),
/// the oldest kernel tracer runs on: (`enum bpf_func_id` value, name, the
/// release that added it), from include/uapi/linux/bpf.h.
const NEWER_HELPERS: &[(u32, &str, &str)] = &[
    (158, "bpf_get_current_task_btf", "5.11"),
    (173, "bpf_get_func_ip", "5.15"),
    (174, "bpf_get_attach_cookie", "5.15"),
    (175, "bpf_task_pt_regs", "5.15"),
    (180, "bpf_find_vma", "5.17"),
    (181, "bpf_loop", "5.17"),
];

/// The verifier's closing statistics, never the reason.
const STATISTICS: [&str; 3] = ["processed ", "verification time", "stack depth"];

/// One line saying why `program` could not be loaded or attached; the
/// verifier's whole log, when there is one, is logged at debug level.
pub fn brief(program: &str, e: &ProgramError) -> String {
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    else {
        return e.to_string();
    };
    let log = format!("{verifier_log:?}");
    tracing::debug!("verifier log of {program}:\n{log}");
    brief_log(io_error, &log)
}

/// [`brief`] of a load failure with its verifier `log`.
fn brief_log(io_error: &std::io::Error, log: &str) -> String {
    if let Some((id, known)) = unknown_helper(log) {
        let newer = NEWER_HELPERS.iter().find(|(n, ..)| *n == id);
        return match (known, newer) {
            (false, Some((_, name, since))) => {
                format!("needs the BPF helper {name} (Linux {since}+), which this kernel lacks")
            }
            (false, None) => format!("needs BPF helper #{id}, which this kernel lacks"),
            (true, _) => format!(
                "calls BPF helper #{id}, which this kernel does not allow in this program type"
            ),
        };
    }
    let last = log
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !STATISTICS.iter().any(|s| l.starts_with(s)));
    match last {
        Some(l) => format!("the verifier refused it ({io_error}): {l}"),
        None => format!("the kernel refused it ({io_error})"),
    }
}

/// The helper id of the verifier's `invalid func unknown#N` (a kernel that
/// does not know the helper at all: false) or `unknown func NAME#N` (one
/// that knows it but not for this program type: true).
fn unknown_helper(log: &str) -> Option<(u32, bool)> {
    log.lines().find_map(|l| {
        let (rest, known) = match l.split_once("invalid func unknown#") {
            Some((_, rest)) => (rest, false),
            None => (l.split_once("unknown func ")?.1, true),
        };
        let digits = rest.rsplit('#').next().unwrap_or(rest);
        let digits: String = digits.chars().take_while(char::is_ascii_digit).collect();
        Some((digits.parse().ok()?, known))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn einval() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EINVAL)
    }

    /// The tail of the log Debian 11's 5.10.0-46 printed for the growth
    /// program (`cargo xtask vm-test --kernel 5.10`), register states cut.
    const LOG_5_10: &str = "; if first {\n424: (15) if r7 == 0x0 goto pc-21\n; fun()\n\
        425: (85) call unknown#158\ninvalid func unknown#158\n\
        verification time 9789 usec\nstack depth 48+0\n";

    /// The same kernel on the exit program as it was before its RSS was
    /// always initialised.
    const LOG_5_10_STACK: &str = "192: (79) r1 = *(u64 *)(r10 -72)\n\
        193: (79) r2 = *(u64 *)(r10 -152)\ninvalid read from stack R10 off=-152 size=8\n\
        verification time 256097 usec\nstack depth 160+0\n";

    #[test]
    fn a_missing_helper_is_named_with_its_release() {
        assert_eq!(
            brief_log(&einval(), LOG_5_10),
            "needs the BPF helper bpf_get_current_task_btf (Linux 5.11+), which this kernel lacks"
        );
        // A helper the kernel knows, in a program type that may not call it.
        assert_eq!(
            brief_log(
                &einval(),
                "12: (85) call bpf_task_pt_regs#175\nunknown func bpf_task_pt_regs#175\n"
            ),
            "calls BPF helper #175, which this kernel does not allow in this program type"
        );
        assert_eq!(
            brief_log(&einval(), "invalid func unknown#999\n"),
            "needs BPF helper #999, which this kernel lacks"
        );
    }

    #[test]
    fn any_other_refusal_is_the_logs_last_line() {
        assert_eq!(
            brief_log(&einval(), LOG_5_10_STACK),
            format!(
                "the verifier refused it ({}): invalid read from stack R10 off=-152 size=8",
                einval()
            )
        );
        let log =
            "0: (b7) r0 = 0\n1: (95) exit\nR0 !read_ok\nprocessed 2 insns\nstack depth 160+0\n\n";
        assert_eq!(
            brief_log(&einval(), log),
            format!("the verifier refused it ({}): R0 !read_ok", einval())
        );
        assert!(brief_log(&einval(), "").starts_with("the kernel refused it"));
    }
}
