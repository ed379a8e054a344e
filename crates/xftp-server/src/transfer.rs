//! Moving file bytes over data connections: stream mode on one connection
//! (with TYPE A conversion) and striped multi-stream transfers through the
//! xftp-stripe engine. Uploads never leave a complete-looking file behind
//! when they fail (see [`Upload`]).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::SeekFrom;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use xftp_proto::ascii;
use xftp_stripe::StripeError;
use xftp_tls::Stream;

const CHUNK: usize = 256 * 1024;

/// Why a transfer failed after its data connections were open.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Reading or writing the local file failed (451).
    #[error("local file error: {0}")]
    Storage(std::io::Error),
    /// The data connection failed (426).
    #[error("data connection failed: {0}")]
    Network(std::io::Error),
    /// The upload passed `--max-upload-size` (552); nothing is kept.
    #[error("upload larger than the limit of {0} bytes")]
    TooLarge(u64),
    /// As [`TransferError::TooLarge`], for an upload written in place
    /// from offset `from` (REST+STOR): what came before the limit stays.
    #[error("upload larger than the limit of {max} bytes, written in place from byte {from}")]
    TooLargeKept {
        /// The limit.
        max: u64,
        /// Where the upload began writing.
        from: u64,
    },
    /// A striped transfer failed (426): lost connection, hole, bad block.
    #[error("{0}")]
    Stripe(#[from] StripeError),
}

/// Bytes moved so far, shared with the control task for STAT.
pub type Progress = Arc<AtomicU64>;

/// A stream-mode data connection that is reset (RST), not closed (FIN),
/// if it is dropped before [`ResetIfCut::finish`]: in stream mode a clean
/// close marks the end of the file, so a send cut short (ABOR, a stall,
/// the server stopping) must not end with one.
pub(crate) struct ResetIfCut {
    conn: Stream,
    done: bool,
}

impl ResetIfCut {
    pub(crate) fn new(conn: Stream) -> ResetIfCut {
        ResetIfCut { conn, done: false }
    }

    /// Send what is left and close cleanly: the end of the data.
    pub(crate) async fn finish(&mut self) -> std::io::Result<()> {
        self.conn.shutdown().await?;
        self.done = true;
        Ok(())
    }
}

impl std::ops::Deref for ResetIfCut {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.conn
    }
}

impl std::ops::DerefMut for ResetIfCut {
    fn deref_mut(&mut self) -> &mut Stream {
        &mut self.conn
    }
}

impl Drop for ResetIfCut {
    fn drop(&mut self) {
        if !self.done {
            // Linger 0: close(2) then sends RST and drops unsent bytes.
            let _ =
                socket2::SockRef::from(self.conn.tcp()).set_linger(Some(std::time::Duration::ZERO));
        }
    }
}

/// RETR in stream mode: `file` from `offset` to the end, on one connection.
pub async fn send_stream(
    file: File,
    offset: u64,
    conn: Stream,
    ascii_mode: bool,
    progress: Progress,
) -> Result<u64, TransferError> {
    let mut conn = ResetIfCut::new(conn);
    // sendfile(2) hands the kernel plain bytes: not under TLS.
    #[cfg(target_os = "linux")]
    if !ascii_mode && !conn.is_tls() {
        let total = sendfile_all(&file, offset, conn.tcp(), &progress).await?;
        conn.finish().await.map_err(TransferError::Network)?;
        return Ok(total);
    }
    let mut file = tokio::fs::File::from_std(file);
    if offset > 0 {
        file.seek(SeekFrom::Start(offset))
            .await
            .map_err(TransferError::Storage)?;
    }
    let mut buf = vec![0u8; CHUNK];
    let mut conv = ascii::ToWire::new();
    let mut wire = Vec::new();
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).await.map_err(TransferError::Storage)?;
        if n == 0 {
            break;
        }
        let out: &[u8] = if ascii_mode {
            wire.clear();
            conv.convert(&buf[..n], &mut wire);
            &wire
        } else {
            &buf[..n]
        };
        conn.write_all(out).await.map_err(TransferError::Network)?;
        total += out.len() as u64;
        progress.store(total, Ordering::Relaxed);
    }
    conn.finish().await.map_err(TransferError::Network)?;
    Ok(total)
}

