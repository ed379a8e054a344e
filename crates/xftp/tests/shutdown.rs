//! Stopping `xftp serve`: SIGTERM stops accepting, idle sessions get a 421
//! at once, running transfers may finish within `--shutdown-grace`, and a
//! transfer that cannot finish (its client stopped reading) does not hold
//! the server past the grace, nor past a second signal.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{serve, write_prng_file, Ctl, Server};

fn signal(srv: &Server, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &srv.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill {sig}");
}

/// Log in, ask for `file` over a passive data connection; the data
/// connection is returned unread.
fn start_retr(port: u16, file: &str) -> (Ctl, TcpStream) {
    let mut c = Ctl::login(port);
    assert!(c.cmd("TYPE I").starts_with("200"));
    let dport = c.epsv_port();
    let data = TcpStream::connect(("127.0.0.1", dport)).unwrap();
    let r = c.cmd(&format!("RETR {file}"));
    assert!(r.starts_with("150"), "{r}");
    (c, data)
}

/// Wait for the server to exit; how long it took, and whether it exited
/// with success.
fn wait_exit(srv: &mut Server, limit: Duration) -> (Duration, bool) {
    let t = Instant::now();
    loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            return (t.elapsed(), st.success());
        }
        assert!(
            t.elapsed() < limit,
            "xftp serve still running {limit:?} after the signal"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn still_running(srv: &mut Server) -> bool {
    srv.child.try_wait().unwrap().is_none()
}

#[test]
fn a_stuck_transfer_is_ended_when_the_grace_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    write_prng_file(&dir.path().join("big.bin"), 64_000_000, 1);
    let mut srv = serve(dir.path(), &["--shutdown-grace", "2"]);
    let mut idle = Ctl::login(srv.port);
    // A client that never reads its data: the server's writes block.
    let (mut c, mut data) = start_retr(srv.port, "big.bin");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    signal(&srv, "-TERM");
    // The idle session is told at once.
    let r = idle.reply();
    assert!(r.starts_with("421"), "{r}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // The transfer has its grace: the server waits for it...
    std::thread::sleep(Duration::from_millis(1000));
    assert!(still_running(&mut srv), "exited before the grace was over");
    // ...and no longer (its stall timeout is 120 s).
    let (_, ok) = wait_exit(&mut srv, Duration::from_secs(15));
    assert!(ok, "a stop on SIGTERM is a success");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // The client is told on the control connection...
    let r = c.reply();
    assert!(r.starts_with("421"), "{r}");
    // ...and its data connection is reset, not closed: in stream mode a
    // clean close would read as the end of the file.
    data.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    let end = loop {
        match data.read(&mut buf) {
            Ok(0) => break None,
            Err(e) => break Some(e.kind()),
            Ok(n) => got += n as u64,
        }
    };
    assert!(got < 64_000_000, "the whole file arrived: {got}");
    assert_eq!(
        end,
        Some(std::io::ErrorKind::ConnectionReset),
        "the data connection ended cleanly after {got} bytes"
    );
}

#[test]
fn a_second_signal_ends_the_sessions_at_once() {
    let dir = tempfile::tempdir().unwrap();
    write_prng_file(&dir.path().join("big.bin"), 64_000_000, 2);
    let mut srv = serve(dir.path(), &["--shutdown-grace", "600"]);
    let (_c, _data) = start_retr(srv.port, "big.bin");
    std::thread::sleep(Duration::from_millis(300));
    signal(&srv, "-TERM");
    std::thread::sleep(Duration::from_millis(1000));
    assert!(still_running(&mut srv), "exited with a transfer running");
    signal(&srv, "-INT");
    let (took, ok) = wait_exit(&mut srv, Duration::from_secs(10));
    assert!(ok);
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_running_transfer_finishes_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let len = 48_000_000u64;
    write_prng_file(&dir.path().join("big.bin"), len, 3);
    let mut srv = serve(dir.path(), &["--shutdown-grace", "60"]);
    let (mut c, mut data) = start_retr(srv.port, "big.bin");
    // Read a part, stop the server, read the rest: all of it arrives and
    // the transfer ends with 226 before the server exits.
    let mut buf = vec![0u8; 1 << 20];
    let mut got = data.read(&mut buf).unwrap() as u64;
    signal(&srv, "-TERM");
    std::thread::sleep(Duration::from_millis(500));
    // No new sessions.
    assert!(
        TcpStream::connect(("127.0.0.1", srv.port))
            .and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.read(&mut buf)
            })
            .map_or(true, |n| n == 0),
        "a new session was accepted while stopping"
    );
    loop {
        match data.read(&mut buf).unwrap() {
            0 => break,
            n => got += n as u64,
        }
    }
    assert_eq!(got, len);
    let r = c.reply();
    assert!(r.starts_with("226"), "{r}");
    let (_, ok) = wait_exit(&mut srv, Duration::from_secs(10));
    assert!(ok);
}

#[test]
fn sighup_without_tls_leaves_the_server_and_its_sessions_running() {
    // SIGHUP reloads the certificate; without one it changes nothing,
    // where its default action would end the server with every transfer.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"still here").unwrap();
    let mut srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    signal(&srv, "-HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert!(still_running(&mut srv), "SIGHUP ended the server");
    assert!(c.cmd("NOOP").starts_with("200"));
    let mut fresh = Ctl::login(srv.port);
    assert!(fresh.cmd("SIZE f").starts_with("213 10"));
}
