//! The USDT family: statically defined probes (`.note.stapsdt`) attached
//! by address, whose arguments the program decodes from specs userspace
//! parsed out of the notes. The first users are PyTorch's CUDA caching
//! allocator probes (`pytorch:malloc`, `pytorch:free`).

use crate::EventHeader;

/// Arguments a probe's event carries at most.
pub const MAX_ARGS: usize = 6;
/// Entries of `USDT_SPECS` (one per attached probe site and file).
pub const MAX_SPECS: u32 = 1024;

/// `pytorch:malloc(void *ptr, int8 device, size_t size, int64 stream)`: a
/// block handed out by the CUDA caching allocator.
pub const TORCH_MALLOC: u32 = 1;
/// `pytorch:free(void *ptr)`: a block given back to it.
pub const TORCH_FREE: u32 = 2;

/// Every probe tracer knows: (id, provider, name).
pub const PROBES: &[(u32, &str, &str)] = &[
    (TORCH_MALLOC, "pytorch", "malloc"),
    (TORCH_FREE, "pytorch", "free"),
];

/// Where an argument is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// No argument.
    None = 0,
    /// A register: `%rdi`.
    Reg = 1,
    /// Memory at a register plus an offset: `-56(%rbp)`.
    Mem = 2,
    /// A constant: `$5`.
    Const = 3,
}

/// One argument spec.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArg {
    /// [`ArgKind`].
    pub kind: u8,
    /// Width in bytes: 1, 2, 4 or 8.
    pub size: u8,
    /// Non-zero: sign-extend.
    pub signed: u8,
    /// Explicit padding.
    pub _pad: u8,
    /// Byte offset of the register in `struct pt_regs`.
    pub reg_off: u32,
    /// The offset (`Mem`) or the value (`Const`).
    pub value: i64,
}
const _: () = assert!(size_of::<UsdtArg>() == 16);

/// What the program needs to decode one attached probe (indexed by the
/// attach cookie in `USDT_SPECS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    /// Probe id ([`TORCH_MALLOC`], ...).
    pub probe: u32,
    /// Arguments used.
    pub nargs: u32,
    /// Their specs.
    pub args: [UsdtArg; MAX_ARGS],
}
const _: () = assert!(size_of::<UsdtSpec>() == 104);

/// A USDT probe fired ([`crate::kind::USDT`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtEvent {
    /// Common header; the task is the one that passed the probe.
    pub header: EventHeader,
    /// Probe id.
    pub probe: u32,
    /// Arguments read.
    pub nargs: u32,
    /// Their values, extended to 64 bits as their specs say.
    pub args: [u64; MAX_ARGS],
}
const _: () = assert!(size_of::<UsdtEvent>() == size_of::<EventHeader>() + 56);
