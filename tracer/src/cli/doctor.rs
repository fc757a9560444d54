//! `tracer doctor`: what this kernel and node support, each with a fix.

use std::{path::Path, process::ExitCode};

use serde::Serialize;

use super::{Format, StoreArg};
use crate::{
    collect::kmsg,
    model::cgroup::CgroupLayout,
    probes::{self, Hook, PROBES, Probes, btf, caps, tracefs},
    store::Store,
    util::term,
};

/// Options of `tracer doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Also check the CUDA libraries of this process: which probed functions they have.
    #[arg(long)]
    pub pid: Option<u32>,
    /// NVML library to check instead of the driver's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<std::path::PathBuf>,
}

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Works.
    Ok,
    /// Missing, but recording works without it.
    Warn,
    /// Recording cannot work.
    Fail,
    /// Facts, no judgement.
    Info,
}

/// One row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about it.
    pub fix: Option<String>,
}

fn check(
    name: impl Into<String>,
    status: Status,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
        fix: fix.map(String::from),
    }
}

/// Runs every check.
pub fn checks(store: &Path, nvml_lib: Option<&Path>) -> Vec<Check> {
    let mut out = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let privileged = caps::can_trace(caps::effective());
    out.push(match &privileged {
        Ok(()) => check(
            "privilege",
            Status::Ok,
            format!("uid {uid}, can load eBPF"),
            None,
        ),
        Err(missing) => check(
            "privilege",
            Status::Fail,
            format!("uid {uid}, missing {missing}"),
            Some("run tracer as root (sudo)"),
        ),
    });
    out.push(if caps::can_protect_from_oom(caps::effective()) {
        check("OOM protection", Status::Ok, "the recorder sets its oom_score_adj to -1000", None)
    } else {
        check(
            "OOM protection",
            Status::Warn,
            "no CAP_SYS_RESOURCE: the recorder cannot set its oom_score_adj to -1000, so a global OOM could pick it",
            Some("run with CAP_SYS_RESOURCE (a root service outside a restricted container has it)"),
        )
    });
    let release = crate::util::sys::kernel_release();
    out.push(check("kernel", Status::Info, release.trim(), None));

    match btf::KernelBtf::open(Path::new(btf::VMLINUX_BTF)) {
        Ok(b) => {
            let tgid = b.member_offset("task_struct", "tgid");
            let items = b.enum_values("vm_event_item");
            let detail = format!(
                "{}; task_struct.tgid {}; enum vm_event_item {}",
                btf::VMLINUX_BTF,
                tgid.as_ref()
                    .map(|o| format!("at {o}"))
                    .unwrap_or_else(|e| super::chain(e)),
                items
                    .as_ref()
                    .map(|m| format!("({} items)", m.len()))
                    .unwrap_or_else(|e| super::chain(e))
            );
            let ok = tgid.is_ok() && items.is_ok();
            out.push(check(
                "BTF",
                if ok { Status::Ok } else { Status::Fail },
                detail,
                (!ok).then_some("use a kernel built with CONFIG_DEBUG_INFO_BTF=y"),
            ));
        }
        Err(e) => out.push(check(
            "BTF",
            Status::Fail,
            super::chain(&e),
            Some("use a kernel built with CONFIG_DEBUG_INFO_BTF=y"),
        )),
    }

    let tfs = tracefs::find();
    out.push(match &tfs {
        Some(p) => check(
            "tracefs",
            Status::Ok,
            format!("mounted at {}", p.display()),
            None,
        ),
        None => match tracefs::mount_point() {
            Some(p) => check(
                "tracefs",
                Status::Warn,
                format!(
                    "mounted at {} but not readable by this user (uid {})",
                    p.display(),
                    crate::util::fsafe::euid()
                ),
                Some("run tracer as root"),
            ),
            None => check(
                "tracefs",
                Status::Warn,
                "not mounted; `tracer record` mounts it at /sys/kernel/tracing",
                Some("mount -t tracefs nodev /sys/kernel/tracing"),
            ),
        },
    });

    // The real test: load the object and attach every probe, then detach.
    fn is_growth(spec: &crate::probes::ProbeSpec) -> bool {
        crate::probes::growth::GROWTH_PROBES
            .iter()
            .any(|g| g.program == spec.program)
    }
    let loaded = if privileged.is_ok() {
        let heap = crate::probes::heap::config(
            crate::probes::heap::DEFAULT_SAMPLE_BYTES,
            crate::probes::heap::DEFAULT_ALWAYS_BYTES,
        );
        let growth = crate::probes::growth::GrowthOptions {
            mode: crate::probes::growth::GrowthMode::Limited,
            sample_bytes: crate::probes::growth::DEFAULT_SAMPLE_BYTES,
            reserve_bytes: crate::probes::growth::DEFAULT_RESERVE_BYTES,
        };
        Some(
            Probes::load_with(crate::probes::DATA_RING_BYTES, &heap, &growth).and_then(|mut p| {
                let mut statuses = p.attach()?;
                // Growth attribution is optional: recording works without it.
                match p.attach_growth(false) {
                    Ok(more) => statuses.extend(more),
                    Err(e) => statuses.push(crate::probes::ProbeStatus {
                        spec: crate::probes::growth::GROWTH_PROBES[0],
                        error: Some(super::chain(&e)),
                    }),
                }
                Ok((p, statuses))
            }),
        )
    } else {
        None
    };
    match loaded {
        Some(Ok((mut probes, statuses))) => {
            out.push(check(
                "ring buffer",
                Status::Ok,
                "critical and data rings created",
                None,
            ));
            out.extend(uprobe_program_checks(&mut probes));
            for s in statuses {
                let name = s.spec.hook.to_string();
                out.push(match s.error {
                    None => check(
                        name,
                        Status::Ok,
                        format!("attached ({})", s.spec.purpose),
                        None,
                    ),
                    Some(e) => check(
                        name,
                        if s.spec.required && !is_growth(&s.spec) {
                            Status::Fail
                        } else {
                            Status::Warn
                        },
                        format!("{e}: no {}", s.spec.purpose),
                        None,
                    ),
                });
            }
            for f in &probes.notes.missing_fields {
                out.push(check(
                    format!("field {f}"),
                    Status::Warn,
                    "not on this kernel; reports say it is unknown",
                    None,
                ));
            }
            drop(probes);
        }
        Some(Err(e)) => {
            let fix = match &e {
                probes::ProbeError::Tracefs(_) => {
                    Some("mount -t tracefs nodev /sys/kernel/tracing")
                }
                _ => None,
            };
            out.push(check(
                "eBPF load and attach",
                Status::Fail,
                format!("{e:#}"),
                fix,
            ));
        }
        None => {
            for p in PROBES {
                let present = match (p.hook, &tfs) {
                    (Hook::TracePoint { category, name }, Some(root)) => {
                        root.join("events").join(category).join(name).exists()
                    }
                    _ => false,
                };
                out.push(check(
                    p.hook.to_string(),
                    Status::Info,
                    if present {
                        "present (not attached: no privilege)"
                    } else {
                        "not checked (no privilege)"
                    },
                    None,
                ));
            }
        }
    }

    let uprobe = crate::probes::caps::has_event_source("uprobe");
    out.push(check(
        "uprobes",
        if uprobe { Status::Ok } else { Status::Warn },
        if uprobe {
            "available (CUDA and libc probes)"
        } else {
            "no uprobe PMU"
        },
        (!uprobe).then_some("use a kernel with CONFIG_UPROBE_EVENTS=y"),
    ));
    let kprobe = crate::probes::caps::has_event_source("kprobe");
    out.push(check(
        "kprobes (optional)",
        if kprobe { Status::Ok } else { Status::Info },
        if kprobe {
            "available"
        } else {
            "not available; tracer uses none"
        },
        None,
    ));
    out.push(check(
        "fentry/fexit (optional)",
        Status::Info,
        "not used: tracer relies on tracepoints and uprobes only",
        None,
    ));

    let layout = CgroupLayout::detect();
    let where_ = layout
        .memcg_dir("/")
        .map(|p| format!("memory controller at {}", p.display()))
        .unwrap_or_else(|| "no memory controller mounted".into());
    let has_memory = layout.memcg_dir("/").is_some();
    out.push(check(
        "cgroups",
        if has_memory { Status::Ok } else { Status::Warn },
        format!("{}; {where_}", layout.kind()),
        (!has_memory)
            .then_some("mount the memory controller (cgroup v2 with +memory, or v1 memory)"),
    ));
    out.push(match kmsg::open() {
        Ok(_) => check(
            "kernel log",
            Status::Ok,
            format!("{} readable: OOM reports are joined", kmsg::KMSG),
            None,
        ),
        Err(e) => check(
            "kernel log",
            Status::Warn,
            super::chain(&e),
            Some("run as root, or set kernel.dmesg_restrict=0"),
        ),
    });
    out.push(nvml_check(nvml_lib));
    out.push(journal_check());
    out.push(store_check(store));
    out
}

