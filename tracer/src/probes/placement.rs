//! Where to put a uprobe in a function so that it costs least.
//!
//! On x86_64 the kernel runs the probed instruction either by emulating it
//! (branches, calls, `nop`, `push reg`: a fraction of a microsecond) or by
//! copying it to a page of the process and single-stepping it there (every
//! other instruction: several microseconds more per hit). glibc's `free`
//! begins with `test %rdi,%rdi`, the driver's entry points with a
//! rip-relative `cmpl`: single-stepped, while the `je` right after them is
//! emulated. (arch/x86/kernel/uprobes.c: `branch_setup_xol_ops`,
//! `push_setup_xol_ops`.)
//!
//! So each probe goes on the first instruction the kernel emulates, when
//! every instruction before it
//! - runs straight on (no branch, call or return),
//! - writes no argument register (the entry program reads them there),
//! - and, when a return probe shares the site, leaves the stack pointer and
//!   the memory it points at alone (the kernel finds the return address at
//!   `[rsp]`),
//!
//! and no branch of the function lands in the skipped bytes or on the site
//! (the probe would then fire for a call that did not pass the entry).
//! Otherwise the probe stays on the entry.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
    Register,
};

/// Bytes of a function read to place its probe when its size is unknown.
pub const WINDOW: usize = 64;
/// The longest function whose probe is moved (its every branch is checked).
pub const MAX_FUNCTION: usize = 64 * 1024;
/// Instructions looked at past the entry.
const MAX_SKIPPED: usize = 4;

/// The chosen site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Bytes from the entry to the probed instruction.
    pub shift: u64,
    /// Whether the kernel emulates the probed instruction.
    pub emulated: bool,
}

/// The registers that carry arguments (System V x86_64).
const ARGS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// Whether the kernel emulates `bytes` (one instruction) instead of
/// single-stepping it: exactly the encodings its x86 uprobe code handles
/// (no prefixes but REX.B on `push`).
pub fn emulated(bytes: &[u8]) -> bool {
    match bytes {
        [0x70..=0x7f, _] => true,                    // jcc rel8
        [0x0f, 0x80..=0x8f, _, _, _, _] => true,     // jcc rel32
        [0xeb, _] | [0xe9, _, _, _, _] => true,      // jmp rel8 / rel32
        [0xe8, _, _, _, _] => true,                  // call rel32
        [0x90] => true, // nop (also `66 90` etc. since 6.16; not relied on)
        [0x50..=0x57] | [0x41, 0x50..=0x57] => true, // push r64
        _ => false,
    }
}

/// Places the probe of a function at `addr` whose code is `code` (`size`
/// from the symbol table; when it is unknown or `code` does not hold the
/// whole function, nothing is moved: branches into the skipped bytes could
/// not be ruled out). `with_return`: a return probe shares the site.
pub fn place(code: &[u8], addr: u64, size: u64, with_return: bool) -> Placement {
    let entry = Placement {
        shift: 0,
        emulated: first_len(code, addr).is_some_and(|n| emulated(&code[..n])),
    };
    if entry.emulated || size == 0 || size as usize > code.len() {
        return entry;
    }
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    for _ in 0..=MAX_SKIPPED {
        if !decoder.can_decode() {
            break;
        }
        let at = decoder.position();
        decoder.decode_out(&mut insn);
        if insn.code() == Code::INVALID {
            break;
        }
        let bytes = &code[at..at + insn.len()];
        if at > 0 && emulated(bytes) {
            let shift = at as u64;
            return if lands_in(code, addr, size, shift) {
                entry
            } else {
                Placement {
                    shift,
                    emulated: true,
                }
            };
        }
        if !straight(&insn, &mut info, with_return) {
            break;
        }
    }
    entry
}

pub(super) fn first_len(code: &[u8], addr: u64) -> Option<usize> {
    let insn = Decoder::with_ip(64, code, addr, DecoderOptions::NONE).decode();
    (insn.code() != Code::INVALID).then(|| insn.len())
}

/// Whether an instruction may run before the probe.
fn straight(insn: &Instruction, info: &mut InstructionInfoFactory, with_return: bool) -> bool {
    if insn.flow_control() != FlowControl::Next {
        return false;
    }
    let used = info.info(insn);
    let writes = |a: OpAccess| {
        matches!(
            a,
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        )
    };
    let touches_args = used
        .used_registers()
        .iter()
        .any(|r| writes(r.access()) && ARGS.contains(&r.register().full_register()));
    if touches_args {
        return false;
    }
    if with_return {
        let moves_stack = insn.stack_pointer_increment() != 0
            || used
                .used_registers()
                .iter()
                .any(|r| writes(r.access()) && r.register().full_register() == Register::RSP);
        let stores = used.used_memory().iter().any(|m| writes(m.access()));
        if moves_stack || stores {
            return false;
        }
    }
    true
}

