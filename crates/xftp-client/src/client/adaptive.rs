//! The framed transfer whose connection count changes while it runs
//! (`-p auto`): every [`SAMPLE_EVERY`] a [`Sample`] goes to the
//! [`Controller`]; its decisions become `MULT n` on the control connection,
//! then new data connections (added to the engine) or retired ones.
//!
//! The control connection carries, in command order, the replies to our
//! `STAT` and `MULT` commands and, last, the transfer's final reply. A
//! server that finished before reading a command answers it after its
//! final reply, so replies are told apart by code, not only by position.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use xftp_stripe::{RecvControl, SendControl, StripeError};
use xftp_tls::Stream;
use xftp_tune::controller::Step;
use xftp_tune::meter::{parse_progress, MeterSet, Metered, Totals};
use xftp_tune::{Controller, Sample};

use super::{accept_from, stripe_err, Client};
use crate::control::{reply_text, unexpected, Cmd};
use crate::error::{ClientError, Result};
use crate::negotiate;
use crate::watchdog::{Guarded, Watchdog};

/// How often the control loop samples the transfer.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// A data connection of an adaptive transfer: metered, stall-guarded.
pub(crate) type Conn = Guarded<Metered<Stream>>;

/// How the number of connections moved during one transfer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Timeline {
    /// Connections the transfer started with.
    pub start: u32,
    /// Why that many.
    pub start_reason: String,
    /// True when the controller could change the count (framed transfer,
    /// automatic mode).
    pub adaptive: bool,
    /// Every epoch the controller evaluated.
    pub steps: Vec<Step>,
    /// Connections wanted at the end.
    pub final_streams: u32,
    /// The most connections wanted at once. The summary's `streams` counts
    /// every connection a transfer opened, so a count halved and grown
    /// again counts twice there.
    pub most_streams: u32,
    /// The count to remember for the path ([`Controller::learned`]: the
    /// one that carried the most goodput in an epoch, short of counts
    /// stepped down from as crowded; the final count when no epoch was
    /// evaluated).
    pub best_streams: u32,
    /// Smallest RTT seen (control connection and data path), microseconds.
    pub rtt_floor_us: Option<u64>,
}

/// Where more data connections of the running transfer come from.
#[derive(Debug)]
pub(crate) enum Grow {
    /// Passive: connect again to the server's port.
    Passive(SocketAddr),
    /// Active: the server connects again to our listening port.
    Active(Arc<TcpListener>),
    /// MPRT or a listing: the set cannot grow.
    Fixed,
}

/// The engine's live controls, for either direction.
pub(crate) enum EngineCtl {
    Recv(RecvControl<Conn>),
    Send(SendControl<Conn>),
}

impl EngineCtl {
    fn add(&self, c: Conn) -> std::result::Result<usize, StripeError> {
        match self {
            EngineCtl::Recv(r) => r.add_connection(c),
            EngineCtl::Send(s) => s.add_connection(c),
        }
    }

    fn clone_handle(&self) -> EngineCtl {
        match self {
            EngineCtl::Recv(r) => EngineCtl::Recv(r.clone()),
            EngineCtl::Send(s) => EngineCtl::Send(s.clone()),
        }
    }
}

/// Sockets of a sending transfer, kept (as duplicated descriptors) so the
/// control loop can read `TCP_INFO` of every connection at each sample,
/// also of connections the engine has already closed: what the peer
/// acknowledged is the goodput of a sender, while bytes written include
/// what still sits in socket buffers (megabytes with autotuning) and
/// arrive in bursts as buffer space frees.
#[derive(Debug, Clone, Default)]
pub(crate) struct Socks(Arc<Mutex<Vec<Kept>>>);

/// A kept socket and its reading at the previous sample.
type Kept = (OwnedFd, Option<xftp_tune::tcpinfo::TcpInfo>);

impl Socks {
    /// Keep a duplicate of `s`'s descriptor (closed when the transfer
    /// ends).
    pub fn keep(&self, s: &Stream) {
        match s.as_fd().try_clone_to_owned() {
            Ok(fd) => {
                if let Ok(mut v) = self.0.lock() {
                    v.push((fd, None));
                }
            }
            Err(e) => tracing::debug!("cannot keep a data socket for TCP_INFO: {e}"),
        }
    }

