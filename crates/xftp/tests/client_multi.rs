//! Multi-stream end to end: `xftp get/put -p N` against `xftp serve`, in
//! the three data-connection forms (passive, active, MPRT), compared by
//! sha256; plus the grant being smaller than the request.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod support;
use support::{serve as serve_with, sha256_file, write_prng_file, Server};

/// The engine's default record size (xftp_stripe::DEFAULT_RECORD_SIZE).
const RECORD: u64 = 256 * 1024;

/// The connections a transfer of `len` bytes uses with `-p n`: no more
/// than it has records (the client tells the server before the transfer:
/// records of `record` bytes at least), except with MPRT, whose ports are
/// announced before the size is known.
fn used(n: u32, mode: &[&str], len: u64, record: u64) -> u64 {
    if mode.contains(&"--mprt") {
        u64::from(n)
    } else {
        len.div_ceil(record).clamp(1, u64::from(n))
    }
}

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run xftp")
}

/// [`xftp`] without the endgame (`XFTP_ENDGAME=off`): a transfer that
/// loses a data connection fails, as with a server that has no endgame.
fn xftp_no_endgame(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .env("XFTP_ENDGAME", "off")
        .output()
        .expect("run xftp")
}

fn json_ok(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON line expected: {text:?}");
    serde_json::from_str(lines[0]).unwrap()
}