/// Whether `record` can follow this boot's systemd journal for the reasons
/// userspace OOM killers log (see `collect::journal`).
fn journal_check() -> Check {
    let what =
        "the reasons systemd-oomd, earlyoom, nohang and kubelet log are joined to their SIGKILLs";
    let out = std::process::Command::new("journalctl")
        .args(["--boot", "--lines=1", "--output=cat", "--no-pager"])
        .stdin(std::process::Stdio::null())
        .output();
    // With no journal files at all it says nothing and succeeds.
    match out {
        Ok(o) if o.status.success() && !o.stdout.is_empty() => check(
            "journal",
            Status::Ok,
            format!("this boot's journal is readable: {what}"),
            None,
        ),
        Ok(o) => {
            let said = String::from_utf8_lossy(&o.stderr);
            let said = said.lines().next().unwrap_or("").trim();
            check(
                "journal",
                Status::Info,
                format!(
                    "this boot's journal cannot be read (journalctl: {}): kills by userspace OOM killers are recorded without their reasons",
                    if said.is_empty() {
                        "no entry of this boot"
                    } else {
                        said
                    }
                ),
                None,
            )
        }
        Err(e) => check(
            "journal",
            Status::Info,
            format!(
                "no journalctl ({e}): kills by userspace OOM killers are recorded without their reasons"
            ),
            None,
        ),
    }
}

