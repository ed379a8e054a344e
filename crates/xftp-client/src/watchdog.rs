//! Stall detection for the data connections of one transfer.
//!
//! A transfer is stalled when *no* connection has moved a byte for the
//! limit. The clock is shared: a connection that finished early and sits
//! idle while its siblings still move data is not a stall.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::progress::{self, Progress};

/// Shared "last progress" clock of one transfer.
#[derive(Debug)]
pub struct Watchdog {
    start: Instant,
    /// Milliseconds after `start` of the last progress on any connection.
    last_ms: AtomicU64,
    limit: Duration,
    /// Where each guarded connection's bytes are counted, if anywhere.
    progress: Option<Arc<Progress>>,
    /// The rate all guarded connections share (`--limit-rate`).
    rate: Option<Arc<RateLimit>>,
}

/// The smallest read or write a rate-limited connection makes
/// ([`RateLimit::allowance`]).
const MIN_CHUNK: usize = 8 * 1024;

/// A token bucket shared by every data connection of a client
/// (`--limit-rate`): bytes are debited after they moved, and a connection
/// whose next read or write would find the bucket in debt waits.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_sec: f64,
    burst: f64,
    st: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl RateLimit {
    /// At most `bytes_per_sec` on average, with bursts of 100 ms (at
    /// least 64 KiB).
    pub fn new(bytes_per_sec: u64) -> Arc<RateLimit> {
        let r = bytes_per_sec.max(1) as f64;
        Arc::new(RateLimit {
            bytes_per_sec: r,
            burst: (r / 10.0).max(65536.0),
            st: std::sync::Mutex::new((0.0, std::time::Instant::now())),
        })
    }

    fn refill(&self) -> std::sync::MutexGuard<'_, (f64, std::time::Instant)> {
        let mut g = self.st.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let dt = now.duration_since(g.1).as_secs_f64();
        g.0 = (g.0 + dt * self.bytes_per_sec).min(self.burst);
        g.1 = now;
        g
    }

    /// `n` bytes moved.
    pub fn debit(&self, n: usize) {
        self.refill().0 -= n as f64;
    }

    /// How long to wait before moving more, if at all.
    pub fn delay(&self) -> Option<Duration> {
        let t = self.refill().0;
        (t < 0.0).then(|| Duration::from_secs_f64(-t / self.bytes_per_sec))
    }

    /// The most the next read or write should move: what the bucket holds,
    /// at least [`MIN_CHUNK`]. Reads and writes of whatever a socket holds
    /// (hundreds of KiB each, on every connection at once) put the bucket
    /// seconds into debt: the connections then all wait, their receive
    /// windows closed, and resume together; 64 connections held to 2 MB/s
    /// moved 1.3 MB/s that way on a 100 ms path.
    pub fn allowance(&self) -> usize {
        let t = self.refill().0;
        (t.max(0.0) as usize).max(MIN_CHUNK)
    }

    /// Debit `n` and wait until the bucket is out of debt.
    pub async fn take(&self, n: usize) {
        self.debit(n);
        if let Some(d) = self.delay() {
            tokio::time::sleep(d).await;
        }
    }
}

impl Watchdog {
    /// A watchdog that fires after `limit` without progress.
    #[cfg(test)]
    pub fn new(limit: Duration) -> Arc<Watchdog> {
        Watchdog::with(limit, None, None)
    }

