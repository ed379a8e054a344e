//! The receiving half of the engine: blocks from N connections into a file
//! (positional writes) or into a bounded reorder buffer (ordered stream).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader, ReadBuf};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::block::{BlockHeader, Descriptor, HEADER_LEN};
use crate::driver::{admit_or_reap, Tasks};
use crate::ranges::RangeSet;
use crate::reasm::Reassembly;
use crate::{DataSocket, Pipe, StreamStats, StripeError, TransferReport, WriteAt};

/// Largest piece of a block read into memory at once when writing a file.
const FILE_CHUNK: usize = 256 * 1024;
/// Stream mode: the received part of a record is handed to the reader
/// once this much is in (or at the record's end) ...
const PUBLISH: usize = 256 * 1024;
/// ... or, when the socket has nothing more for now, once this much is in.
const PUBLISH_DRY: usize = 64 * 1024;
/// Read buffer per connection: headers are small, so batch the syscalls.
const READ_BUF: usize = 64 * 1024;

/// Ordered-stream buffer: received records not yet read by the
/// application, plus space reserved for records being read off a socket.
struct Reorder {
    cap: u64,
    max_block: u64,
    /// Reserved + filled bytes not yet consumed.
    buffered: u64,
    peak: u64,
    map: BTreeMap<u64, Bytes>,
    read_pos: u64,
    /// Every range ever admitted (coalesced, so small).
    admitted: RangeSet,
}

impl Reorder {
    /// Admission rule (see docs/psock.md): the record at the first offset
    /// not yet admitted may use the whole cap; any other record must leave
    /// room for one maximal block, so the in-order record always fits once
    /// the application has read what precedes it. "In order" is judged at
    /// each attempt: a record becomes in order while it waits.
    fn admit(&mut self, offset: u64, count: u64) -> bool {
        let in_order = self.admitted.contiguous_prefix() == offset;
        let limit = if in_order {
            self.cap
        } else {
            self.cap.saturating_sub(self.max_block)
        };
        if self.buffered + count <= limit {
            // Cannot overlap: the reassembly refused overlaps already.
            let _ = self.admitted.insert(offset, offset + count);
            self.buffered += count;
            self.peak = self.peak.max(self.buffered);
            true
        } else {
            false
        }
    }
}

struct State {
    reasm: Reassembly,
    /// With duplicates taken: the first connection failure, reported only
    /// if the transfer cannot complete without that connection.
    conn_failed: Option<StripeError>,
    /// With duplicates taken: payload bytes that arrived again and
    /// matched what was stored (the stats count bytes stored first).
    duplicates: u64,
    stats: Vec<StreamStats>,
    failed: Option<StripeError>,
    result: Option<Result<TransferReport, StripeError>>,
    reorder: Option<Reorder>,
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
    /// Reorder space freed, or failure.
    space: Notify,
    file: Option<Arc<dyn WriteAt>>,
    expected: Option<u64>,
    /// Connections stay open after their EOD, for the next transfer
    /// ([`Receiver::file_kept`]).
    keep_open: bool,
    /// Positional writes into `file`, one at a time.
    writer: Writer,
    /// The completion rule may hold: with duplicates taken it can while
    /// connections are still open (a stuck one), so the driver must not
    /// wait for them to end.
    maybe_done: Notify,
    /// Connection tasks running: a file's payload goes through a pipe
    /// only while there is one (see `conn_task`).
    running: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running striped receive. Dropping it aborts the transfer.
pub struct Receiver<S> {
    ctl: RecvControl<S>,
    driver: Option<JoinHandle<Result<Finished<S>, StripeError>>>,
}

/// A finished transfer and the connections it kept open.
type Finished<S> = (TransferReport, Vec<S>);

/// A cloneable handle to add connections to a running [`Receiver`].
pub struct RecvControl<S> {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<(usize, S)>,
}

impl<S> Clone for RecvControl<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            tx: self.tx.clone(),
        }
    }
}