/// Zero-copy send of `file` from `offset` to its end (Linux sendfile(2)):
/// the kernel moves page-cache pages to the socket, no user-space copy.
#[cfg(target_os = "linux")]
async fn sendfile_all(
    file: &File,
    mut offset: u64,
    conn: &tokio::net::TcpStream,
    progress: &Progress,
) -> Result<u64, TransferError> {
    use std::os::fd::AsRawFd;
    use tokio::io::Interest;
    const STEP: usize = 4 << 20;
    let mut total = 0u64;
    loop {
        conn.writable().await.map_err(TransferError::Network)?;
        let r = conn.try_io(Interest::WRITABLE, || {
            let mut off = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
            // SAFETY: both fds are open for the duration of the call and
            // `off` is a valid off_t the kernel updates.
            let n = unsafe { libc::sendfile(conn.as_raw_fd(), file.as_raw_fd(), &mut off, STEP) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as u64)
            }
        });
        match r {
            Ok(0) => return Ok(total),
            Ok(n) => {
                offset += n;
                total += n;
                progress.store(total, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return Err(TransferError::Storage(e)),
            Err(e) => return Err(TransferError::Network(e)),
        }
    }
}

/// STOR/APPE in stream mode: everything the client sends until it closes.
/// `stop` ends it early (ABOR, a stall, the client gone) as an error,
/// after the writes already handed to the file have landed: tokio's file
/// writes run in the background, and a caller rolling an append back must
/// not have one land after the truncation.
pub async fn recv_stream(
    file: File,
    offset: u64,
    conn: Stream,
    ascii_mode: bool,
    progress: Progress,
    stop: CancellationToken,
    limit: Option<u64>,
) -> Result<u64, TransferError> {
    let mut file = tokio::fs::File::from_std(file);
    let r = recv_stream_into(&mut file, offset, conn, ascii_mode, progress, stop, limit).await;
    if r.is_err() {
        let _ = file.flush().await;
    }
    r
}

async fn recv_stream_into(
    file: &mut tokio::fs::File,
    offset: u64,
    mut conn: Stream,
    ascii_mode: bool,
    progress: Progress,
    stop: CancellationToken,
    limit: Option<u64>,
) -> Result<u64, TransferError> {
    file.seek(SeekFrom::Start(offset))
        .await
        .map_err(TransferError::Storage)?;
    let mut buf = vec![0u8; CHUNK];
    let mut conv = ascii::FromWire::new();
    let mut local = Vec::new();
    let mut total = 0u64;
    loop {
        let n = tokio::select! {
            r = conn.read(&mut buf) => r.map_err(TransferError::Network)?,
            _ = stop.cancelled() => {
                return Err(TransferError::Network(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "transfer stopped",
                )));
            }
        };
        if n == 0 {
            break;
        }
        total += n as u64;
        if let Some(max) = limit.filter(|m| total > *m) {
            return Err(TransferError::TooLarge(max));
        }
        if ascii_mode {
            local.clear();
            conv.convert(&buf[..n], &mut local);
            file.write_all(&local)
                .await
                .map_err(TransferError::Storage)?;
        } else {
            file.write_all(&buf[..n])
                .await
                .map_err(TransferError::Storage)?;
        }
        progress.store(total, Ordering::Relaxed);
    }
    if ascii_mode {
        local.clear();
        conv.finish(&mut local);
        file.write_all(&local)
            .await
            .map_err(TransferError::Storage)?;
    }
    file.flush().await.map_err(TransferError::Storage)?;
    // Our side's end too: under TLS a close_notify, which clients that
    // unwrap the connection after an upload wait for (Python's ftplib
    // raised SSLEOFError on every upload without it, the file stored).
    let _ = tokio::time::timeout(CLOSE_WAIT, conn.shutdown()).await;
    Ok(total)
}

/// How long a finished upload's data connection may take to close.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// An upload in progress. Dropped without [`Upload::commit`], it undoes
/// itself: a new file's temporary is removed; an append is truncated back
/// to its old length. So an aborted or failed upload never leaves a file
/// that looks complete under its final name.
#[derive(Debug)]
pub struct Upload {
    final_path: PathBuf,
    temp: Option<PathBuf>,
    rollback_len: Option<u64>,
    /// For a write in place: the file, holding an exclusive `flock` until
    /// the upload is committed or rolled back, so that two uploads never
    /// write into one file at once (an append would overwrite the other's
    /// data, a rollback truncate it away).
    held: Option<File>,
    committed: bool,
    /// The upload created `final_path` (STOU): removed on failure, if the
    /// name still leads to this file.
    created: bool,
    /// The directory the upload writes in, held open and checked inside
    /// the root ([`crate::fs::Root::pin_parent`]): `final_path` and
    /// `temp` lead through it (`/proc/self/fd/N/NAME`), so a directory on
    /// the way renamed or swapped for a link meanwhile changes nothing.
    _dir: Option<std::os::fd::OwnedFd>,
}

