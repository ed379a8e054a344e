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

    /// The counters now. Before any transfer: zero bytes, serial 0.
    pub fn snapshot(&self) -> Snapshot {
        let s = self.lock();
        let per_stream: Vec<u64> = s
            .streams
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        Snapshot {
            label: s.label.clone(),
            total: s.total,
            bytes: per_stream
                .iter()
                .sum::<u64>()
                .min(s.total.unwrap_or(u64::MAX)),
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
        self.lock().streams.push(c.clone());
        c
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
