//! Device memory as a PyTorch memory snapshot: the pickle that
//! `torch.cuda.memory._snapshot()` returns and `_dump_snapshot` writes,
//! which PyTorch's memory viewer and `torch.cuda._memory_viz` open.
//!
//! Segments are the process's traced device allocations (cudaMalloc and
//! friends: what a caching allocator reserves), each with the stack that
//! allocated it. Where the caching allocator's probes were seen, the blocks
//! it handed out are placed in their segments and the rest of each segment
//! is free (`inactive`); a program with no caching allocator uses each
//! allocation whole, so its segment is one block, in use. The trace holds
//! the allocations of the segments still live and the failed allocations,
//! not the whole history (a ledger keeps what is live).

use std::collections::HashMap;

use serde::Serialize;

use crate::{
    model::ledger::{CallRecord, Ledger},
    record::{GpuOomRecord, HeapSite},
    stacks::symbols::Frame,
};

/// A segment: one device allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Segment {
    /// Its device pointer.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Device (-1: unknown).
    pub device: i32,
    /// Wall time it was made, ns.
    pub ts_ns: i64,
    /// The stack that allocated it, innermost first (empty: not known).
    pub frames: Vec<Frame>,
}

/// A block a caching allocator handed out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// Its device pointer.
    pub address: u64,
    /// Bytes as the allocator counts them (rounded up).
    pub size: u64,
    /// Bytes asked for.
    pub requested: u64,
    /// The stack that asked for it, innermost first (empty: not sampled).
    pub frames: Vec<Frame>,
}

/// An allocation that failed for lack of device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Oom {
    /// Bytes asked for.
    pub size: u64,
    /// Device (-1: unknown).
    pub device: i32,
    /// Free device memory then, as last known (0: not known).
    pub device_free: u64,
    /// Wall time, ns.
    pub ts_ns: i64,
}

/// What a snapshot is made of.
#[derive(Clone, Debug, Default)]
pub struct Input {
    /// The device allocations, lowest address first.
    pub segments: Vec<Segment>,
    /// The caching allocator's blocks, lowest address first; `None` when
    /// the process has none (or its probes were not seen).
    pub blocks: Option<Vec<Block>>,
    /// Failed allocations, oldest first.
    pub ooms: Vec<Oom>,
}

/// The stacks of the allocations the device memory sites list, by pointer.
fn frames_by_ptr(sites: &[HeapSite]) -> HashMap<u64, &[Frame]> {
    sites
        .iter()
        .flat_map(|s| {
            s.allocations
                .iter()
                .map(move |a| (a.ptr.as_str(), &s.frames[..]))
        })
        .filter_map(|(ptr, frames)| Some((parse_ptr(ptr)?, frames)))
        .collect()
}

fn parse_ptr(hex: &str) -> Option<u64> {
    u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok()
}

/// The failed allocations among `failures` that ran out of memory.
fn ooms_of(failures: &[CallRecord]) -> impl Iterator<Item = Oom> + '_ {
    failures
        .iter()
        .filter(|f| f.ret == tracer_common::cuda::OUT_OF_MEMORY)
        .map(|f| Oom {
            size: f.size,
            device: f.device,
            device_free: 0,
            ts_ns: f.ts_ns,
        })
}

impl Input {
    /// A traced process now: its ledger's device allocations, named with
    /// the stacks `sites` list, and its caching allocator's blocks, named
    /// with those `block_sites` list.
    pub fn live(ledger: &Ledger, sites: &[HeapSite], block_sites: &[HeapSite]) -> Self {
        let frames = frames_by_ptr(sites);
        let block_frames = frames_by_ptr(block_sites);
        let segments = ledger
            .device_segments()
            .into_iter()
            .map(|(ptr, a)| Segment {
                address: ptr,
                size: a.size,
                device: a.device,
                ts_ns: a.ts_ns,
                frames: frames.get(&ptr).map(|f| f.to_vec()).unwrap_or_default(),
            })
            .collect();
        let blocks = ledger.allocator_blocks().map(|b| {
            b.into_iter()
                .map(|(address, size, requested)| Block {
                    address,
                    size,
                    requested,
                    frames: block_frames
                        .get(&address)
                        .map(|f| f.to_vec())
                        .unwrap_or_default(),
                })
                .collect()
        });
        Input {
            segments,
            blocks,
            ooms: ooms_of(&ledger.summary().failures).collect(),
        }
    }

