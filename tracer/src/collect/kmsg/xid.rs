//! NVIDIA Xid (and NVSwitch SXid) lines of the kernel log.

use serde::{Deserialize, Serialize};

/// An NVIDIA driver Xid error from the kernel log:
/// `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xid {
    /// Monotonic time, µs.
    pub ts_us: u64,
    /// PCI address as printed (`0000:3b:00`).
    pub pci: String,
    /// Xid code (79: fell off the bus, 31: MMU fault, 48: double-bit ECC, ...).
    pub code: u32,
    /// Process the driver named, if any.
    pub pid: Option<u32>,
    /// Its name, if any.
    pub name: Option<String>,
    /// The rest of the message.
    pub message: String,
    /// An NVSwitch SXid (`nvidia-nvswitch0: SXid (PCI:...)`), not a GPU's Xid.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sxid: bool,
}

/// Parses an Xid line.
pub fn parse_xid(text: &str) -> Option<Xid> {
    // `NVRM: Xid (PCI:0000:3b:00): 79, ...`; older drivers print the
    // address without `PCI:`; NVSwitches print `SXid (PCI:...)`; a paste
    // may hide the address (`(PCI:...)`).
    let at = text.find("Xid (")?;
    let sxid = text[..at].ends_with('S');
    if !sxid && !text[..at].ends_with("NVRM: ") {
        return None;
    }
    let rest = &text[at + "Xid (".len()..];
    let (pci, rest) = rest.split_once("):")?;
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci);
    let mut parts = rest.splitn(2, ',');
    let code = parts.next()?.trim().parse().ok()?;
    let mut x = Xid {
        pci: pci.trim().to_string(),
        code,
        sxid,
        ..Default::default()
    };
    let mut message = Vec::new();
    for p in parts.next().unwrap_or("").split(',') {
        let p = p.trim();
        if let Some(v) = p.strip_prefix("pid=") {
            x.pid = v.parse().ok();
        } else if let Some(v) = p.strip_prefix("name=") {
            x.name = Some(v.to_string());
        } else if !p.is_empty() {
            message.push(p);
        }
    }
    x.message = message.join(", ");
    Some(x)
}

/// Bus and device of a PCI address, whatever the domain width and
/// function: `00000000:3B:00.0` and `0000:3b:00` are the same GPU.
pub fn pci_key(addr: &str) -> Option<(u32, u32)> {
    let mut parts = addr.split(':').rev();
    let dev = parts.next()?.split('.').next()?;
    let bus = parts.next()?;
    Some((
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(dev, 16).ok()?,
    ))
}
