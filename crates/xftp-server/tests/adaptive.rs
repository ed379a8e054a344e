//! Framed transfers that change their connection count while running:
//! MODE E on one connection, STAT progress and NOOP answered mid-transfer,
//! MULT raised (more passive connections) and lowered (retired ones).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::*;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use xftp_stripe::{MemFile, Receiver, SendConfig, Sender};

/// A connection that lets through at most 4 MiB/s.
struct Paced {
    inner: TcpStream,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Paced writes go through poll_write: no file pages sent by the kernel.
impl xftp_stripe::DataSocket for Paced {}

impl Paced {
    fn new(inner: TcpStream) -> Self {
        Paced { inner, sleep: None }
    }
}

impl AsyncWrite for Paced {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let chunk = buf.len().min(16 * 1024);
        let r = Pin::new(&mut self.inner).poll_write(cx, &buf[..chunk]);
        if let Poll::Ready(Ok(n)) = r {
            let d = Duration::from_micros(n as u64 * 1_000_000 / (4 << 20));
            self.sleep = Some(Box::pin(tokio::time::sleep(d)));
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// End an upload: the sender finishes, the server says 226, `streams`
/// connections carried it and `path` holds exactly `data`.
async fn finish_upload(
    sender: Sender<Paced>,
    c: &mut Ctl,
    path: &std::path::Path,
    data: &[u8],
    streams: usize,
) {
    let rep = sender.finish().await.unwrap();
    c.expect(226).await;
    assert_eq!(rep.streams.len(), streams);
    assert!(std::fs::read(path).unwrap() == data, "content differs");
}

async fn epsv_port(c: &mut Ctl) -> u16 {
    let r = c.cmd("EPSV", 229).await;
    xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_e_on_one_connection() {
    let srv = start(|_| {}).await;
    let data = pattern(700_001, 1);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MODE E", 200).await;
    let conns = c.epsv_connect(1).await;
    c.cmd("RETR f", 150).await;
    let dst = Arc::new(MemFile::default());
    let rep = xftp_stripe::recv_file(dst.clone(), conns, Some(data.len() as u64))
        .await
        .unwrap();
    c.expect(226).await;
    assert_eq!(dst.to_vec(), data);
    assert_eq!(rep.streams.len(), 1);
    c.cmd("MODE S", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retr_grows_and_reports_progress() {
    let srv = start(|cfg| cfg.record_size = 64 * 1024).await;
    let data = pattern(48 << 20, 2);
    write(srv.dir.path(), "big", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MODE E", 200).await;
    c.cmd("MULT 2", 200).await;
    let port = epsv_port(&mut c).await;
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    c.cmd("RETR big", 150).await;
    // Nothing is read yet, so the transfer is stuck in progress.
    let stat = c.cmd("STAT", 213).await;
    let mut t = xftp_tune::meter::parse_progress(&stat.text()).expect("progress line");
    assert_eq!(t.conns, 2, "{stat}");
    assert!(t.at.is_some(), "{stat}");
    // Our kernel acknowledges what fills our receive buffers, read or not;
    // the server's sockets report it.
    for _ in 0..100 {
        if t.delivered > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stat = c.cmd("STAT", 213).await;
        t = xftp_tune::meter::parse_progress(&stat.text()).expect("progress line");
    }
    assert!(t.delivered > 0 && t.delivered <= t.bytes, "{t:?}");
    c.cmd("NOOP", 200).await;
    let r = c.cmd("MULT 4", 200).await;
    assert!(r.text().starts_with("MULT 4 "), "{r}");
    for _ in 0..2 {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    let dst = Arc::new(MemFile::default());
    let rep = Receiver::file(dst.clone(), Some(data.len() as u64), conns)
        .finish()
        .await
        .unwrap();
    c.expect(226).await;
    assert!(dst.to_vec() == data, "content differs");
    assert_eq!(rep.streams.len(), 4);
    assert!(rep.streams.iter().all(|s| s.bytes > 0), "{rep:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retr_sheds_connections() {
    let srv = start(|cfg| cfg.record_size = 64 * 1024).await;
    let data = pattern(24 << 20, 3);
    write(srv.dir.path(), "big", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 3", 200).await;
    let conns = c.epsv_connect(3).await;
    c.cmd("RETR big", 150).await;
    c.cmd("MULT 1", 200).await;
    let dst = Arc::new(MemFile::default());
    let rep = Receiver::file(dst.clone(), Some(data.len() as u64), conns)
        .finish()
        .await
        .unwrap();
    c.expect(226).await;
    assert!(dst.to_vec() == data, "content differs");
    assert_eq!(rep.bytes, data.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stor_grows() {
    let srv = start(|_| {}).await;
    // Paced at 4 MiB/s per connection, so the transfer is still running
    // when the added connections join, however slow the host.
    let data = pattern(12 << 20, 4);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MODE E", 200).await;
    c.cmd("MULT 1", 200).await;
    let port = epsv_port(&mut c).await;
    let first = Paced::new(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    c.cmd("STOR up", 150).await;
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let sender = Sender::file(
        Arc::new(MemFile::from(data.clone())),
        data.len() as u64,
        vec![first],
        &cfg,
    );
    c.cmd("MULT 3", 200).await;
    for _ in 0..2 {
        sender
            .add_connection(Paced::new(
                TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
            ))
            .expect("the transfer is still running");
    }
    finish_upload(sender, &mut c, &srv.dir.path().join("up"), &data, 3).await;
}

/// An adaptive upload that sheds and regrows uses more connections over
/// its life than the server's maximum at any one time; its EOF block counts
/// them all, and the server must not take that for too many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stor_that_sheds_and_regrows_past_the_maximum_in_total() {
    let srv = start(|cfg| cfg.max_streams = 2).await;
    let data = pattern(12 << 20, 5);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MODE E", 200).await;
    c.cmd("MULT 2", 200).await;
    let port = epsv_port(&mut c).await;
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(Paced::new(
            TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
        ));
    }
    c.cmd("STOR up", 150).await;
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let sender = Sender::file(
        Arc::new(MemFile::from(data.clone())),
        data.len() as u64,
        conns,
        &cfg,
    );
    // 2 -> 1 -> 2: three connections in all, two at most at once.
    c.cmd("MULT 1", 200).await;
    sender.retire(1).expect("the transfer is still running");
    c.cmd("MULT 2", 200).await;
    sender
        .add_connection(Paced::new(
            TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
        ))
        .expect("the transfer is still running");
    finish_upload(sender, &mut c, &srv.dir.path().join("up"), &data, 3).await;
}

/// Connections added after the sender handed out its last record carry
/// nothing: the sender closes them (or its listener, closed at the end,
/// resets them), and the download completes, whole, over the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retr_latecomers_after_the_last_record_are_harmless() {
    let srv = start(|_| {}).await;
    // Small enough to sit in the first connection's socket buffers at once.
    let data = pattern(100_000, 5);
    write(srv.dir.path(), "small", &data);
    for round in 0..5 {
        let mut c = Ctl::login(srv.addr).await;
        c.cmd("MODE E", 200).await;
        c.cmd("MULT 1", 200).await;
        let port = epsv_port(&mut c).await;
        let mut conns = vec![TcpStream::connect(("127.0.0.1", port)).await.unwrap()];
        c.cmd("RETR small", 150).await;
        // The file fits in the socket buffers, so the transfer may end
        // before the server reads MULT: then 226 comes first and MULT is
        // answered after it (a grant for the next transfer).
        c.send_raw(b"MULT 3\r\n").await;
        let first = c.read_reply().await.expect("a reply to MULT or RETR");
        let finished_first = match first.code {
            200 => false,
            226 => {
                c.expect(200).await;
                true
            }
            _ => panic!("round {round}: unexpected reply {first}"),
        };
        for _ in 0..2 {
            // Refused once the transfer is over and the listener gone.
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
                conns.push(s);
            }
        }
        let dst = Arc::new(MemFile::default());
        let rep = tokio::time::timeout(
            Duration::from_secs(20),
            Receiver::file(dst.clone(), Some(data.len() as u64), conns).finish(),
        )
        .await
        .expect("the receiver must not wait for unused connections")
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        if !finished_first {
            c.expect(226).await;
        }
        assert!(dst.to_vec() == data, "round {round}: content differs");
        assert_eq!(rep.bytes, data.len() as u64);
    }
}
