//! The link model, without I/O: packets of a given length are offered at a
//! given time and the model answers when they arrive at the far end, or why
//! they were dropped. Time is plain nanoseconds on the caller's clock, so
//! tests drive it with a virtual clock and never sleep.
//!
//! One direction of a link is a drop-tail router queue feeding a bottleneck
//! of `rate` bits per second, followed by a wire of one-way `delay`. On the
//! wire a packet may be lost at random (`loss`) or corrupted by bit errors
//! (`ber`); either way it has used its serialization time.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

/// Limit of the drop-tail queue in front of the bottleneck. The packet
/// being serialized counts as queued until its last bit has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum QueueLimit {
    /// At most this many packets.
    Packets(u64),
    /// At most this many bytes.
    Bytes(u64),
    /// No limit (the queue still builds up and adds delay).
    Unlimited,
}

/// The emulated properties of one direction of a link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DirectionSpec {
    /// Bottleneck rate in bits per second; `None` forwards without
    /// serialization delay (and then the queue never fills).
    pub rate_bps: Option<u64>,
    /// One-way propagation delay added after serialization.
    pub delay: Duration,
    /// Drop-tail queue limit in front of the bottleneck.
    pub queue: QueueLimit,
    /// Probability that a packet is lost on the wire, in [0, 1].
    pub loss: f64,
    /// Bit error rate: a packet of `len` bytes is dropped with probability
    /// `1 - (1 - ber)^(8 * len)`.
    pub ber: f64,
}

impl Default for DirectionSpec {
    /// No rate limit, no delay, 1000 packets of queue (tc netem's default
    /// limit), no loss.
    fn default() -> Self {
        DirectionSpec {
            rate_bps: None,
            delay: Duration::ZERO,
            queue: QueueLimit::Packets(1000),
            loss: 0.0,
            ber: 0.0,
        }
    }
}

impl DirectionSpec {
    /// Checks that probabilities are in [0, 1] and limits are non-zero.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.loss) {
            return Err(format!("loss {} is not in [0, 1]", self.loss));
        }
        if !(0.0..=1.0).contains(&self.ber) {
            return Err(format!("bit error rate {} is not in [0, 1]", self.ber));
        }
        if matches!(self.queue, QueueLimit::Packets(0) | QueueLimit::Bytes(0)) {
            return Err("a zero queue limit would drop every packet".into());
        }
        if self.rate_bps == Some(0) {
            return Err("rate 0: use None for an unlimited rate".into());
        }
        Ok(())
    }
}

/// Why the model dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The drop-tail queue was full when the packet arrived.
    Queue,
    /// Random loss on the wire.
    Loss,
    /// Corrupted by bit errors on the wire.
    BitError,
}

/// The model's answer for one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The packet arrives at the far end at this time (nanoseconds).
    Deliver {
        /// Arrival time on the caller's clock, in nanoseconds.
        at: u64,
    },
    /// The packet never arrives.
    Drop(DropReason),
}

/// One direction of an emulated link. Arrival times it hands out never
/// decrease, so a FIFO is enough to hold packets until they are due.
#[derive(Debug, Clone)]
pub struct LinkModel {
    spec: DirectionSpec,
    delay_ns: u64,
    /// When the bottleneck finishes serializing what it has accepted.
    link_free: u64,
    /// Departure time and length of each packet still in the queue.
    backlog: VecDeque<(u64, u64)>,
    backlog_bytes: u64,
    /// The latest arrival handed out, so arrivals never go backwards even
    /// if the caller's clock does.
    last_arrival: u64,
    rng: Rng,
}

impl LinkModel {
    /// A model of one direction; `seed` fixes the loss and bit-error
    /// pattern.
    pub fn new(spec: DirectionSpec, seed: u64) -> Self {
        let delay_ns = u64::try_from(spec.delay.as_nanos()).unwrap_or(u64::MAX);
        LinkModel {
            spec,
            delay_ns,
            link_free: 0,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            last_arrival: 0,
            rng: Rng::new(seed),
        }
    }

    /// The settings this model emulates.
    pub fn spec(&self) -> &DirectionSpec {
        &self.spec
    }

