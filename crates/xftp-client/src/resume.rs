//! Resumable downloads (`-c`): the partial file beside the target and the
//! record of which byte ranges it holds.
//!
//! `dir/.NAME.xftp-part` holds the data, `dir/.NAME.xftp-part.ranges` (JSON)
//! the ranges known to be on disk, with the source's size and modification
//! time. The record is rewritten every half second while data arrives: the
//! ranges are read first, then the file is synced, then the record is
//! written to a temporary and renamed over the old one, so a record never
//! names a byte that is not on disk, whenever the client dies. A resumed
//! transfer asks only for the missing ranges (`REST a-b,...` in MODE E,
//! `REST offset` in stream mode), so holes anywhere are filled, not only a
//! tail. Neither file has the final name until the whole file arrived.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xftp_stripe::ranges::RangeSet;
use xftp_stripe::RecordedFile;

/// How often the record is rewritten while data arrives.
pub(crate) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// What identifies the source: a resume against a different size or
/// modification time would splice two versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceMeta {
    /// The server's SIZE.
    pub size: u64,
    /// The server's MDTM (`YYYYMMDDHHMMSS`), when it answers.
    pub mdtm: Option<String>,
}

impl SourceMeta {
    /// The same source: the same size and time. A time with a fraction of
    /// a second (an xftp server's MDTM) against one without (a partial
    /// begun from an older server, or a server that dropped it) is
    /// compared to the second.
    pub fn same_as(&self, other: &SourceMeta) -> bool {
        let whole = |t: &str| t.split('.').next().unwrap_or(t).to_owned();
        self.size == other.size
            && match (&self.mdtm, &other.mdtm) {
                (Some(a), Some(b)) if a.contains('.') != b.contains('.') => whole(a) == whole(b),
                (a, b) => a == b,
            }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    version: u32,
    /// `host:port/path`, never a password.
    source: String,
    #[serde(flatten)]
    meta: SourceMeta,
    ranges: Vec<(u64, u64)>,
}

/// A resumable download in progress.
#[derive(Debug)]
pub(crate) struct Partial {
    pub path: PathBuf,
    record: PathBuf,
    source: String,
    pub meta: SourceMeta,
    /// Present when the run began.
    pub had: RangeSet,
    pub rec: Arc<RecordedFile>,
    /// Held while the record is written; true once it was removed. A
    /// checkpoint in a blocking thread outlives the abort of its task,
    /// and wrote a stale record after the file was complete, renamed
    /// and its record removed: every later `-c` of a new version then
    /// failed on it.
    done: Arc<std::sync::Mutex<bool>>,
}

/// Why a resume cannot go on.
#[derive(Debug)]
pub(crate) enum ResumeError {
    Io(PathBuf, io::Error),
    Changed {
        was: SourceMeta,
        now: SourceMeta,
        partial: PathBuf,
    },
    /// The partial was begun from another remote file (`was`).
    OtherSource {
        was: String,
        partial: PathBuf,
    },
}

/// Where `-c` keeps the partial download of `target`:
/// `dir/.NAME.xftp-part` (its record of ranges: the same name + `.ranges`;
/// a long NAME shortened by [`xftp_proto::name::part_stem`]).
pub fn partial_path(target: &Path) -> PathBuf {
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "download".into());
    let name = xftp_proto::name::part_stem(&name);
    dir.join(format!(".{name}.xftp-part"))
}

/// The way on from a download's partial of another version of its
/// source (`ClientError::SourceChanged`): every later `-c` run is refused
/// until it goes.
pub fn remove_partial_fix(partial: &Path) -> String {
    format!(
        "remove {} (and its .ranges file) to download the new version from the start",
        partial.display()
    )
}

/// `path`, a regular file (not through a link) that no running transfer
/// holds: opened and locked, or `None`.
pub(crate) fn unlocked(path: &Path) -> Option<std::fs::File> {
    let f = xftp_stripe::open_regular(
        path,
        std::fs::OpenOptions::new().read(true),
        libc::O_NOFOLLOW,
    )
    .ok()??;
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the lock goes with `f`.
    (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0).then_some(f)
}

/// A partial of `target` that an earlier `-c` run left, now that a whole
/// copy is in place: removed with its record (unless a run holds it).
/// Kept, it would refuse every later `-c` once the source changed (as it
/// has, for the whole copy to be fetched) and take the disk meanwhile.
pub(crate) fn drop_superseded(target: &Path) {
    let path = partial_path(target);
    // Held until both are gone.
    let Some(_held) = unlocked(&path) else {
        return;
    };
    let _ = std::fs::remove_file(record_path(&path));
    if std::fs::remove_file(&path).is_ok() {
        tracing::info!(
            "{}: removed the partial download of an earlier -c run (the whole file is in place now)",
            path.display()
        );
    }
}

