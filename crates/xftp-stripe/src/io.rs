//! Positional storage traits.

use std::io;
use std::sync::Mutex;

use crate::Pipe;

/// Read at an absolute offset without moving any shared cursor, so that
/// many connection tasks can read one file concurrently. Blocking: the
/// engine calls it from `spawn_blocking`.
pub trait ReadAt: Send + Sync + 'static {
    /// Read up to `buf.len()` bytes at `offset`; `Ok(0)` means end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The file descriptor behind this source, if it is a file the kernel
    /// can send from directly (`sendfile(2)`, [`crate::DataSocket`]).
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// Write at an absolute offset (records arrive in any order). Blocking:
/// the engine calls it from `spawn_blocking`.
pub trait WriteAt: Send + Sync + 'static {
    /// Write all of `buf` at `offset`, extending the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Read back `buf.len()` bytes written before at `offset`: how a
    /// receiver that takes duplicate records (the endgame) checks a second
    /// copy against the first. `Unsupported` where the storage cannot.
    fn read_back(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let _ = (buf, offset);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Write the `len` bytes `pipe` holds at `offset`: a file takes them
    /// straight from the pipe ([`Pipe::drain_to`]); by default they are
    /// read out into a buffer and written with [`write_at`](Self::write_at).
    fn write_from_pipe(&self, pipe: &Pipe, len: usize, offset: u64) -> io::Result<()> {
        let mut buf = vec![0u8; len];
        pipe.read_exact(&mut buf)?;
        self.write_at(&buf, offset)
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }

    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self))
    }
}

impl WriteAt for std::fs::File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn write_from_pipe(&self, pipe: &Pipe, len: usize, offset: u64) -> io::Result<()> {
        pipe.drain_to(std::os::fd::AsFd::as_fd(self), Some(offset), len)
    }

    fn read_back(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// A file written at any offset that remembers which ranges were
/// written: the partial file of a resumable transfer.
#[derive(Debug)]
pub struct RecordedFile {
    file: std::fs::File,
    ranges: Mutex<crate::ranges::RangeSet>,
}

impl RecordedFile {
    /// `file`, of which `have` is already written.
    pub fn new(file: std::fs::File, have: crate::ranges::RangeSet) -> Self {
        RecordedFile {
            file,
            ranges: Mutex::new(have),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::ranges::RangeSet> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ranges written so far (not necessarily on disk yet).
    pub fn ranges(&self) -> crate::ranges::RangeSet {
        self.lock().clone()
    }

    /// Record bytes written through another handle of the same file.
    pub fn wrote(&self, offset: u64, len: u64) {
        self.lock().union(offset, offset.saturating_add(len));
    }

    /// The ranges on disk: read the ranges, then sync the file, so every
    /// range returned was written before the sync.
    pub fn sync_ranges(&self) -> io::Result<crate::ranges::RangeSet> {
        let r = self.ranges();
        self.file.sync_data()?;
        Ok(r)
    }
}

impl WriteAt for RecordedFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)?;
        self.wrote(offset, buf.len() as u64);
        Ok(())
    }

    fn write_from_pipe(&self, pipe: &Pipe, len: usize, offset: u64) -> io::Result<()> {
        pipe.drain_to(std::os::fd::AsFd::as_fd(&self.file), Some(offset), len)?;
        self.wrote(offset, len as u64);
        Ok(())
    }

    fn read_back(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
}

/// Open `p` only if it is a regular file (`Ok(None)` if it is anything
/// else), without ever blocking: opening a FIFO otherwise waits for its
/// other end. `O_NONBLOCK` makes the open return at once, the type is
/// checked on the open descriptor, and the flag is cleared again for the
/// file's reads and writes. `flags` are further open flags (`O_NOFOLLOW`):
/// set here, since `custom_flags` replaces, not adds.
pub fn open_regular(
    p: &std::path::Path,
    opts: &mut std::fs::OpenOptions,
    flags: i32,
) -> io::Result<Option<std::fs::File>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // Looked at first, so that a device is not even opened (an open can
    // act: a tape rewinds, a modem line hangs up); checked again on the
    // descriptor, against a swap between the two.
    let before = if flags & libc::O_NOFOLLOW != 0 {
        std::fs::symlink_metadata(p)
    } else {
        std::fs::metadata(p)
    };
    if before.is_ok_and(|m| !m.is_file()) {
        return Ok(None);
    }
    let f = opts.custom_flags(flags | libc::O_NONBLOCK).open(p)?;
    if !f.metadata()?.is_file() {
        return Ok(None);
    }
    // SAFETY: fcntl on a descriptor owned by `f` for the call.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(Some(f))
}

