//! Transfers: stream mode, TYPE A, REST, listings, file management,
//! concurrency, and multi-stream (MULT with EPSV, EPRT and MPRT).

mod common;

use std::sync::Arc;

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use xftp_stripe::{recv_file, send_file, MemFile, SendConfig};

#[tokio::test]
async fn one_upload_at_a_time_writes_into_a_file() {
    // An append fixes its offset when it starts: a second one at the same
    // time would be overwritten by the first, or truncated away by its
    // rollback. It is refused with 450 (busy) instead.
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "log", b"BASE\n");
    let mut a = Ctl::login(srv.addr).await;
    let mut b = Ctl::login(srv.addr).await;
    a.cmd("TYPE I", 200).await;
    b.cmd("TYPE I", 200).await;
    let da = a.epsv_connect(1).await;
    a.cmd("APPE log", 150).await;
    let mut da = da.into_iter().next().unwrap();
    da.write_all(b"AAAA").await.unwrap();
    b.cmd("EPSV", 229).await;
    b.cmd("APPE log", 450).await;
    b.cmd("REST 2", 350).await;
    b.cmd("STOR log", 450).await;
    da.shutdown().await.unwrap();
    drop(da);
    a.expect(226).await;
    // Done: the next one goes ahead, after the first's data.
    let db = b.epsv_connect(1).await;
    b.cmd("APPE log", 150).await;
    let mut db = db.into_iter().next().unwrap();
    db.write_all(b"BBBB").await.unwrap();
    db.shutdown().await.unwrap();
    drop(db);
    b.expect(226).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("log")).unwrap(),
        b"BASE\nAAAABBBB"
    );
    // An aborted append rolls back its own bytes only.
    let da = a.epsv_connect(1).await;
    a.cmd("APPE log", 150).await;
    let mut da = da.into_iter().next().unwrap();
    da.write_all(b"CCCC").await.unwrap();
    da.flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    a.send_raw(b"ABOR\r\n").await;
    a.expect(426).await;
    a.expect(226).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("log")).unwrap(),
        b"BASE\nAAAABBBB"
    );
}

#[tokio::test]
async fn a_replaced_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let srv = start(|_| {}).await;
    let path = srv.dir.path().join("private");
    write(srv.dir.path(), "private", b"old");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    let d = c.epsv_connect(1).await;
    c.cmd("STOR private", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(b"new").await.unwrap();
    d.shutdown().await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[tokio::test]
async fn names_as_long_as_the_file_system_allows_can_be_stored() {
    // The temporary name adds to the final one; it must still fit in 255
    // bytes when the final name does (ASCII, and 2-byte UTF-8 at 254).
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    for name in ["n".repeat(255), "\u{e9}".repeat(127)] {
        let d = c.epsv_connect(1).await;
        c.cmd(&format!("STOR {name}"), 150).await;
        let mut d = d.into_iter().next().unwrap();
        d.write_all(b"long").await.unwrap();
        d.shutdown().await.unwrap();
        drop(d);
        c.expect(226).await;
        assert_eq!(std::fs::read(srv.dir.path().join(&name)).unwrap(), b"long");
    }
    c.cmd(&format!("STOR {}", "n".repeat(256)), 553).await;
}

#[tokio::test]
async fn stream_mode_roundtrip_passive_and_active() {
    let srv = start(|_| {}).await;
    let data = pattern(1_048_576 + 7, 3);
    let mut c = Ctl::login(srv.addr).await;
    // Upload (passive).
    let d = c.epsv_connect(1).await;
    c.cmd("STOR f.bin", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(&data).await.unwrap();
    d.shutdown().await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(std::fs::read(srv.dir.path().join("f.bin")).unwrap(), data);
    let size = c.cmd("SIZE f.bin", 213).await;
    assert_eq!(size.text(), data.len().to_string());
    // Download (active).
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    c.cmd(&format!("EPRT |1|127.0.0.1|{port}|"), 200).await;
    c.cmd("RETR f.bin", 150).await;
    let (s, _) = l.accept().await.unwrap();
    let got = read_all(s).await;
    c.expect(226).await;
    assert_eq!(got, data);
    // PORT form.
    let p = xftp_proto::hostport::format_port_arg(format!("127.0.0.1:{port}").parse().unwrap());
    c.cmd(&format!("PORT {p}"), 200).await;
    c.cmd("RETR f.bin", 150).await;
    let (s, _) = l.accept().await.unwrap();
    assert_eq!(read_all(s).await, data);
    c.expect(226).await;
}

#[tokio::test]
async fn type_a_converts_both_ways() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "t.txt", b"one\ntwo\r\nthree\n");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE A", 200).await;
    // SIZE in TYPE A counts the wire bytes (RFC 3659 section 4).
    assert_eq!(c.cmd("SIZE t.txt", 213).await.text(), "17");
    // Not for a file large enough that counting is a cost: TYPE I then.
    let big = srv.dir.path().join("big.txt");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    let r = c.cmd("SIZE big.txt", 550).await;
    assert!(r.text().contains("send TYPE I first"), "{r}");
    c.cmd("TYPE I", 200).await;
    assert_eq!(c.cmd("SIZE big.txt", 213).await.text(), "16777217");
    c.cmd("TYPE A", 200).await;
    let d = c.epsv_connect(1).await;
    c.cmd("RETR t.txt", 150).await;
    assert_eq!(
        read_all(d.into_iter().next().unwrap()).await,
        b"one\r\ntwo\r\nthree\r\n"
    );
    c.expect(226).await;
    let d = c.epsv_connect(1).await;
    c.cmd("STOR u.txt", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(b"a\r\nb\rc\r\n").await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("u.txt")).unwrap(),
        b"a\nb\rc\n"
    );
}

