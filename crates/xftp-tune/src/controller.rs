//! Dynamic multiplicity control: how many connections, now.
//!
//! XFTP kept the RTT between α and β: add a connection below α, turn off
//! half of them above β. RTT alone misleads on today's paths (a deep
//! queue inflates RTT long before throughput stops growing; a shallow one
//! overflows with almost no inflation; random loss lowers throughput with
//! none), so this controller looks at three signals per *epoch* (a few
//! RTTs, long enough for new connections to leave slow start):
//!
//! * **goodput** over the epoch (payload bytes delivered per second);
//! * **queueing delay**: smoothed RTT minus the smallest RTT seen;
//! * **loss**: retransmitted segments per segment sent in the epoch.
//!
//! Rules, in order:
//!
//! 1. *Overflow* — loss above `loss_threshold` **and** queueing delay above
//!    `queue_delay_min`, right after a growth step (the start is none) or
//!    with goodput 10 % below the settled level for two epochs: the
//!    connections are overflowing a router
//!    queue (XFTP's β case). Halve N (at least down to the last level that
//!    did not overflow; a probe's count goes back to where the probe
//!    started) and never grow past N−1 again in this transfer.
//!    Loss without queueing delay is random loss, where more connections
//!    help (Mathis), so it does not count; loss and a queue at a steady
//!    goodput are what loss-based TCP does on a full link at any N.
//! 2. *Grow* — a start of `wait_first_from` or more connections is first
//!    judged on its second epoch (the first is slow start), and the first
//!    growth decision also needs the RTT at the epoch's end near the
//!    floor. While each step raised goodput by at least `gain`, double N
//!    (up to the cap); when the last doubling scaled goodput almost
//!    linearly (`fast_gain`) with no queue and no loss, quadruple it: the path
//!    is far from full, and each epoch spent below the right count costs.
//!    The first step whose gain is smaller stops growth: a step that
//!    lowered goodput by more than 5 % is undone, a step with a small gain
//!    is kept. A standing queue (the epoch's smallest RTT above the floor)
//!    also stops growth: the link is full at this count.
//! 3. *Steady* — re-check every epoch; if goodput falls below 60 % of the
//!    settled level for two epochs without queueing, conditions changed:
//!    grow again. Every `probe_epochs` quiet epochs, try +25 %; a probe
//!    that gains less than `gain` goes back.
//! 4. Never grow when what is left of the transfer would finish within two
//!    epochs and two RTTs: new connections would arrive too late (the MULT
//!    exchange and their handshake take two RTTs) and spend the rest in
//!    slow start.
//!
//! A count known to be good for the path (the cache's best) starts in
//! *Steady* ([`Controller::settled`]): no growth phase, only the probes
//! and the reactions of rules 1 and 3.
//!
//! The controller has no clock: `Sample::at` carries time.

use std::time::Duration;

/// An epoch ends at the first sample at least this share of its length
/// after its start.
const EPOCH_SLACK: f64 = 0.9;

/// A growth step whose goodput rose more than this many times its ratio
/// of connections was measured against slow start, not a settled rate.
const SUPERLINEAR: f64 = 1.25;

/// Knobs; the defaults are documented in docs/tuning.md.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// Fewest connections.
    pub min_streams: u32,
    /// Most connections (also bounded by what the server grants).
    pub max_streams: u32,
    /// Relative goodput gain a growth step must bring to continue growing.
    pub gain: f64,
    /// Relative gain of a doubling (1.0 = linear) above which, with no
    /// queueing at all, the next step quadruples N instead.
    pub fast_gain: f64,
    /// Retransmitted/sent segments in an epoch above which loss counts.
    pub loss_threshold: f64,
    /// Queueing delay (RTT minus floor) that marks a standing queue:
    /// the larger of this and `queue_delay_fraction` × floor.
    pub queue_delay_min: Duration,
    /// See `queue_delay_min`.
    pub queue_delay_fraction: f64,
    /// Queueing delay that vetoes growth (more connections would only
    /// lengthen the queue): the larger of this and `heavy_queue_fraction`
    /// × floor.
    pub heavy_queue_min: Duration,
    /// See `heavy_queue_min`.
    pub heavy_queue_fraction: f64,
    /// Retransmitted/sent segments in an epoch that veto growth whatever
    /// the queueing delay (also 3 × the lowest loss rate seen, so a path
    /// with that much random loss can still grow, but never more than
    /// `heavy_loss_max`).
    pub heavy_loss: f64,
    /// The most the lowest loss rate seen can raise `heavy_loss` to. The
    /// first epoch's rate is slow start's overshoot as much as the path's
    /// random loss: a satellite start lost 31 % of its segments, and the
    /// rule measured by that floor let growth go on into the collapse.
    pub heavy_loss_max: f64,
    /// Shortest epoch.
    pub min_epoch: Duration,
    /// Epoch length in RTTs (of the RTT floor).
    pub epoch_rtts: f64,
    /// Quiet steady epochs between probes upward.
    pub probe_epochs: u32,
    /// A start of at least this many connections does not grow from its
    /// first epoch (slow start), only from the next.
    pub wait_first_from: u32,
}

impl Default for TuneConfig {
    fn default() -> Self {
        TuneConfig {
            min_streams: 1,
            max_streams: 32,
            gain: 0.15,
            fast_gain: 0.6,
            loss_threshold: 0.002,
            queue_delay_min: Duration::from_millis(3),
            queue_delay_fraction: 0.05,
            heavy_queue_min: Duration::from_millis(5),
            heavy_queue_fraction: 0.5,
            heavy_loss: 0.01,
            heavy_loss_max: 0.1,
            min_epoch: Duration::from_millis(300),
            epoch_rtts: 3.0,
            probe_epochs: 8,
            wait_first_from: 8,
        }
    }
}

