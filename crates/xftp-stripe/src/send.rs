//! The sending half of the engine: a file or a byte stream over N
//! connections.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::block::BlockHeader;
use crate::driver::{admit_or_reap, Tasks};
use crate::endgame::Books;
use crate::sched::{Next, Schedule, Scheduler};
use crate::{DataSocket, ReadAt, StreamStats, StripeError, TransferReport, DEFAULT_RECORD_SIZE};

/// Sender settings.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// Bytes per record (data block). Default [`DEFAULT_RECORD_SIZE`].
    pub record_size: u32,
    /// Dynamic (default) or static assignment of records to connections.
    pub schedule: Schedule,
    /// Leave every connection open after its EOD (GridFTP data channel
    /// caching) so that the next transfer can use it:
    /// [`Sender::finish_kept`] hands them back. Off: each connection's
    /// write side is shut down after its EOD.
    pub keep_open: bool,
    /// The endgame ([`crate::endgame`]): a connection past its EOD sends
    /// again the records a connection stuck in a retransmission timeout
    /// still holds, until every byte is delivered (past the end of
    /// [`Sender::finish`] when every connection wrote its EOD); then
    /// connections still stuck are reset. Only for a receiver that takes
    /// identical copies, also after an EOD, and completes without every
    /// EOD (`Receiver::file_endgame`; xftp's `OPTS MULT ENDGAME`). Files
    /// only; not with `keep_open`.
    pub endgame: bool,
    /// Asked as the last record of a file is handed out: whether the
    /// source changed since the transfer began. If so, the transfer fails
    /// ([`StripeError::SourceChanged`]) before that record goes, so the
    /// receiver never completes a copy of no one version (a receiver that
    /// writes a temporary keeps what it had).
    pub source_check: Option<SourceCheck>,
}

/// See [`SendConfig::source_check`]: true when the source changed.
#[derive(Clone)]
pub struct SourceCheck(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for SourceCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceCheck")
    }
}

impl Default for SendConfig {
    fn default() -> Self {
        Self {
            record_size: DEFAULT_RECORD_SIZE,
            schedule: Schedule::Dynamic,
            keep_open: false,
            endgame: false,
            source_check: None,
        }
    }
}

/// Bytes written by the application and not yet taken by a connection:
/// sealed chunks of one record each (usually), plus the one being filled.
/// Chunks are separate allocations so handing one out never copies.
struct StreamBuf {
    ready: VecDeque<Bytes>,
    cur: BytesMut,
    record: usize,
    /// Bytes in `ready` and `cur`.
    queued: usize,
    /// Stream offset of the first byte of `ready`.
    base: u64,
    cap: usize,
    /// Total bytes accepted from the application.
    written: u64,
    closing: bool,
}

impl StreamBuf {
    fn seal(&mut self) {
        if !self.cur.is_empty() {
            self.ready.push_back(self.cur.split().freeze());
        }
    }

    /// The next `len` sealed bytes; one chunk unless a flush cut a record.
    fn take(&mut self, len: usize) -> Bytes {
        self.queued -= len;
        self.base += len as u64;
        if let Some(front) = self.ready.front_mut() {
            if front.len() >= len {
                let b = front.split_to(len);
                if front.is_empty() {
                    self.ready.pop_front();
                }
                return b;
            }
        }
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len {
            let Some(front) = self.ready.front_mut() else {
                break;
            };
            let k = front.len().min(len - out.len());
            out.extend_from_slice(&front.split_to(k));
            if front.is_empty() {
                self.ready.pop_front();
            }
        }
        out.freeze()
    }
}

struct State {
    sched: Scheduler,
    stream: Option<StreamBuf>,
    /// Connection tasks that have not yet decided how they end.
    active: usize,
    /// The EOF block is committed: nothing may be added any more.
    eof_sent: bool,
    /// Connections that have taken their end (EOD or EOF) ...
    ends_taken: usize,
    /// ... and written it.
    ends_written: usize,
    failed: Option<StripeError>,
    stats: Vec<StreamStats>,
    result: Option<Result<TransferReport, StripeError>>,
    app_waker: Option<Waker>,
    /// The endgame's books and sockets, when it is on.
    endgame: Option<EndgameState>,
    /// The error of the last connection lost while others went on
    /// ([`lose`]): once one is lost, the transfer is over only when every
    /// byte is delivered again, not when the EOF is written.
    lost_error: Option<StripeError>,
}

/// The endgame's I/O side: duplicates of every connection's socket, to
/// ask the kernel what each has delivered, and each task's part in the end.
struct EndgameState {
    books: Books,
    probes: Vec<Option<Box<dyn crate::Probe>>>,
    /// Per connection: its task has ended (EOD sent, or failed).
    ended: Vec<bool>,
    /// Per connection: to be reset, its records delivered by others.
    abort: Vec<bool>,
    /// Per connection: its EOD (or EOF) was written.
    wrote_end: Vec<bool>,
    /// Per connection: its task has returned.
    gone: Vec<bool>,
    last_observed: Option<std::time::Instant>,
    observations: u64,
    /// Payload bytes sent again (whole copies), for the report.
    resent: u64,
    /// Payload bytes to deliver (the file less what the receiver has):
    /// the report's total once the transfer is over, each byte once. The
    /// connections' counts cannot give it: they hold the copies, but not
    /// a record a stuck connection was reset in the middle of.
    payload: u64,
}

