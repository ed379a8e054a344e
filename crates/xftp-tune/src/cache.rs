//! Parameter collection per destination (MFTP section 3.2): what earlier
//! transfers to the same host and port measured, kept in
//! `$XDG_CACHE_HOME/xftp/paths.json` (or `~/.cache/xftp/paths.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Records kept per destination (newest last).
const KEEP: usize = 32;

/// Records older than this are dropped when the cache is written: the
/// commands use a day's records at most, and a file that only grows
/// (test runs on throwaway ports left thousands of destinations) is
/// read and rewritten whole by every transfer.
const RETAIN_SECS: u64 = 2 * 24 * 3600;

/// Destinations kept (those with the newest records).
const MAX_DESTS: usize = 256;

/// One earlier transfer (or probe) to a destination.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PathRecord {
    /// Seconds since the Unix epoch.
    pub when: u64,
    /// RTT floor seen, microseconds.
    pub rtt_us: u64,
    /// Connections used at the end (or the fixed N).
    pub streams: u32,
    /// Payload throughput, bits per second (0 for a probe).
    pub throughput_bps: f64,
    /// Bytes moved (0 for a probe).
    pub bytes: u64,
    /// An upload (`true`) or a download (`false`); unknown for a probe
    /// and in files written before it was kept. A path's two directions
    /// can differ (an asymmetric link): a count is taken from its own
    /// direction's records, or from those that do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<bool>,
    /// The count a `-p auto` transfer started from (`None` for a fixed
    /// count, a probe, and in files written before it was kept). One that
    /// learned another count says the start no longer pays on this path:
    /// the earlier records of that count are left out ([`Cache::best`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u32>,
}

/// Errors saving the cache (loading never fails: a bad cache is ignored).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Writing the file failed.
    #[error("cache {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// The per-destination cache.
#[derive(Debug, Clone, Default)]
pub struct Cache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Vec<PathRecord>>,
}

/// Largest cache file read.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// How far ahead of the clock a record may be and still count (clocks
/// of a host differ by little; a record a day ahead is no measurement).
const FUTURE_SLACK_SECS: u64 = 300;