    /// Sum over the kept sockets.
    fn totals(&self) -> SockTotals {
        let mut t = SockTotals::default();
        let Ok(mut v) = self.0.lock() else {
            return t;
        };
        let (mut rtt_sum, mut rtt_n) = (Duration::ZERO, 0u32);
        for (fd, prev) in v.iter_mut() {
            if let Ok(i) = xftp_tune::tcpinfo::read(fd) {
                t.delivered += i.delivered_bytes();
                t.received += i.bytes_received;
                t.retrans += u64::from(i.total_retrans);
                t.segs += u64::from(i.segs_out);
                // A connection its receiver held back tells nothing of a
                // router queue (TcpInfo::receiver_limited_since).
                let limited = prev.is_some_and(|p| i.receiver_limited_since(&p));
                *prev = Some(i);
                if !i.rtt.is_zero() && !limited {
                    rtt_sum += i.rtt;
                    rtt_n += 1;
                }
            }
        }
        t.rtt = (rtt_n > 0).then(|| rtt_sum / rtt_n);
        t
    }
}

/// What the kernel says of the kept sockets (0 where it says nothing).
#[derive(Debug, Default)]
struct SockTotals {
    /// Bytes the peer acknowledged in order or selectively (we send): does
    /// not jump when a retransmission fills a hole.
    delivered: u64,
    /// Bytes received in order (we receive), read by us or not yet.
    received: u64,
    /// Mean smoothed RTT of the connections their receivers did not
    /// hold back.
    rtt: Option<Duration>,
    retrans: u64,
    segs: u64,
}

/// Meter, keep and guard one data connection.
pub(crate) fn wrap(
    meters: &MeterSet,
    dog: &Arc<Watchdog>,
    socks: Option<&Socks>,
    s: Stream,
) -> Conn {
    match socks {
        Some(k) => {
            k.keep(&s);
            sending(meters, dog, s)
        }
        None => dog.guard(meters.wrap(s)),
    }
}

/// Meter and guard one sending connection, its unsent backlog bounded to
/// about one window: records wait in the engine for whichever connection
/// is free, not in the queue of one slowed by loss (where the endgame
/// would count them as held by it). Every framed send of the client.
pub(crate) fn sending(meters: &MeterSet, dog: &Arc<Watchdog>, s: Stream) -> Conn {
    dog.guard(meters.wrap(s).bound_backlog())
}

/// A running adaptive transfer.
pub(crate) struct Live {
    pub ctl: EngineCtl,
    /// The sockets whose `TCP_INFO` gives the bytes the network delivered
    /// (acknowledged when we send, received when we receive): bytes the
    /// application wrote or read lag behind by what sits in the socket
    /// buffers, megabytes on a fat path, and make goodput jump.
    pub socks: Option<Socks>,
    pub meters: MeterSet,
    pub dog: Arc<Watchdog>,
    pub grow: Grow,
    /// Payload to move, when known (`remaining` in samples).
    pub total: Option<u64>,
    /// Connection indexes not retired, oldest first (we retire the newest).
    /// Shared with what adds the connections that were late at the start.
    pub live_idx: LiveIdx,
    /// Connections granted now.
    pub current: u32,
    /// An upload in the endgame, of this many payload bytes: the server's
    /// 226 means it has every byte, even if our end of a connection
    /// failed ([`Client::after_failure`]).
    pub complete_on_226: Option<u64>,
}

/// Connection indexes of a running transfer not retired, oldest first.
pub(crate) type LiveIdx = Arc<std::sync::Mutex<Vec<usize>>>;

impl Live {
    /// The list for a transfer that started on connections `0..started`.
    pub fn started_with(started: usize) -> LiveIdx {
        Arc::new(std::sync::Mutex::new((0..started).collect()))
    }

    fn push_idx(&self, idx: usize) {
        if let Ok(mut l) = self.live_idx.lock() {
            l.push(idx);
        }
    }

    /// The connection to retire next: one that waits in a timeout
    /// (`waiting`), else the newest; never the last.
    fn pop_idx(&self, waiting: &[usize]) -> Option<usize> {
        let mut l = self.live_idx.lock().ok()?;
        if l.len() <= 1 {
            return None;
        }
        match l.iter().rposition(|i| waiting.contains(i)) {
            Some(at) => Some(l.remove(at)),
            None => l.pop(),
        }
    }

