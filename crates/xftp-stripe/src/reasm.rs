//! Sans-IO receiver accounting: the completion rule.
//!
//! A transfer is complete iff
//! 1. an EOF block has arrived (its offset field is the EOD count `n`),
//! 2. exactly `n` connections have sent EOD, and
//! 3. the received ranges are exactly `[0, total)` with no hole, `total`
//!    being the largest end seen (and equal to the announced size, if any).
//!
//! A connection whose stream ends before its EOD, data after an EOD, and
//! overlapping data are errors. Nothing here does I/O.

use crate::block::{BlockHeader, Descriptor};
use crate::ranges::RangeSet;
use crate::StripeError;

/// Largest data block a receiver takes (GridFTP senders cut 256 KiB to a
/// few MiB; xftp at most 64 MiB).
pub const MAX_RECORD: u64 = 1 << 30;

/// What the caller must do after a header was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Read `count` payload bytes and place them at `offset`.
    pub data: Option<(u64, u64)>,
    /// After that payload, this connection has ended (EOD seen).
    pub end: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    Open,
    Ended,
}

/// Receiver state of one transfer over any number of connections.
#[derive(Clone, Debug, Default)]
pub struct Reassembly {
    ranges: RangeSet,
    conns: Vec<ConnState>,
    eods: u64,
    eof: Option<u64>,
    /// Data blocks whose range is recorded but whose payload is not yet
    /// stored (see [`Reassembly::on_payload_done`]).
    in_flight: u64,
    /// The most connections the receiver will take (an EOF announcing more
    /// could never complete).
    max_conns: Option<u64>,
    /// `max_conns` is the group's size, which the EOF must announce.
    exact_conns: bool,
    /// Duplicates taken ([`Reassembly::take_duplicates`]): the size, and
    /// the bytes actually stored.
    dup: Option<Duplicates>,
}

/// The endgame's receiving rule: a byte range may arrive more than once,
/// also after its connection's EOD (the sender's connections go on
/// sending copies of what a stuck one holds); the first copy is stored,
/// later ones are compared with it. The transfer is complete when every
/// byte of the announced size is stored, whatever connections are still
/// open and whether the EOF block has arrived (a sender resets
/// connections stuck with copies, and one stuck before its EOF never
/// sends it).
#[derive(Clone, Debug, Default)]
struct Duplicates {
    size: u64,
    stored: RangeSet,
}

impl Reassembly {
    /// A fresh transfer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A resumed transfer: `have` is already in place, so the sender
    /// sends only the rest; data over `have` is refused as overlap, and
    /// the completion rule counts `have` as received.
    pub fn with_ranges(have: RangeSet) -> Self {
        Self {
            ranges: have,
            ..Self::default()
        }
    }

    /// Take duplicate ranges (the endgame): see [`Duplicates`]. Needs the
    /// size out of band; what is already in place (`with_ranges`) counts
    /// as stored.
    pub fn take_duplicates(&mut self, size: u64) {
        self.dup = Some(Duplicates {
            size,
            stored: self.ranges.clamped(size),
        });
    }

    /// Whether duplicates are taken.
    pub fn takes_duplicates(&self) -> bool {
        self.dup.is_some()
    }

