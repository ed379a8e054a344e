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
}

impl Watchdog {
    /// A watchdog that fires after `limit` without progress.
    #[cfg(test)]
    pub fn new(limit: Duration) -> Arc<Watchdog> {
        Watchdog::counting(limit, None)
    }

    /// A watchdog whose guarded connections also count their bytes in
    /// `progress`.
    pub fn counting(limit: Duration, progress: Option<Arc<Progress>>) -> Arc<Watchdog> {
        Arc::new(Watchdog {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            limit,
            progress,
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
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

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                this.dog.touch();
                progress::add(&this.count, buf.filled().len().saturating_sub(before));
                Poll::Ready(r)
            }
            Poll::Pending => poll_stall(&this.dog, &mut this.read_sleep, cx).map(Err),
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
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
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
