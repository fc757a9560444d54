//! Files that a privileged agent creates by a path someone else may have
//! prepared: no symlink is followed, no file or directory of another user
//! is used, nothing is created readable by others.
//!
//! A root process that opens `/some/dir/tracer.db` with plain `open(2)`
//! follows a symlink planted there, overwrites whatever it points to, and
//! leaves a store that any local user can read (victims' command lines
//! carry secrets). The checks here are the ones OpenSSH and systemd make
//! for their own state files.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Why a path is refused.
#[derive(Debug, thiserror::Error)]
pub enum UnsafePath {
    /// A symlink where a file of ours belongs.
    #[error(
        "{path} is a symbolic link; tracer does not follow links for its files (remove it or pick another path)"
    )]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// Not a regular file.
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
    },
    /// Owned by another user.
    #[error(
        "{path} belongs to uid {uid}, not to this user ({me}); tracer will not use another user's file or directory"
    )]
    Owner {
        /// The path.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// A directory others can write to (without the sticky bit).
    #[error(
        "directory {path} is writable by other users (mode {mode:o}), who could plant links in it; use a directory only its owner can write"
    )]
    OpenDir {
        /// The path.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// The file system said no.
    #[error("{path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> UnsafePath + '_ {
    move |source| UnsafePath::Io {
        path: path.into(),
        source,
    }
}

/// The effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn check_owner(path: &Path, uid: u32) -> Result<(), UnsafePath> {
    let me = euid();
    if uid == me || uid == 0 {
        Ok(())
    } else {
        Err(UnsafePath::Owner {
            path: path.into(),
            uid,
            me,
        })
    }
}

/// Makes `dir` if missing (mode 0700) and checks it: owned by this user or
/// root, and not writable by group or others unless sticky (like /tmp).
pub fn private_dir(dir: &Path) -> Result<(), UnsafePath> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(dir))?;
    }
    let m = std::fs::metadata(dir).map_err(io_err(dir))?;
    if !m.is_dir() {
        return Err(io_err(dir)(io::Error::from_raw_os_error(libc::ENOTDIR)));
    }
    check_owner(dir, m.uid())?;
    let mode = m.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(UnsafePath::OpenDir {
            path: dir.into(),
            mode,
        });
    }
    Ok(())
}

/// Reads a regular file of at most `max` bytes that someone else wrote
/// (another program's state): a FIFO, a device or a huge file is refused
/// rather than blocking or filling memory. Links are followed (the file is
/// not ours to guard).
pub fn read_capped(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let m = f.metadata()?;
    if !m.is_file() || m.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file of a sensible size",
        ));
    }
    let mut out = Vec::with_capacity(m.len() as usize);
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Checks a path that may not exist yet: when it does, it must be a
/// regular file of this user (or root), not a link. Returns whether it exists.
pub fn check_file(path: &Path) -> Result<bool, UnsafePath> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
        Ok(m) if m.file_type().is_symlink() => Err(UnsafePath::Symlink { path: path.into() }),
        Ok(m) if !m.is_file() => Err(UnsafePath::NotRegular { path: path.into() }),
        Ok(m) => check_owner(path, m.uid()).map(|()| true),
    }
}

/// Writes `bytes` as the whole of a file of ours, made as
/// [`open_private`] makes it (written as root: never through a link, nor
/// over another user's file).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let mut file = open_private(path)?;
    file.set_len(0)
        .with_context(|| format!("emptying {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Opens (creating with mode 0600 if missing) a file of ours for reading
/// and writing, never through a link. A file others could read or write is
/// narrowed to its owner and group.
pub fn open_private(path: &Path) -> Result<File, UnsafePath> {
    check_file(path)?;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                UnsafePath::Symlink { path: path.into() }
            } else {
                io_err(path)(e)
            }
        })?;
    let m = f.metadata().map_err(io_err(path))?;
    if !m.is_file() {
        return Err(UnsafePath::NotRegular { path: path.into() });
    }
    check_owner(path, m.uid())?;
    narrow(path, &f, m.mode())?;
    Ok(f)
}

/// Takes away what others may do with an open file of ours.
fn narrow(path: &Path, f: &File, mode: u32) -> Result<(), UnsafePath> {
    if mode & 0o007 != 0 {
        let keep = mode & 0o770;
        f.set_permissions(std::fs::Permissions::from_mode(keep))
            .map_err(io_err(path))?;
        tracing::info!(
            "{} was readable by other users (mode {:o}); now {keep:o}",
            path.display(),
            mode & 0o777
        );
    }
    Ok(())
}

/// Narrows an existing file of ours (the store's -wal and -shm) the same way.
pub fn narrow_existing(path: &Path) -> Result<(), UnsafePath> {
    if !check_file(path)? {
        return Ok(());
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io_err(path))?;
    let m = f.metadata().map_err(io_err(path))?;
    narrow(path, &f, m.mode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_refused_and_their_targets_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"precious").unwrap();
        let link = dir.path().join("store.db");
        symlink(&target, &link).unwrap();
        assert!(matches!(
            open_private(&link),
            Err(UnsafePath::Symlink { .. })
        ));
        let dangling = dir.path().join("dangling.db");
        symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            open_private(&dangling),
            Err(UnsafePath::Symlink { .. })
        ));
        assert!(
            !dir.path().join("nowhere").exists(),
            "nothing created through the link"
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }

    #[test]
    fn new_files_are_private_and_open_ones_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        private_dir(&sub).unwrap();
        assert_eq!(std::fs::metadata(&sub).unwrap().mode() & 0o777, 0o700);
        let f = sub.join("x.db");
        drop(open_private(&f).unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private(&f).unwrap());
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o640);
    }

    #[test]
    fn directories_others_can_write_or_own_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            private_dir(&open),
            Err(UnsafePath::OpenDir { .. })
        ));
        // Sticky and world-writable, like /tmp: allowed (files are checked one by one).
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        private_dir(&open).unwrap();
        if euid() == 0 {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(matches!(
                private_dir(&theirs),
                Err(UnsafePath::Owner { uid: 65534, .. })
            ));
            let f = dir.path().join("theirs.db");
            std::fs::write(&f, b"").unwrap();
            std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
            assert!(matches!(open_private(&f), Err(UnsafePath::Owner { .. })));
        }
    }

    #[test]
    fn another_programs_file_is_read_only_when_it_is_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("config.json");
        std::fs::write(&small, b"{}").unwrap();
        assert_eq!(read_capped(&small, 16).unwrap(), b"{}");
        // Larger than the cap: refused, not read into memory.
        std::fs::write(&small, vec![b' '; 64]).unwrap();
        assert!(read_capped(&small, 16).is_err());
        // A FIFO with no writer: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a path in a directory this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t0 = std::time::Instant::now();
        assert!(read_capped(&fifo, 16).is_err());
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        // A directory, and a link to the small file (followed: not ours to guard).
        assert!(read_capped(dir.path(), 16).is_err());
        std::fs::write(&small, b"{}").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&small, &link).unwrap();
        assert_eq!(read_capped(&link, 16).unwrap(), b"{}");
    }
}
