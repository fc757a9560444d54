//! The GPU's own view: NVML through nvml-wrapper, sampled on a thread of
//! its own (NVML calls block, sometimes for milliseconds), never on the
//! ring buffer readers. No NVIDIA driver is a normal state: one line, and
//! the host side keeps working.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    Nvml,
    enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
};
use serde::{Deserialize, Serialize};

use crate::probes::cuda::release_in_name;
use tokio::sync::mpsc;

/// The library nvml-wrapper loads by default.
pub const LIBRARY: &str = "libnvidia-ml.so.1";
/// Where the NVIDIA kernel module says its version, while it is loaded.
const MODULE_VERSION: &str = "/proc/driver/nvidia/version";

/// The driver's user-space library as the dynamic loader finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverLibrary {
    /// The file, links resolved (`.../libnvidia-ml.so.535.261.03`).
    pub path: PathBuf,
    /// The driver release in its name (`535.261.03`), if it has one.
    pub version: Option<String>,
}

impl std::fmt::Display for DriverLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{v} ({})", self.path.display()),
            None => write!(f, "{}", self.path.display()),
        }
    }
}

/// NVML could not be used. Each case says what the node lacks and the fix.
#[derive(Debug, thiserror::Error)]
pub enum NvmlUnavailable {
    /// No driver library at all: a node without the NVIDIA driver.
    #[error(
        "no NVIDIA driver libraries ({LIBRARY} not found by the dynamic loader); GPU figures are off, host tracing works"
    )]
    NotInstalled,
    /// The static build, on a node with an NVIDIA kernel module: a static
    /// binary has no dynamic loader, and the driver's library needs one.
    #[error(
        "this is tracer's static build, which cannot load the NVIDIA driver's {LIBRARY} (a static binary has no dynamic loader); GPU figures are off, host and CUDA tracing work. Fix: on GPU nodes install the .deb or run the image (docs/operate/install.md)"
    )]
    StaticBuild,
    /// The static build on a node with no NVIDIA kernel module.
    #[error("no NVIDIA driver (no kernel module loaded); GPU figures are off, host tracing works")]
    NoDriver,
    /// The libraries are there, the kernel module is not (a GPU node whose
    /// driver did not load, or libraries without a GPU).
    #[error(
        "the NVIDIA driver libraries {library} are installed but the NVIDIA kernel module is not loaded (no {MODULE_VERSION}); GPU figures are off, host tracing works. Fix: load it (`modprobe nvidia`; `dmesg | grep -i nvrm` says why it did not load), or install the kernel driver of the same release{}",
        .library.version.as_deref().map(|v| format!(" ({v})")).unwrap_or_default()
    )]
    ModuleNotLoaded {
        /// The library found.
        library: DriverLibrary,
    },
    /// The kernel module and the libraries are of different releases
    /// (the driver was upgraded and the node not rebooted).
    #[error(
        "the NVIDIA kernel module {module} does not match the driver libraries {library}; GPU figures are off, host tracing works. Fix: reboot the node, or unload and reload the nvidia modules, so that the module matches the libraries"
    )]
    VersionMismatch {
        /// The kernel module's release.
        module: String,
        /// The library found.
        library: DriverLibrary,
    },
    /// NVML failed otherwise.
    #[error("NVML unavailable ({}); GPU figures are off, host tracing works", .library.as_ref().map(ToString::to_string).unwrap_or_else(|| LIBRARY.into()))]
    Failed {
        /// The library, if known.
        library: Option<DriverLibrary>,
        /// nvml-wrapper's error.
        #[source]
        source: NvmlError,
    },
}

impl NvmlUnavailable {
    /// Whether the node has a broken driver (libraries without their kernel
    /// module, or of another release), not simply no GPU.
    pub fn is_broken_driver(&self) -> bool {
        matches!(
            self,
            NvmlUnavailable::ModuleNotLoaded { .. } | NvmlUnavailable::VersionMismatch { .. }
        )
    }
}

/// The release of the NVIDIA kernel module loaded now, if one is.
pub fn loaded_module_release() -> Option<String> {
    module_release(&std::fs::read_to_string("/proc/driver/nvidia/version").ok()?)
}

/// The release of the loaded NVIDIA kernel module, from the first line of
/// /proc/driver/nvidia/version (`NVRM version: NVIDIA UNIX x86_64 Kernel
/// Module  535.261.03  ...`, also `... Open Kernel Module for x86_64 ...`);
/// `None` when the module is not loaded.
pub fn module_release(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let after = &line[line.find("Module")? + "Module".len()..];
    after
        .split_whitespace()
        .find(|w| w.contains('.') && w.split('.').all(|p| p.parse::<u32>().is_ok()))
        .map(String::from)
}

