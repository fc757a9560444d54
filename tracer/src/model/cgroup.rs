//! Cgroups: where the hierarchies are mounted (v1, v2, hybrid), which
//! memory cgroup a process is in, and who owns a cgroup (container runtime
//! and id, Kubernetes pod and QoS class, systemd unit), from the path alone.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// How cgroups are laid out on this host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CgroupLayout {
    /// Mount point of the v1 memory controller, if any.
    pub memory_v1: Option<PathBuf>,
    /// Mount point of the v2 (unified) hierarchy, if any.
    pub unified: Option<PathBuf>,
    /// The unified hierarchy has the memory controller.
    pub unified_has_memory: bool,
    /// The memory controller's hierarchy id, as `/proc/cgroups` and the
    /// cgroup tracepoints' `root` number it (0: the unified hierarchy).
    pub memory_hierarchy: Option<i32>,
}

/// The memory controller's hierarchy id in `/proc/cgroups` text
/// (`#subsys_name hierarchy num_cgroups enabled`); `None` when it is not
/// there or not enabled.
pub fn memory_hierarchy(text: &str) -> Option<i32> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f[..] {
            ["memory", h, _, "1"] => h.parse().ok(),
            _ => None,
        }
    })
}

impl CgroupLayout {
    /// Reads the layout from /proc/self/mountinfo.
    pub fn detect() -> Self {
        let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut layout = Self::from_mountinfo(&text);
        if let Some(u) = &layout.unified {
            let controllers = fs::read_to_string(u.join("cgroup.controllers")).unwrap_or_default();
            layout.unified_has_memory = controllers.split_whitespace().any(|c| c == "memory");
        }
        // The unified hierarchy is 0; a v1 controller's id is in
        // /proc/cgroups (which newer kernels keep for v1 only).
        layout.memory_hierarchy = if layout.memory_v1.is_some() {
            memory_hierarchy(&fs::read_to_string("/proc/cgroups").unwrap_or_default())
        } else {
            layout.unified_has_memory.then_some(0)
        };
        layout
    }

    /// Parses mountinfo text (the controllers file is not read).
    pub fn from_mountinfo(text: &str) -> Self {
        let mut layout = Self::default();
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split_whitespace().nth(4).map(PathBuf::from);
            let mut r = right.split_whitespace();
            let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
            match fstype {
                Some("cgroup2") if layout.unified.is_none() => layout.unified = mount_point,
                Some("cgroup") if options.split(',').any(|o| o == "memory") => {
                    layout.memory_v1 = mount_point;
                }
                _ => {}
            }
        }
        layout
    }

    /// "v1", "v2", "hybrid" or "none", by where the memory controller is.
    pub fn kind(&self) -> &'static str {
        match (&self.memory_v1, &self.unified, self.unified_has_memory) {
            (Some(_), Some(_), _) => "hybrid",
            (Some(_), None, _) => "v1",
            (None, Some(_), true) => "v2",
            (None, Some(_), false) => "v2 (no memory controller)",
            (None, None, _) => "none",
        }
    }

    /// The directory of a memory cgroup path (as /proc/PID/cgroup names it).
    pub fn memcg_dir(&self, path: &str) -> Option<PathBuf> {
        let root = match (&self.memory_v1, &self.unified) {
            (Some(v1), _) => v1,
            (None, Some(u)) if self.unified_has_memory => u,
            _ => return None,
        };
        Some(root.join(path.trim_start_matches('/')))
    }

    /// Whether the memory controller is v1 (else v2).
    pub fn memory_is_v1(&self) -> bool {
        self.memory_v1.is_some()
    }

    /// Finds the memory cgroup whose directory inode is `id` (the cgroup id
    /// that memcg tracepoints report), searching from the memory root.
    pub fn memcg_path_by_id(&self, id: u64) -> Option<String> {
        let mut found = None;
        self.walk_memcgs(|ino, path| {
            if ino == id {
                found = Some(path);
                false
            } else {
                true
            }
        });
        found
    }

    /// Every memory cgroup, by id (its directory's inode).
    pub fn memcg_ids(&self) -> HashMap<u64, String> {
        let mut out = HashMap::new();
        self.walk_memcgs(|ino, path| {
            out.insert(ino, path);
            true
        });
        out
    }

    /// Calls `f(id)` for memory cgroup `path` and each one below it, at
    /// most `most` of them.
    pub fn memcg_ids_under(&self, path: &str, most: usize, mut f: impl FnMut(u64)) {
        let Some(dir) = self.memcg_dir(path) else {
            return;
        };
        if most == 0 {
            return;
        }
        let mut left = most;
        self.walk_from(dir, |id, _| {
            f(id);
            left -= 1;
            left > 0
        });
    }

    /// Calls `f(id, path)` for each memory cgroup until it returns false.
    fn walk_memcgs(&self, f: impl FnMut(u64, String) -> bool) {
        if let Some(root) = self.memcg_dir("/") {
            self.walk_from(root, f);
        }
    }

    /// Calls `f(id, path)` for `start` and each memory cgroup below it until
    /// it returns false; `path` as /proc/PID/cgroup names it.
    fn walk_from(&self, start: PathBuf, mut f: impl FnMut(u64, String) -> bool) {
        let Some(root) = self.memcg_dir("/") else {
            return;
        };
        let mut stack = vec![start];
        while let Some(dir) = stack.pop() {
            if let Ok(m) = fs::metadata(&dir)
                && let Ok(rel) = dir.strip_prefix(&root)
                && !f(m.ino(), format!("/{}", rel.display()))
            {
                return;
            }
            if let Ok(rd) = fs::read_dir(&dir) {
                stack.extend(
                    rd.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
    }
}

/// The cgroups of one process, from /proc/PID/cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcCgroups {
    /// Path in the v1 memory hierarchy.
    pub memory_v1: Option<String>,
    /// Path in the v2 hierarchy (`0::/path`).
    pub unified: Option<String>,
}

impl ProcCgroups {
    /// Parses /proc/PID/cgroup text.
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                out.unified = Some(path.to_string());
            } else if controllers.split(',').any(|c| c == "memory") {
                out.memory_v1 = Some(path.to_string());
            }
        }
        out
    }

    /// The path that holds the process's memory accounting.
    pub fn memory_path(&self, layout: &CgroupLayout) -> Option<&str> {
        if layout.memory_is_v1() {
            self.memory_v1.as_deref()
        } else {
            self.unified.as_deref()
        }
    }
}

