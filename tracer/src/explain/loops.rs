//! Kills that belong together. A crash loop is one killer killing
//! processes of one name in one place for one cause, each soon after the
//! one before: `kills`, `explain --all` and `report` show it once.

use std::{collections::BTreeMap, time::Duration};

use super::Cause;
use crate::{model::cgroup::Owner, record::KillRecord};

/// Kills of one crash loop are at most this far apart: more than the
/// longest back-off of a restart policy (kubelet's is 5 min) plus the
/// time to grow into a limit again.
pub const GAP_NS: i64 = 30 * 60 * 1_000_000_000;

pub use crate::model::cgroup::place;

/// What stays the same across the restarts of a crash loop: the pod's
/// container by name, else the pod (each restart is a new container), the
/// container, or the cgroup; none when no place is known.
fn home(owner: Option<&Owner>, cgroup: Option<&str>) -> Option<String> {
    if owner.and_then(|o| o.kube.as_ref()).is_some() {
        return Some(place(owner, cgroup));
    }
    owner
        .and_then(|o| o.pod_uid.clone().or_else(|| o.container_id.clone()))
        .or_else(|| cgroup.map(str::to_string))
}

/// The crash-loop key of a kill whose verdict's cause is `cause`; none
/// for a kill whose place is not known (kills of one name in places not
/// known are not said to be one loop).
pub fn key(k: &KillRecord, cause: Cause) -> Option<String> {
    let home = home(k.victim.owner.as_ref(), k.cgroup())?;
    Some(format!(
        "{}\0{home}\0{}\0{cause:?}",
        k.killer.name(),
        k.victim.comm
    ))
}

/// Groups `items` into crash loops: the same [`key`], each within
/// [`GAP_NS`] of the next (an item with no key is a group of its own).
/// Returns the groups as indices into `items`, each latest first, the
/// group with the latest kill first.
pub fn loops<T>(
    items: &[T],
    key: impl Fn(&T) -> Option<String>,
    ts_ns: impl Fn(&T) -> i64,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ts_ns(&items[i])));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // The open group of each key, by index into `groups`.
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    for i in order {
        let Some(k) = key(&items[i]) else {
            groups.push(vec![i]);
            continue;
        };
        let t = ts_ns(&items[i]);
        match open.get(&k) {
            Some(&g) if ts_ns(&items[*groups[g].last().expect("never empty")]) - t <= GAP_NS => {
                groups[g].push(i)
            }
            _ => {
                open.insert(k, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// `killed 14 times in 20m` for a group's count and first and last times.
pub fn span(count: usize, first_ns: i64, last_ns: i64) -> String {
    let secs = ((last_ns - first_ns).max(0) / 1_000_000_000) as u64;
    format!(
        "killed {count} times in {}",
        humantime::format_duration(Duration::from_secs(secs.max(1)))
    )
}
