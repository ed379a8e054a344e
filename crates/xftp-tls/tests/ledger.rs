//! The endgame's probe of a TLS connection never counts as delivered
//! what its peer has not acknowledged, and counts everything once all of
//! it is.

use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use xftp_stripe::DataSocket;
use xftp_tls::client::{ClientTls, ClientTlsConfig};
use xftp_tls::server::ServerTls;

const T: Duration = Duration::from_secs(10);

/// Bytes waiting in the socket's receive queue.
fn inq(fd: &impl AsRawFd) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer.
    assert_eq!(
        unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) },
        0
    );
    n as u64
}

/// The probe of a TLS stream, as the stream, boxed, and metered the way
/// `xftp serve` sends through it: a wrapper that answered with the
/// socket's own counts (ciphertext) would count as delivered what was not.
#[tokio::test]
async fn a_tls_probe_counts_only_what_the_peer_acknowledged() {
    let (rd, wr) = tls_pair().await;
    check(rd, wr).await;
    let (rd, wr) = tls_pair().await;
    check(rd, Box::new(wr)).await;
    let (rd, wr) = tls_pair().await;
    check(
        rd,
        xftp_tune::meter::MeterSet::new().wrap(wr).bound_backlog(),
    )
    .await;
}

/// A TLS connection over loopback whose reader has a small window.
async fn tls_pair() -> (xftp_tls::Stream, xftp_tls::Stream) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let server = ServerTls::load(&cert, &key).unwrap().session(0).unwrap();
    let client = ClientTls::new(
        &ClientTlsConfig {
            cacert: Some(cert.clone()),
            insecure: false,
        },
        "localhost",
    )
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sock = TcpSocket::new_v4().unwrap();
    // A small receive window: the writer blocks soon.
    sock.set_recv_buffer_size(64 * 1024).unwrap();
    let a = sock.connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    let (rd, wr) = tokio::join!(client.connect(a, T), server.accept_control(b, T));
    (rd.unwrap(), wr.unwrap())
}

async fn check<W: AsyncWrite + DataSocket + Unpin>(mut rd: xftp_tls::Stream, mut wr: W) {
    let probe = wr.probe().expect("a TLS stream gives a probe");

    // Write until the stalled reader's window and both buffers are full.
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let mut written = 0u64;
    loop {
        match tokio::time::timeout(Duration::from_millis(300), wr.write(&chunk)).await {
            Ok(n) => written += n.unwrap() as u64,
            Err(_) => break,
        }
        assert!(written < 1 << 30, "the writer never blocked");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = probe.delivery().expect("the kernel answers");
    let delivered = written - d.outq;
    // Nothing was read: what the peer acknowledged waits in its receive
    // queue, as ciphertext, which is longer than its plaintext.
    let queued = inq(rd.tcp());
    assert!(
        delivered <= queued,
        "{delivered} counted delivered, {queued} bytes of ciphertext in the receiver's queue"
    );
    assert!(delivered > 0, "nothing counted delivered of {written}");
    assert!(d.outq > 0);
    // And exact to within one write: marks are taken at every write, at
    // the ciphertext's exact position, so what was acknowledged and not
    // yet counted is at most the last write's plaintext and the overhead
    // of TLS records (22-29 bytes per 16 KiB).
    let overhead = queued / 16384 * 29 + 29;
    assert!(
        queued - delivered <= chunk.len() as u64 + overhead,
        "{delivered} counted delivered, {queued} bytes of ciphertext in the receiver's queue"
    );

    // Read everything: once the last write is flushed and acknowledged,
    // all of it counts.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        let mut got = 0u64;
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got += n as u64,
            }
        }
    });
    wr.write_all(&chunk).await.unwrap();
    written += chunk.len() as u64;
    wr.flush().await.unwrap();
    let mut outq = u64::MAX;
    for _ in 0..100 {
        outq = probe.delivery().unwrap().outq;
        if outq == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(outq, 0, "of {written} written, all read");
    wr.shutdown().await.unwrap();
    drop(wr);
    assert_eq!(reader.await.unwrap(), written);
}