#[tokio::test]
async fn rest_resumes_download_and_upload() {
    let srv = start(|_| {}).await;
    let data = pattern(100_000, 4);
    write(srv.dir.path(), "f", &data);
    write(srv.dir.path(), "part", &data[..30_000]);
    let mut c = Ctl::login(srv.addr).await;
    let d = c.epsv_connect(1).await;
    c.cmd("REST 60000", 350).await;
    c.cmd("RETR f", 150).await;
    assert_eq!(
        read_all(d.into_iter().next().unwrap()).await,
        &data[60_000..]
    );
    c.expect(226).await;
    c.cmd("REST 200000", 350).await;
    c.cmd("RETR f", 554).await;
    let d = c.epsv_connect(1).await;
    c.cmd("REST 30000", 350).await;
    c.cmd("STOR part", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(&data[30_000..]).await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(std::fs::read(srv.dir.path().join("part")).unwrap(), data);
}

#[tokio::test]
async fn listings_and_file_management() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "a b.txt", b"12345");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MKD \"q\" dir", 257).await;
    c.cmd("MKD sub", 257).await;
    c.cmd("MKD sub", 550).await;
    c.cmd("CWD sub", 250).await;
    assert!(c.cmd("PWD", 257).await.text().starts_with("\"/sub\""));
    c.cmd("CDUP", 200).await;
    let d = c.epsv_connect(1).await;
    c.cmd("NLST", 150).await;
    let names = String::from_utf8(read_all(d.into_iter().next().unwrap()).await).unwrap();
    c.expect(226).await;
    assert_eq!(names, "\"q\" dir\r\na b.txt\r\nsub\r\n");
    // A file named in a subdirectory comes back as named, as a pattern's
    // matches do: a client fetches what the listing says.
    write(&srv.dir.path().join("sub"), "in.txt", b"x");
    for arg in ["sub/in.txt", "sub/in*"] {
        let d = c.epsv_connect(1).await;
        c.cmd(&format!("NLST {arg}"), 150).await;
        let names = String::from_utf8(read_all(d.into_iter().next().unwrap()).await).unwrap();
        c.expect(226).await;
        assert_eq!(names, "sub/in.txt\r\n", "NLST {arg}");
    }
    std::fs::remove_file(srv.dir.path().join("sub/in.txt")).unwrap();
    let d = c.epsv_connect(1).await;
    c.cmd("LIST -la", 150).await;
    let list = String::from_utf8(read_all(d.into_iter().next().unwrap()).await).unwrap();
    c.expect(226).await;
    assert!(
        list.lines()
            .any(|l| l.starts_with("-rw") && l.ends_with(" a b.txt")),
        "{list}"
    );
    assert!(
        list.lines()
            .any(|l| l.starts_with('d') && l.ends_with(" sub")),
        "{list}"
    );
    let d = c.epsv_connect(1).await;
    c.cmd("MLSD", 150).await;
    let ml = String::from_utf8(read_all(d.into_iter().next().unwrap()).await).unwrap();
    c.expect(226).await;
    assert!(ml.contains("type=file;size=5;"), "{ml}");
    assert!(ml.contains("type=dir;"), "{ml}");
    let r = c.cmd("MLST a b.txt", 250).await;
    assert!(
        r.lines[1].contains("size=5;") && r.lines[1].ends_with("/a b.txt"),
        "{r}"
    );
    // YYYYMMDDHHMMSS, and the milliseconds where there are some.
    let m = c.cmd("MDTM a b.txt", 213).await;
    assert!([14, 18].contains(&m.text().len()), "{m}");
    let at = |ms: u64| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_000 + ms);
        std::fs::File::options()
            .write(true)
            .open(srv.dir.path().join("a b.txt"))
            .and_then(|f| f.set_modified(t))
            .unwrap();
    };
    at(250);
    assert_eq!(
        c.cmd("MDTM a b.txt", 213).await.text(),
        "20231114221320.250"
    );
    at(0);
    assert_eq!(c.cmd("MDTM a b.txt", 213).await.text(), "20231114221320");
    c.cmd("RNFR a b.txt", 350).await;
    c.cmd("RNTO sub/c.txt", 250).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("sub/c.txt")).unwrap(),
        b"12345"
    );
    c.cmd("RMD sub", 550).await;
    c.cmd("DELE sub", 550).await;
    c.cmd("DELE sub/c.txt", 250).await;
    c.cmd("RMD sub", 250).await;
    let stat = c.cmd("STAT", 211).await;
    assert!(stat.text().contains("MULT: 1"), "{stat}");
    let feat = c.cmd("FEAT", 211).await;
    assert!(feat.lines.iter().any(|l| l.trim() == "MULT"), "{feat}");
    c.cmd("QUIT", 221).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_sessions() {
    let srv = start(|_| {}).await;
    let data = Arc::new(pattern(200_000, 5));
    write(srv.dir.path(), "f", &data);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let addr = srv.addr;
        let data = data.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Ctl::login(addr).await;
            for _ in 0..3 {
                let d = c.epsv_connect(1).await;
                c.cmd("RETR f", 150).await;
                assert_eq!(read_all(d.into_iter().next().unwrap()).await, *data);
                c.expect(226).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn mult_negotiation() {
    let srv = start(|cfg| {
        cfg.max_streams = 16;
        cfg.default_streams = 4;
    })
    .await;
    let mut c = Ctl::login(srv.addr).await;
    assert!(c.cmd("MULT 8", 200).await.text().starts_with("MULT 8 "));
    assert!(c.cmd("MULT 1000", 200).await.text().starts_with("MULT 16 "));
    assert!(c.cmd("MULT", 200).await.text().starts_with("MULT 4 "));
    assert!(c.cmd("MULT 1", 200).await.text().starts_with("MULT 1 "));
}

async fn multi_retr(c: &mut Ctl, conns: Vec<TcpStream>, name: &str, len: usize) -> Vec<u8> {
    c.cmd(&format!("RETR {name}"), 150).await;
    let dst = Arc::new(MemFile::default());
    let rep = recv_file(dst.clone(), conns, Some(len as u64))
        .await
        .unwrap();
    c.expect(226).await;
    assert_eq!(rep.bytes, len as u64);
    dst.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_passive_active_and_mprt() {
    let srv = start(|cfg| cfg.record_size = 64 * 1024).await;
    let rs = 64 * 1024;
    let mut c = Ctl::login(srv.addr).await;
    for (i, len) in [0usize, 1, rs - 1, rs, rs + 1, 3 * 1024 * 1024 + 13]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, 10 + i as u64);
        let name = format!("f{i}");
        write(srv.dir.path(), &name, &data);
        for n in [2usize, 3, 8] {
            c.cmd(&format!("MULT {n}"), 200).await;
            // Passive: n connections to one port.
            let conns = c.epsv_connect(n).await;
            assert_eq!(multi_retr(&mut c, conns, &name, len).await, data);
            // Active: the server opens n connections to our one port; count them.
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = l.local_addr().unwrap().port();
            c.cmd(&format!("EPRT |1|127.0.0.1|{port}|"), 200).await;
            c.cmd(&format!("RETR {name}"), 150).await;
            let mut conns = Vec::new();
            for _ in 0..n {
                conns.push(l.accept().await.unwrap().0);
            }
            let dst = Arc::new(MemFile::default());
            recv_file(dst.clone(), conns, Some(len as u64))
                .await
                .unwrap();
            c.expect(226).await;
            assert_eq!(dst.to_vec(), data);
            let extra =
                tokio::time::timeout(std::time::Duration::from_millis(50), l.accept()).await;
            assert!(extra.is_err(), "server opened more than {n} connections");
            // MPRT: one listener per connection.
            let mut ls = Vec::new();
            for _ in 0..n {
                ls.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
            }
            let addrs: Vec<_> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
            c.cmd(
                &format!("MPRT {}", xftp_proto::hostport::format_mprt_arg(&addrs)),
                200,
            )
            .await;
            // Upload over MPRT: the client sends blocks.
            let up = format!("up{i}_{n}");
            c.cmd(&format!("STOR {up}"), 150).await;
            let mut conns = Vec::new();
            for l in &ls {
                conns.push(l.accept().await.unwrap().0);
            }
            let src = Arc::new(MemFile::from(data.clone()));
            let cfg = SendConfig {
                record_size: 8192,
                ..SendConfig::default()
            };
            send_file(src, len as u64, conns, &cfg).await.unwrap();
            c.expect(226).await;
            assert_eq!(std::fs::read(srv.dir.path().join(&up)).unwrap(), data);
        }
    }
}

#[tokio::test]
async fn multi_stream_passive_refuses_extra_connections() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "f", &pattern(10_000, 1));
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 2", 200).await;
    let r = c.cmd("EPSV", 229).await;
    let port = xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap();
    let a = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let b = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.cmd("RETR f", 150).await;
    let dst = Arc::new(MemFile::default());
    recv_file(dst.clone(), vec![a, b], Some(10_000))
        .await
        .unwrap();
    c.expect(226).await;
    // The listener is gone once the transfer has its connections.
    assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_stream_upload_killed_connection_leaves_no_file() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 3", 200).await;
    let conns = c.epsv_connect(3).await;
    c.cmd("STOR big", 150).await;
    // Send a few valid blocks on one connection, then reset them all.
    let mut conns = conns;
    let hdr = xftp_stripe::block::BlockHeader::data(0, 1000);
    conns[0].write_all(&hdr.encode()).await.unwrap();
    conns[0].write_all(&[7u8; 1000]).await.unwrap();
    for s in conns {
        let std = s.into_std().unwrap();
        socket2::SockRef::from(&std)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(std);
    }
    c.expect(426).await;
    assert!(std::fs::read_dir(srv.dir.path()).unwrap().next().is_none());
}