fn record_path(partial: &Path) -> PathBuf {
    let mut p = partial.as_os_str().to_owned();
    p.push(".ranges");
    PathBuf::from(p)
}

impl Partial {
    /// Open the partial of `target` (created if missing) and check its
    /// record against the source as it is now.
    pub(crate) fn open(
        target: &Path,
        source: &str,
        now: SourceMeta,
    ) -> Result<Partial, ResumeError> {
        let path = partial_path(target);
        let record = record_path(&path);
        // Temporaries of the record that a killed run left behind.
        xftp_stripe::remove_stale_temps(&record);
        let io_err = |p: &Path| {
            let p = p.to_owned();
            move |e| ResumeError::Io(p, e)
        };
        // A record without its partial names bytes that are not there (a
        // run that completed and was killed as its record went): stale.
        let existed = path.symlink_metadata().is_ok();
        // Never through a link, nor into a FIFO or a device, put in the
        // partial's place (in a directory others may write to): O_NOFOLLOW
        // and O_NONBLOCK, and a plain file checked on the open descriptor.
        let file = xftp_stripe::open_regular(
            &path,
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
            libc::O_NOFOLLOW,
        )
        .map_err(io_err(&path))?
        .ok_or_else(|| {
            ResumeError::Io(
                path.clone(),
                std::io::Error::other("not a regular file: remove it and run again"),
            )
        })?;
        // One run at a time: a second `-c` of the same target would write
        // the same partial and rename it from under the first.
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor; the lock lives as long as `file`.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                return Err(ResumeError::Io(
                    path.clone(),
                    if e.kind() == io::ErrorKind::WouldBlock {
                        io::Error::other(
                            "another xftp is resuming this download now: wait for it to end",
                        )
                    } else {
                        e
                    },
                ));
            }
        }
        let md = file.metadata().map_err(io_err(&path))?;
        let on_disk = md.len();
        let mut had = RangeSet::new();
        // Neither through a link nor from a FIFO (whose open would wait).
        match xftp_stripe::read_regular(&record, libc::O_NOFOLLOW).and_then(|b| {
            b.ok_or_else(|| io::Error::other("not a regular file: remove it and run again"))
        }) {
            Ok(_) if !existed => {
                tracing::info!(
                    "{}: a resume record without its partial; removed",
                    record.display()
                );
                let _ = std::fs::remove_file(&record);
            }
            Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                Ok(r) if r.version == 1 => {
                    // Another file's partial (the same local name for
                    // another remote path) of the same size and time
                    // would be spliced with this one. The path only: the
                    // same server may be reached at another address.
                    let path_of = |s: &str| s.split_once('/').map(|(_, p)| p.to_owned());
                    if path_of(&r.source) != path_of(source) {
                        return Err(ResumeError::OtherSource {
                            was: r.source,
                            partial: path,
                        });
                    }
                    if !r.meta.same_as(&now) {
                        return Err(ResumeError::Changed {
                            was: r.meta,
                            now,
                            partial: path,
                        });
                    }
                    for (a, b) in r.ranges {
                        // Never trust a range past what the file holds.
                        had.union(a.min(on_disk), b.min(on_disk));
                    }
                }
                _ => tracing::warn!(
                    "{}: unreadable resume record, starting over",
                    record.display()
                ),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ResumeError::Io(record, e)),
        }
        // Bytes past the source's end are no part of it (a partial of a
        // larger earlier version whose record was lost, a damaged one):
        // left, they would be renamed into place with the file.
        if on_disk > now.size {
            file.set_len(now.size).map_err(io_err(&path))?;
        }
        let had = had.clamped(now.size);
        Ok(Partial {
            rec: Arc::new(RecordedFile::new(file, had.clone())),
            path,
            record,
            source: source.to_owned(),
            meta: now,
            had,
            done: Arc::default(),
        })
    }

    /// Bytes already in place when this run began.
    pub(crate) fn already(&self) -> u64 {
        self.had.covered()
    }

    /// Make what was recorded durable and say so in the record.
    pub(crate) fn checkpoint(&self) -> io::Result<()> {
        checkpoint(
            &self.done,
            &self.rec,
            &self.record,
            &self.source,
            &self.meta,
        )
    }

    /// A task that checkpoints every [`CHECKPOINT_EVERY`] until aborted.
    pub(crate) fn spawn_checkpoints(&self) -> tokio::task::JoinHandle<()> {
        let (done, rec, record, source, meta) = (
            self.done.clone(),
            self.rec.clone(),
            self.record.clone(),
            self.source.clone(),
            self.meta.clone(),
        );
        tokio::spawn(async move {
            let mut t = tokio::time::interval(CHECKPOINT_EVERY);
            t.tick().await;
            loop {
                t.tick().await;
                let (done, rec, record, source, meta) = (
                    done.clone(),
                    rec.clone(),
                    record.clone(),
                    source.clone(),
                    meta.clone(),
                );
                let r = tokio::task::spawn_blocking(move || {
                    checkpoint(&done, &rec, &record, &source, &meta)
                })
                .await;
                if let Ok(Err(e)) = r {
                    tracing::warn!("cannot write the resume record: {e}");
                }
            }
        })
    }

    /// The copy is not the source's (a checksum that differs): the
    /// partial and its record go, so that no later `-c` takes it for
    /// complete.
    pub(crate) fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
        self.remove_record();
    }

    /// What this run wrote is not the source's (the server sent more than
    /// the file holds from where it was asked to start: it ignored REST):
    /// the record goes back to what was there before the run, and no
    /// checkpoint writes it again.
    pub(crate) fn roll_back(&self) -> io::Result<()> {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        let r = Record {
            version: 1,
            source: self.source.clone(),
            meta: self.meta.clone(),
            ranges: self.had.iter().collect(),
        };
        let text = serde_json::to_vec(&r).map_err(io::Error::other)?;
        xftp_stripe::write_atomic(&self.record, &text)
    }

    /// The whole file is here: remove the record (the caller renames the
    /// data into place).
    pub(crate) fn remove_record(&self) {
        // After a checkpoint under way, and before any later one.
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        let _ = std::fs::remove_file(&self.record);
        // And what a run killed while writing it left.
        xftp_stripe::remove_stale_temps(&self.record);
    }
}