    pub fn sending(&self) -> bool {
        matches!(self.ctl, EngineCtl::Send(_))
    }
}

/// Where the samples of a download come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Waiting for the first progress line (it tells which).
    Unknown,
    /// The server's progress lines: what its sockets' peers (our sockets)
    /// acknowledged, on the server's clock, one sample per reply.
    Server,
    /// Our own sockets and clock, every tick.
    Own,
}

/// Give up waiting for a server's first delivered byte after this long
/// (its kernel may not report acknowledged bytes at all).
const SERVER_SILENT: Duration = Duration::from_secs(1);

/// Data standing still this long makes the loop ask the server (STAT)
/// whether the path answers, where it would not ask otherwise.
const STILL_PROBE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Stat,
    Mult(u32),
}

/// What a reply during the transfer answers.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Final,
    Stat,
    Mult,
}

/// Tell a reply apart: 211–213 answer STAT, 200 answers MULT, 226/250 and
/// every 4xx end the transfer; a 5xx refuses the oldest outstanding command
/// if there is one, else ends the transfer.
fn classify(code: u16, oldest: Option<Pending>) -> Kind {
    match code {
        211..=213 => Kind::Stat,
        200 => Kind::Mult,
        500..=599 => match oldest {
            Some(Pending::Stat) => Kind::Stat,
            Some(Pending::Mult(_)) => Kind::Mult,
            None => Kind::Final,
        },
        _ => Kind::Final,
    }
}

/// Print one controller decision (shown with `-v`).
fn log_step(s: &Step) {
    tracing::info!(
        "tune: t={:.1}s N {} -> {} goodput {:.1} Mbit/s RTT {} ({:?})",
        s.at_s,
        s.streams,
        s.next,
        s.goodput_bps / 1e6,
        s.rtt_ms
            .map_or_else(|| "?".to_string(), |r| format!("{r:.2} ms")),
        s.reason
    );
}

