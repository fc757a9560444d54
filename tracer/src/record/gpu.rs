//! What tracer records about GPUs: NVML's picture of a device joined with
//! the processes and containers on it, and a CUDA out-of-memory failure.

use serde::{Deserialize, Serialize};

use super::process::ProcRef;

/// One process on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcGpu {
    /// Pid.
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// Container/pod/unit, short form.
    pub container: Option<String>,
    /// Memory cgroup.
    pub memcg: Option<String>,
    /// Device index.
    pub device: u32,
    /// What NVML charges it on the device, bytes.
    pub nvml_used: Option<u64>,
    /// Device-side bytes its traced CUDA calls hold there.
    pub traced_device: Option<u64>,
    /// NVML minus traced: context, allocator slack, untraced libraries.
    pub unexplained: Option<u64>,
    /// Pinned host memory it holds (charged to its memory cgroup).
    pub pinned_host: Option<u64>,
    /// Host RSS, kB.
    pub host_rss_kb: Option<u64>,
    /// Its memory cgroup's usage, bytes.
    pub memcg_usage: Option<u64>,
    /// Its memory cgroup's limit, bytes.
    pub memcg_limit: Option<u64>,
    /// Pinned host memory as a share of its memory cgroup's limit, percent.
    pub pinned_pct_of_limit: Option<f64>,
}

/// One container (or cgroup, when no container is recognised) on one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerGpu {
    /// The container, or the memory cgroup path.
    pub name: String,
    /// Device index.
    pub device: u32,
    /// What NVML charges its processes there, bytes.
    pub nvml_used: u64,
    /// What their traced calls hold there, bytes.
    pub traced_device: u64,
    /// Its share of the device's memory, percent of total.
    pub share_pct: f64,
    /// Its processes there.
    pub pids: Vec<u32>,
    /// Its pod's names, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<crate::model::kube::KubeNames>,
}

/// One device at one moment, with everyone on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicePicture {
    /// Device index.
    pub device: u32,
    /// UUID.
    pub uuid: String,
    /// PCI bus id.
    #[serde(default)]
    pub pci_bus_id: String,
    /// NVML sample time, wall ns.
    pub ts_ns: i64,
    /// Total memory, bytes.
    pub total: u64,
    /// Used, bytes.
    pub used: u64,
    /// Free, bytes.
    pub free: u64,
    /// Reserved by the driver, bytes (neither used nor free).
    #[serde(default)]
    pub reserved: u64,
    /// Processes on it, most memory first.
    pub processes: Vec<ProcGpu>,
    /// Containers on it, most memory first.
    pub containers: Vec<ContainerGpu>,
    /// Xid errors the driver logged for it in the last hour.
    #[serde(default)]
    pub xids: Vec<XidNote>,
}

/// One Xid error of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidNote {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// Xid code.
    pub code: u32,
    /// Process the driver named.
    pub pid: Option<u32>,
    /// The driver's message.
    pub message: String,
}

/// The whole node's GPU picture at one NVML sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// Per device.
    pub devices: Vec<DevicePicture>,
}

impl GpuView {
    /// The device `index`.
    pub fn device(&self, index: u32) -> Option<&DevicePicture> {
        self.devices.iter().find(|d| d.device == index)
    }

    /// Devices where `pid` holds memory (per NVML or per its traced calls).
    pub fn of_process(&self, pid: u32) -> Vec<DevicePicture> {
        self.holding(pid).cloned().collect()
    }

    /// [`GpuView::of_process`], borrowed.
    pub fn holding(&self, pid: u32) -> impl Iterator<Item = &DevicePicture> {
        self.devices
            .iter()
            .filter(move |d| d.processes.iter().any(|p| p.pid == pid))
    }
}

/// GPU memory of one process at a moment (from its traced CUDA calls).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuHolder {
    /// Process.
    pub process: ProcRef,
    /// Bytes held on the device in question (all device-side kinds).
    pub device_bytes: u64,
    /// Its whole ledger.
    pub ledger: crate::model::ledger::LedgerSummary,
}

/// A CUDA allocation that failed with out-of-memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuOomRecord {
    /// Wall time, ns.
    pub ts_ns: i64,
    /// The process whose allocation failed.
    pub process: ProcRef,
    /// The function that failed.
    pub function: String,
    /// Bytes asked for.
    pub size: u64,
    /// Kind of memory asked for.
    pub kind: Option<crate::model::ledger::AllocKind>,
    /// Device (-1 unknown).
    pub device: i32,
    /// The return code (2).
    pub ret: i32,
    /// Thread that called.
    pub tid: u32,
    /// What the process held when it failed, by kind, with its recent history.
    pub held: crate::model::ledger::LedgerSummary,
    /// Other traced processes holding memory on the same device, most first.
    pub others: Vec<GpuHolder>,
    /// The recording session.
    pub session_id: Option<i64>,
    /// What is not known, and why.
    pub gaps: Vec<String>,
    /// NVML's picture of the device at the last sample before the failure.
    #[serde(default)]
    pub nvml: Option<DevicePicture>,
    /// The device memory the process's traced allocations held a moment
    /// before (at most a second), by the stack that allocated it (native
    /// and Python frames), most first: exact for allocations of 1 MiB or
    /// more, estimated from byte samples below.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<crate::record::HeapSite>,
}