    /// A recorded GPU out-of-memory error: the allocations its device
    /// memory sites list (with their stacks) and the
    /// largest it held, and its failures, this one last with the device's
    /// free memory as NVML saw it. The allocations neither lists are not
    /// in it: [`Input::held_bytes`] says how much that leaves out.
    pub fn gpu_oom(r: &GpuOomRecord) -> Self {
        let mut segments: HashMap<u64, Segment> = HashMap::new();
        for site in &r.stacks {
            for a in &site.allocations {
                if let Some(ptr) = parse_ptr(&a.ptr) {
                    segments.insert(
                        ptr,
                        Segment {
                            address: ptr,
                            size: a.size,
                            device: r.device,
                            ts_ns: a.ts_ns as i64,
                            frames: site.frames.clone(),
                        },
                    );
                }
            }
        }
        for a in r.held.largest.iter().filter(|a| a.kind.in_device_space()) {
            if let Some(ptr) = parse_ptr(&a.ptr) {
                segments.entry(ptr).or_insert_with(|| Segment {
                    address: ptr,
                    size: a.size,
                    device: a.device,
                    ts_ns: a.ts_ns,
                    frames: Vec::new(),
                });
            }
        }
        let mut segments: Vec<Segment> = segments.into_values().collect();
        segments.sort_by_key(|s| s.address);
        let mut ooms: Vec<Oom> = ooms_of(&r.held.failures)
            .filter(|o| o.ts_ns != r.ts_ns)
            .collect();
        ooms.push(Oom {
            size: r.size,
            device: r.device,
            device_free: r.nvml.as_ref().map_or(0, |n| n.free),
            ts_ns: r.ts_ns,
        });
        Input {
            segments,
            blocks: None,
            ooms,
        }
    }

    /// Bytes of device memory the segments hold.
    pub fn held_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }
}

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<SegmentOut>,
    device_traces: Vec<Vec<TraceEntry>>,
}

#[derive(Serialize)]
struct SegmentOut {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Vec<FrameOut>,
    blocks: Vec<BlockOut>,
}

#[derive(Serialize)]
struct BlockOut {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<FrameOut>,
}

#[derive(Clone, Serialize)]
struct FrameOut {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum TraceEntry {
    Segment {
        action: &'static str,
        addr: u64,
        size: u64,
        stream: i64,
        frames: Vec<FrameOut>,
        time_us: i64,
    },
    Oom {
        action: &'static str,
        device_free: u64,
        size: u64,
        stream: i64,
        frames: Vec<FrameOut>,
        time_us: i64,
    },
}

/// PyTorch's frame: Python frames with their script and line; native ones
/// with their source file (or, without line information, their module).
fn frame_out(f: &Frame) -> FrameOut {
    FrameOut {
        filename: f
            .file
            .clone()
            .or_else(|| f.module.clone())
            .unwrap_or_else(|| "??".into()),
        line: i64::from(f.line.unwrap_or(0)),
        name: f.function.clone().unwrap_or_else(|| "??".into()),
    }
}

/// PyTorch's pools: segments of up to 1 MiB come from its small pool.
fn segment_type(size: u64) -> &'static str {
    if size <= 1 << 20 { "small" } else { "large" }
}

/// The blocks of one segment, covering it end to end: the allocator's
/// blocks in it, in use, and the ranges between them, free.
fn blocks_of(s: &Segment, frames: &[FrameOut], blocks: Option<&[Block]>) -> Vec<BlockOut> {
    let end = s.address.saturating_add(s.size);
    let Some(blocks) = blocks else {
        return vec![BlockOut {
            address: s.address,
            size: s.size,
            requested_size: s.size,
            state: "active_allocated",
            frames: frames.to_vec(),
        }];
    };
    let mut out = Vec::new();
    let mut at = s.address;
    let first = blocks.partition_point(|b| b.address < s.address);
    for b in blocks[first..].iter().take_while(|b| b.address < end) {
        if b.address < at {
            // Overlaps the block before: a free that was not seen.
            continue;
        }
        if b.address > at {
            out.push(free_block(at, b.address - at));
        }
        let size = b.size.min(end - b.address);
        out.push(BlockOut {
            address: b.address,
            size,
            requested_size: b.requested.min(size),
            state: "active_allocated",
            frames: b.frames.iter().map(frame_out).collect(),
        });
        at = b.address + size;
    }
    if at < end {
        out.push(free_block(at, end - at));
    }
    out
}

fn free_block(address: u64, size: u64) -> BlockOut {
    BlockOut {
        address,
        size,
        requested_size: size,
        state: "inactive",
        frames: Vec::new(),
    }
}

/// PyTorch numbers devices from 0; an unknown device is shown as 0.
fn device_index(device: i32) -> usize {
    device.max(0) as usize
}

