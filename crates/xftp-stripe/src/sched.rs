//! Sans-IO record scheduler: which bytes a connection sends next.
//!
//! A connection asks for work with [`Scheduler::next`] only when it can
//! write, so under [`Schedule::Dynamic`] a fast connection takes many
//! records and a slow one few (XFTP: m ≫ n records, each sent on whichever
//! connection has room). [`Schedule::Static`] gives connection i the i-th of
//! n equal contiguous parts (PSockets), cut into records only to bound
//! memory.
//!
//! The available length may grow ([`Scheduler::extend`]) until
//! [`Scheduler::close`]: a byte stream is scheduled like a file whose end is
//! not known yet.

use crate::ranges::RangeSet;

/// How records are assigned to connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// The next record goes to whichever connection asks first.
    #[default]
    Dynamic,
    /// n equal contiguous parts, one per connection, fixed up front.
    Static,
}

/// What a connection should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send `len` bytes at `offset`.
    Record {
        /// Offset of the record.
        offset: u64,
        /// Length (1..=record_size).
        len: u64,
    },
    /// Nothing available now, but more may come (stream not closed).
    Wait,
    /// This connection is finished: send its EOD.
    Done,
}

#[derive(Clone, Debug)]
struct Conn {
    /// Own part for static scheduling, `[start, end)`.
    part: (u64, u64),
    retired: bool,
}

/// Hands out records to connections. Records handed to any one connection
/// have increasing offsets (a property the ordered-stream receiver relies
/// on), and every byte of `[0, len)` is handed out exactly once.
#[derive(Clone, Debug)]
pub struct Scheduler {
    schedule: Schedule,
    record_size: u64,
    available: u64,
    closed: bool,
    cursor: u64,
    conns: Vec<Conn>,
    /// Ranges given back by retired static connections, taken by anyone.
    leftovers: Vec<(u64, u64)>,
    /// Ranges the receiver already has (a resumed transfer): never sent.
    skip: RangeSet,
    /// Bytes of `skip` at or after `cursor`.
    skip_ahead: u64,
}

/// A scheduler request that cannot be honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// Static partitioning fixes the connection count up front.
    #[error("static scheduling cannot add connections")]
    StaticAdd,
    /// No such connection.
    #[error("no connection {0}")]
    BadIndex(usize),
    /// Length would shrink, or grow after close.
    #[error("length change after close or backwards")]
    BadLength,
}

impl Scheduler {
    /// Dynamic scheduling of `len` bytes (already final).
    pub fn dynamic(record_size: u32, len: u64) -> Self {
        let mut s = Self::stream(record_size);
        s.available = len;
        s.closed = true;
        s
    }

    /// Dynamic scheduling of a stream whose length grows with
    /// [`extend`](Self::extend) until [`close`](Self::close).
    pub fn stream(record_size: u32) -> Self {
        Self {
            schedule: Schedule::Dynamic,
            record_size: u64::from(record_size.max(1)),
            available: 0,
            closed: false,
            cursor: 0,
            conns: Vec::new(),
            leftovers: Vec::new(),
            skip: RangeSet::new(),
            skip_ahead: 0,
        }
    }

    /// Dynamic scheduling of the bytes of `[0, len)` that are not in
    /// `have` (the ranges a resuming receiver already holds).
    pub fn dynamic_except(record_size: u32, len: u64, have: &RangeSet) -> Self {
        let mut s = Self::dynamic(record_size, len);
        s.skip = have.clamped(len);
        s.skip_ahead = s.skip.covered();
        s
    }

    /// Static scheduling of `len` bytes over exactly `n` connections
    /// (indices `0..n` are created here).
    pub fn fixed(record_size: u32, len: u64, n: usize) -> Self {
        let mut s = Self::dynamic(record_size, len);
        s.schedule = Schedule::Static;
        let n64 = n.max(1) as u64;
        for i in 0..n as u64 {
            // Spread the remainder: part i is [i*len/n, (i+1)*len/n).
            let a = mul_div(i, len, n64);
            let b = mul_div(i + 1, len, n64);
            s.conns.push(Conn {
                part: (a, b),
                retired: false,
            });
        }
        s.cursor = len;
        s
    }

