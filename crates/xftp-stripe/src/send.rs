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
use crate::sched::{Next, Schedule, Scheduler};
use crate::{ReadAt, SendFile, StreamStats, StripeError, TransferReport, DEFAULT_RECORD_SIZE};

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
}

impl Default for SendConfig {
    fn default() -> Self {
        Self {
            record_size: DEFAULT_RECORD_SIZE,
            schedule: Schedule::Dynamic,
            keep_open: false,
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
    failed: Option<StripeError>,
    stats: Vec<StreamStats>,
    result: Option<Result<TransferReport, StripeError>>,
    app_waker: Option<Waker>,
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
    /// Reading the source took long once (a disk, not the page cache):
    /// from then on records are read in the blocking pool.
    slow_source: std::sync::atomic::AtomicBool,
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

impl<S: AsyncWrite + SendFile + Unpin + Send + 'static> Sender<S> {
    /// Start sending `len` bytes of `src` over `conns`.
    ///
    /// With [`Schedule::Static`] the connection set is fixed to `conns`.
    pub fn file(src: Arc<dyn ReadAt>, len: u64, conns: Vec<S>, cfg: &SendConfig) -> Self {
        let sched = match cfg.schedule {
            Schedule::Dynamic => Scheduler::dynamic(cfg.record_size, len),
            Schedule::Static => Scheduler::fixed(cfg.record_size, len, conns.len()),
        };
        Self::start(sched, None, Some(src), conns, cfg.keep_open)
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
        Self::start(sched, None, Some(src), conns, cfg.keep_open)
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
        Self::start(Scheduler::stream(rs), Some(sb), None, conns, false)
    }

    fn start(
        mut sched: Scheduler,
        stream: Option<StreamBuf>,
        file: Option<Arc<dyn ReadAt>>,
        conns: Vec<S>,
        keep_open: bool,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let n = conns.len();
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
                failed: None,
                stats: vec![StreamStats::default(); n],
                result: None,
                app_waker: None,
            }),
            wake: Notify::new(),
            file,
            keep_open,
            slow_source: Default::default(),
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
            Some(d) => d
                .await
                .unwrap_or_else(|e| Err(StripeError::Aborted(e.to_string()))),
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
        // Sent while holding the lock so the driver cannot finish between
        // our registration and the hand-over.
        if self.tx.send((idx, conn)).is_err() {
            return Err(StripeError::Finished);
        }
        Ok(idx)
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

async fn drive<S: AsyncWrite + SendFile + Unpin + Send + 'static>(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<(usize, S)>,
) -> Result<Finished<S>, StripeError> {
    let mut set = Tasks::new();
    let mut open = true;
    let mut kept = Vec::new();
    let result = loop {
        if set.is_empty() {
            let st = shared.lock();
            if st.eof_sent {
                let streams = st.stats.clone();
                break Ok(TransferReport {
                    bytes: streams.iter().map(|s| s.bytes).sum(),
                    streams,
                });
            }
            if !open {
                break Err(StripeError::NoConnections);
            }
        }
        let spawn = |idx, s| conn_task(s, idx, shared.clone());
        match admit_or_reap(&mut rx, &mut open, &mut set, spawn).await {
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
    st.result = Some(result.clone());
    st.wake_app();
    drop(st);
    shared.wake.notify_waiters();
    // Dropping `set` aborts the other connection tasks and closes their
    // connections without EOD, so the receiver fails too.
    drop(set);
    result.map(|r| (r, kept))
}

enum Step {
    Record(u64, u64, Option<Bytes>),
    Wait,
    End(Option<u64>),
}

/// One connection's loop; ends with the connection itself when it is to
/// stay open ([`SendConfig::keep_open`]).
async fn conn_task<S: AsyncWrite + SendFile + Unpin>(
    mut s: S,
    idx: usize,
    sh: Arc<Shared>,
) -> Result<Option<S>, StripeError> {
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
            match st.sched.next(idx) {
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
                Next::Done => {
                    st.active -= 1;
                    let last = st.active == 0 && st.sched.exhausted();
                    if last {
                        st.eof_sent = true;
                    }
                    Step::End(last.then(|| st.sched.conn_count() as u64))
                }
            }
        };
        match step {
            Step::Record(offset, len, payload) => {
                let hdr = BlockHeader::data(offset, len).encode();
                match payload {
                    Some(b) => write_block(&mut s, &hdr, &b).await.map_err(ioerr)?,
                    None => {
                        let file = sh
                            .file
                            .clone()
                            .ok_or(StripeError::Unsupported("no source"))?;
                        buf = send_record(&mut s, &sh, file, buf, &hdr, offset, len)
                            .await
                            .map_err(|e| match e {
                                RecordError::Net(e) => ioerr(e),
                                RecordError::Source(e) => e,
                            })?;
                    }
                }
                {
                    let mut st = sh.lock();
                    if let Some(stat) = st.stats.get_mut(idx) {
                        stat.bytes += len;
                        stat.records += 1;
                    }
                }
                // Records are read in place now: a connection whose socket
                // takes everything at once (loopback, large buffers) would
                // otherwise keep its thread from record to record, and the
                // other connections (and tasks) on it would wait.
                tokio::task::yield_now().await;
            }
            Step::Wait => notified.await,
            Step::End(eof) => {
                let hdr = match eof {
                    Some(n) => BlockHeader::eof(n),
                    None => BlockHeader::eod(),
                };
                s.write_all(&hdr.encode()).await.map_err(ioerr)?;
                s.flush().await.map_err(ioerr)?;
                if sh.keep_open {
                    return Ok(Some(s));
                }
                s.shutdown().await.map_err(ioerr)?;
                return Ok(None);
            }
        }
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

/// Where the page cache cannot be asked (see [`crate::zerocopy::cached`]),
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
/// [`SendFile`]): no copy through user space at all. A record not in the
/// page cache (asked with `RWF_NOWAIT`) is read in the blocking pool, so
/// a slow disk never holds up the runtime's threads, which other
/// connections and sessions share.
async fn send_record<S: AsyncWrite + SendFile + Unpin>(
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
        Some(fd) => crate::zerocopy::cached(fd, offset, len),
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
            let sent = crate::zerocopy::send_all(s, hdr, fd, offset, len as usize, &mut longest)
                .await
                .map_err(RecordError::Net)?;
            if let crate::zerocopy::SentFrom::FileEnded(at) = sent {
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
pub fn send_file<S: AsyncWrite + SendFile + Unpin + Send + 'static>(
    src: Arc<dyn ReadAt>,
    len: u64,
    conns: Vec<S>,
    cfg: &SendConfig,
) -> impl std::future::Future<Output = Result<TransferReport, StripeError>> + Send + 'static {
    let cfg = cfg.clone();
    async move { Sender::file(src, len, conns, &cfg).finish().await }
}