impl EndgameState {
    fn grow(&mut self, idx: usize) {
        if self.probes.len() <= idx {
            self.probes.resize_with(idx + 1, || None);
            self.ended.resize(idx + 1, false);
            self.abort.resize(idx + 1, false);
            self.wrote_end.resize(idx + 1, false);
            self.gone.resize(idx + 1, false);
        }
        self.books.add_conn(idx);
    }
}

impl State {
    fn wake_app(&mut self) {
        if let Some(w) = self.app_waker.take() {
            w.wake();
        }
    }
}

struct Shared {
    st: Mutex<State>,
    /// Scheduler progress: data added, close, retire, failure.
    wake: Notify,
    file: Option<Arc<dyn ReadAt>>,
    /// [`SendConfig::keep_open`].
    keep_open: bool,
    /// [`SendConfig::source_check`].
    source_check: Option<SourceCheck>,
    /// Reading the source took long once (a disk, not the page cache):
    /// from then on records are read in the blocking pool.
    slow_source: std::sync::atomic::AtomicBool,
    /// The endgame reset some connections (their tasks end at once).
    abort: Notify,
    /// A connection wrote its EOD, or the endgame reset some: the driver
    /// checks whether the transfer is over.
    ended: Notify,
    born: std::time::Instant,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before any
        // call that could panic, so a poisoned lock is still usable.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running striped send. Dropping it aborts the transfer (every
/// connection is closed without EOD, so the receiver fails rather than
/// seeing a short file).
pub struct Sender<S> {
    ctl: SendControl<S>,
    driver: Option<JoinHandle<Result<Finished<S>, StripeError>>>,
}

/// A finished transfer and the connections it kept open.
type Finished<S> = (TransferReport, Vec<S>);

/// A cloneable handle to add or retire connections of a running [`Sender`].
pub struct SendControl<S> {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<(usize, S)>,
}

impl<S> Clone for SendControl<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            tx: self.tx.clone(),
        }
    }
}

