//! kubelet's lines, which say why it stops a pod or a container: its
//! eviction manager (`attempting to reclaim memory`, `must evict pod(s) to
//! reclaim memory`, `pod NAME(UID) evicted successfully`, the structured
//! `"Eviction manager: pod is evicted successfully" pod="ns/name"`), a
//! failed probe (`Liveness probe failed`, `failed liveness probe, will be
//! restarted`), a pod deleted through the API, its admission's preemption
//! for a critical pod, a pod past its activeDeadlineSeconds; and the kill
//! lines that follow (`Killing container "docker://ID" with 30 second grace
//! period`, `"Killing container with a grace period" pod="ns/name" ...
//! containerName="c"`, `Killing unwanted pod "name"`).

use super::{Said, UserKill, quoted};

/// kubelet's reasons between its lines.
#[derive(Debug, Default)]
pub struct Kubelet {
    /// Its last reason to evict or kill (its eviction manager's resource,
    /// a failed probe).
    why: Option<String>,
    /// Its reasons for a named pod (deleted through the API, preempted,
    /// past its deadline, a failed probe), by pod name, the newest last; at
    /// most [`POD_REASONS`].
    pod_why: std::collections::VecDeque<(String, String)>,
    /// The pod of its last kill line and its reason: the pod's other
    /// containers, killed next, share it.
    last_pod_kill: Option<(String, String)>,
}

impl Kubelet {
    /// kubelet's reason for `pod` (any form), for its next kill line.
    fn pod_reason(&mut self, pod: &str, why: String) {
        let key = pod_name(pod).to_string();
        self.pod_why.retain(|(p, _)| *p != key);
        if self.pod_why.len() == POD_REASONS {
            self.pod_why.pop_front();
        }
        self.pod_why.push_back((key, why));
    }

    /// The reason kubelet gave for `pod` before this kill line of it (or
    /// gave the kill of another of its containers just before).
    fn reason_of_pod(&mut self, pod: &str) -> Option<String> {
        let key = pod_name(pod);
        let why = match self.pod_why.iter().position(|(p, _)| p == key) {
            Some(i) => self.pod_why.remove(i).map(|(_, w)| w),
            None => self
                .last_pod_kill
                .as_ref()
                .filter(|(p, _)| p == key)
                .map(|(_, w)| w.clone()),
        };
        if let Some(w) = &why {
            self.last_pod_kill = Some((key.to_string(), w.clone()));
        }
        why
    }