    /// Which policy this scheduler follows.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// Register a new connection and return its index.
    pub fn add_conn(&mut self) -> Result<usize, SchedError> {
        if self.schedule == Schedule::Static {
            return Err(SchedError::StaticAdd);
        }
        self.conns.push(Conn {
            part: (0, 0),
            retired: false,
        });
        Ok(self.conns.len() - 1)
    }

    /// Number of connections ever registered.
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// Stop giving records to `idx`; its next [`next`](Self::next) is
    /// `Done`. A static part not yet sent goes to whoever asks next.
    pub fn retire(&mut self, idx: usize) -> Result<(), SchedError> {
        let c = self.conns.get_mut(idx).ok_or(SchedError::BadIndex(idx))?;
        c.retired = true;
        if c.part.0 < c.part.1 {
            self.leftovers.push(c.part);
            c.part = (c.part.1, c.part.1);
        }
        Ok(())
    }

    /// Hand `[start, end)` out again (a connection that carried it was
    /// lost): taken before anything new, lowest offsets first.
    pub fn give_back(&mut self, start: u64, end: u64) {
        if start < end {
            // `leftovers` is taken from its end.
            let at = self
                .leftovers
                .iter()
                .position(|l| l.0 < start)
                .unwrap_or(self.leftovers.len());
            self.leftovers.insert(at, (start, end));
        }
    }

    /// A record of what was handed back ([`Scheduler::give_back`]) or left
    /// by a retired connection, for any connection, even one past its end.
    pub fn next_leftover(&mut self) -> Option<(u64, u64)> {
        let rs = self.record_size;
        let l = self.leftovers.last_mut()?;
        let offset = l.0;
        let len = rs.min(l.1 - offset);
        l.0 += len;
        if l.0 >= l.1 {
            self.leftovers.pop();
        }
        Some((offset, len))
    }

    /// Make bytes up to `len` available.
    pub fn extend(&mut self, len: u64) -> Result<(), SchedError> {
        if self.closed || len < self.available {
            return Err(SchedError::BadLength);
        }
        self.available = len;
        Ok(())
    }

    /// No more bytes will be added.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Bytes made available so far.
    pub fn available(&self) -> u64 {
        self.available
    }

    /// Offset below which every byte has been handed out (dynamic only).
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Closed, and every byte handed out.
    pub fn exhausted(&self) -> bool {
        self.closed
            && self.cursor >= self.available
            && self.leftovers.is_empty()
            && self.conns.iter().all(|c| c.part.0 >= c.part.1)
    }

    /// The next record for connection `idx`.
    pub fn next(&mut self, idx: usize) -> Next {
        let rs = self.record_size;
        let Some(c) = self.conns.get_mut(idx) else {
            return Next::Done;
        };
        if c.retired {
            return Next::Done;
        }
        if c.part.0 < c.part.1 {
            let offset = c.part.0;
            let len = rs.min(c.part.1 - offset);
            c.part.0 += len;
            return Next::Record { offset, len };
        }
        if let Some(l) = self.leftovers.last_mut() {
            let offset = l.0;
            let len = rs.min(l.1 - offset);
            l.0 += len;
            if l.0 >= l.1 {
                self.leftovers.pop();
            }
            return Next::Record { offset, len };
        }
        if self.schedule == Schedule::Static {
            return Next::Done;
        }
        // Step over what the receiver has; stop records short of it.
        let mut limit = self.available;
        while let Some((a, b)) = self.skip.at_or_after(self.cursor) {
            if a <= self.cursor {
                self.skip_ahead -= b - a;
                self.cursor = b.max(self.cursor);
                continue;
            }
            limit = limit.min(a);
            break;
        }
        if self.cursor < self.available {
            let offset = self.cursor;
            let rest = (self.available - offset).saturating_sub(self.skip_ahead);
            let room = limit - offset;
            let len = if self.closed {
                rs.min(self.tail_len(rest))
            } else {
                rs.min(rest)
            }
            .min(room)
            .max(1);
            self.cursor += len;
            return Next::Record { offset, len };
        }
        if self.closed {
            Next::Done
        } else {
            Next::Wait
        }
    }