/// Whether this kernel takes the uprobe families' programs (loaded, not
/// attached): each needs helpers newer than the kill capture does.
fn uprobe_program_checks(probes: &mut Probes) -> Vec<Check> {
    use crate::probes::uprobe::{CUDA, HEAP};
    let rows: [(&str, &str, Result<(), probes::ProbeError>); 3] = [
        (
            "CUDA tracing",
            "record --cuda, attach --pid",
            probes.load_family(&CUDA, false),
        ),
        (
            "heap tracing",
            "attach --host, record --host-cgroup",
            probes.load_family(&HEAP, false),
        ),
        (
            "USDT probes",
            "PyTorch's caching allocator probes",
            probes.load_usdt(),
        ),
    ];
    rows.into_iter()
        .map(|(name, what, r)| match r {
            Ok(()) => check(name, Status::Ok, format!("programs load ({what})"), None),
            Err(e) => check(
                name,
                Status::Warn,
                format!("{e}: not available on this kernel ({what})"),
                Some("a kernel of 5.15 or newer has every helper tracer uses"),
            ),
        })
        .collect()
}

/// The CUDA libraries of `pid` and the probed functions each lacks.
fn cuda_checks(pid: u32) -> Vec<Check> {
    use crate::probes::uprobe::{CUDA, libraries_of};
    let name = format!("CUDA in pid {pid}");
    match libraries_of(&CUDA, pid) {
        Err(e) => vec![check(
            name,
            Status::Fail,
            format!("cannot read /proc/{pid}/maps: {e}"),
            Some("check the pid"),
        )],
        Ok(libs) if libs.is_empty() => vec![check(
            name,
            Status::Warn,
            "no CUDA library loaded (no libcudart or libcuda mapped, no cudart in the executable)",
            Some("tracer attach --wait traces it once one is loaded"),
        )],
        Ok(libs) => {
            let mut rows = vec![versions_check(pid, &libs)];
            rows.extend(libs.into_iter().map(|l| {
                let what = if l.executable {
                    " (cudart linked into the executable)"
                } else {
                    ""
                };
                let missing = if l.missing.is_empty() {
                    String::new()
                } else {
                    format!("; not exported, so not traced: {}", l.missing.join(", "))
                };
                check(
                    name.clone(),
                    Status::Ok,
                    format!(
                        "{}{what}: {} probed functions{missing}",
                        l.path,
                        l.functions.len()
                    ),
                    None,
                )
            }));
            rows
        }
    }
}

/// The caching allocator probes (PyTorch's USDT) in the files of `pid`,
/// with their semaphores as they are now (non-zero: a tracer has them on).
fn allocator_checks(pid: u32) -> Vec<Check> {
    use crate::probes::{uprobe::candidates, usdt};
    let name = format!("allocator probes in pid {pid}");
    let Ok(files) = candidates(pid, usdt::is_usdt_library_name) else {
        return Vec::new(); // cuda_checks says why the process cannot be read
    };
    let mut rows = Vec::new();
    for f in files.iter().filter_map(usdt::inspect) {
        let names = f.probe_names();
        let semaphores: Vec<String> = f
            .semaphores_in(pid)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, addr)| {
                addr.and_then(|a| usdt::read_semaphore(pid, a).ok())
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "?".into())
            })
            .collect();
        let refused = f
            .refused
            .iter()
            .map(|(p, why)| format!("; {p} not attachable: {why}"))
            .collect::<String>();
        rows.push(check(
            name.clone(),
            if f.sites.is_empty() {
                Status::Warn
            } else {
                Status::Ok
            },
            format!(
                "{}: {} sites ({}), semaphores now [{}]{refused}",
                crate::util::term::escape(&f.file.path),
                f.sites.len(),
                names.join(", "),
                semaphores.join(", ")
            ),
            None,
        ));
    }
    rows
}