/// The JSON summary is consistent: `streams` connections, per-stream bytes
/// summing to the total.
fn check_summary(j: &serde_json::Value, len: u64, streams: u64, what: &str) {
    assert_eq!(j["status"], "ok", "{what}");
    assert_eq!(j["bytes"], len, "{what}");
    assert_eq!(j["streams"], streams, "{what}");
    let per: Vec<u64> = j["per_stream_bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no per_stream_bytes"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(per.len() as u64, streams, "{what}: {per:?}");
    assert_eq!(per.iter().sum::<u64>(), len, "{what}: {per:?}");
}

struct Dirs {
    _tmp: tempfile::TempDir,
    srv: PathBuf,
    local: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let srv = tmp.path().join("srv");
    let local = tmp.path().join("local");
    std::fs::create_dir(&srv).unwrap();
    std::fs::create_dir(&local).unwrap();
    Dirs {
        _tmp: tmp,
        srv,
        local,
    }
}

/// Put then get every size with `-p n` in `mode`; compare by sha256.
fn roundtrip(n: u32, mode: &[&str], sizes: &[u64]) {
    let d = dirs();
    let server = serve(&d.srv, 64);
    let p = n.to_string();
    for (i, &len) in sizes.iter().enumerate() {
        let what = format!("-p {n} {mode:?} {len} B");
        let name = format!("f{len}.bin");
        let src = d.local.join(format!("src-{name}"));
        write_prng_file(&src, len, 0xC0FFEE + i as u64);
        let want = sha256_file(&src);
        let url = format!("ftp://127.0.0.1:{}/{name}", server.port);

        let mut args = vec![
            "put",
            src.to_str().unwrap(),
            url.as_str(),
            "-p",
            &p,
            "--json",
        ];
        args.extend_from_slice(mode);
        let j = json_ok(&xftp(&args, &d.local), &format!("put {what}"));
        // Either end cuts a small file into records of 16 KiB at least.
        check_summary(
            &j,
            len,
            used(n, mode, len, 16 * 1024),
            &format!("put {what}"),
        );
        assert_eq!(sha256_file(&d.srv.join(&name)), want, "server copy, {what}");

        let mut args = vec!["get", url.as_str(), "-p", &p, "--json"];
        args.extend_from_slice(mode);
        let j = json_ok(&xftp(&args, &d.local), &format!("get {what}"));
        check_summary(
            &j,
            len,
            used(n, mode, len, 16 * 1024),
            &format!("get {what}"),
        );
        assert_eq!(sha256_file(&d.local.join(&name)), want, "download, {what}");
    }
    let left: Vec<String> = std::fs::read_dir(&d.local)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("xftp-part"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

const EDGE_SIZES: [u64; 6] = [0, 1, RECORD - 1, RECORD, RECORD + 1, 3 * RECORD + 17];

#[test]
fn passive_2_and_3_streams_edge_sizes() {
    roundtrip(2, &[], &EDGE_SIZES);
    roundtrip(3, &[], &EDGE_SIZES);
}

#[test]
fn active_3_streams_edge_sizes() {
    roundtrip(3, &["--active"], &EDGE_SIZES);
}

#[test]
fn mprt_3_streams_edge_sizes() {
    roundtrip(3, &["--mprt"], &EDGE_SIZES);
}

#[test]
fn eight_streams_all_forms_10_mib() {
    for mode in [&[][..], &["--active"][..], &["--mprt"][..]] {
        roundtrip(8, mode, &[10 * 1024 * 1024 + 13]);
    }
}

#[test]
fn sixty_four_streams_passive() {
    roundtrip(64, &[], &[0, 64 * RECORD + 5]);
}

#[test]
fn hundred_mib_passive_8_streams() {
    roundtrip(8, &[], &[100 * 1024 * 1024 + 13]);
}

#[test]
fn grant_smaller_than_request_is_used_and_reported() {
    let d = dirs();
    let server = serve(&d.srv, 2);
    write_prng_file(&d.srv.join("g.bin"), 5 * RECORD + 3, 99);
    let url = format!("ftp://127.0.0.1:{}/g.bin", server.port);
    let out = xftp(&["get", &url, "-p", "8", "--json"], &d.local);
    let j = json_ok(&out, "get -p 8 with --max-streams 2");
    check_summary(&j, 5 * RECORD + 3, 2, "granted 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("granted 2 of 8"), "{err}");
    assert_eq!(
        sha256_file(&d.local.join("g.bin")),
        sha256_file(&d.srv.join("g.bin"))
    );
}

#[test]
fn parallel_flag_rejects_out_of_range() {
    let d = dirs();
    for bad in ["0", "65", "x"] {
        let out = xftp(&["get", "ftp://127.0.0.1:1/f", "-p", bad], &d.local);
        assert!(!out.status.success(), "-p {bad} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("1 to 64"), "-p {bad}: {err}");
    }
}

/// A control-connection proxy that rewrites 229 replies so the data
/// connections go through a data proxy, which cuts the connection with
/// accept index `victim` after `cut_after` payload bytes in `direction`.
mod cutter {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    #[derive(Clone, Copy)]
    pub enum Dir {
        ToClient,
        ToServer,
        /// Like `ToClient`, but the victim stops forwarding and holds both
        /// sockets open instead of closing them (a stalled path).
        StallToClient,
    }

    /// Start the proxy in front of `server_port`; returns its port and a
    /// counter of the data connections it has carried.
    pub fn start(
        server_port: u16,
        victim: usize,
        cut_after: u64,
        dir: Dir,
    ) -> (u16, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let counter = counter.clone();
                thread::spawn(move || control(c, server_port, victim, cut_after, dir, counter));
            }
        });
        (port, count)
    }

    fn control(
        client: TcpStream,
        server_port: u16,
        victim: usize,
        cut_after: u64,
        dir: Dir,
        count: Arc<AtomicUsize>,
    ) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
            return;
        };
        let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        thread::spawn(move || {
            let _ = std::io::copy(&mut c2, &mut s2);
            let _ = s2.shutdown(Shutdown::Write);
        });
        let mut client = client;
        let mut lines = BufReader::new(server);
        let mut line = String::new();
        loop {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(p) = epsv_port(&line) {
                let proxy = data_proxy(p, victim, cut_after, dir, count.clone());
                line = format!("229 Entering Extended Passive Mode (|||{proxy}|)\r\n");
            }
            if client.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        let _ = client.shutdown(Shutdown::Write);
    }

    fn epsv_port(line: &str) -> Option<u16> {
        if !line.starts_with("229 ") {
            return None;
        }
        let start = line.find("(|||")? + 4;
        let end = start + line[start..].find('|')?;
        line[start..end].parse().ok()
    }

    fn data_proxy(
        server_port: u16,
        victim: usize,
        cut_after: u64,
        dir: Dir,
        count: Arc<AtomicUsize>,
    ) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for (i, c) in l.incoming().enumerate() {
                let Ok(c) = c else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(s) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                let stall = matches!(dir, Dir::StallToClient);
                let limit = |d: Dir| match (i == victim, d, dir) {
                    (true, Dir::ToClient, Dir::ToClient | Dir::StallToClient)
                    | (true, Dir::ToServer, Dir::ToServer) => Some(cut_after),
                    _ => None,
                };
                pump(
                    s.try_clone().unwrap(),
                    c.try_clone().unwrap(),
                    limit(Dir::ToClient),
                    stall,
                );
                pump(c, s, limit(Dir::ToServer), false);
            }
        });
        port
    }

    /// Copy `from` to `to`; after `limit` bytes, shut both sockets down
    /// (or, with `stall`, stop and keep them open for a minute).
    fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<u64>, stall: bool) {
        thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut moved = 0u64;
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let n = match limit {
                    Some(l) if moved + n as u64 >= l => {
                        let _ = to.write_all(&buf[..(l - moved) as usize]);
                        if stall {
                            thread::sleep(std::time::Duration::from_secs(60));
                        }
                        let _ = from.shutdown(Shutdown::Both);
                        let _ = to.shutdown(Shutdown::Both);
                        return;
                    }
                    _ => n,
                };
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                moved += n as u64;
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

/// Four connections, static: each carries 4 MiB, so a cut after 1 MiB
/// always happens (a dynamic late joiner could carry less and escape it).
const CUT_OPTS: &[&str] = &["-p", "4", "--static", "--json", "--timeout", "20"];

/// A data connection closed early (the proxy ends it after 1 MiB): in the
/// endgame the server sends what it carried again on the other three and
/// the download completes; without it, the download fails and leaves
/// nothing.
#[test]
fn losing_one_data_connection_completes_a_get_in_the_endgame_only() {
    let d = dirs();
    let server = serve(&d.srv, 8);
    let len = 16 * 1024 * 1024;
    write_prng_file(&d.srv.join("k.bin"), len, 5);
    let (proxy, _) = cutter::start(server.port, 1, 1024 * 1024, cutter::Dir::ToClient);
    let url = format!("ftp://127.0.0.1:{proxy}/k.bin");
    let args = [&["get", url.as_str()][..], CUT_OPTS].concat();
    let j = json_ok(&xftp(&args, &d.local), "get losing a data connection");
    // What reached the client before the cut came again.
    assert!(j["bytes_received_twice"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(
        sha256_file(&d.local.join("k.bin")),
        sha256_file(&d.srv.join("k.bin"))
    );
    std::fs::remove_file(d.local.join("k.bin")).unwrap();
    let (proxy, _) = cutter::start(server.port, 1, 1024 * 1024, cutter::Dir::ToClient);
    let url = format!("ftp://127.0.0.1:{proxy}/k.bin");
    let args = [&["get", url.as_str()][..], CUT_OPTS].concat();
    let out = xftp_no_endgame(&args, &d.local);
    assert!(
        !out.status.success(),
        "a cut data connection must fail the download"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // The engine notices the cut itself: no waiting for a timeout.
    assert!(!err.contains("timed out"), "{err}");
    eprintln!("{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(j["status"], "error");
    let left: Vec<_> = std::fs::read_dir(&d.local).unwrap().collect();
    assert!(left.is_empty(), "nothing may be left locally: {left:?}");
}

/// The automatic mode keeps a way to add connections open for the whole
/// transfer; a download whose every connection is cut must still fail at
/// once (the server's 426), not wait for a connection that never comes.
#[test]
fn cutting_an_automatic_download_fails_it_at_once() {
    let d = dirs();
    let server = serve(&d.srv, 8);
    let len = 16 * 1024 * 1024;
    write_prng_file(&d.srv.join("a.bin"), len, 7);
    let (proxy, _) = cutter::start(server.port, 0, 1024 * 1024, cutter::Dir::ToClient);
    let url = format!("ftp://127.0.0.1:{proxy}/a.bin");
    let cache = d.local.join("cache");
    let t = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", &url, "-p", "auto", "--json", "--timeout", "30"])
        .current_dir(&d.local)
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .expect("run xftp");
    assert!(!out.status.success(), "a cut download must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert!(!err.contains("timed out"), "{err}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "took {:?}: {err}",
        t.elapsed()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(j["status"], "error");
    let left: Vec<_> = std::fs::read_dir(&d.local)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "cache")
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "nothing may be left locally: {left:?}");
}

/// The upload's side of the above: completes in the endgame, fails at both
/// ends without it.
#[test]
fn losing_one_data_connection_completes_a_put_in_the_endgame_only() {
    let d = dirs();
    let server = serve(&d.srv, 8);
    let len = 16 * 1024 * 1024;
    let src = d.local.join("k.bin");
    write_prng_file(&src, len, 6);
    let (proxy, _) = cutter::start(server.port, 1, 1024 * 1024, cutter::Dir::ToServer);
    let url = format!("ftp://127.0.0.1:{proxy}/k.bin");
    let args = [&["put", "k.bin", url.as_str()][..], CUT_OPTS].concat();
    // In the endgame (an upload of 1 MiB and more to xftp) the client
    // sends what the lost connection carried again on the other three.
    let j = json_ok(&xftp(&args, &d.local), "put losing a data connection");
    assert!(
        j["bytes_sent_twice"].as_u64().unwrap_or(0) >= 1 << 20,
        "{j}"
    );
    assert_eq!(sha256_file(&d.srv.join("k.bin")), sha256_file(&src));
    std::fs::remove_file(d.srv.join("k.bin")).unwrap();
    let (proxy, _) = cutter::start(server.port, 1, 1024 * 1024, cutter::Dir::ToServer);
    let url = format!("ftp://127.0.0.1:{proxy}/k.bin");
    let args = [&["put", "k.bin", url.as_str()][..], CUT_OPTS].concat();
    let out = xftp_no_endgame(&args, &d.local);
    assert!(
        !out.status.success(),
        "a cut data connection must fail the upload"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // The engine notices the cut itself: no waiting for a timeout.
    assert!(!err.contains("timed out"), "{err}");
    eprintln!("{err}");
    let names: Vec<String> = std::fs::read_dir(&d.srv)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n == "k.bin"),
        "the server must not keep the upload under its name: {names:?}"
    );
}

#[test]
fn proxy_without_cut_passes_everything_and_counts_connections() {
    // The control case for the two tests above: the same proxy with a cut
    // point past the end of the file lets both directions succeed. It also
    // counts the TCP data connections really opened: 4 per transfer.
    let d = dirs();
    let server = serve(&d.srv, 8);
    let len = 4 * 1024 * 1024 + 3;
    write_prng_file(&d.srv.join("c.bin"), len, 8);
    let (proxy, conns) = cutter::start(server.port, 1, u64::MAX, cutter::Dir::ToClient);
    let url = format!("ftp://127.0.0.1:{proxy}/c.bin");
    let j = json_ok(
        &xftp(&["get", &url, "-p", "4", "--json"], &d.local),
        "get via proxy",
    );
    check_summary(&j, len, 4, "get via proxy");
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 4);
    let url = format!("ftp://127.0.0.1:{proxy}/c2.bin");
    let j = json_ok(
        &xftp(&["put", "c.bin", &url, "-p", "4", "--json"], &d.local),
        "put via proxy",
    );
    check_summary(&j, len, 4, "put via proxy");
    // 4 for the upload; the SIZE check after it needs no data connection.
    assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 8);
    assert_eq!(
        sha256_file(&d.srv.join("c2.bin")),
        sha256_file(&d.srv.join("c.bin"))
    );
}

#[test]
fn ipv6_loopback_all_forms() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIP ipv6_loopback_all_forms: cannot bind [::1] on this machine");
        return;
    }
    let d = dirs();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["serve", "--root"])
        .arg(&d.srv)
        .args(["--listen", "[::1]:0", "--anonymous-write"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn xftp serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = Server { child, port: 0 };
    let port = line.trim().rsplit(':').next().unwrap().to_owned();
    let len = 3 * RECORD + 5;
    write_prng_file(&d.srv.join("six.bin"), len, 6);
    let want = sha256_file(&d.srv.join("six.bin"));
    let url = format!("ftp://[::1]:{port}/six.bin");
    for (i, args) in [
        &["-p", "1"][..],
        &["-p", "1", "--active"][..],
        &["-p", "3"][..],
        &["-p", "3", "--active"][..],
        &["-p", "3", "--mprt"][..],
    ]
    .iter()
    .enumerate()
    {
        let local = format!("six-{i}.bin");
        let mut a = vec!["get", url.as_str(), local.as_str(), "--json"];
        a.extend_from_slice(args);
        let j = json_ok(&xftp(&a, &d.local), &format!("IPv6 get {args:?}"));
        check_summary(&j, len, args[1].parse().unwrap(), &format!("IPv6 {args:?}"));
        assert_eq!(sha256_file(&d.local.join(&local)), want, "IPv6 {args:?}");
    }
    drop(server);
}

#[test]
fn one_stalled_data_connection_times_out_the_download() {
    let d = dirs();
    let server = serve(&d.srv, 8);
    let len = 8 * 1024 * 1024;
    write_prng_file(&d.srv.join("s.bin"), len, 9);
    let (proxy, _) = cutter::start(server.port, 2, 512 * 1024, cutter::Dir::StallToClient);
    let url = format!("ftp://127.0.0.1:{proxy}/s.bin");
    let t0 = std::time::Instant::now();
    // Static split: every connection carries len/4 = 2 MiB, more than the
    // 512 KiB after which the proxy stalls connection 2. (With dynamic
    // assignment a late-starting connection may carry less than that and
    // finish before the stall, which made this test flaky.)
    let out = xftp(
        &["get", &url, "-p", "4", "--static", "--timeout", "2"],
        &d.local,
    );
    assert!(
        !out.status.success(),
        "a stalled connection must fail the download"
    );
    // Well before the proxy's 60 s hold ends: the watchdog cut it short.
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("timed out") && err.contains("--timeout"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(&d.local).unwrap().collect();
    assert!(left.is_empty(), "nothing may be left locally: {left:?}");
}

fn serve(root: &Path, max_streams: u32) -> Server {
    serve_with(root, &["--max-streams", &max_streams.to_string()])
}

/// A new file gets 0666 less the umask, as `cp` would make it (not a
/// fixed 0644 that shows a private user's downloads to everyone), with
/// one connection and with four.
#[test]
fn a_new_download_follows_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    write_prng_file(&d.srv.join("f.bin"), 3_000_000, 21);
    let srv = serve_with(&d.srv, &[]);
    for p in ["1", "4"] {
        let name = format!("u{p}.bin");
        let cmd = format!(
            "umask 077; exec '{}' get -q -p {p} ftp://127.0.0.1:{}/f.bin {name}",
            env!("CARGO_BIN_EXE_xftp"),
            srv.port
        );
        let out = Command::new("sh")
            .args(["-c", &cmd])
            .current_dir(&d.local)
            .env("HOME", &d.local)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mode = std::fs::metadata(d.local.join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "-p {p}");
    }
}

/// A reader of `--json` output that goes away (`| head -c 10`) does not
/// make the transfer fail or panic: the file is still completed.
#[test]
fn a_closed_stdout_does_not_stop_a_download() {
    let d = dirs();
    write_prng_file(&d.srv.join("f.bin"), 8_000_000, 22);
    let srv = serve_with(&d.srv, &[]);
    let url = format!("ftp://127.0.0.1:{}/f.bin", srv.port);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args([
            "get",
            "--json",
            "--json-progress",
            "--limit-rate",
            "8M",
            &url,
            "f.bin",
        ])
        .current_dir(&d.local)
        .env("HOME", &d.local)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        sha256_file(&d.local.join("f.bin")),
        sha256_file(&d.srv.join("f.bin"))
    );
}