/// Finds the library `name` the way the dynamic loader does, by one of
/// its symbols (it is loaded and unloaded again; loading runs no code of
/// the driver's that touches the node).
pub fn locate(name: &str, symbol: &str) -> Option<DriverLibrary> {
    use std::os::unix::ffi::OsStrExt as _;
    let cname = std::ffi::CString::new(name).ok()?;
    let csym = std::ffi::CString::new(symbol).ok()?;
    // SAFETY: a NUL-terminated name; the handle is closed below.
    let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a live handle and a NUL-terminated symbol name.
    let addr = unsafe { libc::dlsym(handle, csym.as_ptr()) };
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info`; its file name is the loader's, valid
    // while the library stays loaded, and copied out before dlclose.
    let path = (!addr.is_null()
        && unsafe { libc::dladdr(addr, &mut info) } != 0
        && !info.dli_fname.is_null())
    .then(|| {
        // SAFETY: checked non-null above; NUL-terminated.
        let bytes = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
        PathBuf::from(OsStr::from_bytes(bytes))
    });
    // SAFETY: the handle dlopen returned, closed once.
    unsafe { libc::dlclose(handle) };
    let path = std::fs::canonicalize(path?).ok()?;
    Some(DriverLibrary {
        version: release_in_name(&path),
        path,
    })
}

/// Opens NVML from `lib` (default: the driver's `libnvidia-ml.so.1`).
///
/// With the default library, a node whose kernel module is not loaded is
/// told so without initializing NVML: the library would create
/// /dev/nvidiactl on a node that has no use for it. A library named with
/// `lib` is always initialized.
pub fn open(lib: Option<&Path>) -> Result<Nvml, NvmlUnavailable> {
    let module = std::fs::read_to_string(MODULE_VERSION).ok();
    let module_loaded = module.is_some() || Path::new("/sys/module/nvidia").exists();
    if cfg!(target_feature = "crt-static") {
        return Err(if module_loaded {
            NvmlUnavailable::StaticBuild
        } else {
            NvmlUnavailable::NoDriver
        });
    }
    let library = match lib {
        Some(p) => {
            let path = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            Some(DriverLibrary {
                version: release_in_name(&path),
                path,
            })
        }
        None => {
            let Some(found) = locate(LIBRARY, "nvmlInit_v2") else {
                return Err(NvmlUnavailable::NotInstalled);
            };
            if !module_loaded {
                return Err(NvmlUnavailable::ModuleNotLoaded { library: found });
            }
            Some(found)
        }
    };
    let mut b = Nvml::builder();
    if let Some(p) = lib {
        b.lib_path(OsStr::new(p));
    }
    b.init().map_err(|source| match (source, library) {
        (NvmlError::DriverNotLoaded, Some(library)) if !module_loaded => {
            NvmlUnavailable::ModuleNotLoaded { library }
        }
        (NvmlError::LibRmVersionMismatch, Some(library)) => NvmlUnavailable::VersionMismatch {
            module: module
                .as_deref()
                .and_then(module_release)
                .unwrap_or_else(|| "(release unknown)".into()),
            library,
        },
        (source, library) => NvmlUnavailable::Failed { library, source },
    })
}

/// One process with GPU memory on a device, as NVML reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Process id (host pid namespace).
    pub pid: u32,
    /// Bytes of device memory NVML charges it (None: not available).
    pub used: Option<u64>,
}

/// One device at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// Index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Name.
    pub name: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Memory, bytes.
    pub total: u64,
    /// Used, bytes.
    pub used: u64,
    /// Free, bytes.
    pub free: u64,
    /// Reserved by the driver, bytes.
    pub reserved: u64,
    /// GPU utilization, percent.
    pub util_gpu: Option<u32>,
    /// Memory utilization, percent.
    pub util_mem: Option<u32>,
    /// Temperature, C.
    pub temperature_c: Option<u32>,
    /// Power, mW.
    pub power_mw: Option<u32>,
    /// Clock throttle reasons (NVML bits).
    pub throttle_reasons: Option<u64>,
    /// Uncorrected ECC errors (aggregate), where supported.
    pub ecc_uncorrected: Option<u64>,
    /// MIG mode on.
    pub mig: Option<bool>,
    /// Processes with memory on it (compute and graphics).
    pub processes: Vec<GpuProcess>,
}

/// Every device at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// How long the sample took, µs.
    pub took_us: u64,
    /// Devices.
    pub devices: Vec<DeviceSample>,
    /// A failure while sampling (the sample may be partial).
    pub error: Option<String>,
}

fn opt<T>(r: Result<T, NvmlError>) -> Option<T> {
    r.ok()
}

/// Samples every device now.
pub fn sample(nvml: &Nvml) -> GpuSample {
    let t0 = Instant::now();
    let mut out = GpuSample {
        ts_ns: crate::util::time::wall_now_ns(),
        ..Default::default()
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    for index in 0..count {
        let d = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                out.error = Some(format!("device {index}: {e}"));
                continue;
            }
        };
        let mem = d.memory_info().ok();
        let util = d.utilization_rates().ok();
        let mut processes: Vec<GpuProcess> = Vec::new();
        for list in [
            d.running_compute_processes(),
            d.running_graphics_processes(),
        ]
        .into_iter()
        .flatten()
        {
            for p in list {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                match processes.iter_mut().find(|q| q.pid == p.pid) {
                    Some(q) => q.used = Some(q.used.unwrap_or(0) + used.unwrap_or(0)),
                    None => processes.push(GpuProcess { pid: p.pid, used }),
                }
            }
        }
        out.devices.push(DeviceSample {
            index,
            uuid: d.uuid().unwrap_or_default(),
            name: d.name().unwrap_or_default(),
            pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            total: mem.as_ref().map(|m| m.total).unwrap_or(0),
            used: mem.as_ref().map(|m| m.used).unwrap_or(0),
            free: mem.as_ref().map(|m| m.free).unwrap_or(0),
            reserved: mem.as_ref().map(|m| m.reserved).unwrap_or(0),
            util_gpu: util.as_ref().map(|u| u.gpu),
            util_mem: util.as_ref().map(|u| u.memory),
            temperature_c: opt(d.temperature(TemperatureSensor::Gpu)),
            power_mw: opt(d.power_usage()),
            throttle_reasons: opt(d.current_throttle_reasons()).map(|r| r.bits()),
            ecc_uncorrected: opt(
                d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            ),
            mig: opt(d.mig_mode()).map(|m| m.current == 1),
            processes,
        });
    }
    out.took_us = t0.elapsed().as_micros() as u64;
    out
}

/// What the NVML thread sends.
#[derive(Debug)]
pub enum FromNvml {
    /// A sample of every device.
    Sample(GpuSample),
    /// An Xid the driver reported through NVML's events, at wall `ts_ns`.
    Xid {
        /// The error (no pid or name: NVML's event has none).
        xid: crate::collect::kmsg::Xid,
        /// When it was received, wall ns.
        ts_ns: i64,
    },
}

/// How long one wait for an NVML event lasts: how soon the Xid watcher
/// notices that the recorder is stopping.
const EVENT_WAIT_MS: u32 = 500;

/// Samples every `interval` on a thread of its own and sends each sample,
/// and the Xids NVML's events report (a second thread, waiting on them);
/// a message on the returned sender asks for a sample now (after a GPU
/// OOM, say). Stops when the receiver is gone.
pub fn spawn(
    nvml: Nvml,
    interval: Duration,
    tx: mpsc::Sender<FromNvml>,
) -> std::io::Result<std::sync::mpsc::Sender<()>> {
    let (now_tx, now_rx) = std::sync::mpsc::channel::<()>();
    thread::Builder::new()
        .name("tracer-nvml".into())
        .spawn(move || {
            thread::scope(|scope| {
                let (nvml, xids) = (&nvml, tx.clone());
                if let Err(e) = thread::Builder::new()
                    .name("tracer-nvml-xid".into())
                    .spawn_scoped(scope, move || watch_xids(nvml, &xids))
                {
                    tracing::warn!(
                        "NVML Xid events: no thread ({e}); Xids come from the kernel log alone"
                    );
                }
                sample_every(nvml, interval, &tx, &now_rx);
            });
        })?;
    Ok(now_tx)
}

fn sample_every(
    nvml: &Nvml,
    interval: Duration,
    tx: &mpsc::Sender<FromNvml>,
    now_rx: &std::sync::mpsc::Receiver<()>,
) {
    let mut next = Instant::now();
    loop {
        let s = sample(nvml);
        if tx.blocking_send(FromNvml::Sample(s)).is_err() {
            return;
        }
        next += interval;
        let now = Instant::now();
        if next <= now {
            // A sample slower than the interval: start the next one now.
            next = now;
            continue;
        }
        match now_rx.recv_timeout(next - now) {
            Ok(()) => {
                while now_rx.try_recv().is_ok() {}
                next = Instant::now();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            // The engine is gone; the sample send above will notice.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
        }
    }
}

/// Waits on NVML's critical-Xid events of every device that has them and
/// sends each one, until the receiver is gone. The kernel log names the
/// same errors (with the process, where the driver knows it): the engine
/// keeps one of the two. NVML's events reach a recorder that cannot read
/// the kernel log, and come without the log's rate limit.
fn watch_xids(nvml: &Nvml, tx: &mpsc::Sender<FromNvml>) {
    use nvml_wrapper::{bitmasks::event::EventTypes, enums::event::XidError};
    let count = nvml.device_count().unwrap_or(0);
    let devices: Vec<u32> = (0..count)
        .filter(|&i| {
            nvml.device_by_index(i)
                .and_then(|d| d.supported_event_types())
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
        })
        .collect();
    // A failed registration frees the set (NVML's rule): start again
    // without that device.
    let mut skip: Vec<u32> = Vec::new();
    let set = 'register: loop {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(
                    "NVML Xid events unavailable ({e}); Xids come from the kernel log alone"
                );
                return;
            }
        };
        for &i in devices.iter().filter(|i| !skip.contains(i)) {
            let registered = nvml
                .device_by_index(i)
                .map_err(Into::into)
                .and_then(|d| d.register_events(EventTypes::CRITICAL_XID_ERROR, set));
            match registered {
                Ok(s) => set = s,
                Err(e) => {
                    tracing::warn!("NVML Xid events of GPU {i}: {e}");
                    skip.push(i);
                    continue 'register;
                }
            }
        }
        break set;
    };
    if devices.len() == skip.len() {
        tracing::info!(
            "no GPU reports Xid events through NVML; Xids come from the kernel log alone"
        );
        return;
    }
    while !tx.is_closed() {
        match set.wait(EVENT_WAIT_MS) {
            Ok(ev) => {
                let Some(XidError::Value(code)) = ev.event_data else {
                    continue;
                };
                let pci = ev.device.pci_info().map(|p| p.bus_id).unwrap_or_default();
                let xid = crate::collect::kmsg::Xid {
                    pci,
                    code: u32::try_from(code).unwrap_or(u32::MAX),
                    message: "reported by NVML's critical Xid event".into(),
                    ..Default::default()
                };
                let ts_ns = crate::util::time::wall_now_ns();
                if tx.blocking_send(FromNvml::Xid { xid, ts_ns }).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(
                    "NVML Xid events stopped ({e}); Xids come from the kernel log alone"
                );
                return;
            }
        }
    }
}

/// A short description of the devices, for logs.
pub fn describe(nvml: &Nvml) -> String {
    let driver = nvml.sys_driver_version().unwrap_or_else(|_| "?".into());
    let count = nvml
        .device_count()
        .map(|c| c.to_string())
        .unwrap_or_else(|e| format!("? ({e})"));
    format!("driver {driver}, {count} GPU(s)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_is_read_from_the_module_version() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jun 11 10:43:08 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(module_release(proprietary).as_deref(), Some("535.261.03"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024\n";
        assert_eq!(module_release(open).as_deref(), Some("550.54.15"));
        assert_eq!(module_release(""), None);
        assert_eq!(module_release("garbage\n"), None);
    }

    #[test]
    fn a_broken_driver_says_what_is_missing_and_the_fix() {
        let library = DriverLibrary {
            path: "/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03".into(),
            version: Some("535.261.03".into()),
        };
        let e = NvmlUnavailable::ModuleNotLoaded {
            library: library.clone(),
        };
        let text = e.to_string();
        assert!(e.is_broken_driver());
        assert!(text.contains("535.261.03 (/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.261.03) are installed"), "{text}");
        assert!(text.contains("kernel module is not loaded"), "{text}");
        assert!(text.contains("modprobe nvidia"), "{text}");
        let e = NvmlUnavailable::VersionMismatch {
            module: "535.183.01".into(),
            library,
        };
        assert!(
            e.to_string()
                .contains("module 535.183.01 does not match the driver libraries 535.261.03"),
            "{e}"
        );
        assert!(!NvmlUnavailable::NotInstalled.is_broken_driver());
    }
}