    /// A watchdog that counts in `progress` and holds every guarded
    /// connection to `rate`.
    pub fn with(
        limit: Duration,
        progress: Option<Arc<Progress>>,
        rate: Option<Arc<RateLimit>>,
    ) -> Arc<Watchdog> {
        Arc::new(Watchdog {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            limit,
            progress,
            rate,
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long no guarded connection has moved a byte.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    fn deadline(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + self.limit
    }

    /// Wrap one connection.
    pub fn guard<S>(self: &Arc<Self>, inner: S) -> Guarded<S> {
        let d = self.deadline();
        Guarded {
            inner,
            count: self.progress.as_ref().map(|p| p.counter()),
            throttle: Box::pin(tokio::time::sleep_until(Instant::now())),
            dog: self.clone(),
            read_sleep: Box::pin(tokio::time::sleep_until(d)),
            write_sleep: Box::pin(tokio::time::sleep_until(d)),
        }
    }
}

/// A connection whose pending reads and writes fail with `TimedOut` once
/// the whole transfer has stalled.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    count: Option<Arc<AtomicU64>>,
    /// The wait of `--limit-rate`.
    throttle: Pin<Box<Sleep>>,
    dog: Arc<Watchdog>,
    read_sleep: Pin<Box<Sleep>>,
    write_sleep: Pin<Box<Sleep>>,
}

fn poll_stall(
    dog: &Watchdog,
    sleep: &mut Pin<Box<Sleep>>,
    cx: &mut Context<'_>,
) -> Poll<io::Error> {
    loop {
        let d = dog.deadline();
        if sleep.deadline() != d {
            sleep.as_mut().reset(d);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(()) => {
                if dog.deadline() <= Instant::now() {
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no data moved on any connection for {:.1} s",
                            dog.limit.as_secs_f64()
                        ),
                    ));
                }
            }
        }
    }
}

/// Ready when the rate limit (if any) allows the next read or write.
fn poll_throttle(dog: &Watchdog, sleep: &mut Pin<Box<Sleep>>, cx: &mut Context<'_>) -> Poll<()> {
    let Some(rate) = &dog.rate else {
        return Poll::Ready(());
    };
    loop {
        let Some(d) = rate.delay() else {
            return Poll::Ready(());
        };
        sleep.as_mut().reset(Instant::now() + d);
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
    }
}

impl<S> Guarded<S> {
    /// The connection, unguarded: for one kept for the next transfer.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if poll_throttle(&this.dog, &mut this.throttle, cx).is_pending() {
            return Poll::Pending;
        }
        let allow = this.dog.rate.as_ref().map_or(usize::MAX, |r| r.allowance());
        let polled = if buf.remaining() > allow {
            let mut part = buf.take(allow);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut part);
            let n = part.filled().len();
            // SAFETY: `part` is `buf`'s unfilled part, and its first `n`
            // bytes were filled (so initialised) by the read.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
            polled.map(|r| r.map(|()| n))
        } else {
            let before = buf.filled().len();
            Pin::new(&mut this.inner)
                .poll_read(cx, buf)
                .map(|r| r.map(|()| buf.filled().len().saturating_sub(before)))
        };
        match polled {
            Poll::Ready(r) => {
                this.dog.touch();
                let n = *r.as_ref().unwrap_or(&0);
                progress::add(&this.count, n);
                if let Some(rate) = &this.dog.rate {
                    rate.debit(n);
                }
                Poll::Ready(r.map(drop))
            }
            Poll::Pending => poll_stall(&this.dog, &mut this.read_sleep, cx).map(Err),
        }
    }
}

