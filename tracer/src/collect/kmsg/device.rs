//! Reading /dev/kmsg itself: the records, the kernel log's clock, and
//! everything it holds now.

use std::{
    fs::File,
    io::{self, Read},
    os::unix::fs::OpenOptionsExt,
};

use super::{Assembler, KMSG, KmsgError, KmsgEvent, KmsgRecord, OomReport, Xid, parse_record};

/// Opens /dev/kmsg for non-blocking reads from the oldest record kept.
pub fn open() -> Result<File, KmsgError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(KMSG)
        .map_err(|source| KmsgError::Open { source })
}

/// Reads the next record. `Ok(None)`: nothing more for now. Records the
/// kernel overwrote before we read them (EPIPE) are skipped and counted.
pub fn read_record(
    f: &mut File,
    buf: &mut [u8],
    lost: &mut u64,
) -> Result<Option<KmsgRecord>, KmsgError> {
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(None),
            Ok(n) => {
                let raw = String::from_utf8_lossy(&buf[..n]);
                match parse_record(&raw) {
                    Ok(r) => return Ok(Some(r)),
                    Err(e) => {
                        tracing::debug!("{e}");
                        continue;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                *lost += 1;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(KmsgError::Read { source }),
        }
    }
}

/// How far the kernel log's clock is ahead of CLOCK_MONOTONIC, ns
/// (negative: behind), measured by writing one line to the kernel log
/// (`tracer[PID]: kernel log clock reference`, user facility) and reading
/// back its stamp. `None` when the log cannot be written or read back.
pub fn measure_clock_skew() -> Option<i64> {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let mono = crate::util::time::mono_now_ns;
    let mut r = open().ok()?;
    // SEEK_END on /dev/kmsg: the next record read is the next one logged.
    r.seek(SeekFrom::End(0)).ok()?;
    let marker = format!("tracer[{}]: kernel log clock reference", std::process::id());
    let mut w = std::fs::OpenOptions::new().write(true).open(KMSG).ok()?;
    let t0 = mono();
    w.write_all(format!("{marker}\n").as_bytes()).ok()?;
    let t1 = mono();
    let mut buf = vec![0u8; 8192];
    let mut lost = 0;
    for _ in 0..100 {
        while let Some(rec) = read_record(&mut r, &mut buf, &mut lost).ok()? {
            if rec.facility != 0 && rec.text == marker {
                return Some(rec.ts_us as i64 * 1000 - (t0 + (t1 - t0) / 2));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    None
}

/// Every OOM report still in the kernel log buffer (for `explain --kmsg`).
pub fn read_all_reports() -> Result<Vec<OomReport>, KmsgError> {
    read_all().map(|(r, _)| r)
}

/// Every OOM report and Xid line the kernel log holds now.
pub fn read_all() -> Result<(Vec<OomReport>, Vec<Xid>), KmsgError> {
    let mut f = open()?;
    let mut buf = vec![0u8; 8192];
    let mut lost = 0;
    let mut asm = Assembler::default();
    let (mut out, mut xids) = (Vec::new(), Vec::new());
    while let Some(rec) = read_record(&mut f, &mut buf, &mut lost)? {
        match asm.push(&rec) {
            Some(KmsgEvent::Report(r)) => out.push(*r),
            Some(KmsgEvent::OomGroup(g)) => g.mark_first(&mut out),
            Some(KmsgEvent::Xid(x)) => xids.push(x),
            _ => {}
        }
    }
    Ok((out, xids))
}