    /// One of kubelet's messages (its klog header taken off).
    pub fn push(&mut self, text: &str) -> Option<Said> {
        let lower = text.to_ascii_lowercase();
        // kubelet's reasons for a pod it then stops: the API deleted it
        // (kubectl delete, a rollout, a controller, the scheduler's
        // preemption), its own admission preempted it for a critical pod,
        // or it outlived its activeDeadlineSeconds.
        if let Some(pods) = api_delete(text) {
            for pod in pods {
                self.pod_reason(pod, API_DELETE.into());
            }
            return None;
        }
        if let Some((pods, short)) = preempting(text) {
            let why = preempted(short);
            for pod in pods {
                self.pod_reason(pod, why.clone());
            }
            return None;
        }
        if lower.contains("longer than the specified deadline") {
            let pod = quoted(text, "object=").map(str::to_string).or_else(|| {
                Some(format!(
                    "{}/{}",
                    quoted(text, "Namespace:")?,
                    quoted(text, "Name:")?
                ))
            })?;
            self.pod_reason(&pod, DEADLINE.into());
            return None;
        }
        let t = text.trim_start();
        // `Killing unwanted pod "name"`: a pod no longer meant to run here.
        if let Some(rest) = t.strip_prefix("Killing unwanted pod ").or_else(|| {
            t.strip_prefix("\"Killing unwanted pod\"")
                .and_then(|r| r.split_once("podName=").map(|(_, r)| r))
        }) {
            let pod = rest.trim().trim_matches('"').split('"').next()?.to_string();
            let reason = self.reason_of_pod(&pod).unwrap_or_else(|| {
                "kubelet stopped the pod: it is no longer meant to run here (its reason is not in the log)".into()
            });
            return Some(Said::Kill(Box::new(UserKill {
                killer: "kubelet",
                pod: Some(pod),
                reason,
                signal: Some("SIGTERM"),
                ..Default::default()
            })));
        }
        if lower.contains("attempting to reclaim ")
            || lower.contains("must evict pod(s)")
            || lower.contains("probe failed")
            || lower.contains("failed liveness probe")
            || lower.contains("failed startup probe")
            || lower.contains("the node was low on resource")
        {
            let why = structured_reason(text);
            let why = why.trim().trim_start_matches("eviction manager: ");
            // One reason per incident: the first line that says it.
            let why = why.trim_matches('"').to_string();
            if let Some(pod) = quoted(text, "pod=") {
                self.pod_reason(pod, why.clone());
            }
            if !self
                .why
                .as_deref()
                .is_some_and(|w| lower.contains("must evict") && w.contains("reclaim"))
            {
                self.why = Some(why);
            }
            return None;
        }
        // `eviction manager: pod NAME(UID) evicted successfully`, and
        // `"Eviction manager: pod is evicted successfully" pod="ns/name"`;
        // and the pod kubelet's admission preempted, once its containers are
        // stopped: `preemption: pod NAME_NS(UID) evicted successfully`,
        // `"Pod evicted successfully" pod="ns/name"`.
        if lower.contains("evicted successfully") {
            let pod = quoted(text, "pod=").map(str::to_string).or_else(|| {
                let rest = text.split("pod ").nth(1)?;
                Some(rest.split(" evicted").next()?.trim().to_string())
            })?;
            let preemption = lower.trim_start().starts_with("preemption: pod ")
                || t.starts_with("\"Pod evicted successfully\"");
            let reason = if preemption {
                self.reason_of_pod(&pod).unwrap_or_else(|| preempted(None))
            } else {
                self.why
                    .take()
                    .map(|w| format!("evicted: {w}"))
                    .unwrap_or_else(|| {
                        "evicted (the eviction manager's reason is not in the log)".into()
                    })
            };
            return Some(Said::Kill(Box::new(UserKill {
                killer: "kubelet",
                pod: Some(pod),
                reason,
                ..Default::default()
            })));
        }
        // `Killing container "docker://ID" with 30 second grace period`,
        // `"Killing container with a grace period" pod="ns/name" ... containerName="c" ... gracePeriod=30`.
        if lower.contains("killing container") {
            let container = quoted(text, "containerName=")
                .or_else(|| quoted(text, "Killing container "))
                .map(str::to_string);
            let grace = quoted(text, "gracePeriod=")
                .map(str::to_string)
                .or_else(|| {
                    text.split("gracePeriod=")
                        .nth(1)
                        .and_then(|g| g.split_whitespace().next())
                        .map(str::to_string)
                })
                .or_else(|| {
                    text.split(" with ")
                        .nth(1)
                        .and_then(|g| g.split_whitespace().next())
                        .map(str::to_string)
                });
            let pod = quoted(text, "pod=");
            let last = self.why.take();
            let why = pod
                .and_then(|p| self.reason_of_pod(p))
                .or(last)
                .unwrap_or_else(|| {
                    "kubelet stopped the container (its reason is not in the log)".into()
                });
            let grace = grace
                .map(|g| format!(", {g} s to exit before SIGKILL"))
                .unwrap_or_default();
            return Some(Said::Kill(Box::new(UserKill {
                killer: "kubelet",
                pod: pod.map(str::to_string),
                container,
                reason: format!("{why}{grace}"),
                signal: Some("SIGTERM"),
                ..Default::default()
            })));
        }
        None
    }
}

/// The most pods whose reasons kubelet's lines are kept for.
const POD_REASONS: usize = 64;

/// A pod deleted through the API server (kubelet's `SyncLoop DELETE` from
/// source `api`).
const API_DELETE: &str = "the pod was deleted through the API (kubectl delete, a rollout or scale-down, a controller, or the scheduler preempting it)";

/// A pod past its `activeDeadlineSeconds` (kubelet's event, in its log at
/// -v=3: `reason="DeadlineExceeded" message="Pod was active on the node
/// longer than the specified deadline"`).
const DEADLINE: &str =
    "Pod was active on the node longer than the specified deadline (activeDeadlineSeconds)";