/// `--limit-rate` on N connections: the client reads slowly, so the
/// server's sockets wait on closed receive windows. That is no stuck
/// connection: the endgame must not send their records again (the
/// copies took the rate's budget: at 1 MB/s, 8 connections, 5 MB, 0.3 MB
/// came twice and a 500 kB/s limit gave 84 % of it on 16), and the rate
/// holds.
#[test]
fn a_rate_limited_download_gets_no_copies() {
    let d = dirs();
    write_prng_file(&d.srv.join("r.bin"), 4_000_000, 36);
    let srv = serve(&d.srv, 16);
    let url = format!("ftp://127.0.0.1:{}/r.bin", srv.port);
    let j = json_ok(
        &xftp(
            &[
                "get",
                "-p",
                "8",
                "--limit-rate",
                "1M",
                "--json",
                &url,
                "r.bin",
            ],
            &d.local,
        ),
        "rate-limited get",
    );
    assert_eq!(j["bytes_received_twice"].as_u64().unwrap_or(0), 0, "{j}");
    assert_eq!(
        sha256_file(&d.local.join("r.bin")),
        sha256_file(&d.srv.join("r.bin"))
    );
}

/// A local target in a directory that does not exist (or under a file) is
/// refused before connecting, naming the directory, not the partial's
/// temporary file found missing after the login.
#[test]
fn a_target_in_a_missing_directory_is_refused_before_connecting() {
    let d = dirs();
    std::fs::write(d.local.join("file"), b"x").unwrap();
    for (target, says) in [
        ("nodir/sub/x", "mkdir -p nodir/sub"),
        ("file/x", "file is not a directory"),
    ] {
        let out = xftp(&["get", "ftp://127.0.0.1:1/x", target], &d.local);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(says) && !err.contains("connect"), "{err}");
    }
    assert!(!d.local.join("nodir").exists());
}