/// A file as it was when a transfer of it began, to tell at the end
/// whether it was written meanwhile (its size or modification time
/// changed): read through a duplicate of the transfer's descriptor, so
/// it is the same file whatever its name is now.
#[derive(Debug)]
pub struct FileStamp {
    file: Option<std::fs::File>,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    /// `file` now, `len` bytes long as the transfer took it.
    pub fn new(file: &std::fs::File, len: u64) -> FileStamp {
        FileStamp {
            file: file.try_clone().ok(),
            len,
            modified: file.metadata().ok().and_then(|m| m.modified().ok()),
        }
    }

    /// Written since [`new`](Self::new) (false where it cannot be told).
    pub fn changed(&self) -> bool {
        self.file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|now| now.len() != self.len || now.modified().ok() != self.modified)
    }
}

/// The whole of `p` if it is a regular file (`flags` as for
/// [`open_regular`]), `Ok(None)` if it is something else: a small record
/// read this way cannot hang on a FIFO left in its place.
pub fn read_regular(p: &std::path::Path, flags: i32) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let Some(mut f) = open_regular(p, std::fs::OpenOptions::new().read(true), flags)? else {
        return Ok(None);
    };
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(Some(v))
}

/// Whether an error's text (`io::Error`'s display, which ends in
/// "(os error N)") names a full file system (ENOSPC) or a used-up quota
/// (EDQUOT): FTP's 452, not a broken connection.
pub fn names_out_of_space(text: &str) -> bool {
    [libc::ENOSPC, libc::EDQUOT]
        .iter()
        .any(|e| text.contains(&format!("(os error {e})")))
}