/// The snapshot, pickled as `torch.cuda.memory._snapshot()` returns it.
pub fn pickle(input: &Input) -> anyhow::Result<Vec<u8>> {
    let blocks = input.blocks.as_deref();
    let devices = input
        .segments
        .iter()
        .map(|s| s.device)
        .chain(input.ooms.iter().map(|o| o.device))
        .map(device_index)
        .max()
        .map_or(0, |d| d + 1);
    let mut traces: Vec<Vec<(i64, TraceEntry)>> = (0..devices).map(|_| Vec::new()).collect();
    let mut segments = Vec::with_capacity(input.segments.len());
    for s in &input.segments {
        let frames: Vec<FrameOut> = s.frames.iter().map(frame_out).collect();
        let blocks = blocks_of(s, &frames, blocks);
        let used = |f: fn(&BlockOut) -> u64| {
            blocks
                .iter()
                .filter(|b| b.state == "active_allocated")
                .map(f)
                .sum::<u64>()
        };
        let (allocated, requested) = (used(|b| b.size), used(|b| b.requested_size));
        traces[device_index(s.device)].push((
            s.ts_ns,
            TraceEntry::Segment {
                action: "segment_alloc",
                addr: s.address,
                size: s.size,
                stream: 0,
                frames: frames.clone(),
                time_us: s.ts_ns / 1000,
            },
        ));
        segments.push(SegmentOut {
            device: device_index(s.device) as i64,
            address: s.address,
            total_size: s.size,
            allocated_size: allocated,
            active_size: allocated,
            requested_size: requested,
            stream: 0,
            segment_type: segment_type(s.size),
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames,
            blocks,
        });
    }
    for o in &input.ooms {
        traces[device_index(o.device)].push((
            o.ts_ns,
            TraceEntry::Oom {
                action: "oom",
                device_free: o.device_free,
                size: o.size,
                stream: 0,
                frames: Vec::new(),
                time_us: o.ts_ns / 1000,
            },
        ));
    }
    let device_traces = traces
        .into_iter()
        .map(|mut t| {
            t.sort_by_key(|(ts, _)| *ts);
            t.into_iter().map(|(_, e)| e).collect()
        })
        .collect();
    let snap = Snapshot {
        segments,
        device_traces,
    };
    Ok(serde_pickle::to_vec(
        &snap,
        serde_pickle::SerOptions::new(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            module: None,
            python: true,
        }
    }

    #[test]
    fn blocks_cover_their_segment_and_keep_what_was_asked_for() {
        let s = Segment {
            address: 0x1000,
            size: 0x1000,
            ..Segment::default()
        };
        let blocks = [
            // Before the segment: another segment's.
            Block {
                address: 0x800,
                size: 0x200,
                requested: 0x200,
                frames: Vec::new(),
            },
            Block {
                address: 0x1200,
                size: 0x200,
                requested: 0x1f0,
                frames: vec![py("forward", "/srv/train.py", 9)],
            },
            // Overlaps the one before it: skipped.
            Block {
                address: 0x1300,
                size: 0x200,
                requested: 0x200,
                frames: Vec::new(),
            },
            // Runs past the end: cut at it.
            Block {
                address: 0x1e00,
                size: 0x400,
                requested: 0x400,
                frames: Vec::new(),
            },
        ];
        let out = blocks_of(&s, &[], Some(&blocks));
        let got: Vec<(u64, u64, u64, &str)> = out
            .iter()
            .map(|b| (b.address, b.size, b.requested_size, b.state))
            .collect();
        assert_eq!(
            got,
            vec![
                (0x1000, 0x200, 0x200, "inactive"),
                (0x1200, 0x200, 0x1f0, "active_allocated"),
                (0x1400, 0xa00, 0xa00, "inactive"),
                (0x1e00, 0x200, 0x200, "active_allocated"),
            ]
        );
        assert_eq!(out.iter().map(|b| b.size).sum::<u64>(), s.size);
        assert_eq!(
            out[1].frames[0].name, "forward",
            "a block keeps its own stack"
        );
    }

    #[test]
    fn without_an_allocator_a_segment_is_one_block_in_use_with_its_stack() {
        let s = Segment {
            address: 0x7f00_0000_0000,
            size: 8 << 20,
            device: 1,
            ts_ns: 5_000_000,
            frames: vec![py("forward", "/srv/train.py", 88)],
        };
        let input = Input {
            segments: vec![s],
            blocks: None,
            ooms: vec![Oom {
                size: 1 << 30,
                device: 1,
                device_free: 0,
                ts_ns: 6_000_000,
            }],
        };
        let bytes = pickle(&input).unwrap();
        let v: serde_pickle::Value =
            serde_pickle::from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
        let text = format!("{v:?}");
        for want in [
            "\"active_allocated\"",
            "\"/srv/train.py\"",
            "\"forward\"",
            "I64(88)",
            "\"segment_alloc\"",
            "\"oom\"",
            "\"device_free\"",
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
        let serde_pickle::Value::Dict(d) = v else {
            panic!("not a dict")
        };
        let traces = &d[&serde_pickle::HashableValue::String("device_traces".into())];
        let serde_pickle::Value::List(t) = traces else {
            panic!("not a list")
        };
        assert_eq!(t.len(), 2, "one trace per device up to the highest");
    }
}
