//! Whole native user stacks and their names: unwinding a sample's copied
//! stack from `.eh_frame` (framehop), with the kernel's frame-pointer walk
//! where it goes further, and symbols with lines (blazesym). Reads
//! /proc/PID/maps and the mapped files through /proc/PID/map_files, so
//! processes in other mount namespaces and deleted files work.

pub mod maps;
pub mod perfmap;
pub mod python;
pub mod symbols;
pub mod unwind;
