//! Bad input gets the right reply code and the session stays usable.
//! Each test names the rule it pins.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn paths_cannot_escape_the_root() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "inside", b"ok");
    std::os::unix::fs::symlink("/etc", srv.dir.path().join("etc-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", srv.dir.path().join("host-link")).unwrap();
    let mut c = Ctl::login(srv.addr).await;
    // `..` above the root stays at the root.
    c.cmd("CWD ../../..", 250).await;
    let pwd = c.cmd("PWD", 257).await;
    assert!(pwd.text().starts_with("\"/\""), "{pwd}");
    // Absolute paths are inside the virtual root: /etc/passwd does not exist there.
    c.cmd("SIZE /etc/passwd", 550).await;
    c.cmd("SIZE ../../../../etc/passwd", 550).await;
    c.cmd("SIZE %2e%2e/%2e%2e/etc/passwd", 550).await;
    c.cmd("SIZE ..\\..\\..\\etc\\passwd", 550).await;
    // Overlong UTF-8 for '/' and '.' is just bytes in a name, never a separator.
    c.send_raw(b"SIZE \xc0\xae\xc0\xae\xc0\xaf\xc0\xae\xc0\xae\xc0\xafetc\xc0\xafpasswd\r\n")
        .await;
    c.expect(550).await;
    // Symbolic links that lead outside are refused.
    c.cmd("CWD etc-link", 550).await;
    c.cmd("SIZE etc-link/passwd", 550).await;
    c.cmd("SIZE host-link", 550).await;
    c.cmd("RETR host-link", 550).await;
    c.cmd("STOR etc-link/evil", 553).await;
    c.cmd("MKD etc-link/evil", 550).await;
    // A NUL byte in a path is refused.
    c.send_raw(b"SIZE inside\0x\r\n").await;
    c.expect(501).await;
    c.cmd("SIZE inside", 213).await;
}

#[tokio::test]
async fn writes_in_place_do_not_follow_links_outside() {
    // APPE and STOR after REST open the file, which follows a symbolic
    // link; STOR alone renames onto the name and replaces the link.
    let srv = start(|_| {}).await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, b"secret").unwrap();
    let link = |target: &std::path::Path, name: &str| {
        std::os::unix::fs::symlink(target, srv.dir.path().join(name)).unwrap()
    };
    link(&secret, "evil");
    link(&outside.path().join("created"), "dangle");
    write(srv.dir.path(), "mine", b"0123");
    link(std::path::Path::new("mine"), "inside-link");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    let r = c.cmd("APPE evil", 553).await;
    assert!(r.text().contains("outside the served root"), "{r}");
    c.cmd("APPE dangle", 553).await;
    c.cmd("REST 3", 350).await;
    c.cmd("STOR evil", 553).await;
    c.cmd("REST 1", 350).await;
    c.cmd("STOR dangle", 553).await;
    assert_eq!(std::fs::read(&secret).unwrap(), b"secret");
    assert!(!outside.path().join("created").exists());
    // A link inside the root is followed: APPE extends its target.
    let mut d = c.epsv_connect(1).await;
    c.cmd("APPE inside-link", 150).await;
    let mut s = d.remove(0);
    s.write_all(b"45").await.unwrap();
    drop(s);
    c.expect(226).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("mine")).unwrap(),
        b"012345"
    );
}