impl<S: AsyncWrite + DataSocket + Unpin + Send + 'static> Sender<S> {
    /// Start sending `len` bytes of `src` over `conns`.
    ///
    /// With [`Schedule::Static`] the connection set is fixed to `conns`.
    pub fn file(src: Arc<dyn ReadAt>, len: u64, conns: Vec<S>, cfg: &SendConfig) -> Self {
        let sched = match cfg.schedule {
            Schedule::Dynamic => Scheduler::dynamic(cfg.record_size, len),
            Schedule::Static => Scheduler::fixed(cfg.record_size, len, conns.len()),
        };
        Self::start_file(sched, src, len, &crate::ranges::RangeSet::new(), conns, cfg)
    }

    /// A file's send (of the bytes `have` leaves) as `cfg` sets it up.
    fn start_file(
        sched: Scheduler,
        src: Arc<dyn ReadAt>,
        len: u64,
        have: &crate::ranges::RangeSet,
        conns: Vec<S>,
        cfg: &SendConfig,
    ) -> Self {
        let endgame = Self::endgame_for(cfg, len, have);
        Self::start(
            sched,
            None,
            Some(src),
            conns,
            cfg.keep_open,
            endgame,
            cfg.source_check.clone(),
        )
    }

    fn endgame_for(
        cfg: &SendConfig,
        len: u64,
        have: &crate::ranges::RangeSet,
    ) -> Option<EndgameState> {
        (cfg.endgame && !cfg.keep_open).then(|| EndgameState {
            books: Books::new(len, have),
            probes: Vec::new(),
            ended: Vec::new(),
            abort: Vec::new(),
            wrote_end: Vec::new(),
            gone: Vec::new(),
            last_observed: None,
            observations: 0,
            resent: 0,
            payload: len - have.covered().min(len),
        })
    }

    /// Resume: send the bytes of `[0, len)` the receiver does not have
    /// (`have`), dynamically scheduled whatever `cfg` says. The end of the
    /// transfer (EOF, EODs) is as for [`Sender::file`].
    pub fn file_except(
        src: Arc<dyn ReadAt>,
        len: u64,
        have: &crate::ranges::RangeSet,
        conns: Vec<S>,
        cfg: &SendConfig,
    ) -> Self {
        let sched = Scheduler::dynamic_except(cfg.record_size, len, have);
        Self::start_file(sched, src, len, have, conns, cfg)
    }

    /// Start a byte stream (dynamic scheduling, length unknown) fed with
    /// [`poll_write`](Self::poll_write). At most `buffer` bytes wait
    /// between the application and the connections (raised to two records).
    pub fn stream(conns: Vec<S>, record_size: u32, buffer: usize) -> Self {
        let rs = record_size.max(1);
        let sb = StreamBuf {
            ready: VecDeque::new(),
            cur: BytesMut::new(),
            record: rs as usize,
            queued: 0,
            base: 0,
            cap: buffer.max(2 * rs as usize),
            written: 0,
            closing: false,
        };
        Self::start(
            Scheduler::stream(rs),
            Some(sb),
            None,
            conns,
            false,
            None,
            None,
        )
    }

    fn start(
        mut sched: Scheduler,
        stream: Option<StreamBuf>,
        file: Option<Arc<dyn ReadAt>>,
        conns: Vec<S>,
        keep_open: bool,
        mut endgame: Option<EndgameState>,
        source_check: Option<SourceCheck>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let n = conns.len();
        if let Some(e) = endgame.as_mut() {
            for i in 0..n {
                e.grow(i);
            }
        }
        if sched.schedule() == Schedule::Dynamic {
            for _ in 0..n {
                // Dynamic schedulers always accept connections.
                let _ = sched.add_conn();
            }
        }
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                sched,
                stream,
                active: n,
                eof_sent: false,
                ends_taken: 0,
                ends_written: 0,
                failed: None,
                stats: vec![StreamStats::default(); n],
                result: None,
                app_waker: None,
                endgame,
                lost_error: None,
            }),
            wake: Notify::new(),
            file,
            keep_open,
            source_check,
            slow_source: Default::default(),
            abort: Notify::new(),
            ended: Notify::new(),
            born: std::time::Instant::now(),
        });
        for (i, c) in conns.into_iter().enumerate() {
            // The receiver lives in the driver spawned below.
            let _ = tx.send((i, c));
        }
        let driver = tokio::spawn(drive(shared.clone(), rx));
        Self {
            ctl: SendControl { shared, tx },
            driver: Some(driver),
        }
    }

    /// Add a connection to the running transfer; returns its index.
    pub fn add_connection(&self, conn: S) -> Result<usize, StripeError> {
        self.ctl.add_connection(conn)
    }

    /// Stop using connection `idx` after its current record; it sends EOD.
    pub fn retire(&self, idx: usize) -> Result<(), StripeError> {
        self.ctl.retire(idx)
    }

    /// A handle for adding/retiring connections from elsewhere.
    pub fn control(&self) -> SendControl<S> {
        self.ctl.clone()
    }

    /// Payload bytes sent so far, per connection.
    pub fn stats(&self) -> Vec<StreamStats> {
        self.ctl.shared.lock().stats.clone()
    }

    /// Wait for the end: every connection has sent its EOD (one of them
    /// the EOF block), flushed and shut down its write side.
    pub async fn finish(self) -> Result<TransferReport, StripeError> {
        self.finish_kept().await.map(|(report, _)| report)
    }

    /// [`finish`](Self::finish), and the connections left open after
    /// their EOD when [`SendConfig::keep_open`] was set (none otherwise),
    /// ready for the next transfer.
    pub async fn finish_kept(mut self) -> Result<(TransferReport, Vec<S>), StripeError> {
        let driver = self.driver.take();
        // Without our handle the driver fails once no connection is left.
        // Replace our sender half by a dead one so the channel can close.
        self.ctl.tx = mpsc::unbounded_channel().0;
        match driver {
            // Dropped before the end (the caller gave up), the transfer
            // stops with it: the driver must not go on in the background.
            Some(d) => {
                let mut d = crate::AbortOnDrop(d);
                (&mut d.0)
                    .await
                    .unwrap_or_else(|e| Err(StripeError::Aborted(e.to_string())))
            }
            None => Err(StripeError::Aborted("finished twice".into())),
        }
    }

    /// Stream mode: accept bytes from the application (up to the free
    /// buffer space). Full records are handed to connections at once.
    pub fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let sh = &self.ctl.shared;
        let mut st = sh.lock();
        if let Some(e) = &st.failed {
            return Poll::Ready(Err(e.to_io()));
        }
        let avail = st.sched.available();
        let Some(sb) = st.stream.as_mut() else {
            return Poll::Ready(Err(io::Error::other("not a stream sender")));
        };
        if sb.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let room = sb.cap.saturating_sub(sb.queued);
        if room == 0 {
            st.app_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(data.len());
        let mut rest = &data[..n];
        let mut sealed = 0usize;
        while !rest.is_empty() {
            if sb.cur.capacity() == 0 {
                // Reuses the old allocation when its record was sent.
                sb.cur.reserve(sb.record);
            }
            let k = rest.len().min(sb.record - sb.cur.len());
            sb.cur.extend_from_slice(&rest[..k]);
            rest = &rest[k..];
            if sb.cur.len() >= sb.record {
                sb.seal();
                sealed += 1;
            }
        }
        sb.queued += n;
        sb.written += n as u64;
        // Only whole records are scheduled here: small writes are batched.
        let full = sb.written - sb.cur.len() as u64;
        if full > avail {
            let _ = st.sched.extend(full);
            // One idle connection per new record; waking all of them for
            // every record would make 128 connections thrash.
            for _ in 0..sealed {
                sh.wake.notify_one();
            }
        }
        Poll::Ready(Ok(n))
    }

    /// Stream mode: hand every buffered byte (also a partial record) to
    /// the connections; ready once all of it has been taken.
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sh = &self.ctl.shared;
        let mut st = sh.lock();
        if let Some(e) = &st.failed {
            return Poll::Ready(Err(e.to_io()));
        }
        let Some(written) = st.stream.as_mut().map(|s| {
            s.seal();
            s.written
        }) else {
            return Poll::Ready(Ok(()));
        };
        if st.sched.available() < written && !st.sched.exhausted() {
            let _ = st.sched.extend(written);
            sh.wake.notify_waiters();
        }
        if st.sched.cursor() >= written {
            Poll::Ready(Ok(()))
        } else {
            st.app_waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// Stream mode: no more data; ready when every connection has sent its
    /// EOD (one the EOF block) and shut down its write side.
    pub fn poll_close(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sh = &self.ctl.shared;
        let mut st = sh.lock();
        if let Some(r) = &st.result {
            return Poll::Ready(r.as_ref().map(|_| ()).map_err(StripeError::to_io));
        }
        if let Some(e) = &st.failed {
            return Poll::Ready(Err(e.to_io()));
        }
        let written = st.stream.as_mut().map(|s| {
            s.seal();
            s.closing = true;
            s.written
        });
        if let Some(w) = written {
            if st.sched.available() < w {
                let _ = st.sched.extend(w);
            }
        }
        st.sched.close();
        st.app_waker = Some(cx.waker().clone());
        drop(st);
        sh.wake.notify_waiters();
        Poll::Pending
    }
}

