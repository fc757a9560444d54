//! USDT probes (SystemTap SDT, `<sys/sdt.h>`, PyTorch's
//! `c10/util/static_tracepoint.h`): the `.note.stapsdt` notes of an ELF
//! file, each probe's argument specs, and its semaphore.
//!
//! aya has no USDT support, and the notes are a small fixed format, so
//! this is written here. Each note (type 3, owner `stapsdt`) carries the
//! probe's address (a `nop` in the code), the link-time address of the
//! `.stapsdt.base` section (to correct for prelinking; PyTorch writes 0 and
//! has no such section), the address of the probe's semaphore (a `u16` the
//! code tests before it computes the arguments; 0 = none), then provider,
//! name and the argument specs as NUL-terminated strings. On x86_64 an
//! argument spec is `SIZE@LOCATION`: SIZE is the byte width, negative for
//! signed, and LOCATION one of `%reg`, `OFFSET(%reg)` and `$CONSTANT`
//! (GNU as operands).

use std::{
    fs, io,
    os::{
        fd::AsFd as _,
        unix::fs::{FileExt as _, MetadataExt as _},
    },
};

use aya::programs::UProbe;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use tracer_common::{
    maps, programs,
    usdt::{self, ArgKind, UsdtArg, UsdtSpec},
};

use super::{ProbeError, Probes, uprobe::Candidate};

/// A note or argument spec that cannot be used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsdtError {
    /// The note section is cut short or malformed.
    #[error("malformed .note.stapsdt at byte {0}")]
    Malformed(usize),
    /// An argument spec of a form tracer does not read.
    #[error("argument spec {0:?} is not supported (only %reg, OFFSET(%reg) and $CONSTANT)")]
    Unsupported(String),
    /// More arguments than the programs read.
    #[error("{0} arguments; at most {max} are read", max = tracer_common::usdt::MAX_ARGS)]
    TooManyArgs(usize),
    /// The file is not an ELF file tracer can read.
    #[error("not a readable ELF file: {0}")]
    Elf(String),
}

/// One probe as its note gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Address of the probe's `nop` (link-time).
    pub pc: u64,
    /// Link-time address of `.stapsdt.base` (0: not recorded).
    pub base: u64,
    /// Address of the semaphore (0: none).
    pub semaphore: u64,
    /// Provider (`pytorch`).
    pub provider: String,
    /// Probe name (`malloc`).
    pub name: String,
    /// Argument specs, space separated (`-8@%rdi 8@16(%rsp)`).
    pub args: String,
}

/// The owner name and type of a SystemTap SDT note.
const OWNER: &[u8] = b"stapsdt";
const NT_STAPSDT: u32 = 3;

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// Parses the bytes of a `.note.stapsdt` section (64-bit, little endian).
/// Notes of other owners or types are skipped.
pub fn parse_notes(data: &[u8]) -> Result<Vec<Note>, UsdtError> {
    let align = |n: usize| n.div_ceil(4) * 4;
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let bad = UsdtError::Malformed(at);
        let namesz = u32_at(data, at).ok_or(bad.clone())? as usize;
        let descsz = u32_at(data, at + 4).ok_or(bad.clone())? as usize;
        let ntype = u32_at(data, at + 8).ok_or(bad.clone())?;
        let name_at = at + 12;
        let desc_at = name_at + align(namesz);
        let next = desc_at + align(descsz);
        let owner = data.get(name_at..name_at + namesz).ok_or(bad.clone())?;
        let desc = data.get(desc_at..desc_at + descsz).ok_or(bad.clone())?;
        at = next;
        if ntype != NT_STAPSDT || owner.strip_suffix(b"\0").unwrap_or(owner) != OWNER {
            continue;
        }
        let (Some(pc), Some(base), Some(semaphore)) =
            (u64_at(desc, 0), u64_at(desc, 8), u64_at(desc, 16))
        else {
            return Err(bad);
        };
        let mut strings = desc.get(24..).ok_or(bad.clone())?.split(|b| *b == 0);
        let mut next_str = || -> Result<String, UsdtError> {
            let s = strings.next().ok_or(bad.clone())?;
            String::from_utf8(s.to_vec()).map_err(|_| bad.clone())
        };
        let provider = next_str()?;
        let name = next_str()?;
        // A probe without arguments may end right after its name.
        let args = next_str().unwrap_or_default();
        out.push(Note {
            pc,
            base,
            semaphore,
            provider,
            name,
            args,
        });
    }
    Ok(out)
}