    /// With duplicates taken: the parts of `[start, end)` already stored,
    /// which a new copy must match instead of overwrite.
    pub fn stored_within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.dup
            .as_ref()
            .map_or_else(Vec::new, |d| d.stored.overlaps(start, end))
    }

    /// With duplicates taken: `[start, end)` is stored.
    pub fn on_stored(&mut self, start: u64, end: u64) {
        if let Some(d) = self.dup.as_mut() {
            d.stored.union(start, end);
        }
    }

    /// Refuse an EOF block that announces more than `max` connections:
    /// the receiver would wait for EODs from connections it never takes.
    pub fn limit_connections(&mut self, max: u64) {
        self.max_conns = Some(max);
    }

    /// A fixed group of `n` connections (the parallel-sockets stream):
    /// an EOF block must announce exactly `n`.
    pub fn require_connections(&mut self, n: u64) {
        self.max_conns = Some(n);
        self.exact_conns = true;
    }

    /// Register a data connection; returns its index.
    pub fn add_conn(&mut self) -> usize {
        self.conns.push(ConnState::Open);
        self.conns.len() - 1
    }

    /// A header arrived on connection `conn`. On `Ok`, the data range (if
    /// any) is already recorded, so a duplicate arriving on another
    /// connection is refused even before this payload is read.
    pub fn on_header(&mut self, conn: usize, h: &BlockHeader) -> Result<Accepted, StripeError> {
        let state = self
            .conns
            .get(conn)
            .copied()
            .ok_or(StripeError::BadIndex(conn))?;
        if state == ConnState::Ended && self.dup.is_none() {
            return Err(StripeError::DataAfterEod { conn });
        }
        let d = h.descriptor;
        if d.contains(Descriptor::RESTART_MARKER) {
            return Err(StripeError::Unsupported("restart marker blocks"));
        }
        let mut data = None;
        if d.contains(Descriptor::EOF) {
            if self.eof.is_some() {
                return Err(StripeError::DuplicateEof);
            }
            if let Some(max) = self.max_conns.filter(|&m| h.offset > m) {
                return Err(StripeError::TooManyConnections {
                    announced: h.offset,
                    max,
                });
            }
            if let Some(n) = self
                .max_conns
                .filter(|&n| self.exact_conns && h.offset != n)
            {
                return Err(StripeError::WrongGroup {
                    announced: h.offset,
                    group: n,
                });
            }
            self.eof = Some(h.offset);
        } else if h.count > MAX_RECORD {
            // No sender cuts records this large; a count near 2^64 is an
            // attack or garbage, refused before a byte of it is read.
            return Err(StripeError::BlockTooLarge {
                count: h.count,
                max: MAX_RECORD,
            });
        } else if h.count > 0 {
            if let Some(dup) = &self.dup {
                // The size is known: nothing past it is taken (a copy
                // is checked against the first when stored).
                if h.end() > dup.size {
                    return Err(StripeError::PastSize {
                        end: h.end(),
                        size: dup.size,
                    });
                }
                self.ranges.union(h.offset, h.end());
            } else {
                self.ranges
                    .insert(h.offset, h.end())
                    .map_err(|o| StripeError::Overlap {
                        start: o.start,
                        end: o.end,
                    })?;
            }
            data = Some((h.offset, h.count));
            self.in_flight += 1;
        }
        let end = d.contains(Descriptor::EOD);
        if end && state == ConnState::Open {
            self.conns[conn] = ConnState::Ended;
            self.eods += 1;
        }
        if let (Some(n), None) = (self.eof, &self.dup) {
            if self.eods > n {
                return Err(StripeError::TooManyEods {
                    expected: n,
                    seen: self.eods,
                });
            }
        }
        Ok(Accepted { data, end })
    }

    /// The byte stream of `conn` ended (TCP FIN) or failed. Before its EOD
    /// that is an error; after it, harmless.
    pub fn on_closed(&mut self, conn: usize) -> Result<(), StripeError> {
        match self.conns.get(conn) {
            Some(ConnState::Ended) => Ok(()),
            Some(ConnState::Open) => Err(StripeError::ClosedBeforeEod { conn }),
            None => Err(StripeError::BadIndex(conn)),
        }
    }

    /// Connection `conn` closed cleanly before sending any byte: it was
    /// never used (for example added after the sender sent EOF). Harmless;
    /// it does not count as an EOD.
    pub fn on_unused(&mut self, conn: usize) -> Result<(), StripeError> {
        match self.conns.get(conn) {
            Some(ConnState::Open) => {
                self.conns[conn] = ConnState::Ended;
                Ok(())
            }
            Some(ConnState::Ended) => Ok(()),
            None => Err(StripeError::BadIndex(conn)),
        }
    }

    /// The payload of a data block accepted by [`Reassembly::on_header`]
    /// has been stored.
    pub fn on_payload_done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Whether the completion rule holds now (and every accepted payload
    /// has been stored).
    pub fn is_done(&self) -> bool {
        if let Some(d) = &self.dup {
            return d.stored.is_complete(d.size);
        }
        self.eof == Some(self.eods)
            && self.in_flight == 0
            && self.ranges.is_complete(self.ranges.max_end())
    }

    /// Whether connection `conn` has sent its EOD.
    pub fn conn_ended(&self, conn: usize) -> bool {
        self.conns.get(conn) == Some(&ConnState::Ended)
    }

    /// The byte ranges recorded so far.
    pub fn ranges(&self) -> &RangeSet {
        &self.ranges
    }

    /// EODs seen so far and the count announced by EOF (if seen).
    pub fn eod_progress(&self) -> (u64, Option<u64>) {
        (self.eods, self.eof)
    }

    /// Final verdict, when no more input will come: the total size if the
    /// transfer is complete, otherwise why not. `expected` is a size the
    /// sender announced out of band (e.g. FTP SIZE), if any.
    pub fn finish(&self, expected: Option<u64>) -> Result<u64, StripeError> {
        if let Some(d) = &self.dup {
            // Every byte stored is all that counts; connections may have
            // been reset with copies still on them.
            if let Some((at, _)) = d.stored.missing(d.size).first() {
                return Err(StripeError::Hole {
                    at: *at,
                    total: d.size,
                });
            }
            if self.ranges.max_end() > d.size {
                return Err(StripeError::SizeMismatch {
                    expected: d.size,
                    got: self.ranges.max_end(),
                });
            }
            return Ok(d.size);
        }
        let Some(n) = self.eof else {
            return Err(StripeError::MissingEof);
        };
        if self.eods != n {
            return Err(StripeError::MissingEods {
                expected: n,
                seen: self.eods,
            });
        }
        let total = self.ranges.max_end();
        if let Some(at) = self.ranges.first_hole() {
            return Err(StripeError::Hole { at, total });
        }
        if let Some(e) = expected {
            if e != total {
                return Err(StripeError::SizeMismatch {
                    expected: e,
                    got: total,
                });
            }
        }
        Ok(total)
    }
}