/// Now, in seconds since the epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long [`Cache::record_at`] waits for another process's lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Cache {
    /// `$XDG_CACHE_HOME/xftp/paths.json`, else `$HOME/.cache/xftp/paths.json`.
    pub fn default_path() -> Option<PathBuf> {
        // Relative or empty values are ignored (the XDG base directory
        // spec; an empty HOME would put the cache in the current directory).
        let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        let base = std::env::var_os("XDG_CACHE_HOME")
            .and_then(absolute)
            .or_else(|| {
                std::env::var_os("HOME")
                    .and_then(absolute)
                    .map(|h| h.join(".cache"))
            })?;
        Some(base.join("xftp").join("paths.json"))
    }

    /// Load from `path`; a missing or unreadable file gives an empty cache.
    pub fn load(path: &Path) -> Cache {
        use std::io::Read;
        let mut bytes = Vec::new();
        // Bounded: a cache is a few KiB a destination; a file of hundreds
        // of megabytes (junk, a wrong XDG_CACHE_HOME) is not read whole.
        let read = std::fs::File::open(path)
            .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes));
        let entries = match read {
            Ok(_) if bytes.len() as u64 > MAX_FILE_BYTES => {
                tracing::warn!(
                    "path cache {}: larger than {} MiB, not a cache of ours; starting a new one",
                    path.display(),
                    MAX_FILE_BYTES >> 20
                );
                BTreeMap::new()
            }
            Ok(0) => BTreeMap::new(),
            Ok(_) => Self::parse(path, &bytes),
            Err(_) => BTreeMap::new(),
        };
        Cache {
            path: Some(path.to_owned()),
            entries,
        }
    }

    /// The records of a cache file, record by record: one that does not
    /// read (a hand edit, a field out of range) is dropped with a
    /// warning, and the other destinations' records kept (they all went).
    fn parse(path: &Path, bytes: &[u8]) -> BTreeMap<String, Vec<PathRecord>> {
        let raw: BTreeMap<String, Vec<serde_json::Value>> = match serde_json::from_slice(bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    "path cache {}: unreadable ({e}); starting a new one",
                    path.display()
                );
                return BTreeMap::new();
            }
        };
        let mut dropped = 0usize;
        let mut out = BTreeMap::new();
        for (dest, recs) in raw {
            let mut v: Vec<PathRecord> = recs
                .into_iter()
                .filter_map(|r| {
                    serde_json::from_value(r).ok().or_else(|| {
                        dropped += 1;
                        None
                    })
                })
                .collect();
            // A hand-made list past the bound: the newest, as `record`
            // keeps them.
            if v.len() > KEEP {
                v.drain(..v.len() - KEEP);
            }
            if !v.is_empty() {
                out.insert(dest, v);
            }
        }
        if dropped > 0 {
            tracing::warn!(
                "path cache {}: {dropped} record(s) unreadable, left out",
                path.display()
            );
        }
        out
    }

    /// A cache that is never saved.
    pub fn in_memory() -> Cache {
        Cache::default()
    }

    /// Records for `dest` no older than `max_age`.
    pub fn fresh(&self, dest: &str, max_age: Duration) -> Vec<&PathRecord> {
        let now = now_secs();
        self.entries
            .get(dest)
            .map(|v| {
                v.iter()
                    // A record from more than a few minutes ahead (a clock
                    // set back since, or a hand-edited file) would stay
                    // fresh until the clock caught up: not taken.
                    .filter(|r| {
                        now.saturating_sub(r.when) <= max_age.as_secs()
                            && r.when <= now + FUTURE_SLACK_SECS
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The fastest stream count of the fresh transfers, with its
    /// throughput: each count is judged by the median of its records (one
    /// lucky run must not decide: on an emulated satellite link one of
    /// three runs of 32 connections took 3.7 s against 6.1 and 7.6, and made
    /// 32 the "best" where 8 ran at 4.0-4.2 s every time), and of counts
    /// within 5 % of the fastest median, the smallest.
    /// `upload`: only records of that direction (and those that do not
    /// say); `None`, all.
    pub fn best(&self, dest: &str, max_age: Duration, upload: Option<bool>) -> Option<(u32, f64)> {
        let mut by_count: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
        let this_way = |r: &PathRecord| match (upload, r.upload) {
            (Some(want), Some(was)) => want == was,
            _ => true,
        };
        // Oldest first, as recorded.
        let runs: Vec<&PathRecord> = self
            .fresh(dest, max_age)
            .into_iter()
            .filter(|r| this_way(r) && r.throughput_bps > 0.0 && r.streams > 0)
            .collect();
        // A later `-p auto` run that started at this count and learned
        // another: one run of 1 connection at 47 Mbit/s, before the link
        // turned lossy, started every later transfer at 1, each of which
        // grew to 8 and recorded 8 at 24-35 (the median of 1 stayed 47).
        let superseded = |i: usize, n: u32| {
            runs[i + 1..]
                .iter()
                .any(|later| later.started == Some(n) && later.streams != n)
        };
        for (_, r) in runs
            .iter()
            .enumerate()
            .filter(|(i, r)| !superseded(*i, r.streams))
        {
            by_count
                .entry(r.streams)
                .or_default()
                .push(r.throughput_bps);
        }
        let medians: Vec<(u32, f64)> = by_count
            .into_iter()
            .map(|(n, mut v)| {
                v.sort_by(f64::total_cmp);
                let m = v.len() / 2;
                let median = if v.len() % 2 == 1 {
                    v[m]
                } else {
                    (v[m - 1] + v[m]) / 2.0
                };
                (n, median)
            })
            .collect();
        let top = medians.iter().map(|&(_, t)| t).fold(0.0, f64::max);
        // Throughput differences of a few percent are noise; of counts
        // that close to the best, the smallest costs the path least
        // (the map iterates in ascending count).
        medians
            .into_iter()
            .find(|&(_, t)| t >= top * (1.0 - BEST_WITHIN))
    }

    /// The smallest fresh RTT.
    pub fn rtt(&self, dest: &str, max_age: Duration) -> Option<Duration> {
        self.fresh(dest, max_age)
            .into_iter()
            .filter(|r| r.rtt_us > 0)
            .map(|r| Duration::from_micros(r.rtt_us))
            .min()
    }

    /// Add a record (keeps the newest few per destination, drops records
    /// past [`RETAIN_SECS`] and all but the [`MAX_DESTS`] destinations
    /// recorded last).
    pub fn record(&mut self, dest: &str, rec: PathRecord) {
        let now = rec.when;
        let v = self.entries.entry(dest.to_owned()).or_default();
        v.push(rec);
        // Records of the RTT alone (`xftp probe`, a rate-limited transfer)
        // go first, oldest first: a run of probes must not push out the
        // transfers a start is chosen from.
        while v.len() > KEEP {
            let at = v
                .iter()
                .position(|r| r.streams == 0 && r.throughput_bps == 0.0)
                .filter(|&i| i + 1 < v.len())
                .unwrap_or(0);
            v.remove(at);
        }
        let oldest = now.saturating_sub(RETAIN_SECS);
        // A record from the future (a clock set back since, a hand edit)
        // is never taken (`fresh`), and would never age out.
        let latest = now_secs().max(now) + FUTURE_SLACK_SECS;
        for v in self.entries.values_mut() {
            v.retain(|r| r.when >= oldest && r.when <= latest);
        }
        self.entries.retain(|_, v| !v.is_empty());
        if self.entries.len() > MAX_DESTS {
            let mut last: Vec<(u64, String)> = self
                .entries
                .iter()
                .map(|(d, v)| (v.iter().map(|r| r.when).max().unwrap_or(0), d.clone()))
                .collect();
            last.sort_unstable_by(|a, b| b.cmp(a));
            for (_, d) in last.drain(MAX_DESTS..) {
                self.entries.remove(&d);
            }
        }
    }

    /// Add `rec` for `dest` to the cache file at `path`: load, record and
    /// save under an exclusive lock on `path` + `.lock`, so that sessions
    /// recording at once (the striped sessions of a tree, two xftp
    /// processes) each keep their record; a plain load-record-save lets the
    /// last writer drop what another saved in between.
    pub fn record_at(path: &Path, dest: &str, rec: PathRecord) -> Result<(), CacheError> {
        Self::update_at(path, |c| c.record(dest, rec))
    }

    /// Change the cache file at `path` with `f`, under its lock (see
    /// [`record_at`](Cache::record_at)).
    pub fn update_at(path: &Path, f: impl FnOnce(&mut Cache)) -> Result<(), CacheError> {
        if let Some(dir) = path.parent() {
            create_private_dir(dir)?;
        }
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_err = |source| CacheError::Io {
            path: PathBuf::from(&lock_path).display().to_string(),
            source,
        };
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(lock_err)?;
        // Released when `lock` is closed, also on an early return. Waited
        // for a moment only: a process that holds it for long must not
        // hold up this one's exit (the record is worth a warning, no more).
        let give_up = std::time::Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let r = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&lock),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            };
            if r == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(lock_err(e));
            }
            if std::time::Instant::now() >= give_up {
                return Err(lock_err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "held by another process for over {} s; this run is not recorded",
                        LOCK_WAIT.as_secs()
                    ),
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut c = Cache::load(path);
        f(&mut c);
        c.save()
    }

    /// Every destination with its records, oldest first.
    pub fn destinations(&self) -> impl Iterator<Item = (&str, &[PathRecord])> {
        self.entries.iter().map(|(d, v)| (d.as_str(), v.as_slice()))
    }

    /// Drop `dest`'s records; whether there were any.
    pub fn forget(&mut self, dest: &str) -> bool {
        self.entries.remove(dest).is_some()
    }

    /// Drop every record.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Write the cache atomically (temporary file, then rename).
    pub fn save(&self) -> Result<(), CacheError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let err = |source| CacheError::Io {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            create_private_dir(dir)?;
        }
        // Unique per save, not only per process: the sessions of a tree
        // transfer save from one process at the same time, and two
        // writes into one temporary would interleave.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}.{n}", std::process::id()));
        let text =
            serde_json::to_vec_pretty(&self.entries).map_err(|e| err(std::io::Error::other(e)))?;
        // The user's alone (the file names every host contacted), and
        // not left behind when the disk is full.
        let written = {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut f| f.write_all(&text))
                .and_then(|()| std::fs::rename(&tmp, path))
        };
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }
}

