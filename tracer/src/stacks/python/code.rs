//! Code objects read from a process, and the line of an instruction in
//! each CPython version's line table.

use super::{
    layout::Interpreter,
    memory::{read_bytes, read_mem, read_str},
};

/// A code object, as read from the process.
#[derive(Clone, Debug)]
pub struct Code {
    /// `co_qualname` (3.11+), `co_name`.
    pub name: String,
    /// `co_filename`.
    pub file: String,
    /// `co_firstlineno`.
    pub first: i32,
    /// The line table.
    pub table: Vec<u8>,
}

/// Reads the code object of `pid` at `addr`; `Err` is an index into
/// the reasons `WHY` lists (in this module's parent).
pub fn read_code(pid: u32, i: &Interpreter, addr: u64) -> Result<Code, usize> {
    let o = &i.offsets;
    let mut c = [0u8; 256];
    if addr == 0 || !read_mem(pid, addr, &mut c) {
        return Err(0);
    }
    let word = |off: usize| u64::from_le_bytes(c[off..off + 8].try_into().unwrap_or_default());
    if word(8) != i.code_type {
        return Err(1);
    }
    let first = i32::from_le_bytes(
        c[o.co_firstlineno..o.co_firstlineno + 4]
            .try_into()
            .unwrap_or_default(),
    );
    let name = read_str(pid, (o.ascii_size, o.compact_size), word(o.co_name)).ok_or(2usize)?;
    let file = read_str(pid, (o.ascii_size, o.compact_size), word(o.co_filename)).ok_or(2usize)?;
    let table = read_bytes(pid, word(o.co_linetable)).ok_or(3usize)?;
    Ok(Code {
        name,
        file,
        first,
        table,
    })
}

/// The line of byte offset `addr` in a 3.9 `co_lnotab`.
pub fn line_lnotab(first: i32, table: &[u8], addr: i64) -> Option<i32> {
    let (mut line, mut at) = (first, 0i64);
    for p in table.chunks_exact(2) {
        at += p[0] as i64;
        if at > addr {
            break;
        }
        line += p[1] as i8 as i32;
    }
    Some(line)
}

/// The line of byte offset `addr` in a 3.10 `co_linetable`.
pub fn line_310(first: i32, table: &[u8], addr: i64) -> Option<i32> {
    let (mut line, mut end) = (first, 0i64);
    for p in table.chunks_exact(2) {
        let start = end;
        end += p[0] as i64;
        let delta = p[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line += delta as i32;
            Some(line)
        };
        if start <= addr && addr < end {
            return here;
        }
    }
    None
}

/// The line of code unit `unit` in a 3.11+ location table
/// (`Objects/locations.md` in CPython's source).
pub fn line_311(first: i32, table: &[u8], unit: i64) -> Option<i32> {
    let mut it = table.iter().copied();
    let varint = |it: &mut dyn Iterator<Item = u8>| -> Option<u64> {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = it.next()?;
            v |= ((b & 63) as u64) << shift;
            shift += 6;
            if b & 64 == 0 || shift > 60 {
                return Some(v);
            }
        }
    };
    let svarint = |it: &mut dyn Iterator<Item = u8>| -> Option<i64> {
        let v = varint(it)?;
        Some(if v & 1 == 1 {
            -((v >> 1) as i64)
        } else {
            (v >> 1) as i64
        })
    };
    let (mut line, mut at) = (first as i64, 0i64);
    while let Some(b) = it.next() {
        if b & 0x80 == 0 {
            return None;
        }
        let code = (b >> 3) & 15;
        let len = (b & 7) as i64 + 1;
        let here = match code {
            15 => None,
            14 => {
                line += svarint(&mut it)?;
                varint(&mut it)?;
                varint(&mut it)?;
                varint(&mut it)?;
                Some(line)
            }
            13 => {
                line += svarint(&mut it)?;
                Some(line)
            }
            10..=12 => {
                line += (code - 10) as i64;
                it.next()?;
                it.next()?;
                Some(line)
            }
            _ => {
                it.next()?;
                Some(line)
            }
        };
        if at <= unit && unit < at + len {
            return here.map(|l| l as i32);
        }
        at += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints, for every code object of a real module compiled by this
    /// interpreter, its first line, its line table and CPython's own line
    /// of each instruction (`co_lines()`; `dis.findlinestarts` in 3.9).
    const DUMP: &str = r#"
import dis, json, sys, types
src = open(sys.argv[1]).read()
def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)
for co in walk(compile(src, sys.argv[1], "exec")):
    if sys.version_info >= (3, 10):
        table = co.co_linetable
        lines = [[o, l] for s, e, l in co.co_lines() for o in range(s, e, 2)]
    else:
        table = co.co_lnotab
        starts = list(dis.findlinestarts(co))
        lines = []
        for o in range(0, len(co.co_code), 2):
            at = [l for s, l in starts if s <= o]
            if at:
                lines.append([o, at[-1]])
    print(json.dumps({"first": co.co_firstlineno, "table": table.hex(), "lines": lines}))
"#;

    /// Each interpreter of this machine kind compiles its own `argparse.py`
    /// and `tests/py/grow_lists.py`: our reading of every instruction's
    /// line matches CPython's own, instruction by instruction.
    #[test]
    fn lines_are_read_as_cpython_reads_them() {
        let mut found = 0;
        for minor in 9..=13u8 {
            let python = super::super::pyenv(minor).map(|p| p.join(format!("bin/python3.{minor}")));
            let Some(python) = python.filter(|p| p.exists()) else {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CPython 3.{minor} is missing"
                );
                continue;
            };
            let lib = python
                .parent()
                .unwrap()
                .join(format!("../lib/python3.{minor}/argparse.py"));
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/py/grow_lists.py");
            for file in [lib.to_str().unwrap(), script] {
                let out = std::process::Command::new(&python)
                    .args(["-c", DUMP, file])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap();
                    let first = v["first"].as_i64().unwrap() as i32;
                    let table: Vec<u8> = (0..v["table"].as_str().unwrap().len())
                        .step_by(2)
                        .map(|i| {
                            u8::from_str_radix(&v["table"].as_str().unwrap()[i..i + 2], 16).unwrap()
                        })
                        .collect();
                    for pair in v["lines"].as_array().unwrap() {
                        let offset = pair[0].as_i64().unwrap();
                        let want = pair[1].as_i64().map(|l| l as i32);
                        let got = match minor {
                            9 => line_lnotab(first, &table, offset),
                            10 => line_310(first, &table, offset),
                            _ => line_311(first, &table, offset / 2),
                        };
                        assert_eq!(got, want, "3.{minor} {file}: byte {offset} of {v}");
                        found += 1;
                    }
                }
            }
        }
        assert!(
            found > 1000 || std::env::var_os("CI").is_none(),
            "{found} instructions"
        );
    }
}
