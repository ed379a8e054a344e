//! End-to-end tests of the file engine over in-memory pipes and loopback TCP.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use xftp_stripe::{
    recv_file, send_file, MemFile, Receiver, Schedule, SendConfig, Sender, StripeError,
    TransferReport,
};

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn duplexes(n: usize) -> (Vec<DuplexStream>, Vec<DuplexStream>) {
    (0..n).map(|_| tokio::io::duplex(256 * 1024)).unzip()
}

async fn tcp_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..n {
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        a.push(c.unwrap());
        b.push(s.unwrap().0);
    }
    (a, b)
}

async fn roundtrip<S, R>(
    data: &[u8],
    tx: Vec<S>,
    rx: Vec<R>,
    cfg: &SendConfig,
) -> (TransferReport, TransferReport, Vec<u8>)
where
    S: AsyncWrite + xftp_stripe::DataSocket + Unpin + Send + 'static,
    R: AsyncRead + xftp_stripe::DataSocket + Unpin + Send + 'static,
{
    let src = Arc::new(MemFile::from(data.to_vec()));
    let dst = Arc::new(MemFile::default());
    let len = data.len() as u64;
    let (s, r) = tokio::join!(
        send_file(src, len, tx, cfg),
        recv_file(dst.clone(), rx, Some(len))
    );
    (s.unwrap(), r.unwrap(), dst.to_vec())
}