#[tokio::test]
async fn a_mode_e_upload_announcing_more_connections_than_taken_fails_at_once() {
    // globus-url-copy -p 8 against --max-streams 2: the six connections
    // never taken would hold their EODs in the listen queue until the
    // stall timeout; the EOF block's count says so at once.
    use xftp_stripe::block::BlockHeader;
    let srv = start(|cfg| cfg.max_streams = 2).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    c.cmd("MODE E", 200).await;
    let d = c.epsv_connect(1).await;
    c.cmd("STOR g8", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(&BlockHeader::data(0, 4).encode())
        .await
        .unwrap();
    d.write_all(b"data").await.unwrap();
    d.write_all(&BlockHeader::eof(8).encode()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), c.expect(426))
        .await
        .expect("no reply to an EOF announcing 8 connections");
    assert!(r.text().contains("announced 8 data connections"), "{r}");
    let left: Vec<_> = std::fs::read_dir(srv.dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_data_connection_past_the_maximum_is_reset_not_left_waiting() {
    // A sender writing on a connection the server never takes: left in
    // the listen queue, its writes block once the buffers fill (and the
    // EOF block may be behind them); reset, the sender learns at once.
    use xftp_stripe::block::BlockHeader;
    let srv = start(|cfg| cfg.max_streams = 2).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    c.cmd("MODE E", 200).await;
    let mut d = c.epsv_connect(3).await;
    c.cmd("STOR g3", 150).await;
    let mut extra = d.pop().unwrap();
    let block = vec![7u8; 1 << 20];
    let writes = async {
        for i in 0..64u64 {
            extra
                .write_all(&BlockHeader::data(i << 20, 1 << 20).encode())
                .await?;
            extra.write_all(&block).await?;
        }
        std::io::Result::Ok(())
    };
    let r = tokio::time::timeout(Duration::from_secs(10), writes)
        .await
        .expect("writes on a connection past the maximum blocked");
    assert!(r.is_err(), "64 MiB written on a connection never taken");
    drop(d);
}

#[tokio::test]
async fn gridftp_parallelism_counts_against_the_address_budget() {
    let srv = start(|cfg| cfg.max_streams_per_ip = 8).await;
    let mut a = Ctl::login(srv.addr).await;
    let r = a.cmd("OPTS RETR Parallelism=6,6,6;", 200).await;
    assert_eq!(r.text(), "Parallelism set to 6.");
    // A second session from the same address gets what is left.
    let mut b = Ctl::login(srv.addr).await;
    let r = b.cmd("OPTS RETR Parallelism=16,16,16;", 200).await;
    assert_eq!(r.text(), "Parallelism set to 2.");
    // The first one's given back when it lowers its own.
    a.cmd("OPTS RETR Parallelism=1,1,1;", 200).await;
    let r = b.cmd("OPTS RETR Parallelism=16,16,16;", 200).await;
    assert_eq!(r.text(), "Parallelism set to 7.");
}

#[tokio::test]
async fn active_mode_refuses_bounce_and_privileged_ports() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    // RFC 2577: a third-party address (FTP bounce) is refused.
    c.cmd("PORT 10,0,0,1,39,16", 501).await;
    c.cmd("EPRT |1|127.0.0.2|10000|", 501).await;
    c.cmd("EPRT |2|::1|10000|", 501).await;
    // A privileged port is refused.
    c.cmd("PORT 127,0,0,1,0,25", 501).await;
    c.cmd("EPRT |1|127.0.0.1|21|", 501).await;
    c.cmd("EPRT |1|127.0.0.1|10000|", 200).await;
    // MPRT applies the same rules to every address.
    c.cmd("MULT 2", 200).await;
    c.cmd("MPRT |1|127.0.0.1|10000| |1|10.1.1.1|10001|", 501)
        .await;
    c.cmd("MPRT |1|127.0.0.1|10000|", 501).await;
    c.cmd("MPRT |1|127.0.0.1|10000| |1|127.0.0.1|10000|", 501)
        .await;
    c.cmd("MPRT |1|127.0.0.1|10000| |1|127.0.0.1|10001|", 200)
        .await;
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn malformed_commands_keep_the_session_usable() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::connect(srv.addr).await;
    // Commands before login.
    c.cmd("PWD", 530).await;
    c.cmd("RETR x", 530).await;
    c.cmd("PASS x", 503).await;
    c.cmd("USER anonymous", 331).await;
    c.cmd("PASS x", 230).await;
    // Over-long line: 500, then the session goes on.
    let long = "A".repeat(xftp_proto::MAX_LINE * 2);
    c.cmd(&long, 500).await;
    c.cmd("NOOP", 200).await;
    // Unknown and unimplemented commands.
    c.cmd("FROB x", 500).await;
    c.cmd("REIN", 502).await;
    // STOU without a data connection: refused before any file is made.
    c.cmd("STOU", 425).await;
    c.cmd("12AB", 500).await;
    // Bad arguments.
    c.cmd("TYPE X", 504).await;
    c.cmd("MODE B", 504).await;
    c.cmd("STRU R", 504).await;
    c.cmd("REST abc", 501).await;
    c.cmd("PORT 1,2,3", 501).await;
    c.cmd("RETR", 501).await;
    c.cmd("MULT 0", 501).await;
    // RNTO without RNFR is a bad sequence.
    c.cmd("RNTO x", 503).await;
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn missing_files_directories_and_read_only() {
    let srv = start(|cfg| cfg.anonymous_write = false).await;
    write(srv.dir.path(), "f", b"data");
    std::fs::create_dir(srv.dir.path().join("d")).unwrap();
    let mut c = Ctl::login(srv.addr).await;
    // RETR of a missing file and of a directory.
    c.cmd("RETR missing", 550).await;
    c.cmd("RETR d", 550).await;
    c.cmd("CWD f", 550).await;
    // Writes by a read-only user.
    c.cmd("STOR new", 550).await;
    c.cmd("APPE f", 550).await;
    c.cmd("DELE f", 550).await;
    c.cmd("MKD x", 550).await;
    c.cmd("RMD d", 550).await;
    c.cmd("RNFR f", 550).await;
    assert_eq!(std::fs::read(srv.dir.path().join("f")).unwrap(), b"data");
    assert!(!srv.dir.path().join("new").exists());
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn store_into_missing_directory_is_553() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("STOR no/such/dir/file", 553).await;
    c.cmd("MKD sub", 257).await;
    c.cmd("STOR sub", 553).await;
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn idle_control_connection_times_out() {
    let srv = start(|cfg| cfg.idle_timeout = Duration::from_millis(1500)).await;
    let mut c = Ctl::login(srv.addr).await;
    let r = c.read_reply().await.expect("a 421 before close");
    assert_eq!(r.code, 421);
    assert!(
        c.read_reply().await.is_none(),
        "connection closed after 421"
    );
}

#[tokio::test]
async fn data_connection_that_never_arrives_gets_425() {
    let srv = start(|cfg| cfg.data_timeout = Duration::from_millis(1500)).await;
    write(srv.dir.path(), "f", b"data");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("EPSV", 229).await;
    c.cmd("RETR f", 150).await;
    c.expect(425).await;
    // Without any PORT/PASV, a transfer fails with 425 and no 150 before
    // it (nothing started): RETR, STOR, APPE, LIST, also in MODE E, where
    // GridFTP clients would reuse the last transfer's connections.
    c.cmd("RETR f", 425).await;
    c.cmd("STOR g", 425).await;
    c.cmd("APPE f", 425).await;
    c.cmd("LIST", 425).await;
    c.cmd("TYPE I", 200).await;
    c.cmd("MODE E", 200).await;
    let r = c.cmd("RETR f", 425).await;
    assert!(
        r.text().contains("keeps connections only after a transfer"),
        "{r}"
    );
    c.cmd("MODE S", 200).await;
    assert!(!srv.dir.path().join("g").exists());
    assert_eq!(std::fs::read(srv.dir.path().join("f")).unwrap(), b"data");
    c.cmd("NOOP", 200).await;
    // And the session still transfers afterwards.
    let d = c.epsv_connect(1).await;
    c.cmd("RETR f", 150).await;
    let got = read_all(d.into_iter().next().unwrap()).await;
    c.expect(226).await;
    assert_eq!(got, b"data");
}

/// ABOR while the server waits for the data connection ends the wait at
/// once (426 for the transfer, 226 for ABOR), not at the data timeout; a
/// NOOP then is answered, and STAT waits for the transfer.
#[tokio::test]
async fn abor_before_the_data_connection_ends_the_wait() {
    let srv = start(|cfg| cfg.data_timeout = Duration::from_secs(60)).await;
    write(srv.dir.path(), "f", b"data");
    let mut c = Ctl::login(srv.addr).await;
    for upload in [false, true] {
        c.cmd("EPSV", 229).await;
        c.cmd(if upload { "STOR g" } else { "RETR f" }, 150).await;
        let t = std::time::Instant::now();
        c.send_raw(b"NOOP\r\nABOR\r\n").await;
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            c.expect(200).await;
            let r = c.expect(426).await;
            c.expect(226).await;
            r
        })
        .await
        .expect("ABOR answered before the data timeout");
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(r.text().contains("before its data connection"), "{r}");
    }
    assert!(!srv.dir.path().join("g").exists());
    // ABOR in the same segment as the command (read already with it).
    c.cmd("EPSV", 229).await;
    let t = std::time::Instant::now();
    c.send_raw(b"RETR f\r\nABOR\r\nNOOP\r\n").await;
    tokio::time::timeout(Duration::from_secs(10), async {
        c.expect(150).await;
        c.expect(426).await;
        c.expect(226).await;
        c.expect(200).await;
    })
    .await
    .expect("a pipelined ABOR answered before the data timeout");
    assert!(t.elapsed() < Duration::from_secs(10));
    // A command sent while the server waits is run after the transfer.
    let d = c.epsv_connect(1).await;
    c.cmd("RETR f", 150).await;
    c.send_raw(b"PWD\r\n").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let got = read_all(d.into_iter().next().unwrap()).await;
    c.expect(226).await;
    c.expect(257).await;
    assert_eq!(got, b"data");
}

#[tokio::test]
async fn reset_upload_leaves_no_file() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    let d = c.epsv_connect(1).await;
    c.cmd("STOR up.bin", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(&pattern(100_000, 1)).await.unwrap();
    // Reset instead of a clean close: SO_LINGER 0 then drop.
    let std = d.into_std().unwrap();
    socket2::SockRef::from(&std)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(std);
    c.expect(426).await;
    assert!(!srv.dir.path().join("up.bin").exists());
    let leftovers: Vec<_> = std::fs::read_dir(srv.dir.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn aborted_upload_leaves_no_file_and_append_rolls_back() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "log", b"old");
    let mut c = Ctl::login(srv.addr).await;
    // ABOR during STOR.
    let d = c.epsv_connect(1).await;
    c.cmd("STOR up.bin", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(&pattern(10_000, 2)).await.unwrap();
    c.send_raw(b"\xff\xf4\xff\xf2ABOR\r\n").await;
    c.expect(426).await;
    c.expect(226).await;
    assert!(!srv.dir.path().join("up.bin").exists());
    // ABOR during APPE: the file returns to its old length.
    let d = c.epsv_connect(1).await;
    c.cmd("APPE log", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(b"new data").await.unwrap();
    d.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.send_raw(b"ABOR\r\n").await;
    c.expect(426).await;
    c.expect(226).await;
    assert_eq!(std::fs::read(srv.dir.path().join("log")).unwrap(), b"old");
    // ABOR as TCP urgent data, as Python's ftplib sends it (all of
    // "ABOR\r\n" with MSG_OOB, so the LF is the urgent byte): the LF must
    // stay in the stream.
    let d = c.epsv_connect(1).await;
    c.cmd("APPE log", 150).await;
    let mut d = d.into_iter().next().unwrap();
    d.write_all(b"more").await.unwrap();
    d.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    socket2::SockRef::from(&c.s)
        .send_out_of_band(b"ABOR\r\n")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        c.expect(426).await;
        c.expect(226).await;
    })
    .await
    .expect("no reply to an urgent ABOR");
    assert_eq!(std::fs::read(srv.dir.path().join("log")).unwrap(), b"old");
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn failed_logins_with_users_file() {
    let mut db = xftp_server::UserDb::default();
    db.set("alice", "right", xftp_server::Access::ReadOnly)
        .unwrap();
    let srv = start(move |cfg| {
        cfg.anonymous = false;
        cfg.users = db;
    })
    .await;
    let mut c = Ctl::connect(srv.addr).await;
    c.cmd("USER anonymous", 530).await;
    c.cmd("USER alice", 331).await;
    c.cmd("PASS right", 230).await;
    c.cmd("STOR x", 550).await;
    let mut c = Ctl::connect(srv.addr).await;
    for _ in 0..2 {
        c.cmd("USER alice", 331).await;
        c.cmd("PASS wrong", 530).await;
    }
    c.cmd("USER mallory", 331).await;
    c.cmd("PASS x", 421).await;
    assert!(c.read_reply().await.is_none());
}

/// An anonymous login does not clear a named user's failed guesses from
/// the same address (it would let guessing go on without end).
#[tokio::test]
async fn an_anonymous_login_does_not_clear_failed_guesses() {
    let mut db = xftp_server::UserDb::default();
    db.set("alice", "right", xftp_server::Access::ReadOnly)
        .unwrap();
    let srv = start(move |cfg| {
        cfg.users = db;
        cfg.login_max_failures = 3;
    })
    .await;
    for _ in 0..2 {
        let mut c = Ctl::connect(srv.addr).await;
        c.cmd("USER alice", 331).await;
        c.cmd("PASS wrong", 530).await;
        c.cmd("USER anonymous", 331).await;
        c.cmd("PASS a@b", 230).await;
    }
    // The third guess locks the address: the two before it still count.
    let mut c = Ctl::connect(srv.addr).await;
    c.cmd("USER alice", 331).await;
    c.cmd("PASS wrong", 421).await;
}

#[tokio::test]
async fn stalled_data_connection_is_aborted() {
    let srv = start(|cfg| cfg.stall_timeout = Duration::from_secs(2)).await;
    write(srv.dir.path(), "big", &pattern(64 << 20, 3));
    let mut c = Ctl::login(srv.addr).await;
    // Connect but never read: the server's writes stall once buffers fill.
    let d = c.epsv_connect(1).await;
    c.cmd("RETR big", 150).await;
    let r = c.read_reply().await.expect("a reply");
    assert_eq!(r.code, 426, "{r}");
    assert!(r.text().contains("no data moved"), "{r}");
    drop(d);
    c.cmd("NOOP", 200).await;
}

#[tokio::test]
async fn an_overlong_command_line_is_refused_and_the_session_goes_on() {
    let srv = start(|_| {}).await;
    let mut c = Ctl::login(srv.addr).await;
    let mut line = b"SIZE ".to_vec();
    line.extend(std::iter::repeat_n(b'a', 20_000));
    line.extend_from_slice(b"\r\n");
    c.send_raw(&line).await;
    let r = c.expect(500).await;
    assert!(r.text().contains("too long"), "{r}");
    c.cmd("NOOP", 200).await;
}

/// One hostile MODE E upload: `blocks` written on one connection after
/// STOR; the server must answer with a 4xx/5xx, keep no file, and go on.
async fn hostile_upload(what: &str, blocks: Vec<Vec<u8>>, stall: Duration) -> xftp_proto::Reply {
    eprintln!("hostile upload: {what}");
    let srv = start(|cfg| cfg.stall_timeout = stall).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    c.cmd("MODE E", 200).await;
    let d = c.epsv_connect(1).await;
    c.cmd("STOR hostile", 150).await;
    let mut d = d.into_iter().next().unwrap();
    for b in blocks {
        if d.write_all(&b).await.is_err() {
            break;
        }
    }
    let r = tokio::time::timeout(Duration::from_secs(20), c.read_reply())
        .await
        .expect("no reply to a hostile upload")
        .expect("the control connection closed");
    assert!(r.code >= 400, "accepted: {r}");
    drop(d);
    let left: Vec<_> = std::fs::read_dir(srv.dir.path()).unwrap().collect();
    assert!(left.is_empty(), "kept {left:?}");
    c.cmd("NOOP", 200).await;
    r
}

#[tokio::test]
async fn hostile_mode_e_uploads_are_refused_and_keep_nothing() {
    use xftp_stripe::block::BlockHeader;
    let data = |off: u64, bytes: &[u8]| {
        let mut v = BlockHeader::data(off, bytes.len() as u64).encode().to_vec();
        v.extend_from_slice(bytes);
        v
    };
    let long = Duration::from_secs(30);
    // A count near 2^64: refused from the header, nothing allocated.
    let huge = BlockHeader::data(0, u64::MAX - 5).encode().to_vec();
    hostile_upload("a count near 2^64", vec![huge, vec![0u8; 1024]], long).await;
    // An offset whose end passes 2^64.
    let wrap = BlockHeader::data(u64::MAX - 2, 4).encode().to_vec();
    hostile_upload("an end past 2^64", vec![wrap, b"abcd".to_vec()], long).await;
    // Overlapping ranges with different bytes.
    hostile_upload(
        "overlapping ranges",
        vec![
            data(0, b"aaaaaaaa"),
            data(4, b"bbbbbbbb"),
            BlockHeader::eof(1).encode().to_vec(),
        ],
        long,
    )
    .await;
    // A hole: EOF and EOD, but bytes 4..8 never came.
    hostile_upload(
        "a hole",
        vec![
            data(0, b"aaaa"),
            data(8, b"cccc"),
            BlockHeader::eof(1).encode().to_vec(),
        ],
        long,
    )
    .await;
    // An EOD count that lies (more than the connections taken).
    hostile_upload(
        // More connections may still come (up to --max-streams): the
        // stall timeout ends the wait.
        "an EOD count that lies",
        vec![data(0, b"aaaa"), BlockHeader::eof(3).encode().to_vec()],
        Duration::from_secs(2),
    )
    .await;
    // A connection that never sends EOD: the stall timeout ends it.
    let t = std::time::Instant::now();
    hostile_upload("no EOD", vec![data(0, b"aaaa")], Duration::from_secs(2)).await;
    assert!(t.elapsed() < Duration::from_secs(15));
    // A descriptor with unknown bits.
    let mut bad = BlockHeader::data(0, 4).encode().to_vec();
    bad[0] = 0x01;
    hostile_upload("unknown descriptor bits", vec![bad, b"abcd".to_vec()], long).await;
}

#[tokio::test]
async fn mfmt_sets_a_time_and_replies_with_the_one_the_file_has() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "f", b"data");
    let mut c = Ctl::login(srv.addr).await;
    let r = c.cmd("MFMT 20200102030405 f", 213).await;
    assert!(r.text().starts_with("Modify=20200102030405; "), "{r:?}");
    let t = std::fs::metadata(srv.dir.path().join("f"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(
        t,
        std::time::UNIX_EPOCH + Duration::from_secs(1_577_934_245)
    );
    // MDTM reads the same time back.
    let r = c.cmd("MDTM f", 213).await;
    assert_eq!(r.text(), "20200102030405");
    c.cmd("MFMT 20200102030405 missing", 550).await;
    c.cmd("MFMT yesterday f", 501).await;
    c.cmd("NOOP", 200).await;
}

/// A client that sends commands but reads no replies: the server's writes
/// block once the socket buffers fill, and the idle timeout still ends the
/// session (it would otherwise hold its place under the session limits).
#[tokio::test]
async fn a_client_that_reads_no_replies_is_ended_by_the_idle_timeout() {
    let srv = start(|cfg| {
        cfg.idle_timeout = Duration::from_secs(2);
        cfg.max_sessions_per_ip = 1;
    })
    .await;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&srv.addr.into()).unwrap();
    sock.set_nonblocking(true).unwrap();
    let mut s = tokio::net::TcpStream::from_std(sock.into()).unwrap();
    // HELP's reply is long: a few thousand fill both ends' buffers.
    let flood = b"HELP\r\n".repeat(2000);
    let t = std::time::Instant::now();
    // The write itself may block or fail once the server stops reading.
    let _ = tokio::time::timeout(Duration::from_secs(3), s.write_all(&flood)).await;
    // Held, the place refuses a second session (421); given back, the
    // next one is greeted (220).
    loop {
        let mut n = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        let mut first = [0u8; 3];
        n.read_exact(&mut first).await.unwrap();
        if &first == b"220" {
            break;
        }
        assert_eq!(&first, b"421");
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the session that reads no replies still holds its place"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(s);
}

/// Commands sent while a transfer runs wait in a queue; a client that
/// sends without end is cut off rather than filling the server's memory.
#[tokio::test]
async fn commands_piled_up_during_a_transfer_are_bounded() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "big", &pattern(16 << 20, 9));
    let mut c = Ctl::login(srv.addr).await;
    // The data connection is opened and never read: the transfer stalls.
    let _d = c.epsv_connect(1).await;
    c.cmd("RETR big", 150).await;
    let lines = b"XYZZ\r\n".repeat(10_000);
    let _ = tokio::time::timeout(Duration::from_secs(5), c.s.write_all(&lines)).await;
    let r = c.read_reply().await.expect("a reply before the close");
    assert_eq!(r.code, 421, "{r}");
    assert!(r.text().contains("commands sent during a transfer"), "{r}");
}

