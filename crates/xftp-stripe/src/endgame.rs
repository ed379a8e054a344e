//! Sans-IO bookkeeping of the sender's endgame.
//!
//! The end of a striped transfer waits for its slowest connection. On a
//! lossy path the last records often sit on a connection in a
//! retransmission timeout (a second or more, doubling), while the other
//! connections have nothing left to do. In the endgame a connection that
//! has sent its EOD does not close: it watches what every connection has
//! *delivered* (acknowledged by the peer's TCP) and sends again, on
//! itself, the records a stuck connection still holds. The receiver takes
//! the first copy of each byte and checks every later copy against it,
//! also after a connection's EOD (`Receiver::file_endgame`), and is done
//! once every byte is stored; the sender stops once every byte has been
//! delivered by some connection and resets the connections still stuck.
//! A connection lost on the way (reset) gives back everything it carried
//! that no other connection delivered ([`Books::lost`]), and the others
//! send it again.
//!
//! This module keeps the books; it does no I/O and has no clock. Its
//! caller tells it what each connection wrote ([`Books::queued`],
//! [`Books::written`]) and what the kernel says (`observe`: bytes still
//! unacknowledged, whether the connection is in a retransmission
//! timeout), and asks it what to send again ([`Books::claim`]) and whether
//! everything is delivered ([`Books::all_delivered`]).

use std::collections::VecDeque;
use std::time::Duration;

use crate::ranges::RangeSet;

/// A record written to a connection and not yet known to be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sent {
    offset: u64,
    len: u64,
    /// The connection's byte count (headers included) at the record's
    /// end: delivered once the peer has acknowledged that many.
    end: u64,
    /// Already claimed to be sent again on another connection.
    resent: bool,
}

/// One connection's books.
#[derive(Clone, Debug, Default)]
struct Book {
    /// Bytes handed to the connection's writes so far (headers included).
    queued: u64,
    /// Bytes of those whose write completed: in the kernel's hands.
    written: u64,
    pending: VecDeque<Sent>,
    /// Bytes the peer has acknowledged, as far as known.
    acked: u64,
    /// When `acked` last grew (or the first record was queued).
    progress_at: Duration,
    /// Holding records that wait a timeout: others may send them again.
    stuck: bool,
    /// Bytes unacknowledged at the last observation.
    outq: u64,
    /// The highest [`Observed::progress`] seen.
    progress: Option<u64>,
    /// The records the peer acknowledged on this connection. The peer's
    /// TCP acknowledges what its socket holds, not what the receiver
    /// read: a reset loses what was still unread ([`Books::lost`]).
    acked_ranges: RangeSet,
    /// Lost ([`Books::lost`]): its books no longer count.
    dead: bool,
    /// Held by its peer's closed window at the last observation.
    held: bool,
    /// The kernel cannot be asked about it ([`Books::blind`]): what it
    /// wrote counts as delivered, as without the endgame.
    blind: bool,
}

/// What the kernel says of one sending connection: what it has
/// delivered ([`crate::Probe::delivery`], re-exported as
/// [`crate::Delivery`]), and what the books are told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Bytes written to the socket and not yet acknowledged by the peer
    /// (sent or not).
    pub outq: u64,
    /// In loss recovery by retransmission timeout, or backing off after
    /// one: the bytes it holds wait a timeout at least.
    pub timed_out: bool,
    /// The connection's retransmission timeout.
    pub rto: Duration,
    /// The smallest RTT the connection has seen (`tcpi_min_rtt`), if the
    /// kernel says: what a round trip takes on this path.
    pub min_rtt: Option<Duration>,
    /// Time since the connection last received an acknowledgement
    /// (`tcpi_last_ack_recv`), if the kernel says.
    pub since_ack: Option<Duration>,
    /// The connection has retransmitted at least once: loss is about, and
    /// with it the timeouts the endgame is for (see `Books::lossy`).
    pub lossy: bool,
    /// A count that grows whenever the peer acknowledges anything on the
    /// connection, in the socket's own units (`tcpi_bytes_acked`:
    /// ciphertext under TLS, where `outq` counts plaintext and moves only
    /// in steps). It tells a connection that makes progress from one that
    /// waits, not what was delivered; `None`: only `outq` tells.
    pub progress: Option<u64>,
    /// The connection is gone (reset by the network or the peer): what
    /// it held, and what its peer acknowledged but may not have read, is
    /// to be sent again ([`Books::lost`]).
    pub closed: bool,
    /// Bytes wait to be sent and none are in flight: the peer's receive
    /// window is closed. A receiver that reads slowly (a `--limit-rate`,
    /// a slow disk) opens it again within seconds, and copies on other
    /// connections would only take its reads from the records it still
    /// needs; one that does not read this connection at all is helped by
    /// them. So a held connection is stuck only after a silence of
    /// [`HELD_SILENCE_MIN`] or more (the kernel's zero-window probes back
    /// off as a timeout does: that is no sign here).
    pub held: bool,
}

