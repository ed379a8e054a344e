//! `xftp send` / `xftp recv` end to end, running the built binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

const XFTP: &str = env!("CARGO_BIN_EXE_xftp");

fn data(len: usize) -> Vec<u8> {
    let mut x = 0x2545_f491u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Start a listening side; returns the child (stderr still readable) and
/// the address it printed.
fn listen(
    sub: &str,
    extra: &[&str],
    stdin: Stdio,
) -> (Child, String, BufReader<std::process::ChildStderr>) {
    let mut c = Command::new(XFTP)
        .arg(sub)
        .args(["--listen", "127.0.0.1:0", "--json"])
        .args(extra)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();
    (c, addr, err)
}

fn json_of(stderr: &str) -> serde_json::Value {
    let line = stderr
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON summary in {stderr:?}"));
    serde_json::from_str(line).unwrap()
}

fn run_pair(n: &str, payload: &[u8]) {
    let (mut recv, addr, mut rerr) = listen("recv", &[], Stdio::null());
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", n, "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sin = send.stdin.take().unwrap();
    let p = payload.to_vec();
    let feeder = std::thread::spawn(move || {
        sin.write_all(&p).unwrap();
    });
    let mut out = Vec::new();
    recv.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    feeder.join().unwrap();
    let so = send.wait_with_output().unwrap();
    let rs = recv.wait().unwrap();
    let mut rtext = String::new();
    rerr.read_to_string(&mut rtext).unwrap();
    let stext = String::from_utf8_lossy(&so.stderr).to_string();
    assert!(so.status.success(), "send failed: {stext}");
    assert!(rs.success(), "recv failed: {rtext}");
    assert_eq!(out.len(), payload.len());
    assert_eq!(Sha256::digest(&out), Sha256::digest(payload));
    let sj = json_of(&stext);
    let rj = json_of(&rtext);
    for j in [&sj, &rj] {
        assert_eq!(j["status"], "ok");
        assert_eq!(j["bytes"], payload.len() as u64);
        assert_eq!(j["streams"], n.parse::<u64>().unwrap());
        assert!(j["error"].is_null());
        let per: u64 = j["per_stream_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum();
        // The stream's bytes on the wire: the 4-byte role before the
        // payload (what each end says it is) counts too.
        assert_eq!(per, payload.len() as u64 + 4);
    }
}

#[test]
fn pipe_one_and_eight_connections() {
    let d = data(5 * 1024 * 1024 + 7);
    run_pair("1", &d);
    run_pair("8", &d);
    run_pair("3", &[]);
}

#[test]
fn sender_may_listen_too() {
    let d = data(1024 * 1024 + 1);
    let (mut send, addr, mut serr) = listen("send", &[], Stdio::piped());
    let mut sin = send.stdin.take().unwrap();
    let p = d.clone();
    let feeder = std::thread::spawn(move || sin.write_all(&p).unwrap());
    let recv = Command::new(XFTP)
        .args(["recv", &addr, "-p", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    feeder.join().unwrap();
    assert!(
        recv.status.success(),
        "{}",
        String::from_utf8_lossy(&recv.stderr)
    );
    assert!(recv.stdout == d);
    assert!(send.wait().unwrap().success());
    let mut t = String::new();
    serr.read_to_string(&mut t).unwrap();
    assert_eq!(json_of(&t)["streams"], 5);
}

#[test]
fn killed_sender_makes_recv_fail() {
    let (mut recv, addr, mut rerr) = listen("recv", &[], Stdio::null());
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Keep stdin open so the sender is mid-stream, then kill it.
    let mut sin = send.stdin.take().unwrap();
    sin.write_all(&data(3 * 1024 * 1024)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    send.kill().unwrap();
    send.wait().unwrap();
    drop(sin);
    let mut out = Vec::new();
    recv.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let st = recv.wait().unwrap();
    let mut t = String::new();
    rerr.read_to_string(&mut t).unwrap();
    assert!(!st.success(), "recv must fail when the stream is cut: {t}");
    assert_eq!(json_of(&t)["status"], "error");
}

/// A receiver stopped by a signal mid-stream still prints its `--json`
/// summary (status error, the bytes written out until then), as get and
/// put do, and exits 128 + the signal.
#[test]
fn a_signal_still_gets_the_json_summary() {
    let (mut recv, addr, mut rerr) = listen("recv", &[], Stdio::null());
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sin = send.stdin.take().unwrap();
    sin.write_all(&data(1024 * 1024)).unwrap();
    let mut out = recv.stdout.take().unwrap();
    let mut first = vec![0u8; 1024 * 1024];
    out.read_exact(&mut first).unwrap();
    let st = Command::new("kill")
        .args(["-INT", &recv.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let code = recv.wait().unwrap().code();
    let mut t = String::new();
    rerr.read_to_string(&mut t).unwrap();
    drop(sin);
    let _ = send.kill();
    let _ = send.wait();
    assert_eq!(code, Some(130), "{t}");
    let j = json_of(&t);
    assert_eq!(j["status"], "error", "{t}");
    assert_eq!(j["error"], "interrupted (SIGINT)", "{t}");
    assert_eq!(j["bytes"], 1024 * 1024, "{t}");
}

#[test]
fn nobody_listening_is_an_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let o = Command::new(XFTP)
        .args(["send", &addr, "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let t = String::from_utf8_lossy(&o.stderr);
    assert_eq!(json_of(&t)["status"], "error");
    // An FTP server at that address: named.
    let ftp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ftp_addr = ftp.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in ftp.incoming().take(4) {
            let _ = c.and_then(|mut c| c.write_all(b"220 an FTP server\r\n"));
        }
    });
    let o = Command::new(XFTP)
        .args(["send", &ftp_addr, "-p", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && t.contains("like an FTP server"),
        "{t}"
    );
    // A host without its port, or a URL: said as such.
    for peer in ["127.0.0.1", "ftp://127.0.0.1:21/"] {
        let o = Command::new(XFTP)
            .args(["recv", peer])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && t.contains("is not HOST:PORT"), "{t}");
    }
}

#[test]
fn pipe_over_tls_and_refused_without_it() {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let payload = data(3 << 20);
    // A sender without TLS is refused by a TLS listener, with the reason.
    let (mut recv, addr, _err) = listen("recv", &tls, Stdio::null());
    let port = addr.rsplit(':').next().unwrap().to_string();
    let out = Command::new(XFTP)
        .args(["send", &format!("localhost:{port}"), "-p", "2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("TLS"), "{e}");
    // The listener's flags on the connecting side are a mistake, not a
    // stream in clear (it went in clear, exit 0).
    let out = Command::new(XFTP)
        .args(["send", &format!("localhost:{port}"), "-p", "2"])
        .args(tls)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("listening side") && e.contains("--tls"), "{e}");
    // With --cacert: every connection TLS, the bytes in order.
    let mut send = Command::new(XFTP)
        .args(["send", &format!("localhost:{port}"), "-p", "4"])
        .args(["--cacert", cert.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The receiver's output is drained while the sender runs (the sender
    // waits for the receiver, which waits for room in its stdout pipe).
    let mut out = recv.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        out.read_to_end(&mut got).unwrap();
        got
    });
    send.stdin.take().unwrap().write_all(&payload).unwrap();
    let st = send.wait().unwrap();
    let got = reader.join().unwrap();
    assert!(st.success());
    assert!(recv.wait().unwrap().success());
    assert_eq!(Sha256::digest(&got), Sha256::digest(&payload));
}

/// Two senders joined by mistake: each gets the other's stream, and
/// neither may say it delivered its own.
/// Two senders joined by mistake both fail, also where one has nothing
/// to send: its end-of-stream is no receipt, and the one with data does
/// not report it delivered.
#[test]
fn two_senders_both_fail() {
    for (mine, theirs, n) in [
        (300_000, 200_000, "4"),
        (0, 1_234_567, "4"),
        (1_234_567, 0, "1"),
    ] {
        let (mut listener, addr, mut lerr) = listen("send", &["-p", n], Stdio::piped());
        let mut lin = listener.stdin.take().unwrap();
        let feed = std::thread::spawn(move || {
            let _ = lin.write_all(&data(mine));
        });
        let mut other = Command::new(XFTP)
            .args(["send", &addr, "-p", n])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut oin = other.stdin.take().unwrap();
        // It may have failed before reading any of it.
        let _ = oin.write_all(&data(theirs));
        drop(oin);
        let out = other.wait_with_output().unwrap();
        feed.join().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mine}/{theirs}: {err}");
        assert!(err.contains("an `xftp send` too"), "{err}");
        let mut rest = String::new();
        lerr.read_to_string(&mut rest).unwrap();
        assert!(!listener.wait().unwrap().success(), "{rest}");
        assert!(rest.contains("an `xftp send` too"), "{rest}");
    }
}

/// Two receivers joined by mistake would wait for each other for ever:
/// each says what the peer is, at once, and fails.
#[test]
fn two_receivers_both_fail_at_once() {
    let (mut listener, addr, mut lerr) = listen("recv", &[], Stdio::null());
    let other = Command::new(XFTP)
        .args(["recv", &addr, "-p", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = other.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the peer is an `xftp recv` too"), "{err}");
    let mut rest = String::new();
    lerr.read_to_string(&mut rest).unwrap();
    assert!(!listener.wait().unwrap().success(), "{rest}");
    assert!(rest.contains("the peer is an `xftp recv` too"), "{rest}");
}

/// A producer that writes a line now and then (`tail -f`) has each line
/// delivered soon after it is written, on several connections too, not
/// held until a record fills or the input ends.
#[test]
fn a_slow_producer_is_not_held_back() {
    let (mut recv, addr, _rerr) = listen("recv", &[], Stdio::null());
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = send.stdin.take().unwrap();
    input.write_all(b"first line\n").unwrap();
    input.flush().unwrap();
    // The input stays open: the line must come through on its own.
    let mut out = BufReader::new(recv.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the line did not arrive while the input stayed open");
    assert_eq!(line, "first line\n");
    drop(input);
    assert!(send.wait().unwrap().success());
    assert!(recv.wait().unwrap().success());
}

/// Both ends keep TCP keepalive on their connections, so that a peer
/// whose host vanished is found out rather than waited for for ever
/// (seen with `ss`: a keepalive timer on every established connection of
/// the pair while it idles).
#[test]
fn an_idle_pair_probes_its_peer_with_keepalive() {
    let have_ss = Command::new("ss").arg("-V").output().is_ok();
    if !have_ss {
        eprintln!("SKIP: no ss to look at the sockets' timers");
        return;
    }
    let (mut recv, addr, _rerr) = listen("recv", &[], Stdio::null());
    let port = addr.rsplit(':').next().unwrap().to_string();
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The sender idles on its stdin; look at both ends' sockets.
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (mut recv_side, mut send_side) = (0, 0);
    while std::time::Instant::now() < deadline && (recv_side < 2 || send_side < 2) {
        std::thread::sleep(Duration::from_millis(200));
        let out = Command::new("ss")
            .args(["-tnoH", "state", "established"])
            .output()
            .unwrap();
        seen = String::from_utf8_lossy(&out.stdout).into_owned();
        let with_ka = |local_port_is_ours: bool| {
            seen.lines()
                .filter(|l| l.contains("keepalive"))
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let (local, peer) = (f.get(2).copied(), f.get(3).copied());
                    let ours = format!(":{port}");
                    if local_port_is_ours {
                        local.is_some_and(|a| a.ends_with(&ours))
                    } else {
                        peer.is_some_and(|a| a.ends_with(&ours))
                    }
                })
                .count()
        };
        recv_side = with_ka(true);
        send_side = with_ka(false);
    }
    drop(send.stdin.take());
    let _ = send.wait();
    let _ = recv.wait();
    assert!(recv_side >= 2 && send_side >= 2, "{seen}");
}

/// A receiver whose stdout closes early (`| head -c 100`) says so, not
/// "receiving the stream"; the sender says that the receiver ended it.
#[test]
fn a_closed_stdout_is_named_at_both_ends() {
    let (mut recv, addr, mut rerr) = listen("recv", &[], Stdio::null());
    // Read a little of recv's output, then close it.
    let mut rout = recv.stdout.take().unwrap();
    let mut send = Command::new(XFTP)
        .args(["send", &addr, "-p", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sin = send.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let d = data(64 << 20);
        let _ = sin.write_all(&d);
    });
    let mut first = [0u8; 100];
    rout.read_exact(&mut first).unwrap();
    drop(rout);
    feeder.join().unwrap();
    let so = send.wait_with_output().unwrap();
    assert!(!recv.wait().unwrap().success());
    let mut rtext = String::new();
    rerr.read_to_string(&mut rtext).unwrap();
    let stext = String::from_utf8_lossy(&so.stderr);
    assert!(!so.status.success(), "{stext}");
    assert!(rtext.contains("writing stdout"), "{rtext}");
    assert!(stext.contains("the receiver ended it"), "{stext}");
}
