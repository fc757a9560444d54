//! Reads of another process's memory, and of the CPython objects in it
//! that frames are named from: `str` and `bytes`.

/// Characters of a name read at most.
const STR_MAX: usize = 4096;
/// Bytes of a line table read at most (a function of thousands of lines
/// has a few tens of KiB).
const TABLE_MAX: usize = 256 << 10;

/// Reads `buf.len()` bytes of `pid`'s memory at `addr`.
pub fn read_mem(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local buffer we own, of the length given; the remote
    // side is only read by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

pub fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    read_mem(pid, addr, &mut b).then(|| u64::from_le_bytes(b))
}

/// Reads a compact `str` object of `pid` at `addr`; `sizes` are
/// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`.
pub fn read_str(pid: u32, sizes: (usize, usize), addr: u64) -> Option<String> {
    let mut h = [0u8; 40];
    if addr == 0 || !read_mem(pid, addr, &mut h) {
        return None;
    }
    let len = u64::from_le_bytes(h[16..24].try_into().ok()?) as usize;
    let state = u32::from_le_bytes(h[32..36].try_into().ok()?);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || len > STR_MAX || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    if ascii == 1 {
        let mut b = vec![0u8; len];
        read_mem(pid, addr + sizes.0 as u64, &mut b).then_some(())?;
        return String::from_utf8(b).ok();
    }
    let mut b = vec![0u8; len * kind as usize];
    read_mem(pid, addr + sizes.1 as u64, &mut b).then_some(())?;
    Some(match kind {
        1 => b.iter().map(|&c| c as char).collect(),
        2 => char::decode_utf16(b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect(),
        _ => b
            .chunks(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    })
}

/// Reads a `bytes` object of `pid` at `addr`.
pub fn read_bytes(pid: u32, addr: u64) -> Option<Vec<u8>> {
    let len = read_u64(pid, addr.checked_add(16)?)? as usize;
    if len > TABLE_MAX {
        return None;
    }
    let mut b = vec![0u8; len];
    read_mem(pid, addr + 32, &mut b).then_some(b)
}