impl Client {
    /// Drive the transfer `fin` (the engine's `finish()`), sampling and
    /// applying decisions, until both the data and the final reply to `c`
    /// are in. Returns the engine's report and the controller.
    pub(crate) async fn adapt<F>(
        &mut self,
        c: &Cmd,
        fin: F,
        mut live: Live,
        mut ctlr: Controller,
    ) -> Result<xftp_stripe::TransferReport>
    where
        F: std::future::Future<
            Output = std::result::Result<xftp_stripe::TransferReport, StripeError>,
        >,
    {
        let start = Instant::now();
        let mut fin = std::pin::pin!(fin);
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut pending: VecDeque<(Pending, Instant)> = VecDeque::new();
        let mut adds: JoinSet<Result<Option<usize>>> = JoinSet::new();
        let mut data: Option<xftp_stripe::TransferReport> = None;
        let mut final_seen = false;
        let mut server: Option<Totals> = None;
        // Only our own server (FEAT MULT and MODE E) gets here; it answers
        // STAT with a progress line until proven otherwise.
        let mut stat_ok = true;
        let mut adapt = true;
        let peer = self.ctl.peer().ip();
        let sending = live.sending();
        // A download is judged by what the server's sockets say our
        // sockets acknowledged, if it says: what our sockets received *in
        // order* jumps when a retransmission fills a hole (an epoch read
        // 300 Mbit/s on a 200 Mbit/s link).
        let mut source = if sending {
            Source::Own
        } else {
            Source::Unknown
        };
        // A server sample with nothing acknowledged yet, kept until the
        // source is known: the start of the first epoch.
        let mut first: Option<Sample> = None;
        // Every byte handed to the data connections (the server's last
        // STAT said so): no decision can help from here, so no more STAT.
        // One still out when the 226 comes is waited for, half an RTT on
        // average, 0.3 s on a satellite hop.
        let mut handed_out = false;
        // A reply came since the last sample of our own meters.
        let mut heard = false;
        let reply_timeout = self.cfg.reply_timeout;
        loop {
            if data.is_some() && final_seen && pending.is_empty() {
                break;
            }
            // While data moves the final reply may take as long as the
            // transfer; the limit restarts with every loop turn anyway.
            let limit = if data.is_none() {
                Duration::from_secs(86_400)
            } else {
                reply_timeout
            };
            tokio::select! {
                r = &mut fin, if data.is_none() => {
                    match r {
                        Ok(rep) => data = Some(rep),
                        Err(e) => {
                            let e = stripe_err(e, self.cfg.data_timeout);
                            // The server's 426 may say why (it reset the
                            // connections); its reply is the better error.
                            let (e, done) = if final_seen {
                                (e, true)
                            } else {
                                self.after_failure(c, e).await
                            };
                            match (done, live.complete_on_226) {
                                (true, Some(bytes)) => {
                                    tracing::info!("{e}, after the server had every byte (226): the upload is complete");
                                    let streams = match &live.ctl {
                                        EngineCtl::Send(s) => s.stats(),
                                        EngineCtl::Recv(_) => Vec::new(),
                                    };
                                    return Ok(xftp_stripe::TransferReport { bytes, duplicate_bytes: 0, streams });
                                }
                                _ => return Err(e),
                            }
                        }
                    }
                    // Connections still being added are moot now.
                    adds.abort_all();
                }
                r = self.ctl.read_reply_within(limit), if !final_seen || !pending.is_empty() => {
                    let r = r?;
                    heard = true;
                    let oldest = pending.front().map(|p| p.0);
                    match classify(r.code, oldest) {
                        Kind::Final => {
                            if final_seen {
                                return Err(unexpected(c, &r));
                            }
                            if !matches!(r.code, 226 | 250) {
                                return Err(unexpected(c, &r));
                            }
                            final_seen = true;
                        }
                        Kind::Stat => {
                            take(&mut pending, |p| p == Pending::Stat);
                            match parse_progress(r.lines.first().map_or("", |s| s.as_str())) {
                                Some(t) if r.code == 213 => {
                                    tracing::debug!("progress: {}", reply_text(&r));
                                    // What the server has not yet written:
                                    // all a new connection could carry.
                                    let remaining = live.total.map(|n| n.saturating_sub(t.bytes));
                                    handed_out |= remaining == Some(0);
                                    let sample = t.at.map(|at| Sample {
                                        at,
                                        bytes: t.delivered,
                                        rtt: t.rtt,
                                        retrans: t.retrans,
                                        segs_out: t.segs_out,
                                        remaining,
                                        heard: true,
                                    });
                                    if source == Source::Unknown {
                                        source = match t.at {
                                            Some(_) if t.delivered > 0 => Source::Server,
                                            Some(at) if at < SERVER_SILENT => Source::Unknown,
                                            _ => Source::Own,
                                        };
                                        if source == Source::Unknown && first.is_none() {
                                            first = sample;
                                        }
                                    }
                                    if let (Source::Server, Some(sample), None, true) = (source, sample, &data, adapt) {
                                        if let Some(f) = first.take() {
                                            self.feed(&mut ctlr, f, &mut pending, &mut live, &mut adds, peer).await?;
                                        }
                                        self.feed(&mut ctlr, sample, &mut pending, &mut live, &mut adds, peer).await?;
                                    }
                                    server = Some(t);
                                }
                                // The transfer is over on the server's side
                                // (its status, no progress line): the race
                                // of a STAT with the 226, not a server
                                // without progress reports.
                                _ if r.code == 211 && server.is_some() => {
                                    tracing::debug!("STAT after the server's end of the transfer: {}", reply_text(&r));
                                    stat_ok = false;
                                }
                                _ => {
                                    tracing::info!("server answers STAT without progress ({} {}); using our own meters", r.code, reply_text(&r));
                                    stat_ok = false;
                                    source = Source::Own;
                                }
                            }
                        }
                        Kind::Mult => {
                            let want = take(&mut pending, |p| matches!(p, Pending::Mult(_)));
                            let want = match want { Some(Pending::Mult(n)) => n, _ => return Err(unexpected(c, &r)) };
                            let granted = if r.code == 200 { negotiate::mult_granted(&r, want) } else { None };
                            if let Some(g) = granted {
                                // The session's grant: what the next transfer uses.
                                self.granted = g;
                            }
                            match granted {
                                Some(g) if data.is_none() => {
                                    if g < want {
                                        ctlr.limit(g);
                                    }
                                    self.apply_grant(&mut live, g, &mut adds, peer);
                                }
                                Some(_) => {}
                                None => {
                                    tracing::info!("MULT {want} during the transfer: {} {}; no more changes", r.code, reply_text(&r));
                                    adapt = false;
                                }
                            }
                        }
                    }
                }
                Some(r) = adds.join_next(), if !adds.is_empty() => {
                    match r {
                        Ok(Ok(Some(idx))) => live.push_idx(idx),
                        Ok(Ok(None)) => {}
                        Ok(Err(e)) => tracing::warn!("an added data connection failed: {e}"),
                        Err(e) => tracing::debug!("adding a data connection: {e}"),
                    }
                }
                _ = tick.tick(), if data.is_none() && adapt => {
                    if let Some((p, at)) = pending.front() {
                        if at.elapsed() > reply_timeout {
                            return Err(ClientError::Timeout {
                                what: format!(
                                    "a reply to {} during the transfer",
                                    match p {
                                        Pending::Stat => "STAT".to_owned(),
                                        Pending::Mult(n) => format!("MULT {n}"),
                                    }
                                ),
                                after: reply_timeout,
                            });
                        }
                    }
                    // While the data stands still a STAT also asks whether
                    // the path answers (rule 12's rescue), uploads and a
                    // download's last records included.
                    let still = live.dog.idle() >= STILL_PROBE;
                    let ask = if sending { still } else { stat_ok && (!handed_out || still) };
                    if ask && !pending.iter().any(|p| p.0 == Pending::Stat) {
                        self.ctl.send(&[&Cmd::bare("STAT")]).await?;
                        pending.push_back((Pending::Stat, Instant::now()));
                    }
                    if source != Source::Own {
                        continue;
                    }
                    let own = live.meters.totals();
                    let mut bytes = own.bytes;
                    let kernel = live.socks.as_ref().map(Socks::totals);
                    if let Some(k) = &kernel {
                        // Kernels without tcpi_bytes_acked/received report 0.
                        let delivered = if sending {
                            k.delivered
                        } else {
                            k.received
                        };
                        if delivered > 0 {
                            bytes = delivered;
                        }
                    }
                    let (rtt, retrans, segs_out) = if let Some(k) = kernel.filter(|_| sending) {
                        (k.rtt.or(own.rtt), k.retrans, k.segs)
                    } else if sending {
                        (own.rtt, own.retrans, own.segs_out)
                    } else {
                        match server.filter(|_| stat_ok) {
                            Some(s) => (s.rtt, s.retrans, s.segs_out),
                            None => (self.ctl.rtt(), 0, 0),
                        }
                    };
                    let sample = Sample {
                        at: start.elapsed(),
                        bytes,
                        rtt,
                        retrans,
                        segs_out,
                        // What no connection has taken yet, when we send.
                        remaining: live
                            .total
                            .map(|t| t.saturating_sub(if sending { own.bytes } else { bytes })),
                        heard: std::mem::take(&mut heard),
                    };
                    self.feed(&mut ctlr, sample, &mut pending, &mut live, &mut adds, peer).await?;
                }
            }
        }
        self.last_controller = Some(ctlr);
        data.ok_or_else(|| ClientError::Stripe("transfer ended without a report".into()))
    }

