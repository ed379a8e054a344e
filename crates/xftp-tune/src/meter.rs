//! Metering data connections: bytes moved and `TCP_INFO`, sampled at most
//! every [`SAMPLE_EVERY`] from inside the I/O path, so a controller can
//! read them without owning the sockets.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::tcpinfo::{self, TcpInfo};

/// How often a busy connection refreshes its `TCP_INFO`.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Counters of one connection.
#[derive(Debug)]
pub struct Meter {
    bytes: AtomicU64,
    born: Instant,
    last_us: AtomicU64,
    state: Mutex<State>,
}

/// The latest `TCP_INFO`, and the descriptor to refresh it from while the
/// connection is open (`None` once [`Metered`] is dropped: the descriptor
/// may then be closed and reused, so it is only read under this lock).
#[derive(Debug, Default)]
struct State {
    info: Option<TcpInfo>,
    /// The reading the last [`MeterSet::totals`] used.
    at_totals: Option<TcpInfo>,
    fd: Option<RawFd>,
    /// A duplicate taken when a sending connection was dropped with data
    /// still unacknowledged: the kernel goes on delivering it, and what
    /// it delivers is goodput (a closed sender's count would otherwise
    /// stop short, and the end of a transfer read as a stall). Closed when
    /// everything is acknowledged or the set is dropped.
    kept: Option<OwnedFd>,
}

impl Meter {
    fn new(fd: RawFd) -> Self {
        Meter {
            bytes: AtomicU64::new(0),
            born: Instant::now(),
            last_us: AtomicU64::new(0),
            state: Mutex::new(State {
                fd: Some(fd),
                ..State::default()
            }),
        }
    }

    /// Count `n` bytes; returns a `TCP_INFO` sample when one was taken.
    fn count(&self, n: usize, fd: RawFd) -> Option<TcpInfo> {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        let now = self.born.elapsed().as_micros() as u64;
        let last = self.last_us.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SAMPLE_EVERY.as_micros() as u64 || last == 0 {
            self.last_us.store(now.max(1), Ordering::Relaxed);
            if let Ok(i) = tcpinfo::read(&Fd(fd)) {
                if let Ok(mut g) = self.state.lock() {
                    g.info = Some(i);
                }
                return Some(i);
            }
        }
        None
    }

    /// Read `TCP_INFO` again if the connection is still open; with
    /// `close`, for the last time.
    fn refresh(&self, close: bool) {
        let Ok(mut g) = self.state.lock() else {
            return;
        };
        let Some(fd) = g.fd else {
            return;
        };
        if let Ok(i) = tcpinfo::read(&Fd(fd)) {
            g.info = Some(i);
        }
        // In flight: sent data not yet acknowledged (a receiver's own FIN
        // alone leaves `bytes_acked` at 0).
        let in_flight = g.info.is_some_and(|i| i.unacked > 0 && i.bytes_acked > 0);
        if close && g.kept.is_none() {
            g.fd = None;
            if in_flight {
                // SAFETY: `close` comes from `Metered::drop`, which owns
                // the open descriptor `fd` until it returns.
                let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
                if let Ok(dup) = borrowed.try_clone_to_owned() {
                    g.fd = Some(dup.as_raw_fd());
                    g.kept = Some(dup);
                }
            }
        } else if g.kept.is_some() && !in_flight {
            g.fd = None;
            g.kept = None;
        }
    }

    /// Bytes moved through this connection (payload and framing).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The latest `TCP_INFO` sample.
    pub fn info(&self) -> Option<TcpInfo> {
        self.state.lock().ok().and_then(|g| g.info)
    }

    /// The latest sample, and whether the receiver's window held the
    /// connection back since the previous call (its RTT then tells of
    /// the receiver, not of the path).
    fn info_for_totals(&self) -> Option<(TcpInfo, bool)> {
        let mut g = self.state.lock().ok()?;
        let i = g.info?;
        let limited = g.at_totals.is_some_and(|p| i.receiver_limited_since(&p));
        g.at_totals = Some(i);
        Some((i, limited))
    }
}

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A connection whose traffic is metered.
#[derive(Debug)]
pub struct Metered<S> {
    /// First, so that it drops first: its last reading of the connection
    /// is taken while the descriptor is still open.
    meter: LastWord,
    inner: S,
    fd: RawFd,
    /// The `TCP_NOTSENT_LOWAT` set on a sending connection, kept at one
    /// congestion window ([`crate::sockbuf::notsent_lowat_for`]); 0 for a
    /// connection left alone.
    lowat: u32,
}

