//! Metering data connections: bytes moved and `TCP_INFO`, sampled at most
//! every [`SAMPLE_EVERY`] from inside the I/O path, so a controller can
//! read them without owning the sockets.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
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
    info: Mutex<Option<TcpInfo>>,
}

impl Meter {
    fn new() -> Self {
        Meter {
            bytes: AtomicU64::new(0),
            born: Instant::now(),
            last_us: AtomicU64::new(0),
            info: Mutex::new(None),
        }
    }

    fn count(&self, n: usize, fd: RawFd) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        let now = self.born.elapsed().as_micros() as u64;
        let last = self.last_us.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= SAMPLE_EVERY.as_micros() as u64 || last == 0 {
            self.last_us.store(now.max(1), Ordering::Relaxed);
            if let Ok(i) = tcpinfo::read(&Fd(fd)) {
                if let Ok(mut g) = self.info.lock() {
                    *g = Some(i);
                }
            }
        }
    }

    /// Bytes moved through this connection (payload and framing).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The latest `TCP_INFO` sample.
    pub fn info(&self) -> Option<TcpInfo> {
        self.info.lock().ok().and_then(|g| *g)
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
    inner: S,
    fd: RawFd,
    meter: Arc<Meter>,
}

impl<S> Metered<S> {
    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.meter.count(n, self.fd);
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
#[derive(Debug, Clone, Default)]
pub struct MeterSet {
    meters: Arc<Mutex<Vec<Arc<Meter>>>>,
}

/// A sum over a transfer's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Connections metered so far.
    pub conns: usize,
    /// Bytes moved (payload and framing).
    pub bytes: u64,
    /// Mean smoothed RTT of the connections that have one.
    pub rtt: Option<Duration>,
    /// Smallest `min_rtt` of any connection.
    pub min_rtt: Option<Duration>,
    /// Segments retransmitted.
    pub retrans: u64,
    /// Segments sent.
    pub segs_out: u64,
}

impl MeterSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Meter `conn`.
    pub fn wrap<S: AsRawFd>(&self, conn: S) -> Metered<S> {
        let meter = Arc::new(Meter::new());
        if let Ok(mut m) = self.meters.lock() {
            m.push(meter.clone());
        }
        let fd = conn.as_raw_fd();
        Metered {
            inner: conn,
            fd,
            meter,
        }
    }

    /// Sum the counters.
    pub fn totals(&self) -> Totals {
        let Ok(m) = self.meters.lock() else {
            return Totals::default();
        };
        let mut t = Totals {
            conns: m.len(),
            ..Totals::default()
        };
        let (mut rtt_sum, mut rtt_n) = (Duration::ZERO, 0u32);
        for meter in m.iter() {
            t.bytes += meter.bytes();
            if let Some(i) = meter.info() {
                t.retrans += u64::from(i.total_retrans);
                t.segs_out += u64::from(i.segs_out);
                if !i.rtt.is_zero() {
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
        "XFTP-PROGRESS bytes={} conns={} rtt_us={} min_rtt_us={} retrans={} segs_out={}",
        t.bytes,
        t.conns,
        us(t.rtt),
        us(t.min_rtt),
        t.retrans,
        t.segs_out
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
            _ => {}
        }
    }
    Some(t)
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
        };
        assert_eq!(parse_progress(&format_progress(&t)), Some(t));
        assert_eq!(parse_progress("Transfer in progress"), None);
        assert_eq!(parse_progress("XFTP-PROGRESS bytes=x"), None);
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
}
