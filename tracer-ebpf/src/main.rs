//! eBPF programs of tracer. One module per probe family under `probes/`;
//! every map in `maps.rs`; the event ABI in `tracer-common`.
#![no_std]
#![no_main]

mod maps;
mod probes;
mod python;
mod slots;
mod stack;
mod util;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL: the programs call GPL-only helpers (`bpf_probe_read_kernel`, ...).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