/// `LIST -la` takes options; a name that starts with `-` is listed when
/// an entry has it, and one with a `/` is a path, never options that would
/// list the current directory instead.
#[tokio::test]
async fn list_arguments_that_start_with_a_dash() {
    let srv = start(|_| {}).await;
    std::fs::create_dir(srv.dir.path().join("-ldir")).unwrap();
    write(&srv.dir.path().join("-ldir"), "inside", b"x");
    write(srv.dir.path(), "top", b"y");
    let mut c = Ctl::login(srv.addr).await;
    async fn list(c: &mut Ctl, arg: &str) -> String {
        let d = c.epsv_connect(1).await;
        c.cmd(&format!("LIST {arg}"), 150).await;
        let got = read_all(d.into_iter().next().unwrap()).await;
        c.expect(226).await;
        String::from_utf8(got).unwrap()
    }
    let l = list(&mut c, "-la").await;
    assert!(l.contains("top") && l.contains("-ldir"), "{l}");
    let l = list(&mut c, "-ldir").await;
    assert!(l.contains("inside") && !l.contains("top"), "{l}");
    c.cmd("EPSV", 229).await;
    c.cmd("LIST -nonexistent/", 550).await;
}

/// With a one-port --passive-ports range, a session's second PASV (its
/// first never used: the RETR failed) gets the same port again.
#[tokio::test]
async fn a_new_pasv_frees_the_sessions_own_port_first() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let srv = start(move |cfg| cfg.passive_ports = Some((port, port))).await;
    write(srv.dir.path(), "f", b"data");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("PASV", 227).await;
    c.cmd("RETR missing", 550).await;
    c.cmd("PASV", 227).await;
    let d = c.epsv_connect(1).await;
    c.cmd("RETR f", 150).await;
    assert_eq!(read_all(d.into_iter().next().unwrap()).await, b"data");
    c.expect(226).await;
}