impl<S> Drop for Sender<S> {
    fn drop(&mut self) {
        if let Some(d) = self.driver.take() {
            d.abort();
        }
    }
}

impl<S: Send + 'static> SendControl<S> {
    /// See [`Sender::add_connection`].
    pub fn add_connection(&self, conn: S) -> Result<usize, StripeError> {
        let mut st = self.shared.lock();
        if st.eof_sent || st.failed.is_some() || st.result.is_some() {
            return Err(StripeError::Finished);
        }
        let idx = st.sched.add_conn().map_err(|_| StripeError::StaticAdd)?;
        st.active += 1;
        st.stats.push(StreamStats::default());
        if let Some(e) = st.endgame.as_mut() {
            e.grow(idx);
        }
        // Sent while holding the lock so the driver cannot finish between
        // our registration and the hand-over.
        if self.tx.send((idx, conn)).is_err() {
            return Err(StripeError::Finished);
        }
        Ok(idx)
    }

    /// See [`Sender::stats`]; also after the transfer ended.
    pub fn stats(&self) -> Vec<StreamStats> {
        self.shared.lock().stats.clone()
    }

    /// Connections whose kernel says they wait now (bytes unacknowledged,
    /// in a timeout or silent: [`crate::Delivery::waiting`]): the ones to
    /// retire first when fewer are wanted. After a stall, a connection
    /// added to carry what they hold is the newest, and retiring the
    /// newest left only the waiting ones. Empty without the endgame (it
    /// keeps the probes).
    pub fn waiting(&self) -> Vec<usize> {
        let st = self.shared.lock();
        let Some(e) = st.endgame.as_ref() else {
            return Vec::new();
        };
        e.probes
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.as_ref()
                    .and_then(|p| p.delivery())
                    .is_some_and(|d| d.waiting())
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// See [`Sender::retire`].
    pub fn retire(&self, idx: usize) -> Result<(), StripeError> {
        self.shared
            .lock()
            .sched
            .retire(idx)
            .map_err(|_| StripeError::BadIndex(idx))?;
        self.shared.wake.notify_waiters();
        Ok(())
    }
}