impl Observed {
    /// Whether the connection, by the kernel's word alone, waits now:
    /// holding bytes its peer has not acknowledged, in a retransmission
    /// timeout or without an acknowledgement for longer than
    /// [`silence_limit`].
    pub fn waiting(&self) -> bool {
        self.outq > 0
            && !self.held
            && (self.timed_out || self.since_ack.is_some_and(|a| a > silence_limit(self)))
    }
}

/// A connection counts as stuck when nothing it holds was acknowledged
/// for longer than this, even without a timeout on record (a floor under
/// its own RTO, which starts at 200 ms on Linux).
const NO_PROGRESS_FLOOR: Duration = Duration::from_millis(200);

/// Silence longer than this many of the path's smallest RTTs (and
/// [`SILENCE_CAP_MIN`]) is stuck, whatever the connection's own RTO says.
/// After a stall of the path, packets held for its length come back as an
/// RTT sample of that length: a connection on an 80 ms path read 17.6 s
/// of RTT after a 30 s stall, set its RTO to 84 s, and left its lost
/// segments waiting for it while the path carried data again.
const SILENCE_CAP_RTTS: u32 = 8;

/// The least silence the cap of [`SILENCE_CAP_RTTS`] allows: under it a
/// timeout of the connection's own (200 ms and up, doubling) is the
/// likelier reason, and will end soon.
const SILENCE_CAP_MIN: Duration = Duration::from_secs(1);

/// The least silence after which a connection held by its peer's closed
/// window ([`Observed::held`]) counts as stuck. A rate-limited reader of
/// 16 connections at 500 kB/s opens each window every 2 s on loopback,
/// whose 64 KiB segments are what a window must open by.
pub const HELD_SILENCE_MIN: Duration = Duration::from_secs(5);

/// How long a held connection may go without an acknowledgement before it
/// counts as stuck: [`HELD_SILENCE_MIN`], or four times what an unheld
/// one may ([`silence_limit`]) where that is longer.
fn held_silence_limit(o: &Observed) -> Duration {
    (silence_limit(o) * 4).max(HELD_SILENCE_MIN)
}

/// How long a connection holding undelivered records may go without an
/// acknowledgement before it counts as stuck: its own RTO, but no more
/// than a few of the path's round trips when the RTO has grown far past
/// them.
pub(crate) fn silence_limit(o: &Observed) -> Duration {
    let cap = o
        .min_rtt
        .filter(|r| !r.is_zero())
        .map(|r| (r * SILENCE_CAP_RTTS).max(SILENCE_CAP_MIN));
    let rto = match cap {
        Some(cap) => o.rto.min(cap),
        None => o.rto,
    };
    rto.max(NO_PROGRESS_FLOOR)
}

/// The endgame's books over every connection of one file transfer.
#[derive(Clone, Debug)]
pub struct Books {
    books: Vec<Book>,
    /// What the receiver had before (a resumed transfer).
    have: RangeSet,
    /// Every byte some connection has delivered, and what the receiver
    /// had before (a resumed transfer).
    delivered: RangeSet,
    len: u64,
    /// Some connection has retransmitted during the transfer.
    lossy: bool,
}