/// Who a cgroup belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Container runtime: docker, containerd, cri-o, podman, nerdctl.
    pub runtime: Option<String>,
    /// Container id (full).
    pub container_id: Option<String>,
    /// Kubernetes pod UID (with dashes).
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class: Guaranteed, Burstable, BestEffort.
    pub qos: Option<String>,
    /// systemd unit (service, scope or slice) that holds it, outside containers.
    pub unit: Option<String>,
    /// Kubernetes namespace, pod and container names, when the node's
    /// files give them (kube.rs looks them up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<KubeNames>,
}

/// A pod's (and container's) names.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KubeNames {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name (none for the pod's sandbox, or when not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl KubeNames {
    /// The bytes of its strings.
    pub fn weight(&self) -> usize {
        self.namespace.len() + self.pod.len() + self.container.as_ref().map_or(0, String::len)
    }
}

impl Owner {
    /// Whether nothing was recognised.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `docker ab12cd34ef56`, `pod 1b2c… (Burstable)`, `nginx.service`;
    /// for a named pod `ml/trainer-0/worker (containerd ab12cd34ef56)`.
    pub fn short(&self) -> Option<String> {
        let id = |rt: &str, id: &str| format!("{rt} {}", &id[..id.len().min(12)]);
        if let Some(k) = &self.kube {
            let mut s = format!("{}/{}", k.namespace, k.pod);
            if let Some(c) = &k.container {
                s.push('/');
                s.push_str(c);
            }
            if let (Some(rt), Some(cid)) = (&self.runtime, &self.container_id) {
                s.push_str(&format!(" ({})", id(rt, cid)));
            }
            return Some(s);
        }
        let mut parts = Vec::new();
        if let (Some(rt), Some(cid)) = (&self.runtime, &self.container_id) {
            parts.push(id(rt, cid));
        }
        if let Some(pod) = &self.pod_uid {
            let qos = self
                .qos
                .as_deref()
                .map(|q| format!(" ({q})"))
                .unwrap_or_default();
            parts.push(format!("pod {pod}{qos}"));
        }
        if parts.is_empty()
            && let Some(u) = &self.unit
        {
            parts.push(u.clone());
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// Whether cgroup `path` is `over` or below it (by whole path parts: not
/// `/podcast` under `/pod`).
pub fn at_or_below(path: &str, over: &str) -> bool {
    path == over
        || over == "/"
        || path
            .strip_prefix(over)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Where a process ran, for people: its pod's container by name, its
/// container or unit, else its memory cgroup.
pub fn place(owner: Option<&Owner>, cgroup: Option<&str>) -> String {
    if let Some(k) = owner.and_then(|o| o.kube.as_ref()) {
        return format!(
            "{}/{}/{}",
            k.namespace,
            k.pod,
            k.container.as_deref().unwrap_or("-")
        );
    }
    owner
        .and_then(Owner::short)
        .or_else(|| cgroup.map(str::to_string))
        .unwrap_or_else(|| "-".into())
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Recognises the owner of a cgroup path, for the cgroupfs and systemd
/// drivers of docker, containerd (CRI and nerdctl), CRI-O and podman, and
/// Kubernetes pods of every QoS class.
pub fn owner_of(path: &str) -> Owner {
    let mut o = Owner::default();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut in_kube = false;
    for (i, seg) in segments.iter().enumerate() {
        let name = seg
            .strip_suffix(".scope")
            .or_else(|| seg.strip_suffix(".slice"))
            .unwrap_or(seg);
        // Kubernetes: kubepods[.slice], QoS level, pod level.
        if name == "kubepods" {
            in_kube = true;
            o.qos = Some("Guaranteed".into());
            continue;
        }
        if in_kube {
            if name == "burstable" || name.ends_with("-burstable") {
                o.qos = Some("Burstable".into());
                continue;
            }
            if name == "besteffort" || name.ends_with("-besteffort") {
                o.qos = Some("BestEffort".into());
                continue;
            }
            // cgroupfs: `pod<uid>`; systemd: `kubepods-<qos>-pod<uid_with_underscores>`.
            let uid = name
                .strip_prefix("pod")
                .or_else(|| name.rsplit_once("-pod").map(|(_, u)| u));
            if let Some(uid) = uid {
                o.pod_uid = Some(uid.replace('_', "-"));
                continue;
            }
        }
        // Containers: <prefix>-<id>.scope (systemd driver), <prefix>-<id> or <id> (cgroupfs).
        if let Some((prefix, id)) = name.rsplit_once('-')
            && is_container_id(id)
        {
            let runtime = match prefix {
                "docker" => "docker",
                "cri-containerd" => "containerd",
                "crio" | "crio-conmon" => "cri-o",
                "libpod" | "libpod-conmon" => "podman",
                "nerdctl" => "nerdctl",
                other => other,
            };
            o.runtime = Some(runtime.into());
            o.container_id = Some(id.into());
            continue;
        }
        if is_container_id(name) {
            let parent = i.checked_sub(1).map(|p| segments[p]).unwrap_or("");
            let runtime = if parent == "docker" {
                "docker"
            } else if in_kube {
                "containerd"
            } else {
                "unknown"
            };
            o.runtime = Some(runtime.into());
            o.container_id = Some(name.into());
            continue;
        }
        if seg.ends_with(".service") || seg.ends_with(".scope") {
            o.unit = Some((*seg).into());
        }
    }
    if !in_kube {
        o.qos = None;
    }
    o
}

/// The cgroup of the pod that `path` is in (`path` itself, or the part of
/// it down to the pod's level), if it is in one.
pub fn pod_cgroup(path: &str) -> Option<String> {
    path.char_indices()
        .filter(|&(i, c)| c == '/' && i > 0)
        .map(|(i, _)| i)
        .chain([path.len()])
        .map(|end| &path[..end])
        .find(|prefix| owner_of(prefix).pod_uid.is_some())
        .map(String::from)
}

/// Reads a cgroup directory's inode (its cgroup id).
pub fn dir_id(dir: &Path) -> Option<u64> {
    fs::metadata(dir).ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "8f3c5d9e0b1a2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5";

    #[test]
    fn owners_of_each_runtime_and_driver() {
        let pod = "1b2c3d4e-5f6a-7b8c-9d0e-1f2a3b4c5d6e";
        let pod_sd = pod.replace('-', "_");
        let cases: Vec<(String, Owner)> = vec![
            (
                format!("/docker/{ID}"),
                own(Some("docker"), None, None, None),
            ),
            (
                format!("/system.slice/docker-{ID}.scope"),
                own(Some("docker"), None, None, None),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_sd}.slice/cri-containerd-{ID}.scope"
                ),
                own(Some("containerd"), Some(pod), Some("Burstable"), None),
            ),
            (
                format!("/kubepods/burstable/pod{pod}/{ID}"),
                own(Some("containerd"), Some(pod), Some("Burstable"), None),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{pod_sd}.slice/crio-{ID}.scope"),
                own(Some("cri-o"), Some(pod), Some("Guaranteed"), None),
            ),
            (
                format!("/kubepods/besteffort/pod{pod}/crio-{ID}"),
                own(Some("cri-o"), Some(pod), Some("BestEffort"), None),
            ),
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                own(Some("podman"), None, None, None),
            ),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
                ),
                own(Some("podman"), None, None, None),
            ),
            (
                format!("/system.slice/nerdctl-{ID}.scope"),
                own(Some("nerdctl"), None, None, None),
            ),
            (
                "/system.slice/nginx.service".into(),
                own(None, None, None, Some("nginx.service")),
            ),
            (
                "/user.slice/user-1000.slice/session-3.scope".into(),
                own(None, None, None, Some("session-3.scope")),
            ),
            ("/".into(), Owner::default()),
            ("/tracer-test-1234".into(), Owner::default()),
        ];
        for (path, expect) in cases {
            let mut got = owner_of(&path);
            if expect.unit.is_none() {
                got.unit = None;
            }
            assert_eq!(got, expect, "{path}");
        }
    }