/// One observation of the running transfer. Counters are cumulative.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Time since the transfer started.
    pub at: Duration,
    /// Payload bytes delivered so far.
    pub bytes: u64,
    /// Current smoothed RTT of the data path, if known.
    pub rtt: Option<Duration>,
    /// Segments retransmitted so far (all data connections).
    pub retrans: u64,
    /// Segments sent so far (all data connections); 0 if unknown.
    pub segs_out: u64,
    /// Bytes no connection has taken yet (all that added connections
    /// could carry), if known.
    pub remaining: Option<u64>,
}

/// Why the controller chose a stream count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The starting value.
    Start,
    /// Goodput grew with the last step: grow again.
    Grow,
    /// The last step did not raise goodput enough: stop growing.
    NoGain,
    /// The last step lowered goodput: undo it.
    Undo,
    /// Loss with a standing queue: halve (XFTP's β rule).
    QueueOverflow,
    /// Goodput fell with no queue: conditions changed, grow again.
    Degraded,
    /// Periodic probe upward.
    Probe,
    /// Too little left to be worth new connections.
    TooLittleLeft,
    /// Heavy loss: a full queue, however short; no growth.
    HeavyLoss,
    /// Waiting after a reduction for the queue to drain.
    Hold,
    /// A standing queue while growing: the link is full at this count.
    LinkFull,
    /// The first epoch of a start of many connections: they are still in
    /// slow start, so its goodput says nothing about growth.
    SlowStart,
}

/// A change of the stream count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The new number of connections.
    pub streams: u32,
    /// Why.
    pub reason: Reason,
}

/// One evaluated epoch, for the JSON summary and `-v` output.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Step {
    /// Seconds since the start.
    pub at_s: f64,
    /// Connections in use during the epoch.
    pub streams: u32,
    /// Goodput of the epoch, bits per second.
    pub goodput_bps: f64,
    /// RTT at the end of the epoch, milliseconds.
    pub rtt_ms: Option<f64>,
    /// Queueing delay estimate, milliseconds.
    pub queue_ms: Option<f64>,
    /// Retransmitted / sent segments in the epoch.
    pub loss: f64,
    /// Connections chosen for the next epoch.
    pub next: u32,
    /// Why.
    pub reason: Reason,
}

/// What an epoch showed, as the rules read it.
struct Judged {
    /// Goodput, bits per second.
    g: f64,
    /// Loss with a standing queue.
    overflow: bool,
    /// A heavy queue or heavy loss (with its reason): no growth.
    veto: Option<Reason>,
    /// The epoch's smallest RTT above the floor: a standing queue.
    queueing: bool,
    /// The RTT at the epoch's end above the floor.
    queue_now: bool,
    /// No queue and no loss above the threshold: fast growth allowed.
    clean: bool,
    /// The rest would finish before new connections could help.
    little_left: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Grow,
    Steady,
}

/// The controller. Feed it [`Sample`]s (every 50–200 ms is plenty); apply
/// the [`Decision`]s it returns.
#[derive(Debug, Clone)]
pub struct Controller {
    cfg: TuneConfig,
    n: u32,
    cap: u32,
    phase: Phase,
    floor: Option<Duration>,
    /// Smallest RTT sampled in the current epoch: a standing queue raises
    /// it, a passing spike (a loaded host, one burst) does not.
    epoch_rtt: Option<Duration>,
    epoch_start: Option<Sample>,
    /// (streams, goodput) before the last growth step.
    before: Option<(u32, f64)>,
    settled: Option<f64>,
    low_epochs: u32,
    /// Steady epochs in a row with overflow and goodput 10 % down.
    collapse_epochs: u32,
    /// The count the last probe started from, while the probe's count
    /// stands: a collapse then goes back there, not to half.
    probed_from: Option<u32>,
    quiet_epochs: u32,
    /// Epochs left in which no decision is taken after a reduction (the
    /// queue drains; losses counted then belong to the old count).
    hold: u32,
    /// Smallest per-epoch loss rate seen: the path's random loss.
    loss_floor: Option<f64>,
    history: Vec<Step>,
}

impl Controller {
    /// Start with `initial` connections.
    pub fn new(cfg: TuneConfig, initial: u32) -> Self {
        let max = cfg.max_streams.max(cfg.min_streams).max(1);
        let n = initial.clamp(cfg.min_streams.max(1), max);
        Controller {
            cfg,
            n,
            cap: max,
            phase: Phase::Grow,
            floor: None,
            epoch_rtt: None,
            epoch_start: None,
            before: None,
            settled: None,
            low_epochs: 0,
            collapse_epochs: 0,
            probed_from: None,
            quiet_epochs: 0,
            hold: 0,
            loss_floor: None,
            history: Vec::new(),
        }
    }

    /// Start with `n` connections known to suit the path (e.g. the cache's
    /// best for this destination): steady from the first epoch, probing
    /// upward now and then instead of growing.
    pub fn settled(cfg: TuneConfig, n: u32) -> Self {
        let mut c = Controller::new(cfg, n);
        c.phase = Phase::Steady;
        c
    }

    /// Connections currently wanted.
    pub fn streams(&self) -> u32 {
        self.n
    }

    /// Lower the ceiling (e.g. the server granted fewer, or it is too late
    /// in the transfer to add connections).
    pub fn limit(&mut self, max: u32) {
        self.cap = self.cap.min(max.max(1));
        self.n = self.n.min(self.cap);
        // The last decision is what was applied, not what was asked.
        if let Some(last) = self.history.last_mut() {
            last.next = last.next.min(self.cap);
        }
        // A growth step that cannot happen is no growth phase to judge.
        if self.phase == Phase::Grow && self.n >= self.cap {
            self.phase = Phase::Steady;
            self.before = None;
        }
    }