#[tokio::test]
async fn buffer_size_commands() {
    let srv = start(|cfg| cfg.max_bufsize = 8 << 20).await;
    let data = pattern(300_000, 8);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    // Linux doubles the request; the reply says what is in force.
    let r = c.cmd("SITE BUFSIZE 65536", 200).await;
    assert!(
        r.text().contains("65536 requested, in force rcv 131072"),
        "{r}"
    );
    let r = c.cmd("STAT", 211).await;
    assert!(r.text().contains("65536 requested"), "{r}");
    // The buffer applies to data connections: a transfer still works.
    let d = c.epsv_connect(1).await;
    c.cmd("RETR f", 150).await;
    assert_eq!(read_all(d.into_iter().next().unwrap()).await, data);
    c.expect(226).await;
    c.cmd("SITE WIN 64k", 200).await;
    c.cmd("SBUF 1M", 200).await;
    c.cmd("SITE RBUFSZ 1g", 501).await;
    c.cmd("SITE BUFSIZE 10", 501).await;
    c.cmd("SITE BUFSIZE lots", 501).await;
    // "64 k" is not 64 bytes, nor is a second size ignored.
    c.cmd("SITE BUFSIZE 64 k", 501).await;
    c.cmd("SITE RBUFSZ 1M 2M", 501).await;
    c.cmd("SBUF lots", 501).await;
    let r = c.cmd("SITE BUFSIZE auto", 200).await;
    assert!(r.text().contains("autotuning"), "{r}");
    c.cmd("SITE FROB", 500).await;
    // Known commands without their arguments: 501, not "unknown".
    for bare in ["SITE CHMOD", "SITE RANGES", "SITE RESUMABLE", "SITE"] {
        c.cmd(bare, 501).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_schedule_on_request() {
    let srv = start(|cfg| cfg.record_size = 4096).await;
    let data = pattern(1_000_003, 12);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    c.cmd("OPTS MULT STATIC", 200).await;
    let conns = c.epsv_connect(4).await;
    c.cmd("RETR f", 150).await;
    let dst = Arc::new(MemFile::default());
    let rep = recv_file(dst.clone(), conns, Some(data.len() as u64))
        .await
        .unwrap();
    c.expect(226).await;
    assert_eq!(dst.to_vec(), data);
    // Static: four equal contiguous parts, one per connection.
    let per: Vec<u64> = rep.streams.iter().map(|s| s.bytes).collect();
    assert_eq!(per.iter().sum::<u64>(), data.len() as u64);
    assert!(
        per.iter()
            .all(|b| b.abs_diff(data.len() as u64 / 4) <= 4096),
        "{per:?}"
    );
    c.cmd("OPTS MULT DYNAMIC", 200).await;
    c.cmd("OPTS MULT SIDEWAYS", 501).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_after_opts_mult_endgame_reaches_an_endgame_receiver() {
    let srv = start(|_| {}).await;
    // Above the 1 MiB floor, not a whole number of records.
    let data = pattern(9 * 1024 * 1024 + 4321, 13);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("OPTS MULT ENDGAME", 200).await;
    c.cmd("MULT 4", 200).await;
    let conns = c.epsv_connect(4).await;
    c.cmd("RETR f", 150).await;
    let dst = Arc::new(MemFile::default());
    let len = data.len() as u64;
    let rep = xftp_stripe::Receiver::file_endgame(dst.clone(), len, Default::default(), conns)
        .finish()
        .await
        .unwrap();
    c.expect(226).await;
    assert_eq!(dst.to_vec(), data);
    assert_eq!(rep.bytes, len);
    assert_eq!(rep.duplicate_bytes, 0, "nothing was stuck on loopback");
}

/// A MODE E block of `data[off..end]`.
fn block_of(data: &[u8], off: usize, end: usize) -> Vec<u8> {
    let h = xftp_stripe::block::BlockHeader::data(off as u64, (end - off) as u64);
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&data[off..end]);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_announced_with_allo_completes_past_a_stuck_connection() {
    // A client in its endgame (ALLO after OPTS MULT ENDGAME) sends the
    // records a stuck connection holds again on the others, and never
    // ends that connection: the server stores the first copy of a range,
    // checks the others against it, and completes once every byte of the
    // announced size is in, with the stuck connection still open.
    let srv = start(|_| {}).await;
    let data = pattern(3 * 1024 * 1024 + 77, 31);
    let len = data.len() as u64;
    let mut c = Ctl::login(srv.addr).await;
    // Nothing asked for: ALLO is superfluous, as RFC 959 allows.
    c.cmd("ALLO 5", 202).await;
    c.cmd("OPTS MULT ENDGAME", 200).await;
    c.cmd("MULT 4", 200).await;
    let mut conns = c.epsv_connect(4).await;
    c.cmd(&format!("ALLO {len}"), 200).await;
    c.cmd("STOR up", 150).await;
    const R: usize = 256 * 1024;
    // Connection 3 takes the first record and stalls in its middle.
    let first = block_of(&data, 0, R);
    conns[3].write_all(&first[..first.len() / 2]).await.unwrap();
    // The others send every record, and the second one twice.
    for (i, off) in (0..data.len()).step_by(R).enumerate() {
        let b = block_of(&data, off, (off + R).min(data.len()));
        conns[i % 3].write_all(&b).await.unwrap();
        if i == 1 {
            conns[2].write_all(&b).await.unwrap();
        }
    }
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), c.read_reply())
        .await
        .expect("the upload completes without the stuck connection")
        .expect("control connection open");
    assert_eq!(r.code, 226, "{r}");
    assert!(std::fs::read(srv.dir.path().join("up")).unwrap() == data);
    // The session goes on; the next ALLO needs asking again.
    c.cmd("NOOP", 200).await;
    drop(conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_in_the_endgame_refuses_a_copy_that_differs() {
    let srv = start(|_| {}).await;
    let data = pattern(2 * 1024 * 1024 + 5, 32);
    let len = data.len();
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("OPTS MULT ENDGAME", 200).await;
    c.cmd("MULT 2", 200).await;
    let mut conns = c.epsv_connect(2).await;
    c.cmd(&format!("ALLO {len}"), 200).await;
    c.cmd("STOR up", 150).await;
    const R: usize = 256 * 1024;
    // Every record but the last, the first one twice, the copy changed.
    let first = block_of(&data, 0, R);
    let mut bad = first.clone();
    bad[xftp_stripe::block::HEADER_LEN + 100] ^= 1;
    conns[0].write_all(&first).await.unwrap();
    conns[1].write_all(&bad).await.unwrap();
    let last = (len - 1) / R * R;
    // The server may refuse as soon as both copies of the first range are
    // in, and end the connections: a write after that fails, as it may.
    for off in (R..last).step_by(R) {
        if conns[0]
            .write_all(&block_of(&data, off, off + R))
            .await
            .is_err()
        {
            break;
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The last record: every byte is in now, one range in two versions.
    let _ = conns[0].write_all(&block_of(&data, last, len)).await;
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), c.read_reply())
        .await
        .expect("a reply")
        .expect("control connection open");
    assert!(r.code >= 400, "two versions of one range were taken: {r}");
    assert!(
        !srv.dir.path().join("up").exists(),
        "a file that is not what was sent was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_does_not_wait_for_a_connection_that_is_late() {
    // MULT 4 granted, three connections open (the fourth's SYN lost, say):
    // the server starts on the three instead of waiting for the fourth
    // until its data timeout, and the session goes on after.
    let srv = start(|_| {}).await;
    let data = pattern(3 * 1024 * 1024 + 5, 14);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    let conns = c.epsv_connect(3).await;
    c.cmd("RETR f", 150).await;
    let dst = Arc::new(MemFile::default());
    let rep = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        recv_file(dst.clone(), conns, Some(data.len() as u64)),
    )
    .await
    .expect("the server waited for the missing connection")
    .unwrap();
    let r = c.expect(226).await;
    assert!(r.text().contains("on 3 connections"), "{r}");
    assert_eq!(dst.to_vec(), data);
    assert_eq!(rep.streams.len(), 3);
    c.cmd("NOOP", 200).await;
}

/// A port on loopback whose connects hang: its listener's accept queue
/// is full and nothing accepts, so the kernel drops further SYNs (as a
/// lossy path loses one). The fillers are returned to keep it full.
fn black_hole() -> (
    socket2::Socket,
    Vec<std::net::TcpStream>,
    std::net::SocketAddr,
) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    s.listen(0).unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)) {
            Ok(f) => fillers.push(f),
            Err(_) => return (s, fillers, addr),
        }
    }
    panic!("the accept queue of {addr} never filled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mprt_download_does_not_wait_for_a_connect_that_hangs() {
    // MPRT with four addresses, one of which does not answer: the server
    // starts on the three that connected, as in active mode, instead of
    // waiting for the fourth until its data timeout (30 s).
    let srv = start(|_| {}).await;
    let data = pattern(3 * 1024 * 1024 + 5, 18);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    let mut ls = Vec::new();
    for _ in 0..3 {
        ls.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let mut addrs: Vec<_> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let (_hole, _fillers, hole) = black_hole();
    addrs.push(hole);
    c.cmd(
        &format!("MPRT {}", xftp_proto::hostport::format_mprt_arg(&addrs)),
        200,
    )
    .await;
    c.cmd("RETR f", 150).await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut conns = Vec::new();
        for l in &ls {
            conns.push(l.accept().await.unwrap().0);
        }
        let dst = Arc::new(MemFile::default());
        recv_file(dst.clone(), conns, Some(data.len() as u64))
            .await
            .unwrap();
        c.expect(226).await;
        dst
    })
    .await
    .expect("the server waited for the connect that hangs");
    assert!(got.to_vec() == data, "content");
    c.cmd("NOOP", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_connection_joins_the_running_download() {
    let srv = start(|cfg| cfg.record_size = 64 * 1024).await;
    let data = pattern(32 * 1024 * 1024 + 9, 15);
    write(srv.dir.path(), "f", &data);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    let r = c.cmd("EPSV", 229).await;
    let port = xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap();
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    c.cmd("RETR f", 150).await;
    // Nothing is read yet: the three hold what their windows take, and
    // the server has started without the fourth, which comes now.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    let dst = Arc::new(MemFile::default());
    let rep = recv_file(dst.clone(), conns, Some(data.len() as u64))
        .await
        .unwrap();
    let r = c.expect(226).await;
    assert!(r.text().contains("on 4 connections"), "{r}");
    assert!(dst.to_vec() == data, "content");
    assert!(rep.streams[3].bytes > 0, "{:?}", rep.streams);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_does_not_wait_for_a_connection_that_is_late() {
    // As for a download: MULT 4 granted, three connections open; the
    // server takes the upload on the three, and the session goes on.
    let srv = start(|_| {}).await;
    let data = pattern(3 * 1024 * 1024 + 5, 16);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    let conns = c.epsv_connect(3).await;
    c.cmd("STOR up", 150).await;
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let src = Arc::new(MemFile::from(data.clone()));
    send_file(src, data.len() as u64, conns, &cfg)
        .await
        .unwrap();
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), c.expect(226))
        .await
        .expect("the server waited for the missing connection");
    assert!(r.text().contains("on 3 connection"), "{r}");
    assert!(std::fs::read(srv.dir.path().join("up")).unwrap() == data);
    c.cmd("NOOP", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_connection_joins_the_running_upload() {
    let srv = start(|_| {}).await;
    let data = pattern(8 * 1024 * 1024 + 9, 17);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MULT 4", 200).await;
    let r = c.cmd("EPSV", 229).await;
    let port = xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap();
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    c.cmd("STOR up", 150).await;
    // The server has started on the three (it waits 250 ms for the rest);
    // the fourth comes now, and every connection carries records.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let src = Arc::new(MemFile::from(data.clone()));
    let rep = send_file(src, data.len() as u64, conns, &cfg)
        .await
        .unwrap();
    assert!(rep.streams.iter().all(|s| s.bytes > 0), "{:?}", rep.streams);
    let r = c.expect(226).await;
    assert!(r.text().contains("on 4 connection"), "{r}");
    assert!(std::fs::read(srv.dir.path().join("up")).unwrap() == data);
}

#[tokio::test]
async fn replies_to_a_pipelined_flight_go_out_together() {
    // A login flight sent in one write is answered in one write (one
    // segment, not six: on a path with a router queue of a few packets
    // the last of six waited out a retransmission timeout), and a reply
    // a later command needs from the client (EPSV before LIST) is not
    // held back by it. (Linux: TCP_INFO counts the segments.)
    use tokio::io::AsyncReadExt;
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "f", b"12345");
    let mut c = Ctl::connect(srv.addr).await;
    let segs = |s: &TcpStream| xftp_tune::tcpinfo::read(s).map(|i| i.data_segs_in);
    let before = segs(&c.s).unwrap();
    c.send_raw(b"USER anonymous\r\nPASS a@b\r\nTYPE I\r\nFEAT\r\nSIZE f\r\nEPSV\r\n")
        .await;
    let mut got = String::new();
    let mut buf = vec![0u8; 65536];
    while !got.contains("\r\n229 ") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(20), c.s.read(&mut buf))
            .await
            .expect("no reply")
            .unwrap();
        assert!(n > 0, "closed after {got:?}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    for code in ["331 ", "230 ", "200 ", "211", "213 5", "229 "] {
        assert!(got.contains(code), "{code} missing: {got:?}");
    }
    let segs_for_flight = segs(&c.s).unwrap() - before;
    assert_eq!(
        segs_for_flight, 1,
        "six replies in {segs_for_flight} segments"
    );
    // LIST right behind a fresh EPSV, both in one write: the 229 comes
    // first, the data connection after it, then the listing.
    c.send_raw(b"EPSV\r\nLIST\r\n").await;
    let r = c.expect(229).await;
    let port = xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap();
    let d = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    c.expect(150).await;
    let listing = read_all(d).await;
    assert!(String::from_utf8_lossy(&listing).contains('f'));
    c.expect(226).await;
}

