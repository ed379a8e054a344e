//! Dynamic multiplicity control: how many connections, now.
//!
//! XFTP kept the RTT between α and β: add a connection below α, turn off
//! half of them above β. The delay signal is the right one for "is the
//! link full": a bottleneck that never idles keeps a standing queue, and
//! random loss does not raise the RTT. RTT alone cannot tell a deep queue
//! that still gains throughput from one that does not, so this controller
//! also asks the link by experiment, judging each change by the goodput it
//! brought. Per *epoch* (max(300 ms, 3 RTTs)) it reads:
//!
//! * **goodput** (payload bytes delivered per second), and whether it still
//!   climbs (the epoch's second half against its first);
//! * **standing queue**: the epoch's *smallest* RTT above the floor;
//! * **loss**: retransmitted segments per segment sent, against the path's
//!   own (the lowest seen in an epoch with no queue).
//!
//! Rules (docs/tuning.md has the reasons):
//!
//! 1. *Start* — wait while goodput climbs (slow start; a start of
//!    [`TuneConfig::wait_first_from`] or more never decides on its first
//!    epoch). Then, with no standing queue and no heavy loss, grow: four
//!    times the count when the epoch was clean (no queue, no loss beyond
//!    the path's own, several segments in flight per connection), else
//!    twice.
//! 2. *Grow* — every growth step is a trial, judged against the level
//!    before it as a share of the ideal gain (every added connection
//!    carrying as much as the others did). Half the ideal or more grows on
//!    at once (×4 after a near-linear step on a clean path, else ×2),
//!    unless a queue now stands: the link is full, keep the count. Less is
//!    judged once the new connections have ramped up, over two epochs:
//!    a gain of a tenth of the step keeps the count, less goes back. A
//!    step that crowds the queue (heavy loss with a standing queue) and
//!    brings nothing goes back at once, and growth stays below it.
//! 3. *Steady* — no standing queue for two epochs: the bottleneck idles,
//!    each connection held by its window or by its own losses (Mathis), so
//!    try more; after a trial that gained nothing, later and later. A
//!    crowded queue (loss above the path's own by 2 %, with a standing
//!    queue, or heavy loss on windows of under 32 segments) in two of
//!    three epochs: try fewer (half, or as
//!    many as the pipe holds at 8 segments each) and keep them if goodput
//!    holds within 8 %, judged once the retired connections have sent the
//!    records they hold; else go back and do not step down from there
//!    again. Goodput at 60 % of the settled level with no heavy loss or
//!    queue: conditions changed, grow. Now and then probe +25 %.
//! 4. *Long paths* (rule 7 in docs/tuning.md) — from an RTT of 200 ms,
//!    a clean first epoch of the start whose pipe would give twice the
//!    count 8 segments each doubles the count during slow start; the
//!    second epoch once more where it would give 32 each.
//! 5. *Own delay* (rule 8 in docs/tuning.md) — a queue that stood while a
//!    growth step's connections carried half their share or more is no
//!    bottleneck's (a window cap's delayed acknowledgements): it stops
//!    counting as queue, and growth goes on. A start that stops on a
//!    queue probes it soon.
//! 6. *Short paths* (rules 6 and 9 in docs/tuning.md) — under 20 ms of
//!    RTT, a timeout idles a connection for a hundred round trips: with
//!    under 8 segments each, heavy loss neither stops growth (up to 8)
//!    nor sheds; with 8 or more and no queue standing, heavy loss is the
//!    path's own (BBR on a shallow queue) and goodput judges growth.
//! 7. *Busy* (rule 10 in docs/tuning.md) — a busy bottleneck delivers its
//!    rate: delay above the floor while goodput is under 3/4 of the best
//!    seen (two epochs in a row), with no heavy loss, is not read as a
//!    full link (growth is not barred by it); a growth step from such a
//!    count that carries 9/10 of the best again is kept whatever level it
//!    is judged against.
//! 8. Never grow when what is left of the transfer would finish within two
//!    epochs and two RTTs: new connections would arrive too late (the MULT
//!    exchange and their handshake take two RTTs) and spend the rest in
//!    slow start.
//!
//! 9. *Stall* (rule 12 in docs/tuning.md) — an epoch that delivered next
//!    to nothing (2 % of the best seen) is the path stopping, not the
//!    count: not judged.
//! 10. *Outside limit* — with [`TuneConfig::ceiling_bps`], an epoch at
//!     85 % of it starts no growth.
//!
//! A count known to be good for the path (the cache's best) starts in
//! *Steady* ([`Controller::settled`]).
//!
//! The controller has no clock: `Sample::at` carries time. It is judged
//! on a simulated path ([`crate::model`]) in its tests.

use std::time::Duration;

/// An epoch ends at the first sample at least this share of its length
/// after its start.
const EPOCH_SLACK: f64 = 0.9;

/// A growth step whose goodput rose more than this many times its ratio
/// of connections was measured against slow start, not a settled rate.
const SUPERLINEAR: f64 = 1.25;

/// Goodput above the last epoch's by this factor: still ramping up.
const RAMPING: f64 = 1.15;

/// Rule 14 holds from this RTT floor on.
const EVEN_RTT: Duration = Duration::from_millis(10);

/// The most epochs a start or a trial waits for its ramp to end.
const MAX_WAIT: u32 = 4;

/// Payload bits in a segment (1448-byte MSS, timestamps on).
const SEGMENT_BITS: f64 = 1448.0 * 8.0;

/// Segments in flight per connection below which a connection that loses
/// segments is not held by its window (windows of 16 KiB or more are 11
/// segments or more) but by a pipe that small: more connections would
/// crowd it.
const TINY_SHARE: f64 = 4.0;

/// Segments of the pipe per connection a step down aims for: enough for
/// fast retransmit to repair a loss without a timeout.
const SHED_SHARE: f64 = 8.0;

/// Segments of the pipe per connection from which heavy loss with no
/// standing queue is not read as connections crowding a short queue: a
/// window this large repairs a loss by fast retransmit, so halving the
/// count saves no timeouts. (The T1 satellite at 16 connections holds
/// about 5 each; a 350 Mbit/s, 270 ms path at 16 about 230.)
const CROWD_SHARE: f64 = 4.0 * SHED_SHARE;

/// Share of the best goodput seen (of two epochs in a row) below which a
/// standing queue is not read as a full link (a busy bottleneck delivers
/// its rate).
const BUSY_SHARE: f64 = 0.75;

/// Share of the best goodput seen (of two epochs in a row) that a growth
/// step from a starved count (see [`BUSY_SHARE`]) must carry to be kept
/// whatever its gain.
const REGAINED_SHARE: f64 = 0.9;

/// Linux's shortest retransmission timeout (TCP_RTO_MIN).
const MIN_RTO: Duration = Duration::from_millis(200);

/// A path whose RTT floor is this many times shorter than [`MIN_RTO`] or
/// more idles a connection for that many round trips at each timeout.
const TIMEOUT_RTTS: f64 = 10.0;

/// The most connections rule 6 (timeouts hold the link) grows to. On
/// every tiny link measured (eight, docs/tuning.md) the best fixed count
/// was 8 or fewer, and with Reno 16 or more collapsed: each connection's
/// share of the pipe under a segment, timeouts backing off, fixed 16, 32
/// and 64 all out of time on a 6.2 Mbit/s, 6.8 ms link with a 3000-byte
/// queue. A trial into that costs more than it can show, since retired
/// connections first finish the records they hold.
const TIMEOUT_MAX: u32 = 8;

/// Rule 6's cap once the link has carried [`TIMEOUT_WIDE_BPS`]: on the
/// emulated 120 and 240 Mbit/s links with a four-packet queue and 2 ms of
/// RTT, fixed 16 and 32 moved 15-25 % more than 8 (BBR and CUBIC), where
/// every tiny link on which 8 was best or 16 collapsed carried 12 Mbit/s
/// or less (docs/tuning.md, "Tiny short paths").
const TIMEOUT_WIDE_MAX: u32 = 32;

/// See [`TIMEOUT_WIDE_MAX`]: between the 12 Mbit/s of the narrow tiny
/// links and the 33 Mbit/s and more of those where 16 beat 8.
const TIMEOUT_WIDE_BPS: f64 = 20e6;

/// A path whose RTT floor is at least this long grows during its start's
/// slow start (rule 7): each epoch there is 0.6 s or more, and slow start
/// alone takes several of them on a fat path.
const LONG_RTT: Duration = Duration::from_millis(200);

/// A record, in bits: what a retired connection still sends (the server
/// cuts files into records of 256 KiB, smaller at the end).
const RECORD_BITS: f64 = 256.0 * 1024.0 * 8.0;

/// A connection's first flight: Linux's initial window of 10 segments.
const FIRST_FLIGHT: f64 = 10.0 * 1448.0;

/// Share of the start's first flights that must be delivered before rule
/// 11 reads the RTT (some of the last may still be on the way).
const FLIGHTS_IN: f64 = 0.8;

/// RTT, against the handshake's, under which the first flights met no
/// queue (rule 11).
const FLIGHT_RTT: f64 = 1.1;

/// Shortest path (the handshake's RTT) for rule 11. From 200 ms it also
/// took the emulated ds3 profile (45 Mbit/s, 64 KiB windows, best 32) to
/// 64 and cost it 3-8 %, and a 178 Mbit/s, 280 ms autotuned CUBIC path
/// 5-10 % (64 connections' tail) (docs/tuning.md).
const FLIGHTS_RTT: Duration = Duration::from_millis(300);

/// Share of the best goodput seen at or below which an epoch is a stall
/// of the path, not judged (an epoch of nothing delivered always is).
const STALL_SHARE: f64 = 0.02;

/// A stall that goes on this long (and [`RESCUE_RTTS`] round trips) after
/// the peer answered again is the data connections', not the path's: one
/// connection is added (rule 12). After a 30 s stall of an 80 ms path the
/// one connection of a download sat 60 s more in a retransmission timeout
/// the stall had blown up to 84 s, while the control connection answered
/// in a round trip, and the transfer timed out.
const RESCUE_AFTER: Duration = Duration::from_secs(2);

/// See [`RESCUE_AFTER`].
const RESCUE_RTTS: u32 = 8;

/// Share of [`TuneConfig::ceiling_bps`] from which goodput is the
/// limit's: more connections cannot raise it.
const CEILING_SHARE: f64 = 0.85;

/// Knobs; the defaults are documented in docs/tuning.md.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// Fewest connections.
    pub min_streams: u32,
    /// Most connections (also bounded by what the server grants).
    pub max_streams: u32,
    /// Share of the ideal gain (the added connections carrying as much as
    /// the others did) a growth step must bring to grow on.
    pub gain: f64,
    /// Share of the ideal gain of a doubling above which, with no queue
    /// and no loss, the next step quadruples N instead.
    pub fast_gain: f64,
    /// Share of the ideal gain below which a growth step is undone once
    /// its connections have ramped up.
    pub keep_gain: f64,
    /// Retransmitted/sent segments in an epoch above which loss counts
    /// for fast growth.
    pub loss_threshold: f64,
    /// Queueing delay (RTT minus floor) that marks a standing queue:
    /// the larger of this and `queue_delay_fraction` × floor.
    pub queue_delay_min: Duration,
    /// See `queue_delay_min`.
    pub queue_delay_fraction: f64,
    /// Queueing delay that vetoes a probe: the larger of this and
    /// `heavy_queue_fraction` × floor.
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
    /// Loss above the path's own (the lowest seen with no standing queue)
    /// that, with a standing queue, says the connections crowd the queue.
    pub shed_loss: f64,
    /// Goodput a step down may lose and still be kept.
    pub shed_tolerance: f64,
    /// Shortest epoch.
    pub min_epoch: Duration,
    /// Epoch length in RTTs (of the RTT floor).
    pub epoch_rtts: f64,
    /// Quiet steady epochs between probes upward (doubled after each probe
    /// that gained nothing).
    pub probe_epochs: u32,
    /// A start of at least this many connections is never judged on its
    /// first epoch (slow start); a smaller one is, when its goodput has
    /// stopped climbing within that epoch.
    pub wait_first_from: u32,
    /// A rate the transfer is held to from outside, in bits per second
    /// (`--limit-rate`): an epoch at [`CEILING_SHARE`] of it or more
    /// shows the limit, not the path, so no growth starts from it.
    pub ceiling_bps: Option<f64>,
}