    /// Offers a packet of `len` bytes arriving at the queue at `now`
    /// (nanoseconds) and returns its fate.
    pub fn offer(&mut self, len: usize, now: u64) -> Verdict {
        let len = len as u64;
        let depart = match self.spec.rate_bps {
            Some(rate) => {
                while let Some(&(d, l)) = self.backlog.front() {
                    if d > now {
                        break;
                    }
                    self.backlog.pop_front();
                    self.backlog_bytes -= l;
                }
                let full = match self.spec.queue {
                    QueueLimit::Packets(n) => self.backlog.len() as u64 >= n,
                    QueueLimit::Bytes(b) => self.backlog_bytes + len > b,
                    QueueLimit::Unlimited => false,
                };
                if full {
                    return Verdict::Drop(DropReason::Queue);
                }
                let start = self.link_free.max(now);
                let depart = start.saturating_add(serialization_ns(len, rate));
                self.link_free = depart;
                self.backlog.push_back((depart, len));
                self.backlog_bytes += len;
                depart
            }
            None => now,
        };
        if self.spec.loss > 0.0 && self.rng.next_f64() < self.spec.loss {
            return Verdict::Drop(DropReason::Loss);
        }
        if self.spec.ber > 0.0 && self.rng.next_f64() < ber_drop_probability(self.spec.ber, len) {
            return Verdict::Drop(DropReason::BitError);
        }
        let at = depart.saturating_add(self.delay_ns).max(self.last_arrival);
        self.last_arrival = at;
        Verdict::Deliver { at }
    }

    /// Packets currently queued at the bottleneck (including the one being
    /// serialized), as of the last `offer`.
    pub fn backlog_packets(&self) -> usize {
        self.backlog.len()
    }
}

/// Time to put `len` bytes on a wire of `rate` bits per second, rounded up
/// to whole nanoseconds.
pub fn serialization_ns(len: u64, rate_bps: u64) -> u64 {
    let bits = u128::from(len) * 8 * 1_000_000_000;
    let rate = u128::from(rate_bps.max(1));
    u64::try_from(bits.div_ceil(rate)).unwrap_or(u64::MAX)
}

/// Probability that at least one of the `8 * len` bits of a packet is
/// flipped, for independent bit errors at rate `ber`.
pub fn ber_drop_probability(ber: f64, len: u64) -> f64 {
    // 1 - (1 - ber)^n, computed without cancellation for tiny ber.
    -f64::exp_m1(8.0 * len as f64 * f64::ln_1p(-ber))
}

/// xoshiro256** seeded by splitmix64: small, fast, and stable across crate
/// versions, so a seed reproduces the same loss pattern forever.
#[derive(Debug, Clone)]
struct Rng {
    s: [u64; 4],
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn spec(rate: Option<u64>, delay_ms: u64, queue: QueueLimit) -> DirectionSpec {
        DirectionSpec {
            rate_bps: rate,
            delay: Duration::from_millis(delay_ms),
            queue,
            loss: 0.0,
            ber: 0.0,
        }
    }

    fn at(v: Verdict) -> u64 {
        match v {
            Verdict::Deliver { at } => at,
            Verdict::Drop(r) => panic!("unexpected drop: {r:?}"),
        }
    }

    #[test]
    fn unshaped_link_adds_only_the_delay() {
        let mut m = LinkModel::new(spec(None, 50, QueueLimit::Packets(1)), 1);
        assert_eq!(at(m.offer(1500, 0)), 50 * MS);
        // No rate, so a burst never queues even with a 1-packet limit.
        assert_eq!(at(m.offer(1500, 0)), 50 * MS);
        assert_eq!(at(m.offer(64, 7)), 50 * MS + 7);
    }

    #[test]
    fn back_to_back_packets_leave_one_serialization_time_apart() {
        // 1500 bytes at 12 Mbit/s take exactly 1 ms.
        let mut m = LinkModel::new(spec(Some(12_000_000), 10, QueueLimit::Unlimited), 1);
        let arrivals: Vec<u64> = (0..5).map(|_| at(m.offer(1500, 0))).collect();
        assert_eq!(arrivals, vec![11 * MS, 12 * MS, 13 * MS, 14 * MS, 15 * MS]);
        // After the link has gone idle, a packet is not held by old traffic.
        assert_eq!(at(m.offer(1500, 100 * MS)), 111 * MS);
    }

    #[test]
    fn sustained_offered_load_is_served_at_the_rate() {
        // Offer 2x the link rate for one virtual second with no queue limit:
        // the last packet departs after (total bits / rate) seconds.
        let rate = 10_000_000;
        let mut m = LinkModel::new(spec(Some(rate), 0, QueueLimit::Unlimited), 1);
        let pkt = 1250u64; // 1 ms at 10 Mbit/s
        let mut last = 0;
        for i in 0..2000 {
            last = at(m.offer(pkt as usize, i * MS / 2));
        }
        let bits = 2000 * pkt * 8;
        assert_eq!(last, bits * 1_000_000_000 / rate);
    }