/// kubelet's admission preempted the pod, short of `short` when it said.
fn preempted(short: Option<&str>) -> String {
    let mut why = "preempted by kubelet to admit a critical pod".to_string();
    if let Some(s) = short {
        why.push_str(&format!(" (short of {s})"));
    }
    why
}

/// A pod's name from kubelet's forms of it: `ns/name`, `name_ns(uid)`,
/// `name`.
fn pod_name(pod: &str) -> &str {
    let pod = pod.trim().trim_matches('"');
    match pod.rsplit_once('/') {
        Some((_, name)) => name,
        None => pod.split(['_', '(']).next().unwrap_or(pod),
    }
}

/// The pods of kubelet's `SyncLoop DELETE` from the API: `"SyncLoop
/// DELETE" source="api" pods=["ns/a"]` (`pods=[ns/a]` in 1.23), or
/// `SyncLoop (DELETE, "api"): "a_ns(uid), b_ns(uid)"` before 1.21.
fn api_delete(text: &str) -> Option<Vec<&str>> {
    let t = text.trim_start();
    let list = if let Some(rest) = t.strip_prefix("\"SyncLoop DELETE\"") {
        if quoted(rest, "source=") != Some("api") {
            return None;
        }
        rest.split_once("pods=[")?.1.split(']').next()?
    } else {
        let rest = t.strip_prefix("SyncLoop (DELETE, \"api\"): ")?;
        rest.trim().trim_matches('"')
    };
    let pods: Vec<&str> = list
        .split([',', ' '])
        .map(|p| p.trim().trim_matches('"'))
        .filter(|p| !p.is_empty())
        .collect();
    (!pods.is_empty()).then_some(pods)
}

/// The pods kubelet's admission preempts, and what it was short of:
/// `preemption: attempting to evict pods [a_ns(uid) b_ns(uid)], in order
/// to free up resources: X` before 1.21, `"Preempting pod to free up
/// resources" pod="ns/name" ... insufficientResources=X` since (at -v=3).
fn preempting(text: &str) -> Option<(Vec<&str>, Option<&str>)> {
    let t = text.trim_start();
    if let Some(rest) = t.strip_prefix("preemption: attempting to evict pods [") {
        let (list, after) = rest.split_once(']')?;
        let short = after
            .split_once("free up resources: ")
            .map(|(_, r)| r.trim())
            .filter(|r| !r.is_empty());
        let pods = list.split_whitespace().collect::<Vec<_>>();
        return (!pods.is_empty()).then_some((pods, short));
    }
    let rest = t.strip_prefix("\"Preempting pod to free up resources\"")?;
    let pod = quoted(rest, "pod=")?;
    // Printed as pointers (`[0xc00...]`) until 2025: no figure in that.
    let short = rest
        .split_once("insufficientResources=")
        .map(|(_, r)| r.split(" requestingPod=").next().unwrap_or(r).trim())
        .filter(|r| !r.is_empty() && !r.contains("0xc"));
    Some((vec![pod], short))
}

/// A klog line's message: `I0902 15:20:14.747890   18530 file.go:280] msg`
/// -> `msg` (a line without the header is its own message).
pub(super) fn klog_message(text: &str) -> &str {
    let t = text.trim_start();
    let header =
        t.starts_with(['I', 'W', 'E', 'F']) && t[1..].starts_with(|c: char| c.is_ascii_digit());
    match (header, t.split_once("] ")) {
        (true, Some((_, m))) => m,
        _ => t
            .split_once(".go:")
            .and_then(|(_, r)| r.split_once("] "))
            .map_or(t, |(_, m)| m),
    }
}

/// A reason from kubelet's structured line, in its own words: the
/// message it gave the container (`containerMessage="Container c failed
/// liveness probe, will be restarted"`), or a probe's failure
/// (`"Probe failed" probeType="Liveness"` reads `Liveness probe failed`);
/// any other line whole.
fn structured_reason(text: &str) -> std::borrow::Cow<'_, str> {
    if let Some(m) = quoted(text, "containerMessage=") {
        return m.into();
    }
    if text.trim_start().starts_with("\"Probe failed\"")
        && let Some(kind) = quoted(text, "probeType=")
    {
        return format!("{kind} probe failed").into();
    }
    text.into()
}