/// REST+STOR writes in place (how a stock client resumes), so an upload
/// stopped at --max-upload-size leaves what it wrote: the 552 says so,
/// rather than that nothing was stored.
#[tokio::test]
async fn a_rest_upload_over_the_limit_says_what_it_left() {
    let srv = start(|cfg| cfg.max_upload_size = Some(1 << 20)).await;
    write(srv.dir.path(), "f", &vec![b'A'; 3_000_000]);
    let mut c = Ctl::login(srv.addr).await;
    let d = c.epsv_connect(1).await;
    c.cmd("REST 100", 350).await;
    c.cmd("STOR f", 150).await;
    let mut d = d.into_iter().next().unwrap();
    let _ = d.write_all(&vec![b'Z'; 2_000_000]).await;
    drop(d);
    let r = c.read_reply().await.expect("the upload's end");
    assert_eq!(r.code, 552, "{r}");
    assert!(r.text().contains("written in place from byte 100"), "{r}");
}

/// The limit is on the file an upload leaves: APPE after APPE, or a REST
/// past the limit (a sparse file), cannot grow one beyond it.
#[tokio::test]
async fn appends_and_a_rest_past_the_limit_cannot_grow_a_file_beyond_it() {
    let srv = start(|cfg| cfg.max_upload_size = Some(1 << 20)).await;
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE I", 200).await;
    for (i, want) in [(0, 226), (1, 552)] {
        let d = c.epsv_connect(1).await;
        c.cmd("APPE a", 150).await;
        let mut d = d.into_iter().next().unwrap();
        let _ = d.write_all(&vec![b'A' + i; 900_000]).await;
        drop(d);
        let r = c.read_reply().await.expect("the append's end");
        assert_eq!(r.code, want, "append {i}: {r}");
    }
    // The refused append is rolled back.
    let a = std::fs::read(srv.dir.path().join("a")).unwrap();
    assert_eq!(a.len(), 900_000);
    assert!(a.iter().all(|&b| b == b'A'));
    // Refused before any data: no sparse file of 50 MB.
    write(srv.dir.path(), "sparse", b"0123456789");
    c.cmd("EPSV", 229).await;
    c.cmd("REST 50000000", 350).await;
    let r = c.cmd("STOR sparse", 552).await;
    assert!(r.text().contains("limit of 1048576 bytes"), "{r}");
    assert_eq!(
        std::fs::metadata(srv.dir.path().join("sparse"))
            .unwrap()
            .len(),
        10
    );
    // And a missing file to resume is said without an errno.
    c.cmd("EPSV", 229).await;
    c.cmd("REST 5", 350).await;
    let r = c.cmd("STOR missing", 553).await;
    assert!(!r.text().contains("os error"), "{r}");
    c.cmd("NOOP", 200).await;
}