/// Fuzz entry: drive a [`Reassembly`] with operations decoded from
/// `data` (connections added, headers of any kind on any connection,
/// streams closed, payloads stored) and check it against a naive model.
/// Panics if it accepts two overlapping ranges, says it is done when the
/// completion rule does not hold, or `finish` disagrees with the rule.
/// Any error ends the run, as it ends a transfer. Returns whether the
/// transfer was complete at the end.
#[doc(hidden)]
pub fn fuzz_reassembly(data: &[u8]) -> bool {
    let mut r = Reassembly::new();
    let mut conns = 0usize;
    let mut accepted: Vec<(u64, u64)> = Vec::new();
    let mut stored = 0usize;
    let mut eods = 0u64;
    let mut eof = None;
    let mut it = data.iter().copied();
    let mut byte = || it.next();
    while let Some(op) = byte() {
        // A connection index, sometimes one that does not exist.
        let mut conn = || byte().map_or(0, |b| usize::from(b) % (conns + 1));
        let ok = match op % 6 {
            0 if conns < 64 => {
                conns = r.add_conn() + 1;
                true
            }
            1 => {
                let c = conn();
                let (d, a, b) = (
                    byte().unwrap_or(0),
                    byte().unwrap_or(0),
                    byte().unwrap_or(0),
                );
                // Small offsets and counts, so that ranges meet, overlap
                // and leave holes; a flag byte picks the kind.
                let h = match d % 4 {
                    0 => BlockHeader::data(u64::from(a) * 4, u64::from(b % 16)),
                    1 => BlockHeader::eod(),
                    2 => BlockHeader::eof(u64::from(a % 4)),
                    _ => BlockHeader {
                        descriptor: Descriptor::from_bits(d & 0xfc).unwrap_or(Descriptor::NONE),
                        count: u64::from(b % 16) * u64::from(d & 0x40 == 0),
                        offset: u64::from(a) * 4,
                    },
                };
                let Ok(acc) = r.on_header(c, &h) else {
                    return false;
                };
                if let Some((off, n)) = acc.data {
                    let end = off + n;
                    assert!(
                        accepted.iter().all(|&(s, e)| end <= s || off >= e),
                        "accepted {off}..{end} over {accepted:?}"
                    );
                    accepted.push((off, end));
                }
                if h.descriptor.contains(Descriptor::EOF) {
                    assert!(eof.is_none(), "a second EOF accepted");
                    eof = Some(h.offset);
                }
                if acc.end {
                    eods += 1;
                }
                true
            }
            2 => r.on_closed(conn()).is_ok(),
            3 => r.on_unused(conn()).is_ok(),
            4 => {
                r.on_payload_done();
                stored = (stored + 1).min(accepted.len());
                true
            }
            _ => true,
        };
        if !ok {
            return false;
        }
        let total = accepted.iter().map(|&(_, e)| e).max().unwrap_or(0);
        let covered: u64 = accepted.iter().map(|&(s, e)| e - s).sum();
        let rule = eof == Some(eods) && covered == total;
        if r.is_done() {
            assert!(rule && stored == accepted.len(), "done without the rule");
        }
        match r.finish(None) {
            Ok(t) => assert!(rule && t == total, "finish Ok({t}) without the rule"),
            Err(_) => assert!(!rule, "the rule holds but finish refused"),
        }
    }
    r.is_done()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_that_takes_copies_takes_nothing_past_the_size() {
        let mut r = Reassembly::new();
        r.take_duplicates(100);
        let c = r.add_conn();
        assert!(r.on_header(c, &BlockHeader::data(0, 100)).is_ok());
        assert!(r.on_header(c, &BlockHeader::data(50, 50)).is_ok());
        assert_eq!(
            r.on_header(c, &BlockHeader::data(90, 11)).unwrap_err(),
            StripeError::PastSize {
                end: 101,
                size: 100
            }
        );
    }

    #[test]
    fn fuzz_entry_survives_random_operations() {
        // A quick stand-in for `cargo fuzz run reassembly` (fuzz/README.md).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2000 {
            let data: Vec<u8> = (0..len % 300)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            fuzz_reassembly(&data);
        }
        // A complete two-connection transfer in the entry's encoding: two
        // connections, data 0..4 on the first and 4..8 on the second, both
        // payloads stored, EOD on the second, EOF (2 EODs) on the first.
        let complete = [
            0, 0, 1, 0, 0, 0, 4, 1, 1, 0, 1, 4, 4, 4, 1, 1, 1, 0, 0, 1, 0, 2, 2, 0,
        ];
        assert!(fuzz_reassembly(&complete));
        // One payload not yet stored: not complete.
        let mut unstored = complete.to_vec();
        unstored.remove(12);
        assert!(!fuzz_reassembly(&unstored));
    }

    #[test]
    fn an_eof_announcing_more_connections_than_taken_is_refused() {
        let mut r = Reassembly::new();
        r.limit_connections(2);
        let a = r.add_conn();
        assert_eq!(
            r.on_header(a, &BlockHeader::eof(8)),
            Err(StripeError::TooManyConnections {
                announced: 8,
                max: 2
            })
        );
        let mut r = Reassembly::new();
        r.limit_connections(2);
        let a = r.add_conn();
        assert!(r.on_header(a, &BlockHeader::eof(2)).is_ok());
    }

    #[test]
    fn two_connections_complete() {
        let mut r = Reassembly::new();
        let a = r.add_conn();
        let b = r.add_conn();
        r.on_header(a, &BlockHeader::data(0, 10)).unwrap();
        r.on_header(b, &BlockHeader::data(10, 5)).unwrap();
        assert!(!r.is_done());
        r.on_payload_done();
        r.on_header(b, &BlockHeader::eod()).unwrap();
        assert!(!r.is_done());
        let acc = r.on_header(a, &BlockHeader::eof(2)).unwrap();
        assert_eq!(
            acc,
            Accepted {
                data: None,
                end: true
            }
        );
        // One payload is still being stored: not done yet.
        assert!(!r.is_done());
        r.on_payload_done();
        assert!(r.is_done());
        assert_eq!(r.finish(Some(15)), Ok(15));
        assert_eq!(
            r.finish(Some(16)),
            Err(StripeError::SizeMismatch {
                expected: 16,
                got: 15
            })
        );
        r.on_closed(a).unwrap();
    }

    #[test]
    fn unused_late_connection_is_harmless() {
        let mut r = Reassembly::new();
        let a = r.add_conn();
        r.on_header(a, &BlockHeader::data(0, 4)).unwrap();
        r.on_payload_done();
        r.on_header(a, &BlockHeader::eof(1)).unwrap();
        let late = r.add_conn();
        assert!(r.is_done());
        r.on_unused(late).unwrap();
        assert_eq!(r.finish(None), Ok(4));
    }

    #[test]
    fn hole_is_never_success() {
        let mut r = Reassembly::new();
        let a = r.add_conn();
        r.on_header(a, &BlockHeader::data(5, 5)).unwrap();
        r.on_header(a, &BlockHeader::eof(1)).unwrap();
        assert!(!r.is_done());
        assert_eq!(r.finish(None), Err(StripeError::Hole { at: 0, total: 10 }));
    }

    #[test]
    fn protocol_violations() {
        let mut r = Reassembly::new();
        let a = r.add_conn();
        let b = r.add_conn();
        r.on_header(a, &BlockHeader::data(0, 10)).unwrap();
        assert!(matches!(
            r.on_header(b, &BlockHeader::data(9, 1)),
            Err(StripeError::Overlap { .. })
        ));
        assert_eq!(
            r.on_closed(b),
            Err(StripeError::ClosedBeforeEod { conn: 1 })
        );
        r.on_header(a, &BlockHeader::eof(1)).unwrap();
        assert_eq!(
            r.on_header(a, &BlockHeader::data(10, 1)),
            Err(StripeError::DataAfterEod { conn: 0 })
        );
        assert_eq!(
            r.on_header(b, &BlockHeader::eod()),
            Err(StripeError::TooManyEods {
                expected: 1,
                seen: 2
            })
        );
    }

    #[test]
    fn missing_eods_and_eof() {
        let mut r = Reassembly::new();
        let a = r.add_conn();
        assert_eq!(r.finish(None), Err(StripeError::MissingEof));
        r.on_header(a, &BlockHeader::eof(3)).unwrap();
        assert_eq!(
            r.finish(None),
            Err(StripeError::MissingEods {
                expected: 3,
                seen: 1
            })
        );
    }
}