    /// Every evaluated epoch so far.
    pub fn history(&self) -> &[Step] {
        &self.history
    }

    /// The smallest RTT seen.
    pub fn rtt_floor(&self) -> Option<Duration> {
        self.floor
    }

    fn epoch_len(&self) -> Duration {
        let by_rtt = self
            .floor
            .map_or(Duration::ZERO, |f| f.mul_f64(self.cfg.epoch_rtts));
        by_rtt.max(self.cfg.min_epoch)
    }

    /// Take a sample; returns a decision when the stream count changes.
    pub fn on_sample(&mut self, s: Sample) -> Option<Decision> {
        if let Some(r) = s.rtt.filter(|r| !r.is_zero()) {
            self.floor = Some(self.floor.map_or(r, |f| f.min(r)));
            self.epoch_rtt = Some(self.epoch_rtt.map_or(r, |e| e.min(r)));
        }
        let Some(start) = self.epoch_start else {
            self.epoch_start = Some(s);
            return None;
        };
        let dt = s.at.saturating_sub(start.at);
        // Samples come at their own pace (every 100 ms, or one per STAT
        // reply, about an RTT apart): close the epoch at the sample that
        // nearly reaches its length rather than one interval later.
        if dt < self.epoch_len().mul_f64(EPOCH_SLACK) {
            return None;
        }
        self.epoch_start = Some(s);
        let goodput = s.bytes.saturating_sub(start.bytes) as f64 * 8.0 / dt.as_secs_f64();
        let dsegs = s.segs_out.saturating_sub(start.segs_out);
        let dretr = s.retrans.saturating_sub(start.retrans);
        let loss = if dsegs > 0 {
            dretr as f64 / dsegs as f64
        } else if dretr > 0 {
            1.0
        } else {
            0.0
        };
        let epoch_rtt = self.epoch_rtt.take().or(s.rtt);
        let queue = match (epoch_rtt, self.floor) {
            (Some(r), Some(f)) => Some(r.saturating_sub(f)),
            _ => None,
        };
        let queue_at = |r: Option<Duration>| match (r, self.floor) {
            (Some(r), Some(f)) => {
                r.saturating_sub(f)
                    > self
                        .cfg
                        .queue_delay_min
                        .max(f.mul_f64(self.cfg.queue_delay_fraction))
            }
            _ => false,
        };
        let queueing = queue_at(epoch_rtt);
        // The RTT at the epoch's end: a queue that stands now. BBR drains
        // its queue once after its startup, so the epoch after a start's
        // slow start can touch the floor for a moment with a queue of half
        // the floor before and after.
        let queue_now = queue_at(s.rtt);
        // Random loss is the same whatever N is; overflow loss comes with
        // a queue and grows with N. So loss counts only when it is well
        // above the lowest loss rate this path has shown.
        let floor = *self.loss_floor.get_or_insert(loss);
        self.loss_floor = Some(floor.min(loss));
        let overflow = loss > self.cfg.loss_threshold.max(3.0 * floor) && queueing;
        // A heavy standing queue vetoes growth (more connections would only
        // lengthen it); a light one is what loss-based TCP always builds.
        let heavy_queue = match (queue, self.floor) {
            (Some(q), Some(f)) => {
                q > self
                    .cfg
                    .heavy_queue_min
                    .max(f.mul_f64(self.cfg.heavy_queue_fraction))
            }
            _ => false,
        };
        // A router queue much shorter than the RTT overflows long before
        // the queueing delay shows against a long RTT (8 packets at T1 rate
        // are 62 ms against 560): one segment in a hundred lost says the
        // same, and no random-loss path worth striping loses that much.
        let heavy_loss = loss
            > (3.0 * floor)
                .min(self.cfg.heavy_loss_max)
                .max(self.cfg.heavy_loss);
        // New connections carry data only about two RTTs after the
        // decision (the MULT exchange, then their handshake).
        let arrive = self.floor.map_or(0.0, |f| 2.0 * f.as_secs_f64());
        let worth = 2.0 * self.epoch_len().as_secs_f64() + arrive;
        // At the rate the transfer had, not this epoch's alone: at the end
        // every connection can sit in a retransmission timeout with a few
        // records still unsent, and goodput near zero then made growth
        // look worth it (16 -> 32 in the last seconds of satellite
        // transfers, carrying nothing: the stuck records' data was
        // already on the stuck connections).
        let rate = goodput.max(self.settled.unwrap_or(0.0));
        let little_left = s
            .remaining
            .is_some_and(|rem| (rem as f64 * 8.0) < rate * worth);

        // Fast growth only on a path that shows neither a queue nor loss
        // above the threshold: a small router queue overflows with almost
        // no queueing delay, and its losses are the warning.
        let clean = !queueing && loss <= self.cfg.loss_threshold;
        let veto = match (heavy_queue, heavy_loss) {
            (true, _) => Some(Reason::NoGain),
            (false, true) => Some(Reason::HeavyLoss),
            (false, false) => None,
        };
        let (next, reason) = self.decide(Judged {
            g: goodput,
            overflow,
            veto,
            queueing,
            queue_now,
            clean,
            little_left,
        });
        self.history.push(Step {
            at_s: s.at.as_secs_f64(),
            streams: self.n,
            goodput_bps: goodput,
            rtt_ms: s.rtt.map(|r| r.as_secs_f64() * 1e3),
            queue_ms: queue.map(|q| q.as_secs_f64() * 1e3),
            loss,
            next,
            reason,
        });
        if next != self.n {
            self.n = next;
            // The probe's count no longer stands.
            if reason != Reason::Probe {
                self.probed_from = None;
            }
            Some(Decision {
                streams: next,
                reason,
            })
        } else {
            None
        }
    }