    /// Give the controller one sample; a decision goes out as `MULT n`.
    ///
    /// A download in passive mode opens the new connections at once, with
    /// the `MULT`: the server's kernel completes their handshakes on the
    /// passive port while the command is on its way, and the server takes
    /// them from there when it grants, a round trip sooner than connecting
    /// after the 200. One the server never takes (a smaller grant, a
    /// refusal) carries nothing and is reset when the transfer ends, which
    /// a receiver ignores (docs/protocol.md). An upload waits for the
    /// grant: records written to a connection the server never takes
    /// would be lost.
    async fn feed(
        &mut self,
        ctlr: &mut Controller,
        sample: Sample,
        pending: &mut VecDeque<(Pending, Instant)>,
        live: &mut Live,
        adds: &mut JoinSet<Result<Option<usize>>>,
        peer: IpAddr,
    ) -> Result<()> {
        let before = ctlr.history().len();
        let decision = ctlr.on_sample(sample);
        if ctlr.history().len() > before {
            if let (Some(s), Some(_)) = (ctlr.history().last(), decision) {
                log_step(s);
            }
        }
        if let Some(d) = decision {
            let m = Cmd::with("MULT", d.streams.to_string());
            self.ctl.send(&[&m]).await?;
            pending.push_back((Pending::Mult(d.streams), Instant::now()));
            if d.streams > live.current && !live.sending() && matches!(live.grow, Grow::Passive(_))
            {
                self.apply_grant(live, d.streams, adds, peer);
            }
        }
        Ok(())
    }