/// REST in TYPE A would count converted bytes (SIZE does, the file does
/// not): refused rather than resumed at the wrong place. A STOR name with
/// a trailing slash names a directory and replaces no file.
#[tokio::test]
async fn rest_in_ascii_and_a_file_name_with_a_trailing_slash_are_refused() {
    let srv = start(|_| {}).await;
    write(srv.dir.path(), "t.txt", b"line1\nline2\n");
    let mut c = Ctl::login(srv.addr).await;
    c.cmd("TYPE A", 200).await;
    c.cmd("EPSV", 229).await;
    c.cmd("REST 7", 350).await;
    c.cmd("RETR t.txt", 504).await;
    c.cmd("REST 7", 350).await;
    c.cmd("STOR t.txt", 504).await;
    c.cmd("TYPE I", 200).await;
    c.cmd("STOR t.txt/", 553).await;
    assert_eq!(
        std::fs::read(srv.dir.path().join("t.txt")).unwrap(),
        b"line1\nline2\n"
    );
}

#[tokio::test]
async fn the_root_and_unlistable_names_are_refused_in_words() {
    let srv = start(|_| {}).await;
    std::fs::create_dir(srv.dir.path().join("d")).unwrap();
    write(srv.dir.path(), "f", b"data");
    let mut c = Ctl::login(srv.addr).await;
    // The root is not the client's to delete or lock (mode 0) as it
    // cannot remove or rename it.
    let r = c.cmd("DELE /", 550).await;
    assert!(r.text().contains("root directory"), "{r}");
    let r = c.cmd("SITE CHMOD 0 /", 550).await;
    assert!(r.text().contains("root directory"), "{r}");
    let r = c.cmd("SITE CHMOD 0 .", 550).await;
    assert!(r.text().contains("root directory"), "{r}");
    // A directory deleted as a file, moved into itself: said so, no errno.
    let r = c.cmd("DELE d", 550).await;
    assert!(r.text().contains("RMD"), "{r}");
    c.cmd("RNFR d", 350).await;
    let r = c.cmd("RNTO d/sub", 550).await;
    assert!(r.text().contains("cannot move into itself"), "{r}");
    assert!(!r.text().contains("os error"), "{r}");
    // A name with a line break could never be listed or named again.
    c.send_raw(b"MKD cr\rX\r\n").await;
    let r = c.expect(550).await;
    assert!(r.text().contains("line break"), "{r}");
    assert_eq!(std::fs::read_dir(srv.dir.path()).unwrap().count(), 2);
    c.cmd("NOOP", 200).await;
}