/// A server short of file descriptors (`ulimit -n 64`) and a client asking
/// for 32 connections: the server grants what its limit has room for, the
/// transfers complete, and no descriptor is kept after them. Before, a
/// transfer either waited 120 s on connections whose probe it could not
/// open, or completed and kept 30 sockets in CLOSE-WAIT, after which every
/// transfer (a stock client's too) was reset.
#[test]
fn a_server_short_of_descriptors_grants_fewer_connections_and_keeps_none() {
    let d = dirs();
    write_prng_file(&d.srv.join("big.bin"), 24 << 20, 37);
    let srv = support::serve_spawned(
        Command::new("bash")
            .arg("-c")
            .arg("ulimit -n 64 && exec \"$0\" serve --root \"$1\" --listen 127.0.0.1:0 --anonymous-write")
            .arg(env!("CARGO_BIN_EXE_xftp"))
            .arg(&d.srv)
            .stderr(Stdio::null()),
    );
    let port = srv.port;
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", srv.child.id()))
            .unwrap()
            .count()
    };
    let idle = fds();
    let url = format!("ftp://127.0.0.1:{port}/big.bin");
    for _ in 0..3 {
        let out = xftp(
            &[
                "get",
                "-p",
                "32",
                "--json",
                "--timeout",
                "30",
                &url,
                "big.bin",
            ],
            &d.local,
        );
        let j = json_ok(&out, "get from a server short of descriptors");
        assert!(j["streams"].as_u64().unwrap_or(0) < 32, "{j}");
        assert_eq!(
            sha256_file(&d.local.join("big.bin")),
            sha256_file(&d.srv.join("big.bin"))
        );
        // Its connections are closed once the client has closed its ends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while fds() > idle && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(fds(), idle, "descriptors kept after the transfer");
    }
}

