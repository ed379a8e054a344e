//! Resumable uploads (`SITE RESUMABLE`): the partial file is written in
//! place and kept on failure, with a record beside it (`NAME.ranges`) of
//! the byte ranges on disk and of the source's size and modification time
//! as the client announced them. The record is rewritten every half
//! second: the ranges are read, then the file synced, then the record
//! replaced atomically, so it never names a byte that is not on disk.
//! `SITE RANGES NAME` reads it back; `REST a-b,...` before `STOR` sends
//! only the rest.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use xftp_stripe::ranges::RangeSet;
use xftp_stripe::RecordedFile;

/// How often the record is rewritten while data arrives.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a newer upload of a partial waits for an older one to let go.
pub const TAKE_OVER_WAIT: Duration = Duration::from_secs(10);

/// The source as the client describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, seconds since the epoch.
    pub mtime: i64,
}

/// `NAME.ranges` beside `NAME`.
pub fn record_path(partial: &Path) -> PathBuf {
    let mut p = partial.as_os_str().to_owned();
    p.push(".ranges");
    PathBuf::from(p)
}

/// The record's text.
pub fn format(meta: Meta, ranges: &RangeSet) -> String {
    let r: Vec<(u64, u64)> = ranges.iter().collect();
    format!(
        "xftp-upload 1\nsize {}\nmtime {}\nranges {}\n",
        meta.size,
        meta.mtime,
        xftp_proto::command::format_ranges(&r)
    )
}

/// Parse a record; `None` if it is not one.
pub fn parse(text: &str) -> Option<(Meta, RangeSet)> {
    let mut lines = text.lines();
    if lines.next()? != "xftp-upload 1" {
        return None;
    }
    let mut size = None;
    let mut mtime = None;
    let mut ranges = RangeSet::new();
    for l in lines {
        let (k, v) = l.split_once(' ').unwrap_or((l, ""));
        match k {
            "size" => size = v.parse().ok(),
            "mtime" => mtime = v.parse().ok(),
            "ranges" if !v.is_empty() => {
                for (a, b) in xftp_proto::command::parse_ranges(v).ok()? {
                    ranges.union(a, b);
                }
            }
            _ => {}
        }
    }
    Some((
        Meta {
            size: size?,
            mtime: mtime?,
        },
        ranges,
    ))
}

/// The record of `partial`, its ranges cut to what the file holds;
/// `Ok(None)` when there is none (or it cannot be read as one).
pub fn read(partial: &Path) -> io::Result<Option<(Meta, RangeSet)>> {
    // Never a FIFO's open, which would wait for a writer.
    let text = match xftp_stripe::read_regular(&record_path(partial), libc::O_NOFOLLOW) {
        Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let on_disk = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    Ok(parse(&text).map(|(m, r)| (m, r.clamped(on_disk.min(m.size)))))
}

/// Remove the record beside `partial`, if there is one: only a file that
/// reads as a record (a user's own `NAME.ranges` is left alone).
pub fn remove_record(partial: &Path) {
    if matches!(read(partial), Ok(Some(_))) {
        let _ = std::fs::remove_file(record_path(partial));
    }
}

/// Make what `rec` wrote durable and say so in the record.
pub fn checkpoint(rec: &RecordedFile, partial: &Path, meta: Meta) -> io::Result<()> {
    let r = rec.sync_ranges()?;
    xftp_stripe::write_atomic(&record_path(partial), format(meta, &r).as_bytes())
}

/// The resumable uploads under way on one server, by partial file. One
/// partial has one writer: a newer upload of it (a client's next run,
/// while the server has not yet seen the last one go) stops the older one
/// and waits until it has recorded what it holds. Two writers would each
/// rewrite the record with their own ranges, so that the last to write
/// could drop what the other stored, or, after a truncating start, name
/// bytes the file no longer holds.
#[derive(Debug, Default)]
pub struct Writers {
    map: Mutex<HashMap<PathBuf, Arc<Writer>>>,
}

/// One upload's hold on its partial; see [`Writers`].
#[derive(Debug, Default)]
pub struct Writer {
    /// Cancelled to ask the upload to stop (a newer one takes over, or
    /// its session ends): it records what arrived, then lets go.
    pub stop: CancellationToken,
    /// Set before `stop` when the reason is a newer upload of the same
    /// partial (its reply says so: no network fault).
    pub taken_over: std::sync::atomic::AtomicBool,
    /// Cancelled once the upload let go: it writes its record no more.
    done: CancellationToken,
    /// Set under the lock when the upload let go; every record write
    /// holds the lock and checks it first, so none lands after.
    retired: Mutex<bool>,
}

impl Writer {
    /// Write the record of `rec` unless this writer let go of the partial.
    pub fn checkpoint(&self, rec: &RecordedFile, partial: &Path, meta: Meta) -> io::Result<()> {
        let retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        if *retired {
            return Ok(());
        }
        checkpoint(rec, partial, meta)
    }
}

/// Held by the upload while it writes `path`; dropped, it lets go.
#[derive(Debug)]
pub struct Hold {
    writers: Arc<Writers>,
    path: PathBuf,
    /// This upload's writer.
    pub writer: Arc<Writer>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        *self
            .writer
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = true;
        let mut map = self.writers.map.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.path)
            .is_some_and(|w| Arc::ptr_eq(w, &self.writer))
        {
            map.remove(&self.path);
        }
        drop(map);
        self.writer.done.cancel();
    }
}