impl Default for TuneConfig {
    fn default() -> Self {
        TuneConfig {
            min_streams: 1,
            max_streams: 64,
            gain: 0.5,
            fast_gain: 0.8,
            keep_gain: 0.1,
            loss_threshold: 0.002,
            queue_delay_min: Duration::from_millis(3),
            queue_delay_fraction: 0.05,
            heavy_queue_min: Duration::from_millis(5),
            heavy_queue_fraction: 0.5,
            heavy_loss: 0.01,
            heavy_loss_max: 0.1,
            shed_loss: 0.02,
            shed_tolerance: 0.08,
            min_epoch: Duration::from_millis(300),
            epoch_rtts: 3.0,
            probe_epochs: 8,
            wait_first_from: 8,
            ceiling_bps: None,
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
    /// The peer answered on the control connection since the last sample
    /// (a download's samples are its replies): the path carries packets
    /// now, whatever the data connections do.
    pub heard: bool,
}

/// Why the controller chose a stream count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The starting value.
    Start,
    /// A growth step (a trial) or its success: grow again.
    Grow,
    /// The count stays: the last step did not gain enough to go on, or
    /// nothing calls for a change.
    NoGain,
    /// The last step did not pay: back to the count before it.
    Undo,
    /// A growth step overflowed a queue (heavy loss, a standing queue, no
    /// more goodput): back at once, and no growth to it again.
    QueueOverflow,
    /// Goodput fell with no queue: conditions changed, grow again.
    Degraded,
    /// Periodic probe upward.
    Probe,
    /// Too little left to be worth new connections.
    TooLittleLeft,
    /// Heavy loss: a full queue, however short; no growth.
    HeavyLoss,
    /// Not used by this controller; kept for older timelines.
    Hold,
    /// A standing queue: the link is full at this count.
    LinkFull,
    /// The start's connections are still in slow start: their goodput
    /// says nothing yet.
    SlowStart,
    /// A standing queue with heavy loss: try fewer connections.
    Shed,
    /// A change is being judged: its connections are joining or ramping.
    Trial,
    /// Goodput is at the rate the transfer is held to (`--limit-rate`):
    /// more connections cannot raise it.
    RateLimit,
    /// Next to nothing was delivered in the epoch (the path stalled), or
    /// the epoch is the first after such: not judged.
    Stalled,
    /// The data stood still for a while after the peer answered again:
    /// the connections wait out timeouts the stall blew up, and a fresh
    /// one is added to carry what they hold.
    Rescue,
    /// The last growth step carried as much as the count before it and
    /// crowded nothing: kept, as going back would cost more (once a
    /// transfer).
    KeptEven,
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
#[derive(Debug, Clone, Copy)]
struct Judged {
    /// Goodput, bits per second.
    g: f64,
    /// Goodput still climbing (within the epoch, or against the last one).
    ramping: bool,
    /// Goodput of the epoch's second part (or of the whole epoch).
    late: f64,
    /// The epoch's last sample had no RTT, where earlier ones had: every
    /// connection was held by its receiver's window by then (a cap; slow
    /// start is over).
    held: bool,
    /// New connections join late enough in an epoch (two RTTs of it) for
    /// its first part to miss them.
    late_join: bool,
    /// The epoch's smallest RTT above the floor: a standing queue.
    queueing: bool,
    /// How far above the floor (and `own_delay`) that RTT was.
    queue: Option<Duration>,
    /// The RTT at the epoch's end above the floor.
    queue_now: bool,
    /// A heavy queue (vetoes probes).
    heavy_queue: bool,
    /// Heavy loss: no growth.
    heavy_loss: bool,
    /// Heavy loss that is the path's own (rule 9): no veto.
    own_loss: bool,
    /// A standing queue with loss well above the path's own.
    crowded: bool,
    /// No queue and no loss above the threshold: fast growth allowed.
    clean: bool,
    /// The rest would finish before new connections could help.
    little_left: bool,
    /// Few segments in flight per connection, and losing some: the pipe,
    /// not each connection's window, holds them (windows of 16 KiB or
    /// more are 11 segments or more). A connection held back by its peer
    /// (a throttle, a slow reader) loses nothing.
    tiny: bool,
    /// Few segments in flight per connection, lossy or not.
    small: bool,
    /// Segments in flight over all connections (goodput × RTT now).
    pipe: f64,
    /// Losing on windows too small for fast retransmit, on a path so
    /// short that each retransmission timeout idles a connection for ten
    /// round trips or more: the link idles with it unless other
    /// connections fill it. Heavy loss here bars no growth trial (judged
    /// by goodput like any other).
    timeout_bound: bool,
}

/// A change under test.
#[derive(Debug, Clone, Copy)]
struct Trial {
    from: u32,
    to: u32,
    /// Goodput at `from` before the change.
    base: f64,
    /// Epochs judged since the change.
    epochs: u32,
    /// Goodput of the last epoch judged.
    last: f64,
    /// A probe (+25 %) rather than a growth step.
    probe: bool,
    /// Epochs of a step down with the crowding gone, and their goodput.
    clear: u32,
    clear_sum: f64,
    /// Epochs a step down waits at most for the crowding to clear.
    wait: u32,
    /// Epochs after the first, and their goodput.
    all: u32,
    all_sum: f64,
    /// Where `base` is the first epoch of a step that grew on at once:
    /// the level before that step, the last one measured after a ramp.
    prior: Option<f64>,
    /// Taken from a count whose goodput had fallen well below the best
    /// seen (`Controller::starved`).
    starved: bool,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The start, until its goodput stops climbing.
    Start,
    /// More connections on trial.
    Up(Trial),
    /// Fewer connections on trial.
    Down(Trial),
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
    /// The path's RTT from elsewhere (the control connection's), for
    /// timing alone: epochs, arrivals, segments per connection.
    rtt_hint: Option<Duration>,
    /// Smallest RTT sampled in the current epoch: a standing queue raises
    /// it, a passing spike (a loaded host, one burst) does not.
    epoch_rtt: Option<Duration>,
    epoch_start: Option<Sample>,
    /// The first sample past the middle of the epoch (goodput's trend).
    epoch_mid: Option<Sample>,
    /// Goodput of the last epoch.
    last_g: Option<f64>,
    settled: Option<f64>,
    /// Epochs evaluated, and epochs of the start.
    epochs: u32,
    start_epochs: u32,
    /// Steady epochs in a row with no standing queue, with a crowded
    /// queue, with goodput far down.
    room_epochs: u32,
    /// Crowded epochs, one bit each, the latest lowest.
    crowded_bits: u8,
    low_epochs: u32,
    quiet_epochs: u32,
    /// Epochs between probes (doubles after each that gained nothing).
    probe_every: u32,
    /// No growth trial to this count or beyond before that epoch.
    up_failed: Option<(u32, u32)>,
    /// Epochs to wait after the next failed growth trial.
    up_backoff: u32,
    /// A growth trial was kept on carrying as much as before (rule 14).
    kept_even: bool,
    /// A step down from this count did not hold goodput.
    shed_failed: Option<u32>,
    /// Delay above the RTT floor that is no queue: it stood while added
    /// connections carried their share (rule 8).
    own_delay: Duration,
    /// Smallest per-epoch loss rate seen: the path's random loss.
    loss_floor: Option<f64>,
    /// Smallest per-epoch loss rate seen with no standing queue.
    quiet_loss: Option<f64>,
    /// Highest mean goodput of two epochs in a row so far: the link
    /// carries at least this.
    best_g: Option<f64>,
    /// The last epoch's goodput was well below `best_g` with a queue that
    /// therefore was no full link's.
    starved: bool,
    /// Rule 11 has looked at the start's first flights.
    flights_read: bool,
    /// An epoch's goodput reached the outside limit (sticky)
    /// ([`TuneConfig::ceiling_bps`]).
    at_ceiling: bool,
    /// In a stall (rule 12): when the peer was first heard in it, and
    /// whether a connection was added for it.
    stall: Option<(Option<Duration>, bool)>,
    history: Vec<Step>,
}

impl Controller {
    /// Start with `initial` connections.
    pub fn new(cfg: TuneConfig, initial: u32) -> Self {
        let max = cfg.max_streams.max(cfg.min_streams).max(1);
        let n = initial.clamp(cfg.min_streams.max(1), max);
        let probe_every = cfg.probe_epochs.max(1);
        Controller {
            cfg,
            n,
            cap: max,
            phase: Phase::Start,
            floor: None,
            rtt_hint: None,
            epoch_rtt: None,
            epoch_start: None,
            epoch_mid: None,
            last_g: None,
            settled: None,
            epochs: 0,
            start_epochs: 0,
            room_epochs: 0,
            crowded_bits: 0,
            low_epochs: 0,
            quiet_epochs: 0,
            probe_every,
            up_failed: None,
            up_backoff: 4,
            kept_even: false,
            shed_failed: None,
            own_delay: Duration::ZERO,
            loss_floor: None,
            quiet_loss: None,
            best_g: None,
            starved: false,
            flights_read: false,
            at_ceiling: false,
            stall: None,
            history: Vec::new(),
        }
    }

    /// Start with `n` connections known to suit the path (e.g. the cache's
    /// best for this destination): steady from the first epoch after its
    /// slow start, trying other counts only when the path calls for it.
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
        // A growth step that cannot happen is no trial to judge.
        if let Phase::Up(t) = self.phase {
            if self.n <= t.from {
                self.phase = Phase::Steady;
            }
        }
    }

    /// Every evaluated epoch so far.
    pub fn history(&self) -> &[Step] {
        &self.history
    }

    /// The count to remember for this path (the next transfer's start):
    /// the one whose epoch carried the most goodput, leaving out counts
    /// the controller stepped down from as crowded and stayed below (an
    /// overflow, or a step down whose trial was kept): one epoch of 16 at
    /// 19.5 Mbit/s with a fifth of its segments lost, shed to 8 and 4 at
    /// 19.3, made every later transfer start at 16. `None` before any
    /// epoch was judged.
    pub fn learned(&self) -> Option<u32> {
        learned_from(&self.history)
    }

    /// The smallest RTT seen.
    pub fn rtt_floor(&self) -> Option<Duration> {
        self.floor
    }

    /// The path's round-trip time as measured elsewhere (the control
    /// connection's), used until the data connections report one. Where
    /// every connection is held by its receiver's window, they report none
    /// (their RTT carries the receiver's delayed acknowledgements), and
    /// without this an epoch on a 550 ms path would last 300 ms, shorter
    /// than the round trip new connections take to join. It times epochs
    /// and arrivals only: a standing queue is read from the data
    /// connections' own RTT.
    pub fn hint_rtt(&mut self, rtt: Duration) {
        if !rtt.is_zero() {
            self.rtt_hint = Some(rtt);
        }
    }

    /// The RTT floor for timing: the data connections', else the hint.
    fn path_rtt(&self) -> Option<Duration> {
        self.floor.or(self.rtt_hint)
    }

    fn epoch_len(&self) -> Duration {
        let by_rtt = self
            .path_rtt()
            .map_or(Duration::ZERO, |f| f.mul_f64(self.cfg.epoch_rtts));
        by_rtt.max(self.cfg.min_epoch)
    }

    /// Record an epoch that was not judged (rule 12) in the history.
    fn unjudged(&mut self, s: &Sample, goodput: f64, next: u32, reason: Reason) {
        self.history.push(Step {
            at_s: s.at.as_secs_f64(),
            streams: self.n,
            goodput_bps: goodput,
            rtt_ms: s.rtt.map(|r| r.as_secs_f64() * 1e3),
            queue_ms: None,
            loss: 0.0,
            next,
            reason,
        });
    }

    /// Take a sample; returns a decision when the stream count changes.
    pub fn on_sample(&mut self, s: Sample) -> Option<Decision> {
        if let Some(r) = s.rtt.filter(|r| !r.is_zero()) {
            self.floor = Some(self.floor.map_or(r, |f| f.min(r)));
            self.epoch_rtt = Some(self.epoch_rtt.map_or(r, |e| e.min(r)));
        }
        if let Some(d) = self.first_flights(&s) {
            return Some(d);
        }
        let Some(start) = self.epoch_start else {
            self.epoch_start = Some(s);
            return None;
        };
        let dt = s.at.saturating_sub(start.at);
        let len = self.epoch_len();
        if self.epoch_mid.is_none() && dt >= len / 2 {
            self.epoch_mid = Some(s);
        }
        // Samples come at their own pace (every 100 ms, or one per STAT
        // reply, about an RTT apart): close the epoch at the sample that
        // nearly reaches its length rather than one interval later.
        if dt < len.mul_f64(EPOCH_SLACK) || dt.is_zero() {
            return None;
        }
        self.epoch_start = Some(s);
        let mid = self.epoch_mid.take().filter(|m| m.at < s.at);
        let rate = |a: &Sample, b: &Sample| {
            let t = b.at.saturating_sub(a.at).as_secs_f64();
            (t > 0.0).then(|| b.bytes.saturating_sub(a.bytes) as f64 * 8.0 / t)
        };
        let goodput = rate(&start, &s).unwrap_or(0.0);
        // A stall (the path stopped: a link down, a host frozen): next to
        // nothing delivered in a whole epoch where the link carried far
        // more, and only timeouts' retransmissions sent. That says
        // nothing of the count: read as heavy loss on tiny windows it
        // shed an upload from 8 connections to 1 within a second of a
        // 5 s stall, and the drain after it was then cached as one
        // connection's rate. Not judged; the epoch after it is.
        // (Crowding that collapses a link still delivers more than this.)
        if goodput <= STALL_SHARE * self.best_g.unwrap_or(0.0) {
            self.epoch_mid = None;
            self.epoch_rtt = None;
            // Unless it goes on after the peer answered again (rule 12).
            let wait = self
                .path_rtt()
                .map_or(RESCUE_AFTER, |r| (r * RESCUE_RTTS).max(RESCUE_AFTER));
            let (heard_at, rescued) = self.stall.get_or_insert((None, false));
            if s.heard && heard_at.is_none() {
                *heard_at = Some(s.at);
            }
            let rescue = !*rescued
                && self.n < self.cap
                && heard_at.is_some_and(|h| s.at.saturating_sub(h) >= wait);
            *rescued |= rescue;
            let (next, reason) = if rescue {
                (self.n + 1, Reason::Rescue)
            } else {
                (self.n, Reason::Stalled)
            };
            self.unjudged(&s, goodput, next, reason);
            if !rescue {
                return None;
            }
            // Whatever was on trial is moot; the epochs after the stall
            // are judged from here.
            self.n = next;
            self.phase = Phase::Steady;
            return Some(Decision {
                streams: next,
                reason,
            });
        }
        if self.stall.take().is_some() {
            // The epoch after a stall is not judged either: its goodput
            // is the drain of what the stall held, its RTT samples the
            // stall's (a put through a 70 s stall read 70 s of RTT and
            // 30.8 Mbit/s against 8 before it, and its start doubled to
            // 64). Judging starts afresh from the next.
            self.last_g = None;
            self.epoch_rtt = None;
            self.unjudged(&s, goodput, self.n, Reason::Stalled);
            return None;
        }
        // Within the epoch: its second part against its first.
        let halves = mid.and_then(|m| Some((rate(&start, &m)?, rate(&m, &s)?)));
        let ramping = match halves {
            Some((a, b)) => b > a * RAMPING,
            None => self.last_g.is_some_and(|l| goodput > l * RAMPING),
        };
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
        // Delay above the floor that growth showed is no bottleneck's
        // (`own_delay`) is not queue.
        let base = self.floor.map(|f| f + self.own_delay);
        let queue = match (epoch_rtt, base) {
            (Some(r), Some(b)) => Some(r.saturating_sub(b)),
            _ => None,
        };
        let over = |r: Option<Duration>, min: Duration, frac: f64| match (r, base, self.floor) {
            (Some(r), Some(b), Some(f)) => r.saturating_sub(b) > min.max(f.mul_f64(frac)),
            _ => false,
        };
        let (qmin, qfrac) = (self.cfg.queue_delay_min, self.cfg.queue_delay_fraction);
        let queueing = over(epoch_rtt, qmin, qfrac);
        // The RTT at the epoch's end: a queue that stands now. BBR drains
        // its queue once after its startup, so the epoch after a start's
        // slow start can touch the floor for a moment with a queue of half
        // the floor before and after.
        let queue_now = over(s.rtt, qmin, qfrac);
        let heavy_queue = over(
            epoch_rtt,
            self.cfg.heavy_queue_min,
            self.cfg.heavy_queue_fraction,
        );
        // Random loss is the same whatever N is; loss from a crowded queue
        // comes with a standing queue. The lowest rate seen is the path's
        // own as far as growth goes; the lowest seen with no queue is what
        // the queue's losses are measured from.
        let floor = *self.loss_floor.get_or_insert(loss);
        self.loss_floor = Some(floor.min(loss));
        // A router queue much shorter than the RTT overflows long before
        // the queueing delay shows against a long RTT (8 packets at T1 rate
        // are 62 ms against 560): one segment in a hundred lost says the
        // same, and no random-loss path worth striping loses that much.
        let heavy_loss = loss
            > (3.0 * floor)
                .min(self.cfg.heavy_loss_max)
                .max(self.cfg.heavy_loss);
        if !queueing && !heavy_loss && !matches!(self.phase, Phase::Start) {
            self.quiet_loss = Some(self.quiet_loss.map_or(loss, |q| q.min(loss)));
        }
        let floor_s = self.path_rtt().map_or(0.0, |f| f.as_secs_f64());
        let per_conn = goodput / f64::from(self.n.max(1)) * floor_s / SEGMENT_BITS;
        let short = self
            .path_rtt()
            .is_some_and(|f| f.mul_f64(TIMEOUT_RTTS) < MIN_RTO);
        // Rule 9: on a short path with no queue standing, heavy loss on
        // windows that fast retransmit repairs is the path's own, not a
        // full link: one BBR connection on a 740 Mbit/s, 2.4 ms path with
        // a queue of a fifth of its BDP lost 20-30 % of its segments at
        // 220 Mbit/s, where 16 connections moved 520 (iperf3 alike).
        // Goodput judges each trial there, as on a path of random loss;
        // timeouts cost a short path little, and a queue still stops
        // growth.
        // (Only where an RTT says so: with none, no queue can be seen.)
        let own_loss =
            short && epoch_rtt.is_some() && !queueing && !queue_now && per_conn >= SHED_SHARE;
        let heavy_loss_raw = heavy_loss;
        let heavy_loss = heavy_loss && !own_loss;
        // Connections crowding a queue: loss well above the path's own,
        // with a standing queue or, where the queue is too short to show
        // against the RTT, with heavy loss on windows small enough that
        // fewer connections would lose less. Large windows repair their
        // losses by fast retransmit whatever the count; their loss is a
        // slow start's overshoot or a sawtooth's peak, and fewer of them
        // only make the sawtooth deeper.
        let crowded = (queueing || (heavy_loss && per_conn < CROWD_SHARE))
            && loss - self.quiet_loss.unwrap_or(0.0) > self.cfg.shed_loss;
        // The path's own loss does not bar fast growth: only loss above it.
        // Clean needs an RTT to show no queue: a server whose connections
        // are all held by their receivers' windows reports none (a window
        // cap, as on DS3), and a x4 step taken blind went from 16 to 64
        // where 16 already carried 0.96 of the link.
        let clean = epoch_rtt.is_some()
            && !queueing
            && loss
                <= self
                    .cfg
                    .loss_threshold
                    .max(1.5 * self.quiet_loss.unwrap_or(0.0));
        // A standing queue is a busy bottleneck's, and a busy bottleneck
        // delivers its rate, which is at least the best seen. Delay
        // above the floor while goodput sits well below that best, with
        // no heavy loss, is no full link's: cubic connections on a
        // 198 Mbit/s, 64 ms path with 0.09 % random loss decayed from 190
        // to 70 Mbit/s at 8 (each capped by its own losses, Mathis) while
        // their smallest RTT stood 3-14 ms above the floor (a loaded
        // host's delay), and `link_full` kept the count at 8 where 32
        // carried 190. It does not bar growth there; trials judge it by
        // goodput. (Crowding, which sheds, still reads the raw queue.)
        // The best is of two epochs in a row: an epoch can deliver more
        // than the link carries in it when a loss's hole fills and a
        // window of bytes already received counts at once, after an
        // epoch that delivered as much less.
        let best = self.best_g.unwrap_or(0.0);
        let starved = goodput < BUSY_SHARE * best && !heavy_loss && !crowded;
        let pair = self.last_g.map_or(goodput, |l| (l + goodput) / 2.0);
        self.best_g = Some(best.max(pair));
        self.starved = starved;
        let (queueing, queue_now, heavy_queue) = if starved {
            (false, false, false)
        } else {
            (queueing, queue_now, heavy_queue)
        };
        // New connections carry data only about two RTTs after the
        // decision (the MULT exchange, then their handshake).
        let arrive = self.path_rtt().map_or(0.0, |f| 2.0 * f.as_secs_f64());
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
        let timeout_bound = short && per_conn < SHED_SHARE && loss > self.cfg.loss_threshold;
        let now_s = s.rtt.map_or(floor_s, |r| r.as_secs_f64());
        let pipe = goodput * now_s / SEGMENT_BITS;
        // Sticky: an epoch that dips under the limit (a sawtooth, a
        // slow reader) is no call for more connections; a probe after
        // one added two to a transfer held at 8.4 Mbit/s.
        self.at_ceiling |= self.near_ceiling(goodput);
        let (next, reason) = self.decide(Judged {
            g: goodput,
            ramping,
            late: halves.map_or(goodput, |h| h.1),
            late_join: arrive > 0.25 * self.epoch_len().as_secs_f64(),
            // (Only after some RTT: a peer that reports none at all, a
            // server on a system without TCP_INFO, holds no windows.)
            held: s.rtt.is_none() && self.floor.is_some(),
            queueing,
            queue,
            queue_now,
            heavy_queue,
            heavy_loss,
            own_loss: heavy_loss_raw && own_loss,
            crowded,
            clean,
            little_left,
            tiny: per_conn < TINY_SHARE && loss > self.cfg.loss_threshold,
            small: per_conn < TINY_SHARE,
            pipe,
            timeout_bound,
        });
        // What held growth back, for the step log.
        let reason = if self.at_ceiling && reason == Reason::NoGain {
            Reason::RateLimit
        } else {
            reason
        };
        self.last_g = Some(goodput);
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
            Some(Decision {
                streams: next,
                reason,
            })
        } else {
            None
        }
    }

