//! What an NVIDIA Xid (or NVSwitch SXid) error means: the driver's codes
//! as NVIDIA's published Xid catalogue describes them, kept here as a
//! table (what happened, whether the applications on the GPU were hit,
//! and the usual action), so a log read anywhere is explained without the
//! network, and the recorder can tell which Xids end applications.
//!
//! Only codes whose meaning is settled are in the table; any other is said
//! to be not in it, with where to look.

use serde::Serialize;

use super::Xid;

/// The meaning of one Xid code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Meaning {
    /// What happened.
    pub what: &'static str,
    /// Whether the applications using the GPU were hit (None: the event
    /// itself hurts none, but tells of one that did or will).
    pub apps_affected: Option<bool>,
    /// The usual action.
    pub action: &'static str,
}

const fn m(what: &'static str, apps: Option<bool>, action: &'static str) -> Meaning {
    Meaning {
        what,
        apps_affected: apps,
        action,
    }
}

/// The table: code, meaning.
pub(crate) const TABLE: &[(u32, Meaning)] = &[
    (
        8,
        m(
            "the GPU stopped processing: a channel timed out",
            Some(true),
            "restart the application; reset the GPU if it happens again",
        ),
    ),
    (
        13,
        m(
            "graphics engine exception: most often the application's own illegal memory access or instruction, rarely the hardware",
            Some(true),
            "restart the application; run it under compute-sanitizer to find the fault",
        ),
    ),
    (
        31,
        m(
            "GPU memory page fault (MMU fault): most often the application touched memory it does not own",
            Some(true),
            "restart the application; run it under compute-sanitizer; if it happens on one GPU only, suspect that GPU",
        ),
    ),
    (
        32,
        m(
            "invalid or corrupted push buffer stream: driver, PCIe or memory corruption",
            Some(true),
            "restart the application; if it happens again, check the PCIe link and reset the GPU",
        ),
    ),
    (
        38,
        m(
            "driver firmware error",
            Some(true),
            "reset the GPU; update the driver",
        ),
    ),
    (
        43,
        m(
            "the GPU stopped processing: the driver reset the application's channel after a fault of its own",
            Some(true),
            "restart the application",
        ),
    ),
    (
        44,
        m(
            "graphics engine fault during a context switch",
            Some(true),
            "reset the GPU",
        ),
    ),
    (
        45,
        m(
            "preemptive cleanup: the driver tore down the application's GPU channels because the process was killed or ended, or after an earlier Xid",
            Some(true),
            "nothing by itself: look at the signal or the Xid before it",
        ),
    ),
    (
        48,
        m(
            "double-bit (uncorrectable) ECC error in GPU memory",
            Some(true),
            "reset the GPU; if it happens again, the GPU needs service",
        ),
    ),
    (
        61,
        m(
            "internal micro-controller breakpoint or warning",
            Some(true),
            "reset the GPU",
        ),
    ),
    (
        62,
        m(
            "internal micro-controller halt",
            Some(true),
            "reset the GPU",
        ),
    ),
    (
        63,
        m(
            "ECC page retirement or row remapping recorded: a failing memory row was set aside",
            Some(false),
            "reset the GPU when convenient to put it in effect",
        ),
    ),
    (
        64,
        m(
            "ECC page retirement or row remapping failed",
            Some(true),
            "reset the GPU; if it happens again, the GPU needs service",
        ),
    ),
    (
        68,
        m(
            "video decoder (NVDEC) exception",
            Some(true),
            "restart the application",
        ),
    ),
    (
        69,
        m(
            "graphics engine class error",
            Some(true),
            "restart the application",
        ),
    ),
    (
        74,
        m(
            "NVLink error",
            Some(true),
            "reset the GPU; if it happens again, check the NVLink connections",
        ),
    ),
    (
        79,
        m(
            "the GPU has fallen off the bus: it no longer answers on PCIe",
            Some(true),
            "drain the node, then reset the GPU or reboot; check PCIe seating, power and cooling",
        ),
    ),
    (
        92,
        m(
            "high rate of corrected (single-bit) ECC errors",
            Some(false),
            "watch it; nothing now",
        ),
    ),
    (
        94,
        m(
            "contained ECC error: only the applications using the failed memory were hit",
            Some(true),
            "restart the applications that were hit; reset the GPU when convenient",
        ),
    ),
    (
        95,
        m(
            "uncontained ECC error: every application on the GPU was hit",
            Some(true),
            "reset the GPU",
        ),
    ),
    (
        109,
        m(
            "context switch timeout",
            Some(true),
            "restart the application; reset the GPU if it happens again",
        ),
    ),
    (
        119,
        m(
            "GSP RPC timeout: the GPU's system processor did not answer the driver",
            Some(true),
            "reset the GPU or reboot; update the driver if it happens again",
        ),
    ),
    (
        120,
        m(
            "GSP error: the GPU's system processor failed",
            Some(true),
            "reset the GPU",
        ),
    ),
    (
        154,
        m(
            "GPU recovery action changed: the driver says what the GPU now needs (a reset, a reboot)",
            None,
            "do what the line asks",
        ),
    ),
];

/// What an NVSwitch SXid means: the switch's own catalogue is long and
/// per generation; the line itself and NVIDIA's SXid catalogue tell.
const SXID: Meaning = m(
    "NVSwitch error (SXid): a fault of the NVLink switch fabric between GPUs",
    None,
    "look the code up in NVIDIA's SXid catalogue; the jobs using that fabric may have been hit",
);

/// The meaning of `x`, if the table has it.
pub fn meaning(x: &Xid) -> Option<Meaning> {
    if x.sxid {
        return Some(SXID);
    }
    meaning_of(x.code)
}

/// The meaning of a GPU's Xid `code`, if the table has it.
pub fn meaning_of(code: u32) -> Option<Meaning> {
    TABLE.iter().find(|(c, _)| *c == code).map(|(_, m)| *m)
}