impl Books {
    /// A transfer of `[0, len)` of which the receiver already has `have`.
    pub fn new(len: u64, have: &RangeSet) -> Self {
        Books {
            books: Vec::new(),
            have: have.clamped(len),
            delivered: have.clamped(len),
            len,
            lossy: false,
        }
    }

    /// Register connection `idx` (indices are dense, in order of addition).
    pub fn add_conn(&mut self, idx: usize) {
        if self.books.len() <= idx {
            self.books.resize_with(idx + 1, Book::default);
        }
    }

    /// Connection `idx` is about to write `bytes` (header included); if it
    /// is a record, `record` is its range. `now`: time since the start.
    pub fn queued(&mut self, idx: usize, bytes: u64, record: Option<(u64, u64)>, now: Duration) {
        self.add_conn(idx);
        let b = &mut self.books[idx];
        if b.pending.is_empty() {
            // Waiting on the peer starts now, not when the last record
            // was delivered.
            b.progress_at = now;
        }
        b.queued += bytes;
        if let Some((offset, len)) = record {
            if !self.delivered.covers(offset, offset + len) {
                b.pending.push_back(Sent {
                    offset,
                    len,
                    end: b.queued,
                    resent: false,
                });
            }
        }
    }

    /// Connection `idx`'s write of `bytes` completed.
    pub fn written(&mut self, idx: usize, bytes: u64) {
        self.add_conn(idx);
        self.books[idx].written += bytes;
        if self.books[idx].blind {
            self.trust_written(idx);
        }
    }

    /// Connection `idx` cannot be observed (no probe: the descriptor a
    /// probe keeps could not be had, EMFILE). Its records count as
    /// delivered once written, as they do without the endgame: its books
    /// would otherwise never be settled, and every other connection would
    /// wait on them for good. (It cannot be helped if it gets stuck.)
    pub fn blind(&mut self, idx: usize) {
        self.add_conn(idx);
        self.books[idx].blind = true;
        self.trust_written(idx);
    }

    fn trust_written(&mut self, idx: usize) {
        let b = &mut self.books[idx];
        b.acked = b.written;
        self.settle_acked(idx);
    }

    /// Connection `idx`'s records up to what its peer acknowledged are
    /// delivered.
    fn settle_acked(&mut self, idx: usize) {
        let b = &mut self.books[idx];
        while let Some(s) = b.pending.front() {
            if s.end > b.acked {
                break;
            }
            self.delivered.union(s.offset, s.offset + s.len);
            b.acked_ranges.union(s.offset, s.offset + s.len);
            b.pending.pop_front();
        }
    }

    /// What the kernel says of connection `idx` at `now`: its records up
    /// to what the peer acknowledged are delivered; it is stuck when it
    /// holds undelivered records and is in a timeout, or has seen no
    /// acknowledgement for longer than its RTO.
    pub fn observe(&mut self, idx: usize, o: Observed, now: Duration) {
        self.add_conn(idx);
        let b = &mut self.books[idx];
        if b.dead {
            return;
        }
        // The write in progress is not in `written` yet, while its bytes
        // may already be in the kernel's queue: this underestimates what
        // was acknowledged, never overestimates it.
        b.outq = o.outq;
        self.lossy |= o.lossy;
        let acked = b.written.saturating_sub(o.outq);
        if acked > b.acked {
            b.acked = acked;
            b.progress_at = now;
        }
        // Time with nothing in the kernel (the record's write waits on our
        // own side: `--limit-rate`, a slow read of the file) is no
        // silence; nor is a window that opens again after it was closed
        // (what is sent then needs a round trip to be acknowledged).
        if o.outq == 0 || (b.held && !o.held) {
            b.progress_at = now;
        }
        b.held = o.held;
        // The first count seen is a base, not progress.
        if let Some(p) = o.progress {
            if b.progress.is_some_and(|seen| p > seen) {
                b.progress_at = now;
            }
            b.progress = Some(b.progress.map_or(p, |seen| seen.max(p)));
        }
        self.settle_acked(idx);
        let b = &mut self.books[idx];
        // Records delivered by another connection's copy.
        let delivered = &self.delivered;
        b.pending
            .retain(|s| !delivered.covers(s.offset, s.offset + s.len));
        let silence = now.saturating_sub(b.progress_at);
        let stuck = if o.held {
            silence > held_silence_limit(&o)
        } else {
            o.outq > 0 && (o.timed_out || silence > silence_limit(&o))
        };
        b.stuck = !b.pending.is_empty() && stuck;
    }