    /// Rule 11: on a long path ([`FLIGHTS_RTT`]), the start's first
    /// flights (each connection's initial window) delivered at the
    /// handshake's RTT with nothing retransmitted met no queue: the pipe
    /// holds all of them with room, so four times the count goes into the
    /// ramp at once, a round trip in, where growth after the start's
    /// first epoch would come two steps of several seconds later (and,
    /// where every connection is held by a window cap, two steps a
    /// doubling each). Read once, before that epoch ends. A narrow long
    /// path's bottleneck queues or drops the first flights' burst (the T1
    /// satellite hop lost 9 % of them).
    fn first_flights(&mut self, s: &Sample) -> Option<Decision> {
        if self.flights_read || !matches!(self.phase, Phase::Start) || self.start_epochs > 0 {
            return None;
        }
        let hint = self.rtt_hint?;
        let flights = f64::from(self.n) * FIRST_FLIGHT;
        if (s.bytes as f64) < FLIGHTS_IN * flights {
            return None;
        }
        self.flights_read = true;
        // (Only from the data connections' own counts: a download from a
        // server that reports none samples the control connection's RTT,
        // which says nothing of the flights.)
        // Flights paced by an outside limit say nothing of the pipe.
        let paced = self.near_ceiling(s.bytes as f64 * 8.0 / s.at.as_secs_f64().max(1e-3));
        // (Nor far below it: then the hint was no path's RTT, but a
        // handshake a stall held.)
        let calm = s.segs_out > 0
            && s.retrans == 0
            && !paced
            && s.rtt
                .is_some_and(|r| r <= hint.mul_f64(FLIGHT_RTT) && r >= hint / 2);
        let to = self.n.saturating_mul(4).min(self.cap);
        // Each added connection takes a record at least.
        let room = s.remaining.map_or(true, |r| {
            r as f64 * 8.0 >= f64::from(to - self.n.min(to)) * RECORD_BITS
        });
        if hint < FLIGHTS_RTT || !calm || !room || !self.may_grow() || to <= self.n {
            return None;
        }
        self.history.push(Step {
            at_s: s.at.as_secs_f64(),
            streams: self.n,
            goodput_bps: s.bytes as f64 * 8.0 / s.at.as_secs_f64().max(1e-3),
            rtt_ms: s.rtt.map(|r| r.as_secs_f64() * 1e3),
            queue_ms: None,
            loss: 0.0,
            next: to,
            reason: Reason::Grow,
        });
        self.n = to;
        Some(Decision {
            streams: to,
            reason: Reason::Grow,
        })
    }

    fn min(&self) -> u32 {
        self.cfg.min_streams.max(1)
    }

    /// Rule 6's cap: wider once the link has carried enough that more
    /// connections paid on every such link measured.
    fn timeout_max(&self) -> u32 {
        if self.best_g.unwrap_or(0.0) >= TIMEOUT_WIDE_BPS {
            TIMEOUT_WIDE_MAX
        } else {
            TIMEOUT_MAX
        }
    }

    /// Whether a growth trial from the current count may start now.
    fn may_grow(&self) -> bool {
        let barred = match self.up_failed {
            Some((level, until)) => self.epochs < until && self.n.saturating_mul(2) >= level,
            None => false,
        };
        self.n < self.cap && !barred && !self.at_ceiling
    }

    /// Goodput `bps` is at the outside limit, if there is one.
    fn near_ceiling(&self, bps: f64) -> bool {
        self.cfg
            .ceiling_bps
            .is_some_and(|c| bps >= CEILING_SHARE * c)
    }

    /// Start a growth trial to `to` from the current count.
    fn trial_up(&mut self, to: u32, base: f64, probe: bool, why: Reason) -> (u32, Reason) {
        let to = to.min(self.cap).max(self.n + 1).min(self.cap);
        if self.at_ceiling {
            return self.steady(self.n, Reason::RateLimit);
        }
        if to <= self.n {
            return self.steady(self.n, Reason::NoGain);
        }
        self.phase = Phase::Up(Trial {
            from: self.n,
            to,
            base,
            epochs: 0,
            last: base,
            probe,
            clear: 0,
            clear_sum: 0.0,
            wait: MAX_WAIT,
            all: 0,
            all_sum: 0.0,
            prior: None,
            starved: self.starved,
        });
        self.room_epochs = 0;
        self.quiet_epochs = 0;
        (to, why)
    }

    /// Settle at `n`: steady from here.
    fn steady(&mut self, n: u32, why: Reason) -> (u32, Reason) {
        self.phase = Phase::Steady;
        self.room_epochs = 0;
        self.crowded_bits = 0;
        self.low_epochs = 0;
        (n, why)
    }

    /// Remember that growth to `to` did not pay: no trial that far for a
    /// while, longer after each failure.
    fn failed_up(&mut self, to: u32) {
        self.up_failed = Some((to, self.epochs + self.up_backoff));
        self.up_backoff = self.up_backoff.saturating_mul(2);
    }

    fn decide(&mut self, e: Judged) -> (u32, Reason) {
        self.epochs += 1;
        match self.phase {
            Phase::Start => self.on_start(e),
            Phase::Up(t) => self.on_up(t, e),
            Phase::Down(t) => self.on_down(t, e),
            Phase::Steady => self.on_steady(e),
        }
    }

    fn note_crowded(&mut self, e: Judged) {
        self.crowded_bits = (self.crowded_bits << 1) | u8::from(e.crowded && !e.ramping);
    }

