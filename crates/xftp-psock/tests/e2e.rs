//! Loopback end-to-end transfers with checksums (≥ 1 GiB in total).

mod common;

use std::time::Instant;

use tokio::io::AsyncWriteExt;
use xftp_psock::{PsockConfig, PsockListener, PsockStream};

async fn transfer(n: u16, total: u64) {
    let cfg = PsockConfig::default();
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();
    let server = tokio::spawn(async move {
        let mut s = l.accept().await.unwrap();
        assert_eq!(s.streams(), n as usize);
        let r = common::read_hash(&mut s).await.unwrap();
        s.shutdown().await.unwrap();
        let per: u64 = s.received_stats().iter().map(|x| x.bytes).sum();
        (r, per, s.reorder_usage())
    });
    let t = Instant::now();
    let mut c = PsockStream::connect(addr, n, &cfg).await.unwrap();
    let sent = common::write_pattern(&mut c, total).await.unwrap();
    c.shutdown().await.unwrap();
    // The peer's end-of-stream confirms it read everything.
    let (back, _) = common::read_hash(&mut c).await.unwrap();
    assert_eq!(back, 0);
    let ((got, hash), per, (peak, cap)) = server.await.unwrap();
    assert_eq!(got, total);
    assert_eq!(hash, sent, "n = {n}: content differs");
    assert_eq!(per, total);
    assert!(peak <= cap);
    eprintln!("n = {n}: {total} bytes in {:?}", t.elapsed());
}

// 4 × 256 MiB = 1 GiB over the four group sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_256mib() {
    transfer(1, 256 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_256mib() {
    transfer(2, 256 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_connections_256mib() {
    transfer(16, 256 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_256mib() {
    transfer(128, (256 << 20) + 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_at_once() {
    let cfg = PsockConfig::default();
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();
    let (a, b) = tokio::join!(PsockStream::connect(addr, 3, &cfg), l.accept());
    let (a, b) = (a.unwrap(), b.unwrap());
    let one = |mut s: PsockStream, total: u64| async move {
        let (mut r, mut w) = tokio::io::split(&mut s);
        let (sent, got) = tokio::join!(
            async {
                let h = common::write_pattern(&mut w, total).await.unwrap();
                w.shutdown().await.unwrap();
                h
            },
            common::read_hash(&mut r)
        );
        (sent, got.unwrap())
    };
    let ((sa, ga), (sb, gb)) = tokio::join!(one(a, 5 << 20), one(b, 3 << 20));
    assert_eq!(ga, (3 << 20, sb));
    assert_eq!(gb, (5 << 20, sa));
}