/// The byte offset in `struct pt_regs` (x86_64) of a register named as
/// GNU as writes it (any width: `%rax`, `%eax`, `%ax`, `%al`).
pub fn pt_regs_offset(reg: &str) -> Option<u32> {
    // (64-bit name, 32-bit, 16-bit, low 8-bit, offset)
    const REGS: [(&str, &str, &str, &str, u32); 17] = [
        ("r15", "r15d", "r15w", "r15b", 0),
        ("r14", "r14d", "r14w", "r14b", 8),
        ("r13", "r13d", "r13w", "r13b", 16),
        ("r12", "r12d", "r12w", "r12b", 24),
        ("rbp", "ebp", "bp", "bpl", 32),
        ("rbx", "ebx", "bx", "bl", 40),
        ("r11", "r11d", "r11w", "r11b", 48),
        ("r10", "r10d", "r10w", "r10b", 56),
        ("r9", "r9d", "r9w", "r9b", 64),
        ("r8", "r8d", "r8w", "r8b", 72),
        ("rax", "eax", "ax", "al", 80),
        ("rcx", "ecx", "cx", "cl", 88),
        ("rdx", "edx", "dx", "dl", 96),
        ("rsi", "esi", "si", "sil", 104),
        ("rdi", "edi", "di", "dil", 112),
        ("rip", "eip", "ip", "", 128),
        ("rsp", "esp", "sp", "spl", 152),
    ];
    let r = reg.strip_prefix('%')?;
    REGS.iter()
        .find(|(q, d, w, b, _)| r == *q || r == *d || r == *w || (!b.is_empty() && r == *b))
        .map(|(.., off)| *off)
}

/// Resolves a symbol of the file a probe is in to its address.
pub type Symbols<'a> = &'a dyn Fn(&str) -> Option<u64>;

/// Parses one argument spec (`-8@%rdi`, `8@-56(%rbp)`, `-4@$5`).
pub fn parse_arg(spec: &str) -> Result<UsdtArg, UsdtError> {
    parse_arg_at(spec, None)
}

/// As [`parse_arg`]; with the probe's address and the file's symbols, a
/// global read rip-relative (`-1@current_device(%rip)`, `8@table+16(%rip)`,
/// as gcc writes a global operand) is read at the probe's saved `rip`
/// (the probe's own address when it fires) plus the symbol's distance.
pub fn parse_arg_at(spec: &str, at: Option<(u64, Symbols)>) -> Result<UsdtArg, UsdtError> {
    let unsupported = || UsdtError::Unsupported(spec.to_string());
    let (size, loc) = spec.split_once('@').ok_or_else(unsupported)?;
    let size: i32 = size.parse().map_err(|_| unsupported())?;
    if !matches!(size.unsigned_abs(), 1 | 2 | 4 | 8) {
        return Err(unsupported());
    }
    let mut arg = UsdtArg {
        size: size.unsigned_abs() as u8,
        signed: u8::from(size < 0),
        ..Default::default()
    };
    if let Some(c) = loc.strip_prefix('$') {
        arg.kind = ArgKind::Const as u8;
        arg.value = parse_int(c).ok_or_else(unsupported)?;
    } else if loc.starts_with('%') {
        arg.kind = ArgKind::Reg as u8;
        arg.reg_off = pt_regs_offset(loc).ok_or_else(unsupported)?;
    } else if let Some((off, rest)) = loc.split_once('(') {
        let reg = rest.strip_suffix(')').ok_or_else(unsupported)?;
        // `(%base,%index,scale)` is not read.
        if reg.contains(',') {
            return Err(unsupported());
        }
        if reg == "%rip" {
            let (pc, symbols) = at.ok_or_else(unsupported)?;
            let (sym, add) = match off.find(['+', '-']) {
                Some(i) => (
                    &off[..i],
                    parse_int(off[i..].trim_start_matches('+')).ok_or_else(unsupported)?,
                ),
                None => (off, 0),
            };
            if sym.is_empty() || sym.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
                return Err(unsupported());
            }
            let addr = symbols(sym).ok_or_else(unsupported)?;
            arg.kind = ArgKind::Mem as u8;
            arg.reg_off = pt_regs_offset("%rip").ok_or_else(unsupported)?;
            arg.value = (addr.wrapping_add(add as u64)).wrapping_sub(pc) as i64;
            return Ok(arg);
        }
        arg.kind = ArgKind::Mem as u8;
        arg.reg_off = pt_regs_offset(reg).ok_or_else(unsupported)?;
        arg.value = if off.is_empty() {
            0
        } else {
            parse_int(off).ok_or_else(unsupported)?
        };
    } else {
        return Err(unsupported());
    }
    Ok(arg)
}

fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = match digits.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None => digits.parse().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// Parses a note's argument list.
pub fn parse_args(args: &str) -> Result<Vec<UsdtArg>, UsdtError> {
    parse_args_at(args, None)
}

/// As [`parse_args`], with the probe's address and the file's symbols.
pub fn parse_args_at(args: &str, at: Option<(u64, Symbols)>) -> Result<Vec<UsdtArg>, UsdtError> {
    let out: Vec<UsdtArg> = args
        .split_whitespace()
        .map(|a| parse_arg_at(a, at))
        .collect::<Result<_, _>>()?;
    if out.len() > tracer_common::usdt::MAX_ARGS {
        return Err(UsdtError::TooManyArgs(out.len()));
    }
    Ok(out)
}

/// One probe of a file, ready to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The note, as found.
    pub note: Note,
    /// File offset of the probe's instruction (what a uprobe takes).
    pub offset: u64,
    /// File offset of its semaphore (`None`: the probe has none).
    pub semaphore_offset: Option<u64>,
    /// Its arguments (`Err`: a spec tracer cannot read; the probe is not
    /// attached and says why).
    pub args: Result<Vec<UsdtArg>, UsdtError>,
}

/// The USDT probes of an ELF file: each note's addresses corrected for
/// prelinking (`.stapsdt.base`) and turned into file offsets.
pub fn probes_in<'a, R: object::ReadRef<'a>>(data: R) -> Result<Vec<Probe>, UsdtError> {
    let elf = |e: object::Error| UsdtError::Elf(e.to_string());
    let obj = object::File::parse(data).map_err(elf)?;
    let Some(section) = obj.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let notes = parse_notes(section.data().map_err(elf)?)?;
    let base = obj.section_by_name(".stapsdt.base").map(|s| s.address());
    let symbols = |name: &str| {
        use object::ObjectSymbol as _;
        obj.symbols()
            .chain(obj.dynamic_symbols())
            .find(|s| s.name() == Ok(name) && s.address() != 0)
            .map(|s| s.address())
    };
    let to_offset = |vaddr: u64| {
        obj.segments().find_map(|s| {
            let (off, size) = s.file_range();
            (vaddr >= s.address() && vaddr < s.address() + size)
                .then(|| off + (vaddr - s.address()))
        })
    };
    Ok(notes
        .into_iter()
        .filter_map(|note| {
            // Prelinking moves the code; the note keeps link-time addresses.
            let shift = match base {
                Some(actual) if note.base != 0 => actual.wrapping_sub(note.base),
                _ => 0,
            };
            let pc = note.pc.wrapping_add(shift);
            let offset = to_offset(pc)?;
            let semaphore_offset =
                (note.semaphore != 0).then(|| to_offset(note.semaphore.wrapping_add(shift)));
            Some(Probe {
                offset,
                semaphore_offset: semaphore_offset.flatten(),
                args: parse_args_at(&note.args, Some((pc, &symbols))),
                note,
            })
        })
        .collect())
}

/// The id of a probe tracer knows ([`usdt::PROBES`]).
pub fn known(provider: &str, name: &str) -> Option<u32> {
    usdt::PROBES
        .iter()
        .find(|(_, p, n)| *p == provider && *n == name)
        .map(|(id, ..)| *id)
}

/// `provider:name` of a known probe id.
pub fn probe_name(id: u32) -> String {
    usdt::PROBES
        .iter()
        .find(|(i, ..)| *i == id)
        .map(|(_, p, n)| format!("{p}:{n}"))
        .unwrap_or_else(|| format!("probe {id}"))
}

/// Files (besides the executable) that may carry probes tracer knows:
/// PyTorch's CUDA library, `libc10_cuda.so` (torch/lib in the wheel).
pub fn is_usdt_library_name(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .unwrap_or(path)
        .starts_with("libc10_cuda")
}

/// One probe site of a file, ready to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// Known probe id.
    pub probe: u32,
    /// File offset of the probe's instruction.
    pub offset: u64,
    /// File offset of its semaphore.
    pub semaphore: Option<u64>,
    /// How its arguments are read.
    pub spec: UsdtSpec,
}