    fn grow_target(&self, factor: u32) -> u32 {
        self.n.saturating_mul(factor).min(self.cap).max(self.n)
    }

    fn decide(&mut self, e: Judged) -> (u32, Reason) {
        let Judged {
            g,
            overflow,
            veto,
            queueing,
            queue_now,
            clean,
            little_left,
        } = e;
        let min = self.cfg.min_streams.max(1);
        if self.hold > 0 {
            self.hold -= 1;
            return (self.n, Reason::Hold);
        }
        // A loss-based TCP that fills a small queue loses packets and keeps
        // a queue at *any* count that fills the link, the best one
        // included; so in the steady phase overflow counts only when
        // goodput fell too. Right after a growth step it always counts.
        // One epoch below is a loss-based TCP's sawtooth on a small queue
        // (Reno halving on one drop); two in a row are a collapse.
        let collapsing = match self.phase {
            // A start is no growth step: a high start's first judged epoch
            // is its slow start's exit, whose losses and queue say little
            // about the count (16 cubic connections on the 0.01 % lossy
            // link lost 1.5 % there and were halved to 8, which then ran
            // at half the link's rate). There overflow counts as in the
            // steady phase, once goodput falls too.
            Phase::Grow if self.before.is_some() => {
                self.collapse_epochs = 0;
                true
            }
            Phase::Grow => {
                self.collapse_epochs = 0;
                false
            }
            Phase::Steady => {
                let low = self.settled.is_some_and(|s| g < s * 0.9);
                self.collapse_epochs = if low && overflow {
                    self.collapse_epochs + 1
                } else {
                    0
                };
                self.collapse_epochs >= 2
            }
        };
        // At the very end goodput falls as connections run out of work:
        // no collapse to react to, and no time for it to matter.
        if overflow && collapsing && !little_left && self.n > min {
            // β rule: turn off half, and stay below the level that overflowed.
            // A probe's +25 % that overflows goes back to where the probe
            // started, a count that held: halving 5 to 2 on satellite-x10
            // meant half the rate of the 4 it had probed from.
            self.cap = self.cap.min(self.n - 1).max(min);
            let down = match self.probed_from.take() {
                Some(p) if p < self.n => p,
                _ => (self.n / 2).max(min),
            };
            let back = self.before.map_or(down, |(n, _)| n.min(self.n - 1));
            self.phase = Phase::Steady;
            self.settled = None;
            self.before = None;
            self.quiet_epochs = 0;
            self.collapse_epochs = 0;
            self.hold = 2;
            return (down.min(back).max(min), Reason::QueueOverflow);
        }
        match self.phase {
            Phase::Grow => {
                // A start of many connections is already a guess of the
                // path's count (cache::start_for_rtt). Its first epoch is
                // slow start: goodput far below what the count will carry
                // and no queue yet, so growth judged on it doubles a count
                // that was about right (16 -> 32 on the 0.1 % lossy link
                // of docs/results.md, slower than staying at 16).
                if self.history.is_empty() && self.n >= self.cfg.wait_first_from {
                    return (self.n, Reason::SlowStart);
                }
                if let Some((n0, g0)) = self.before {
                    if g0 > 0.0 && g < g0 * 0.95 {
                        self.phase = Phase::Steady;
                        self.settled = Some(g0);
                        self.before = None;
                        return (n0, Reason::Undo);
                    }
                    if g0 > 0.0 && g < g0 * (1.0 + self.cfg.gain) {
                        self.phase = Phase::Steady;
                        self.settled = Some(g);
                        self.before = None;
                        // A probe asks whether more connections help; if
                        // not, go back, or every probe would ratchet the
                        // count up to the cap over a long transfer.
                        if let Some(p) = self.probed_from.take().filter(|&p| p < self.n) {
                            return (p, Reason::Undo);
                        }
                        return (self.n, Reason::NoGain);
                    }
                }
                // Near-linear scaling says the path is far from full. A
                // gain well beyond the step's ratio says only that the
                // epoch before was slow start (a fresh lossy transfer's
                // 4 -> 8 read 8.9 times the goodput): no evidence either
                // way, so the next step is a plain doubling.
                let linear = self.before.is_some_and(|(n0, g0)| {
                    let ratio = f64::from(self.n) / f64::from(n0.max(1));
                    g0 > 0.0
                        && n0 > 0
                        && g >= g0 * (1.0 + self.cfg.fast_gain * (ratio - 1.0))
                        && g <= g0 * ratio * SUPERLINEAR
                });
                let factor = if linear && clean { 4 } else { 2 };
                let target = self.grow_target(factor);
                // A queue that stands through a whole epoch (its smallest
                // RTT above the floor) means the bottleneck never idled:
                // the link is full at this count, and more connections
                // would only lengthen the queue and then overflow it. In
                // the steady phase a loss-based TCP keeps a queue at any
                // count, so this holds for the growth phase only.
                let stop = if little_left {
                    Some(Reason::TooLittleLeft)
                } else if target == self.n {
                    Some(Reason::NoGain)
                } else {
                    // The first growth step has no step before it to
                    // judge by, so both queue signals must be clear: a
                    // high start's second epoch (the first judged) is
                    // where BBR drains after startup.
                    let full = queueing || (self.before.is_none() && queue_now);
                    veto.or(full.then_some(Reason::LinkFull))
                };
                if let Some(why) = stop {
                    self.phase = Phase::Steady;
                    self.settled = Some(g);
                    self.before = None;
                    return (self.n, why);
                }
                self.before = Some((self.n, g));
                (target, Reason::Grow)
            }
            Phase::Steady => {
                let settled = self.settled.get_or_insert(g);
                let low = g < *settled * 0.6;
                *settled = 0.75 * *settled + 0.25 * g;
                if low && veto.is_none() {
                    self.low_epochs += 1;
                } else {
                    self.low_epochs = 0;
                }
                self.quiet_epochs += 1;
                if little_left {
                    return (self.n, Reason::TooLittleLeft);
                }
                if self.n >= self.cap {
                    return (self.n, Reason::NoGain);
                }
                if self.low_epochs >= 2 {
                    self.low_epochs = 0;
                    self.phase = Phase::Grow;
                    self.before = Some((self.n, g));
                    return (self.grow_target(2), Reason::Degraded);
                }
                if let Some(why) = veto {
                    return (self.n, why);
                }
                if self.quiet_epochs >= self.cfg.probe_epochs {
                    self.quiet_epochs = 0;
                    self.phase = Phase::Grow;
                    self.before = Some((self.n, g));
                    self.probed_from = Some(self.n);
                    let step = (self.n / 4).max(1);
                    return ((self.n + step).min(self.cap), Reason::Probe);
                }
                (self.n, Reason::NoGain)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fluid model of N window-limited connections sharing a bottleneck:
    /// rate min(C, N·W/RTT); beyond the BDP a queue builds (RTT grows);
    /// beyond BDP + Q the queue overflows and goodput collapses.
    struct Path {
        cap_bps: f64,
        rtt: Duration,
        window: f64,
        queue: f64,
        random_loss: f64,
        overflow_penalty: f64,
    }

    impl Path {
        /// A deep queue, no random loss: only the windows limit.
        fn window_limited(cap_bps: f64, rtt_ms: u64, window: f64) -> Path {
            Path {
                cap_bps,
                rtt: Duration::from_millis(rtt_ms),
                window,
                queue: 1e6,
                random_loss: 0.0,
                overflow_penalty: 0.5,
            }
        }

        fn step(&self, n: u32) -> (f64, Duration, f64) {
            let bdp = self.cap_bps / 8.0 * self.rtt.as_secs_f64();
            let inflight = n as f64 * self.window;
            let mathis = if self.random_loss > 0.0 {
                // per-connection cap MSS/(RTT sqrt(p)) in bits/s
                1460.0 * 8.0 / (self.rtt.as_secs_f64() * self.random_loss.sqrt()) * 1.22
            } else {
                f64::INFINITY
            };
            let per_conn = (self.window * 8.0 / self.rtt.as_secs_f64()).min(mathis);
            let offered = n as f64 * per_conn;
            // Bytes the connections keep in flight: window-limited, or
            // loss-limited at the Mathis rate.
            let inflight = inflight.min(offered / 8.0 * self.rtt.as_secs_f64());
            let excess = (inflight - bdp).max(0.0);
            let qdelay = Duration::from_secs_f64(excess.min(self.queue) / (self.cap_bps / 8.0));
            if inflight > bdp + self.queue {
                // One connection rides a full queue at line rate; several
                // synchronise their losses and collapse (XFTP figure 10).
                let g = if n > 1 {
                    self.cap_bps * self.overflow_penalty
                } else {
                    self.cap_bps
                };
                (g, self.rtt + qdelay, 0.03 + self.random_loss)
            } else {
                (
                    offered.min(self.cap_bps),
                    self.rtt + qdelay,
                    self.random_loss,
                )
            }
        }
    }

    /// Run the controller for `secs` seconds of simulated time; return the
    /// final N, the most N ever used, and mean goodput.
    fn simulate(path: &Path, cfg: TuneConfig, start: u32, secs: f64) -> (u32, u32, f64) {
        let mut c = Controller::new(cfg, start);
        let (mut bytes, mut retr, mut segs) = (0f64, 0f64, 0f64);
        let dt = 0.05;
        let mut t = 0.0;
        let mut most = start;
        while t < secs {
            let n = c.streams();
            most = most.max(n);
            let (g, rtt, loss) = path.step(n);
            bytes += g / 8.0 * dt;
            let s = g / 8.0 * dt / 1460.0;
            segs += s;
            retr += s * loss;
            t += dt;
            c.on_sample(Sample {
                at: Duration::from_secs_f64(t),
                bytes: bytes as u64,
                rtt: Some(rtt),
                retrans: retr as u64,
                segs_out: segs as u64,
                remaining: None,
            });
        }
        (c.streams(), most, bytes * 8.0 / secs)
    }

    #[test]
    fn window_limited_long_path_grows_to_fill_it() {
        // 100 Mbit/s, 100 ms, 64 KiB windows: one connection gets ~5 Mbit/s.
        let p = Path::window_limited(100e6, 100, 65536.0);
        let (n, _, mean) = simulate(&p, TuneConfig::default(), 2, 30.0);
        assert!(n >= 16, "ended at {n}");
        assert!(mean > 0.85 * 100e6, "mean {mean}");
    }

    #[test]
    fn near_linear_growth_with_no_queue_quadruples() {
        // DS3-class: 45 Mbit/s, 200 ms, 64 KiB windows: one connection gets
        // 2.6 Mbit/s, the link needs about 17. Epochs are 3 RTTs (0.6 s):
        // doubling from 2 would need four steps to reach 16 or more; after
        // one near-linear doubling the controller quadruples. 1.5 s: two
        // decisions (epochs end at the sample 0.9 epochs on).
        let p = Path::window_limited(45e6, 200, 65536.0);
        let (_, most, _) = simulate(&p, TuneConfig::default(), 2, 1.5);
        assert!(most >= 16, "most {most} after 2 decisions");
        let doubling = TuneConfig {
            fast_gain: f64::INFINITY,
            ..TuneConfig::default()
        };
        let (_, most, _) = simulate(&p, doubling, 2, 1.5);
        assert!(most < 16, "doubling alone reached {most}");
        let (n, _, mean) = simulate(&p, TuneConfig::default(), 2, 30.0);
        assert!(n >= 16, "ended at {n}");
        assert!(mean > 0.85 * 45e6, "mean {mean}");
    }

    #[test]
    fn rtt_spikes_are_not_a_standing_queue() {
        // Goodput scales with N; one sample in four shows a 20 ms spike (a
        // loaded host). Growth must not stop on the spikes.
        let cfg = TuneConfig {
            max_streams: 16,
            ..TuneConfig::default()
        };
        let mut c = Controller::new(cfg, 1);
        let mut bytes = 0u64;
        for i in 1..=200u64 {
            bytes += u64::from(c.streams()) * 50_000;
            let rtt = if i % 4 == 0 { 30 } else { 10 };
            c.on_sample(Sample {
                at: Duration::from_millis(50 * i),
                bytes,
                rtt: Some(Duration::from_millis(rtt)),
                ..Sample::default()
            });
        }
        assert_eq!(c.streams(), 16, "{:?}", c.history());
    }

    #[test]
    fn a_settled_start_does_not_grow_until_it_probes() {
        // Random loss: growing always seems to help a little; a count that
        // came from the cache is kept until the periodic probe.
        let p = Path {
            cap_bps: 200e6,
            rtt: Duration::from_millis(100),
            window: 32e6,
            queue: 2e6,
            random_loss: 0.001,
            overflow_penalty: 0.5,
        };
        let cfg = TuneConfig::default();
        let mut c = Controller::settled(cfg.clone(), 8);
        let mut bytes = 0f64;
        for i in 1..=(cfg.probe_epochs * 6) {
            let (g, rtt, _) = p.step(c.streams());
            bytes += g / 8.0 * 0.05;
            c.on_sample(Sample {
                at: Duration::from_millis(50 * u64::from(i)),
                bytes: bytes as u64,
                rtt: Some(rtt),
                ..Sample::default()
            });
        }
        let h = c.history();
        assert!(h.len() >= 4, "{h:?}");
        assert!(h.iter().take(4).all(|s| s.next == 8), "{h:?}");
    }

    #[test]
    fn a_probe_that_gains_nothing_goes_back() {
        // A full link: goodput is the same at any count. Each probe (+25 %
        // every 8 quiet epochs) finds no gain and returns to 8; keeping
        // it would climb 8 -> 10 -> 12 -> 15 -> ... over a long transfer.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 60, 100e6, 0.0, 50);
        let h = c.history();
        assert!(h.iter().any(|s| s.reason == Reason::Probe), "{h:?}");
        assert_eq!(c.streams(), 8, "{h:?}");
        assert!(h.iter().all(|s| s.next <= 10), "{h:?}");
    }

    #[test]
    fn short_clean_path_stays_small() {
        // One connection fills the link: growing brings nothing.
        let p = Path {
            cap_bps: 1e9,
            rtt: Duration::from_micros(500),
            window: 4e6,
            queue: 1e6,
            random_loss: 0.0,
            overflow_penalty: 0.5,
        };
        let (n, most, _) = simulate(&p, TuneConfig::default(), 1, 20.0);
        assert!(n <= 2 && most <= 2, "ended at {n}, most {most}");
    }

    #[test]
    fn small_queue_does_not_collapse() {
        // T1-class, 560 ms, 24 KiB windows, 10-packet queue: the optimum is
        // about 4-5 connections; 8 overflow the queue.
        let p = Path {
            cap_bps: 1.536e6,
            rtt: Duration::from_millis(560),
            window: 24576.0,
            queue: 15000.0,
            random_loss: 0.0,
            overflow_penalty: 0.55,
        };
        let (n, _, mean) = simulate(&p, TuneConfig::default(), 2, 120.0);
        let bdp: f64 = 1.536e6 / 8.0 * 0.56;
        let best_n = ((bdp + 15000.0) / 24576.0).floor() as u32;
        assert!(
            n <= best_n && n >= best_n / 2,
            "ended at {n}, best {best_n}"
        );
        assert!(mean > 0.8 * 1.536e6, "mean {mean}");
    }

    /// Time (ms), bytes, segments and retransmissions so far.
    #[derive(Default)]
    struct Fed(u64, f64, f64, f64);

    /// `c` after its first sample, which starts its first epoch, and the
    /// counters to feed it from.
    fn started(mut c: Controller) -> (Controller, Fed) {
        c.on_sample(Sample::default());
        (c, Fed::default())
    }

    /// Feed `epochs` epochs of 300 ms at `bps` with the given loss rate
    /// and RTT.
    fn feed(c: &mut Controller, f: &mut Fed, epochs: u64, bps: f64, loss: f64, rtt_ms: u64) {
        feed_with(c, f, epochs * 6, bps, loss, |_| rtt_ms, None);
    }

    /// Feed `samples` samples 50 ms apart at `bps` with the given loss
    /// rate, the i-th with an RTT of `rtt_ms(i)` milliseconds, each
    /// saying `remaining` bytes are unsent.
    fn feed_with(
        c: &mut Controller,
        f: &mut Fed,
        samples: u64,
        bps: f64,
        loss: f64,
        rtt_ms: impl Fn(u64) -> u64,
        remaining: Option<u64>,
    ) {
        for i in 0..samples {
            f.0 += 50;
            f.1 += bps / 8.0 * 0.05;
            f.2 += bps / 8.0 * 0.05 / 1460.0;
            f.3 += bps / 8.0 * 0.05 / 1460.0 * loss;
            c.on_sample(Sample {
                at: Duration::from_millis(f.0),
                bytes: f.1 as u64,
                rtt: Some(Duration::from_millis(rtt_ms(i))),
                retrans: f.3 as u64,
                segs_out: f.2 as u64,
                remaining,
            });
        }
    }

    #[test]
    fn a_full_small_queue_at_steady_goodput_is_not_overflow() {
        // A count that fills the link: once the queue is full, loss-based
        // TCP loses packets and keeps a queue, whatever the count; goodput
        // holds, so the count is kept.
        let mut c = Controller::settled(TuneConfig::default(), 8);
        let mut f = Fed::default();
        feed(&mut c, &mut f, 3, 13e6, 0.0, 56);
        feed(&mut c, &mut f, 4, 13e6, 0.03, 62);
        assert!(
            c.history()
                .iter()
                .all(|s| s.reason != Reason::QueueOverflow)
                && c.streams() >= 8,
            "{:?}",
            c.history()
        );
        // The same with goodput 30 % down: now the queue costs, halve.
        let mut c = Controller::settled(TuneConfig::default(), 8);
        let mut f = Fed::default();
        feed(&mut c, &mut f, 3, 13e6, 0.0, 56);
        feed(&mut c, &mut f, 6, 9e6, 0.03, 62);
        assert!(c.streams() <= 4, "{:?}", c.history());
    }

    #[test]
    fn one_dip_of_a_sawtooth_is_not_a_collapse() {
        // Four Reno connections on an 8-packet queue (satellite-x10): an
        // epoch with a drop, the queue and goodput half down, then back.
        // Halving on that one epoch lost a fifth of the transfer's rate.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 3, 10e6, 0.0, 61);
        feed(&mut c, &mut f, 1, 4.8e6, 0.023, 66);
        feed(&mut c, &mut f, 2, 10e6, 0.0, 61);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        // Two such epochs in a row are a collapse: halve.
        feed(&mut c, &mut f, 2, 4.8e6, 0.023, 66);
        assert_eq!(c.streams(), 2, "{:?}", c.history());
    }

    #[test]
    fn a_probe_that_collapses_goes_back_to_where_it_started() {
        // Satellite-x10 warm: 4 held from the cache, a probe to 5 that
        // gains and fills the link (a standing queue: kept), then two
        // epochs of loss with a queue and goodput down: back to 4.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 8, 10e6, 0.0, 60);
        assert_eq!(c.streams(), 5, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 11.6e6, 0.0, 65);
        assert_eq!(c.streams(), 5, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 11.6e6, 0.0, 60);
        feed(&mut c, &mut f, 2, 7e6, 0.03, 65);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::QueueOverflow)
        );
        // Without a probe before it the same collapse halves.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 5));
        feed(&mut c, &mut f, 3, 10.5e6, 0.0, 60);
        feed(&mut c, &mut f, 2, 7e6, 0.03, 65);
        assert_eq!(c.streams(), 2, "{:?}", c.history());
    }

    #[test]
    fn heavy_loss_stops_growth_before_the_queue_shows() {
        // Satellite-like at a tenth of the RTT: 8 packets of queue are
        // 6 ms against 56 ms, below the queueing threshold, but the step
        // to 8 connections loses 8 % of its segments: stop there, and do
        // not probe upward while the loss lasts.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 1.7e6, 0.0, 56);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 3.9e6, 0.085, 57);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::HeavyLoss)
        );
        feed(&mut c, &mut f, 20, 9e6, 0.05, 57);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        // The same gains without the loss: growth goes on.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 1.7e6, 0.0, 56);
        feed(&mut c, &mut f, 1, 3.9e6, 0.0, 57);
        assert!(c.streams() > 8, "{:?}", c.history());
    }

