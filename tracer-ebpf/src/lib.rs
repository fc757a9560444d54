//! Stub library target: it lets `tracer` list this crate as a build
//! dependency, so cargo rebuilds `tracer` (which embeds the eBPF object
//! built from `main.rs`) whenever the probes change.
#![no_std]