/// `dir` and its missing parents, the new ones private (0700, as the XDG
/// base directory spec asks); one that exists but is no directory is
/// named as such.
fn create_private_dir(dir: &Path) -> Result<(), CacheError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(p) = dir.ancestors().find(|p| p.exists()) {
        if !p.is_dir() {
            return Err(CacheError::Io {
                path: p.display().to_string(),
                source: std::io::Error::other("not a directory: remove it, or set XDG_CACHE_HOME"),
            });
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CacheError::Io {
            path: dir.display().to_string(),
            source,
        })
}

/// The starting count on a path of round-trip time `rtt` with nothing
/// cached: one connection per 6.25 ms of RTT, rounded down to a power of
/// two, at least 2 and at most 16 (2 under 25 ms, 4 under 50 ms, 8 under
/// 100 ms, 16 from 100 ms on).
///
/// MFTP's `Tp = k·N·W'/D`: for a given rate, the count needed grows with
/// the delay, whether each connection is held by its window (W/RTT) or by
/// random loss (Mathis: MSS/(RTT·√p)). And a count found late costs more
/// the longer the path: each growth step is an epoch of about 3 RTTs, and
/// connections added then open in slow start while the first ones
/// already fill the queue, so they carry little for the rest of the
/// transfer. A start too high on a link it crowds is stepped down by the
/// controller, but slowly where connections are slow: a retired
/// connection first sends the record it holds. 16 is the cap: past it a
/// small router queue overflows into the collapse (XFTP's figure 10;
/// fixed 32 on the satellite profile of docs/results.md runs at half the
/// rate of 16), and the whole of a small file is handed out at once. On
/// the emulated T1 satellite hop (560 ms, an 8-packet queue, 2 MiB) a
/// start of 32 took 26.4-26.7 s against 21.6-22.3 at 8, while 16 took
/// 21.9-23.1 (docs/tuning.md, section 2).
pub fn start_for_rtt(rtt: Duration) -> u32 {
    let per = rtt.as_secs_f64() / 0.00625;
    let mut n = 2u32;
    while n < 16 && f64::from(n * 2) <= per {
        n *= 2;
    }
    n
}