    /// One 300 ms epoch at `bps`, no loss, whose first sample's RTT is
    /// `first_ms` and every other sample's `rest_ms` (BBR's drain: the
    /// smallest RTT of the epoch at the floor, the rest well above it).
    fn feed_dip(c: &mut Controller, f: &mut Fed, bps: f64, first_ms: u64, rest_ms: u64) {
        feed_with(
            c,
            f,
            6,
            bps,
            0.0,
            |i| if i == 0 { first_ms } else { rest_ms },
            None,
        );
    }

    #[test]
    fn a_high_start_waits_out_its_slow_start() {
        // 16 connections on a 100 ms path: the first epoch is slow start
        // (a sixth of the rate to come, no queue yet). Growth judged on it
        // would double a count that was about right.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 30e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::SlowStart)
        );
        // Then BBR drains once: the epoch touches the floor, but ends with
        // half the floor of queue: the link is full at 16. (Its slow
        // start's exit may lose segments into the queue: no collapse yet.)
        feed_dip(&mut c, &mut f, 160e6, 100, 150);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(c.history().last().map(|s| s.reason), Some(Reason::LinkFull));
        // Cubic's exit from slow start: 1.5 % lost with 23 ms of queue at
        // the link's rate. The link is full; halving would leave it half
        // used.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 32e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 186e6, 0.015, 123);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::HeavyLoss)
        );
        // With no queue at the end either, the path has room: grow.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 9e6, 0.0, 100);
        feed_dip(&mut c, &mut f, 40e6, 100, 102);
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        // A small start grows from its first epoch: its count is no guess
        // of the path's, only a floor.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
    }

    #[test]
    fn a_standing_queue_while_growing_stops_growth() {
        // The fresh lossy start: 4 connections in slow start, then 8 with
        // ten times the goodput and 10 ms of queue standing all epoch on
        // a 100 ms path: the link is full, stay at 8.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 80e6, 0.0, 110);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert_eq!(c.history().last().map(|s| s.reason), Some(Reason::LinkFull));
        // The same gain with no queue grows, but by a doubling only: ten
        // times the goodput for twice the connections is slow start
        // ending, no sign of linear scaling.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 80e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
    }

    #[test]
    fn a_start_that_loses_a_third_of_its_segments_does_not_grow() {
        // The satellite start: 8 connections in slow start into an
        // 8-packet queue lost 31 % of their segments. That first epoch is
        // also the lowest loss rate seen so far; it must not excuse itself.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 12, 0.2e6, 0.31, 569);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::HeavyLoss),
            "{:?}",
            c.history()
        );
        // Random loss of a few per cent (fig12's bit errors: 5.8 % of
        // packets) still lets a path grow: there more connections help.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 1.0e6, 0.06, 56);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
    }

    #[test]
    fn random_loss_is_not_mistaken_for_overflow() {
        // 0.1 % random loss, big windows: Mathis caps each connection, more help.
        let p = Path {
            cap_bps: 200e6,
            rtt: Duration::from_millis(100),
            window: 32e6,
            queue: 2e6,
            random_loss: 0.001,
            overflow_penalty: 0.5,
        };
        let (n, _, mean) = simulate(&p, TuneConfig::default(), 2, 30.0);
        assert!(n >= 8, "ended at {n}");
        assert!(mean > 0.5 * 200e6, "mean {mean}");
    }

    #[test]
    fn random_loss_with_a_standing_queue_is_not_overflow() {
        // 0.3 % random loss caps each connection (Mathis) at ~2.6 Mbit/s;
        // three fill the 8 Mbit/s link and from four on a queue stands.
        // Loss is the same at every N: no reason to shed connections.
        let p = Path {
            cap_bps: 8e6,
            rtt: Duration::from_millis(100),
            window: 1e6,
            queue: 500_000.0,
            random_loss: 0.003,
            overflow_penalty: 0.5,
        };
        let (n, _, mean) = simulate(&p, TuneConfig::default(), 2, 60.0);
        assert!(n >= 3, "ended at {n}");
        assert!(mean > 0.9 * 8e6, "mean {mean}");
    }

    #[test]
    fn little_left_means_no_growth() {
        let mut c = Controller::new(TuneConfig::default(), 1);
        let mut d = None;
        for i in 0..20u64 {
            d = d.or(c.on_sample(Sample {
                at: Duration::from_millis(100 * i),
                bytes: i * 100_000,
                rtt: Some(Duration::from_millis(10)),
                remaining: Some(10_000),
                ..Sample::default()
            }));
        }
        assert_eq!(d, None);
        assert_eq!(c.streams(), 1);
        assert_eq!(
            c.history().last().map(|s| s.reason),
            Some(Reason::TooLittleLeft)
        );
    }

    #[test]
    fn a_stalled_end_is_no_reason_to_grow() {
        // 8 connections settled at 100 Mbit/s; at the end every one of
        // them waits in a retransmission timeout with 2 MB still unsent.
        // At the settled rate that is 0.16 s of work: new connections
        // would come too late to matter.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 4, 100e6, 0.0, 50);
        feed_with(&mut c, &mut f, 4 * 6, 0.0, 0.0, |_| 50, Some(2_000_000));
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert!(
            c.history().iter().all(|s| s.reason != Reason::Degraded),
            "{:?}",
            c.history()
        );
        // The same fall with most of the file left is a changed path:
        // grow again.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 4, 100e6, 0.0, 50);
        feed_with(&mut c, &mut f, 4 * 6, 10e6, 0.0, |_| 50, Some(500_000_000));
        assert!(c.streams() > 8, "{:?}", c.history());
    }

    #[test]
    fn an_epoch_ends_at_the_sample_that_nearly_reaches_its_length() {
        // 200 ms RTT: epochs of 600 ms. Samples one per STAT reply, about
        // 300 ms apart and a little early: the epoch must close at the
        // second one, not a whole interval later.
        let mut c = Controller::new(TuneConfig::default(), 4);
        let mut decided = None;
        for (i, at) in [0u64, 299, 598, 897].into_iter().enumerate() {
            let d = c.on_sample(Sample {
                at: Duration::from_millis(at),
                bytes: at * 1_000,
                rtt: Some(Duration::from_millis(200)),
                ..Sample::default()
            });
            if d.is_some() && decided.is_none() {
                decided = Some(i);
            }
        }
        assert_eq!(decided, Some(2), "{:?}", c.history());
    }

    #[test]
    fn growth_must_pay_for_the_two_rtts_new_connections_take() {
        // 100 ms RTT: epochs of 300 ms, new connections carry data from
        // 200 ms after the decision. 0.7 s of the transfer left is more
        // than two epochs but less than two epochs and two RTTs.
        for (left_s, grows) in [(0.7, false), (0.9, true)] {
            let mut c = Controller::new(TuneConfig::default(), 4);
            let bps = 8e6;
            let mut bytes = 0u64;
            let mut d = None;
            for i in 0..=7u64 {
                if i > 0 {
                    bytes += (bps / 8.0 * 0.05) as u64;
                }
                d = d.or(c.on_sample(Sample {
                    at: Duration::from_millis(50 * i),
                    bytes,
                    rtt: Some(Duration::from_millis(100)),
                    remaining: Some((bps / 8.0 * left_s) as u64),
                    ..Sample::default()
                }));
            }
            assert_eq!(d.is_some(), grows, "{left_s} s left: {:?}", c.history());
        }
    }

    #[test]
    fn bounds_hold() {
        let cfg = TuneConfig {
            max_streams: 4,
            ..TuneConfig::default()
        };
        let c = Controller::new(cfg, 100);
        assert_eq!(c.streams(), 4);
        let mut c = Controller::new(TuneConfig::default(), 0);
        assert_eq!(c.streams(), 1);
        c.limit(0);
        assert_eq!(c.streams(), 1);
    }
}
