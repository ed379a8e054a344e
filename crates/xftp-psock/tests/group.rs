//! Grouping, rejection, timeout, error and backpressure behaviour.

mod common;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use xftp_psock::handshake::{Hello, Reply, SessionId, Status, HELLO_LEN, MAX_VERSION, REPLY_LEN};
use xftp_psock::{PsockConfig, PsockError, PsockListener, PsockStream};

const LIMIT: Duration = Duration::from_secs(20);

fn hello(session: u8, index: u16, count: u16) -> Hello {
    Hello {
        min_version: 1,
        max_version: 1,
        session: SessionId([session; 16]),
        index,
        count,
        record_size: 65536,
    }
}

/// Send a raw hello; returns the connection and the listener's verdict.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> (TcpStream, Option<Reply>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut b = [0u8; REPLY_LEN];
    let r = match s.read_exact(&mut b).await {
        Ok(_) => Reply::decode(&b).unwrap(),
        Err(_) => None,
    };
    (s, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_groups_never_mix() {
    let cfg = PsockConfig::default();
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();
    let mut clients = Vec::new();
    for k in 0..4u8 {
        let cfg = cfg.clone();
        clients.push(tokio::spawn(async move {
            let mut c = PsockStream::connect(addr, 4, &cfg).await.unwrap();
            let msg = vec![k; 300_000 + k as usize];
            c.write_all(&msg).await.unwrap();
            c.shutdown().await.unwrap();
            let mut back = Vec::new();
            c.read_to_end(&mut back).await.unwrap();
        }));
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        let mut s = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
        let mut v = Vec::new();
        s.read_to_end(&mut v).await.unwrap();
        s.shutdown().await.unwrap();
        let k = v[0];
        assert_eq!(v.len(), 300_000 + k as usize);
        assert!(v.iter().all(|&b| b == k), "bytes of two groups mixed");
        seen.push(k);
    }
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2, 3]);
    for c in clients {
        c.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_connections_are_refused_without_harm() {
    let cfg = PsockConfig::default();
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();

    // Start a real group's first connection by hand.
    let (g0, r0) = raw(addr, &hello(1, 0, 2).encode()).await;
    assert_eq!(r0.unwrap().status, Status::Ok);

    // Garbage: closed without a reply.
    let (_s, r) = raw(addr, b"GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxx").await;
    assert_eq!(r, None);
    // Our magic but an impossible index.
    let mut bad = hello(2, 5, 2).encode();
    bad[31] = 0;
    let (_s, r) = raw(addr, &bad).await;
    assert_eq!(r.unwrap().status, Status::Malformed);
    // Duplicate index of the pending group.
    let (_s, r) = raw(addr, &hello(1, 0, 2).encode()).await;
    assert_eq!(r.unwrap().status, Status::Duplicate);
    // Same session, different group size.
    let (_s, r) = raw(addr, &hello(1, 1, 3).encode()).await;
    assert_eq!(r.unwrap().status, Status::Mismatch);
    // A version we do not speak.
    let mut v = hello(3, 0, 1);
    v.min_version = MAX_VERSION + 1;
    v.max_version = 9;
    let (_s, r) = raw(addr, &v.encode()).await;
    let r = r.unwrap();
    assert_eq!((r.status, r.version), (Status::Version, MAX_VERSION));
    // Half a hello, then silence: the handshake timer will drop it; it
    // must not block others.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&hello(4, 0, 1).encode()[..HELLO_LEN / 2])
        .await
        .unwrap();

    // The real group completes and works despite all of the above.
    let (mut g1, r1) = raw(addr, &hello(1, 1, 2).encode()).await;
    assert_eq!(r1.unwrap().status, Status::Ok);
    let s = timeout(LIMIT, l.accept()).await.unwrap().unwrap();
    assert_eq!(s.streams(), 2);
    // A late connection for the completed group is refused.
    let (_s, r) = raw(addr, &hello(1, 0, 2).encode()).await;
    assert_eq!(r.unwrap().status, Status::Late);
    drop((g0, s));
    let mut b = [0u8; 1];
    // The accepted group is alive until dropped; now it is closed.
    let n = timeout(LIMIT, g1.read(&mut b)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_group_times_out_and_is_freed() {
    let cfg = PsockConfig {
        group_timeout: Duration::from_millis(2000),
        ..PsockConfig::default()
    };
    let l = PsockListener::bind("127.0.0.1:0", cfg).await.unwrap();
    let (mut s, r) = raw(l.local_addr(), &hello(9, 0, 3).encode()).await;
    assert_eq!(r.unwrap().status, Status::Ok);
    assert_eq!(l.pending_groups(), 1);
    // The listener closes the connection when the group expires.
    let mut b = [0u8; 1];
    let n = timeout(LIMIT, s.read(&mut b)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)));
    assert_eq!(l.pending_groups(), 0);
    // And a straggler of that group is told it is too late.
    let (_s, r) = raw(l.local_addr(), &hello(9, 1, 3).encode()).await;
    assert_eq!(r.unwrap().status, Status::Late);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_pending_groups_are_refused() {
    let cfg = PsockConfig {
        max_pending_groups: 2,
        ..PsockConfig::default()
    };
    let l = PsockListener::bind("127.0.0.1:0", cfg).await.unwrap();
    let (_a, r) = raw(l.local_addr(), &hello(1, 0, 2).encode()).await;
    assert_eq!(r.unwrap().status, Status::Ok);
    let (_b, r) = raw(l.local_addr(), &hello(2, 0, 2).encode()).await;
    assert_eq!(r.unwrap().status, Status::Ok);
    let (_c, r) = raw(l.local_addr(), &hello(3, 0, 2).encode()).await;
    assert_eq!(r.unwrap().status, Status::Busy);
}

#[tokio::test]
async fn connect_to_nothing_fails_cleanly() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let r = PsockStream::connect(addr, 2, &PsockConfig::default()).await;
    assert!(matches!(r, Err(PsockError::Io { .. })));
    let r = PsockStream::connect(addr, 0, &PsockConfig::default()).await;
    assert!(matches!(r, Err(PsockError::Invalid(_))));
}

/// A listener that answers some connections of a group and leaves the
/// others waiting (out of file descriptors, say): the connecting side's
/// timeout says how many were accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_timeout_says_how_many_connections_were_accepted() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let mut b = [0u8; HELLO_LEN];
            s.read_exact(&mut b).await.unwrap();
            let h = Hello::decode(&b).unwrap().unwrap();
            if h.index < 2 {
                let r = Reply {
                    status: Status::Ok,
                    version: h.max_version.min(MAX_VERSION),
                    record_size: h.record_size,
                };
                s.write_all(&r.encode()).await.unwrap();
            }
            held.push(s);
        }
    });
    let cfg = PsockConfig {
        handshake_timeout: Duration::from_millis(500),
        ..PsockConfig::default()
    };
    let r = timeout(LIMIT, PsockStream::connect(addr, 4, &cfg))
        .await
        .unwrap();
    serve.abort();
    match r {
        Err(e @ PsockError::GroupTimeout { ready: 2, count: 4 }) => {
            assert!(e.to_string().contains("2 of the 4"), "{e}")
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A group through the relay: (client, server, relay).
async fn relayed(n: u16, cfg: &PsockConfig) -> (PsockStream, PsockStream, common::Relay) {
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let relay = common::Relay::start(l.local_addr(), n as usize).await;
    let (c, s) = tokio::join!(PsockStream::connect(relay.addr, n, cfg), l.accept());
    (c.unwrap(), s.unwrap(), relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_of_one_connection_fails_both_ends() {
    let cfg = PsockConfig::default();
    let (mut c, mut s, relay) = relayed(4, &cfg).await;
    let writer = tokio::spawn(async move {
        let r = common::write_pattern(&mut c, 1 << 40).await;
        let _ = c.shutdown().await;
        (r, c)
    });
    let mut buf = vec![0u8; 1 << 16];
    // Let data flow, then reset one connection.
    for _ in 0..20 {
        s.read_exact(&mut buf).await.unwrap();
    }
    relay.kill(2);
    let r = timeout(LIMIT, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .unwrap();
    assert!(r.is_err(), "receiver must see an error, not end-of-stream");
    let (w, mut c) = timeout(LIMIT, writer).await.unwrap().unwrap();
    assert!(w.is_err(), "sender must see an error");
    // Reading on the sender's side errors too.
    let mut b = [0u8; 8];
    assert!(timeout(LIMIT, c.read(&mut b)).await.unwrap().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_either_end_never_hangs_the_other() {
    let cfg = PsockConfig::default();
    let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone())
        .await
        .unwrap();
    let addr = l.local_addr();
    // Receiver dropped while the sender writes.
    let (c, s) = tokio::join!(PsockStream::connect(addr, 3, &cfg), l.accept());
    let (mut c, s) = (c.unwrap(), s.unwrap());
    c.write_all(&[1u8; 100_000]).await.unwrap();
    drop(s);
    let r = timeout(LIMIT, async {
        common::write_pattern(&mut c, 1 << 40).await?;
        c.shutdown().await
    })
    .await
    .expect("sender hung after the receiver went away");
    assert!(r.is_err());
    // Sender dropped mid-stream: the receiver gets an error, not EOF.
    let (c, s) = tokio::join!(PsockStream::connect(addr, 3, &cfg), l.accept());
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    c.write_all(&[2u8; 1_000_000]).await.unwrap();
    drop(c);
    let r = timeout(LIMIT, common::read_hash(&mut s))
        .await
        .expect("receiver hung after the sender went away");
    assert!(
        r.is_err(),
        "a dropped sender must not look like a clean end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connection_bounds_the_reorder_buffer_and_resumes() {
    let cfg = PsockConfig {
        record_size: Some(32 * 1024),
        reorder_cap: 1024 * 1024,
        ..PsockConfig::default()
    };
    let (mut c, mut s, relay) = relayed(4, &cfg).await;
    let total: u64 = 48 << 20;
    // Stall one connection (client -> server) for a while.
    relay.pause[1].send(true).unwrap();
    let unpause = tokio::spawn({
        let p = relay.pause[1].clone();
        async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            p.send(false).unwrap();
        }
    });
    let writer = tokio::spawn(async move {
        let h = common::write_pattern(&mut c, total).await.unwrap();
        c.shutdown().await.unwrap();
        h
    });
    let (got, hash) = timeout(LIMIT, common::read_hash(&mut s))
        .await
        .unwrap()
        .unwrap();
    unpause.await.unwrap();
    let sent = writer.await.unwrap();
    assert_eq!(got, total);
    assert_eq!(hash, sent);
    let (peak, cap) = s.reorder_usage();
    assert!(peak <= cap, "reorder buffer {peak} exceeded its cap {cap}");
    // The stall really filled the buffer (so the bound was exercised).
    assert!(
        peak > cap / 2,
        "peak {peak} of {cap}: the stall did not bite"
    );
    // Sender memory stayed bounded too: the stalled connection got few records.
    let per = s.received_stats();
    assert!(per.iter().all(|p| p.bytes > 0));
}

/// A TLS config of the wrong side is refused, never a group in clear: a
/// listener given a client's config does not bind.
#[tokio::test]
async fn a_tls_config_of_the_wrong_side_is_refused() {
    let verify = xftp_tls::client::ClientTlsConfig {
        cacert: None,
        insecure: true,
    };
    let tls = xftp_tls::client::ClientTls::new(&verify, "localhost").unwrap();
    let cfg = PsockConfig {
        tls: Some(xftp_psock::PsockTls::Client(tls)),
        ..PsockConfig::default()
    };
    let r = PsockListener::bind("127.0.0.1:0", cfg).await;
    let e = r.err().expect("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("connecting side"), "{e}");
}
