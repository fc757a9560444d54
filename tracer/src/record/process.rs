//! A process as records name it: the killer, the victim's fellow tasks,
//! a GPU holder.

use serde::{Deserialize, Serialize};

use crate::model::cgroup::Owner;

/// A process as named in a report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// Pid; 0 when not known (a saved log's header without its `CPU: ...
    /// PID:` line), written as null.
    #[serde(with = "pid_or_null")]
    pub pid: u32,
    /// Name.
    pub comm: String,
    /// Command line, when known.
    pub cmdline: Option<String>,
    /// Memory cgroup, when known.
    pub memcg: Option<String>,
    /// Container, pod or unit, when recognised.
    pub owner: Option<Owner>,
}

/// A pid that is 0 when not known, written as null (and null read as 0).
mod pid_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(pid: &u32, s: S) -> Result<S::Ok, S::Error> {
        match *pid {
            0 => s.serialize_none(),
            p => s.serialize_some(&p),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        Ok(Option::<u32>::deserialize(d)?.unwrap_or(0))
    }
}