    fn on_start(&mut self, mut e: Judged) -> (u32, Reason) {
        self.start_epochs += 1;
        // A held epoch's ramp happened within it: its later part is the
        // count's rate, the base for what comes next.
        if e.held {
            e.g = e.g.max(e.late);
        }
        // A start of many connections is a guess of the path's count
        // (cache::start_for_rtt); its first epoch is slow start, whose
        // goodput says nothing of what the count will carry (16 -> 32 on
        // the 0.1 % lossy link of docs/results.md was slower than staying
        // at 16). Any start waits while its goodput climbs.
        // So does a start whose first epoch lost heavily on a short path
        // (rule 9): BBR's startup on a shallow queue delivered twice its
        // later rate there (429 Mbit/s, then 205-214 at one connection),
        // and a trial judged against that surge read real gains as none.
        let first_blind =
            self.start_epochs == 1 && (self.n >= self.cfg.wait_first_from || e.own_loss);
        // Not where every connection ends the epoch held by its receiver's
        // window (a cap, as on DS3 or behind a fixed buffer): slow start
        // is over, as a connection in it is held by its own window. On a
        // 540 ms path with 26 KB windows the wait cost two epochs of 1.6 s.
        if (first_blind || e.ramping) && !e.held && self.start_epochs < MAX_WAIT {
            // Rule 7: on a long path, a clean ramp whose pipe would still
            // give twice as many connections a window each that fast
            // retransmit repairs (were the link full now) takes more
            // connections into the ramp: they climb alongside, where
            // growth after the ramp would cost epochs of seconds each.
            // Its second epoch does so again only on a pipe four times
            // as wide (never on a satellite hop's few hundred segments).
            let long = self.path_rtt().is_some_and(|f| f >= LONG_RTT);
            let to = self.n.saturating_mul(2);
            let share = if self.start_epochs == 1 {
                SHED_SHARE
            } else {
                CROWD_SHARE
            };
            if long
                && self.start_epochs <= 2
                && e.clean
                && !e.queue_now
                && !e.little_left
                && self.may_grow()
                && e.pipe / f64::from(to) >= share
            {
                return (to.min(self.cap), Reason::Grow);
            }
            return (self.n, Reason::SlowStart);
        }
        self.settled = Some(e.g);
        if e.little_left {
            return self.steady(self.n, Reason::TooLittleLeft);
        }
        // Rule 6 from the start: fourfold (one connection to four), as
        // these transfers are short and every trial costs two epochs;
        // goodput judges it like any other.
        if e.timeout_bound && self.n < self.timeout_max() && self.may_grow() {
            let to = self.n.saturating_mul(4).min(self.timeout_max());
            return self.trial_up(to, e.g, false, Reason::Grow);
        }
        if e.heavy_loss {
            let r = self.steady(self.n, Reason::HeavyLoss);
            // Steady from here, but the start's crowding counts.
            self.note_crowded(e);
            return r;
        }
        // No step before to compare with: both queue signals must be clear
        // (a high start's first judged epoch is where BBR drains after its
        // startup).
        if e.queueing || e.queue_now {
            // The start has no step to judge the queue by; the first probe
            // comes after two quiet epochs instead of eight, and rule 8
            // tells there whether it was the bottleneck's.
            let r = self.steady(self.n, Reason::LinkFull);
            self.quiet_epochs = self.probe_every.saturating_sub(2);
            return r;
        }
        if !self.may_grow() || e.tiny {
            return self.steady(self.n, Reason::NoGain);
        }
        // Flat goodput with no queue and no loss beyond the path's own:
        // each connection is held by its window or its own losses, not by
        // the link, so many more can be added at once.
        // (Not where each connection holds only a few segments: a pipe
        // that small is full at once, and a step back costs the records
        // the retired connections hold.)
        // (Nor where every connection is held by its receiver's window at
        // the epoch's end: the RTT that showed no queue is from before.)
        let factor = if e.clean && !e.small && !e.held && self.cfg.fast_gain.is_finite() {
            4
        } else {
            2
        };
        self.trial_up(self.n.saturating_mul(factor), e.g, false, Reason::Grow)
    }

    fn on_up(&mut self, mut t: Trial, mut e: Judged) -> (u32, Reason) {
        t.epochs += 1;
        // The added connections carry data about two RTTs after the
        // decision, and an epoch is three: the trial's first epoch holds
        // a round trip of them at most. Where goodput climbs within it (no
        // queue, no heavy loss), its later part is what the new count
        // carries.
        // (Not for a probe, whose +25 % a sawtooth's upswing matches, nor
        // where they join early in the epoch, nor with a queue at its end,
        // which the new connections' slow start may be building.)
        if t.epochs == 1
            && !t.probe
            && e.late_join
            && e.ramping
            && !e.heavy_loss
            && !e.queueing
            && !e.queue_now
        {
            e.g = e.g.max(e.late);
        }
        let prev = t.last;
        t.last = e.g;
        self.phase = Phase::Up(t);
        let ratio = f64::from(t.to) / f64::from(t.from.max(1));
        // The share of the ideal gain: the added connections carrying as
        // much each as the others did.
        let share = |g: f64| {
            if t.base > 0.0 {
                (g / t.base - 1.0) / (ratio - 1.0)
            } else {
                f64::INFINITY
            }
        };
        let now = share(e.g);
        // Overflow: the step fills a small queue past what it holds (heavy
        // loss with a standing queue) and brings nothing. Back at once,
        // and stay below: waiting out the ramp here is the climb into the
        // collapse.
        // (Not where timeouts hold the link: there one epoch says little,
        // the new connections' first being their slow start, and the
        // trial is judged on two like any other.)
        if e.crowded && e.heavy_loss && e.g <= t.base && t.from < t.to && !e.timeout_bound {
            self.cap = self.cap.min(t.to - 1).max(self.min());
            self.failed_up(t.to);
            return self.steady(t.from, Reason::QueueOverflow);
        }
        if e.little_left {
            return self.steady(self.n, Reason::TooLittleLeft);
        }
        if now >= self.cfg.gain && now.is_finite() {
            self.settled = Some(e.g);
            // Rule 8: a queue that stood while the added connections
            // carried half their share or more is no bottleneck's, since a full link
            // would not have carried more. It is delay of the connections'
            // own: a window cap's last segment waits for the receiver's
            // delayed acknowledgement, 20-35 ms above a 380 ms floor with
            // the link at a few per cent. It stops counting as queue, so
            // growth goes on, and a real queue on top of it still shows.
            // Judged on the trial's second epoch (the first with a queue
            // waits: the count is kept either way), so that one epoch's
            // noise on a small step is not taken for a share.
            let own =
                e.queueing && !e.heavy_loss && !e.crowded && e.g <= t.base * ratio * SUPERLINEAR;
            if own && t.epochs < 2 {
                return (self.n, Reason::Trial);
            }
            if let (true, Some(q)) = (own, e.queue) {
                self.own_delay += q;
                if self.may_grow() {
                    return self.trial_up(self.n.saturating_mul(2), e.g, false, Reason::Grow);
                }
            }
            if e.queueing || e.heavy_loss || !self.may_grow() {
                // Kept; the link is full now (or growth is barred).
                let why = if e.heavy_loss {
                    Reason::HeavyLoss
                } else if e.queueing {
                    Reason::LinkFull
                } else {
                    Reason::NoGain
                };
                return self.steady(self.n, why);
            }
            // Near-linear scaling on a clean path says it is far from
            // full. A gain well beyond the step's ratio says only that the
            // level before was slow start: no evidence either way, so the
            // next step is a plain doubling.
            // Connections all held by their receivers' windows report no
            // RTT, so their epochs are never clean; a step that scaled
            // almost linearly with every connection still held says the
            // same, as a full link would have held the added ones back.
            let fast = !t.probe
                && (e.clean || (e.held && !e.queue_now))
                && now >= self.cfg.fast_gain
                && e.g <= t.base * ratio * SUPERLINEAR;
            let factor = if fast { 4 } else { 2 };
            let r = self.trial_up(self.n.saturating_mul(factor), e.g, false, Reason::Grow);
            if let (1, Phase::Up(next)) = (t.epochs, &mut self.phase) {
                next.prior = Some(t.base);
            }
            return r;
        }
        // Less than that: wait until the new connections have left slow
        // start, then judge on two epochs, so that noise does not undo a
        // real gain.
        let climbing = e.g > prev * RAMPING;
        if t.epochs < 2 || (climbing && t.epochs < MAX_WAIT) {
            return (self.n, Reason::Trial);
        }
        let mean = (e.g + prev) / 2.0;
        // From a count that had fallen well below the link's best, one
        // that carries that best again is kept, however high the level it
        // is judged against: that level (the count's settled rate) still
        // holds the decay's start, and on the 198 Mbit/s path of
        // `BUSY_SHARE` 16 carried 191 Mbit/s against a level of 175, was
        // undone, and 8 fell to 86 in the next epoch.
        let best = self.best_g.unwrap_or(0.0);
        if t.starved && mean >= REGAINED_SHARE * best {
            self.settled = Some(mean);
            return self.steady(self.n, Reason::NoGain);
        }
        // Kept on its gain, not on its share of the ideal: a step of
        // several times the count that fills the link reaches a small
        // share of an ideal no link holds.
        let gained = |g: f64| g / t.base.max(f64::MIN_POSITIVE) - 1.0;
        let step = (ratio - 1.0).min(1.0);
        if gained(mean) >= self.cfg.keep_gain * step && !t.probe {
            // Kept, but no further growth from here for a while: the step
            // brought less than its share.
            self.settled = Some(mean);
            self.failed_up(self.n.saturating_mul(2));
            return self.steady(self.n, Reason::NoGain);
        }
        // Within the noise of a sawtooth: one more epoch before undoing.
        if gained(mean) >= (self.cfg.keep_gain - 0.15) * step && t.epochs < MAX_WAIT && !t.probe {
            return (self.n, Reason::Trial);
        }
        // The level before was one epoch, the first of a step that grew on
        // at once: new BBR connections' startup lifts goodput for an epoch
        // on a shallow queue (2 connections: 452-482 Mbit/s, then
        // 306-365), and against it 4 read as no gain. Going back rests on
        // that epoch alone; a count well above the level measured before
        // it is kept.
        if let Some(p) = t.prior.filter(|_| !t.probe) {
            if gained(mean) < 0.0 && mean >= p * (1.0 + self.cfg.keep_gain) {
                self.settled = Some(mean);
                self.failed_up(self.n.saturating_mul(2));
                return self.steady(self.n, Reason::NoGain);
            }
        }
        // Rule 14: a doubling that carries at least what the count before
        // it did, without crowding the queue, is kept once: going back
        // costs more than staying. The retired connections' records wait
        // for them, and on a loss-based path the survivors' windows sit
        // at their share of the larger count (CUBIC holds near the window
        // of its last loss for seconds), so the smaller count carries
        // less than it did before the trial. Once only, so that an even
        // path does not ratchet up to the cap: later even trials go back.
        // Not under 10 ms, where windows are a few segments and regrow in
        // a few milliseconds: there the short BBR paths on which one
        // connection carries as much as any count kept 4 for nothing.
        let even = gained(mean) >= 0.0 && !e.crowded;
        if even && !t.probe && !self.kept_even && self.path_rtt().is_some_and(|r| r >= EVEN_RTT) {
            self.kept_even = true;
            self.settled = Some(mean);
            self.failed_up(self.n.saturating_mul(2));
            return self.steady(self.n, Reason::KeptEven);
        }
        // A probe asks whether more connections help; if not, go back, or
        // every probe would ratchet the count up to the cap over a long
        // transfer.
        self.settled = Some(t.base.max(mean));
        if t.probe {
            self.probe_every = self.probe_every.saturating_mul(2);
        } else {
            self.failed_up(t.to);
        }
        self.steady(t.from, Reason::Undo)
    }

    fn on_down(&mut self, mut t: Trial, e: Judged) -> (u32, Reason) {
        t.epochs += 1;
        t.last = e.g;
        // The retired connections first finish the records they hold (a
        // record takes a slow connection a second or more): the count is
        // judged once the crowding has cleared, or after the time such a
        // record takes, on every epoch but the first.
        if t.epochs > 1 {
            t.all += 1;
            t.all_sum += e.g;
            if !e.crowded {
                t.clear += 1;
                t.clear_sum += e.g;
            }
        }
        self.phase = Phase::Down(t);
        let tol = self.cfg.shed_tolerance;
        // The last clear epoch counts on its own too: the one before may
        // still have carried a retired connection's last records.
        let verdict = (t.clear >= 2).then(|| {
            let mean = (t.clear_sum / f64::from(t.clear)).max(e.g);
            (mean >= t.base * (1.0 - tol), mean)
        });
        // Still crowded after the wait: the smaller count is kept unless
        // goodput clearly fell, as fewer connections cost the path less.
        let verdict = verdict.or_else(|| {
            (t.epochs >= t.wait && t.all > 0).then(|| {
                let mean = t.all_sum / f64::from(t.all);
                (mean >= t.base * (1.0 - 2.0 * tol), mean)
            })
        });
        match verdict {
            None => (self.n, Reason::Trial),
            Some((true, mean)) => {
                // Fewer connections, the same goodput: keep them, and do
                // not grow back to where the queue was crowded for a
                // while.
                self.settled = Some(mean);
                self.failed_up(t.from);
                self.steady(self.n, Reason::NoGain)
            }
            Some((false, _)) => {
                self.shed_failed = Some(t.from);
                self.settled = Some(t.base);
                if e.little_left {
                    return self.steady(self.n, Reason::TooLittleLeft);
                }
                // From 8 or more, halfway back (twice the smaller count),
                // not into the crowding: the clear epochs that judged the
                // smaller count are often those in which its connections
                // sat in timeouts (nothing sent, so nothing lost) after
                // the crowded ones, and back at the crowded count the end
                // of the file waits on connections in backed-off timeouts
                // (docs/tuning.md, rule 3). Growth back there is barred
                // for a while.
                let mid = t.to.saturating_mul(2);
                if t.from >= 8 && mid < t.from {
                    self.failed_up(t.from);
                    return self.steady(mid, Reason::Undo);
                }
                self.steady(t.from, Reason::Undo)
            }
        }
    }