/// A file of a process that has probes tracer knows.
#[derive(Clone, Debug)]
pub struct UsdtFile {
    /// The file.
    pub file: Candidate,
    /// Its sites.
    pub sites: Vec<Site>,
    /// Known probes whose argument specs cannot be read (not attached).
    pub refused: Vec<(String, UsdtError)>,
}

/// The known probes of one file (`None`: it has none).
pub fn inspect(c: &Candidate) -> Option<UsdtFile> {
    // The file opened is the one stat'ed (by dev and inode). Only the parts parsed are read (headers, the notes, the symbols a
    // spec names): an executable can be as large as its owner makes it.
    let file = fs::File::open(&c.host_path).ok()?;
    if file.metadata().ok().map(|m| (m.dev(), m.ino())) != Some(c.id) {
        return None;
    }
    let data = object::ReadCache::new(file);
    let mut out = UsdtFile {
        file: c.clone(),
        sites: Vec::new(),
        refused: Vec::new(),
    };
    for p in probes_in(&data).ok()? {
        let Some(id) = known(&p.note.provider, &p.note.name) else {
            continue;
        };
        match p.args {
            Ok(args) => {
                let mut spec = UsdtSpec {
                    probe: id,
                    nargs: args.len() as u32,
                    ..Default::default()
                };
                spec.args[..args.len()].copy_from_slice(&args);
                out.sites.push(Site {
                    probe: id,
                    offset: p.offset,
                    semaphore: p.semaphore_offset,
                    spec,
                });
            }
            Err(e) => out.refused.push((probe_name(id), e)),
        }
    }
    (!out.sites.is_empty() || !out.refused.is_empty()).then_some(out)
}

impl UsdtFile {
    /// `provider:name` of each probe it has, in id order, once each.
    pub fn probe_names(&self) -> Vec<String> {
        let mut ids: Vec<u32> = self.sites.iter().map(|s| s.probe).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(probe_name).collect()
    }

    /// The file offsets of its semaphores, once each.
    fn semaphore_offsets(&self) -> std::collections::BTreeSet<u64> {
        self.sites.iter().filter_map(|s| s.semaphore).collect()
    }

    /// Where its semaphores are in process `pid`: (file offset, address),
    /// the address `None` where no mapping of the file covers it. The
    /// process's maps are read once.
    pub fn semaphores_in(&self, pid: u32) -> io::Result<Vec<(u64, Option<u64>)>> {
        let offsets = self.semaphore_offsets();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
        Ok(offsets
            .into_iter()
            .map(|off| (off, address_in(&maps, &self.file, off)))
            .collect())
    }

    /// How many semaphores its sites have (each counted by the kernel in
    /// every process the probes are installed in, while attached).
    pub fn semaphores(&self) -> usize {
        self.semaphore_offsets().len()
    }
}

/// The address of byte `offset` of `file` in a process whose memory maps
/// are `maps` (the mapping of that file, by path and inode, that covers
/// the offset).
fn address_in(maps: &str, file: &Candidate, offset: u64) -> Option<u64> {
    maps.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (range, _perms, off, _dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        if inode.parse::<u64>().ok()? != file.id.1
            || super::uprobe::map_path(line)?.trim_end_matches(" (deleted)") != file.path
        {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        let off = u64::from_str_radix(off, 16).ok()?;
        (offset >= off && offset - off < end - start).then(|| start + (offset - off))
    })
}

/// The `u16` semaphore at `addr` in `pid`, as it is now.
pub fn read_semaphore(pid: u32, addr: u64) -> io::Result<u16> {
    let mem = fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut v = [0u8; 2];
    mem.read_exact_at(&mut v, addr)?;
    Ok(u16::from_ne_bytes(v))
}

/// The probes of one file attached.
#[derive(Debug)]
pub struct UsdtAttachment {
    /// The file.
    pub file: UsdtFile,
    links: Vec<super::refctr::CountedLink>,
    /// Sites that failed to attach, with why.
    pub failed: Vec<(String, String)>,
}

impl UsdtAttachment {
    /// Sites attached.
    pub fn attached(&self) -> usize {
        self.links.len()
    }
}

impl Probes {
    /// Loads the USDT program (once).
    pub fn load_usdt(&mut self) -> Result<(), ProbeError> {
        self.load_uprobe(programs::USDT_PROBE)
    }