    /// Near the end of a known length, records shrink (guided
    /// self-scheduling): each takes at most 1/(2n) of what is left for n
    /// connections, never under [`TAIL_MIN`]. A connection in loss
    /// recovery that takes the last full-size record holds up the whole
    /// transfer while the others sit idle; smaller last records leave it
    /// less to finish.
    fn tail_len(&self, rest: u64) -> u64 {
        let live = self.conns.iter().filter(|c| !c.retired).count().max(1) as u64;
        (rest / (2 * live))
            .max(TAIL_MIN.min(self.record_size))
            .min(rest)
    }
}

/// Smallest record the end of a transfer is cut into: below this, headers
/// and wake-ups start to cost.
const TAIL_MIN: u64 = 16 * 1024;

fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    // Exact in 128 bits; the result is ≤ b because a ≤ c.
    ((u128::from(a) * u128::from(b)) / u128::from(c)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::RangeSet;

    fn drain(s: &mut Scheduler, order: &[usize]) -> (RangeSet, Vec<u64>) {
        let mut got = RangeSet::new();
        let mut per = vec![0u64; s.conn_count()];
        let mut last = vec![0u64; s.conn_count()];
        let mut done = vec![false; s.conn_count()];
        let mut i = 0;
        while done.iter().any(|d| !d) {
            let c = order[i % order.len()] % s.conn_count();
            i += 1;
            if done[c] {
                continue;
            }
            match s.next(c) {
                Next::Record { offset, len } => {
                    assert!(offset >= last[c], "offsets increase per connection");
                    last[c] = offset;
                    got.insert(offset, offset + len).unwrap();
                    per[c] += len;
                }
                Next::Done => done[c] = true,
                Next::Wait => panic!("closed scheduler waits"),
            }
        }
        (got, per)
    }

    #[test]
    fn ranges_given_back_go_first_lowest_first_to_anyone() {
        let mut s = Scheduler::dynamic(100, 1000);
        s.add_conn().unwrap();
        s.add_conn().unwrap();
        s.close();
        assert_eq!(
            s.next(0),
            Next::Record {
                offset: 0,
                len: 100
            }
        );
        s.give_back(500, 650);
        s.give_back(0, 100);
        assert!(!s.exhausted());
        assert_eq!(
            s.next(1),
            Next::Record {
                offset: 0,
                len: 100
            }
        );
        assert_eq!(s.next_leftover(), Some((500, 100)));
        assert_eq!(
            s.next(0),
            Next::Record {
                offset: 600,
                len: 50
            }
        );
        assert_eq!(s.next_leftover(), None);
        assert_eq!(
            s.next(1),
            Next::Record {
                offset: 100,
                len: 100
            }
        );
    }

    #[test]
    fn dynamic_covers_everything_once() {
        for len in [0u64, 1, 99, 100, 101, 12345] {
            let mut s = Scheduler::dynamic(100, len);
            for _ in 0..3 {
                s.add_conn().unwrap();
            }
            let (got, _) = drain(&mut s, &[0, 0, 1, 2, 0]);
            assert!(got.is_complete(len));
            assert!(s.exhausted());
        }
    }

    #[test]
    fn the_last_records_shrink() {
        // 10 MiB in 256 KiB records over 8 connections: the last record
        // any connection takes is small, and the cut adds few records.
        let (rs, len) = (256 * 1024u64, 10 << 20);
        let mut s = Scheduler::dynamic(rs as u32, len);
        for _ in 0..8 {
            s.add_conn().unwrap();
        }
        let mut recs = Vec::new();
        while let Next::Record { offset, len } = s.next(recs.len() % 8) {
            recs.push((offset, len));
        }
        let covered: u64 = recs.iter().map(|r| r.1).sum();
        assert_eq!(covered, len);
        assert!(recs.iter().all(|r| r.1 <= rs && r.1 > 0));
        let last8: Vec<u64> = recs.iter().rev().take(8).map(|r| r.1).collect();
        assert!(last8.iter().all(|&l| l <= TAIL_MIN), "{last8:?}");
        // 40 full records; the cut adds about 2n·ln(2n·rs / TAIL_MIN).
        assert!(recs.len() <= 40 + 16 * 6, "{} records", recs.len());
        // A file of one small record is not cut further.
        let mut s = Scheduler::dynamic(rs as u32, 1000);
        s.add_conn().unwrap();
        assert_eq!(
            s.next(0),
            Next::Record {
                offset: 0,
                len: 1000
            }
        );
        // Nor is a stream whose end is not known yet.
        let mut s = Scheduler::stream(rs as u32);
        s.add_conn().unwrap();
        s.extend(len).unwrap();
        assert_eq!(s.next(0), Next::Record { offset: 0, len: rs });
    }

    #[test]
    fn static_parts_are_equal_and_contiguous() {
        let mut s = Scheduler::fixed(7, 1000, 3);
        assert_eq!(s.add_conn(), Err(SchedError::StaticAdd));
        // Connection 0 asks far more often, yet sends only its third.
        let (got, per) = drain(&mut s, &[0, 0, 0, 0, 1, 2]);
        assert!(got.is_complete(1000));
        assert_eq!(per, vec![333, 333, 334]);
    }

    #[test]
    fn retire_hands_back_work() {
        let mut s = Scheduler::fixed(10, 100, 2);
        assert!(matches!(
            s.next(1),
            Next::Record {
                offset: 50,
                len: 10
            }
        ));
        s.retire(1).unwrap();
        assert_eq!(s.next(1), Next::Done);
        let (got, per) = drain(&mut s, &[0, 1]);
        assert_eq!(per, vec![90, 0]);
        let mut all = got;
        all.insert(50, 60).unwrap();
        assert!(all.is_complete(100));
    }

    #[test]
    fn resumed_schedules_only_what_is_missing() {
        let mut have = RangeSet::new();
        have.insert(0, 100).unwrap();
        have.insert(250, 260).unwrap();
        have.insert(900, 1000).unwrap();
        let mut s = Scheduler::dynamic_except(64, 1000, &have);
        let a = s.add_conn().unwrap();
        let b = s.add_conn().unwrap();
        let (got, _) = drain(&mut s, &[a, b, b, a]);
        let mut want = RangeSet::new();
        want.insert(100, 250).unwrap();
        want.insert(260, 900).unwrap();
        assert_eq!(got, want);
        // Everything present: nothing to send.
        let mut all = RangeSet::new();
        all.insert(0, 1000).unwrap();
        let mut s = Scheduler::dynamic_except(64, 1000, &all);
        let c = s.add_conn().unwrap();
        assert_eq!(s.next(c), Next::Done);
    }

    #[test]
    fn stream_waits_until_closed() {
        let mut s = Scheduler::stream(4);
        let c = s.add_conn().unwrap();
        assert_eq!(s.next(c), Next::Wait);
        s.extend(6).unwrap();
        assert_eq!(s.next(c), Next::Record { offset: 0, len: 4 });
        assert_eq!(s.next(c), Next::Record { offset: 4, len: 2 });
        assert_eq!(s.next(c), Next::Wait);
        assert_eq!(s.extend(5), Err(SchedError::BadLength));
        s.close();
        assert_eq!(s.next(c), Next::Done);
        assert!(s.exhausted());
    }
}
