//! Leaf helpers with no dependency on the rest of the crate.

pub mod fsafe;
pub mod handoff;
pub mod out;
pub mod sys;
pub mod term;
pub mod time;
pub mod units;

/// FNV-1a, 64 bits: a hash that is the same in every build and run (std's
/// is seeded), for names kept on disk and keys of names.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An error with its causes, `a: b: c`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}