    /// Connection `idx` is gone (reset): nothing it carried counts as
    /// delivered any more unless another connection delivered it too. A
    /// reset discards what the receiver's socket still held, acknowledged
    /// or not, and the sender cannot tell how much of what its peer
    /// acknowledged was read: every record the connection carried is
    /// sent again, less what others delivered. Returns those ranges (empty
    /// when it was lost before).
    pub fn lost(&mut self, idx: usize) -> RangeSet {
        self.add_conn(idx);
        let b = &mut self.books[idx];
        let mut again = RangeSet::new();
        if b.dead {
            return again;
        }
        b.dead = true;
        b.stuck = false;
        b.outq = 0;
        for s in b.pending.drain(..) {
            again.union(s.offset, s.offset + s.len);
        }
        let suspect = std::mem::take(&mut b.acked_ranges);
        let mut delivered = self.have.clone();
        for b in self.books.iter().filter(|b| !b.dead) {
            for (a, z) in b.acked_ranges.iter() {
                delivered.union(a, z);
            }
        }
        self.delivered = delivered;
        for (a, z) in suspect.iter() {
            again.union(a, z);
        }
        again.minus(&self.delivered)
    }

    /// Whether connection `idx` was lost ([`Books::lost`]).
    pub fn is_lost(&self, idx: usize) -> bool {
        self.books.get(idx).is_some_and(|b| b.dead)
    }

    /// A record a stuck connection holds that no one has sent again yet,
    /// for connection `helper` to send; it is marked as claimed.
    pub fn claim(&mut self, helper: usize) -> Option<(u64, u64)> {
        let delivered = &self.delivered;
        for (i, b) in self.books.iter_mut().enumerate() {
            if i == helper || !b.stuck {
                continue;
            }
            if let Some(s) = b
                .pending
                .iter_mut()
                .find(|s| !s.resent && !delivered.covers(s.offset, s.offset + s.len))
            {
                s.resent = true;
                return Some((s.offset, s.len));
            }
        }
        None
    }

    /// Whether connection `idx`'s socket held nothing unacknowledged at
    /// its last observation (never observed: it never wrote anything
    /// that is unacknowledged, as far as known). Once every byte is
    /// delivered, a connection that is not clear still holds copies in a
    /// timeout: it is reset rather than given its EOD to write.
    pub fn is_clear(&self, idx: usize) -> bool {
        self.books.get(idx).map_or(true, |b| b.outq == 0)
    }

    /// Whether connection `idx` holds records not yet delivered.
    pub fn holds_undelivered(&self, idx: usize) -> bool {
        self.books.get(idx).is_some_and(|b| !b.pending.is_empty())
    }

    /// Whether some connection has retransmitted. On a path that has lost
    /// nothing so far no connection waits a timeout, and a connection out
    /// of records ends at once: the endgame's wait for every byte to be
    /// acknowledged would cost a round trip for nothing.
    pub fn lossy(&self) -> bool {
        self.lossy
    }

    /// Whether every byte of the transfer has been delivered by some
    /// connection.
    pub fn all_delivered(&self) -> bool {
        self.delivered.is_complete(self.len)
    }

    /// Bytes delivered so far (with what the receiver had before).
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered.covered()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 17;
    const MS: Duration = Duration::from_millis(1);
    const RTO: Duration = Duration::from_millis(300);

    fn obs(outq: u64, timed_out: bool) -> Observed {
        Observed {
            outq,
            timed_out,
            rto: RTO,
            min_rtt: None,
            since_ack: None,
            lossy: timed_out,
            progress: None,
            closed: false,
            held: false,
        }
    }