/// In MODE E a listing is MODE E blocks too, on the transfer's
/// connections, which stay open for the next transfer (GridFTP's data
/// channel caching: `globus-url-copy -r -fast` lists a tree so, and
/// aborts on a listing in stream mode). MODE S lists in stream mode again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_in_mode_e_are_framed_on_kept_connections() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "a.txt", b"hello");
    std::fs::create_dir(srv.dir.path().join("d")).unwrap();
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("MODE E", 200).await;
    let conns = c.epsv_connect(1).await;
    c.cmd("MLSD", 150).await;
    let dst = Arc::new(MemFile::default());
    let (_, kept) = xftp_stripe::Receiver::file_kept(dst.clone(), None, conns)
        .finish_kept()
        .await
        .expect("a framed listing");
    c.expect(226).await;
    let text = String::from_utf8(dst.to_vec()).unwrap();
    assert!(
        text.contains("; a.txt\r\n") && text.contains("; d\r\n"),
        "{text}"
    );
    assert_eq!(kept.len(), 1, "the connection stays open");
    // The next listing goes over the kept connection: no EPSV.
    let r = c.cmd("LIST d", 150).await;
    assert!(r.text().contains("kept"), "{r}");
    let dst = Arc::new(MemFile::default());
    let (_, kept) = xftp_stripe::Receiver::file_kept(dst.clone(), None, kept)
        .finish_kept()
        .await
        .expect("a framed listing on the kept connection");
    c.expect(226).await;
    assert!(dst.to_vec().is_empty(), "d is empty");
    drop(kept);
    // Stream mode again: the listing is the bytes themselves.
    c.cmd("MODE S", 200).await;
    let mut conns = c.epsv_connect(1).await;
    c.cmd("NLST", 150).await;
    let body = read_all(conns.remove(0)).await;
    c.expect(226).await;
    assert_eq!(body, b"a.txt\r\nd\r\n");
}