impl<S: AsyncRead + DataSocket + Unpin + Send + 'static> Receiver<S> {
    /// Receive a file into `dst`, writing each record at its offset.
    /// `expected`: a size announced out of band, checked at the end.
    pub fn file(dst: Arc<dyn WriteAt>, expected: Option<u64>, conns: Vec<S>) -> Self {
        Self::start(Some(dst), expected, None, Reassembly::new(), conns, false)
    }

    /// [`file`](Self::file) over connections that stay open after their
    /// EOD (GridFTP data channel caching): each is read exactly up to its
    /// EOD, never beyond, so the next transfer's blocks that follow on it
    /// stay unread; [`finish_kept`](Self::finish_kept) hands them back.
    /// A connection that ends before its first byte is counted as unused
    /// (as in [`file`](Self::file)) and not handed back.
    pub fn file_kept(dst: Arc<dyn WriteAt>, expected: Option<u64>, conns: Vec<S>) -> Self {
        Self::start(Some(dst), expected, None, Reassembly::new(), conns, true)
    }

    /// Resume a file of which `have` is already in `dst`: the sender sends
    /// the rest ([`Sender::file_except`](crate::Sender::file_except)), and
    /// the transfer is complete when `have` and what arrived cover the
    /// file exactly.
    pub fn file_resume(
        dst: Arc<dyn WriteAt>,
        expected: Option<u64>,
        have: crate::ranges::RangeSet,
        conns: Vec<S>,
    ) -> Self {
        Self::start(
            Some(dst),
            expected,
            None,
            Reassembly::with_ranges(have),
            conns,
            false,
        )
    }

    /// The endgame's receive ([`crate::endgame`]): a file of `size` bytes
    /// of which `have` is already in `dst`, taking byte ranges that arrive
    /// more than once, also after a connection's EOD (the first copy is
    /// stored, every later one must match it, read back from `dst`:
    /// [`WriteAt::read_back`]), and complete once every byte is stored,
    /// even with connections still open or reset and without the EOF (a
    /// sender in the endgame resets connections stuck with copies). The
    /// connections still open are then read on in the background until
    /// the sender closes them (at most a minute). A connection that fails
    /// is an error only if the transfer cannot complete without it.
    pub fn file_endgame(
        dst: Arc<dyn WriteAt>,
        size: u64,
        have: crate::ranges::RangeSet,
        conns: Vec<S>,
    ) -> Self {
        let mut reasm = Reassembly::with_ranges(have);
        reasm.take_duplicates(size);
        Self::start(Some(dst), Some(size), None, reasm, conns, false)
    }

    /// Receive an ordered byte stream read with
    /// [`poll_read`](Self::poll_read). At most `cap` bytes are held
    /// (raised to two blocks); blocks larger than `max_block` are refused.
    pub fn stream(conns: Vec<S>, max_block: u32, cap: usize) -> Self {
        let group = conns.len() as u64;
        let max_block = u64::from(max_block.max(1));
        let ro = Reorder {
            cap: (cap as u64).max(2 * max_block),
            max_block,
            buffered: 0,
            peak: 0,
            map: BTreeMap::new(),
            read_pos: 0,
            admitted: RangeSet::new(),
        };
        // A fixed group: the sender's EOF block must name all of it (one
        // naming fewer ended the stream with the others' data unread),
        // and no connection joins later, so once all have ended without
        // completing, nothing can (it waited for ever).
        let mut reasm = Reassembly::new();
        reasm.require_connections(group);
        let mut r = Self::start(None, None, Some(ro), reasm, conns, false);
        r.ctl.tx = mpsc::unbounded_channel().0;
        r
    }

    fn start(
        file: Option<Arc<dyn WriteAt>>,
        expected: Option<u64>,
        reorder: Option<Reorder>,
        reasm: Reassembly,
        conns: Vec<S>,
        keep_open: bool,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                reasm,
                conn_failed: None,
                duplicates: 0,
                stats: Vec::new(),
                failed: None,
                result: None,
                reorder,
                app_waker: None,
            }),
            space: Notify::new(),
            file,
            expected,
            keep_open,
            writer: Writer::default(),
            maybe_done: Notify::new(),
            running: std::sync::atomic::AtomicUsize::new(0),
        });
        let ctl = RecvControl { shared, tx };
        for c in conns {
            // Cannot fail: the driver is not even started.
            let _ = ctl.add_connection(c);
        }
        let driver = tokio::spawn(drive(ctl.shared.clone(), rx));
        Self {
            ctl,
            driver: Some(driver),
        }
    }

    /// Add a data connection while the transfer runs; returns its index.
    pub fn add_connection(&self, conn: S) -> Result<usize, StripeError> {
        self.ctl.add_connection(conn)
    }

    /// A handle for adding connections from elsewhere.
    pub fn control(&self) -> RecvControl<S> {
        self.ctl.clone()
    }

    /// Payload bytes received so far, per connection.
    pub fn stats(&self) -> Vec<StreamStats> {
        self.ctl.shared.lock().stats.clone()
    }

    /// Stream mode: the most bytes the reorder buffer ever held, and its cap.
    pub fn reorder_usage(&self) -> (u64, u64) {
        let st = self.ctl.shared.lock();
        st.reorder.as_ref().map_or((0, 0), |r| (r.peak, r.cap))
    }

    /// Wait until the completion rule holds (success) or the transfer
    /// fails. Once every [`RecvControl`] is dropped, a transfer whose
    /// connections all ended without completing is an error.
    pub async fn finish(self) -> Result<TransferReport, StripeError> {
        self.finish_kept().await.map(|(report, _)| report)
    }

    /// [`finish`](Self::finish), and the connections of a
    /// [`file_kept`](Self::file_kept) receive, read up to their EOD and
    /// still open (none otherwise).
    pub async fn finish_kept(mut self) -> Result<(TransferReport, Vec<S>), StripeError> {
        let driver = self.driver.take();
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

    /// Stream mode: read in-order bytes. `Ok(())` with nothing filled is
    /// the end of the stream, only after the completion rule held.
    pub fn poll_read(&self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let sh = &self.ctl.shared;
        let mut st = sh.lock();
        let Some(ro) = st.reorder.as_mut() else {
            return Poll::Ready(Err(io::Error::other("not a stream receiver")));
        };
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some(mut e) = ro.map.first_entry() {
            if *e.key() == ro.read_pos {
                let b = e.get_mut();
                let n = b.len().min(out.remaining());
                out.put_slice(&b[..n]);
                if n == b.len() {
                    e.remove();
                } else {
                    let rest = b.slice(n..);
                    e.remove();
                    ro.map.insert(ro.read_pos + n as u64, rest);
                }
                ro.read_pos += n as u64;
                ro.buffered -= n as u64;
                drop(st);
                sh.space.notify_waiters();
                return Poll::Ready(Ok(()));
            }
        }
        if let Some(e) = &st.failed {
            return Poll::Ready(Err(e.to_io()));
        }
        if matches!(st.result, Some(Ok(_))) {
            return Poll::Ready(Ok(()));
        }
        st.app_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<S> Drop for Receiver<S> {
    fn drop(&mut self) {
        if let Some(d) = self.driver.take() {
            d.abort();
        }
    }
}

impl<S> RecvControl<S> {
    /// Fail at once when the sender announces more connections than
    /// `max` (its EOF block), instead of waiting for EODs that connections
    /// never taken would carry.
    pub fn limit_connections(&self, max: u64) {
        self.shared.lock().reasm.limit_connections(max);
    }
}

impl<S: Send + 'static> RecvControl<S> {
    /// See [`Receiver::add_connection`].
    pub fn add_connection(&self, conn: S) -> Result<usize, StripeError> {
        let mut st = self.shared.lock();
        if st.result.is_some() || st.failed.is_some() {
            return Err(StripeError::Finished);
        }
        let idx = st.reasm.add_conn();
        st.stats.push(StreamStats::default());
        if self.tx.send((idx, conn)).is_err() {
            return Err(StripeError::Finished);
        }
        Ok(idx)
    }
}

async fn drive<S: AsyncRead + DataSocket + Unpin + Send + 'static>(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<(usize, S)>,
) -> Result<Finished<S>, StripeError> {
    let mut set = Tasks::new();
    let mut open = true;
    let mut kept = Vec::new();
    let result = loop {
        let maybe_done = shared.maybe_done.notified();
        tokio::pin!(maybe_done);
        maybe_done.as_mut().enable();
        {
            let st = shared.lock();
            let (eods, eof) = st.reasm.eod_progress();
            // The completion rule can hold while connections that never
            // carried a block are still open (one added just as the sender
            // sent EOF): they cannot hold data, so stop waiting for them.
            // With no connection running, decide if nothing more can come.
            let ended = if st.reasm.takes_duplicates() {
                eof.is_some()
            } else {
                eof == Some(eods)
            };
            let idle_and_over = set.is_empty() && (ended || !open);
            if st.reasm.is_done() || idle_and_over {
                let verdict = st.reasm.finish(shared.expected);
                break match (verdict, &st.conn_failed) {
                    // Incomplete because a connection failed: say so.
                    (Err(_), Some(e)) => Err(e.clone()),
                    (v, _) => v.map(|_total| TransferReport {
                        bytes: st.stats.iter().map(|s| s.bytes).sum(),
                        duplicate_bytes: st.duplicates,
                        streams: st.stats.clone(),
                    }),
                };
            }
        }
        // Every connection lost and bytes still missing: a sender that
        // still meant to finish would have kept one. Unless one joins
        // within a moment, the transfer has failed; say so now rather than
        // when the session ends.
        let orphaned = if set.is_empty() {
            shared.lock().conn_failed.clone()
        } else {
            None
        };
        let spawn = |idx, s| conn_task_tolerant(s, idx, shared.clone());
        let event = tokio::select! {
            r = admit_or_reap(&mut rx, &mut open, &mut set, spawn) => r,
            () = &mut maybe_done => continue,
            () = tokio::time::sleep(ORPHAN_GRACE), if orphaned.is_some() => {
                break Err(orphaned.unwrap_or(StripeError::NoConnections));
            }
        };
        match event {
            Ok(Some(Some(s))) => kept.push(s),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    // Kept connections: every one that carried an EOD has read it once
    // the transfer is complete, so its task is ending; collect them. One
    // that carried nothing may never end: added as the sender finished,
    // it can sit open and unused (queued on the sender's listener), and is
    // dropped with the rest of `set` below.
    let result = match result {
        Ok(r) if shared.keep_open => loop {
            if kept.len() as u64 >= shared.lock().reasm.eod_progress().0 {
                break Ok(r);
            }
            match set.join_next().await {
                None => break Ok(r),
                Some(Ok(Ok(Some(s)))) => kept.push(s),
                Some(Ok(Ok(None))) => {}
                Some(Ok(Err(e))) => break Err(e),
                Some(Err(e)) => break Err(StripeError::Aborted(e.to_string())),
            }
        },
        other => other,
    };
    let mut st = shared.lock();
    if let Err(e) = &result {
        tracing::debug!(error = %e, "striped receive failed");
        st.failed = Some(e.clone());
    }
    if st.reasm.takes_duplicates() && result.is_ok() {
        // Connections handed over but not admitted yet (all of them, for
        // an empty file: complete before the first was read) are read
        // on with the others, not dropped under the sender.
        while let Ok((idx, s)) = rx.try_recv() {
            set.spawn(conn_task_tolerant(s, idx, shared.clone()));
        }
    }
    let linger = st.reasm.takes_duplicates() && result.is_ok() && !set.is_empty();
    st.result = Some(result.clone());
    st.wake_app();
    drop(st);
    shared.space.notify_waiters();
    if linger {
        // Complete before every connection ended (the endgame): the
        // sender may still be writing EODs and copies. Read on until it
        // closes them, rather than reset them under it (which would fail
        // its end of a transfer that succeeded); bounded in time.
        tokio::spawn(async move {
            let drain = async { while set.join_next().await.is_some() {} };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    } else {
        drop(set);
    }
    result.map(|r| (r, kept))
}

/// How long a complete receive goes on reading connections the sender has
/// not closed yet (see the end of `drive`).
const LINGER: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a receive that lost every connection waits for a new one
/// before it fails: a tolerant one (the endgame) that lost one with bytes
/// missing, or any that had one reset before its first byte (whose data,
/// if the sender used it, died unread with the reset).
const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// [`conn_task`]; with duplicates taken, a connection's own failure
/// (reset, closed early) is set aside: the others may still bring every
/// byte (a sender in the endgame resets connections stuck with copies).
async fn conn_task_tolerant<S: AsyncRead + DataSocket + Unpin>(
    s: S,
    idx: usize,
    sh: Arc<Shared>,
) -> Result<Option<S>, StripeError> {
    match conn_task(s, idx, sh.clone()).await {
        Err(e @ (StripeError::Io { conn: Some(_), .. } | StripeError::ClosedBeforeEod { .. })) => {
            let mut st = sh.lock();
            if !st.reasm.takes_duplicates() {
                return Err(e);
            }
            tracing::debug!(
                conn = idx,
                "data connection failed: {e}; the others may complete"
            );
            st.conn_failed.get_or_insert(e);
            Ok(None)
        }
        other => other,
    }
}

/// One connection's loop; ends with the connection itself when it is to
/// stay open ([`Receiver::file_kept`]).
async fn conn_task<S: AsyncRead + DataSocket + Unpin>(
    s: S,
    idx: usize,
    sh: Arc<Shared>,
) -> Result<Option<S>, StripeError> {
    use std::sync::atomic::Ordering;
    sh.running.fetch_add(1, Ordering::Relaxed);
    struct Running<'a>(&'a Shared);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            self.0.running.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _running = Running(&sh);
    // A file's payload goes from a plain TCP socket to the file through a
    // pipe, without a copy in user space (see `Pipe`), while this is the
    // only connection. With several, the writes into the file take turns
    // and are the limit: the copy path does half its copying (socket to
    // buffer) outside the turn, on other cores, and the write copies from
    // a buffer still in the cache; measured on loopback into tmpfs, four
    // connections moved 17.1 Gbit/s that way against 15.9 through pipes,
    // one connection 18.9 through a pipe against 12.2 (docs/datapath.md).
    // Headers are read exactly where a pipe may be used: a read-ahead
    // buffer would take part of the next payload the copying way.
    let pipe = match &sh.file {
        Some(_) if s.can_splice_in() => match Pipe::new() {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => {
                tracing::debug!(conn = idx, "no pipe, reading through a buffer: {e}");
                None
            }
        },
        _ => None,
    };
    // A kept connection is read exactly (no read-ahead buffer), so
    // nothing after its EOD is taken.
    let mut r = if sh.keep_open || pipe.is_some() {
        ConnReader::Exact(s)
    } else {
        ConnReader::Buffered(BufReader::with_capacity(READ_BUF, s))
    };
    let mut hdr = [0u8; HEADER_LEN];
    let mut chunk = Vec::new();
    let closed = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            StripeError::ClosedBeforeEod { conn: idx }
        } else {
            StripeError::io(Some(idx), &e)
        }
    };
    // A connection that ends before its first byte carried nothing: it
    // joined after the sender had finished, and was closed (FIN) or, still
    // queued on a listener the sender closed, reset. The EOF count still
    // decides whether every connection the sender used has ended: if this
    // one was used, the count cannot be met and the transfer fails.
    // Only for files: an ordered stream (psock) uses each connection in
    // both directions, and there a silent close is the peer going away.
    // Header bytes already read (a kept connection's first read).
    let mut have = 0;
    if sh.file.is_some() {
        let first = match &mut r {
            ConnReader::Buffered(b) => b.fill_buf().await.map(|buf| buf.len()),
            // Nothing may be read ahead of this transfer's blocks: the
            // first read goes into the header itself.
            ConnReader::Exact(s) => s.read(&mut hdr).await,
        };
        match first {
            Ok(0) => return sh.lock().reasm.on_unused(idx).map(|()| None),
            Ok(n) => {
                if matches!(r, ConnReader::Exact(_)) {
                    have = n;
                }
            }
            Err(e) => {
                tracing::debug!(
                    conn = idx,
                    "data connection failed before its first byte: {e}"
                );
                // A reset also discards what the socket held unread: the
                // sender may have used this connection. If the others end
                // without completing, this is why, and there is no point
                // in waiting on for its EOD (see ORPHAN_GRACE).
                let mut st = sh.lock();
                st.conn_failed
                    .get_or_insert_with(|| StripeError::io(Some(idx), &e));
                return st.reasm.on_unused(idx).map(|()| None);
            }
        }
    }
    // With duplicates taken the connection is read past its EOD (copies
    // may follow), until the sender closes it.
    let mut past_eod = false;
    loop {
        if past_eod && have == 0 {
            match r.read(&mut hdr[..1]).await {
                Ok(0) => return Ok(None),
                Ok(n) => have = n,
                Err(e) => return Err(closed(e)),
            }
        }
        r.read_exact(&mut hdr[have..]).await.map_err(closed)?;
        have = 0;
        let h = match BlockHeader::decode(&hdr) {
            Ok(Some(h)) => h,
            Ok(None) => return Err(StripeError::ClosedBeforeEod { conn: idx }),
            Err(source) => return Err(StripeError::Block { conn: idx, source }),
        };
        let acc = {
            let mut st = sh.lock();
            if let Some(e) = &st.failed {
                return Err(StripeError::Aborted(e.to_string()));
            }
            // With an announced size, refuse data beyond it before writing
            // anything (a hostile peer could otherwise grow the file).
            // (A count no sender cuts is refused as such below, not read
            // as the file's size: "received 4611686018427537904 bytes".)
            if let Some(e) = sh.expected {
                if !h.descriptor.contains(Descriptor::EOF)
                    && h.count > 0
                    && h.count <= crate::reasm::MAX_RECORD
                    && h.end() > e
                {
                    return Err(StripeError::SizeMismatch {
                        expected: e,
                        got: h.end(),
                    });
                }
            }
            if let Some(ro) = &st.reorder {
                if h.count > ro.max_block {
                    return Err(StripeError::BlockTooLarge {
                        count: h.count,
                        max: ro.max_block,
                    });
                }
            }
            let acc = st.reasm.on_header(idx, &h)?;
            if st.reasm.takes_duplicates() && st.reasm.is_done() {
                // The EOF after every byte was stored.
                sh.maybe_done.notify_one();
            }
            acc
        };
        if let Some((offset, count)) = acc.data {
            let alone = sh.running.load(Ordering::Relaxed) == 1;
            if let (Some(file), Some(pipe), ConnReader::Exact(s), true) =
                (&sh.file, &pipe, &mut r, alone)
            {
                let mut pos = 0u64;
                while pos < count {
                    let want = (count - pos).min(pipe.capacity() as u64) as usize;
                    let n = std::future::poll_fn(|cx| {
                        std::pin::Pin::new(&mut *s).poll_splice_in(cx, pipe, want)
                    })
                    .await
                    .map_err(closed)?;
                    if n == 0 {
                        return Err(StripeError::ClosedBeforeEod { conn: idx });
                    }
                    chunk = store_piped(&sh, file, pipe, chunk, n, offset + pos, idx).await?;
                    pos += n as u64;
                }
                let dup = sh.lock().reasm.takes_duplicates();
                block_stored(&sh, idx, if dup { 0 } else { count });
            } else if let Some(file) = &sh.file {
                let mut pos = 0u64;
                while pos < count {
                    let n = (count - pos).min(FILE_CHUNK as u64) as usize;
                    chunk.resize(n, 0);
                    r.read_exact(&mut chunk).await.map_err(closed)?;
                    chunk = store(&sh, file, chunk, offset + pos, idx).await?;
                    pos += n as u64;
                }
                // A block counts as stored (for the completion rule and
                // the stats) only once its last byte is written. With
                // duplicates taken, each piece counted the bytes it stored
                // first as it stored them (the rule then looks at the
                // bytes stored, and the report must agree with it).
                let dup = sh.lock().reasm.takes_duplicates();
                block_stored(&sh, idx, if dup { 0 } else { count });
            } else {
                reserve(&sh, offset, count).await?;
                // `count` ≤ max_block, checked above.
                let mut b = BytesMut::with_capacity(count as usize);
                // Bytes of the record not yet handed over; the first of
                // them is at `offset + count - left`.
                let mut left = count as usize;
                // Hand the received part of a record over as it arrives:
                // whenever a large piece is in, and whenever the socket runs
                // dry, so the reader is not held up for a whole record on a
                // slow connection. `split` keeps the remaining capacity: no
                // copy, no new allocation.
                let publish = |b: &mut BytesMut, left: &mut usize| {
                    let at = offset + count - *left as u64;
                    let piece = b.split().freeze();
                    *left -= piece.len();
                    let mut st = sh.lock();
                    if let Some(ro) = st.reorder.as_mut() {
                        ro.map.insert(at, piece);
                    }
                    st.wake_app();
                };
                while left > 0 {
                    // Reads straight into the record, no zeroing pass; large
                    // reads bypass the BufReader once it is empty.
                    let want = left - b.len();
                    let n = match poll_once(r.read_buf(&mut (&mut b).limit(want))).await {
                        Some(n) => n.map_err(closed)?,
                        None => {
                            if b.len() >= PUBLISH_DRY {
                                publish(&mut b, &mut left);
                            }
                            let want = left - b.len();
                            r.read_buf(&mut (&mut b).limit(want))
                                .await
                                .map_err(closed)?
                        }
                    };
                    if n == 0 {
                        return Err(StripeError::ClosedBeforeEod { conn: idx });
                    }
                    if b.len() == left || b.len() >= PUBLISH {
                        publish(&mut b, &mut left);
                    }
                }
            }
            if sh.file.is_none() {
                block_stored(&sh, idx, count);
            }
        }
        if acc.end && sh.lock().reasm.takes_duplicates() && !sh.keep_open {
            past_eod = true;
            continue;
        }
        if acc.end {
            return Ok(match r {
                ConnReader::Exact(s) => Some(s),
                ConnReader::Buffered(_) => None,
            });
        }
    }
}

/// A data connection as its task reads it: through a read-ahead buffer
/// (headers are small, so this batches system calls), or exactly as asked
/// when the connection outlives the transfer.
enum ConnReader<S> {
    Buffered(BufReader<S>),
    Exact(S),
}

impl<S: AsyncRead + Unpin> AsyncRead for ConnReader<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ConnReader::Buffered(b) => std::pin::Pin::new(b).poll_read(cx, buf),
            ConnReader::Exact(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

/// Wait until the reorder buffer admits `count` bytes.
async fn reserve(sh: &Shared, offset: u64, count: u64) -> Result<(), StripeError> {
    loop {
        let notified = sh.space.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut st = sh.lock();
            if let Some(e) = &st.failed {
                return Err(StripeError::Aborted(e.to_string()));
            }
            let admitted = match st.reorder.as_mut() {
                Some(ro) => ro.admit(offset, count),
                None => true,
            };
            if admitted {
                drop(st);
                // Another waiting record may be in order now.
                sh.space.notify_waiters();
                return Ok(());
            }
        }
        notified.await;
    }
}

fn block_stored(sh: &Shared, idx: usize, count: u64) {
    let mut st = sh.lock();
    st.reasm.on_payload_done();
    if let Some(stat) = st.stats.get_mut(idx) {
        stat.bytes += count;
        stat.records += 1;
    }
    if st.reasm.takes_duplicates() && st.reasm.is_done() {
        sh.maybe_done.notify_one();
    }
}

/// The file writes of one receive. A write into the page cache takes tens
/// of microseconds, less than handing it to another thread and waking the
/// task again (two thread wake-ups per chunk, the most expensive part of a
/// loopback receive after the copies), so chunks are written in place by
/// the connection task that read them. The writes take turns: concurrent
/// writes into one file serialise on its inode lock in the kernel anyway,
/// where the waiters spin (a tenth of the CPU of a 4-connection receive
/// into tmpfs went to that spinning). Once a write takes longer than
/// [`SLOW_WRITE`] (a throttled or slow disk), the rest of the transfer's
/// writes go to the blocking pool, so a slow disk never holds up the
/// runtime's threads (and with them other connections and sessions).
#[derive(Default)]
struct Writer {
    turn: Arc<Mutex<()>>,
    slow: std::sync::atomic::AtomicBool,
}

/// A write slower than this sends the rest of a transfer's writes to the
/// blocking pool (see [`Writer`]).
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(20);

/// Run `write` with the writer's turn held (see [`Writer`]): in place
/// while writes are fast, in the blocking pool once one was slow.
async fn in_turn<T: Send + 'static>(
    sh: &Arc<Shared>,
    write: impl FnOnce(&Shared) -> Result<T, StripeError> + Send + 'static,
) -> Result<T, StripeError> {
    use std::sync::atomic::Ordering;
    let w = &sh.writer;
    if !w.slow.load(Ordering::Relaxed) {
        let turn = w.turn.lock().unwrap_or_else(|p| p.into_inner());
        let t0 = std::time::Instant::now();
        let r = write(sh);
        drop(turn);
        if t0.elapsed() > SLOW_WRITE {
            tracing::debug!("slow storage: further writes of this transfer off the runtime");
            w.slow.store(true, Ordering::Relaxed);
        }
        return r;
    }
    let sh = sh.clone();
    tokio::task::spawn_blocking(move || {
        let _turn = sh.writer.turn.lock().unwrap_or_else(|p| p.into_inner());
        write(&sh)
    })
    .await
    .unwrap_or_else(|e| Err(StripeError::Aborted(e.to_string())))
}