/// Take the in-place writers' lock on `f`, or fail at once with
/// `WouldBlock` (450: file busy) if another upload holds it.
fn lock_exclusive(f: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor owned by `f` for the call.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "another upload is writing to this file; try again when it is done",
        ));
    }
    Err(e)
}

/// A temporary not locked and untouched for this long is stale.
const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(60);

/// Directories this process has swept of stale upload temporaries.
static SWEPT: std::sync::LazyLock<std::sync::Mutex<Swept>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(Swept::new(SWEPT_MAX)));

/// Directories [`SWEPT`] remembers at most: then it starts afresh, so a
/// server that receives trees for months does not grow with every
/// directory ever written to (a directory swept again costs one listing).
const SWEPT_MAX: usize = 4096;

/// Directories and when each was last swept, emptied when it would hold
/// more than `max`.
struct Swept {
    dirs: std::collections::HashMap<PathBuf, std::time::Instant>,
    max: usize,
}

impl Swept {
    fn new(max: usize) -> Swept {
        Swept {
            dirs: Default::default(),
            max,
        }
    }

    /// Whether `dir` is due a sweep at `now`: never swept, or last swept
    /// more than [`STALE_TEMP`] before (it is recorded as swept now).
    /// Once per life was not enough: a server restarted within a minute
    /// of a kill found the dead upload's temporary too fresh at its first
    /// upload there, and never looked again.
    fn due(&mut self, dir: &Path, now: std::time::Instant) -> bool {
        if self
            .dirs
            .get(dir)
            .is_some_and(|&at| now.duration_since(at) <= STALE_TEMP)
        {
            return false;
        }
        if self.dirs.len() >= self.max && !self.dirs.contains_key(dir) {
            self.dirs.clear();
            self.dirs.shrink_to_fit();
        }
        self.dirs.insert(dir.to_owned(), now);
        true
    }
}

/// Remove, off the async threads, the temporaries of uploads whose writer
/// is gone (a server killed mid-upload), in a directory not swept for
/// [`STALE_TEMP`] (so at most once a minute a directory, with a listing).
/// Each upload holds an exclusive lock on its temporary while it writes
/// ([`Upload::begin`]), which the kernel drops with the process.
fn sweep_once(dir: &Path) {
    let due = SWEPT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .due(dir, std::time::Instant::now());
    if !due {
        return;
    }
    let dir = dir.to_owned();
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(move || sweep_stale_temps(&dir, STALE_TEMP));
        }
        Err(_) => {
            sweep_stale_temps(&dir, STALE_TEMP);
        }
    }
}

/// The server's upload temporaries in `dir` that no one holds locked and
/// that were not written for `stale`: removed. Returns how many.
pub(crate) fn sweep_stale_temps(dir: &Path, stale: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        if !crate::fs::is_upload_temp(e.file_name().as_bytes()) {
            continue;
        }
        let p = e.path();
        let Ok(Some(f)) =
            xftp_stripe::open_regular(&p, OpenOptions::new().read(true), libc::O_NOFOLLOW)
        else {
            continue;
        };
        let old = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= stale);
        if old && lock_exclusive(&f).is_ok() && std::fs::remove_file(&p).is_ok() {
            tracing::info!(temp = %p.display(), "removed the temporary of an upload whose writer is gone");
            removed += 1;
        }
    }
    removed
}

/// Kinds of upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    /// STOR: replace or create, via a temporary file renamed on success.
    Replace,
    /// STOR after REST n > 0: write into the existing file from n (resume).
    Resume,
    /// APPE: append; rolled back to the old length on failure.
    Append,
    /// STOU: a new file, created exclusively under the name chosen and
    /// written in place (the name is announced before the data comes);
    /// removed on failure.
    Unique,
}

impl Upload {
    /// An upload written in place into `f` (at `final_path`), which it
    /// holds until committed or rolled back.
    fn in_place(
        final_path: &Path,
        f: &File,
        rollback_len: Option<u64>,
        created: bool,
    ) -> std::io::Result<Upload> {
        Ok(Upload {
            final_path: final_path.to_owned(),
            temp: None,
            rollback_len,
            held: Some(f.try_clone()?),
            committed: false,
            created,
            _dir: None,
        })
    }