/// RTT under which one autotuned connection fills the path: the kernel's
/// windows of megabytes fill 10 Gbit/s at 5 ms. The handshake's one RTT
/// sample also reads jitter of a millisecond or two.
pub const SHORT_PATH: Duration = Duration::from_millis(5);

/// The same with a window fixed by `--bufsize`.
pub const SHORT_PATH_WINDOWED: Duration = Duration::from_millis(2);

/// Records within this fraction of the best throughput count as equal.
const BEST_WITHIN: f64 = 0.05;

/// The starting number of connections, and why.
///
/// MFTP picks N from `Tp = k·N·W'/D` (throughput, window, delay). With a
/// cached best N for this destination, start there. Without one, a short
/// path is filled by one connection ([`SHORT_PATH`], or
/// [`SHORT_PATH_WINDOWED`] with a fixed window); a longer path
/// starts from more the longer it is ([`start_for_rtt`]) and the
/// controller grows from there.
pub fn initial_streams(
    rtt: Option<Duration>,
    window: Option<u64>,
    cached_best: Option<(u32, f64)>,
    max: u32,
) -> (u32, String) {
    let max = max.max(1);
    if let Some((n, bps)) = cached_best {
        return (
            n.clamp(1, max),
            format!(
                "cached: {n} connection(s) gave {:.1} Mbit/s to this destination",
                bps / 1e6
            ),
        );
    }
    let short = if window.is_some() {
        SHORT_PATH_WINDOWED
    } else {
        SHORT_PATH
    };
    match rtt {
        Some(r) if r < short => (
            1,
            format!(
                "RTT {:.2} ms: one connection fills a short path",
                r.as_secs_f64() * 1e3
            ),
        ),
        Some(r) => {
            let n = start_for_rtt(r).min(max);
            let per_conn = window.map(|w| w as f64 * 8.0 / r.as_secs_f64());
            let why = match per_conn {
                Some(pc) => format!(
                    "RTT {:.1} ms, window {} B: {:.1} Mbit/s per connection; starting at {n} and growing while goodput grows",
                    r.as_secs_f64() * 1e3,
                    window.unwrap_or(0),
                    pc / 1e6
                ),
                None => format!(
                    "RTT {:.1} ms: starting at {n} and growing while goodput grows",
                    r.as_secs_f64() * 1e3
                ),
            };
            (n, why)
        }
        None => (2.min(max), "RTT unknown: starting at 2".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_one_process_save_at_once_without_mixing_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("paths.json");
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let p = p.clone();
                s.spawn(move || {
                    for i in 0..50u32 {
                        let mut c = Cache::load(&p);
                        c.record(
                            &format!("h{t}:{i}"),
                            PathRecord {
                                when: now_secs(),
                                rtt_us: 1000 + u64::from(i),
                                streams: 4,
                                throughput_bps: 1e6,
                                bytes: 1 << 20,
                                upload: None,
                                started: None,
                            },
                        );
                        c.save().unwrap();
                    }
                });
            }
        });
        // Whatever the last writer left is whole JSON (a lost record is
        // possible; a torn file is not).
        let text = std::fs::read(&p).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert!(v.as_object().is_some_and(|o| !o.is_empty()), "{v}");
    }

    #[test]
    fn records_made_at_once_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("xftp/paths.json");
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let p = p.clone();
                s.spawn(move || {
                    for i in 0..8u32 {
                        let rec = PathRecord {
                            when: now_secs(),
                            rtt_us: 1000 + u64::from(i),
                            streams: 4,
                            throughput_bps: 1e6,
                            bytes: 1 << 20,
                            upload: None,
                            started: None,
                        };
                        Cache::record_at(&p, &format!("h{t}:21"), rec).unwrap();
                    }
                });
            }
        });
        let c = Cache::load(&p);
        for t in 0..4 {
            let n = c
                .fresh(&format!("h{t}:21"), Duration::from_secs(3600))
                .len();
            assert_eq!(n, 8, "destination h{t}:21 kept {n} of 8 records");
        }
    }

    #[test]
    fn a_lock_held_elsewhere_is_waited_for_only_a_moment() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("paths.json");
        let held = std::fs::File::create(dir.path().join("paths.json.lock")).unwrap();
        // SAFETY: flock on a descriptor the test owns.
        let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) };
        assert_eq!(r, 0);
        let rec = PathRecord {
            when: now_secs(),
            rtt_us: 1000,
            streams: 4,
            throughput_bps: 1e6,
            bytes: 1,
            upload: None,
            started: None,
        };
        let t = std::time::Instant::now();
        let e = Cache::record_at(&p, "h:21", rec.clone())
            .unwrap_err()
            .to_string();
        assert!(t.elapsed() < LOCK_WAIT * 3, "{:?}", t.elapsed());
        assert!(
            e.contains("paths.json.lock") && e.contains("not recorded"),
            "{e}"
        );
        drop(held);
        Cache::record_at(&p, "h:21", rec).unwrap();
    }

    #[test]
    fn save_load_best_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/paths.json");
        let mut c = Cache::load(&p);
        let now = now_secs();
        c.record(
            "h:21",
            PathRecord {
                when: now,
                rtt_us: 100_000,
                streams: 8,
                throughput_bps: 80e6,
                bytes: 1 << 30,
                upload: None,
                started: None,
            },
        );
        c.record(
            "h:21",
            PathRecord {
                when: now,
                rtt_us: 90_000,
                streams: 4,
                throughput_bps: 40e6,
                bytes: 1 << 30,
                upload: None,
                started: None,
            },
        );
        c.record(
            "h:21",
            PathRecord {
                when: now - 100_000,
                rtt_us: 1,
                streams: 64,
                throughput_bps: 900e6,
                bytes: 1,
                upload: None,
                started: None,
            },
        );
        c.save().unwrap();
        let c = Cache::load(&p);
        let day = Duration::from_secs(86_400);
        assert_eq!(c.best("h:21", day, None), Some((8, 80e6)));
        assert_eq!(c.rtt("h:21", day), Some(Duration::from_micros(90_000)));
        assert_eq!(c.best("other:21", day, None), None);
        // From a day ahead: not a measurement of this path's present.
        let mut ahead = Cache::in_memory();
        ahead.record(
            "h:21",
            PathRecord {
                when: now + 86_400,
                rtt_us: 1,
                streams: 64,
                throughput_bps: 900e6,
                bytes: 1,
                upload: None,
                started: None,
            },
        );
        assert_eq!(ahead.best("h:21", day, None), None);
        // Within 5 % of the best, the smallest count wins.
        let mut c = c;
        c.record(
            "h:21",
            PathRecord {
                when: now,
                rtt_us: 90_000,
                streams: 6,
                throughput_bps: 77e6,
                bytes: 1 << 30,
                upload: None,
                started: None,
            },
        );
        assert_eq!(c.best("h:21", day, None), Some((6, 77e6)));
        // Each count by the median of its records: one lucky run of 32
        // among slow ones does not make 32 the best.
        let thirty_two = |c: &mut Cache, t: f64| {
            c.record(
                "h:21",
                PathRecord {
                    when: now,
                    rtt_us: 90_000,
                    streams: 32,
                    throughput_bps: t,
                    bytes: 1 << 30,
                    upload: None,
                    started: None,
                },
            )
        };
        for t in [130e6, 60e6, 50e6] {
            thirty_two(&mut c, t);
        }
        assert_eq!(c.best("h:21", day, None), Some((6, 77e6)));
        for t in [120e6, 125e6] {
            thirty_two(&mut c, t);
        }
        // Now its median (120 of 50, 60, 120, 125, 130) is the fastest.
        assert_eq!(c.best("h:21", day, None), Some((32, 120e6)));
        // A corrupt file is an empty cache, not an error.
        std::fs::write(&p, b"{not json").unwrap();
        assert_eq!(Cache::load(&p).best("h:21", day, None), None);
    }

    #[test]
    fn a_start_that_a_later_auto_run_left_is_not_taken_again() {
        // One fast run of 1 connection; then the link turned lossy, and
        // each `-p auto` run started at 1 and learned 8, slower than the
        // old run: 1 is not chosen again. A fixed count's runs (no start)
        // supersede nothing.
        let mut c = Cache::in_memory();
        let now = now_secs();
        let rec = |streams, bps: f64, started| PathRecord {
            when: now,
            rtt_us: 20_000,
            streams,
            throughput_bps: bps,
            bytes: 1 << 26,
            upload: Some(false),
            started,
        };
        let day = Duration::from_secs(86_400);
        c.record("h:21", rec(1, 47e6, None));
        c.record("h:21", rec(4, 30e6, None));
        assert_eq!(c.best("h:21", day, Some(false)), Some((1, 47e6)));
        c.record("h:21", rec(8, 30e6, Some(1)));
        assert_eq!(c.best("h:21", day, Some(false)), Some((4, 30e6)));
        // A later run that started at 1 and kept it counts again.
        c.record("h:21", rec(1, 45e6, Some(1)));
        assert_eq!(c.best("h:21", day, Some(false)), Some((1, 45e6)));
    }

    #[test]
    fn a_bad_record_costs_itself_alone_and_the_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub").join("paths.json");
        let now = now_secs();
        let good =
            format!(r#"{{"when":{now},"rtt_us":1000,"streams":4,"throughput_bps":4e7,"bytes":1}}"#);
        let bad = r#"{"when":1,"rtt_us":-5,"streams":1e12,"throughput_bps":1,"bytes":1}"#;
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!(r#"{{"a:21":[{bad},{good}],"b:21":[{good}]}}"#)).unwrap();
        let c = Cache::load(&p);
        let day = Duration::from_secs(86_400);
        assert_eq!(c.best("a:21", day, None), Some((4, 4e7)));
        assert_eq!(c.best("b:21", day, None), Some((4, 4e7)));
        // Saved as the user's alone, into a new private directory; no
        // temporary left.
        let fresh = dir.path().join("new").join("xftp").join("paths.json");
        let mut c = Cache::load(&fresh);
        c.record(
            "a:21",
            PathRecord {
                when: now,
                rtt_us: 1,
                streams: 1,
                throughput_bps: 1.0,
                bytes: 1,
                upload: None,
                started: None,
            },
        );
        c.save().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&fresh), 0o600);
        assert_eq!(mode(fresh.parent().unwrap()), 0o700);
        let names: Vec<_> = std::fs::read_dir(fresh.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["paths.json"]);
        // A file where the directory should be is named as such.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let e = Cache::load(&blocked.join("paths.json")).save().unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn each_direction_takes_its_own_best() {
        // An asymmetric path: downloads fast on 16, uploads on a narrow
        // uplink best on 2.
        let mut c = Cache::in_memory();
        let now = now_secs();
        let rec = |streams, bps, upload| PathRecord {
            when: now,
            rtt_us: 100_000,
            streams,
            throughput_bps: bps,
            bytes: 1 << 24,
            upload,
            started: None,
        };
        c.record("h:21", rec(16, 61e6, Some(false)));
        c.record("h:21", rec(2, 1.95e6, Some(true)));
        let day = Duration::from_secs(86_400);
        assert_eq!(c.best("h:21", day, Some(false)), Some((16, 61e6)));
        assert_eq!(c.best("h:21", day, Some(true)), Some((2, 1.95e6)));
        assert_eq!(c.best("h:21", day, None), Some((16, 61e6)));
        // A record that does not say (an older file) counts for both.
        c.record("h:21", rec(8, 90e6, None));
        assert_eq!(c.best("h:21", day, Some(true)), Some((8, 90e6)));
        // And the field stays out of files where it is unknown.
        let text = serde_json::to_string(&rec(1, 1.0, None)).unwrap();
        assert!(!text.contains("upload"), "{text}");
        let back: PathRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back.upload, None);
    }

    #[test]
    fn old_records_and_destinations_past_the_bound_are_dropped() {
        let mut c = Cache::in_memory();
        let now = now_secs();
        let rec = |when| PathRecord {
            when,
            rtt_us: 1000,
            streams: 4,
            throughput_bps: 1e8,
            bytes: 1 << 20,
            upload: None,
            started: None,
        };
        c.record("old:21", rec(now - 30 * 86400));
        c.record("kept:21", rec(now - 3600));
        c.record("kept:21", rec(now - 40 * 86400));
        for i in 0..(MAX_DESTS + 40) {
            c.record(&format!("h{i}:21"), rec(now - 1000 + i as u64));
        }
        assert!(c
            .fresh("old:21", Duration::from_secs(u64::MAX >> 2))
            .is_empty());
        assert_eq!(c.entries.len(), MAX_DESTS);
        // The newest destinations stay; "kept" is older than all of them.
        assert!(c.entries.contains_key(&format!("h{}:21", MAX_DESTS + 39)));
        assert!(!c.entries.contains_key("h0:21"));
        let mut c = Cache::in_memory();
        c.record("kept:21", rec(now - 40 * 86400));
        c.record("kept:21", rec(now - 3600));
        assert_eq!(c.entries["kept:21"].len(), 1, "the 40-day-old one is gone");
        // One from a day ahead goes with the next record.
        c.record("ahead:21", rec(now + 86_400));
        c.record("kept:21", rec(now));
        assert!(!c.entries.contains_key("ahead:21"));
    }

    #[test]
    fn keeps_a_bounded_history() {
        let mut c = Cache::in_memory();
        for i in 0..100 {
            c.record(
                "d",
                PathRecord {
                    when: now_secs(),
                    rtt_us: i,
                    streams: 1,
                    throughput_bps: 1.0,
                    bytes: 1,
                    upload: None,
                    started: None,
                },
            );
        }
        assert_eq!(c.fresh("d", Duration::from_secs(60)).len(), KEEP);
        // A run of probes (the RTT alone) does not push out the transfers
        // a start is chosen from; the newest probe stays.
        let at = |rtt_us, streams, bps| PathRecord {
            when: now_secs(),
            rtt_us,
            streams,
            throughput_bps: bps,
            bytes: 0,
            upload: None,
            started: None,
        };
        let mut c = Cache::in_memory();
        c.record("p", at(500, 8, 9e7));
        c.record("p", at(510, 16, 1e8));
        for i in 0..100 {
            c.record("p", at(600 + i, 0, 0.0));
        }
        let kept = c.fresh("p", Duration::from_secs(60));
        assert_eq!(kept.len(), KEEP);
        assert_eq!(kept.iter().filter(|r| r.streams > 0).count(), 2);
        assert_eq!(kept.last().map(|r| r.rtt_us), Some(699));
        assert_eq!(
            c.best("p", Duration::from_secs(60), None).map(|b| b.0),
            Some(16)
        );
    }

    #[test]
    fn initial_choice() {
        assert_eq!(
            initial_streams(Some(Duration::from_micros(300)), None, None, 32).0,
            1
        );
        // A jittery handshake sample of a 1 ms path.
        assert_eq!(
            initial_streams(Some(Duration::from_micros(2800)), None, None, 32).0,
            1
        );
        assert_eq!(
            initial_streams(Some(Duration::from_micros(2800)), Some(65536), None, 32).0,
            2
        );
        // One connection per 6.25 ms of RTT, a power of two, 2 to 16.
        for (ms, n) in [
            (20, 2),
            (30, 4),
            (56, 8),
            (100, 16),
            (200, 16),
            (299, 16),
            (300, 16),
            (560, 16),
            (1000, 16),
        ] {
            assert_eq!(
                initial_streams(Some(Duration::from_millis(ms)), None, None, 32).0,
                n,
                "{ms} ms"
            );
        }
        assert_eq!(
            initial_streams(Some(Duration::from_millis(560)), None, None, 3).0,
            3
        );
        assert_eq!(
            initial_streams(Some(Duration::from_millis(100)), None, Some((12, 1e8)), 8).0,
            8
        );
        assert_eq!(initial_streams(None, None, None, 1).0, 1);
    }
}