impl<S> Metered<S> {
    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The connection, no longer metered (its meter takes its last
    /// reading now): for a connection kept open for the next transfer.
    pub fn into_inner(self) -> S {
        let Metered { meter, inner, .. } = self;
        drop(meter);
        inner
    }

    /// Bound this sending connection's unsent backlog to one congestion
    /// window, re-read as it writes, so that a connection slowed by loss
    /// takes records only as fast as it sends them.
    pub fn bound_backlog(mut self) -> Self {
        let want = crate::sockbuf::NOTSENT_LOWAT;
        match crate::sockbuf::set_notsent_lowat(&Fd(self.fd), want) {
            Ok(()) => self.lowat = want,
            Err(e) => tracing::debug!("TCP_NOTSENT_LOWAT: {e}"),
        }
        if let Err(e) = crate::sockbuf::set_thin_linear_timeouts(&Fd(self.fd)) {
            tracing::debug!("TCP_THIN_LINEAR_TIMEOUTS: {e}");
        }
        self
    }

    fn follow_window(&mut self, i: &TcpInfo) {
        let want = crate::sockbuf::notsent_lowat_for(i.snd_cwnd, i.snd_mss);
        if self.lowat != 0
            && want != self.lowat
            && crate::sockbuf::set_notsent_lowat(&Fd(self.fd), want).is_ok()
        {
            self.lowat = want;
        }
    }
}

/// A connection's meter, which takes its last reading when the metered
/// connection is dropped or unwrapped.
#[derive(Debug)]
struct LastWord(Arc<Meter>);

impl std::ops::Deref for LastWord {
    type Target = Meter;
    fn deref(&self) -> &Meter {
        &self.0
    }
}

impl Drop for LastWord {
    fn drop(&mut self) {
        // The last word on this connection (what it delivered in the end),
        // taken while the descriptor is still ours.
        self.0.refresh(true);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let n = buf.filled().len() - before;
            self.meter.count(n, self.fd);
        }
        r
    }
}

impl<S: xftp_stripe::DataSocket + Unpin> xftp_stripe::DataSocket for Metered<S> {
    fn can_send_file(&self) -> bool {
        self.inner.can_send_file()
    }

    fn probe(&self) -> Option<Box<dyn xftp_stripe::Probe>> {
        self.inner.probe()
    }

    fn can_splice_in(&self) -> bool {
        self.inner.can_splice_in()
    }

