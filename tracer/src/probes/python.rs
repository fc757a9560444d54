//! The map that tells the stack programs where each process's CPython
//! interpreter is ([`maps::PY_PROCS`]): written by the heap worker's maps
//! readers when they find an interpreter, cleared when its process exits or
//! execs.

use std::sync::{Arc, Mutex};

use aya::maps::{HashMap, MapData};
use tracer_common::{maps, python::PyLayout};

use super::{ProbeError, Probes};

/// Where the programs look up interpreters; shared by the threads that
/// find them and the one that forgets them.
#[derive(Clone)]
pub struct PyProcs(Arc<Mutex<HashMap<MapData, u32, PyLayout>>>);

impl PyProcs {
    /// Tells the programs where `pid`'s interpreter is; false when the
    /// map is full or gone (its samples then carry no Python frames).
    pub fn set(&self, pid: u32, layout: &PyLayout) -> bool {
        self.0
            .lock()
            .is_ok_and(|mut m| m.insert(pid, *layout, 0).is_ok())
    }

    /// Forgets `pid`'s interpreter (absent is fine).
    pub fn remove(&self, pid: u32) {
        if let Ok(mut m) = self.0.lock() {
            let _ = m.remove(&pid);
        }
    }
}

impl Probes {
    /// Takes the interpreters' map out of the object.
    pub fn take_python_map(&mut self) -> Result<PyProcs, ProbeError> {
        let name = maps::PY_PROCS;
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        let map = HashMap::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        Ok(PyProcs(Arc::new(Mutex::new(map))))
    }
}

impl Probes {
    /// Has CUDA allocations send their stacks (off until something reads
    /// them; `None` turns them off): every one of at least
    /// `tracer_common::cuda::STACK_MIN_BYTES`, and one per `sample_bytes`
    /// allocated on average below (0: every one).
    pub fn cuda_stacks(&mut self, sample_bytes: Option<u64>) -> Result<(), ProbeError> {
        let name = maps::CUDA_STACKS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(ProbeError::Missing { what: "map", name })?;
        let mut a: aya::maps::Array<&mut MapData, tracer_common::cuda::StackConfig> =
            aya::maps::Array::try_from(map).map_err(|source| ProbeError::Map { name, source })?;
        let c = tracer_common::cuda::StackConfig {
            on: u32::from(sample_bytes.is_some()),
            _pad: 0,
            sample_bytes: sample_bytes.unwrap_or(0),
        };
        a.set(0, c, 0)
            .map_err(|source| ProbeError::Map { name, source })
    }
}