/// Whether `text` is a klog line from one of kubelet's own source files
/// that say why it stops a pod (`I0708 10:49:49.949088    1091
/// preemption.go:114] ...`; its severity letter may be lost in a paste).
pub(super) fn kubelet_klog(text: &str) -> bool {
    const FILES: &[&str] = &[
        "eviction_manager",
        "kubelet",
        "kubelet_pods",
        "kuberuntime_container",
        "kuberuntime_manager",
        "pod_workers",
        "preemption",
        "prober",
    ];
    let t = text.trim_start();
    let date = t.strip_prefix(['I', 'W', 'E', 'F']).unwrap_or(t);
    let mmdd = date
        .get(..5)
        .is_some_and(|d| d.as_bytes()[..4].iter().all(u8::is_ascii_digit) && d.ends_with(' '));
    if !mmdd {
        return false;
    }
    let Some((head, _)) = t.split_once("] ") else {
        return false;
    };
    let Some((head, line)) = head.rsplit_once(".go:") else {
        return false;
    };
    let file = head.rsplit(' ').next().unwrap_or_default();
    line.bytes().all(|b| b.is_ascii_digit()) && FILES.contains(&file)
}

#[cfg(test)]
mod tests {
    use super::super::tests::kills;
    use super::super::{Killers, recognise, split_program};
    use super::*;