/// Three `put -c` of different files to one name at once: the server lets
/// the newest take over and ends the others with 426. Each of those
/// reads it at once (a sender with data connections the server never
/// took waited for the whole --timeout, then blamed the path), and the
/// file is one of the uploads, whole.
#[test]
fn uploads_taken_over_by_a_newer_one_end_at_once() {
    let d = dirs();
    let srv = serve(&d.srv, 16);
    for i in 0..3 {
        write_prng_file(&d.local.join(format!("u{i}")), 12 << 20, 40 + 2 * i);
    }
    let url = format!("ftp://127.0.0.1:{}/same", srv.port);
    for round in 0..3 {
        let _ = std::fs::remove_file(d.srv.join("same"));
        let start = std::time::Instant::now();
        let runs: Vec<_> = (0..3)
            .map(|i| {
                let f = format!("u{i}");
                support::spawn_xftp(
                    &["put", "-c", "-p", "4", "--timeout", "30", &f, &url],
                    &d.local,
                )
            })
            .collect();
        for r in runs {
            let out = r.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("stalled"), "round {round}: {err}");
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "round {round}: a loser waited for its --timeout"
        );
        let got = sha256_file(&d.srv.join("same"));
        assert!(
            (0..3).any(|i| sha256_file(&d.local.join(format!("u{i}"))) == got),
            "round {round}: the file is none of the uploads"
        );
    }
}