fn checkpoint(
    done: &std::sync::Mutex<bool>,
    rec: &RecordedFile,
    record: &Path,
    source: &str,
    meta: &SourceMeta,
) -> io::Result<()> {
    let done = done.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return Ok(());
    }
    let ranges: Vec<(u64, u64)> = rec.sync_ranges()?.iter().collect();
    let r = Record {
        version: 1,
        source: source.to_owned(),
        meta: meta.clone(),
        ranges,
    };
    let text = serde_json::to_vec(&r).map_err(io::Error::other)?;
    xftp_stripe::write_atomic(record, &text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xftp_stripe::WriteAt;

    fn meta(size: u64) -> SourceMeta {
        SourceMeta {
            size,
            mdtm: Some("20261124120000".into()),
        }
    }

    /// A checkpoint that comes after the record was removed (one still
    /// under way in a blocking thread when the transfer completed) writes
    /// nothing: a stale record beside the complete file made every later
    /// `-c` of a new version fail.
    #[test]
    fn no_checkpoint_after_the_record_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let p = Partial::open(&target, "h:21/f.bin", meta(10)).unwrap();
        p.rec.write_at(&[1u8; 10], 0).unwrap();
        p.checkpoint().unwrap();
        assert!(p.record.exists());
        p.remove_record();
        assert!(!p.record.exists());
        p.checkpoint().unwrap();
        assert!(!p.record.exists(), "a stale record came back");
        // And one left anyway (by an older build), with no partial beside
        // it, names nothing: a changed source is no reason to refuse.
        drop(p);
        std::fs::rename(partial_path(&target), &target).unwrap();
        std::fs::write(
            record_path(&partial_path(&target)),
            br#"{"version":1,"source":"h:21/f.bin","size":10,"mdtm":"20261124120000","ranges":[[0,9]]}"#,
        )
        .unwrap();
        let p = Partial::open(&target, "h:21/f.bin", meta(7)).unwrap();
        assert_eq!(p.already(), 0);
    }

    #[test]
    fn a_record_survives_and_a_changed_source_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let p = Partial::open(&target, "h:21/f.bin", meta(100)).unwrap();
        assert_eq!(p.already(), 0);
        p.rec.write_at(&[1u8; 10], 20).unwrap();
        p.rec.write_at(&[2u8; 5], 90).unwrap();
        p.checkpoint().unwrap();
        drop(p);
        let p = Partial::open(&target, "h:21/f.bin", meta(100)).unwrap();
        assert_eq!(p.had.iter().collect::<Vec<_>>(), vec![(20, 30), (90, 95)]);
        assert_eq!(p.already(), 15);
        drop(p);
        match Partial::open(&target, "h:21/f.bin", meta(101)) {
            Err(ResumeError::Changed { was, now, .. }) => {
                assert_eq!((was.size, now.size), (100, 101));
            }
            other => panic!("{other:?}"),
        }
        let mut m = meta(100);
        m.mdtm = Some("20261124120001".into());
        assert!(matches!(
            Partial::open(&target, "h:21/f.bin", m),
            Err(ResumeError::Changed { .. })
        ));
        // Another remote file of the same size and time into the same
        // local name; the same path at another address is the same file.
        assert!(matches!(
            Partial::open(&target, "h:21/other.bin", meta(100)),
            Err(ResumeError::OtherSource { .. })
        ));
        assert!(Partial::open(&target, "[::1]:21/f.bin", meta(100)).is_ok());
    }

    #[test]
    fn times_differ_by_their_milliseconds_where_both_have_them() {
        let at = |t: &str| SourceMeta {
            size: 1,
            mdtm: Some(t.into()),
        };
        let (a, b) = (at("20261124120000.100"), at("20261124120000.900"));
        assert!(!a.same_as(&b), "rewritten within the second");
        assert!(a.same_as(&at("20261124120000.100")));
        // One side without the fraction (an older server's partial): to
        // the second.
        assert!(a.same_as(&at("20261124120000")));
        assert!(!a.same_as(&at("20261124120001")));
        let none = SourceMeta {
            size: 1,
            mdtm: None,
        };
        assert!(none.same_as(&none.clone()) && !none.same_as(&a));
    }

    #[test]
    fn a_partial_longer_than_the_source_is_cut_to_its_size() {
        // An earlier, larger version's partial whose record was lost (or
        // is damaged): its tail must not go into place with the file.
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f.bin");
        let path = partial_path(&target);
        std::fs::write(&path, vec![9u8; 300]).unwrap();
        let p = Partial::open(&target, "h:21/f.bin", meta(100)).unwrap();
        assert_eq!(p.already(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
        drop(p);
        // With a record of the larger file too (garbage now): the same.
        std::fs::write(&path, vec![9u8; 300]).unwrap();
        std::fs::write(record_path(&path), b"garbage").unwrap();
        let p = Partial::open(&target, "h:21/f.bin", meta(100)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
        p.discard();
        assert!(!path.exists() && !record_path(&path).exists());
    }

    #[test]
    fn one_run_at_a_time_resumes_a_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        let first = Partial::open(&target, "s", meta(10)).unwrap();
        match Partial::open(&target, "s", meta(10)) {
            Err(ResumeError::Io(p, e)) => {
                assert_eq!(p, partial_path(&target));
                assert!(e.to_string().contains("another xftp"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        assert!(Partial::open(&target, "s", meta(10)).is_ok());
    }

    #[test]
    fn a_partial_is_never_opened_through_a_link_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let target = dir.path().join("f");
        std::os::unix::fs::symlink(&victim, partial_path(&target)).unwrap();
        assert!(matches!(
            Partial::open(&target, "s", meta(10)),
            Err(ResumeError::Io(..))
        ));
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let target = dir.path().join("g");
        let c =
            std::ffi::CString::new(partial_path(&target).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        match Partial::open(&target, "s", meta(10)) {
            Err(ResumeError::Io(_, e)) => assert!(e.to_string().contains("not a regular file")),
            other => panic!("{other:?}"),
        }
        // A FIFO in the record's place: refused, not waited on.
        let target = dir.path().join("h");
        let rec = record_path(&partial_path(&target));
        let c = std::ffi::CString::new(rec.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        match Partial::open(&target, "s", meta(10)) {
            Err(ResumeError::Io(p, e)) => {
                assert_eq!(p, rec);
                assert!(e.to_string().contains("not a regular file"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn temporaries_of_killed_runs_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        let rec = record_path(&partial_path(&target));
        let name = |pid: u32| {
            let mut n = rec.as_os_str().to_owned();
            n.push(format!(".{pid}-3.new"));
            std::path::PathBuf::from(n)
        };
        // No process has pid i32::MAX - 1 (pid_max is at most 2^22).
        let dead = name(i32::MAX as u32 - 1);
        let live = name(std::process::id());
        let other = dir.path().join("t.something.new");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        let p = Partial::open(&target, "s", meta(10)).unwrap();
        assert!(!dead.exists());
        assert!(live.exists() && other.exists());
        p.remove_record();
        assert!(live.exists());
    }

    #[test]
    fn ranges_past_the_data_on_disk_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("g");
        let p = Partial::open(&target, "s", meta(1000)).unwrap();
        p.rec.write_at(&[1u8; 100], 0).unwrap();
        p.rec.wrote(100, 400); // claimed but never written
        p.checkpoint().unwrap();
        drop(p);
        let p = Partial::open(&target, "s", meta(1000)).unwrap();
        assert_eq!(p.had.iter().collect::<Vec<_>>(), vec![(0, 100)]);
    }
}