/// Write all of `chunk` at `at` into `file` (see [`Writer`]); hands the
/// buffer back for reuse.
async fn store(
    sh: &Arc<Shared>,
    file: &Arc<dyn WriteAt>,
    chunk: Vec<u8>,
    at: u64,
    idx: usize,
) -> Result<Vec<u8>, StripeError> {
    let file = file.clone();
    in_turn(sh, move |sh| {
        store_piece(sh, &*file, &chunk, at, idx).map(|()| chunk)
    })
    .await
}

/// [`store`] for a piece of `len` bytes held in `pipe`: moved into the
/// file without passing through user space, except where duplicates are
/// taken and part of it is already stored (then it is read out into
/// `chunk` to be compared). Hands `chunk` back for reuse.
async fn store_piped(
    sh: &Arc<Shared>,
    file: &Arc<dyn WriteAt>,
    pipe: &Arc<Pipe>,
    chunk: Vec<u8>,
    len: usize,
    at: u64,
    idx: usize,
) -> Result<Vec<u8>, StripeError> {
    let (file, pipe) = (file.clone(), pipe.clone());
    in_turn(sh, move |sh| {
        store_from_pipe(sh, &*file, &pipe, chunk, len, at, idx)
    })
    .await
}

/// [`store_piece`] from a pipe, with the writer's turn held.
fn store_from_pipe(
    sh: &Shared,
    file: &dyn WriteAt,
    pipe: &Pipe,
    mut chunk: Vec<u8>,
    len: usize,
    at: u64,
    idx: usize,
) -> Result<Vec<u8>, StripeError> {
    let ioerr = |e: io::Error| StripeError::io(None, &e);
    let end = at + len as u64;
    let (dup, overlap) = {
        let st = sh.lock();
        let dup = st.reasm.takes_duplicates();
        (dup, dup && !st.reasm.stored_within(at, end).is_empty())
    };
    if overlap {
        chunk.resize(len, 0);
        pipe.read_exact(&mut chunk).map_err(ioerr)?;
        store_piece(sh, file, &chunk, at, idx)?;
        return Ok(chunk);
    }
    file.write_from_pipe(pipe, len, at).map_err(ioerr)?;
    if dup {
        let mut st = sh.lock();
        st.reasm.on_stored(at, end);
        if let Some(stat) = st.stats.get_mut(idx) {
            stat.bytes += len as u64;
        }
    }
    Ok(chunk)
}