/// The driver and runtime releases `pid` loaded, beside the node's kernel
/// module: a process that loaded a driver library of another release than
/// the module (a container image that ships its own libcuda) fails in
/// cuInit.
fn versions_check(pid: u32, libs: &[crate::probes::uprobe::Library]) -> Check {
    use crate::probes::cuda::library_release;
    let mut parts = Vec::new();
    for l in libs {
        let base = l.path.rsplit('/').next().unwrap_or(&l.path);
        let layer = if l.executable {
            "runtime (linked into the executable)"
        } else if base.starts_with("libcudart") {
            "runtime"
        } else {
            "driver"
        };
        let release = library_release(&l.host_path).unwrap_or_else(|| "release not known".into());
        parts.push(format!("{layer} {release} ({base})"));
    }
    let module = crate::nvml::loaded_module_release();
    parts.push(match module {
        Some(m) => format!("kernel module {m}"),
        None => "kernel module not loaded".into(),
    });
    check(
        format!("CUDA versions in pid {pid}"),
        Status::Info,
        parts.join(", "),
        None,
    )
}

fn nvml_check(lib: Option<&Path>) -> Check {
    match crate::nvml::open(lib) {
        Ok(n) => check("NVML", Status::Ok, crate::nvml::describe(&n), None),
        // A node with the driver's libraries but not its module is broken:
        // its GPUs are invisible to every job.
        Err(e) if e.is_broken_driver() => check("NVML", Status::Warn, super::chain(&e), None),
        Err(e) => check("NVML", Status::Info, super::chain(&e), None),
    }
}

fn store_check(path: &Path) -> Check {
    let name = "store";
    if path.exists() {
        return match Store::open_ro(path) {
            Ok(s) => {
                let size = s
                    .size_bytes()
                    .map(crate::util::units::bytes)
                    .unwrap_or_default();
                let writable = std::fs::OpenOptions::new().append(true).open(path).is_ok();
                if writable {
                    check(
                        name,
                        Status::Ok,
                        format!("{} ({size}), writable", path.display()),
                        None,
                    )
                } else {
                    check(
                        name,
                        Status::Fail,
                        format!("{} is not writable", path.display()),
                        Some("fix its permissions or pass --store"),
                    )
                }
            }
            Err(e) => check(
                name,
                Status::Fail,
                super::chain(&e),
                Some("pass --store with a new path"),
            ),
        };
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let probe = dir.join(format!(".tracer-doctor-{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&probe, b""))
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    if ok {
        check(
            name,
            Status::Ok,
            format!("{} will be created", path.display()),
            None,
        )
    } else {
        check(
            name,
            Status::Fail,
            format!("cannot create files in {}", dir.display()),
            Some("pass --store with a writable path"),
        )
    }
}

/// Runs `doctor`; exits 1 when recording cannot work.
pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut all = checks(&args.store.path, args.nvml_lib.as_deref());
    if let Some(pid) = args.pid {
        all.extend(cuda_checks(pid));
        all.extend(allocator_checks(pid));
    }
    let failed = all.iter().any(|c| c.status == Status::Fail);
    use std::fmt::Write as _;
    let mut text = String::new();
    match args.format {
        Format::Json => text = serde_json::to_string_pretty(&all)? + "\n",
        Format::Text => {
            let w = all.iter().map(|c| c.name.len()).max().unwrap_or(10);
            for c in &all {
                let st = match c.status {
                    Status::Ok => "ok",
                    Status::Warn => "WARN",
                    Status::Fail => "FAIL",
                    Status::Info => "info",
                };
                let _ = writeln!(text, "{:<w$}  {st:<4}  {}", c.name, term::escape(&c.detail));
                if let Some(f) = &c.fix {
                    let _ = writeln!(text, "{:<w$}        fix: {}", "", term::escape(f));
                }
            }
            let _ = writeln!(
                text,
                "\n{}",
                if failed {
                    "recording cannot work here: see FAIL above"
                } else {
                    "recording works here"
                }
            );
        }
    }
    crate::util::out::stdout(&text)?;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