    /// Connection `idx` writes a whole record.
    fn send(b: &mut Books, idx: usize, offset: u64, len: u64, now: Duration) {
        b.queued(idx, H + len, Some((offset, len)), now);
        b.written(idx, H + len);
    }

    #[test]
    fn records_are_delivered_as_the_peer_acknowledges_them() {
        let mut b = Books::new(300, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        send(&mut b, 0, 100, 100, MS);
        send(&mut b, 1, 200, 100, MS);
        // Conn 0: the first record acknowledged, the second not.
        b.observe(0, obs(H + 100, false), 2 * MS);
        b.observe(1, obs(0, false), 2 * MS);
        assert!(!b.all_delivered());
        assert_eq!(b.delivered_bytes(), 200);
        assert!(b.holds_undelivered(0));
        assert!(!b.holds_undelivered(1));
        b.observe(0, obs(0, false), 3 * MS);
        assert!(b.all_delivered());
    }

    #[test]
    fn a_stuck_connections_records_are_claimed_once_each() {
        let mut b = Books::new(300, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        send(&mut b, 0, 100, 100, MS);
        send(&mut b, 1, 200, 100, MS);
        b.observe(1, obs(0, false), 2 * MS);
        // Conn 0 slow but not stuck: nothing to claim.
        b.observe(0, obs(2 * (H + 100), false), 50 * MS);
        assert_eq!(b.claim(1), None);
        // In a retransmission timeout: its records go to the helper, in
        // order, each once.
        b.observe(0, obs(2 * (H + 100), true), 60 * MS);
        assert_eq!(b.claim(1), Some((0, 100)));
        assert_eq!(b.claim(1), Some((100, 100)));
        assert_eq!(b.claim(1), None);
        // The helper's copies are delivered: everything is, though conn 0
        // never acknowledged its own.
        send(&mut b, 1, 0, 100, 61 * MS);
        send(&mut b, 1, 100, 100, 61 * MS);
        b.observe(1, obs(0, false), 70 * MS);
        assert!(b.all_delivered());
        // And conn 0's records count as delivered by the other copy.
        b.observe(0, obs(2 * (H + 100), true), 80 * MS);
        assert!(!b.holds_undelivered(0));
    }

    /// A receiver that reads slowly (`--limit-rate`) closes its window:
    /// the kernel probes it with a backoff, and nothing is acknowledged
    /// for seconds. Copies elsewhere would only take its reads from the
    /// records it still needs.
    #[test]
    fn a_connection_held_by_its_receivers_window_is_not_stuck() {
        let mut b = Books::new(200, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        send(&mut b, 1, 100, 100, MS);
        b.observe(1, obs(0, false), 2 * MS);
        let held = Observed {
            held: true,
            ..obs(H + 100, true)
        };
        assert!(!held.waiting());
        b.observe(0, held, HELD_SILENCE_MIN);
        assert_eq!(b.claim(1), None);
        // The window opens: silence counts from then, not from the start.
        let opened = HELD_SILENCE_MIN + MS;
        b.observe(0, obs(H + 100, false), opened);
        assert_eq!(b.claim(1), None);
        b.observe(0, obs(H + 100, false), opened + RTO / 2);
        assert_eq!(b.claim(1), None);
        b.observe(0, obs(H + 100, false), opened + RTO + MS);
        assert_eq!(b.claim(1), Some((0, 100)));
        // A window that stays closed, past any slow reader's: this
        // connection is not read at all, and copies help.
        let mut b = Books::new(200, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        send(&mut b, 1, 100, 100, MS);
        b.observe(1, obs(0, false), 2 * MS);
        b.observe(0, held, HELD_SILENCE_MIN);
        assert_eq!(b.claim(1), None);
        b.observe(0, held, HELD_SILENCE_MIN + 2 * MS);
        assert_eq!(b.claim(1), Some((0, 100)));
        // A record whose write waits on the sender's own side (its rate
        // limit): nothing is in the kernel, nothing for the network to
        // deliver, however long.
        let mut b = Books::new(200, &RangeSet::new());
        b.queued(0, H + 100, Some((0, 100)), MS);
        send(&mut b, 1, 100, 100, MS);
        b.observe(1, obs(0, false), 2 * MS);
        b.observe(0, obs(0, false), 5000 * MS);
        assert_eq!(b.claim(1), None);
    }

    /// A connection the kernel cannot be asked about (no probe): what it
    /// writes counts as delivered, so the others do not wait on it.
    #[test]
    fn a_blind_connections_writes_count_as_delivered() {
        let mut b = Books::new(200, &RangeSet::new());
        b.blind(0);
        b.queued(0, H + 100, Some((0, 100)), MS);
        assert!(!b.all_delivered());
        b.written(0, H + 100);
        send(&mut b, 1, 100, 100, MS);
        b.observe(1, obs(0, false), 2 * MS);
        assert!(b.all_delivered());
        assert_eq!(b.claim(1), None);
    }

    #[test]
    fn a_lost_connection_gives_back_all_it_carried_less_what_others_delivered() {
        let mut b = Books::new(500, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        send(&mut b, 0, 100, 100, MS);
        send(&mut b, 0, 200, 100, MS);
        send(&mut b, 1, 300, 100, MS);
        // Conn 1 also carried a copy of [100, 200).
        send(&mut b, 1, 100, 100, MS);
        // Conn 0's peer acknowledged its first two records, not the third.
        b.observe(0, obs(H + 100, false), 2 * MS);
        b.observe(1, obs(0, false), 2 * MS);
        assert_eq!(b.delivered_bytes(), 300);
        // Reset: what it acknowledged may not have been read. [100, 200)
        // came through conn 1 too; the rest goes again.
        let again = b.lost(0);
        assert_eq!(again.iter().collect::<Vec<_>>(), vec![(0, 100), (200, 300)]);
        assert_eq!(b.delivered_bytes(), 200);
        assert!(b.is_lost(0) && !b.holds_undelivered(0) && b.is_clear(0));
        // Lost once: nothing more to give back, and its kernel's word no
        // longer counts.
        assert!(b.lost(0).is_empty());
        b.observe(0, obs(0, false), 3 * MS);
        assert_eq!(b.delivered_bytes(), 200);
        assert_eq!(b.claim(1), None);
        // Sent again on conn 1 and delivered: complete.
        send(&mut b, 1, 0, 100, 4 * MS);
        send(&mut b, 1, 200, 100, 4 * MS);
        b.observe(1, obs(0, false), 5 * MS);
        assert_eq!(b.delivered_bytes(), 400);
        send(&mut b, 1, 400, 100, 6 * MS);
        b.observe(1, obs(0, false), 7 * MS);
        assert!(b.all_delivered());
    }

    #[test]
    fn silence_longer_than_the_rto_is_stuck_too() {
        let mut b = Books::new(100, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        b.observe(0, obs(H + 100, false), 100 * MS);
        assert_eq!(b.claim(1), None);
        b.observe(0, obs(H + 100, false), MS + RTO + MS);
        assert_eq!(b.claim(1), Some((0, 100)));
    }

    /// After a stall of the path the kernel's RTO can be a minute and
    /// more on a path of 80 ms: silence of a few round trips is stuck
    /// then, not the RTO's length.
    #[test]
    fn silence_is_judged_by_the_paths_round_trips_when_the_rto_has_blown_up() {
        let mut b = Books::new(100, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        let blown = |min_rtt| Observed {
            rto: Duration::from_secs(84),
            min_rtt,
            ..obs(H + 100, false)
        };
        let rtt = Duration::from_millis(80);
        // 8 round trips are 640 ms: the floor of 1 s holds.
        b.observe(0, blown(Some(rtt)), MS + Duration::from_millis(900));
        assert_eq!(b.claim(1), None);
        b.observe(0, blown(Some(rtt)), 2 * MS + Duration::from_secs(1));
        assert_eq!(b.claim(1), Some((0, 100)));
        // Without the path's RTT the RTO is all there is.
        let mut b = Books::new(100, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        b.observe(0, blown(None), Duration::from_secs(60));
        assert_eq!(b.claim(1), None);
        // A long path's round trips: 8 x 600 ms.
        let mut b = Books::new(100, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        let long = Some(Duration::from_millis(600));
        b.observe(0, blown(long), Duration::from_millis(4700));
        assert_eq!(b.claim(1), None);
        b.observe(0, blown(long), Duration::from_millis(4900));
        assert_eq!(b.claim(1), Some((0, 100)));
    }

    #[test]
    fn waiting_is_bytes_held_in_a_timeout_or_without_acknowledgements() {
        let at = |outq, timed_out, since_ack: u64| Observed {
            min_rtt: Some(Duration::from_millis(80)),
            since_ack: Some(Duration::from_millis(since_ack)),
            ..obs(outq, timed_out)
        };
        assert!(!at(0, true, 5000).waiting(), "nothing held");
        assert!(at(100, true, 0).waiting());
        // RTO 300 ms, under the cap of 1 s.
        assert!(!at(100, false, 250).waiting());
        assert!(at(100, false, 350).waiting());
        // A blown-up RTO is capped at 8 RTTs, at least 1 s.
        let blown = |since_ack| Observed {
            rto: Duration::from_secs(84),
            ..at(100, false, since_ack)
        };
        assert!(!blown(900).waiting());
        assert!(blown(1100).waiting());
    }

    /// Under TLS `outq` counts plaintext and moves in steps, while the
    /// socket's acknowledgements go on: those keep the connection from
    /// reading as silent, but never count a record as delivered.
    #[test]
    fn acknowledgements_that_outq_does_not_show_yet_are_progress() {
        let mut b = Books::new(100, &RangeSet::new());
        send(&mut b, 0, 0, 100, MS);
        let at = |outq, progress| Observed {
            progress: Some(progress),
            ..obs(outq, false)
        };
        // The first count is a base.
        b.observe(0, at(H + 100, 5000), MS);
        // The socket acknowledges more and more; outq stays.
        let mut now = MS;
        for i in 1..=5u64 {
            now += RTO / 2;
            b.observe(0, at(H + 100, 5000 + i * 1000), now);
            assert_eq!(
                b.claim(1),
                None,
                "acknowledgements at {now:?} are not silence"
            );
            assert!(b.holds_undelivered(0));
        }
        // Then they stop: silent after the RTO, as without the count.
        b.observe(0, at(H + 100, 10_000), now + RTO / 2);
        assert_eq!(b.claim(1), None);
        b.observe(0, at(H + 100, 10_000), now + RTO + MS);
        assert_eq!(b.claim(1), Some((0, 100)));
    }

    #[test]
    fn a_record_being_written_counts_as_undelivered() {
        let mut b = Books::new(100, &RangeSet::new());
        b.queued(0, H + 100, Some((0, 100)), MS);
        // Part of it in the kernel, none acknowledged: outq reports what
        // the kernel holds, `written` does not count the record yet.
        b.observe(0, obs(50, true), 2 * MS);
        assert!(!b.all_delivered());
        assert_eq!(b.claim(1), Some((0, 100)));
    }

    #[test]
    fn a_resumed_transfer_starts_with_what_the_receiver_has() {
        let mut have = RangeSet::new();
        have.union(0, 100);
        let mut b = Books::new(200, &have);
        assert!(!b.all_delivered());
        send(&mut b, 0, 100, 100, MS);
        b.observe(0, obs(0, false), 2 * MS);
        assert!(b.all_delivered());
    }

    #[test]
    fn end_of_data_headers_count_in_the_bytes_acknowledged() {
        let mut b = Books::new(100, &RangeSet::new());
        b.queued(0, H, None, MS);
        b.written(0, H);
        send(&mut b, 0, 0, 100, MS);
        // Only the first header acknowledged.
        b.observe(0, obs(H + 100, false), 2 * MS);
        assert!(!b.all_delivered());
        b.observe(0, obs(0, false), 3 * MS);
        assert!(b.all_delivered());
    }
}