    /// Attaches the USDT program at every site of `file`, for process
    /// `pid` only or, with `None`, every process. Each site's spec goes to
    /// a slot of `USDT_SPECS` first; the slot is the attach cookie.
    pub fn attach_usdt(
        &mut self,
        file: &UsdtFile,
        pid: Option<u32>,
    ) -> Result<UsdtAttachment, ProbeError> {
        let mut att = UsdtAttachment {
            file: file.clone(),
            links: Vec::new(),
            failed: Vec::new(),
        };
        for site in &file.sites {
            if self.usdt_slots >= usdt::MAX_SPECS {
                att.failed
                    .push((probe_name(site.probe), "no free USDT spec slot".into()));
                continue;
            }
            let slot = self.usdt_slots;
            let name = maps::USDT_SPECS;
            let map = self
                .ebpf
                .map_mut(name)
                .ok_or(ProbeError::Missing { what: "map", name })?;
            let mut specs: aya::maps::Array<_, UsdtSpec> = aya::maps::Array::try_from(map)
                .map_err(|source| ProbeError::Map { name, source })?;
            specs
                .set(slot, site.spec, 0)
                .map_err(|source| ProbeError::Map { name, source })?;
            self.usdt_slots += 1;
            let prog: &mut UProbe = self
                .program(programs::USDT_PROBE)
                .map_err(|e| e.into_probe_error(programs::USDT_PROBE))?;
            let fd = prog.fd().map_err(|e| {
                super::Unavailable::Program(e).into_probe_error(programs::USDT_PROBE)
            })?;
            // The kernel counts the site's semaphore while it is attached.
            match super::refctr::attach(
                fd.as_fd(),
                &file.file.host_path,
                site.offset,
                site.semaphore,
                pid,
                u64::from(slot),
            ) {
                Ok(l) => att.links.push(l),
                Err(e) => att.failed.push((probe_name(site.probe), e.to_string())),
            }
        }
        Ok(att)
    }