    fn own(rt: Option<&str>, pod: Option<&str>, qos: Option<&str>, unit: Option<&str>) -> Owner {
        Owner {
            runtime: rt.map(String::from),
            container_id: rt.map(|_| ID.to_string()),
            pod_uid: pod.map(String::from),
            qos: qos.map(String::from),
            unit: unit.map(String::from),
            kube: None,
        }
    }

    #[test]
    fn a_pods_cgroup_is_the_path_down_to_its_pod() {
        let sd = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c.slice";
        assert_eq!(
            pod_cgroup(&format!("{sd}/cri-containerd-{ID}.scope")).as_deref(),
            Some(sd)
        );
        assert_eq!(
            pod_cgroup(&format!("/t/kubepods/besteffort/podab-cd/{ID}")).as_deref(),
            Some("/t/kubepods/besteffort/podab-cd")
        );
        assert_eq!(
            pod_cgroup("/kubepods/pod1").as_deref(),
            Some("/kubepods/pod1")
        );
        assert_eq!(pod_cgroup(&format!("/docker/{ID}")), None);
        assert_eq!(pod_cgroup("/kubepods/burstable"), None);
    }

    #[test]
    fn short_names() {
        let o = owner_of(&format!("/kubepods/burstable/pod1b2c/{ID}"));
        assert_eq!(
            o.short().unwrap(),
            "containerd 8f3c5d9e0b1a, pod 1b2c (Burstable)"
        );
        assert_eq!(owner_of("/x").short(), None);
    }