async fn drive<S: AsyncWrite + DataSocket + Unpin + Send + 'static>(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<(usize, S)>,
) -> Result<Finished<S>, StripeError> {
    let mut set = Tasks::new();
    let mut open = true;
    let mut kept = Vec::new();
    let result = loop {
        let ended = shared.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        // In the endgame the transfer is over once every connection has
        // written its EOD (or been reset, its records delivered by
        // others): the connections go on sending copies of what stuck ones
        // hold, after the EOD, while the caller (the 226) goes ahead.
        let over_in_endgame = {
            let st = shared.lock();
            st.endgame.as_ref().is_some_and(|e| {
                st.active == 0
                    && st.ends_written == st.ends_taken
                    && ((st.eof_sent && st.lost_error.is_none()) || e.books.all_delivered())
            })
        };
        if set.is_empty() || over_in_endgame {
            let st = shared.lock();
            if (st.eof_sent && st.lost_error.is_none()) || over_in_endgame {
                let streams = st.stats.clone();
                let resent = st.endgame.as_ref().map_or(0, |e| e.resent);
                if resent > 0 {
                    tracing::debug!(bytes = resent, "endgame: bytes sent again");
                }
                // Over: every record was written whole (the EOF went out)
                // or every byte was acknowledged.
                let bytes = match &st.endgame {
                    Some(e) => e.payload,
                    None => streams.iter().map(|s| s.bytes).sum(),
                };
                break Ok(TransferReport {
                    bytes,
                    duplicate_bytes: resent,
                    streams,
                });
            }
            if let Some(e) = st.lost_error.clone() {
                // Every connection ended, and what a lost one carried was
                // not all delivered again (the receiver, which lost it too,
                // fails as well).
                break Err(e);
            }
            if !open {
                break Err(StripeError::NoConnections);
            }
        }
        let spawn = |idx, s| conn_task(s, idx, shared.clone());
        let event = tokio::select! {
            r = admit_or_reap(&mut rx, &mut open, &mut set, spawn) => r,
            () = &mut ended => continue,
        };
        match event {
            Ok(Some(Some(s))) => kept.push(s),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    let mut st = shared.lock();
    if let Err(e) = &result {
        tracing::debug!(error = %e, "striped send failed");
        st.failed = Some(e.clone());
    }
    let endgame = st.endgame.is_some();
    st.result = Some(result.clone());
    st.wake_app();
    drop(st);
    shared.wake.notify_waiters();
    if endgame && result.is_ok() && !set.is_empty() {
        // The endgame goes on past the EODs until every byte is delivered
        // (or the receiver, complete, closes the connections); bounded in
        // time in case neither happens.
        tokio::spawn(async move {
            let drain = async { while set.join_next().await.is_some() {} };
            let _ = tokio::time::timeout(ENDGAME_MAX, drain).await;
            if let Some(e) = shared.lock().endgame.as_mut() {
                e.probes.clear();
            }
        });
        return result.map(|r| (r, kept));
    }
    if let Some(e) = shared.lock().endgame.as_mut() {
        // The duplicates kept the sockets open for the endgame's questions.
        e.probes.clear();
    }
    // Dropping `set` aborts the other connection tasks and closes their
    // connections without EOD, so the receiver fails too.
    drop(set);
    result.map(|r| (r, kept))
}

enum Step {
    Record(u64, u64, Option<Bytes>),
    Wait,
    Aborted,
    End(Option<u64>),
}

/// One connection's task; ends with the connection itself when it is to
/// stay open ([`SendConfig::keep_open`]). The endgame may reset it.
async fn conn_task<S: AsyncWrite + DataSocket + Unpin>(
    mut s: S,
    idx: usize,
    sh: Arc<Shared>,
) -> Result<Option<S>, StripeError> {
    {
        let mut st = sh.lock();
        if let Some(e) = st.endgame.as_mut() {
            e.grow(idx);
            e.probes[idx] = s.probe();
            if e.probes[idx].is_none() {
                tracing::debug!(
                    conn = idx,
                    "no probe of this connection: the endgame trusts what it writes"
                );
                e.books.blind(idx);
            }
        }
    }
    let outcome = {
        let body = conn_body(&mut s, idx, &sh);
        tokio::pin!(body);
        tokio::select! {
            r = &mut body => Some(r),
            () = reset_ordered(&sh, idx) => None,
        }
    };
    let ended = |sh: &Shared| {
        if let Some(e) = sh.lock().endgame.as_mut() {
            e.ended[idx] = true;
        }
    };
    // In the endgame, a connection that fails once every byte is delivered
    // (the receiver, complete, closed it) has done its part; one that
    // fails before, while others go on, leaves its records to them.
    let outcome = match outcome {
        Some(Err(e @ StripeError::Io { conn: Some(_), .. })) if lose(&mut sh.lock(), idx, &e) => {
            tracing::debug!(
                conn = idx,
                "data connection lost: {e}; the others send what it carried"
            );
            sh.wake.notify_waiters();
            sh.ended.notify_one();
            Some(Ok(Ended::Lost))
        }
        Some(Err(e))
            if sh
                .lock()
                .endgame
                .as_ref()
                .is_some_and(|g| g.books.all_delivered()) =>
        {
            tracing::debug!(conn = idx, "after every byte was delivered: {e}");
            Some(Ok(Ended::Closed))
        }
        other => other,
    };
    if let Some(e) = sh.lock().endgame.as_mut() {
        e.gone[idx] = true;
    }
    match outcome {
        Some(Ok(Ended::Lost)) => {
            // (The probes are cleared once the transfer has ended, which
            // this connection's task may outlive.)
            if let Some(p) = sh
                .lock()
                .endgame
                .as_mut()
                .and_then(|e| e.probes.get_mut(idx))
            {
                *p = None;
            }
            Ok(None)
        }
        Some(Ok(Ended::Keep)) => {
            ended(&sh);
            Ok(Some(s))
        }
        Some(Ok(Ended::Closed)) => {
            ended(&sh);
            Ok(None)
        }
        Some(Err(e)) => {
            ended(&sh);
            Err(e)
        }
        Some(Ok(Ended::Reset)) | None => {
            // Stuck, and everything it held was delivered by others: a
            // reset rather than the wait for its timeouts (and its data).
            // Our duplicate of its socket goes first, so that dropping
            // the connection closes the socket.
            let probe = sh
                .lock()
                .endgame
                .as_mut()
                .and_then(|e| e.probes.get_mut(idx).and_then(Option::take));
            if let Some(p) = probe {
                p.reset_on_close();
            }
            Ok(None)
        }
    }
}

/// Connection `idx` failed (`err`): in the endgame of a file, while
/// bytes are still to be delivered and another connection goes on, it is
/// lost rather than the transfer. Everything it carried that no other
/// connection delivered is handed out again ([`Books::lost`]: a reset
/// also discards what the receiver's socket held unread), and the
/// receiver, which takes duplicates in the endgame, stores what it
/// lacks. Returns whether the connection was lost so (also before).
fn lose(st: &mut State, idx: usize, err: &StripeError) -> bool {
    let State {
        endgame,
        sched,
        active,
        ends_written,
        failed,
        stream,
        lost_error,
        ..
    } = st;
    let Some(e) = endgame.as_mut() else {
        return false;
    };
    if idx >= e.gone.len() || e.books.is_lost(idx) {
        return e.books.is_lost(idx);
    }
    let others = (0..e.gone.len())
        .filter(|&j| j != idx && !e.books.is_lost(j) && !e.gone[j] && !e.abort[j])
        .count();
    if failed.is_some() || stream.is_some() || others == 0 || e.books.all_delivered() {
        return false;
    }
    if !e.ended[idx] {
        e.ended[idx] = true;
        *active -= 1;
    } else if !e.wrote_end[idx] {
        // It had taken its end and not written it: the end is moot.
        *ends_written += 1;
    }
    let _ = sched.retire(idx);
    let again = e.books.lost(idx);
    for (a, z) in again.iter() {
        sched.give_back(a, z);
    }
    e.resent += again.covered();
    *lost_error = Some(err.clone());
    true
}

/// Ready once the endgame has marked connection `idx` to be reset.
async fn reset_ordered(sh: &Shared, idx: usize) {
    loop {
        let notified = sh.abort.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if sh
            .lock()
            .endgame
            .as_ref()
            .is_some_and(|e| e.abort.get(idx).copied().unwrap_or(false))
        {
            return;
        }
        notified.await;
    }
}

/// How a connection's task ended.
enum Ended {
    /// EOD sent; the connection stays open for the next transfer.
    Keep,
    /// EOD sent and the write side shut down.
    Closed,
    /// Reset by the endgame: stuck with copies delivered by others.
    Reset,
    /// Lost while others went on ([`lose`]).
    Lost,
}

/// The connection's records, then its end.
async fn conn_body<S: AsyncWrite + DataSocket + Unpin>(
    s: &mut S,
    idx: usize,
    sh: &Arc<Shared>,
) -> Result<Ended, StripeError> {
    let ioerr = |e: io::Error| StripeError::io(Some(idx), &e);
    let mut buf = Vec::new();
    loop {
        let notified = sh.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let step = {
            let mut st = sh.lock();
            if let Some(e) = &st.failed {
                return Err(StripeError::Aborted(e.to_string()));
            }
            if st.endgame.as_ref().is_some_and(|e| e.books.is_lost(idx)) {
                return Ok(Ended::Lost);
            }
            match st.sched.next(idx) {
                Next::Record { .. }
                    if st.sched.exhausted()
                        && sh.source_check.as_ref().is_some_and(|c| (c.0)()) =>
                {
                    return Err(StripeError::SourceChanged);
                }
                Next::Record { offset, len } => {
                    let payload = st.stream.as_mut().map(|sb| {
                        // Records leave the stream buffer in offset order
                        // because they are cut under this same lock.
                        debug_assert_eq!(sb.base, offset);
                        sb.take(len as usize)
                    });
                    if payload.is_some() {
                        st.wake_app();
                    }
                    Step::Record(offset, len, payload)
                }
                Next::Wait => Step::Wait,
                Next::Done => match st.endgame.as_ref() {
                    Some(e) if e.abort[idx] => Step::Aborted,
                    _ => end_step(&mut st, idx),
                },
            }
        };
        match step {
            Step::Record(offset, len, payload) => {
                match payload {
                    Some(b) => {
                        let hdr = BlockHeader::data(offset, len).encode();
                        write_block(s, &hdr, &b).await.map_err(ioerr)?;
                        sent(sh, idx, len, false);
                    }
                    None => buf = send_file_record(s, sh, idx, buf, offset, len, false).await?,
                }
                // Records are read in place now: a connection whose socket
                // takes everything at once (loopback, large buffers) would
                // otherwise keep its thread from record to record, and the
                // other connections (and tasks) on it would wait.
                tokio::task::yield_now().await;
            }
            Step::Wait => notified.await,
            Step::Aborted => return Ok(Ended::Reset),
            Step::End(eof) => {
                end_of_data(s, sh, idx, eof).await?;
                // In the endgame a connection goes on after its EOD (the
                // receiver takes copies after it): sending again what a
                // stuck connection holds, until every byte is delivered.
                if sh.lock().endgame.is_some() && s.probe().is_some() {
                    let (_, clear) = help(s, idx, sh, buf).await?;
                    if !clear {
                        // Itself stuck with copies delivered by others.
                        return Ok(Ended::Reset);
                    }
                }
                return close_connection(s, sh, idx).await;
            }
        }
    }
}

/// Send the record `[offset, offset + len)` of the source file on
/// connection `idx`, with its books (`copy`: the endgame's); returns
/// `buf` for reuse.
async fn send_file_record<S: AsyncWrite + DataSocket + Unpin>(
    s: &mut S,
    sh: &Arc<Shared>,
    idx: usize,
    buf: Vec<u8>,
    offset: u64,
    len: u64,
    copy: bool,
) -> Result<Vec<u8>, StripeError> {
    let hdr = BlockHeader::data(offset, len).encode();
    queued(sh, idx, hdr.len() as u64 + len, Some((offset, len)));
    let file = sh
        .file
        .clone()
        .ok_or(StripeError::Unsupported("no source"))?;
    let buf = send_record(s, sh, file, buf, &hdr, offset, len)
        .await
        .map_err(|e| match e {
            RecordError::Net(e) => StripeError::io(Some(idx), &e),
            RecordError::Source(e) => e,
        })?;
    sent(sh, idx, len, copy);
    Ok(buf)
}

/// A record of `len` payload bytes went out on `idx` (`copy`: one of the
/// endgame's).
fn sent(sh: &Shared, idx: usize, len: u64, copy: bool) {
    let mut st = sh.lock();
    if let Some(e) = st.endgame.as_mut() {
        e.books.written(idx, crate::block::HEADER_LEN as u64 + len);
        if copy {
            e.resent += len;
        }
    }
    if let Some(stat) = st.stats.get_mut(idx) {
        stat.bytes += len;
        stat.records += 1;
    }
}

/// Account for `bytes` about to be written on `idx` (a record, if any).
fn queued(sh: &Shared, idx: usize, bytes: u64, record: Option<(u64, u64)>) {
    let now = sh.born.elapsed();
    if let Some(e) = sh.lock().endgame.as_mut() {
        e.books.queued(idx, bytes, record, now);
    }
}

/// This connection ends: the last one to end sends the EOF block.
fn end_step(st: &mut State, idx: usize) -> Step {
    // Under the same lock as `active`: an endgame that resets the
    // connections not ended must not count this one again.
    if let Some(e) = st.endgame.as_mut() {
        e.ended[idx] = true;
    }
    st.active -= 1;
    st.ends_taken += 1;
    let last = st.active == 0 && st.sched.exhausted();
    if last {
        st.eof_sent = true;
    }
    Step::End(last.then(|| st.sched.conn_count() as u64))
}

/// Write the EOD (or, `eof`, the EOF block with the count).
async fn end_of_data<S: AsyncWrite + Unpin>(
    s: &mut S,
    sh: &Shared,
    idx: usize,
    eof: Option<u64>,
) -> Result<(), StripeError> {
    let ioerr = |e: io::Error| StripeError::io(Some(idx), &e);
    let hdr = match eof {
        Some(n) => BlockHeader::eof(n),
        None => BlockHeader::eod(),
    };
    queued(sh, idx, hdr.encode().len() as u64, None);
    s.write_all(&hdr.encode()).await.map_err(ioerr)?;
    s.flush().await.map_err(ioerr)?;
    let mut st = sh.lock();
    if let Some(e) = st.endgame.as_mut() {
        e.books.written(idx, hdr.encode().len() as u64);
        if std::mem::replace(&mut e.wrote_end[idx], true) || e.books.is_lost(idx) {
            // Counted when it was lost.
            return Ok(());
        }
    }
    st.ends_written += 1;
    drop(st);
    sh.ended.notify_one();
    Ok(())
}

/// After the EOD: keep the connection for the next transfer, or shut its
/// write side down.
async fn close_connection<S: AsyncWrite + Unpin>(
    s: &mut S,
    sh: &Shared,
    idx: usize,
) -> Result<Ended, StripeError> {
    if sh.keep_open {
        return Ok(Ended::Keep);
    }
    s.shutdown()
        .await
        .map_err(|e| StripeError::io(Some(idx), &e))?;
    Ok(Ended::Closed)
}

/// The longest the endgame goes on after the transfer's end.
const ENDGAME_MAX: std::time::Duration = std::time::Duration::from_secs(120);

/// How often a helping connection asks the kernel what the others have
/// delivered.
const ENDGAME_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The endgame on connection `idx`, past its EOD: send again the records
/// stuck connections hold, until every byte is delivered; then order the
/// connections stuck before their EOD to be reset. Returns the buffer and
/// whether this connection is clear to close (false: it holds copies in a
/// timeout itself, to be reset).
async fn help<S: AsyncWrite + DataSocket + Unpin>(
    s: &mut S,
    idx: usize,
    sh: &Arc<Shared>,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, bool), StripeError> {
    loop {
        observe(sh, false);
        if sh
            .lock()
            .endgame
            .as_ref()
            .is_some_and(|e| e.books.all_delivered())
        {
            // Who is clear is judged on fresh readings.
            observe(sh, true);
        }
        let claim = {
            let mut st = sh.lock();
            if let Some(e) = &st.failed {
                return Err(StripeError::Aborted(e.to_string()));
            }
            let State {
                endgame,
                active,
                sched,
                ..
            } = &mut *st;
            let Some(e) = endgame.as_mut() else {
                return Ok((buf, true));
            };
            if e.books.is_lost(idx) {
                return Ok((buf, true));
            }
            if let Some((offset, len)) = sched.next_leftover() {
                // What a lost connection carried.
                Some((offset, len, false))
            } else if e.books.all_delivered() {
                // Connections that have not reached their EOD are stuck
                // in the middle of a record delivered by others: reset
                // them (they would hold up the end). Those past it that
                // are not clear reset themselves (their own help ends so).
                let clear_self = e.books.is_clear(idx);
                let mut reset = 0;
                for j in 0..e.abort.len() {
                    if !e.ended[j] && !e.abort[j] {
                        e.abort[j] = true;
                        reset += 1;
                    }
                }
                *active -= reset;
                // Connections that ended (their EOD written) but whose
                // records still wait a timeout: reset them through our
                // duplicate of their socket, which is the last one left.
                for j in 0..e.probes.len() {
                    if e.ended[j] {
                        if let Some(p) = e.probes[j].take() {
                            if !e.books.is_clear(j) {
                                p.reset_on_close();
                            }
                        }
                    }
                }
                drop(st);
                if reset > 0 {
                    tracing::debug!(conns = reset, "endgame: stuck connections reset");
                    sh.abort.notify_waiters();
                    sh.ended.notify_one();
                }
                return Ok((buf, clear_self));
            } else if sched.exhausted() {
                // Only once every record is handed out: a connection that
                // was retired mid-transfer (fewer connections wanted) must
                // not add copies while the others still have new records
                // to send (on a lossy path some connection is nearly
                // always in a timeout, and those copies took half the
                // link).
                e.books.claim(idx).map(|(offset, len)| (offset, len, true))
            } else {
                None
            }
        };
        match claim {
            Some((offset, len, copy)) => {
                buf = send_file_record(s, sh, idx, buf, offset, len, copy).await?;
            }
            None => tokio::time::sleep(ENDGAME_POLL).await,
        }
    }
}

/// Ask every connection with undelivered records (with `all`, every
/// connection) what it has delivered, at most once per [`ENDGAME_POLL`]
/// whichever helper asks, unless `all`. The questions are system calls of
/// a few microseconds each, asked under the lock.
fn observe(sh: &Shared, all: bool) {
    let now = std::time::Instant::now();
    let at = sh.born.elapsed();
    let mut st = sh.lock();
    let Some(e) = st.endgame.as_mut() else {
        return;
    };
    if !all
        && e.last_observed
            .is_some_and(|t| now.duration_since(t) < ENDGAME_POLL)
    {
        return;
    }
    e.last_observed = Some(now);
    // Every tenth time, also the connections that hold nothing
    // undelivered: one reset then (a helper with nothing to send) lost
    // what its peer acknowledged and had not read yet.
    e.observations += 1;
    let sweep = all || e.observations % 10 == 0;
    let mut closed = Vec::new();
    for i in 0..e.probes.len() {
        if !sweep && !e.books.holds_undelivered(i) {
            continue;
        }
        let Some(d) = e.probes[i].as_ref().and_then(|p| p.delivery()) else {
            continue;
        };
        if d.closed && !e.books.is_lost(i) {
            closed.push(i);
            continue;
        }
        e.books.observe(i, d, at);
    }
    // A connection reset while its task waits (a helper with nothing to
    // send, its records acknowledged but perhaps not read) writes nothing
    // that would fail: the kernel's word is enough.
    let mut any = false;
    for i in closed {
        let err = StripeError::io(Some(i), &io::Error::from(io::ErrorKind::ConnectionReset));
        any |= lose(&mut st, i, &err);
    }
    drop(st);
    if any {
        sh.wake.notify_waiters();
        sh.ended.notify_one();
    }
}

/// Header and payload in as few system calls as the stream allows.
async fn write_block<S: AsyncWrite + Unpin>(s: &mut S, hdr: &[u8], data: &[u8]) -> io::Result<()> {
    let mut h = hdr;
    let mut d = data;
    while !h.is_empty() {
        let bufs = [io::IoSlice::new(h), io::IoSlice::new(d)];
        let n = s.write_vectored(&bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if n >= h.len() {
            d = &d[n - h.len()..];
            h = &[];
        } else {
            h = &h[n..];
        }
    }
    s.write_all(d).await
}

/// Where the page cache cannot be asked (see [`crate::sock::cached`]),
/// a read or a send that takes longer than this marks the source as slow
/// (a disk): see [`send_record`].
const SLOW_SOURCE: std::time::Duration = std::time::Duration::from_millis(20);

/// Why sending one record failed: the connection, or the source.
enum RecordError {
    Net(io::Error),
    Source(StripeError),
}

/// Send block header `hdr` and the record `[offset, offset + len)` of
/// `file` on `s`; returns `buf` for reuse.
///
/// A record in the page cache is read in place, by the connection's own
/// task: a read of 256 KiB from memory takes less than handing it to
/// another thread and waking the task again. On a plain TCP connection
/// the kernel even sends the file's pages itself (`sendfile(2)`,
/// [`DataSocket`]): no copy through user space at all. A record not in the
/// page cache (asked with `RWF_NOWAIT`) is read in the blocking pool, so
/// a slow disk never holds up the runtime's threads, which other
/// connections and sessions share.
async fn send_record<S: AsyncWrite + DataSocket + Unpin>(
    s: &mut S,
    sh: &Shared,
    file: Arc<dyn ReadAt>,
    mut buf: Vec<u8>,
    hdr: &[u8],
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, RecordError> {
    use std::sync::atomic::Ordering;
    let in_memory = match file.as_fd() {
        Some(fd) => crate::sock::cached(fd, offset, len),
        // Not a file (memory, a test double): nothing to wait for.
        None => Some(true),
    };
    let in_place = match in_memory {
        Some(c) => c,
        None => !sh.slow_source.load(Ordering::Relaxed),
    };
    let mark_slow = |took: std::time::Duration| {
        if in_memory.is_none() && took > SLOW_SOURCE {
            tracing::debug!("slow source: further reads of this transfer off the runtime");
            sh.slow_source.store(true, Ordering::Relaxed);
        }
    };
    if in_place && s.can_send_file() {
        if let Some(fd) = file.as_fd() {
            let mut longest = std::time::Duration::ZERO;
            let sent = crate::sock::send_all(s, hdr, fd, offset, len as usize, &mut longest)
                .await
                .map_err(RecordError::Net)?;
            if let crate::sock::SentFrom::FileEnded(at) = sent {
                return Err(RecordError::Source(StripeError::SourceShort {
                    at,
                    len: offset + len,
                }));
            }
            mark_slow(longest);
            return Ok(buf);
        }
    }
    if in_place {
        let t0 = std::time::Instant::now();
        buf = read_record(&*file, buf, offset, len).map_err(RecordError::Source)?;
        mark_slow(t0.elapsed());
    } else {
        buf = tokio::task::spawn_blocking(move || read_record(&*file, buf, offset, len))
            .await
            .unwrap_or_else(|e| Err(StripeError::Aborted(e.to_string())))
            .map_err(RecordError::Source)?;
    }
    write_block(s, hdr, &buf).await.map_err(RecordError::Net)?;
    Ok(buf)
}

/// Fill `buf` with `len` bytes of `file` at `offset` (blocking).
fn read_record(
    file: &dyn ReadAt,
    mut buf: Vec<u8>,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, StripeError> {
    buf.resize(len as usize, 0);
    let mut got = 0usize;
    while got < buf.len() {
        let at = offset + got as u64;
        match file.read_at(&mut buf[got..], at) {
            Ok(0) => {
                return Err(StripeError::SourceShort {
                    at,
                    len: offset + len,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StripeError::io(None, &e)),
        }
    }
    Ok(buf)
}

/// Send `len` bytes of `src` over `conns` and wait for the end. The
/// future does not borrow `cfg`.
pub fn send_file<S: AsyncWrite + DataSocket + Unpin + Send + 'static>(
    src: Arc<dyn ReadAt>,
    len: u64,
    conns: Vec<S>,
    cfg: &SendConfig,
) -> impl std::future::Future<Output = Result<TransferReport, StripeError>> + Send + 'static {
    let cfg = cfg.clone();
    async move { Sender::file(src, len, conns, &cfg).finish().await }
}