    /// Open the file to write for `kind` at `final_path`; returns the file
    /// and the offset to write at.
    pub fn begin(
        root: &crate::fs::Root,
        final_path: &Path,
        kind: UploadKind,
        rest: u64,
    ) -> std::io::Result<(Upload, File, u64)> {
        use std::os::fd::AsFd;
        let (dir, name) = root
            .pin_parent(final_path)
            .map_err(crate::fs::FsError::into_io)?;
        let real_dir = final_path.parent().unwrap_or(Path::new(".")).to_owned();
        let pinned = crate::fs::proc_path(dir.as_fd()).join(name);
        let final_path = pinned.as_path();
        let (mut up, f, at) = Self::begin_in(final_path, &real_dir, kind, rest)?;
        up._dir = Some(dir);
        Ok((up, f, at))
    }

    /// [`Upload::begin`] at `final_path`, a path through the pinned
    /// directory (`real_dir` is its name, for the sweep of stale
    /// temporaries, which runs later).
    fn begin_in(
        final_path: &Path,
        real_dir: &Path,
        kind: UploadKind,
        rest: u64,
    ) -> std::io::Result<(Upload, File, u64)> {
        match kind {
            UploadKind::Replace => {
                let dir = final_path.parent().unwrap_or(Path::new("."));
                let name = final_path.file_name().map_or(&[][..], |n| n.as_bytes());
                // ".NAME.xftp-part-TAG" must fit in a file name (255
                // bytes), as NAME alone does: keep the start of NAME.
                let name = &name[..name.len().min(255 - 1 - ".xftp-part-".len() - 16)];
                // A file replaced keeps its permissions (a private file must
                // not become readable by all), from the temporary's
                // creation on, so the upload is never readable by more
                // users than the file it replaces; hard links to the old
                // one keep the old content, as with any atomic replace.
                let keep = std::fs::symlink_metadata(final_path)
                    .ok()
                    .filter(|md| md.is_file())
                    .map(|md| {
                        use std::os::unix::fs::PermissionsExt;
                        md.permissions().mode() & 0o777
                    });
                sweep_once(real_dir);
                for _ in 0..16 {
                    let tag: u64 = rand::random();
                    let mut temp = Vec::with_capacity(255);
                    temp.push(b'.');
                    temp.extend_from_slice(name);
                    temp.extend_from_slice(format!(".xftp-part-{tag:016x}").as_bytes());
                    let temp = dir.join(OsStr::from_bytes(&temp));
                    // Readable too: a framed upload in the endgame reads
                    // back the first copy of a range to compare a second.
                    match OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .mode(keep.unwrap_or(0o644))
                        .open(&temp)
                    {
                        Ok(f) => {
                            // Held while the upload writes: a temporary no
                            // one holds is a dead upload's
                            // (`sweep_stale_temps`). Best effort: where
                            // locks are not supported, nothing is swept.
                            let _ = lock_exclusive(&f);
                            // The umask narrowed the mode at creation; the
                            // replaced file's is taken exactly.
                            if let Some(mode) = keep {
                                use std::os::unix::fs::PermissionsExt;
                                let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
                            }
                            return Ok((
                                Upload {
                                    final_path: final_path.to_owned(),
                                    temp: Some(temp),
                                    rollback_len: None,
                                    held: None,
                                    committed: false,
                                    created: false,
                                    _dir: None,
                                },
                                f,
                                0,
                            ));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(std::io::Error::other("cannot create a temporary file"))
            }
            // `final_path` has its links resolved (`Root::in_place`); a link
            // put there since is refused, not followed.
            UploadKind::Resume => {
                let f = crate::fs::open_plain(
                    final_path,
                    OpenOptions::new().write(true),
                    libc::O_NOFOLLOW,
                )?;
                lock_exclusive(&f)?;
                // An offset past the largest file the file system takes
                // (2^44 on ext4, 2^63 - 1 on tmpfs): refused now, before
                // the 150, not when the first write fails with EINVAL.
                if let Err(e) = std::io::Seek::seek(&mut &f, std::io::SeekFrom::Start(rest)) {
                    return Err(if e.raw_os_error() == Some(libc::EINVAL) {
                        std::io::Error::other(format!(
                            "REST {rest} is past the largest file this file system holds"
                        ))
                    } else {
                        e
                    });
                }
                Ok((Upload::in_place(final_path, &f, None, false)?, f, rest))
            }
            UploadKind::Unique => {
                // O_EXCL: fails on any existing name, a link included.
                // Readable for the endgame, as above.
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(final_path)?;
                // Held as APPE and REST+STOR hold theirs: none of them
                // writes into it meanwhile (its failure removes it).
                lock_exclusive(&f)?;
                Ok((Upload::in_place(final_path, &f, None, true)?, f, 0))
            }
            UploadKind::Append => {
                let f = crate::fs::open_plain(
                    final_path,
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .mode(0o644),
                    libc::O_NOFOLLOW,
                )?;
                // The length to roll back to is read under the lock: an
                // append that finished just before is part of it.
                lock_exclusive(&f)?;
                let len = f.metadata()?.len();
                Ok((Upload::in_place(final_path, &f, Some(len), false)?, f, len))
            }
        }
    }

    /// The transfer succeeded: move the temporary into place.
    pub fn commit(mut self) -> std::io::Result<()> {
        if let Some(temp) = self.temp.take() {
            if let Err(e) = std::fs::rename(&temp, &self.final_path) {
                let _ = std::fs::remove_file(&temp);
                self.committed = true;
                return Err(e);
            }
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Some(temp) = &self.temp {
            let _ = std::fs::remove_file(temp);
        }
        // Through the locked file itself: the name may lead elsewhere by
        // now, and the lock keeps other uploads out until this is done.
        if let (Some(len), Some(f)) = (self.rollback_len, &self.held) {
            let _ = f.set_len(len);
        }
        if let (true, Some(f)) = (self.created, &self.held) {
            use std::os::unix::fs::MetadataExt;
            let ours = match (f.metadata(), std::fs::symlink_metadata(&self.final_path)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if ours {
                let _ = std::fs::remove_file(&self.final_path);
            }
        }
    }
}

#[cfg(test)]
mod temp_tests {
    use super::*;

    #[test]
    fn the_swept_set_is_bounded_and_a_directory_is_swept_again_later() {
        let mut s = Swept::new(3);
        let t = std::time::Instant::now();
        let p = |i: u32| PathBuf::from(format!("/d{i}"));
        assert!(s.due(&p(1), t) && s.due(&p(2), t) && s.due(&p(3), t));
        assert!(!s.due(&p(2), t), "not again so soon");
        // A fourth empties the set: each is swept once more, later.
        assert!(s.due(&p(4), t));
        assert_eq!(s.dirs.len(), 1);
        assert!(!s.due(&p(4), t));
        assert!(s.due(&p(1), t));
        // Past STALE_TEMP, a directory is due again: a temporary that was
        // too fresh at the first sweep is old enough now.
        let later = t + STALE_TEMP + std::time::Duration::from_secs(1);
        assert!(!s.due(&p(4), t + STALE_TEMP / 2));
        assert!(s.due(&p(4), later));
        assert!(!s.due(&p(4), later));
    }

    #[test]
    fn only_the_temporaries_of_dead_uploads_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let dead = d.join(".a.bin.xftp-part-00112233aabbccdd");
        let live = d.join(".b.bin.xftp-part-0123456789abcdef");
        let partial = d.join(".c.bin.xftp-part");
        let other = d.join("d.bin");
        for p in [&dead, &live, &partial, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        // A running upload holds its temporary locked.
        let held = File::open(&live).unwrap();
        lock_exclusive(&held).unwrap();
        // Written just now: not stale yet.
        assert_eq!(sweep_stale_temps(d, std::time::Duration::from_secs(60)), 0);
        assert_eq!(sweep_stale_temps(d, std::time::Duration::ZERO), 1);
        assert!(!dead.exists());
        assert!(live.exists() && partial.exists() && other.exists());
        drop(held);
        assert_eq!(sweep_stale_temps(d, std::time::Duration::ZERO), 1);
        assert!(!live.exists());
        assert!(crate::fs::is_upload_temp(b".x.xftp-part-0123456789abcdef"));
        assert!(!crate::fs::is_upload_temp(b".x.xftp-part-0123456789abcdeg"));
        assert!(!crate::fs::is_upload_temp(b"x.xftp-part-0123456789abcdef"));
        assert!(!crate::fs::is_upload_temp(b".xftp-part-0123456789abcdef"));
    }
}
