//! What a running transfer has moved, for progress displays.
//!
//! The client counts the bytes of every data connection as they pass
//! (payload, plus the 17-byte MODE E headers: 0.007 % at 256 KiB
//! records); a display polls [`Progress::snapshot`] at its own pace, so
//! counting costs one relaxed atomic add per read or write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared between the client and whoever displays progress.
#[derive(Debug, Default)]
pub struct Progress {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    label: String,
    total: Option<u64>,
    /// Counters of this transfer's data connections, in opening order.
    streams: Vec<Arc<AtomicU64>>,
    started: Option<Instant>,
    /// Transfers begun so far (a display can tell a new one).
    serial: u64,
    /// Pooled (a tree): every transfer adds to one running count.
    pooled: bool,
    /// Pooled: bytes of the connections that have closed.
    done: u64,
}

/// A reading of the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// What is moving (the remote path).
    pub label: String,
    /// Bytes the transfer will move, when known.
    pub total: Option<u64>,
    /// Bytes moved so far on all connections (never above `total`: the
    /// framing counted with the payload is left out at the end).
    pub bytes: u64,
    /// Bytes per connection, in opening order.
    pub per_stream: Vec<u64>,
    /// Connections open now.
    pub active: usize,
    /// Since the transfer began.
    pub elapsed: Duration,
    /// Which transfer this is (1 for the first of the session).
    pub serial: u64,
}

impl Progress {
    /// A fresh, idle progress.
    pub fn new() -> Arc<Progress> {
        Arc::new(Progress::default())
    }

    /// One count over many transfers, running at once on several sessions
    /// (a tree): transfers do not reset it; [`Progress::set_total`] says
    /// what the whole will be.
    pub fn pooled() -> Arc<Progress> {
        let p = Progress::default();
        p.lock().pooled = true;
        Arc::new(p)
    }

    /// Pooled: what is moving and how much it will be in all.
    pub fn set_total(&self, label: &str, total: Option<u64>) {
        let mut s = self.lock();
        s.label = label.to_owned();
        s.total = total;
        if s.started.is_none() {
            s.started = Some(Instant::now());
            s.serial += 1;
        }
    }

    /// The counters now. Before any transfer: zero bytes, serial 0.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.lock();
        s.fold();
        let per_stream: Vec<u64> = s
            .streams
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        Snapshot {
            label: s.label.clone(),
            total: s.total,
            bytes: (s.done + per_stream.iter().sum::<u64>()).min(s.total.unwrap_or(u64::MAX)),
            active: s
                .streams
                .iter()
                .filter(|c| Arc::strong_count(c) > 1)
                .count(),
            per_stream,
            elapsed: s.started.map_or(Duration::ZERO, |t| t.elapsed()),
            serial: s.serial,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere must not take the display down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new transfer starts: counters back to zero.
    pub(crate) fn begin(&self, label: &str, total: Option<u64>) {
        let mut s = self.lock();
        if s.pooled {
            return;
        }
        s.label = label.to_owned();
        s.total = total;
        s.streams.clear();
        s.started = Some(Instant::now());
        s.serial += 1;
    }

    /// The counter of one more data connection; it counts as active while
    /// the caller holds it.
    pub(crate) fn counter(&self) -> Arc<AtomicU64> {
        let c = Arc::new(AtomicU64::new(0));
        let mut s = self.lock();
        s.fold();
        s.streams.push(c.clone());
        c
    }
}

impl State {
    /// Pooled: closed connections' bytes into `done`, so that ten
    /// thousand files do not leave ten thousand counters.
    fn fold(&mut self) {
        if !self.pooled {
            return;
        }
        let mut done = self.done;
        self.streams.retain(|c| {
            let open = Arc::strong_count(c) > 1;
            if !open {
                done += c.load(Ordering::Relaxed);
            }
            open
        });
        self.done = done;
    }
}

/// Add `n` to an optional counter.
pub(crate) fn add(c: &Option<Arc<AtomicU64>>, n: usize) {
    if let Some(c) = c {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_sums_every_transfer() {
        let p = Progress::pooled();
        p.set_total("3 files", Some(100));
        p.begin("/a", Some(10));
        let a = p.counter();
        add(&Some(a.clone()), 10);
        drop(a);
        p.begin("/b", Some(30));
        let b = p.counter();
        add(&Some(b.clone()), 25);
        let s = p.snapshot();
        assert_eq!((s.bytes, s.total, s.active), (35, Some(100), 1));
        assert_eq!(s.label, "3 files");
        assert_eq!(s.per_stream, vec![25], "closed counters folded");
    }

    #[test]
    fn counts_per_stream_and_active() {
        let p = Progress::new();
        assert_eq!(p.snapshot().serial, 0);
        p.begin("/f", Some(100));
        let a = p.counter();
        let b = p.counter();
        add(&Some(a.clone()), 30);
        add(&Some(b.clone()), 12);
        let s = p.snapshot();
        assert_eq!(
            (s.bytes, s.per_stream.clone(), s.active),
            (42, vec![30, 12], 2)
        );
        drop(b);
        assert_eq!(p.snapshot().active, 1);
        p.begin("/g", None);
        let s = p.snapshot();
        assert_eq!(
            (s.bytes, s.active, s.serial, s.label.as_str()),
            (0, 0, 2, "/g")
        );
    }
}