    /// Removes attachments' probes, together ([`super::drop_together`]);
    /// the kernel lowers their semaphores.
    pub fn detach_usdt(&mut self, atts: Vec<UsdtAttachment>) {
        super::drop_together(atts.into_iter().flat_map(|a| a.links).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `.note.stapsdt` section of `torch/lib/libc10_cuda.so` from the
    /// PyPI wheel torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64 (the
    /// library's sha256 b3bfc48277fb6c1e451c1be9101bb3a214445b14819be470da124dca54ab68c0):
    /// only the note bytes are kept.
    const TORCH_NOTES: &[u8] = include_bytes!("fixtures/libc10_cuda-2.15.0.stapsdt");

    #[test]
    fn pytorch_caching_allocator_probes_from_the_real_library() {
        let notes = parse_notes(TORCH_NOTES).unwrap();
        let got: Vec<(&str, &str, u64, u64, &str)> = notes
            .iter()
            .map(|n| {
                (
                    n.provider.as_str(),
                    n.name.as_str(),
                    n.pc,
                    n.semaphore,
                    n.args.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("pytorch", "free", 0x171d5, 0x867c8, "-8@%rdi"),
                ("pytorch", "free", 0x22997, 0x867c8, "-8@%rdi"),
                (
                    "pytorch",
                    "malloc",
                    0x4a173,
                    0x867ca,
                    "-8@%rbp -1@%al -8@%r12 -8@56(%rsp)"
                ),
                (
                    "pytorch",
                    "malloc",
                    0x514ed,
                    0x867ca,
                    "-8@%rax -1@%dl -8@%r14 -8@-56(%rbp)"
                ),
            ]
        );
        assert!(notes.iter().all(|n| n.base == 0), "PyTorch writes no base");
        // malloc(ptr, device, size, stream): device is the int8 DeviceIndex.
        let a = parse_args(&notes[2].args).unwrap();
        assert_eq!(
            a.iter()
                .map(|a| (a.kind, a.size, a.signed, a.reg_off, a.value))
                .collect::<Vec<_>>(),
            [
                (ArgKind::Reg as u8, 8, 1, 32, 0),
                (ArgKind::Reg as u8, 1, 1, 80, 0),
                (ArgKind::Reg as u8, 8, 1, 24, 0),
                (ArgKind::Mem as u8, 8, 1, 152, 56),
            ]
        );
        let b = parse_args(&notes[3].args).unwrap();
        assert_eq!((b[1].reg_off, b[1].size), (96, 1), "%dl is rdx's low byte");
        assert_eq!(
            (b[3].kind, b[3].reg_off, b[3].value),
            (ArgKind::Mem as u8, 32, -56)
        );
    }

    /// Builds one note as `<sys/sdt.h>` lays it out.
    fn note(owner: &[u8], ntype: u32, pc: u64, base: u64, sem: u64, strs: &[&str]) -> Vec<u8> {
        let mut desc = Vec::new();
        for v in [pc, base, sem] {
            desc.extend_from_slice(&v.to_le_bytes());
        }
        for s in strs {
            desc.extend_from_slice(s.as_bytes());
            desc.push(0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(owner.len() as u32).to_le_bytes());
        out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&ntype.to_le_bytes());
        out.extend_from_slice(owner);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend_from_slice(&desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn synthetic_notes_with_several_probes_semaphores_and_every_argument_form() {
        let mut data = note(
            b"stapsdt\0",
            3,
            0x1000,
            0x2000,
            0x3000,
            &["app", "start", ""],
        );
        data.extend(note(b"GNU\0", 3, 0x1, 0, 0, &["x", "y", "8@%rax"]));
        data.extend(note(b"stapsdt\0", 1, 0x1, 0, 0, &["x", "y", "8@%rax"]));
        data.extend(note(
            b"stapsdt\0",
            3,
            0x1010,
            0x2000,
            0,
            &[
                "app",
                "step",
                "-4@$-12 8@0x10(%rsp) 2@(%rdi) 1@%sil -8@%r9 4@%r15d",
            ],
        ));
        data.extend(note(
            b"stapsdt\0",
            3,
            0x1020,
            0x2000,
            0x3002,
            &["app", "bare"],
        ));
        let notes = parse_notes(&data).unwrap();
        let names: Vec<&str> = notes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            ["start", "step", "bare"],
            "other owners and types skipped"
        );
        assert_eq!((notes[0].semaphore, notes[2].semaphore), (0x3000, 0x3002));
        assert_eq!(notes[1].semaphore, 0);
        assert_eq!(notes[2].args, "");
        let a = parse_args(&notes[1].args).unwrap();
        let got: Vec<(u8, u8, u8, u32, i64)> = a
            .iter()
            .map(|a| (a.kind, a.size, a.signed, a.reg_off, a.value))
            .collect();
        assert_eq!(
            got,
            [
                (ArgKind::Const as u8, 4, 1, 0, -12),
                (ArgKind::Mem as u8, 8, 0, 152, 16),
                (ArgKind::Mem as u8, 2, 0, 112, 0),
                (ArgKind::Reg as u8, 1, 0, 104, 0),
                (ArgKind::Reg as u8, 8, 1, 64, 0),
                (ArgKind::Reg as u8, 4, 0, 0, 0),
            ]
        );
        assert!(parse_args("").unwrap().is_empty());
        // Cut short anywhere: an error, never a panic.
        for cut in 1..data.len() {
            let _ = parse_notes(&data[..cut]);
        }
        assert_eq!(parse_notes(&data[..5]), Err(UsdtError::Malformed(0)));
    }

    #[test]
    fn unsupported_argument_forms_are_refused_by_name() {
        for bad in [
            "8@foo(%rip)",
            "8@(%rax,%rbx,8)",
            "3@%rax",
            "8@%xmm0",
            "8@%ah",
            "rax",
            "8@",
            "8@$x",
        ] {
            assert_eq!(
                parse_arg(bad),
                Err(UsdtError::Unsupported(bad.into())),
                "{bad}"
            );
        }
        // A global, rip-relative: read at the probe's rip plus the distance.
        let syms = |n: &str| (n == "current_device").then_some(0x4010u64);
        let a = parse_arg_at("-1@current_device(%rip)", Some((0x1365, &syms))).unwrap();
        assert_eq!(
            (a.kind, a.size, a.signed, a.reg_off, a.value),
            (ArgKind::Mem as u8, 1, 1, 128, 0x4010 - 0x1365)
        );
        let a = parse_arg_at("8@current_device+8(%rip)", Some((0x1365, &syms))).unwrap();
        assert_eq!(a.value, 0x4018 - 0x1365);
        for bad in ["8@missing(%rip)", "8@16(%rip)"] {
            assert!(parse_arg_at(bad, Some((0x1365, &syms))).is_err(), "{bad}");
        }
        let seven = "8@%rax ".repeat(7);
        assert_eq!(parse_args(&seven), Err(UsdtError::TooManyArgs(7)));
    }
}