impl Writers {
    /// Become the one writer of `partial`: an older upload of it is
    /// stopped first and waited for, up to `wait`. `None` if it did not
    /// let go in that time.
    pub async fn take(self: &Arc<Self>, partial: &Path, wait: Duration) -> Option<Hold> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let older = {
                let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
                match map.get(partial) {
                    Some(w) => w.clone(),
                    None => {
                        let writer = Arc::new(Writer::default());
                        map.insert(partial.to_owned(), writer.clone());
                        return Some(Hold {
                            writers: self.clone(),
                            path: partial.to_owned(),
                            writer,
                        });
                    }
                }
            };
            tracing::info!(partial = %partial.display(), "a newer upload takes over this partial: the older one stops");
            older
                .taken_over
                .store(true, std::sync::atomic::Ordering::SeqCst);
            older.stop.cancel();
            if tokio::time::timeout_at(deadline, older.done.cancelled())
                .await
                .is_err()
            {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_are_cut_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.part");
        std::fs::write(&p, vec![7u8; 100]).unwrap();
        let mut r = RangeSet::new();
        r.union(0, 40);
        r.union(60, 200);
        let m = Meta {
            size: 300,
            mtime: 1_700_000_000,
        };
        std::fs::write(record_path(&p), format(m, &r)).unwrap();
        let (m2, r2) = read(&p).unwrap().unwrap();
        assert_eq!(m2, m);
        assert_eq!(r2.iter().collect::<Vec<_>>(), vec![(0, 40), (60, 100)]);
        assert!(parse("garbage").is_none());
        assert!(parse("xftp-upload 1\nsize x\n").is_none());
        assert!(read(&dir.path().join("none")).unwrap().is_none());
        // A FIFO in a record's place is no record, and is not waited on.
        let q = dir.path().join("q.part");
        let c = std::ffi::CString::new(record_path(&q).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read(&q).unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn one_writer_per_partial_and_none_after_it_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.part");
        let file = std::fs::File::create(&p).unwrap();
        let rec = RecordedFile::new(file, RangeSet::new());
        let m = Meta { size: 10, mtime: 1 };
        let writers = Arc::new(Writers::default());
        let first = writers.take(&p, Duration::from_secs(1)).await.unwrap();
        // Another partial is another writer, at once.
        let other = writers
            .take(&dir.path().join("g.part"), Duration::ZERO)
            .await;
        assert!(other.is_some());
        // An older writer that does not let go: the newer one is refused.
        assert!(writers.take(&p, Duration::from_secs(1)).await.is_none());
        assert!(first.writer.stop.is_cancelled());
        // One that does (after recording what it has): the newer one has it.
        let w = first.writer.clone();
        let older = tokio::spawn(async move {
            let first = first;
            first.writer.stop.cancelled().await;
            first.writer.checkpoint(&rec, &p, m).unwrap();
            drop(first);
            rec
        });
        let p = dir.path().join("f.part");
        let second = writers.take(&p, Duration::from_secs(5)).await.unwrap();
        let rec = older.await.unwrap();
        assert!(read(&p).unwrap().is_some());
        // The older writer records nothing more once it let go.
        std::fs::remove_file(record_path(&p)).unwrap();
        w.checkpoint(&rec, &p, m).unwrap();
        assert!(read(&p).unwrap().is_none());
        second.writer.checkpoint(&rec, &p, m).unwrap();
        assert!(read(&p).unwrap().is_some());
    }
}