/// Remove the temporaries [`write_atomic`] left beside `path` when their
/// process was killed between writing and renaming (each has a name of
/// its own: `path.PID-N.new`). Those of a process still running are left:
/// it may be about to rename one.
pub fn remove_stale_temps(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut prefix = name.as_bytes().to_vec();
    prefix.push(b'.');
    for e in entries.flatten() {
        let f = e.file_name();
        let Some(tag) = f
            .as_bytes()
            .strip_prefix(&prefix[..])
            .and_then(|r| r.strip_suffix(b".new"))
            .and_then(|r| std::str::from_utf8(r).ok())
        else {
            continue;
        };
        let Some(pid) = tag
            .split_once('-')
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .and_then(|(p, _)| p.parse::<i32>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        if pid as u32 != std::process::id() && !process_exists(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether process `pid` (> 0) exists: signal 0 checks without sending.
fn process_exists(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; pid is positive, so it
    // names one process, never a group.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Write `bytes` to `path` durably and atomically: a temporary beside it,
/// synced, renamed over it.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_mode(path, bytes, 0o666)
}

/// [`write_atomic`], the file created with `mode` (less the umask) from
/// the start: 0o600 keeps it from ever being readable by others.
pub fn write_atomic_mode(path: &std::path::Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_atomic_inner(path, bytes, mode, None)
}

/// [`write_atomic_mode`], with `prepare` run on the temporary once it is
/// written and before it is renamed into place (its owner, its final
/// mode): the file never shows under `path` without them.
pub fn write_atomic_with(
    path: &std::path::Path,
    bytes: &[u8],
    mode: u32,
    prepare: impl FnOnce(&std::fs::File) -> io::Result<()>,
) -> io::Result<()> {
    write_atomic_inner(path, bytes, mode, Some(Box::new(prepare)))
}

/// The prepared file's metadata is synced with its data (`sync_all`);
/// otherwise the data alone (`sync_data`: records rewritten every half
/// second need no more).
#[allow(clippy::type_complexity)]
fn write_atomic_inner<'a>(
    path: &std::path::Path,
    bytes: &[u8],
    mode: u32,
    prepare: Option<Box<dyn FnOnce(&std::fs::File) -> io::Result<()> + 'a>>,
) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A new file of a name of its own (O_EXCL: never one already there,
    // nor a link put in its place), so that two writers of one record
    // never write into, or rename, each other's temporary.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}-{n}.new", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        match prepare {
            Some(p) => {
                p(&f)?;
                f.sync_all()?;
            }
            None => f.sync_data()?,
        }
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// An in-memory file (tests, examples, small buffers).
#[derive(Debug, Default)]
pub struct MemFile(Mutex<Vec<u8>>);

impl MemFile {
    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic while holding this lock leaves plain bytes behind: usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl From<Vec<u8>> for MemFile {
    fn from(v: Vec<u8>) -> Self {
        Self(Mutex::new(v))
    }
}

impl ReadAt for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let v = self.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
        let n = buf.len().min(v.len() - start);
        buf[..n].copy_from_slice(&v[start..start + n]);
        Ok(n)
    }
}

impl WriteAt for MemFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut v = self.lock();
        let start = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let end = start
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        if v.len() < end {
            v.resize(end, 0);
        }
        v[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn read_back(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let v = self.lock();
        let start = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| v.get(start..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_regular_files_are_opened_and_others_are_not_even_tried() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"data").unwrap();
        let read = || {
            let mut o = std::fs::OpenOptions::new();
            o.read(true);
            o
        };
        assert!(super::open_regular(&f, &mut read(), 0).unwrap().is_some());
        // A FIFO opened for writing with no reader fails (ENXIO) when it
        // is opened at all: it is turned away before.
        let fifo = dir.path().join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut w = std::fs::OpenOptions::new();
        w.write(true);
        assert!(super::open_regular(&fifo, &mut w, 0).unwrap().is_none());
        assert!(super::open_regular(dir.path(), &mut read(), 0)
            .unwrap()
            .is_none());
        // Through a link only without O_NOFOLLOW.
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(super::open_regular(&link, &mut read(), 0)
            .unwrap()
            .is_some());
        assert!(super::open_regular(&link, &mut read(), libc::O_NOFOLLOW)
            .unwrap()
            .is_none());
        assert_eq!(super::read_regular(&f, 0).unwrap().unwrap(), b"data");
        assert!(super::read_regular(&fifo, 0).unwrap().is_none());
    }

    #[test]
    fn write_atomic_never_writes_through_a_link_left_in_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let path = dir.path().join("rec");
        super::write_atomic(&path, b"record").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"record");
        // Links at the names the next temporaries could take are refused
        // (O_EXCL), never written through.
        let next: Vec<_> = (0..64)
            .map(|n| {
                let mut t = path.as_os_str().to_owned();
                t.push(format!(".{}-{n}.new", std::process::id()));
                std::path::PathBuf::from(t)
            })
            .collect();
        for t in &next {
            let _ = std::os::unix::fs::symlink(&victim, t);
        }
        let r = super::write_atomic(&path, b"second");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        match r {
            Ok(()) => assert_eq!(std::fs::read(&path).unwrap(), b"second"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists),
        }
        for t in &next {
            let _ = std::fs::remove_file(t);
        }
        // Writers at once each rename a whole record of their own.
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let path = &path;
                s.spawn(move || super::write_atomic(path, &[i; 4096]).unwrap());
            }
        });
        let last = std::fs::read(&path).unwrap();
        assert!(last.len() == 4096 && last.iter().all(|&b| b == last[0]));
    }
}