impl<S: xftp_stripe::DataSocket + Unpin> xftp_stripe::DataSocket for Guarded<S> {
    fn can_send_file(&self) -> bool {
        // The rate limit paces writes by their size before they happen;
        // a file's pages go in whatever amount the socket takes.
        self.dog.rate.is_none() && self.inner.can_send_file()
    }

    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.tcp_socket()
    }

    fn probe(&self) -> Option<Box<dyn xftp_stripe::Probe>> {
        self.inner.probe()
    }

    fn can_splice_in(&self) -> bool {
        // The rate limit paces reads by their size (see poll_read).
        self.dog.rate.is_none() && self.inner.can_splice_in()
    }

    fn poll_splice_in(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &xftp_stripe::Pipe,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_splice_in(cx, pipe, len) {
            Poll::Ready(r) => {
                this.dog.touch();
                if let Ok(n) = &r {
                    progress::add(&this.count, *n);
                }
                Poll::Ready(r)
            }
            Poll::Pending => poll_stall(&this.dog, &mut this.read_sleep, cx).map(Err),
        }
    }

    fn poll_send_file(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hdr: &[u8],
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_send_file(cx, hdr, fd, offset, len) {
            Poll::Ready(r) => {
                this.dog.touch();
                if let Ok(n) = &r {
                    progress::add(&this.count, *n);
                }
                Poll::Ready(r)
            }
            Poll::Pending => poll_stall(&this.dog, &mut this.write_sleep, cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if poll_throttle(&this.dog, &mut this.throttle, cx).is_pending() {
            return Poll::Pending;
        }
        // As poll_read: what the bucket holds, not all that is offered.
        let allow = this.dog.rate.as_ref().map_or(usize::MAX, |r| r.allowance());
        let buf = &buf[..buf.len().min(allow)];
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                this.dog.touch();
                if let Ok(n) = &r {
                    progress::add(&this.count, *n);
                    if let Some(rate) = &this.dog.rate {
                        rate.debit(*n);
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending => poll_stall(&this.dog, &mut this.write_sleep, cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => poll_stall(&this.dog, &mut this.write_sleep, cx).map(Err),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => poll_stall(&this.dog, &mut this.write_sleep, cx).map(Err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_rate_limit_holds_the_average() {
        let rate = RateLimit::new(4_000_000);
        let dog = Watchdog::with(Duration::from_secs(5), None, Some(rate));
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut g = dog.guard(a);
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            while b.read(&mut buf).await.unwrap() > 0 {}
        });
        let t = std::time::Instant::now();
        let chunk = vec![7u8; 1 << 16];
        for _ in 0..32 {
            g.write_all(&chunk).await.unwrap();
        }
        drop(g);
        reader.await.unwrap();
        // 2 MiB at 4 MB/s: about 0.5 s (the first burst is free).
        let secs = t.elapsed().as_secs_f64();
        assert!(secs > 0.4, "too fast: {secs} s");
    }

    /// Reads and writes under a limit move what the bucket holds (at
    /// least MIN_CHUNK), never all a socket offers: the bucket's debt,
    /// and so every connection's wait, stays short.
    #[tokio::test]
    async fn a_limited_connection_moves_what_the_bucket_holds() {
        let rate = RateLimit::new(1_000_000);
        let dog = Watchdog::with(Duration::from_secs(5), None, Some(rate.clone()));
        let (a, mut b) = tokio::io::duplex(4 << 20);
        let mut g = dog.guard(a);
        b.write_all(&vec![1u8; 1 << 20]).await.unwrap();
        let mut buf = vec![0u8; 1 << 20];
        // The bucket starts empty: one chunk.
        let n = g.read(&mut buf).await.unwrap();
        assert_eq!(n, MIN_CHUNK);
        assert!(buf[..n].iter().all(|&x| x == 1));
        // Debt of at most a chunk: a wait of about 8 ms at 1 MB/s.
        let d = rate.delay().unwrap_or_default();
        assert!(d <= Duration::from_millis(10), "{d:?}");
        let w = g.write(&vec![2u8; 1 << 20]).await.unwrap();
        assert!(w <= rate.burst as usize, "{w}");
        let mut got = vec![0u8; w];
        b.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&x| x == 2));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_read_times_out() {
        let dog = Watchdog::new(Duration::from_secs(5));
        let (a, _b) = tokio::io::duplex(64);
        let mut g = dog.guard(a);
        let mut buf = [0u8; 8];
        let e = g.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_on_a_sibling_keeps_an_idle_connection_alive() {
        let dog = Watchdog::new(Duration::from_secs(5));
        let (a, _a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let mut idle = dog.guard(a);
        let mut busy = dog.guard(b);
        let feeder = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                b_peer.write_all(b"x").await.unwrap();
            }
            // then stop: the transfer stalls 5 s later
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            for _ in 0..4 {
                busy.read_exact(&mut buf).await.unwrap();
            }
        });
        let t0 = Instant::now();
        let mut buf = [0u8; 1];
        let e = idle.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // 4 bytes at 3 s intervals, then 5 s of silence.
        assert_eq!(t0.elapsed(), Duration::from_secs(17));
        reader.await.unwrap();
        feeder.abort();
    }
}