    #[test]
    fn proc_cgroup_files() {
        let hybrid =
            "12:memory:/tracer-test\n11:cpu:/\n1:name=systemd:/init.scope\n0::/init.scope\n";
        let c = ProcCgroups::parse(hybrid);
        assert_eq!(c.memory_v1.as_deref(), Some("/tracer-test"));
        assert_eq!(c.unified.as_deref(), Some("/init.scope"));
        let v2 = ProcCgroups::parse("0::/system.slice/a.service\n");
        assert_eq!(
            (v2.memory_v1, v2.unified.as_deref()),
            (None, Some("/system.slice/a.service"))
        );
        let both = ProcCgroups::parse("4:memory,cpu:/a:b\n");
        assert_eq!(both.memory_v1.as_deref(), Some("/a:b"));
    }

    #[test]
    fn the_memory_hierarchy_id_comes_from_proc_cgroups() {
        // /proc/cgroups of this project's test machine (6.18, memory on v1).
        let hybrid = "#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t1\t1
cpu\t1\t1\t1
cpuacct\t2\t1\t1
blkio\t7\t1\t1
memory\t4\t33\t1
devices\t5\t1\t1
freezer\t6\t1\t1
net_cls\t0\t1\t1
";
        assert_eq!(memory_hierarchy(hybrid), Some(4));
        assert_eq!(
            memory_hierarchy(&hybrid.replace("memory\t4\t33\t1", "memory\t0\t33\t0")),
            None,
            "disabled"
        );
        assert_eq!(memory_hierarchy(""), None);
    }

    #[test]
    fn memcg_ids_resolve_to_paths() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("kubepods/pod1/ctr");
        fs::create_dir_all(&leaf).unwrap();
        let layout = CgroupLayout {
            memory_v1: Some(root.path().into()),
            ..Default::default()
        };
        let id = dir_id(&leaf).unwrap();
        assert_eq!(
            layout.memcg_path_by_id(id).as_deref(),
            Some("/kubepods/pod1/ctr")
        );
        assert_eq!(
            layout
                .memcg_path_by_id(dir_id(root.path()).unwrap())
                .as_deref(),
            Some("/")
        );
        assert_eq!(layout.memcg_path_by_id(u64::MAX), None);
    }

    #[test]
    fn layouts_from_mountinfo() {
        let hybrid = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
38 25 0:33 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
39 25 0:34 / /sys/fs/cgroup/cpu rw,relatime shared:15 - cgroup cgroup rw,cpu
";
        let l = CgroupLayout::from_mountinfo(hybrid);
        assert_eq!(
            l.memory_v1.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            l.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(l.kind(), "hybrid");
        assert_eq!(
            l.memcg_dir("/a/b").unwrap(),
            Path::new("/sys/fs/cgroup/memory/a/b")
        );
        let v2 = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let mut l = CgroupLayout::from_mountinfo(v2);
        l.unified_has_memory = true;
        assert_eq!(l.kind(), "v2");
        assert_eq!(
            l.memcg_dir("/kubepods.slice").unwrap(),
            Path::new("/sys/fs/cgroup/kubepods.slice")
        );
        assert_eq!(CgroupLayout::from_mountinfo("").kind(), "none");
    }
}