    fn poll_splice_in(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &xftp_stripe::Pipe,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_splice_in(cx, pipe, len);
        if let Poll::Ready(Ok(n)) = r {
            self.meter.count(n, self.fd);
        }
        r
    }

    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.tcp_socket()
    }

    fn poll_send_file(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hdr: &[u8],
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_send_file(cx, hdr, fd, offset, len);
        if let Poll::Ready(Ok(n)) = r {
            if let Some(i) = self.meter.count(n, self.fd) {
                self.follow_window(&i);
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            if let Some(i) = self.meter.count(n, self.fd) {
                self.follow_window(&i);
            }
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The meters of every connection of one transfer.
#[derive(Debug, Clone)]
pub struct MeterSet {
    meters: Arc<Mutex<Vec<Arc<Meter>>>>,
    born: Instant,
}

impl Default for MeterSet {
    fn default() -> Self {
        MeterSet {
            meters: Arc::default(),
            born: Instant::now(),
        }
    }
}

/// A sum over a transfer's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Connections metered so far.
    pub conns: usize,
    /// Bytes moved (payload and framing).
    pub bytes: u64,
    /// Mean smoothed RTT of the connections that have one, leaving out
    /// those the receiver's window held back since the previous totals
    /// ([`TcpInfo::receiver_limited_since`]); `None` if none is left.
    pub rtt: Option<Duration>,
    /// Smallest `min_rtt` of any connection.
    pub min_rtt: Option<Duration>,
    /// Segments retransmitted.
    pub retrans: u64,
    /// Segments sent.
    pub segs_out: u64,
    /// Bytes the peers acknowledged, in order or selectively
    /// ([`TcpInfo::delivered_bytes`], summed; 0 where the kernel does not
    /// say).
    /// Unlike the bytes acknowledged in order, it does not jump when a
    /// retransmission fills a hole, so it is the sender's goodput.
    pub delivered: u64,
    /// When these totals were taken, from the creation of the set.
    pub at: Option<Duration>,
}

impl MeterSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Meter `conn`.
    pub fn wrap<S: AsRawFd>(&self, conn: S) -> Metered<S> {
        let fd = conn.as_raw_fd();
        let meter = Arc::new(Meter::new(fd));
        if let Ok(mut m) = self.meters.lock() {
            m.push(meter.clone());
        }
        Metered {
            meter: LastWord(meter),
            inner: conn,
            fd,
            lowat: 0,
        }
    }

    /// Read every open connection's `TCP_INFO` now (the I/O path samples
    /// a connection only when it moves data, so a connection waiting in
    /// loss recovery would otherwise report its state from before).
    pub fn refresh(&self) {
        let Ok(m) = self.meters.lock() else {
            return;
        };
        for meter in m.iter() {
            meter.refresh(false);
        }
    }

    /// Sum the counters.
    pub fn totals(&self) -> Totals {
        let Ok(m) = self.meters.lock() else {
            return Totals::default();
        };
        let mut t = Totals {
            conns: m.len(),
            at: Some(self.born.elapsed()),
            ..Totals::default()
        };
        let (mut rtt_sum, mut rtt_n) = (Duration::ZERO, 0u32);
        for meter in m.iter() {
            t.bytes += meter.bytes();
            if let Some((i, receiver_limited)) = meter.info_for_totals() {
                t.retrans += u64::from(i.total_retrans);
                t.segs_out += u64::from(i.segs_out);
                t.delivered += i.delivered_bytes();
                if !i.rtt.is_zero() && !receiver_limited {
                    rtt_sum += i.rtt;
                    rtt_n += 1;
                }
                if !i.min_rtt.is_zero() {
                    t.min_rtt = Some(t.min_rtt.map_or(i.min_rtt, |x| x.min(i.min_rtt)));
                }
            }
        }
        if rtt_n > 0 {
            t.rtt = Some(rtt_sum / rtt_n);
        }
        t
    }
}

/// The machine-readable progress line a server sends for STAT during a
/// transfer (docs/protocol.md): `XFTP-PROGRESS bytes=.. conns=.. ...`.
pub fn format_progress(t: &Totals) -> String {
    let us = |d: Option<Duration>| d.map_or(0, |d| d.as_micros() as u64);
    format!(
        "XFTP-PROGRESS bytes={} conns={} rtt_us={} min_rtt_us={} retrans={} segs_out={} delivered={} t_us={}",
        t.bytes,
        t.conns,
        us(t.rtt),
        us(t.min_rtt),
        t.retrans,
        t.segs_out,
        t.delivered,
        us(t.at)
    )
}

/// Parse a progress line (any order of `key=value` words after the tag).
pub fn parse_progress(text: &str) -> Option<Totals> {
    let rest = text.trim().strip_prefix("XFTP-PROGRESS")?;
    let mut t = Totals::default();
    for word in rest.split_ascii_whitespace() {
        let (k, v) = word.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        let dur = |v: u64| (v > 0).then(|| Duration::from_micros(v));
        match k {
            "bytes" => t.bytes = v,
            "conns" => t.conns = v as usize,
            "rtt_us" => t.rtt = dur(v),
            "min_rtt_us" => t.min_rtt = dur(v),
            "retrans" => t.retrans = v,
            "segs_out" => t.segs_out = v,
            "delivered" => t.delivered = v,
            "t_us" => t.at = dur(v),
            _ => {}
        }
    }
    Some(t)
}

/// Fuzz entry: parse arbitrary text as a progress line. Must never panic;
/// what parses must format and parse back to the same totals.
#[doc(hidden)]
pub fn fuzz_progress(data: &[u8]) {
    if let Some(t) = std::str::from_utf8(data).ok().and_then(parse_progress) {
        assert_eq!(parse_progress(&format_progress(&t)), Some(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn progress_roundtrip() {
        let t = Totals {
            conns: 3,
            bytes: 99,
            rtt: Some(Duration::from_micros(1500)),
            min_rtt: Some(Duration::from_micros(1000)),
            retrans: 2,
            segs_out: 50,
            delivered: 70_000,
            at: Some(Duration::from_micros(2_000_500)),
        };
        assert_eq!(parse_progress(&format_progress(&t)), Some(t));
        assert_eq!(parse_progress("Transfer in progress"), None);
        assert_eq!(parse_progress("XFTP-PROGRESS bytes=x"), None);
    }

    proptest::proptest! {
        /// The fuzz entry on progress-shaped lines: keys known and not,
        /// values in and out of range.
        #[test]
        fn fuzz_entry_roundtrips(words in proptest::collection::vec("(bytes|conns|rtt_us|min_rtt_us|retrans|segs_out|delivered|t_us|x)=[0-9]{0,21}", 0..10)) {
            fuzz_progress(format!("XFTP-PROGRESS {}", words.join(" ")).as_bytes());
        }

        #[test]
        fn fuzz_entry_survives_any_bytes(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            fuzz_progress(&data);
        }
    }

    #[tokio::test]
    async fn meters_count_bytes_and_read_tcp_info() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        let set = MeterSet::new();
        let mut m = set.wrap(c);
        m.write_all(&[1u8; 100_000]).await.unwrap();
        m.shutdown().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        let t = set.totals();
        assert_eq!((t.conns, t.bytes), (1, 100_000));
        assert!(t.segs_out > 0, "{t:?}");
    }

    #[tokio::test]
    async fn a_bound_sender_keeps_one_window_of_backlog() {
        use crate::sockbuf::{notsent_lowat, notsent_lowat_for, NOTSENT_LOWAT};
        // Segments of 536 bytes: a first window of 10 is 5 KiB, so the
        // backlog falls to its floor as soon as a write samples TCP_INFO.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        crate::sockbuf::setopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_MAXSEG, 536).unwrap();
        let c = sock.connect(l.local_addr().unwrap()).await.unwrap();
        let (_s, _) = l.accept().await.unwrap();
        let set = MeterSet::new();
        let mut m = set.wrap(c).bound_backlog();
        assert_eq!(notsent_lowat(m.get_ref()).unwrap(), NOTSENT_LOWAT);
        assert!(crate::sockbuf::thin_linear_timeouts(m.get_ref()).unwrap());
        m.write_all(&[1u8; 1000]).await.unwrap();
        let i = m.meter.info().unwrap();
        let want = notsent_lowat_for(i.snd_cwnd, i.snd_mss);
        assert!(want < NOTSENT_LOWAT, "{i:?}");
        assert_eq!(notsent_lowat(m.get_ref()).unwrap(), want);
        // A connection not bound is left alone.
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (_s2, _) = l.accept().await.unwrap();
        let mut m = set.wrap(c);
        assert!(!crate::sockbuf::thin_linear_timeouts(m.get_ref()).unwrap());
        m.write_all(&[1u8; 1000]).await.unwrap();
        assert_eq!(notsent_lowat(m.get_ref()).unwrap(), 0);
    }

    /// Send `LEN` bytes through a metered loopback connection; returns
    /// the metered end, still open.
    async fn metered_send(set: &MeterSet) -> Metered<tokio::net::TcpStream> {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        let mut m = set.wrap(c);
        let write = async {
            m.write_all(&vec![7u8; LEN as usize]).await.unwrap();
            m.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let (_, r) = tokio::join!(write, s.read_to_end(&mut got));
        r.unwrap();
        assert_eq!(got.len() as u64, LEN);
        m
    }

    const LEN: u64 = 1_000_000;

    fn delivered_all(t: &Totals) -> bool {
        (LEN..LEN + LEN / 10).contains(&t.delivered)
    }

    /// Refresh `set` until it says everything was delivered, or 1 s has
    /// passed (an ACK can lag on a loaded host); returns the last totals.
    async fn refreshed_until_all_delivered(set: &MeterSet) -> Totals {
        let mut t = set.totals();
        for _ in 0..100 {
            set.refresh();
            t = set.totals();
            if delivered_all(&t) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        t
    }

    /// What the peer received is read from the kernel on demand and once
    /// more when the connection is dropped, not only when data is written
    /// (the I/O path's sample of the first write saw nothing delivered).
    #[tokio::test]
    async fn delivered_is_refreshed_on_demand_and_at_drop() {
        let set = MeterSet::new();
        let m = metered_send(&set).await;
        // Everything read was acknowledged before the reader saw EOF; give
        // the ACK a moment on a loaded host.
        let t = refreshed_until_all_delivered(&set).await;
        assert!(delivered_all(&t), "{t:?}");
        assert!(t.at.is_some());
        drop(m);

        // Dropped without a refresh: the drop took the last reading.
        let set = MeterSet::new();
        let m = metered_send(&set).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        drop(m);
        let t = set.totals();
        assert!(delivered_all(&t), "{t:?}");
        set.refresh();
        assert_eq!(set.totals().delivered, t.delivered);
    }

    /// A sender lets go of its connection with most of the data still
    /// unacknowledged (the peer has not read it, and its window is
    /// small): the kernel delivers it afterwards, and the count follows.
    #[tokio::test]
    async fn delivered_counts_what_a_dropped_sender_still_delivers() {
        let l = crate::sockbuf::listen("127.0.0.1:0".parse().unwrap(), Some(16 << 10)).unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        crate::sockbuf::apply(&c, 4 << 20).unwrap();
        let (s, _) = l.accept().await.unwrap();
        let set = MeterSet::new();
        let mut m = set.wrap(c);
        m.write_all(&vec![7u8; LEN as usize]).await.unwrap();
        m.shutdown().await.unwrap();
        drop(m);
        let before = set.totals().delivered;
        assert!(
            before < LEN / 2,
            "the peer could not have taken it all: {before}"
        );
        let mut s = s;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len() as u64, LEN);
        let t = refreshed_until_all_delivered(&set).await;
        assert!(delivered_all(&t), "{t:?}");
    }
}