/// Whether a direct branch of the function (its `size` bytes) lands in
/// `(addr, addr + shift]`. Indirect branches (jump tables) cannot be
/// followed; compilers do not aim them at a function's first instructions.
fn lands_in(code: &[u8], addr: u64, size: u64, shift: u64) -> bool {
    let len = (size as usize).min(code.len());
    let mut decoder = Decoder::with_ip(64, &code[..len], addr, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut insn);
        if matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        ) {
            let t = insn.near_branch_target();
            if t > addr && t <= addr + shift {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // Debian 12 glibc 2.36 (libc.so.6), the first bytes of each function.
    /// `push %r12; push %rbp; push %rbx; mov %rdi,%rbx; sub $0x10,%rsp; ...`
    const MALLOC: &str = "415455534889fb4883ec10803d461b1400000f84f8010000";
    /// `test %rdi,%rdi; je ...; push %rbp; lea -0x10(%rdi),%rsi; ...`
    const FREE: &str = "4885ff0f84bf00000055488d77f0534883ec18488b1dd69e";
    /// `cmpb $0,rip(...); push %r12; mov %rdx,%r12; push %rbp; ...`
    const POSIX_MEMALIGN: &str = "803d0102140000 4154 4989d4 55 4889fd 53 4889f3 745a";
    /// `cmpb $0,rip(...); je +7; jmp __libc_malloc+0x320; xchg; sub $0x18,%rsp`
    const MEMALIGN: &str = "803d710e1400007407e932f6ffff66904883ec18";
    /// The driver's exported entry points (libcuda.so.1) are trampolines
    /// of this shape: `cmpl $0,rip(...); je +6; jmp *rip(...); ...`.
    const DRIVER_TRAMPOLINE: &str = "833d1234560000 7406 ff2500100000 b8 03000000 c3";

    fn bytes(s: &str) -> Vec<u8> {
        hex(&s.replace(' ', ""))
    }

    #[test]
    fn emulated_encodings() {
        for (b, want) in [
            ("74bf", true),
            ("0f84bf000000", true),
            ("4154", true),
            ("55", true),
            ("e932f6ffff", true),
            ("90", true),
            ("4885ff", false),         // test %rdi,%rdi
            ("803d0102140000", false), // cmpb rip-relative
            ("4889fb", false),         // mov
            ("f30f1efa", false),       // endbr64
        ] {
            assert_eq!(emulated(&hex(b)), want, "{b}");
        }
    }

    #[test]
    fn glibc_sites() {
        // malloc starts with an emulated push: stays at the entry.
        let p = place(&bytes(MALLOC), 0x98930, 24, true);
        assert_eq!(
            p,
            Placement {
                shift: 0,
                emulated: true
            }
        );
        // free (entry probe only): the je after the test.
        let p = place(&bytes(FREE), 0x98ef0, 24, false);
        assert_eq!(
            p,
            Placement {
                shift: 3,
                emulated: true
            }
        );
        // posix_memalign with its return probe: the push after the cmpb
        // (the push itself runs after the probe, so [rsp] is still the
        // return address when it fires).
        let code = bytes(POSIX_MEMALIGN);
        let p = place(&code, 0x9a280, code.len() as u64, true);
        assert_eq!(
            p,
            Placement {
                shift: 7,
                emulated: true
            }
        );
        let p = place(&bytes(MEMALIGN), 0x99610, 20, true);
        assert_eq!(
            p,
            Placement {
                shift: 7,
                emulated: true
            }
        );
    }

    #[test]
    fn driver_trampolines_move_to_the_branch() {
        let code = bytes(DRIVER_TRAMPOLINE);
        let p = place(&code, 0x1000, code.len() as u64, true);
        assert_eq!(
            p,
            Placement {
                shift: 7,
                emulated: true
            }
        );
    }

    #[test]
    fn what_keeps_a_probe_at_the_entry() {
        // An argument register written before the branch: `mov $1,%edi; je`.
        let code = bytes("bf01000000 7402 90 c3");
        assert_eq!(place(&code, 0, code.len() as u64, false).shift, 0);
        // With a return probe, a push before the branch: `sub $8,%rsp; je`.
        let code = bytes("4883ec08 7402 90 c3");
        assert_eq!(place(&code, 0, code.len() as u64, true).shift, 0);
        // Without one, the same is fine.
        assert_eq!(place(&code, 0, code.len() as u64, false).shift, 4);
        // A store before the branch, with a return probe.
        let code = bytes("48893c24 7402 90 c3"); // mov %rdi,(%rsp)
        assert_eq!(place(&code, 0, code.len() as u64, true).shift, 0);
        // A branch of the function back onto the site: `test; je +0; ...; jmp site`.
        let code = bytes("4885ff 7402 90 90 ebf9");
        assert_eq!(place(&code, 0, code.len() as u64, false).shift, 0);
        // Unknown size, or more function than bytes: branches cannot be ruled out.
        let code = bytes(FREE);
        assert_eq!(place(&code, 0, 0, false).shift, 0);
        assert_eq!(place(&code, 0, 0x240, false).shift, 0);
        // Too far: four straight instructions before the first branch.
        let code = bytes("4885ff 4885f6 4885d2 4885c9 4885c0 7402 c3");
        assert_eq!(place(&code, 0, code.len() as u64, false).shift, 0);
    }
}