const RS: u32 = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_and_stream_counts_in_memory() {
    let rs = RS as usize;
    for &size in &[0, 1, rs - 1, rs, rs + 1, 3 * rs + 7] {
        for &n in &[1usize, 2, 3, 8, 64] {
            for schedule in [Schedule::Dynamic, Schedule::Static] {
                let data = pattern(size, size as u32 + n as u32);
                let (tx, rx) = duplexes(n);
                let cfg = SendConfig {
                    record_size: RS,
                    schedule,
                    keep_open: false,
                    endgame: false,
                    source_check: None,
                };
                let (s, r, got) = roundtrip(&data, tx, rx, &cfg).await;
                assert!(got == data, "size {size} n {n} {schedule:?}");
                assert_eq!(s.bytes, size as u64);
                assert_eq!(r.bytes, size as u64);
                assert_eq!(s.streams.len(), n);
                assert_eq!(s.streams, r.streams, "per-stream accounting agrees");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_file_over_loopback_tcp() {
    let data = pattern(20 * 1024 * 1024 + 13, 7);
    for &n in &[1usize, 2, 3, 8, 64] {
        let (tx, rx) = tcp_pairs(n).await;
        let (s, r, got) = roundtrip(&data, tx, rx, &SendConfig::default()).await;
        assert!(got == data, "n {n}");
        assert_eq!(s.streams.len(), n);
        assert_eq!(r.bytes, data.len() as u64);
        // Dynamic assignment uses every connection on a file this large.
        assert!(s.streams.iter().all(|st| st.records > 0) || n == 64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_size_edges_over_tcp_with_real_files() {
    let rs = xftp_stripe::DEFAULT_RECORD_SIZE as usize;
    for &size in &[0, 1, rs - 1, rs, rs + 1] {
        let data = pattern(size, 3);
        let dir = tempfile::tempdir().unwrap();
        let sp = dir.path().join("src");
        let dp = dir.path().join("dst");
        std::fs::write(&sp, &data).unwrap();
        let src = Arc::new(std::fs::File::open(&sp).unwrap());
        let dst = Arc::new(std::fs::File::create(&dp).unwrap());
        let (tx, rx) = tcp_pairs(3).await;
        let (s, r) = tokio::join!(
            send_file(src, size as u64, tx, &SendConfig::default()),
            recv_file(dst, rx, Some(size as u64))
        );
        s.unwrap();
        r.unwrap();
        assert!(std::fs::read(&dp).unwrap() == data, "size {size}");
    }
}

/// An AsyncWrite that lets through `rate` bytes per second.
struct Throttle<S> {
    inner: S,
    rate: u64,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

// Throttled writes go through poll_write.
impl<S> xftp_stripe::DataSocket for Throttle<S> {}

impl<S: AsyncWrite + Unpin> AsyncWrite for Throttle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let chunk = buf.len().min(4096);
        let r = Pin::new(&mut self.inner).poll_write(cx, &buf[..chunk]);
        if let Poll::Ready(Ok(n)) = r {
            let d = Duration::from_micros(n as u64 * 1_000_000 / self.rate);
            self.sleep = Some(Box::pin(tokio::time::sleep(d)));
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

use std::future::Future;

/// Either a plain or a throttled pipe (one type for the connection list).
enum Conn {
    Fast(DuplexStream),
    Slow(Throttle<DuplexStream>),
}

impl xftp_stripe::DataSocket for Conn {}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Fast(s) => Pin::new(s).poll_write(cx, b),
            Conn::Slow(s) => Pin::new(s).poll_write(cx, b),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Fast(s) => Pin::new(s).poll_flush(cx),
            Conn::Slow(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Fast(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Slow(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

async fn timed_with_slow_conn(schedule: Schedule, data: &[u8]) -> (Duration, TransferReport) {
    let (tx, rx) = duplexes(4);
    let tx: Vec<Conn> = tx
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            if i == 0 {
                Conn::Slow(Throttle {
                    inner: s,
                    rate: 2 * 1024 * 1024,
                    sleep: None,
                })
            } else {
                Conn::Fast(s)
            }
        })
        .collect();
    let cfg = SendConfig {
        record_size: 32 * 1024,
        schedule,
        keep_open: false,
        endgame: false,
        source_check: None,
    };
    let t = Instant::now();
    let (s, r, got) = roundtrip(data, tx, rx, &cfg).await;
    let el = t.elapsed();
    assert!(got == data);
    assert_eq!(r.bytes, data.len() as u64);
    (el, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_beats_static_with_one_slow_connection() {
    let data = pattern(3 * 1024 * 1024, 11);
    let (t_static, s_static) = timed_with_slow_conn(Schedule::Static, &data).await;
    let (t_dyn, s_dyn) = timed_with_slow_conn(Schedule::Dynamic, &data).await;
    // Static must push a quarter of the file through the slow connection.
    assert_eq!(s_static.streams[0].bytes, data.len() as u64 / 4);
    // Dynamic gives the slow connection less than its equal share ...
    assert!(s_dyn.streams[0].bytes < s_static.streams[0].bytes);
    // ... and so finishes sooner.
    assert!(t_dyn < t_static, "dynamic {t_dyn:?} static {t_static:?}");
}

/// Fails with ECONNRESET after `left` bytes, like a killed connection.
struct Killer<S> {
    inner: S,
    left: usize,
}

impl<S> xftp_stripe::DataSocket for Killer<S> {}

impl<S: AsyncWrite + Unpin> AsyncWrite for Killer<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.left == 0 {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        let n = buf.len().min(self.left);
        let r = Pin::new(&mut self.inner).poll_write(cx, &buf[..n]);
        if let Poll::Ready(Ok(k)) = r {
            self.left -= k;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_fails_both_ends() {
    let data = pattern(8 * 1024 * 1024, 5);
    let (tx, rx) = tcp_pairs(4).await;
    let tx: Vec<Killer<TcpStream>> = tx
        .into_iter()
        .enumerate()
        .map(|(i, s)| Killer {
            inner: s,
            // Connection 2 dies within its first block header, whatever
            // the dynamic scheduler gave it (it may carry a single record,
            // or only its EOD, so a later kill point was flaky).
            left: if i == 2 { 10 } else { usize::MAX },
        })
        .collect();
    let src = Arc::new(MemFile::from(data.clone()));
    let dst = Arc::new(MemFile::default());
    let (s, r) = tokio::join!(
        send_file(src, data.len() as u64, tx, &SendConfig::default()),
        recv_file(dst.clone(), rx, None)
    );
    let se = s.unwrap_err();
    assert!(matches!(se, StripeError::Io { conn: Some(2), .. }), "{se}");
    let re = r.unwrap_err();
    assert!(
        matches!(
            re,
            StripeError::ClosedBeforeEod { .. } | StripeError::Io { .. }
        ),
        "{re}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_vanishing_mid_transfer_fails_receiver() {
    // The receiver must not mistake a sender that simply stops for success.
    let data = pattern(1024 * 1024, 9);
    let (tx, rx) = tcp_pairs(2).await;
    // About 250 ms of sending at 2 x 2 MiB/s: dropped well before the end.
    let tx: Vec<_> = tx
        .into_iter()
        .map(|s| Throttle {
            inner: s,
            rate: 2 << 20,
            sleep: None,
        })
        .collect();
    let src = Arc::new(MemFile::from(data.clone()));
    let sender = Sender::file(src, data.len() as u64, tx, &SendConfig::default());
    let dst = Arc::new(MemFile::default());
    let recv = tokio::spawn(recv_file(dst, rx, None));
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(sender);
    let e = recv.await.unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            StripeError::ClosedBeforeEod { .. } | StripeError::Io { .. }
        ),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_retire_connections_mid_transfer() {
    let data = pattern(4 * 1024 * 1024, 21);
    let (mut tx, mut rx) = duplexes(4);
    let first_tx: Vec<_> = tx
        .drain(..2)
        .map(|s| Throttle {
            inner: s,
            rate: 8 << 20,
            sleep: None,
        })
        .collect();
    let first_rx: Vec<_> = rx.drain(..2).collect();
    let cfg = SendConfig {
        record_size: 16 * 1024,
        schedule: Schedule::Dynamic,
        keep_open: false,
        endgame: false,
        source_check: None,
    };
    let src = Arc::new(MemFile::from(data.clone()));
    let dst = Arc::new(MemFile::default());
    let sender = Sender::file(src, data.len() as u64, first_tx, &cfg);
    let receiver = Receiver::file(dst.clone(), Some(data.len() as u64), first_rx);
    tokio::time::sleep(Duration::from_millis(20)).await;
    for (t, r) in tx.into_iter().zip(rx) {
        let i = sender
            .add_connection(Throttle {
                inner: t,
                rate: 8 << 20,
                sleep: None,
            })
            .unwrap();
        let j = receiver.add_connection(r).unwrap();
        assert_eq!(i, j);
    }
    sender.retire(0).unwrap();
    let (s, r) = tokio::join!(sender.finish(), receiver.finish());
    let (s, r) = (s.unwrap(), r.unwrap());
    assert!(dst.to_vec() == data);
    assert_eq!(s.streams.len(), 4);
    assert_eq!(s.streams, r.streams);
    // Added connections really carried data.
    assert!(s.streams[2].bytes > 0 && s.streams[3].bytes > 0);
}

#[tokio::test]
async fn no_connections_is_an_error() {
    let src = Arc::new(MemFile::from(vec![1u8; 10]));
    let r = send_file::<DuplexStream>(src, 10, vec![], &SendConfig::default()).await;
    assert_eq!(r, Err(StripeError::NoConnections));
    let dst = Arc::new(MemFile::default());
    let r = recv_file::<DuplexStream>(dst, vec![], None).await;
    assert_eq!(r, Err(StripeError::MissingEof));
}

#[tokio::test]
async fn short_source_is_an_error_not_a_short_file() {
    let src = Arc::new(MemFile::from(vec![1u8; 10]));
    let (tx, rx) = duplexes(2);
    let dst = Arc::new(MemFile::default());
    let (s, r) = tokio::join!(
        send_file(src, 100, tx, &SendConfig::default()),
        recv_file(dst, rx, None)
    );
    assert!(matches!(
        s,
        Err(StripeError::SourceShort { at: 10, len: 100 })
    ));
    assert!(r.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_plus_13_file_over_tcp() {
    let size = 100 * 1024 * 1024 + 13;
    let data = pattern(size, 77);
    let dir = tempfile::tempdir().unwrap();
    let sp = dir.path().join("src");
    let dp = dir.path().join("dst");
    std::fs::write(&sp, &data).unwrap();
    let src = Arc::new(std::fs::File::open(&sp).unwrap());
    let dst = Arc::new(std::fs::File::create(&dp).unwrap());
    let (tx, rx) = tcp_pairs(8).await;
    let (s, r) = tokio::join!(
        send_file(src, size as u64, tx, &SendConfig::default()),
        recv_file(dst, rx, Some(size as u64))
    );
    assert_eq!(s.unwrap().bytes, size as u64);
    assert_eq!(r.unwrap().bytes, size as u64);
    assert!(std::fs::read(&dp).unwrap() == data);
}

#[tokio::test]
async fn data_beyond_the_announced_size_is_refused_before_writing() {
    use tokio::io::AsyncWriteExt;
    use xftp_stripe::block::BlockHeader;
    let (mut tx, rx) = tokio::io::duplex(1024);
    let dst = Arc::new(MemFile::default());
    let recv = tokio::spawn(recv_file(dst.clone(), vec![rx], Some(10)));
    tx.write_all(&BlockHeader::data(1 << 40, 4).encode())
        .await
        .unwrap();
    tx.write_all(b"evil").await.unwrap();
    let r = recv.await.unwrap();
    assert_eq!(
        r,
        Err(StripeError::SizeMismatch {
            expected: 10,
            got: (1 << 40) + 4
        })
    );
    assert!(dst.to_vec().is_empty(), "nothing may be written");
}

/// A connection the receiver has but the sender never used (it joined
/// just as the sender sent EOF) must not fail or stall the transfer,
/// whether it stays open or closes without a byte.
#[tokio::test]
async fn late_unused_connection_is_ignored() {
    use std::sync::Arc;
    use xftp_stripe::{MemFile, Receiver, SendConfig};
    // Also when the receiver keeps its connections for the next file
    // (`file_kept`): it hands back those that carried an EOD, and does not
    // wait for one that carried nothing and stays open (an xftp server's
    // connect that the client, done, left queued on its listener).
    for (close_it, kept) in [(false, false), (true, false), (false, true), (true, true)] {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let (mut tx, mut rx) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let (a, b) = tokio::io::duplex(64 * 1024);
            tx.push(a);
            rx.push(b);
        }
        let (late_far, late_near) = tokio::io::duplex(1024);
        rx.push(late_near);
        let dst = Arc::new(MemFile::default());
        let recv = if kept {
            Receiver::file_kept(dst.clone(), Some(data.len() as u64), rx)
        } else {
            Receiver::file(dst.clone(), Some(data.len() as u64), rx)
        };
        let cfg = SendConfig {
            record_size: 8192,
            keep_open: kept,
            ..SendConfig::default()
        };
        let src = Arc::new(MemFile::from(data.clone()));
        let sent = xftp_stripe::send_file(src, data.len() as u64, tx, &cfg)
            .await
            .unwrap();
        let keep = if close_it {
            drop(late_far);
            None
        } else {
            Some(late_far)
        };
        let (rep, back) =
            tokio::time::timeout(std::time::Duration::from_secs(10), recv.finish_kept())
                .await
                .expect("receiver must not hang")
                .unwrap();
        assert_eq!(rep.bytes, sent.bytes);
        assert_eq!(dst.to_vec(), data);
        assert_eq!(back.len(), if kept { 2 } else { 0 }, "kept: {kept}");
        drop(keep);
    }
}

/// A connection the sender never used may also die with a reset before
/// its first byte (the sender's listener closed with it still queued):
/// that carried nothing either, and the EOF count still decides. The
/// reset arrives while the transfer is still running.
#[tokio::test]
async fn unused_connection_reset_before_its_first_byte_is_ignored() {
    let data = pattern(2 << 20, 11);
    let (tx, mut rx) = tcp_pairs(2).await;
    let (far, near) = tcp_pairs(1).await;
    rx.extend(near);
    for f in far {
        // Linger 0: close with RST instead of FIN.
        socket2::SockRef::from(&f)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(f);
    }
    let dst = Arc::new(MemFile::default());
    let recv = Receiver::file(dst.clone(), Some(data.len() as u64), rx);
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let src = Arc::new(MemFile::from(data.clone()));
    let (sent, got) = tokio::join!(
        send_file(src, data.len() as u64, tx, &cfg),
        tokio::time::timeout(Duration::from_secs(20), recv.finish())
    );
    let got = got.expect("receiver must not hang").unwrap();
    assert_eq!(got.bytes, sent.unwrap().bytes);
    assert_eq!(dst.to_vec(), data);
}

/// Ordered stream: the part of a large record that has arrived is readable
/// before the rest of the record is sent (a slow connection does not hold
/// the reader up for a whole record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reader_gets_a_partial_record_before_the_rest_arrives() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use xftp_stripe::block::BlockHeader;
    use xftp_stripe::Receiver;
    let record = 4 << 20;
    let (mut tx, rx) = tokio::io::duplex(1 << 20);
    let r = Receiver::stream(vec![rx], record, 16 << 20);
    let data = pattern(record as usize, 3);
    tx.write_all(&BlockHeader::data(0, u64::from(record)).encode())
        .await
        .unwrap();
    let first = 300 * 1024;
    tx.write_all(&data[..first]).await.unwrap();
    let mut got = vec![0u8; first];
    let mut reader = ReadStream(r);
    tokio::time::timeout(Duration::from_secs(10), reader.read_exact(&mut got))
        .await
        .expect("the first part of the record was not delivered before the rest was sent")
        .unwrap();
    assert_eq!(got, data[..first]);
    tx.write_all(&data[first..]).await.unwrap();
    let mut rest = vec![0u8; data.len() - first];
    reader.read_exact(&mut rest).await.unwrap();
    assert_eq!(rest, data[first..]);
}

struct ReadStream(xftp_stripe::Receiver<DuplexStream>);

impl AsyncRead for ReadStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.poll_read(cx, buf)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_transfer_sends_only_the_holes() {
    use xftp_stripe::ranges::RangeSet;
    use xftp_stripe::WriteAt;
    let data = pattern(1_000_003, 77);
    let len = data.len() as u64;
    // Holes anywhere: the head, two in the middle, the tail.
    let mut have = RangeSet::new();
    for (a, b) in [
        (5_000u64, 200_000u64),
        (200_001, 700_000),
        (800_000, 990_000),
    ] {
        have.insert(a, b).unwrap();
    }
    for n in [1usize, 3, 8] {
        let dst = Arc::new(MemFile::default());
        for (a, b) in have.iter() {
            dst.write_at(&data[a as usize..b as usize], a).unwrap();
        }
        let (tx, rx) = duplexes(n);
        let cfg = SendConfig {
            record_size: 16 * 1024,
            schedule: Schedule::Dynamic,
            keep_open: false,
            endgame: false,
            source_check: None,
        };
        let src = Arc::new(MemFile::from(data.clone()));
        let sender = Sender::file_except(src, len, &have, tx, &cfg);
        let receiver = Receiver::file_resume(dst.clone(), Some(len), have.clone(), rx);
        let (s, r) = tokio::join!(sender.finish(), receiver.finish());
        let (s, r) = (s.unwrap(), r.unwrap());
        assert_eq!(dst.to_vec(), data, "n {n}");
        let missing: u64 = have.missing(len).iter().map(|(a, b)| b - a).sum();
        assert_eq!(s.bytes, missing, "sent only the holes");
        assert_eq!(r.bytes, missing);
    }
    // A sender that resends what the receiver has is refused, not
    // written over the data in place.
    let dst = Arc::new(MemFile::default());
    let (tx, rx) = duplexes(2);
    let src = Arc::new(MemFile::from(data.clone()));
    let sender = Sender::file(src, len, tx, &SendConfig::default());
    let receiver = Receiver::file_resume(dst, Some(len), have.clone(), rx);
    let (_, r) = tokio::join!(sender.finish(), receiver.finish());
    assert!(r.is_err(), "overlap with the resumed ranges accepted");
}

/// Data channel caching: many files back to back over the same
/// connections, the sender never waiting for the receiver (as a server
/// answering pipelined RETRs does), each file read exactly to its EODs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_carry_many_files_back_to_back() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    println!("seed {seed}");
    for n in [1usize, 3] {
        let mut x = u64::from(seed) | 1;
        let files: Vec<Vec<u8>> = (0..25u32)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Empty, smaller than a record, and several records.
                let len = match i % 5 {
                    0 => 0,
                    _ => (x >> 33) as usize % (3 * RS as usize + 7),
                };
                pattern(len, seed ^ i)
            })
            .collect();
        let (tx, rx) = tcp_pairs(n).await;
        let cfg = SendConfig {
            record_size: RS,
            keep_open: true,
            ..SendConfig::default()
        };
        let sent = files.clone();
        let sender = tokio::spawn(async move {
            let mut conns = tx;
            for f in sent {
                let len = f.len() as u64;
                let s = Sender::file(Arc::new(MemFile::from(f)), len, conns, &cfg);
                let (_, back) = s.finish_kept().await.unwrap();
                assert_eq!(back.len(), n, "every connection comes back");
                conns = back;
            }
            conns
        });
        let mut conns = rx;
        for (i, f) in files.iter().enumerate() {
            let dst = Arc::new(MemFile::default());
            let r = Receiver::file_kept(dst.clone(), Some(f.len() as u64), conns);
            let (rep, back) = r.finish_kept().await.unwrap();
            assert_eq!(rep.bytes, f.len() as u64, "file {i}");
            assert_eq!(dst.to_vec(), *f, "file {i} (n = {n})");
            assert_eq!(back.len(), n);
            conns = back;
        }
        // Nothing beyond the last EOD: the sender's connections end cleanly.
        drop(sender.await.unwrap());
        for mut c in conns {
            let mut rest = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut c, &mut rest)
                .await
                .unwrap();
            assert!(rest.is_empty(), "bytes left after the last file");
        }
    }
}

/// Storage whose first write is slow (a throttled disk), recording the
/// thread of every write.
struct SlowFirstWrite {
    inner: MemFile,
    threads: std::sync::Mutex<Vec<std::thread::ThreadId>>,
}

impl xftp_stripe::WriteAt for SlowFirstWrite {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut t = self.threads.lock().unwrap();
        if t.is_empty() {
            std::thread::sleep(Duration::from_millis(60));
        }
        t.push(std::thread::current().id());
        drop(t);
        self.inner.write_at(buf, offset)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn after_a_slow_write_the_rest_leave_the_runtime_thread() {
    let data = pattern(2 * 1024 * 1024, 11);
    let (tx, rx) = duplexes(3);
    let dst = Arc::new(SlowFirstWrite {
        inner: MemFile::default(),
        threads: Default::default(),
    });
    let cfg = SendConfig {
        record_size: RS,
        ..SendConfig::default()
    };
    let src = Arc::new(MemFile::from(data.clone()));
    let (s, r) = tokio::join!(
        send_file(src, data.len() as u64, tx, &cfg),
        recv_file(dst.clone(), rx, Some(data.len() as u64))
    );
    s.unwrap();
    r.unwrap();
    assert_eq!(dst.inner.to_vec(), data);
    let threads = dst.threads.lock().unwrap();
    let here = std::thread::current().id();
    // The first write ran in place, on the runtime's only thread; every
    // later one in the blocking pool.
    assert_eq!(threads[0], here);
    assert!(threads.len() > 10, "{} writes", threads.len());
    assert!(threads[1..].iter().all(|t| *t != here));
}

/// A TCP connection that counts what went through `sendfile` and what
/// through ordinary writes.
struct Counting {
    inner: TcpStream,
    by_sendfile: Arc<std::sync::atomic::AtomicU64>,
    by_write: Arc<std::sync::atomic::AtomicU64>,
}

impl xftp_stripe::DataSocket for Counting {
    fn can_send_file(&self) -> bool {
        self.inner.can_send_file()
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
        if let Poll::Ready(Ok(n)) = &r {
            self.by_sendfile
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = &r {
            self.by_write
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
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

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_plain_tcp_goes_by_sendfile() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let data = pattern(5 * 1024 * 1024 + 12_345, 21);
    let mut f = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut f, &data).unwrap();
    let (tx, rx) = tcp_pairs(3).await;
    let by_sendfile = Arc::new(AtomicU64::new(0));
    let by_write = Arc::new(AtomicU64::new(0));
    let tx: Vec<_> = tx
        .into_iter()
        .map(|inner| Counting {
            inner,
            by_sendfile: by_sendfile.clone(),
            by_write: by_write.clone(),
        })
        .collect();
    let dst = Arc::new(MemFile::default());
    let len = data.len() as u64;
    let (s, r) = tokio::join!(
        send_file(Arc::new(f), len, tx, &SendConfig::default()),
        recv_file(dst.clone(), rx, Some(len))
    );
    assert_eq!(s.unwrap().bytes, len);
    assert_eq!(r.unwrap().bytes, len);
    assert_eq!(dst.to_vec(), data);
    // Every payload byte and its header went by sendfile; ordinary writes
    // carried only the end-of-data headers (17 bytes a connection).
    let records = len.div_ceil(u64::from(xftp_stripe::DEFAULT_RECORD_SIZE));
    assert!(by_sendfile.load(Ordering::Relaxed) >= len + 17 * records);
    assert_eq!(by_write.load(Ordering::Relaxed), 17 * 3);
}

/// A TCP connection that counts what came in through a pipe (`splice`)
/// and what through ordinary reads.
struct CountingRx {
    inner: TcpStream,
    by_splice: Arc<std::sync::atomic::AtomicU64>,
    by_read: Arc<std::sync::atomic::AtomicU64>,
}

impl xftp_stripe::DataSocket for CountingRx {
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
        if let Poll::Ready(Ok(n)) = &r {
            self.by_splice
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl AsyncRead for CountingRx {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.by_read
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        r
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_plain_tcp_is_received_through_a_pipe() {
    // One connection: all of it through the pipe.
    let (spliced, len) = receive_counting(1).await;
    assert_eq!(spliced, len);
    // Several: read while more than one runs, through the pipe while one
    // runs alone (which of the two depends on how the tasks interleave),
    // every byte once and the transfer intact (checked inside).
    receive_counting(3).await;
}

/// A file over `n` loopback TCP connections into a file, checked; the
/// payload bytes that came through the pipe, and the file's length.
async fn receive_counting(n: usize) -> (u64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Records of an odd size, so pieces and the pipe's capacity do not line
    // up with them.
    let data = pattern(3 * 1024 * 1024 + 777, 33);
    let (tx, rx) = tcp_pairs(n).await;
    let by_splice = Arc::new(AtomicU64::new(0));
    let by_read = Arc::new(AtomicU64::new(0));
    let rx: Vec<_> = rx
        .into_iter()
        .map(|inner| CountingRx {
            inner,
            by_splice: by_splice.clone(),
            by_read: by_read.clone(),
        })
        .collect();
    let out = tempfile::tempfile().unwrap();
    let len = data.len() as u64;
    let cfg = SendConfig {
        record_size: 100_003,
        ..SendConfig::default()
    };
    let (s, r) = tokio::join!(
        send_file(Arc::new(MemFile::from(data.clone())), len, tx, &cfg),
        recv_file(Arc::new(out.try_clone().unwrap()), rx, Some(len))
    );
    assert_eq!(s.unwrap().bytes, len);
    assert_eq!(r.unwrap().bytes, len);
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &out, &mut got).unwrap();
    assert_eq!(got, data);
    // What did not come through a pipe was read; with one connection the
    // reads took the headers alone (17 bytes each), none of the payload
    // after them (headers are read exactly).
    let spliced = by_splice.load(Ordering::Relaxed);
    let read = by_read.load(Ordering::Relaxed);
    if n == 1 {
        // (The scheduler cuts the last records smaller, so their number
        // is not known here.)
        let records = len.div_ceil(100_003);
        assert_eq!(read % 17, 0, "{read} bytes read");
        assert!(read >= 17 * records && read < 17 * 4 * records, "{read}");
    }
    // Every payload byte came one way or the other, once; the rest of
    // what was read is whole headers.
    let headers = (spliced + read)
        .checked_sub(len)
        .expect("every payload byte counted");
    assert_eq!(headers % 17, 0, "{headers} header bytes");
    (spliced, len)
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cut_short_while_sent_by_sendfile_fails_the_transfer() {
    let data = pattern(1024 * 1024, 5);
    let mut f = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut f, &data).unwrap();
    let (tx, rx) = tcp_pairs(2).await;
    let dst = Arc::new(MemFile::default());
    // Announced longer than the file is.
    let len = data.len() as u64 + 300_000;
    let (s, r) = tokio::join!(
        send_file(Arc::new(f), len, tx, &SendConfig::default()),
        recv_file(dst.clone(), rx, Some(len))
    );
    assert!(
        matches!(s, Err(StripeError::SourceShort { .. })),
        "sender: {s:?}"
    );
    assert!(
        r.is_err(),
        "the receiver must not see a complete file: {r:?}"
    );
}

// ---------------------------------------------------------------- endgame

fn block(offset: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = xftp_stripe::block::BlockHeader::data(offset, payload.len() as u64)
        .encode()
        .to_vec();
    v.extend_from_slice(payload);
    v
}

/// Feed raw bytes on each connection to a receiver that takes duplicates:
/// in memory, or, one after the other, on one loopback TCP connection into
/// a file (where the payload of a lone connection goes through a pipe, and
/// a copy is read out of it to be compared).
async fn receive_raw(
    tcp: bool,
    size: u64,
    wires: Vec<Vec<u8>>,
) -> (Result<TransferReport, StripeError>, Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    if tcp {
        let wires = vec![wires.concat()];
        let (tx, rx) = tcp_pairs(1).await;
        let f = tempfile::tempfile().unwrap();
        let dst = Arc::new(f.try_clone().unwrap());
        let rcv = Receiver::file_endgame(dst, size, Default::default(), rx);
        let feed = async {
            for (mut t, w) in tx.into_iter().zip(wires) {
                t.write_all(&w).await.unwrap();
                std::mem::forget(t);
            }
        };
        let (_, r) = tokio::join!(feed, rcv.finish());
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut &f, &mut got).unwrap();
        return (r, got);
    }
    let (tx, rx) = duplexes(wires.len());
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file_endgame(dst.clone(), size, Default::default(), rx);
    let feed = async {
        for (mut t, w) in tx.into_iter().zip(wires) {
            t.write_all(&w).await.unwrap();
            // Kept open: a connection that never ends.
            std::mem::forget(t);
        }
    };
    let (_, r) = tokio::join!(feed, rcv.finish());
    (r, dst.to_vec())
}

#[tokio::test]
async fn a_receiver_in_the_endgame_takes_identical_copies_and_refuses_others() {
    endgame_copies(false).await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endgame_over_tcp_compares_copies_taken_through_the_pipe() {
    endgame_copies(true).await;
}

async fn endgame_copies(tcp: bool) {
    let receive_raw = |size, wires| receive_raw(tcp, size, wires);
    let data = pattern(300, 9);
    let eof = xftp_stripe::block::BlockHeader::eof(2).encode().to_vec();
    // Conn 0 carries [0, 200) and the EOF; conn 1 a copy of [100, 200)
    // and [200, 300). It completes without any EOD on conn 1.
    let a = [
        block(0, &data[..100]),
        block(100, &data[100..200]),
        eof.clone(),
    ]
    .concat();
    let b = [block(100, &data[100..200]), block(200, &data[200..])].concat();
    let (r, got) = receive_raw(300, vec![a, b]).await;
    let r = r.unwrap();
    assert_eq!(got, data);
    assert_eq!(r.bytes, 300, "each byte counted once");
    assert_eq!(r.duplicate_bytes, 100);
    // A copy overlapping two records, partly new.
    let a = [block(0, &data[..150]), eof.clone()].concat();
    let b = [block(100, &data[100..300])].concat();
    let (r, got) = receive_raw(300, vec![a, b]).await;
    assert_eq!(r.unwrap().bytes, 300);
    assert_eq!(got, data);
    // A copy that differs in one byte is refused.
    let mut bad = data[100..200].to_vec();
    bad[42] ^= 1;
    let a = [block(0, &data[..200]), eof.clone()].concat();
    let b = [block(100, &bad), block(200, &data[200..])].concat();
    let (r, _) = receive_raw(300, vec![a, b]).await;
    assert!(
        matches!(r, Err(StripeError::DuplicateDiffers { .. })),
        "{r:?}"
    );
    // Every byte but no EOF: complete (a sender in the endgame does not
    // send EOF when a connection stuck before its end was reset).
    let (r, got) = receive_raw(300, vec![block(0, &data)]).await;
    assert_eq!(r.unwrap().bytes, 300);
    assert_eq!(got, data);
    if tcp {
        return;
    }
    // Bytes missing and the connection closed: not complete.
    let a = block(0, &data[..200]);
    let (tx, rx) = duplexes(1);
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file_endgame(dst, 300, Default::default(), rx);
    let mut tx = tx;
    {
        use tokio::io::AsyncWriteExt;
        tx[0].write_all(&a).await.unwrap();
        tx[0].shutdown().await.unwrap();
    }
    assert!(rcv.finish().await.is_err());
}

/// A receiver in the endgame that loses every connection with bytes still
/// missing fails soon, even while more connections could still be added
/// (a server's session holds the means to add them): it does not wait for
/// the session to end before the client hears why.
#[tokio::test(start_paused = true)]
async fn a_receiver_in_the_endgame_that_lost_every_connection_fails_soon() {
    use tokio::io::AsyncWriteExt;
    let data = pattern(300, 3);
    let (tx, rx) = duplexes(2);
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file_endgame(dst.clone(), 300, Default::default(), rx);
    // Kept: connections could still join.
    let ctl = rcv.control();
    let feed = async {
        for (i, mut t) in tx.into_iter().enumerate() {
            let a = i * 100;
            t.write_all(&block(a as u64, &data[a..a + 100]))
                .await
                .unwrap();
            t.shutdown().await.unwrap();
        }
    };
    let t0 = tokio::time::Instant::now();
    let (_, r) = tokio::join!(feed, async {
        tokio::time::timeout(Duration::from_secs(60), rcv.finish()).await
    });
    let r = r.expect("the receive waited for a connection that never came");
    assert!(
        matches!(r, Err(StripeError::ClosedBeforeEod { .. })),
        "{r:?}"
    );
    // Within its grace of a second or so, not the minute above.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // What did arrive was written.
    assert_eq!(&dst.to_vec()[..200], &data[..200]);
    drop(ctl);
}

/// A connection that joins within the grace keeps the receive going.
#[tokio::test(start_paused = true)]
async fn a_connection_that_joins_in_time_keeps_an_endgame_receive_alive() {
    use tokio::io::AsyncWriteExt;
    let data = pattern(300, 4);
    let (tx, rx) = duplexes(1);
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file_endgame(dst.clone(), 300, Default::default(), rx);
    let ctl = rcv.control();
    let feed = async {
        for mut t in tx {
            t.write_all(&block(0, &data[..100])).await.unwrap();
            t.shutdown().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mut t, r) = tokio::io::duplex(1 << 16);
        ctl.add_connection(r).unwrap();
        t.write_all(&block(100, &data[100..])).await.unwrap();
        t.shutdown().await.unwrap();
    };
    let (_, r) = tokio::join!(feed, rcv.finish());
    assert_eq!(r.unwrap().bytes, 300);
    assert_eq!(dst.to_vec(), data);
}

/// What crossed one in-memory "connection": bytes the sender wrote, bytes
/// the receiving application read. As with TCP, what the peer has
/// acknowledged is on its way to the application; here what it read.
#[derive(Default)]
struct Wire {
    written: std::sync::atomic::AtomicU64,
    read: std::sync::atomic::AtomicU64,
    /// The reader stopped: what is not read waits "a timeout" for good.
    stalled: std::sync::atomic::AtomicBool,
    /// Reset: the probe says so, and writes never complete (only the
    /// probe can tell the sender).
    closed: std::sync::atomic::AtomicBool,
}

/// The sending end of a [`Wire`].
struct WireTx(DuplexStream, Arc<Wire>);
/// The receiving end; it stops reading for good after `left` bytes.
struct WireRx(DuplexStream, Arc<Wire>, usize);

struct WireProbe(Arc<Wire>);

impl xftp_stripe::Probe for WireProbe {
    fn delivery(&self) -> Option<xftp_stripe::Delivery> {
        use std::sync::atomic::Ordering::SeqCst;
        let outq = self.0.written.load(SeqCst) - self.0.read.load(SeqCst);
        let stalled = self.0.stalled.load(SeqCst);
        Some(xftp_stripe::Delivery {
            outq,
            timed_out: outq > 0 && stalled,
            rto: Duration::from_millis(200),
            min_rtt: None,
            since_ack: None,
            lossy: stalled,
            progress: None,
            closed: self.0.closed.load(SeqCst),
            held: false,
        })
    }
}

impl xftp_stripe::DataSocket for WireTx {
    fn probe(&self) -> Option<Box<dyn xftp_stripe::Probe>> {
        Some(Box::new(WireProbe(self.1.clone())))
    }
}

impl AsyncWrite for WireTx {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.1.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Poll::Pending;
        }
        let r = Pin::new(&mut self.0).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = &r {
            self.1
                .written
                .fetch_add(*n as u64, std::sync::atomic::Ordering::SeqCst);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl xftp_stripe::DataSocket for WireRx {}

impl AsyncRead for WireRx {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.2 == 0 {
            self.1.stalled.store(true, SeqCst);
            return Poll::Pending;
        }
        let want = buf.remaining().min(self.2);
        let mut part = buf.take(want);
        let r = Pin::new(&mut self.0).poll_read(cx, &mut part);
        let n = part.filled().len();
        if let Poll::Ready(Ok(())) = r {
            // SAFETY: `part` filled `n` bytes of `buf`'s unfilled part.
            unsafe { buf.assume_init(n) };
            buf.advance(n);
            self.2 -= n;
            self.1.read.fetch_add(n as u64, SeqCst);
        }
        r
    }
}

/// `n` wires; the one at `stuck` stops being read after `after` bytes.
fn wires(n: usize, stuck: usize, after: usize) -> (Vec<WireTx>, Vec<WireRx>) {
    (0..n)
        .map(|i| {
            let (a, b) = tokio::io::duplex(64 * 1024);
            let w = Arc::new(Wire::default());
            let left = if i == stuck { after } else { usize::MAX };
            (WireTx(a, w.clone()), WireRx(b, w, left))
        })
        .unzip()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endgame_delivers_a_stuck_connections_records_through_the_others() {
    let data = pattern(24 * 1024 * 1024 + 999, 77);
    let len = data.len() as u64;
    for stuck_after in [0, 300_000, 1 << 20] {
        // Connection 2 is read up to `stuck_after` bytes, then never again.
        let (tx, rx) = wires(4, 2, stuck_after);
        let dst = Arc::new(MemFile::default());
        let cfg = SendConfig {
            record_size: 128 * 1024,
            endgame: true,
            ..SendConfig::default()
        };
        let run = async {
            tokio::join!(
                send_file(Arc::new(MemFile::from(data.clone())), len, tx, &cfg),
                Receiver::file_endgame(dst.clone(), len, Default::default(), rx).finish()
            )
        };
        let (s, r) = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the endgame ends the transfer");
        let s = s.unwrap();
        let r = r.unwrap();
        assert!(dst.to_vec() == data, "content, stuck after {stuck_after}");
        assert_eq!(r.bytes, len, "each byte counted once");
        assert_eq!(s.bytes, len, "each byte counted once by the sender");
        // Whole records per connection: the copies, not a record cut short.
        assert!(s.streams.iter().map(|c| c.bytes).sum::<u64>() >= len);
        // The sender sent again what the stuck one held, and only that
        // (a 64 KiB pipe holds less than a record).
        assert!(s.duplicate_bytes > 0, "nothing sent again");
        assert!(
            s.duplicate_bytes <= 3 * 128 * 1024,
            "{} bytes sent again",
            s.duplicate_bytes
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_transfer_in_the_endgame_needs_a_receiver_that_takes_copies() {
    // A resumed download (REST with ranges) gets the endgame too: the
    // sender sends again what a stuck connection holds and drops that
    // connection. A receiver that takes copies completes; one that does
    // not (`file_resume`) fails or waits for good, which is why every
    // framed download with its size known takes copies.
    let data = pattern(12 * 1024 * 1024 + 4321, 79);
    let len = data.len() as u64;
    let mut have = xftp_stripe::ranges::RangeSet::new();
    have.union(0, 1 << 20);
    have.union(5 << 20, 6 << 20);
    let cfg = SendConfig {
        record_size: 128 * 1024,
        endgame: true,
        ..SendConfig::default()
    };
    let prefilled = || {
        use xftp_stripe::WriteAt;
        let dst = Arc::new(MemFile::default());
        for (a, b) in have.iter() {
            dst.write_at(&data[a as usize..b as usize], a).unwrap();
        }
        dst
    };
    let send = |tx| {
        Sender::file_except(Arc::new(MemFile::from(data.clone())), len, &have, tx, &cfg).finish()
    };
    let (tx, rx) = wires(4, 2, 300_000);
    let dst = prefilled();
    let run = async {
        tokio::join!(
            send(tx),
            Receiver::file_endgame(dst.clone(), len, have.clone(), rx).finish()
        )
    };
    let (s, r) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the endgame ends the transfer");
    let s = s.unwrap();
    r.unwrap();
    assert!(dst.to_vec() == data, "content");
    assert!(s.duplicate_bytes > 0, "nothing sent again");

    let (tx, rx) = wires(4, 2, 300_000);
    let dst = prefilled();
    let run = async {
        tokio::join!(
            send(tx),
            Receiver::file_resume(dst.clone(), Some(len), have.clone(), rx).finish()
        )
    };
    if let Ok((_, r)) = tokio::time::timeout(Duration::from_secs(5), run).await {
        assert!(r.is_err(), "a receiver that refuses copies completed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_endgame_a_stuck_connection_holds_the_end() {
    // The same stall without the endgame never completes: the test above
    // is about the endgame, not about the stall being harmless.
    let data = pattern(8 * 1024 * 1024, 78);
    let len = data.len() as u64;
    let (tx, rx) = wires(3, 1, 1 << 20);
    let dst = Arc::new(MemFile::default());
    let cfg = SendConfig {
        record_size: 128 * 1024,
        ..SendConfig::default()
    };
    let run = async {
        tokio::join!(
            send_file(Arc::new(MemFile::from(data.clone())), len, tx, &cfg),
            Receiver::file_endgame(dst.clone(), len, Default::default(), rx).finish()
        )
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(3), run)
            .await
            .is_err(),
        "completed without the endgame"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_transfer_reads_every_connection_to_its_end() {
    // A receiver that takes copies completes once every byte is in: at
    // once for an empty file. Its connections must still be read until
    // the sender closes them: closed under the sender, they answer its
    // EOD and EOF blocks with a reset, which fails its end of a transfer
    // that succeeded (under TLS, whose close_notify follows the blocks,
    // nearly always).
    use tokio::io::AsyncReadExt;
    for round in 0..5 {
        let (mut tx, rx) = tcp_pairs(4).await;
        let dst = Arc::new(MemFile::default());
        let r = Receiver::file_endgame(dst.clone(), 0, Default::default(), rx)
            .finish()
            .await;
        assert!(r.is_ok(), "round {round}: {r:?}");
        for (i, c) in tx.iter_mut().enumerate() {
            let mut b = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(100), c.read(&mut b)).await;
            assert!(
                read.is_err(),
                "round {round}: connection {i} closed by the receiver before the sender's end: {read:?}"
            );
        }
        let cfg = SendConfig {
            endgame: true,
            ..SendConfig::default()
        };
        let s = Sender::file(Arc::new(MemFile::default()), 0, tx, &cfg)
            .finish()
            .await;
        assert!(s.is_ok(), "round {round}: {s:?}");
    }
}

/// A sender in the endgame that loses a data connection mid-transfer (its
/// peer reset it with bytes read and bytes unread) sends everything that
/// connection carried again on the others, and the receiver, which never
/// saw that connection, completes with every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_in_the_endgame_survives_a_lost_connection() {
    use tokio::io::AsyncReadExt;
    let len = 48 << 20;
    let data = pattern(len, 21);
    let (tx, mut rx) = tcp_pairs(4).await;
    let victim = rx.pop().unwrap();
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file_endgame(dst.clone(), len as u64, Default::default(), rx);
    let cfg = SendConfig {
        record_size: RS,
        endgame: true,
        ..SendConfig::default()
    };
    let src = Arc::new(MemFile::from(data.clone()));
    let snd = Sender::file(src, len as u64, tx, &cfg);
    // The lost connection's bytes never reach the receiver: some are
    // read and dropped, the rest die in its socket with the reset.
    let kill = async move {
        let mut v = victim;
        let mut buf = vec![0u8; 300_000];
        let mut got = 0;
        while got < buf.len() {
            match v.read(&mut buf[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        socket2::SockRef::from(&v)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(v);
        got
    };
    let (got, s, r) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(kill, snd.finish(), rcv.finish())
    })
    .await
    .expect("the transfer ends");
    assert!(got > 0, "the lost connection carried something");
    let s = s.expect("the sender goes on without the lost connection");
    let r = r.expect("the receiver gets every byte");
    assert_eq!(dst.to_vec(), data);
    assert!(
        s.duplicate_bytes >= got as u64 - 17,
        "what the lost connection carried went again: {} bytes, {got} read",
        s.duplicate_bytes
    );
    assert_eq!(r.bytes, len as u64);
}

/// A connection whose reset comes before the receiver read its first
/// byte may still have carried data (a reset discards what the socket
/// held). When the others end without the transfer complete, the receive
/// fails soon, naming the reset, even while connections could still join:
/// it does not wait for an EOD that died with the connection. (On a link
/// that resets flows, an upload's server waited for it until the client's
/// reply timeout.)
#[tokio::test(start_paused = true)]
async fn a_connection_reset_before_its_first_byte_does_not_leave_the_receive_waiting() {
    use tokio::io::AsyncWriteExt;
    enum Conn {
        Wire(DuplexStream),
        Reset,
    }
    impl xftp_stripe::DataSocket for Conn {}
    impl AsyncRead for Conn {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            match self.get_mut() {
                Conn::Wire(d) => Pin::new(d).poll_read(cx, buf),
                Conn::Reset => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
            }
        }
    }
    let data = pattern(200, 5);
    let (mut tx, rx) = tokio::io::duplex(1 << 16);
    let dst = Arc::new(MemFile::default());
    let rcv = Receiver::file(dst.clone(), Some(200), vec![Conn::Wire(rx), Conn::Reset]);
    let ctl = rcv.control();
    // The sender used both: [0, 100) and the EOF (count 2) arrive on the
    // first; [100, 200) and its EOD died with the second.
    let eof = xftp_stripe::block::BlockHeader::eof(2).encode().to_vec();
    tx.write_all(&[block(0, &data[..100]), eof].concat())
        .await
        .unwrap();
    tx.shutdown().await.unwrap();
    let t0 = tokio::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(60), rcv.finish())
        .await
        .expect("the receive waited for an EOD that died with the reset");
    assert!(
        matches!(&r, Err(StripeError::Io { conn: Some(1), .. })),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(ctl);
}

/// A connection reset while it writes nothing that could fail (here its
/// writes just stop; a helper past its EOD does not write at all) is
/// found through the kernel's word (`Delivery::closed`): what it carried,
/// acknowledged or not, goes again on the others. Its peer read its
/// first MiB and dropped it, as a reset drops what a socket holds unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_in_the_endgame_learns_of_a_reset_from_the_probe() {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::AsyncReadExt;
    let data = pattern(8 * 1024 * 1024 + 5, 81);
    let len = data.len() as u64;
    let (tx, mut rx) = wires(3, usize::MAX, 0);
    let victim = rx.pop().unwrap();
    let dst = Arc::new(MemFile::default());
    let cfg = SendConfig {
        record_size: 128 * 1024,
        endgame: true,
        ..SendConfig::default()
    };
    let drop_then_reset = async move {
        let WireRx(mut d, wire, _) = victim;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0usize;
        // Each read is acknowledged when the next arrives, so the last
        // one never is before the reset: were all it carried acknowledged,
        // the sender could rightly count it delivered, finish with the
        // others' endgame copies, and leave the receiver short (a reset
        // after delivery, which no sender can undo: the receiver fails
        // then). It stops at a MiB, or after 50 ms with nothing (it
        // carried less, and the sender waits in its endgame): well before
        // the sender counts it stuck (200 ms without an acknowledgement).
        let mut unacked = 0u64;
        loop {
            match tokio::time::timeout(Duration::from_millis(50), d.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    got += n;
                    if got >= 1 << 20 {
                        break;
                    }
                    wire.read.fetch_add(unacked, SeqCst);
                    unacked = n as u64;
                }
                _ => break,
            }
        }
        wire.closed.store(true, SeqCst);
        got
    };
    let run = async {
        tokio::join!(
            drop_then_reset,
            send_file(Arc::new(MemFile::from(data.clone())), len, tx, &cfg),
            Receiver::file_endgame(dst.clone(), len, Default::default(), rx).finish()
        )
    };
    let (got, s, r) = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the transfer ends");
    let s = s.expect("the sender goes on without the reset connection");
    if got < 1 << 20 {
        // The victim carried less than a MiB (the others took most of
        // the records, a loaded machine) and stopped once nothing more
        // came: after its EOD, or with the others' endgame copies done.
        // A reset after the sender is done with a connection is one no
        // sender can undo: the receiver must then fail, not pass short.
        match r {
            Ok(_) => assert!(dst.to_vec() == data, "content"),
            Err(e) => assert!(
                matches!(
                    e,
                    xftp_stripe::StripeError::Hole { .. }
                        | xftp_stripe::StripeError::ClosedBeforeEod { .. }
                ),
                "{e:?}"
            ),
        }
        eprintln!("the victim read {got} bytes only");
        return;
    }
    r.unwrap_or_else(|e| panic!("the receiver gets every byte ({got} read by the victim): {e:?}"));
    assert!(dst.to_vec() == data, "content");
    // The transfer ending at all shows the loss was learned (nothing
    // else would end the victim's wait). What it carried went again on
    // the others: how much of it counts as endgame copies, and how much
    // was sent anew before the endgame began, depends on timing (1 MiB
    // of copies held in most runs, one record in some).
    let sent: u64 = s.streams.iter().map(|x| x.bytes).sum();
    assert!(
        s.duplicate_bytes > 0 && sent > len,
        "{} copies, {sent} sent for {len}",
        s.duplicate_bytes
    );
}

/// A fixed group (the parallel-sockets stream): an EOF block naming fewer
/// connections than the group is refused (it ended the stream with the
/// others' data unread), and every connection ended without an EOF fails
/// the read (it waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_groups_end_needs_every_connection_and_an_eof() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use xftp_stripe::block::BlockHeader;
    use xftp_stripe::Receiver;
    let blk = |off: u64, data: &[u8]| {
        let mut v = BlockHeader::data(off, data.len() as u64).encode().to_vec();
        v.extend_from_slice(data);
        v
    };
    let eof_eod = BlockHeader::eof(1);
    let eod = BlockHeader::eod().encode().to_vec();
    // EOF|EOD naming 1 on a group of 3.
    let (mut t0, r0) = tokio::io::duplex(1 << 16);
    let (mut t1, r1) = tokio::io::duplex(1 << 16);
    let (mut t2, r2) = tokio::io::duplex(1 << 16);
    let mut reader = ReadStream(Receiver::stream(vec![r0, r1, r2], 1 << 16, 1 << 20));
    t0.write_all(&[blk(0, b"abc"), eof_eod.encode().to_vec()].concat())
        .await
        .unwrap();
    // The others' data comes later (it was never read).
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = t1.write_all(&[blk(3, b"def"), eod.clone()].concat()).await;
        let _ = t2.write_all(&[blk(6, b"ghi"), eod.clone()].concat()).await;
        (t0, t1, t2)
    });
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut got))
        .await
        .expect("the read must end");
    assert!(r.is_err(), "{got:?}");
    drop(late.await);
    let eod = BlockHeader::eod().encode().to_vec();
    // Every connection's EOD, no EOF, all closed: an error, not a hang.
    let (mut t0, r0) = tokio::io::duplex(1 << 16);
    let (mut t1, r1) = tokio::io::duplex(1 << 16);
    let mut reader = ReadStream(Receiver::stream(vec![r0, r1], 1 << 16, 1 << 20));
    t0.write_all(&[blk(0, b"abc"), eod.clone()].concat())
        .await
        .unwrap();
    t1.write_all(&[blk(3, b"def"), eod.clone()].concat())
        .await
        .unwrap();
    drop((t0, t1));
    let mut got = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut got))
        .await
        .expect("the read must end");
    assert!(r.is_err(), "{got:?}");
}