/// `--json` gives one object on stdout also for a wrong command line.
#[test]
fn a_wrong_command_line_with_json_still_prints_one_object() {
    let d = dirs();
    let out = xftp(
        &["get", "--json", "-p", "99", "ftp://127.0.0.1:1/x", "o"],
        &d.local,
    );
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON object");
    assert_eq!(j["status"], "error");
    assert!(
        j["error"].as_str().unwrap_or("").contains("--parallel"),
        "{j}"
    );
}

/// A file that shrinks on the server while it is sent over N connections:
/// the server's own words (426 "source ended at") are the cause the user
/// reads, not the data connection it closed on that account.
#[test]
fn a_file_that_shrinks_while_sent_is_named_so() {
    let d = dirs();
    let srv = serve(&d.srv, 16);
    write_prng_file(&d.srv.join("s.bin"), 24 << 20, 12);
    let url = format!("ftp://127.0.0.1:{}/s.bin", srv.port);
    let child = support::spawn_xftp(
        &["get", "-p", "4", "--limit-rate", "8M", &url, "s.bin"],
        &d.local,
    );
    std::thread::sleep(std::time::Duration::from_millis(800));
    support::shrink(&d.srv.join("s.bin"), 10 << 20);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("source ended at"), "{err}");
    assert!(err.contains("the file shrank on the server"), "{err}");
    assert!(!d.local.join("s.bin").exists());
}