/// One piece, with the writer's turn held: where duplicates are taken, the
/// parts already stored are compared with what is there instead of
/// written again, and the rest is written; connection `idx`'s stats count
/// the bytes it stored first.
fn store_piece(
    sh: &Shared,
    file: &dyn WriteAt,
    chunk: &[u8],
    at: u64,
    idx: usize,
) -> Result<(), StripeError> {
    let ioerr = |e: io::Error| StripeError::io(None, &e);
    let end = at + chunk.len() as u64;
    let (dup, present) = {
        let st = sh.lock();
        (st.reasm.takes_duplicates(), st.reasm.stored_within(at, end))
    };
    if !dup {
        return file.write_at(chunk, at).map_err(ioerr);
    }
    let mut pos = at;
    let mut fresh = 0u64;
    let mut first = Vec::new();
    for (a, b) in present {
        if pos < a {
            file.write_at(&chunk[(pos - at) as usize..(a - at) as usize], pos)
                .map_err(ioerr)?;
            fresh += a - pos;
        }
        first.resize((b - a) as usize, 0);
        file.read_back(&mut first, a).map_err(ioerr)?;
        if first[..] != chunk[(a - at) as usize..(b - at) as usize] {
            return Err(StripeError::DuplicateDiffers { start: a, end: b });
        }
        pos = b;
    }
    if pos < end {
        file.write_at(&chunk[(pos - at) as usize..], pos)
            .map_err(ioerr)?;
        fresh += end - pos;
    }
    let mut st = sh.lock();
    st.reasm.on_stored(at, end);
    st.duplicates += chunk.len() as u64 - fresh;
    if let Some(stat) = st.stats.get_mut(idx) {
        stat.bytes += fresh;
    }
    Ok(())
}

/// Receive a file over `conns` into `dst` and wait for the end.
/// `expected`: the size announced out of band, if any.
pub async fn recv_file<S: AsyncRead + DataSocket + Unpin + Send + 'static>(
    dst: Arc<dyn WriteAt>,
    conns: Vec<S>,
    expected: Option<u64>,
) -> Result<TransferReport, StripeError> {
    Receiver::file(dst, expected, conns).finish().await
}

/// Poll `f` once: its output if it is ready now, `None` if it would wait.
/// Dropping the future afterwards is fine for cancel-safe reads.
async fn poll_once<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        Poll::Ready(match f.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}
