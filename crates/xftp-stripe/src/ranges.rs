//! A set of received half-open byte ranges `[start, end)`.

use std::collections::BTreeMap;

/// Disjoint, coalesced `[start, end)` ranges. Inserting a range that
/// overlaps one already present is refused: in a striped transfer every byte
/// arrives exactly once, so overlap means a duplicate or a confused sender.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end, no two touching (adjacent ranges are merged).
    map: BTreeMap<u64, u64>,
    covered: u64,
}

/// An inserted range overlapped bytes already present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("range [{start}, {end}) overlaps data already received")]
pub struct Overlap {
    /// Start of the refused range.
    pub start: u64,
    /// End of the refused range.
    pub end: u64,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `[start, end)`. Empty ranges are accepted and change nothing.
    /// On overlap the set is left unchanged.
    pub fn insert(&mut self, start: u64, end: u64) -> Result<(), Overlap> {
        if end <= start {
            return Ok(());
        }
        let err = Overlap { start, end };
        // The range starting at or before `start`.
        let prev = self.map.range(..=start).next_back().map(|(&s, &e)| (s, e));
        if let Some((_, pe)) = prev {
            if pe > start {
                return Err(err);
            }
        }
        // The first range starting after `start`.
        let next = self
            .map
            .range((std::ops::Bound::Excluded(start), std::ops::Bound::Unbounded))
            .next()
            .map(|(&s, &e)| (s, e));
        if let Some((ns, _)) = next {
            if ns < end {
                return Err(err);
            }
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((ps, pe)) = prev {
            if pe == start {
                self.map.remove(&ps);
                new_start = ps;
            }
        }
        if let Some((ns, ne)) = next {
            if ns == end {
                self.map.remove(&ns);
                new_end = ne;
            }
        }
        self.map.insert(new_start, new_end);
        self.covered += end - start;
        Ok(())
    }

    /// End of the contiguous range starting at 0 (0 if byte 0 is missing).
    pub fn contiguous_prefix(&self) -> u64 {
        match self.map.first_key_value() {
            Some((&0, &e)) => e,
            _ => 0,
        }
    }

    /// Whether the set is exactly `[0, len)`: every byte, nothing beyond.
    pub fn is_complete(&self, len: u64) -> bool {
        if len == 0 {
            self.map.is_empty()
        } else {
            self.map.len() == 1 && self.contiguous_prefix() == len
        }
    }

    /// The largest end of any range (0 when empty).
    pub fn max_end(&self) -> u64 {
        self.map.last_key_value().map_or(0, |(_, &e)| e)
    }

    /// Total number of bytes covered.
    pub fn covered(&self) -> u64 {
        self.covered
    }

    /// Whether no byte is present.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The first byte missing below `max_end()`, if any.
    pub fn first_hole(&self) -> Option<u64> {
        let p = self.contiguous_prefix();
        (p < self.max_end()).then_some(p)
    }

    /// The ranges in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }

    /// Add `[start, end)`, merging with whatever it overlaps (a byte range
    /// written twice, as a resumed stream-mode download does).
    pub fn union(&mut self, start: u64, end: u64) {
        if end <= start {
            return;
        }
        let (mut s, mut e) = (start, end);
        let touching: Vec<(u64, u64)> = self
            .map
            .range(..=end)
            .rev()
            .take_while(|(_, &pe)| pe >= start)
            .map(|(&ps, &pe)| (ps, pe))
            .collect();
        for (ps, pe) in touching {
            self.map.remove(&ps);
            self.covered -= pe - ps;
            s = s.min(ps);
            e = e.max(pe);
        }
        self.map.insert(s, e);
        self.covered += e - s;
    }

    /// The range that holds `pos`, or else the first one after it.
    pub fn at_or_after(&self, pos: u64) -> Option<(u64, u64)> {
        if let Some((&s, &e)) = self.map.range(..=pos).next_back() {
            if e > pos {
                return Some((s, e));
            }
        }
        self.map
            .range((std::ops::Bound::Excluded(pos), std::ops::Bound::Unbounded))
            .next()
            .map(|(&s, &e)| (s, e))
    }

    /// Whether every byte of `[start, end)` is present (an empty range
    /// always is).
    pub fn covers(&self, start: u64, end: u64) -> bool {
        end <= start
            || self
                .at_or_after(start)
                .is_some_and(|(s, e)| s <= start && e >= end)
    }

    /// The parts of `[start, end)` that are present, in order.
    pub fn overlaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            match self.at_or_after(at) {
                Some((s, e)) if s < end => {
                    out.push((s.max(at), e.min(end)));
                    at = e;
                }
                _ => break,
            }
        }
        out
    }

    /// What is missing of `[0, len)`.
    pub fn missing(&self, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = 0;
        for (s, e) in self.iter() {
            if s >= len {
                break;
            }
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < len {
            out.push((at, len));
        }
        out
    }

    /// The parts of the set that `other` does not cover.
    pub fn minus(&self, other: &RangeSet) -> RangeSet {
        let mut out = RangeSet::new();
        for (a, z) in self.iter() {
            let mut at = a;
            for (x, y) in other.overlaps(a, z) {
                if x > at {
                    out.union(at, x);
                }
                at = at.max(y);
            }
            if at < z {
                out.union(at, z);
            }
        }
        out
    }

    /// The part of the set below `len`.
    pub fn clamped(&self, len: u64) -> RangeSet {
        let mut r = RangeSet::new();
        for (s, e) in self.iter() {
            r.union(s, e.min(len));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn covers_and_overlaps() {
        let mut r = RangeSet::new();
        r.union(10, 20);
        r.union(30, 40);
        assert!(r.covers(10, 20) && r.covers(12, 18) && r.covers(5, 5));
        assert!(!r.covers(9, 12) && !r.covers(15, 35) && !r.covers(40, 41));
        assert_eq!(r.overlaps(0, 100), vec![(10, 20), (30, 40)]);
        assert_eq!(r.overlaps(15, 35), vec![(15, 20), (30, 35)]);
        assert_eq!(r.overlaps(20, 30), vec![]);
        assert_eq!(r.overlaps(35, 36), vec![(35, 36)]);
    }

    #[test]
    fn union_missing_and_lookup() {
        let mut r = RangeSet::new();
        r.union(10, 20);
        r.union(30, 40);
        r.union(15, 32);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        assert_eq!(r.covered(), 30);
        r.union(40, 45);
        r.union(0, 5);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(0, 5), (10, 45)]);
        assert_eq!(r.covered(), 40);
        assert_eq!(r.missing(50), vec![(5, 10), (45, 50)]);
        assert_eq!(r.missing(8), vec![(5, 8)]);
        assert_eq!(r.at_or_after(3), Some((0, 5)));
        assert_eq!(r.at_or_after(5), Some((10, 45)));
        assert_eq!(r.at_or_after(45), None);
        assert_eq!(
            r.clamped(12).iter().collect::<Vec<_>>(),
            vec![(0, 5), (10, 12)]
        );
        assert_eq!(RangeSet::new().missing(7), vec![(0, 7)]);
    }

    #[test]
    fn basics() {
        let mut r = RangeSet::new();
        assert!(r.is_complete(0));
        r.insert(10, 20).unwrap();
        assert_eq!(r.contiguous_prefix(), 0);
        assert_eq!(r.first_hole(), Some(0));
        r.insert(0, 10).unwrap();
        assert_eq!(r.contiguous_prefix(), 20);
        assert!(r.is_complete(20));
        assert!(!r.is_complete(21));
        assert_eq!(r.insert(19, 21), Err(Overlap { start: 19, end: 21 }));
        assert_eq!(r.insert(0, 20), Err(Overlap { start: 0, end: 20 }));
        r.insert(30, 40).unwrap();
        assert!(!r.is_complete(40));
        assert_eq!(r.insert(25, 31), Err(Overlap { start: 25, end: 31 }));
        r.insert(20, 30).unwrap();
        assert!(r.is_complete(40));
        assert_eq!(r.covered(), 40);
    }

    proptest! {
        /// Compare with a per-byte model: overlap refused exactly when a
        /// byte is already present; completeness and prefix agree.
        #[test]
        fn matches_bitmap_model(ops in prop::collection::vec((0u64..200, 0u64..40), 0..60)) {
            let mut r = RangeSet::new();
            let mut model = vec![false; 260];
            for (s, l) in ops {
                let e = s + l;
                let clash = (s..e).any(|i| model[i as usize]);
                let res = r.insert(s, e);
                prop_assert_eq!(res.is_err(), clash);
                if !clash {
                    for i in s..e { model[i as usize] = true; }
                }
                let prefix = model.iter().take_while(|&&b| b).count() as u64;
                prop_assert_eq!(r.contiguous_prefix(), prefix);
                let max_end = model.iter().rposition(|&b| b).map_or(0, |i| i as u64 + 1);
                prop_assert_eq!(r.max_end(), max_end);
                prop_assert_eq!(r.is_complete(max_end), prefix == max_end);
                prop_assert_eq!(r.covered(), model.iter().filter(|&&b| b).count() as u64);
                // Ranges stay disjoint and non-touching.
                let v: Vec<_> = r.iter().collect();
                for w in v.windows(2) { prop_assert!(w[0].1 < w[1].0); }
            }
        }
    }
}