/// A file rewritten in place while it is sent (same size), or grown, over
/// N connections and over one: the copy would be of no one version. The
/// server says so (451) instead of 226, and no file is left that looks
/// whole.
#[test]
fn a_file_rewritten_while_sent_is_not_delivered_as_whole() {
    let d = dirs();
    let srv = serve(&d.srv, 16);
    for (p, grow) in [("4", false), ("1", false), ("4", true)] {
        let f = d.srv.join("w.bin");
        write_prng_file(&f, 24 << 20, 13);
        let url = format!("ftp://127.0.0.1:{}/w.bin", srv.port);
        let child = support::spawn_xftp(
            &["get", "-p", p, "--limit-rate", "8M", &url, "w.bin"],
            &d.local,
        );
        std::thread::sleep(std::time::Duration::from_millis(800));
        {
            use std::io::{Seek, Write};
            let mut w = std::fs::File::options().write(true).open(&f).unwrap();
            let at = if grow { 24 << 20 } else { 20 << 20 };
            w.seek(std::io::SeekFrom::Start(at)).unwrap();
            w.write_all(&[0x5a; 1 << 20]).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "-p {p}, grow {grow}: {err}");
        assert!(err.contains("changed during the transfer"), "{err}");
        assert!(!d.local.join("w.bin").exists(), "-p {p}");
    }
}

/// The other way: a local file rewritten in place (same size) while it is
/// uploaded, over N connections and over one. Every byte would go, but not
/// of one version: the client sees it before the last record (or, in
/// stream mode, before its clean close) and ends the upload with a reset,
/// so the server keeps the version it had. (Checked after the 226, the
/// new copy had replaced the old one, and deleting it left nothing.)
#[test]
fn a_local_file_rewritten_while_sent_is_not_left_as_whole() {
    let d = dirs();
    let srv = serve(&d.srv, 16);
    for p in ["4", "1"] {
        let old = b"the version the server had".to_vec();
        std::fs::write(d.srv.join("u.bin"), &old).unwrap();
        let f = d.local.join("u.bin");
        write_prng_file(&f, 24 << 20, 14);
        let url = format!("ftp://127.0.0.1:{}/u.bin", srv.port);
        let child = support::spawn_xftp(
            &["put", "-p", p, "--limit-rate", "8M", "u.bin", &url],
            &d.local,
        );
        std::thread::sleep(std::time::Duration::from_millis(800));
        {
            use std::io::{Seek, Write};
            let mut w = std::fs::File::options().write(true).open(&f).unwrap();
            w.seek(std::io::SeekFrom::Start(20 << 20)).unwrap();
            w.write_all(&[0x5a; 1 << 20]).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "-p {p}: {err}");
        assert!(
            err.contains("written while it was sent") && err.contains("holds none of it"),
            "{err}"
        );
        assert_eq!(std::fs::read(d.srv.join("u.bin")).unwrap(), old, "-p {p}");
    }
}
