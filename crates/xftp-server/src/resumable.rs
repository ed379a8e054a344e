//! Resumable uploads (`SITE RESUMABLE`): the partial file is written in
//! place and kept on failure, with a record beside it (`NAME.ranges`) of
//! the byte ranges on disk and of the source's size and modification time
//! as the client announced them. The record is rewritten every half
//! second: the ranges are read, then the file synced, then the record
//! replaced atomically, so it never names a byte that is not on disk.
//! `SITE RANGES NAME` reads it back; `REST a-b,...` before `STOR` sends
//! only the rest.

use std::io;
use std::path::{Path, PathBuf};

use xftp_stripe::ranges::RangeSet;
use xftp_stripe::RecordedFile;

/// How often the record is rewritten while data arrives.
pub const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

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

/// Make what `rec` wrote durable and say so in the record.
pub fn checkpoint(rec: &RecordedFile, partial: &Path, meta: Meta) -> io::Result<()> {
    let r = rec.sync_ranges()?;
    xftp_stripe::write_atomic(&record_path(partial), format(meta, &r).as_bytes())
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
}