    /// kubelet's lines of tests/fixtures/real-logs (ev-17, ev-18, ev-19) and
    /// systemd's notices (ev-20, ev-21).
    #[test]
    fn kubelet_evictions_and_kills_and_systemds_notices() {
        let ev = kills(&[
            (
                "kubelet",
                "W0902 15:20:12.963510   18530 eviction_manager.go:223] eviction manager: attempting to reclaim memory",
            ),
            (
                "kubelet",
                "I0902 15:20:12.963531   18530 eviction_manager.go:237] eviction manager: must evict pod(s) to reclaim memory",
            ),
            (
                "kubelet",
                "I0902 15:20:14.747890   18530 eviction_manager.go:280] eviction manager: pod guaranteed-cn933_e2e(33a5f9aa) evicted successfully",
            ),
            (
                "kubelet",
                "I0528 16:05:54.802914 2269385 eviction_manager.go:627] \"Eviction manager: pod is evicted successfully\" pod=\"sre/infras-logstash-d484d57fc-rkx95\"",
            ),
            (
                "kubelet",
                "kuberuntime_container.go:561] Killing container \"docker://763de1ad\" with 30 second grace period",
            ),
        ]);
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].pod.as_deref(), Some("guaranteed-cn933_e2e(33a5f9aa)"));
        assert_eq!(ev[0].reason, "evicted: attempting to reclaim memory");
        assert_eq!(
            ev[1].pod.as_deref(),
            Some("sre/infras-logstash-d484d57fc-rkx95")
        );
        assert_eq!(ev[2].container.as_deref(), Some("docker://763de1ad"));
        assert!(
            ev[2].reason.ends_with(", 30 s to exit before SIGKILL"),
            "{}",
            ev[2].reason
        );
        let mut k = Killers::default();
        assert!(matches!(
            k.push("systemd", Some(1), "apache2.service: A process of this unit has been killed by the OOM killer."),
            Some(Said::Unit(unit)) if unit == "apache2.service"
        ));
        assert!(
            k.push("systemd", Some(1), "apache2.service: Consumed 5s CPU time.")
                .is_none()
        );
        assert_eq!(
            split_program("systemd[1]: apache2.service: Started."),
            None,
            "systemd's other lines are no killer's"
        );
    }

    /// kubelet's lines of a pod deleted through the API, from real nodes:
    /// AKS with containerd (github.com/VijayRod/demo, `kubectl delete po
    /// nginx`), and kubelet 1.16 with CRI-O (kubernetes issue 92126).
    #[test]
    fn a_pod_deleted_through_the_api_is_its_kills_reason() {
        let k = kills(&[
            (
                "kubelet",
                r#"I1129 18:20:18.242812    2775 kubelet.go:2449] "SyncLoop DELETE" source="api" pods=["default/nginx"]"#,
            ),
            (
                "kubelet",
                r#"I1129 18:20:18.242970    2775 kuberuntime_container.go:770] "Killing container with a grace period" pod="default/nginx" podUID="5da5612b-9738-493c-af51-a213072997f6" containerName="nginx" containerID="containerd://c65a36d4090569f70b6badb5b6127ad773ebd7e5ce18d3872b8e93ee4fb52cab" gracePeriod=30"#,
            ),
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!(
            k[0].reason,
            format!("{API_DELETE}, 30 s to exit before SIGKILL")
        );
        assert_eq!(k[0].container.as_deref(), Some("nginx"));
        let k = kills(&[
            (
                "kubelet",
                r#"I0615 00:03:23.996993  288702 kubelet.go:1917] SyncLoop (DELETE, "api"): "metrics-server-8f9559cbb-b67qm_kube-system(27ce04fc-48f9-4f39-a805-12f57727d730)""#,
            ),
            (
                "kubelet",
                r#"I0615 00:03:23.998835  288702 kubelet.go:1911] SyncLoop (REMOVE, "api"): "metrics-server-8f9559cbb-b67qm_kube-system(27ce04fc-48f9-4f39-a805-12f57727d730)""#,
            ),
            (
                "kubelet",
                r#"I0615 00:03:23.998905  288702 kubelet_pods.go:1090] Killing unwanted pod "metrics-server-8f9559cbb-b67qm""#,
            ),
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].pod.as_deref(), Some("metrics-server-8f9559cbb-b67qm"));
        assert_eq!(k[0].reason, API_DELETE);
        // A deletion by another source (a static pod's file) is not the API's.
        let mut ks = Killers::default();
        assert!(
            ks.kubelet
                .push(r#""SyncLoop DELETE" source="file" pods=["kube-system/etcd"]"#)
                .is_none()
        );
        assert!(ks.kubelet.pod_why.is_empty());
    }

    /// kubelet's admission preempting a pod: a GKE 1.16 node's line
    /// (kubernetes issue 92906, its `I` lost in the paste), and the forms
    /// kubelet's source prints since 1.21 and before (no public log of
    /// these was found): the preempted pod's kill takes the reason; another
    /// pod's does not. And a pod past its activeDeadlineSeconds (kubelet's
    /// event, at -v=3; no public log found either).
    #[test]
    fn preemption_and_an_active_deadline_are_their_kills_reasons() {
        let k = kills(&[(
            "kubelet",
            r#"0708 10:49:49.949088    1091 preemption.go:114] preemption: pod domain-d9c95557-hs6k6_default(de9427fc-0db2-4bf4-b9f6-344be5233a7b) evicted successfully"   "#,
        )]);
        assert_eq!(k.len(), 1);
        assert_eq!(
            k[0].pod.as_deref(),
            Some("domain-d9c95557-hs6k6_default(de9427fc-0db2-4bf4-b9f6-344be5233a7b)")
        );
        assert_eq!(k[0].reason, "preempted by kubelet to admit a critical pod");
        assert_eq!(
            recognise(
                r#"0708 10:49:49.949088    1091 preemption.go:114] preemption: pod x_default(1) evicted successfully""#
            ),
            Some("kubelet")
        );
        assert_eq!(
            recognise(
                "I0708 10:49:49.949088    1091 controller.go:114] pod x evicted successfully"
            ),
            None,
            "another program's klog line"
        );
        let k = kills(&[
            (
                "kubelet",
                r#""Preempting pod to free up resources" pod="batch/low-1" podUID="5d1" insufficientResources=[{ResourceName:memory Threshold:0}] requestingPod="kube-system/critical""#,
            ),
            (
                "kubelet",
                r#""Killing container with a grace period" pod="batch/other" podUID="6" containerName="c" containerID="containerd://1" gracePeriod=30"#,
            ),
            (
                "kubelet",
                r#""Killing container with a grace period" pod="batch/low-1" podUID="5d1" containerName="a" containerID="containerd://2" gracePeriod=30"#,
            ),
            (
                "kubelet",
                r#""Killing container with a grace period" pod="batch/low-1" podUID="5d1" containerName="b" containerID="containerd://3" gracePeriod=30"#,
            ),
        ]);
        assert_eq!(k.len(), 3);
        assert!(
            k[0].reason
                .starts_with("kubelet stopped the container (its reason is not in the log)"),
            "{}",
            k[0].reason
        );
        for c in &k[1..] {
            assert_eq!(
                c.reason,
                "preempted by kubelet to admit a critical pod (short of [{ResourceName:memory Threshold:0}]), 30 s to exit before SIGKILL"
            );
        }
        let k = kills(&[
            (
                "kubelet",
                "preemption: attempting to evict pods [low-2_batch(77)], in order to free up resources: memory",
            ),
            (
                "kubelet",
                "preemption: pod low-2_batch(77) evicted successfully",
            ),
        ]);
        assert_eq!(
            k[0].reason,
            "preempted by kubelet to admit a critical pod (short of memory)"
        );
        let k = kills(&[
            (
                "kubelet",
                r#""Event occurred" object="batch/job-x" fieldPath="" kind="Pod" apiVersion="v1" type="Normal" reason="DeadlineExceeded" message="Pod was active on the node longer than the specified deadline""#,
            ),
            (
                "kubelet",
                r#""Killing container with a grace period" pod="batch/job-x" podUID="8" containerName="main" containerID="containerd://4" gracePeriod=30"#,
            ),
        ]);
        assert_eq!(
            k[0].reason,
            format!("{DEADLINE}, 30 s to exit before SIGKILL")
        );
        // The runtime's gRPC deadline is not the pod's.
        let mut ks = Killers::default();
        assert!(ks.kubelet.push(r#""StopContainer from runtime service failed" err="rpc error: code = DeadlineExceeded desc = context deadline exceeded" containerID="5""#).is_none());
        assert!(ks.kubelet.pod_why.is_empty());
    }

    /// kubelet's structured lines of a liveness restart, as an AKS node's
    /// journal has them (github.com/VijayRod/demo,
    /// container-storage/logs/k8s-pod.md, `liveness-exec`).
    #[test]
    fn kubelet_s_structured_liveness_restart_gives_its_own_words() {
        let probe = r#"I0516 18:34:49.885197    4052 prober.go:107] "Probe failed" probeType="Liveness" pod="default/liveness-exec" podUID="93e17ecc-ab55-461a-b526-29248d2554ad" containerName="liveness" probeResult="failure" output=<"#;
        let message = r#"I0516 18:34:49.885576    4052 kuberuntime_manager.go:1027] "Message for Container of pod" containerName="liveness" containerStatusID={"Type":"containerd","ID":"05657a9c673d612aedd955a65136ccca36b82ba987831de7844cdc0238f1d707"} pod="default/liveness-exec" containerMessage="Container liveness failed liveness probe, will be restarted""#;
        let killing = r#"I0516 18:34:49.885621    4052 kuberuntime_container.go:808] "Killing container with a grace period" pod="default/liveness-exec" podUID="93e17ecc-ab55-461a-b526-29248d2554ad" containerName="liveness" containerID="containerd://05657a9c673d612aedd955a65136ccca36b82ba987831de7844cdc0238f1d707" gracePeriod=30"#;
        let k = kills(&[
            ("kubelet", probe),
            ("kubelet", message),
            ("kubelet", killing),
        ]);
        assert_eq!(k.len(), 1);
        assert_eq!(
            k[0].reason,
            "Container liveness failed liveness probe, will be restarted, 30 s to exit before SIGKILL"
        );
        assert_eq!(k[0].pod.as_deref(), Some("default/liveness-exec"));
        assert_eq!(k[0].container.as_deref(), Some("liveness"));
        let k = kills(&[("kubelet", probe), ("kubelet", killing)]);
        assert_eq!(
            k[0].reason,
            "Liveness probe failed, 30 s to exit before SIGKILL"
        );
        // OpenShift's kubelet logs as hyperkube (an OCP 4 master's journal,
        // cut by a pager at its edge).
        let (program, pid, text) = split_program(r#"hyperkube[110225]: I1024 06:38:11.949063  110225 kuberuntime_container.go:729] "Killing container with a grace period" pod="openshift-marketplace/cert>"#).unwrap();
        assert_eq!((program, pid), ("hyperkube", Some(110225)));
        let k = kills(&[(program, text)]);
        assert_eq!(k[0].killer, "kubelet");
    }
}