/// In stream mode a clean close is the end of the file, also when the
/// client died mid-upload. An xftp client announces the size (ALLO after
/// OPTS MULT ENDGAME): an upload that ends before it is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_upload_shorter_than_its_allo_is_not_kept() {
    let srv = start(|_| {}).await;
    let data = pattern(300_000, 41);
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("OPTS MULT ENDGAME", 200).await;
    c.cmd(&format!("ALLO {}", data.len()), 200).await;
    let mut conns = c.epsv_connect(1).await;
    c.cmd("STOR cut.bin", 150).await;
    let mut d = conns.remove(0);
    d.write_all(&data[..100_000]).await.unwrap();
    d.shutdown().await.unwrap();
    drop(d);
    let r = c.expect(426).await;
    assert!(r.text().contains("announced (ALLO)"), "{r}");
    assert!(!srv.dir.path().join("cut.bin").exists());
    // Whole, it is kept; without ALLO the close is the end, as ever.
    c.cmd(&format!("ALLO {}", data.len()), 200).await;
    let mut conns = c.epsv_connect(1).await;
    c.cmd("STOR whole.bin", 150).await;
    let mut d = conns.remove(0);
    d.write_all(&data).await.unwrap();
    d.shutdown().await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("whole.bin")).unwrap(),
        data
    );
    let mut conns = c.epsv_connect(1).await;
    c.cmd("STOR plain.bin", 150).await;
    let mut d = conns.remove(0);
    d.write_all(&data[..100_000]).await.unwrap();
    d.shutdown().await.unwrap();
    drop(d);
    c.expect(226).await;
    assert_eq!(
        std::fs::metadata(srv.dir.path().join("plain.bin"))
            .unwrap()
            .len(),
        100_000
    );
}