    fn on_steady(&mut self, e: Judged) -> (u32, Reason) {
        let settled = *self.settled.get_or_insert(e.g);
        let low = e.g < settled * 0.6;
        self.settled = Some(0.75 * settled + 0.25 * e.g);
        let veto = if e.heavy_loss {
            Some(Reason::HeavyLoss)
        } else {
            None
        };
        self.low_epochs = if low && veto.is_none() && !e.queueing {
            self.low_epochs + 1
        } else {
            0
        };
        self.room_epochs = if e.queueing || e.queue_now || e.ramping {
            0
        } else {
            self.room_epochs + 1
        };
        self.note_crowded(e);
        self.quiet_epochs += 1;
        if e.little_left {
            return (self.n, Reason::TooLittleLeft);
        }
        // A standing queue with loss well above the path's own, for two
        // epochs: the connections crowd a small queue. Fewer may carry as
        // much (a start above the collapse point is shed this way).
        // Two of the last three epochs, this one included: a sawtooth's
        // loss comes and goes from epoch to epoch.
        // Not where timeouts hold the link: fewer connections there leave
        // it idle through each one's timeouts (docs/tuning.md).
        let crowded =
            e.crowded && !e.timeout_bound && (self.crowded_bits & 0b111).count_ones() >= 2;
        if crowded && self.n > self.min() && self.shed_failed != Some(self.n) {
            // Half as many, or fewer: as many as the pipe (what is in
            // flight now) holds at a few segments each.
            let fit = (e.pipe / SHED_SHARE).max(1.0) as u32;
            let to = pow2_floor(fit).min(self.n / 2).max(self.min());
            // The level to hold: this epoch and the one before.
            let base = self.last_g.map_or(e.g, |l| (l + e.g) / 2.0);
            // A retired connection first sends the record it holds, which
            // at this count's rate a connection takes this long.
            let per_conn = base / f64::from(self.n);
            let drain = if per_conn > 0.0 {
                RECORD_BITS / per_conn / self.epoch_len().as_secs_f64()
            } else {
                f64::from(MAX_WAIT)
            };
            let wait = (drain.ceil() as u32 + 2).clamp(MAX_WAIT, 6 * MAX_WAIT);
            self.phase = Phase::Down(Trial {
                from: self.n,
                to,
                base,
                epochs: 0,
                last: e.g,
                probe: false,
                clear: 0,
                clear_sum: 0.0,
                wait,
                all: 0,
                all_sum: 0.0,
                prior: None,
                starved: false,
            });
            self.crowded_bits = 0;
            self.room_epochs = 0;
            return (to, Reason::Shed);
        }
        if self.low_epochs >= 2 && self.n < self.cap {
            self.low_epochs = 0;
            return self.trial_up(self.n.saturating_mul(2), e.g, false, Reason::Degraded);
        }
        // Timeouts, not the queue, hold the link: try more connections
        // whatever the loss, as the goodput of the trial decides.
        let level = self.last_g.map_or(e.g, |l| (l + e.g) / 2.0).max(settled);
        if e.timeout_bound
            && self.n < self.timeout_max()
            && self.quiet_epochs >= 2
            && self.may_grow()
        {
            let to = self.n.saturating_mul(2).min(self.timeout_max());
            return self.trial_up(to, level, false, Reason::Grow);
        }
        if let Some(why) = veto {
            return (self.n, why);
        }
        // No standing queue for two epochs: the bottleneck idles now and
        // then, each connection held by its window or its own losses
        // (Mathis); more connections should help.
        // Judged against the level the count has held, not this epoch's
        // alone: after a loss event that cut every window the bottleneck
        // idles for a while, and a trial measured from that dip reads the
        // recovery as gain.
        let tiny = e.tiny;
        if self.room_epochs >= 2 && self.may_grow() && !tiny {
            return self.trial_up(self.n.saturating_mul(2), level, false, Reason::Grow);
        }
        if self.quiet_epochs >= self.probe_every && self.may_grow() && !e.heavy_queue && !tiny {
            let step = (self.n / 4).max(1);
            return self.trial_up(self.n + step, level, true, Reason::Probe);
        }
        let why = if e.queueing {
            Reason::LinkFull
        } else {
            Reason::NoGain
        };
        (self.n, why)
    }
}
/// The largest power of two not above `n` (1 for 0).
fn pow2_floor(n: u32) -> u32 {
    if n <= 1 {
        1
    } else {
        1 << (31 - n.leading_zeros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{run, Cc, PathSpec, Policy, FIXED};

    /// A controller from `start` on `p` for `secs` of an endless
    /// transfer: the controller and the payload rate it got.
    fn auto(p: &PathSpec, c: Controller, secs: f64, seed: u64) -> (Controller, f64) {
        let mut c = c;
        let r = run(p, Policy::Auto(&mut c), None, secs, seed);
        (c, r.bytes * 8.0 / secs)
    }

    /// The best fixed count's payload rate over `secs` (of FIXED).
    fn best_fixed(p: &PathSpec, secs: f64, seed: u64) -> (u32, f64) {
        FIXED
            .iter()
            .map(|&n| {
                (
                    n,
                    run(p, Policy::Fixed(n), None, secs, seed).bytes * 8.0 / secs,
                )
            })
            .fold((0, 0.0), |b, x| if x.1 > b.1 { x } else { b })
    }

    fn most(c: &Controller) -> u32 {
        c.history()
            .iter()
            .map(|s| s.streams.max(s.next))
            .max()
            .unwrap_or(c.streams())
    }

    #[test]
    fn a_stall_of_the_path_is_not_read_as_crowding() {
        // Eight connections steady at 80 Mbit/s on a 80 ms path, then the
        // path stops for 5 s: nothing delivered, only timeouts'
        // retransmissions sent (every segment sent a retransmission),
        // the RTT unchanged. Then it comes back.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 10, 80e6, 0.0, 80);
        let before = c.streams();
        for _ in 0..100 {
            f.0 += 50;
            f.2 += 2.0;
            f.3 += 2.0;
            c.on_sample(Sample {
                at: Duration::from_millis(f.0),
                bytes: f.1 as u64,
                rtt: Some(Duration::from_millis(80)),
                retrans: f.3 as u64,
                segs_out: f.2 as u64,
                remaining: None,
                heard: false,
            });
        }
        assert_eq!(c.streams(), before, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Stalled), "{:?}", c.history());
        // Afterwards the count is judged as before the stall: never
        // below the steady 8.
        feed(&mut c, &mut f, 6, 80e6, 0.0, 80);
        assert!(c.history().iter().all(|s| s.next >= 8), "{:?}", c.history());
    }

    #[test]
    fn the_epoch_after_a_stall_is_not_judged() {
        // A start climbing at 8 connections, then 70 s of nothing, then
        // the drain: goodput far above the start's, RTT samples of the
        // stall's length. No growth on that.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 1, 4e6, 0.0, 80);
        feed(&mut c, &mut f, 1, 8e6, 0.0, 80);
        let n = c.streams();
        for _ in 0..1400 {
            f.0 += 50;
            c.on_sample(Sample {
                at: Duration::from_millis(f.0),
                bytes: f.1 as u64,
                rtt: None,
                retrans: f.3 as u64,
                segs_out: f.2 as u64,
                remaining: Some(50_000_000),
                heard: false,
            });
        }
        assert_eq!(c.streams(), n, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 30e6, 0.0, 70_000);
        assert_eq!(c.streams(), n, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Stalled), "{:?}", c.history());
    }

    #[test]
    fn data_that_stays_stalled_after_the_peer_answers_again_gets_one_more_connection() {
        // Steady connections; the path stops for 5 s (no word from
        // the peer), then answers again while the data connections still
        // wait out their blown-up timeouts.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 10, 80e6, 0.0, 80);
        let n = c.streams();
        let quiet = |c: &mut Controller, f: &mut Fed, ms: u64, heard| {
            let mut d = None;
            for _ in 0..ms / 50 {
                f.0 += 50;
                d = d.or(c.on_sample(Sample {
                    at: Duration::from_millis(f.0),
                    bytes: f.1 as u64,
                    rtt: Some(Duration::from_millis(80)),
                    retrans: f.3 as u64,
                    segs_out: f.2 as u64,
                    remaining: Some(50_000_000),
                    heard,
                }));
            }
            d
        };
        assert_eq!(
            quiet(&mut c, &mut f, 5000, false),
            None,
            "{:?}",
            c.history()
        );
        // Heard again: under 2 s (8 RTTs are 640 ms) nothing changes.
        assert_eq!(quiet(&mut c, &mut f, 1700, true), None, "{:?}", c.history());
        assert_eq!(c.streams(), n);
        let d = quiet(&mut c, &mut f, 600, true);
        assert_eq!(
            d,
            Some(Decision {
                streams: n + 1,
                reason: Reason::Rescue
            }),
            "{:?}",
            c.history()
        );
        // One per stall: the same stall going on adds no more.
        assert_eq!(
            quiet(&mut c, &mut f, 10_000, true),
            None,
            "{:?}",
            c.history()
        );
        assert_eq!(c.streams(), n + 1);
        // Data moves again, then a second stall gets its own rescue.
        feed(&mut c, &mut f, 4, 80e6, 0.0, 80);
        quiet(&mut c, &mut f, 1000, false);
        let d = quiet(&mut c, &mut f, 3000, true);
        assert_eq!(
            d.map(|d| d.reason),
            Some(Reason::Rescue),
            "{:?}",
            c.history()
        );
    }

    #[test]
    fn goodput_at_an_outside_limit_starts_no_growth() {
        // Flat goodput, no queue, no loss: without a limit the start grows
        // (each connection held by its window); at a limit of 16 Mbit/s
        // the same epochs are the limit's, and the count stays.
        let flat = |ceiling: Option<f64>| {
            let cfg = TuneConfig {
                ceiling_bps: ceiling,
                ..TuneConfig::default()
            };
            let (mut c, mut f) = started(Controller::new(cfg, 4));
            feed(&mut c, &mut f, 12, 16e6, 0.0, 100);
            c
        };
        assert!(most(&flat(None)) > 4, "{:?}", flat(None).history());
        let held = flat(Some(16.5e6));
        assert_eq!(most(&held), 4, "{:?}", held.history());
        assert_eq!(last(&held), Some(Reason::RateLimit), "{:?}", held.history());
        // Once reached, epochs under it (a slow reader, a sawtooth) start
        // no growth either: a probe after one added two under a limit.
        let cfg = TuneConfig {
            ceiling_bps: Some(16.5e6),
            ..TuneConfig::default()
        };
        let (mut c, mut f) = started(Controller::new(cfg, 4));
        feed(&mut c, &mut f, 4, 16e6, 0.0, 100);
        feed(&mut c, &mut f, 40, 11e6, 0.0, 100);
        assert_eq!(most(&c), 4, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::RateLimit), "{:?}", c.history());
        // A limit the path does not reach bars nothing.
        let high = flat(Some(100e6));
        assert!(most(&high) > 4, "{:?}", high.history());
    }

    #[test]
    fn window_limited_long_path_grows_to_fill_it() {
        // 100 Mbit/s, 100 ms, 64 KiB windows: one connection gets ~5
        // Mbit/s, the link needs about 20.
        let p = PathSpec::new(100e6, 100.0, 1e6, 0.0, Some(65535.0), Cc::Reno);
        let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), 2), 30.0, 1);
        assert!(c.streams() >= 16, "{:?}", c.history());
        assert!(bps > 0.85 * p.payload_bps(), "{bps}");
    }

    #[test]
    fn near_linear_growth_with_no_queue_quadruples() {
        // A clean path (an RTT at its floor, no loss) whose goodput is flat
        // at 4 connections: each is held by its own window or loss
        // recovery, not by the link. A clean start quadruples, and so does
        // a step that scaled almost linearly; with `fast_gain` off,
        // doubling alone is a step behind.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 30e6, 0.0, 100);
        assert_eq!(c.streams(), 64, "{:?}", c.history());
        let doubling = TuneConfig {
            fast_gain: f64::INFINITY,
            ..TuneConfig::default()
        };
        let (mut c, mut f) = started(Controller::new(doubling, 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 15e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "doubling alone: {:?}", c.history());
        // DS3-class: 45 Mbit/s, 200 ms, 64 KiB windows: one connection
        // gets 2.6 Mbit/s, the link needs about 17. Its connections are
        // held by their windows (no RTT reported): growth doubles, and
        // fills the link.
        let p = PathSpec::new(45e6, 200.0, 1.5e6, 0.0, Some(65535.0), Cc::Reno);
        let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), 2), 30.0, 1);
        assert!(c.streams() >= 16, "{:?}", c.history());
        assert!(bps > 0.85 * p.payload_bps(), "{bps}");
    }

    #[test]
    fn random_loss_with_room_in_the_queue_grows() {
        // Issue 16: a few hundred Mbit/s, tens of ms, a few losses in
        // 10 000, cubic, a queue with room. Each connection is capped by
        // its own loss recovery (Mathis: ~17 Mbit/s at 60 ms), the queue
        // stays empty; a start of 8 stayed at 8 (`link_full` on the slow
        // start's queue, then `no_gain`) at 0.7 of the link where 16-64
        // fixed connections reached 0.85-0.89.
        let p = PathSpec::new(300e6, 60.0, 2.25e6, 0.0003, None, Cc::Cubic);
        let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), 8), 15.0, 3);
        let (best, best_bps) = best_fixed(&p, 15.0, 3);
        assert!(c.streams() > 8, "{:?}", c.history());
        assert!(bps > 0.9 * best_bps, "{bps} against {best_bps} at {best}");
        assert!(bps > 0.8 * p.payload_bps(), "{bps}");
    }

    #[test]
    fn a_queue_with_goodput_well_below_the_best_does_not_bar_growth() {
        // A standing queue is a busy bottleneck's, and a busy bottleneck
        // delivers its rate. On an emulated lossy 198 Mbit/s, 64 ms path,
        // cubic connections decayed from 190 Mbit/s to 70 at 8 (each held
        // by its own losses) while their smallest RTT stood a few ms above
        // the floor; `link_full` kept 8 to the end where 32 carried 190.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 1, 40e6, 0.0005, 64);
        feed(&mut c, &mut f, 6, 190e6, 0.0005, 84);
        assert_eq!(c.streams(), 8, "a full link: {:?}", c.history());
        // The queue is still read (6 ms over a 3.2 ms threshold); goodput
        // falls.
        for g in [130e6, 125e6, 120e6, 110e6, 100e6, 90e6] {
            feed(&mut c, &mut f, 1, g, 0.0005, 70);
            if c.streams() > 8 {
                break;
            }
        }
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        // The step carries nearly the best again: kept, though against
        // the count's settled level (still near the decay's start) it
        // gained under a tenth.
        feed(&mut c, &mut f, 4, 178e6, 0.0005, 70);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert!(
            c.history()
                .iter()
                .all(|s| s.streams != 16 || s.reason != Reason::Undo),
            "{:?}",
            c.history()
        );
        // Where goodput holds with the queue, the link is full: no growth.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 1, 40e6, 0.0005, 64);
        feed(&mut c, &mut f, 6, 190e6, 0.0005, 84);
        feed(&mut c, &mut f, 6, 180e6, 0.0005, 70);
        assert!(c.streams() <= 10, "{:?}", c.history());
    }

    #[test]
    fn random_loss_is_not_mistaken_for_overflow() {
        // The 0.1 % lossy profile of docs/results.md with the client's
        // start (16 at 100 ms): loss with no standing queue means more
        // connections, not fewer.
        for cc in [Cc::Cubic, Cc::Reno] {
            let p = PathSpec::new(200e6, 100.0, 1.5e6, 0.001, None, cc);
            let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), 16), 20.0, 2);
            let (_, best_bps) = best_fixed(&p, 20.0, 2);
            assert!(c.streams() >= 32, "{cc:?}: {:?}", c.history());
            assert!(bps > 0.85 * best_bps, "{cc:?}: {bps} against {best_bps}");
            assert!(
                c.history()
                    .iter()
                    .all(|s| s.reason != Reason::Shed && s.reason != Reason::QueueOverflow),
                "{cc:?}: {:?}",
                c.history()
            );
        }
    }

    #[test]
    fn random_loss_with_a_standing_queue_is_not_overflow() {
        // 0.3 % random loss caps each connection (Mathis) at ~2.6 Mbit/s;
        // three fill the 8 Mbit/s link and from four on a queue stands.
        // Loss is the same at every N: no reason to shed connections.
        let p = PathSpec::new(8e6, 100.0, 5e5, 0.003, Some(1e6), Cc::Reno);
        let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), 2), 60.0, 4);
        let (_, best_bps) = best_fixed(&p, 60.0, 4);
        assert!(c.streams() >= 2, "{:?}", c.history());
        assert!(bps > 0.9 * best_bps, "{bps} against {best_bps}");
    }

    #[test]
    fn short_clean_path_stays_small() {
        // The acceptance profiles' short path: one connection fills it.
        let p = PathSpec::new(1e9, 1.0, 6e6, 0.0, None, Cc::Reno);
        let (c, _) = auto(&p, Controller::new(TuneConfig::default(), 1), 20.0, 1);
        assert!(c.streams() <= 2 && most(&c) <= 2, "{:?}", c.history());
    }

    #[test]
    fn a_small_queue_does_not_climb_into_the_collapse() {
        // satellite-x10 (Reno, 24 KiB windows, 8-packet queue): 4-16
        // connections fill it, 32 collapse. Whatever the start, auto stays
        // out of the collapse and near the best fixed count.
        let p = PathSpec::new(15.36e6, 56.0, 12000.0, 0.0, Some(24576.0), Cc::Reno);
        let (_, best_bps) = best_fixed(&p, 30.0, 5);
        for start in [2, 4, 8] {
            let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), start), 30.0, 5);
            assert!(
                most(&c) <= 16 && c.streams() <= 16,
                "from {start}: {:?}",
                c.history()
            );
            assert!(
                bps > 0.9 * best_bps,
                "from {start}: {bps} against {best_bps}"
            );
        }
        // The T1 satellite itself: 560 ms, same windows and queue, from
        // the start a fresh transfer takes there (cache::start_for_rtt)
        // and from half of it.
        let p = PathSpec::new(1.536e6, 560.0, 12000.0, 0.0, Some(24576.0), Cc::Reno);
        let (_, best_bps) = best_fixed(&p, 60.0, 5);
        for start in [8, 16] {
            let (c, bps) = auto(&p, Controller::new(TuneConfig::default(), start), 60.0, 5);
            assert!(most(&c) <= 16, "from {start}: {:?}", c.history());
            assert!(
                bps > 0.9 * best_bps,
                "from {start}: {bps} against {best_bps}"
            );
        }
    }

    #[test]
    fn a_start_above_the_collapse_point_steps_down() {
        // satellite-x10 started (e.g. from a stale cache) at 32, where its
        // 8-packet queue collapses: 2.6 packets of the pipe a connection,
        // a quarter of the segments lost. Fewer carry more.
        let p = PathSpec::new(15.36e6, 56.0, 12000.0, 0.0, Some(24576.0), Cc::Reno);
        let (_, best_bps) = best_fixed(&p, 30.0, 6);
        for c in [
            Controller::new(TuneConfig::default(), 32),
            Controller::settled(TuneConfig::default(), 32),
        ] {
            let (c, bps) = auto(&p, c, 30.0, 6);
            assert!(c.streams() <= 16, "{:?}", c.history());
            assert!(
                c.history().iter().any(|s| s.reason == Reason::Shed),
                "{:?}",
                c.history()
            );
            assert!(bps > 0.8 * best_bps, "{bps} against {best_bps}");
        }
        // Without the step down it stays in the collapse.
        let fixed = run(&p, Policy::Fixed(32), None, 30.0, 6).bytes * 8.0 / 30.0;
        assert!(fixed < 0.8 * best_bps, "{fixed} against {best_bps}");
    }

    #[test]
    fn a_settled_start_holds_a_full_link() {
        // The cache's count on a link it fills (a deep queue stands): no
        // trial while the queue stands, whatever the slow start showed.
        let p = PathSpec::new(200e6, 50.0, 2.5e6, 0.0, None, Cc::Cubic);
        let (c, _) = auto(&p, Controller::settled(TuneConfig::default(), 8), 10.0, 1);
        assert_eq!(most(&c), 8, "{:?}", c.history());
        // Below the right count on a path with room, it grows.
        let p = PathSpec::new(200e6, 100.0, 1.5e6, 0.001, None, Cc::Cubic);
        let (c, _) = auto(&p, Controller::settled(TuneConfig::default(), 4), 10.0, 1);
        assert!(c.streams() > 4, "{:?}", c.history());
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
        feed_samples(c, f, samples, bps, loss, |i| Some(rtt_ms(i)), remaining);
    }

    /// [`feed_with`], the RTT optional (`None`: none reported).
    fn feed_samples(
        c: &mut Controller,
        f: &mut Fed,
        samples: u64,
        bps: f64,
        loss: f64,
        rtt_ms: impl Fn(u64) -> Option<u64>,
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
                rtt: rtt_ms(i).map(Duration::from_millis),
                retrans: f.3 as u64,
                segs_out: f.2 as u64,
                remaining,
                heard: true,
            });
        }
    }

    fn last(c: &Controller) -> Option<Reason> {
        c.history().last().map(|s| s.reason)
    }

    #[test]
    fn timeouts_on_a_short_path_do_not_bar_growth() {
        // 2 ms of RTT, under one segment in flight per connection, 40 %
        // of segments lost (a two-packet queue): each loss waits out a
        // timeout of a hundred round trips. Growth is tried at once, a
        // trial is not ended as an overflow on its first epoch, and the
        // crowding does not shed what goodput kept. From the start the
        // step is fourfold (up to 8): each trial costs two epochs of a
        // short transfer.
        let cfg = TuneConfig::default();
        let (mut c, mut f) = started(Controller::new(cfg.clone(), 1));
        feed(&mut c, &mut f, 1, 3e6, 0.4, 2);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        // The new connections' slow start: no gain in the first epoch.
        feed(&mut c, &mut f, 1, 3e6, 0.45, 2);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert_ne!(last(&c), Some(Reason::QueueOverflow));
        // Kept on its gain (heavy loss ends the trial), though under its
        // share: no growth for a while.
        feed(&mut c, &mut f, 4, 4.5e6, 0.45, 3);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        feed(&mut c, &mut f, 12, 6e6, 0.45, 3);
        assert!(c.streams() >= 4, "{:?}", c.history());
        // Goodput that keeps rising with the count: not past 8, where
        // such links collapse.
        for _ in 0..60 {
            let bps = 1.5e6 * f64::from(c.streams());
            feed(&mut c, &mut f, 1, bps, 0.45, 3);
        }
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert!(
            !c.history().iter().any(|s| s.reason == Reason::Shed),
            "{:?}",
            c.history()
        );
        // The same loss on a long path (the satellite's small queue) is
        // crowding: no growth from the start.
        let (mut c, mut f) = started(Controller::new(cfg, 1));
        feed_with(&mut c, &mut f, 40, 3e5, 0.4, |_| 560, None);
        assert_eq!(c.streams(), 1, "{:?}", c.history());
    }

    #[test]
    fn timeouts_on_a_fast_short_path_grow_past_eight() {
        // The same tiny pipe (2 ms, a segment or so per connection, 20 %
        // lost) on a link that carries more than 20 Mbit/s: on the
        // emulator 16 and 32 connections moved more than 8 there. Growth
        // goes on while goodput pays, up to 32.
        let cfg = TuneConfig::default();
        let (mut c, mut f) = started(Controller::new(cfg.clone(), 8));
        for _ in 0..80 {
            let bps = 3e6 * f64::from(c.streams());
            feed(&mut c, &mut f, 1, bps, 0.2, 2);
        }
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        // Where more connections carry less, goodput undoes the trial.
        let (mut c, mut f) = started(Controller::new(cfg, 8));
        for _ in 0..80 {
            let bps = if c.streams() > 8 { 30e6 } else { 40e6 };
            feed(&mut c, &mut f, 1, bps, 0.2, 2);
        }
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert!(
            c.history().iter().any(|s| s.next > 8),
            "the trial was made: {:?}",
            c.history()
        );
    }

    #[test]
    fn no_rtt_is_no_clean_path() {
        // Goodput flat after the start's slow start, no loss, and no RTT
        // at all (every connection held by its receiver's window): growth
        // may be tried, but by doubling, not x4.
        // (The first epoch's RTT, 200 ms, sets the floor, as the
        // handshake's would; 16 connections of 40 segments each.)
        let mut c = Controller::new(TuneConfig::default(), 16);
        let mut bytes = 0u64;
        for i in 0..=80u64 {
            bytes += 250_000;
            c.on_sample(Sample {
                at: Duration::from_millis(50 * i),
                bytes,
                rtt: (i < 12).then_some(Duration::from_millis(200)),
                retrans: 0,
                segs_out: bytes / 1448,
                remaining: None,
                heard: true,
            });
            if c.streams() != 16 {
                break;
            }
        }
        assert_eq!(c.streams(), 32, "{:?}", c.history());
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
    fn a_trial_that_gains_nothing_goes_back_and_backs_off() {
        // A full link whose queue is too short to show: goodput is the
        // same at any count. The first doubling that carries as much is
        // kept (going back would cost more than staying); every later
        // trial finds no gain and returns to 16, and the trials come less
        // and less often.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 60, 100e6, 0.0, 50);
        let h = c.history();
        let trials = h.iter().filter(|s| s.next > s.streams).count();
        assert!((2..=4).contains(&trials), "{trials}: {h:?}");
        assert!(h.iter().any(|s| s.reason == Reason::Undo), "{h:?}");
        let kept = h.iter().filter(|s| s.reason == Reason::KeptEven).count();
        assert_eq!(kept, 1, "{h:?}");
        assert_eq!(c.streams(), 16, "{h:?}");
    }

    #[test]
    fn the_count_learned_is_not_one_stepped_down_from_as_crowded() {
        let step = |streams, mbps: f64, next, reason| Step {
            at_s: 0.0,
            streams,
            goodput_bps: mbps * 1e6,
            rtt_ms: None,
            queue_ms: None,
            loss: 0.0,
            next,
            reason,
        };
        // 16 shed to 8, 8 shed to 4, both kept: 4 is remembered, though
        // 16's epoch carried a hair more.
        let h = [
            step(16, 19.5, 16, Reason::LinkFull),
            step(16, 19.5, 8, Reason::Shed),
            step(8, 19.4, 8, Reason::Trial),
            step(8, 19.4, 4, Reason::Shed),
            step(4, 19.3, 4, Reason::Trial),
            step(4, 19.3, 4, Reason::NoGain),
        ];
        assert_eq!(learned_from(&h), Some(4));
        // A step down undone: the larger count was better, and stays.
        let h = [
            step(16, 30.0, 8, Reason::Shed),
            step(8, 20.0, 8, Reason::Trial),
            step(8, 20.0, 16, Reason::Undo),
            step(16, 29.0, 16, Reason::NoGain),
        ];
        assert_eq!(learned_from(&h), Some(16));
        // An overflow is never remembered.
        let h = [
            step(8, 20.0, 16, Reason::Grow),
            step(16, 21.0, 8, Reason::QueueOverflow),
            step(8, 20.5, 8, Reason::NoGain),
        ];
        assert_eq!(learned_from(&h), Some(8));
        assert_eq!(learned_from(&[]), None);
    }

    #[test]
    fn a_trial_that_gains_nothing_on_a_short_path_goes_back() {
        // The same under 10 ms: windows regrow within milliseconds, so
        // going back costs nothing and more connections would be for
        // nothing.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 60, 100e6, 0.0, 5);
        let h = c.history();
        assert!(h.iter().any(|s| s.reason == Reason::Undo), "{h:?}");
        assert!(h.iter().all(|s| s.reason != Reason::KeptEven), "{h:?}");
        assert_eq!(c.streams(), 8, "{h:?}");
    }

    #[test]
    fn a_trial_is_judged_over_two_epochs() {
        // A doubling whose first epoch after the join dips (the new
        // connections' slow start costs the old ones a loss) and whose
        // second gains: kept, not undone on the dip.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 40e6, 0.002, 50);
        let grown = c.streams();
        assert!(grown > 4, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 36e6, 0.004, 50);
        feed(&mut c, &mut f, 1, 58e6, 0.002, 50);
        feed(&mut c, &mut f, 1, 57e6, 0.002, 50);
        assert!(c.streams() >= grown, "{:?}", c.history());
        assert!(
            c.history().iter().all(|s| s.reason != Reason::Undo),
            "{:?}",
            c.history()
        );
    }

    #[test]
    fn heavy_loss_with_no_queue_on_a_short_path_is_the_paths_own() {
        // One BBR connection on a 740 Mbit/s, 2 ms path with a shallow
        // queue: 220 Mbit/s with a quarter of its segments lost, no queue
        // standing, about 38 segments in flight. More connections are
        // tried, and growth goes on while each step pays. The first
        // epoch, BBR's startup at twice the rate that follows, is waited
        // out: a trial judged against it would read 2 connections as no
        // gain.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 1));
        feed(&mut c, &mut f, 1, 430e6, 0.32, 2);
        assert_eq!(last(&c), Some(Reason::SlowStart));
        feed(&mut c, &mut f, 1, 220e6, 0.25, 2);
        assert_eq!(c.streams(), 2, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        feed(&mut c, &mut f, 2, 340e6, 0.27, 2);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        // 4 carry less than 2 did in their first epoch (a surge) but well
        // more than 1: kept, not undone on that one epoch.
        feed(&mut c, &mut f, 3, 320e6, 0.27, 2);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::NoGain));
        assert!(
            c.history()
                .iter()
                .all(|s| s.reason != Reason::HeavyLoss && s.reason != Reason::Undo),
            "{:?}",
            c.history()
        );
        // The same loss with a queue standing (6 ms against a 2 ms
        // floor): the link is full, the count is kept.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 1));
        feed(&mut c, &mut f, 1, 220e6, 0.25, 2);
        feed(&mut c, &mut f, 2, 220e6, 0.25, 6);
        assert_eq!(c.streams(), 1, "{:?}", c.history());
        // And on a long path, where a lost window waits out timeouts of
        // seconds, heavy loss still stops growth.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 2));
        feed(&mut c, &mut f, 3, 220e6, 0.25, 100);
        assert_eq!(c.streams(), 2, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::HeavyLoss));
    }

    #[test]
    fn heavy_loss_on_large_windows_is_no_crowding() {
        // 16 connections of about 100 segments each (180 Mbit/s, 100 ms),
        // no standing queue, 3 % of segments lost in every epoch (a slow
        // start's overshoot, a sawtooth's peaks): each repairs its losses
        // by fast retransmit, fewer would lose as much. No step down.
        // (On the emulator, 353 Mbit/s at 266 ms went from 16 to 8 this
        // way after its slow start and spent three seconds finding out.)
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 180e6, 0.0, 100);
        feed(&mut c, &mut f, 4, 180e6, 0.03, 100);
        assert!(c.streams() >= 16, "{:?}", c.history());
        assert!(
            c.history().iter().all(|s| s.reason != Reason::Shed),
            "{:?}",
            c.history()
        );
        // The same loss on windows of a few segments (the T1 satellite:
        // 1.5 Mbit/s at 560 ms, about 5 segments each): the connections
        // crowd a queue too short to show against the RTT. A step down.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 16));
        let epoch = 34; // samples of 50 ms in an epoch of three RTTs
        feed_with(&mut c, &mut f, epoch, 1.5e6, 0.0, |_| 560, None);
        feed_with(&mut c, &mut f, 3 * epoch, 1.5e6, 0.03, |_| 560, None);
        assert!(c.streams() < 16, "{:?}", c.history());
        assert!(
            c.history().iter().any(|s| s.reason == Reason::Shed),
            "{:?}",
            c.history()
        );
    }

    #[test]
    fn a_crowded_queue_at_steady_goodput_is_tried_with_fewer() {
        // A count that crowds a small queue: loss-based TCP keeps the
        // queue full and loses 3 % of its segments. Two such epochs try
        // half as many (a trial, not an outright halving); goodput holds,
        // so the smaller count is kept.
        // (One epoch at the floor, then a queue of 4 ms: the link is full.)
        let full = |c: &mut Controller, f: &mut Fed| {
            feed(c, f, 1, 13e6, 0.0, 56);
            feed(c, f, 2, 13e6, 0.0, 60);
        };
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        full(&mut c, &mut f);
        feed(&mut c, &mut f, 2, 13e6, 0.03, 62);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Shed));
        feed(&mut c, &mut f, 3, 13e6, 0.0, 60);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert!(c
            .history()
            .iter()
            .all(|s| s.reason != Reason::Undo && s.reason != Reason::QueueOverflow));
        // The same, but goodput falls with fewer: back to 8.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        full(&mut c, &mut f);
        feed(&mut c, &mut f, 2, 13e6, 0.03, 62);
        feed(&mut c, &mut f, 3, 8e6, 0.0, 60);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert!(
            c.history().iter().any(|s| s.reason == Reason::Undo),
            "{:?}",
            c.history()
        );
        // and no second step down from there.
        feed(&mut c, &mut f, 4, 13e6, 0.03, 62);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
    }

    #[test]
    fn a_failed_step_down_from_many_goes_back_halfway() {
        // 16 connections on a 2.4 Mbit/s, 100 ms path with a queue of 8
        // packets: the link full and a third of the segments lost. The
        // step down goes to 2 (the pipe at 8 segments each); once the
        // retired connections have drained, the two sit in timeouts for
        // a while (nothing sent, nothing lost, little goodput). Going
        // back to 16 (emulated: 12.8-14.1 s where fixed 4 took 8.4 s)
        // returned to the crowding; halfway back, 4 (8.6-8.8 s).
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 2.3e6, 0.0, 100);
        feed(&mut c, &mut f, 2, 2.3e6, 0.3, 125);
        assert_eq!(last(&c), Some(Reason::Shed), "{:?}", c.history());
        assert_eq!(c.streams(), 2, "{:?}", c.history());
        feed(&mut c, &mut f, 2, 2.2e6, 0.2, 125);
        feed(&mut c, &mut f, 2, 1.0e6, 0.0, 100);
        assert_eq!(last(&c), Some(Reason::Undo), "{:?}", c.history());
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        // Not back to 16 while the link stays full at 4.
        feed(&mut c, &mut f, 12, 2.3e6, 0.0, 105);
        assert!(c.streams() < 16, "{:?}", c.history());
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
        // Two such epochs in a row: try fewer.
        feed(&mut c, &mut f, 2, 4.8e6, 0.023, 66);
        assert_eq!(c.streams(), 2, "{:?}", c.history());
    }

    #[test]
    fn a_step_that_overflows_goes_back_to_where_it_started() {
        // Satellite-x10 warm: 4 held from the cache; no queue shows, so a
        // trial doubles to 8, which overflows the 8-packet queue: heavy
        // loss with a standing queue and no more goodput. Back to 4 (not
        // half of 8, nor 2: fixed 2 runs at half the rate of 4), and no
        // growth to 8 again.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 3, 10e6, 0.0, 60);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        feed(&mut c, &mut f, 2, 9.5e6, 0.03, 66);
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert!(
            c.history()
                .iter()
                .any(|s| s.reason == Reason::QueueOverflow && s.next == 4),
            "{:?}",
            c.history()
        );
        feed(&mut c, &mut f, 40, 10e6, 0.0, 60);
        assert!(
            c.history().iter().rev().take(40).all(|s| s.next < 8),
            "{:?}",
            c.history()
        );
    }

    #[test]
    fn heavy_loss_stops_growth_before_the_queue_shows() {
        // Satellite-like at a tenth of the RTT: 8 packets of queue are
        // 6 ms against 56 ms, but the grown count loses 8 % of its
        // segments: no further growth while the loss lasts.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 1.7e6, 0.0, 56);
        let grown = c.streams();
        assert!(grown > 4, "{:?}", c.history());
        feed(&mut c, &mut f, 20, 3.9e6, 0.085, 57);
        assert!(most(&c) <= grown, "{:?}", c.history());
        assert!(
            c.history()
                .iter()
                .any(|s| s.reason == Reason::HeavyLoss || s.reason == Reason::Shed),
            "{:?}",
            c.history()
        );
        // The same gains without the loss: growth goes on.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 1.7e6, 0.0, 56);
        let grown = c.streams();
        feed(&mut c, &mut f, 1, 6.8e6, 0.0, 57);
        assert!(c.streams() > grown, "{:?}", c.history());
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

    /// Feed `samples` samples 50 ms apart at `bps`, no loss, the i-th
    /// with the RTT `rtt(i)` (`None`: every connection held by its
    /// receiver's window).
    fn feed_rtt(
        c: &mut Controller,
        f: &mut Fed,
        samples: u64,
        bps: f64,
        rtt: impl Fn(u64) -> Option<u64>,
    ) {
        feed_samples(c, f, samples, bps, 0.0, rtt, None);
    }

    #[test]
    fn a_start_held_by_its_windows_does_not_wait() {
        // 16 connections on a 200 ms path whose windows are capped: slow
        // start fills them within the first epoch, and by its end every
        // connection is held by its receiver (no RTT). No slow start left
        // to wait out: grow, by doubling (the RTT that showed no queue is
        // from before the windows filled).
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed_rtt(&mut c, &mut f, 4, 2e6, |_| Some(200));
        feed_rtt(&mut c, &mut f, 8, 6e6, |_| None);
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        // The same epoch with RTTs to its end is slow start: it waits.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed_rtt(&mut c, &mut f, 4, 2e6, |_| Some(200));
        feed_rtt(&mut c, &mut f, 8, 6e6, |_| Some(200));
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
    }

    #[test]
    fn a_held_step_that_scaled_linearly_grows_fourfold() {
        // 8 connections held by their windows (no RTT) double to 16, and
        // goodput doubles with them, every connection still held: a full
        // link would have held the added ones back, so the next step is
        // fourfold, as after a linear step on a clean path.
        let held = |second: f64| {
            let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
            feed_rtt(&mut c, &mut f, 4, 1e6, |_| Some(200));
            feed_rtt(&mut c, &mut f, 8, 3e6, |_| None);
            assert_eq!(c.streams(), 16, "{:?}", c.history());
            feed_rtt(&mut c, &mut f, 12, second, |_| None);
            c
        };
        let c = held(6e6);
        assert_eq!(c.streams(), 64, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        // Two thirds of the ideal: a doubling, as before.
        let c = held(5e6);
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        // A queue at the epoch's end (some connection no longer held, its
        // RTT above the floor): a doubling.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed_rtt(&mut c, &mut f, 4, 1e6, |_| Some(200));
        feed_rtt(&mut c, &mut f, 8, 3e6, |_| None);
        feed_rtt(&mut c, &mut f, 9, 6e6, |_| None);
        feed_rtt(&mut c, &mut f, 3, 6e6, |_| Some(260));
        assert!(c.streams() <= 32, "{:?}", c.history());
    }

    #[test]
    fn a_trials_first_epoch_is_judged_on_its_later_part() {
        // 4 -> 16 on a clean 100 ms path (epochs of 300 ms). The added
        // connections join two RTTs into the trial's first epoch: its
        // first half runs at the old rate, its second near the new one.
        // Taken whole (18 Mbit/s against 8) that is under half the ideal
        // gain and would wait two more epochs; its later part (28) is not.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        feed_rtt(&mut c, &mut f, 3, 8e6, |_| Some(100));
        feed_rtt(&mut c, &mut f, 3, 28e6, |_| Some(100));
        assert!(c.streams() > 16, "{:?}", c.history());
        // Flat within the epoch, the same mean waits.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 18e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Trial));
    }

    #[test]
    fn the_control_rtt_times_epochs_when_connections_report_none() {
        // Every connection held by its receiver's window from the first
        // sample: no RTT from them. The control connection's 500 ms makes
        // the epoch 1.5 s, not the 300 ms minimum, which is shorter than
        // the round trip new connections take to join.
        let mut c = Controller::new(TuneConfig::default(), 2);
        c.hint_rtt(Duration::from_millis(500));
        let (mut c, mut f) = started(c);
        feed_rtt(&mut c, &mut f, 60, 5e6, |_| None);
        let first = c.history().first().map(|s| s.at_s);
        assert!(first.is_some_and(|t| t >= 1.35), "{:?}", c.history());
        assert_eq!(c.rtt_floor(), None);
    }

    #[test]
    fn a_high_start_waits_out_its_slow_start() {
        // 16 connections on a 100 ms path: the first epoch is slow start (a
        // sixth of the rate to come, no queue yet). Growth judged on it
        // would double a count that was about right.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 30e6, 0.0, 100);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
        // Then BBR drains once: the epoch touches the floor, but ends with
        // half the floor of queue: the link is full at 16.
        feed_dip(&mut c, &mut f, 160e6, 100, 150);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::LinkFull));
        // Cubic's exit from slow start: 1.5 % lost with 23 ms of queue at
        // the link's rate. The link is full; halving would leave it half
        // used.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 32e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 186e6, 0.015, 123);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::HeavyLoss));
        // With no queue at the end either, the path has room: grow.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed(&mut c, &mut f, 1, 9e6, 0.0, 100);
        feed_dip(&mut c, &mut f, 40e6, 100, 102);
        assert!(c.streams() > 16, "{:?}", c.history());
        // A small start is judged on its first epoch when goodput has
        // stopped climbing within it: its count is no guess of the path's.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        assert!(c.streams() > 4, "{:?}", c.history());
        // but not while it climbs.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        for k in 0..6 {
            feed_with(&mut c, &mut f, 1, 1e6 * 2f64.powi(k), 0.0, |_| 100, None);
        }
        assert_eq!(c.streams(), 4, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
    }

    #[test]
    fn a_long_path_with_room_grows_during_its_slow_start() {
        // Rule 7: 8 connections on a 500 ms path, the first epoch (1.5 s)
        // in slow start with no queue and no loss, 40 then 80 Mbit/s: a
        // pipe of some 2600 segments, over 100 each at 16. Grow now.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed_with(&mut c, &mut f, 15, 40e6, 0.0, |_| 500, None);
        feed_with(&mut c, &mut f, 15, 80e6, 0.0, |_| 500, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        // The second epoch once more where the pipe would give twice the
        // count 32 segments each (some 6000 segments at 140 Mbit/s);
        // the rest of the ramp is waited out as before.
        feed_with(&mut c, &mut f, 15, 120e6, 0.0, |_| 500, None);
        feed_with(&mut c, &mut f, 15, 200e6, 0.0, |_| 500, None);
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        feed_with(&mut c, &mut f, 15, 300e6, 0.0, |_| 500, None);
        feed_with(&mut c, &mut f, 15, 400e6, 0.0, |_| 500, None);
        assert_eq!(c.streams(), 32, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
        // A pipe of a few hundred segments: the first doubling only.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed_with(&mut c, &mut f, 15, 4e6, 0.0, |_| 500, None);
        feed_with(&mut c, &mut f, 15, 8e6, 0.0, |_| 500, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        feed_with(&mut c, &mut f, 15, 12e6, 0.0, |_| 500, None);
        feed_with(&mut c, &mut f, 15, 16e6, 0.0, |_| 500, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
        // A narrow long path (a T1 satellite hop: 1.5 Mbit/s at 560 ms, a
        // pipe of 75 segments, a few each at 16): the same ramp keeps
        // the count.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed_with(&mut c, &mut f, 17, 0.5e6, 0.0, |_| 560, None);
        feed_with(&mut c, &mut f, 17, 1.2e6, 0.0, |_| 560, None);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::SlowStart));
        // Nor with a queue building, or losses beyond the threshold.
        for (loss, rtt) in [(0.0, 540), (0.01, 500)] {
            let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
            feed_with(&mut c, &mut f, 1, 40e6, 0.0, |_| 500, None);
            feed_with(&mut c, &mut f, 14, 40e6, loss, |_| rtt, None);
            feed_with(&mut c, &mut f, 15, 80e6, loss, |_| rtt, None);
            assert_eq!(c.streams(), 8, "{loss} {rtt}: {:?}", c.history());
        }
        // A path under 200 ms waits out its ramp whatever its pipe
        // (a_high_start_waits_out_its_slow_start).
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed_with(&mut c, &mut f, 3, 400e6, 0.0, |_| 100, None);
        feed_with(&mut c, &mut f, 3, 800e6, 0.0, |_| 100, None);
        assert_eq!(c.streams(), 8, "{:?}", c.history());
    }

    #[test]
    fn a_long_paths_first_flights_with_room_quadruple_the_start() {
        // Rule 11: 16 connections on a 400 ms path; their first flights
        // (16 × 10 segments, 232 KB) come back at the handshake's RTT with
        // nothing retransmitted, within the first epoch (1.2 s).
        let start = |rtt_ms: u64| {
            let mut c = Controller::new(TuneConfig::default(), 16);
            c.hint_rtt(Duration::from_millis(rtt_ms));
            started(c)
        };
        let (mut c, mut f) = start(400);
        feed_with(&mut c, &mut f, 7, 4e6, 0.0, |_| 420, None);
        assert_eq!(c.streams(), 16, "not before the flights are in");
        feed_with(&mut c, &mut f, 1, 4e6, 0.0, |_| 420, None);
        assert_eq!(c.streams(), 64, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        // Once: the rest of the ramp is the start's, as before.
        feed_with(&mut c, &mut f, 10, 40e6, 0.0, |_| 420, None);
        assert_eq!(c.streams(), 64, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::Grow));
        // Not where the flights met a queue (a narrow link's), lost a
        // segment, the path is under 300 ms, the count is at its cap, or
        // the rest of the file would not give each added connection a
        // record.
        let (mut c, mut f) = start(400);
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 460, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        let (mut c, mut f) = start(400);
        feed_with(&mut c, &mut f, 12, 4e6, 0.01, |_| 420, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        let (mut c, mut f) = start(250);
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 260, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        let (mut c, mut f) = start(400);
        c.limit(16);
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 420, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        let (mut c, mut f) = start(400);
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 420, Some(4 << 20));
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        // Nor where the flights' RTT is far below the handshake's: that
        // handshake was held by a stall (13 s read on an 80 ms path).
        let (mut c, mut f) = start(8000);
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 80, None);
        assert!(most(&c) <= 32, "no fourfold: {:?}", c.history());
        // And with no handshake RTT to read the flights' against.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 16));
        feed_with(&mut c, &mut f, 12, 4e6, 0.0, |_| 420, None);
        assert_eq!(c.streams(), 16, "{:?}", c.history());
        // Nor where the data connections report no segments (a server
        // without counts: the RTT is the control connection's).
        let (mut c, _) = start(400);
        for i in 1..12u64 {
            c.on_sample(Sample {
                at: Duration::from_millis(50 * i),
                bytes: 25_000 * i,
                rtt: Some(Duration::from_millis(400)),
                ..Sample::default()
            });
        }
        assert_eq!(c.streams(), 16, "{:?}", c.history());
    }

    #[test]
    fn a_queue_that_growth_goes_through_is_no_bottleneck() {
        // Rule 8: window-capped connections on a 380 ms path whose link is
        // nearly idle, their RTT 30 ms above the floor all along (delayed
        // acknowledgements of each window's last segment). Each
        // connection carries 0.3 Mbit/s whatever the count.
        let run = |per_conn: bool| {
            let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
            feed_with(&mut c, &mut f, 23, 2.0e6, 0.0, |_| 380, None);
            for _ in 0..24 {
                let bps = if per_conn {
                    0.3e6 * f64::from(c.streams())
                } else {
                    2.4e6
                };
                feed_with(&mut c, &mut f, 23, bps, 0.0, |_| 410, None);
            }
            c
        };
        // The start reads the queue as a full link, probes it two epochs
        // later, and the probe's gain says it is not: growth goes on.
        let c = run(true);
        assert_eq!(c.history()[1].reason, Reason::LinkFull, "{:?}", c.history());
        assert!(c.streams() >= 32, "{:?}", c.history());
        // A link that is full at 8: the probe gains nothing and goes back.
        let c = run(false);
        assert!(
            c.history().iter().all(|s| s.next <= 10),
            "{:?}",
            c.history()
        );
        assert_eq!(c.streams(), 8, "{:?}", c.history());
    }

    #[test]
    fn a_standing_queue_while_growing_stops_growth() {
        // The fresh lossy start: 4 connections, then a step with ten
        // times the goodput and 10 ms of queue standing all epoch on a
        // 100 ms path: the link is full, keep the count.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        let grown = c.streams();
        assert!(grown > 4, "{:?}", c.history());
        feed(&mut c, &mut f, 1, 80e6, 0.0, 110);
        assert_eq!(c.streams(), grown, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::LinkFull));
        // The same gain with no queue grows, but by a doubling only: ten
        // times the goodput for four times the connections is slow start
        // ending, no sign of linear scaling.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 8e6, 0.0, 100);
        feed(&mut c, &mut f, 1, 80e6, 0.0, 100);
        assert_eq!(c.streams(), 2 * grown, "{:?}", c.history());
    }

    #[test]
    fn a_start_that_loses_a_third_of_its_segments_does_not_grow() {
        // The satellite start: 8 connections in slow start into an
        // 8-packet queue lost 31 % of their segments. That first epoch is
        // also the lowest loss rate seen so far; it must not excuse itself.
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 12, 0.2e6, 0.31, 569);
        assert!(most(&c) <= 8, "{:?}", c.history());
        assert!(
            c.history().iter().any(|s| s.reason == Reason::HeavyLoss),
            "{:?}",
            c.history()
        );
        // Random loss of a few per cent (fig12's bit errors: 5.8 % of
        // packets) still lets a path grow: there more connections help.
        // (Each connection at Mathis' rate for 5.8 %: 1 Mbit/s at 56 ms.)
        let (mut c, mut f) = started(Controller::new(TuneConfig::default(), 4));
        feed(&mut c, &mut f, 1, 4.0e6, 0.058, 56);
        assert!(c.streams() > 4, "{:?}", c.history());
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
        assert_eq!(last(&c), Some(Reason::TooLittleLeft));
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
        assert!(most(&c) <= 16, "{:?}", c.history());
        // Nothing delivered at all: a stall, not judged.
        assert_eq!(last(&c), Some(Reason::Stalled), "{:?}", c.history());
        // A trickle still delivered: judged, and too little is left.
        let (mut c, mut f) = started(Controller::settled(TuneConfig::default(), 8));
        feed(&mut c, &mut f, 4, 100e6, 0.0, 50);
        feed_with(&mut c, &mut f, 4 * 6, 5e6, 0.0, |_| 50, Some(2_000_000));
        assert!(most(&c) <= 16, "{:?}", c.history());
        assert_eq!(last(&c), Some(Reason::TooLittleLeft), "{:?}", c.history());
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
        assert_eq!(pow2_floor(0), 1);
        assert_eq!(pow2_floor(7), 4);
        assert_eq!(pow2_floor(64), 64);
    }

    #[test]
    fn growth_every_epoch_when_told_to() {
        // The client's tests force growth through a throttling proxy
        // (crates/xftp-client/tests/adaptive.rs): no gain needed, no queue
        // or loss veto. The count must double every epoch up to the cap.
        let cfg = TuneConfig {
            max_streams: 8,
            gain: -1.0,
            queue_delay_min: Duration::from_secs(3600),
            heavy_queue_min: Duration::from_secs(3600),
            heavy_loss: f64::INFINITY,
            min_epoch: Duration::from_millis(200),
            ..TuneConfig::default()
        };
        let mut c = Controller::new(cfg, 1);
        let mut bytes = 0u64;
        for i in 1..=30u64 {
            // Each connection throttled to 2 MB/s; the RTT jumps around.
            bytes += u64::from(c.streams()) * 200_000;
            c.on_sample(Sample {
                at: Duration::from_millis(100 * i),
                bytes,
                rtt: Some(Duration::from_micros(20 + 3000 * (i % 3))),
                ..Sample::default()
            });
        }
        assert_eq!(c.streams(), 8, "{:?}", c.history());
        assert!(
            c.history()
                .iter()
                .filter(|s| s.reason == Reason::Grow)
                .count()
                >= 2
        );
    }
}