    /// Apply a grant of `g` connections: open more, or retire our newest
    /// (when we send; a sending server retires its own).
    fn apply_grant(
        &mut self,
        live: &mut Live,
        g: u32,
        adds: &mut JoinSet<Result<Option<usize>>>,
        peer: IpAddr,
    ) {
        if g > live.current {
            for _ in live.current..g {
                let handle = live.ctl.clone_handle();
                let (meters, dog) = (live.meters.clone(), live.dog.clone());
                let socks = live.socks.clone();
                let (ct, dt, buf) = (
                    self.cfg.connect_timeout,
                    self.cfg.data_timeout,
                    self.cfg.bufsize,
                );
                let tls = self.data_tls.clone();
                match &live.grow {
                    Grow::Passive(addr) => {
                        let addr = *addr;
                        adds.spawn(async move {
                            let s = super::connect_data(addr, buf, ct, tls.as_ref()).await?;
                            Ok(handle.add(wrap(&meters, &dog, socks.as_ref(), s)).ok())
                        });
                    }
                    Grow::Active(l) => {
                        let l = l.clone();
                        adds.spawn(async move {
                            let s = accept_from(&l, peer, dt, tls.as_ref()).await?;
                            Ok(handle.add(wrap(&meters, &dog, socks.as_ref(), s)).ok())
                        });
                    }
                    Grow::Fixed => return,
                }
            }
            live.current = g;
        } else if g < live.current {
            if let EngineCtl::Send(s) = &live.ctl {
                let waiting = s.waiting();
                for _ in g..live.current {
                    let Some(idx) = live.pop_idx(&waiting) else {
                        break;
                    };
                    if let Err(e) = s.retire(idx) {
                        tracing::debug!("retiring data connection {idx}: {e}");
                    }
                }
            }
            live.current = g;
        }
    }
}

/// Remove and return the oldest entry matching `f`.
fn take(q: &mut VecDeque<(Pending, Instant)>, f: impl Fn(Pending) -> bool) -> Option<Pending> {
    let i = q.iter().position(|p| f(p.0))?;
    q.remove(i).map(|p| p.0)
}

/// Build the timeline of a finished transfer.
pub(crate) fn timeline(
    start: u32,
    start_reason: String,
    ctlr: Option<&Controller>,
    final_streams: u32,
    control_rtt: Option<Duration>,
) -> Timeline {
    let steps: Vec<Step> = ctlr.map(|c| c.history().to_vec()).unwrap_or_default();
    let best_streams = ctlr.and_then(Controller::learned).unwrap_or(final_streams);
    let most_streams = steps
        .iter()
        .map(|s| s.streams)
        .chain([start, final_streams])
        .max()
        .unwrap_or(start);
    let floor = [ctlr.and_then(Controller::rtt_floor), control_rtt]
        .into_iter()
        .flatten()
        .min();
    Timeline {
        start,
        start_reason,
        adaptive: ctlr.is_some(),
        steps,
        final_streams,
        most_streams,
        best_streams,
        rtt_floor_us: floor.map(|d| d.as_micros() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_told_apart_by_code() {
        assert_eq!(classify(213, Some(Pending::Stat)), Kind::Stat);
        assert_eq!(classify(200, Some(Pending::Mult(4))), Kind::Mult);
        assert_eq!(classify(226, Some(Pending::Stat)), Kind::Final);
        assert_eq!(classify(426, Some(Pending::Mult(2))), Kind::Final);
        assert_eq!(classify(504, Some(Pending::Mult(2))), Kind::Mult);
        assert_eq!(classify(502, Some(Pending::Stat)), Kind::Stat);
        assert_eq!(classify(550, None), Kind::Final);
    }
}