    #[test]
    fn full_packet_queue_drops_the_tail() {
        let mut m = LinkModel::new(spec(Some(12_000_000), 0, QueueLimit::Packets(3)), 1);
        for _ in 0..3 {
            at(m.offer(1500, 0));
        }
        assert_eq!(m.offer(1500, 0), Verdict::Drop(DropReason::Queue));
        assert_eq!(m.backlog_packets(), 3);
        // Once the first packet has left (t = 1 ms) there is room for one.
        assert_eq!(at(m.offer(1500, MS)), 4 * MS);
        assert_eq!(m.offer(1500, MS), Verdict::Drop(DropReason::Queue));
    }

    #[test]
    fn byte_queue_counts_bytes_not_packets() {
        let mut m = LinkModel::new(spec(Some(8_000_000), 0, QueueLimit::Bytes(3000)), 1);
        at(m.offer(1500, 0));
        at(m.offer(1000, 0));
        // 2500 queued: a 600-byte packet no longer fits, a 500-byte one does.
        assert_eq!(m.offer(600, 0), Verdict::Drop(DropReason::Queue));
        at(m.offer(500, 0));
        assert_eq!(m.offer(1, 0), Verdict::Drop(DropReason::Queue));
    }

    #[test]
    fn random_loss_matches_its_probability_and_repeats_with_a_seed() {
        let mut s = spec(None, 0, QueueLimit::Unlimited);
        s.loss = 0.01;
        let run = |seed| {
            let mut m = LinkModel::new(s.clone(), seed);
            (0..200_000u64)
                .map(|i| m.offer(100, i))
                .map(|v| v == Verdict::Drop(DropReason::Loss))
                .collect::<Vec<bool>>()
        };
        let a = run(42);
        let lost = a.iter().filter(|&&l| l).count() as f64;
        // Binomial(200000, 0.01): mean 2000, sd ~44.5; 5 sd either side.
        assert!((1777.0..=2223.0).contains(&lost), "lost {lost}");
        assert_eq!(a, run(42), "same seed, same pattern");
        assert_ne!(a, run(43), "another seed, another pattern");
    }

    #[test]
    fn ber_probability_follows_the_formula() {
        let p = ber_drop_probability(1e-6, 1500);
        let direct = 1.0 - (1.0f64 - 1e-6).powi(12_000);
        assert!((p - direct).abs() < 1e-12, "{p} vs {direct}");
        assert!((p - 0.011_928).abs() < 1e-5);
        assert_eq!(ber_drop_probability(0.0, 1500), 0.0);
        assert_eq!(ber_drop_probability(1.0, 1), 1.0);
        // Tiny rates keep their precision: ~8 * len * ber.
        let tiny = ber_drop_probability(1e-12, 1000);
        assert!((tiny / 8e-9 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ber_drops_big_packets_more_often_than_small_ones() {
        let mut s = spec(None, 0, QueueLimit::Unlimited);
        s.ber = 1e-5;
        let mut m = LinkModel::new(s, 7);
        let n = 100_000u64;
        let count = |m: &mut LinkModel, len| {
            (0..n)
                .filter(|&i| m.offer(len, i) == Verdict::Drop(DropReason::BitError))
                .count() as f64
        };
        let big = count(&mut m, 1500); // p = 0.1131, mean 11308, sd ~100
        let small = count(&mut m, 40); // p = 0.0032, mean 320, sd ~18
        assert!((10_800.0..=11_800.0).contains(&big), "big {big}");
        assert!((230.0..=410.0).contains(&small), "small {small}");
    }

    #[test]
    fn lost_packets_still_use_the_bottleneck() {
        let mut s = spec(Some(12_000_000), 0, QueueLimit::Unlimited);
        s.loss = 1.0;
        let mut m = LinkModel::new(s, 1);
        assert_eq!(m.offer(1500, 0), Verdict::Drop(DropReason::Loss));
        assert_eq!(m.backlog_packets(), 1);
    }

    #[test]
    fn arrivals_never_go_backwards() {
        let mut m = LinkModel::new(spec(None, 5, QueueLimit::Unlimited), 1);
        let first = at(m.offer(100, 10 * MS));
        let second = at(m.offer(100, 9 * MS));
        assert!(second >= first);
    }

    #[test]
    fn validation_rejects_impossible_settings() {
        let mut s = DirectionSpec::default();
        assert!(s.validate().is_ok());
        s.loss = 1.5;
        assert!(s.validate().is_err());
        s.loss = 0.0;
        s.queue = QueueLimit::Bytes(0);
        assert!(s.validate().is_err());
    }
}
