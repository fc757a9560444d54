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
use tokio::sync::mpsc;

/// NVML could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("NVML unavailable ({}); GPU figures are off, host tracing works", .lib.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "libnvidia-ml.so.1".into()))]
pub struct NvmlUnavailable {
    /// The library asked for, if not the default.
    pub lib: Option<PathBuf>,
    /// nvml-wrapper's error.
    #[source]
    pub source: NvmlError,
}

/// Opens NVML from `lib` (default: the driver's `libnvidia-ml.so.1`).
pub fn open(lib: Option<&Path>) -> Result<Nvml, NvmlUnavailable> {
    let mut b = Nvml::builder();
    if let Some(p) = lib {
        b.lib_path(OsStr::new(p));
    }
    b.init().map_err(|source| NvmlUnavailable {
        lib: lib.map(Path::to_path_buf),
        source,
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

/// Samples every `interval` on a thread of its own and sends each sample;
/// a message on the returned sender asks for a sample now (after a GPU
/// OOM, say). Stops when the receiver is gone.
pub fn spawn(
    nvml: Nvml,
    interval: Duration,
    tx: mpsc::Sender<GpuSample>,
) -> std::io::Result<std::sync::mpsc::Sender<()>> {
    let (now_tx, now_rx) = std::sync::mpsc::channel::<()>();
    thread::Builder::new()
        .name("tracer-nvml".into())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                let s = sample(&nvml);
                if tx.blocking_send(s).is_err() {
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
        })?;
    Ok(now_tx)
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