/// [`Controller::learned`] of a history.
fn learned_from(h: &[Step]) -> Option<u32> {
    let crowded = |n: u32| {
        h.iter().enumerate().any(|(i, s)| {
            s.streams == n
                && s.next < n
                && match s.reason {
                    Reason::QueueOverflow => true,
                    // Kept unless its trial ended in going back.
                    Reason::Shed => h[i + 1..]
                        .iter()
                        .find(|t| t.reason != Reason::Trial)
                        .is_some_and(|t| t.reason != Reason::Undo),
                    _ => false,
                }
        })
    };
    let best = |ok: &dyn Fn(&Step) -> bool| {
        h.iter()
            .filter(|s| ok(s))
            .max_by(|a, b| a.goodput_bps.total_cmp(&b.goodput_bps))
            .map(|s| s.streams)
    };
    best(&|s| !crowded(s.streams)).or_else(|| best(&|_| true))
}

/// Issue 16's yardstick on the path model: paths drawn from its
/// distribution, each against every fixed count (crate::model).
#[cfg(test)]
mod yardstick {
    use super::*;
    use crate::model::{judge, table, GridPath, Score, Verdict};

    fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// The grid of `XFTP_TUNE_SEED` (default 2026; `random`: the clock)
    /// with `XFTP_TUNE_PATHS` paths (default 40), `-p auto` capped at
    /// `XFTP_TUNE_MAX` connections (default 64, the server's limit).
    fn grid() -> (u64, Vec<Verdict>) {
        let seed = match std::env::var("XFTP_TUNE_SEED").as_deref() {
            Ok("random") => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs()),
            _ => env("XFTP_TUNE_SEED", 2026),
        };
        let k: u64 = env("XFTP_TUNE_PATHS", 40);
        // `XFTP_TUNE_FIRST=i XFTP_TUNE_PATHS=i+1`: path i alone.
        let first: u64 = env("XFTP_TUNE_FIRST", 0);
        let max: u32 = env("XFTP_TUNE_MAX", 64);
        let cfg = TuneConfig {
            max_streams: max,
            ..TuneConfig::default()
        };
        let v = (first.min(k)..k)
            .map(|i| {
                judge(
                    &GridPath::draw(seed, i),
                    |n| Controller::new(cfg.clone(), n),
                    |n| Controller::settled(cfg.clone(), n),
                    max,
                )
            })
            .collect();
        (seed, v)
    }

    fn print_steps(v: &Verdict) {
        for (k, steps) in [("fresh", &v.steps.0), ("warm", &v.steps.1)] {
            println!("{k} on {}:", v.path.spec.describe());
            for s in steps {
                println!(
                    "  t={:.2} n={} -> {} {:.1} Mbit/s RTT {:.1} ms queue {:.1} ms loss {:.4} {:?}",
                    s.at_s,
                    s.streams,
                    s.next,
                    s.goodput_bps / 1e6,
                    s.rtt_ms.unwrap_or(0.0),
                    s.queue_ms.unwrap_or(0.0),
                    s.loss,
                    s.reason
                );
            }
        }
    }

    #[test]
    fn auto_against_fixed_counts_on_a_random_grid() {
        let (seed, v) = grid();
        println!("{}", table(&v));
        if let Some(i) = std::env::var("XFTP_TUNE_SHOW")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        {
            let first: usize = env("XFTP_TUNE_FIRST", 0);
            v.get(i.wrapping_sub(first)).map(print_steps);
        }
        let all = Score::of(&v);
        let near: Vec<Verdict> = v
            .iter()
            .filter(|x| x.path.spec.rtt < Duration::from_millis(100))
            .cloned()
            .collect();
        let under_100ms = Score::of(&near);
        let how = format!(
            "seed {seed} (XFTP_TUNE_SEED={seed} repeats it): all {} paths: {all}; the {} under 100 ms: {under_100ms}",
            v.len(),
            near.len()
        );
        println!("{how}");
        if std::env::var("XFTP_TUNE_STRICT").is_ok() {
            // Issue 16's goals in full, which the model does not meet
            // (docs/tuning.md: the start count on long paths).
            assert!(all.meets_goals(), "{how}");
        }
        // The warm goal and the "too many" rule, which the model meets on
        // every seed tried at the default 40 paths (at 200, seeds 1, 3 and
        // 4 have one path each: starts of 16 on 250-500 ms paths whose
        // best is 4-8, at 0.78-0.95 of it); the fresh median, near the
        // issue's goal (0.95; seed 10 gives 0.94).
        assert!(all.fresh_median >= 0.93, "{how}");
        assert!(all.warm_median >= 0.97, "{how}");
        assert!(all.too_many.is_empty(), "{how}");
        // Where the start count lets the controller reach the best count
        // in time (under 100 ms of RTT), and over all paths: what the model
        // gives today, as a floor against regressions.
        // (Seeds 1-20 gave 59-93 % and 0.55-0.85 under 100 ms, 50-85 %
        // and 0.42-0.72 over all paths, medians 0.94-0.99. Since the model
        // drops bursts on queues of a few packets (docs/tuning.md), the
        // controller without the timeout rule scores a lowest of 0.00-0.30
        // on every one of seeds 1-8 and 2026: it stays at one connection
        // on those paths until the model's time runs out.)
        assert!(under_100ms.fresh_at_90 >= 0.55, "{how}");
        assert!(under_100ms.fresh_min >= 0.5, "{how}");
        assert!(all.fresh_at_90 >= 0.5, "{how}");
        assert!(all.fresh_min >= 0.35, "{how}");
    }
}
