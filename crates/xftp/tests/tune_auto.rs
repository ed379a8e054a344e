//! `-p auto` end to end against `xftp serve` (and a stock server): content
//! by sha256 at 0 B, 1 B and ~50 MiB both ways, the JSON timeline, growth
//! mid-transfer on a path where each connection is throttled (so more
//! connections mean more throughput), `--bufsize`, `--static`, the
//! parameter cache under a temporary XDG_CACHE_HOME, and `xftp probe`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;
use support::{
    have_pyftpdlib, serve as serve_with, sha256_file, spawn_logging_server, write_prng_file,
    Pyftpd, Server, PYTHON,
};

/// A test's directories: server root, local side, and a private cache
/// (XDG_CACHE_HOME of every xftp run, so tests never share the user's).
struct Dirs {
    _tmp: tempfile::TempDir,
    srv: PathBuf,
    local: PathBuf,
    cache: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let srv = tmp.path().join("srv");
    let local = tmp.path().join("local");
    let cache = tmp.path().join("cache");
    for d in [&srv, &local, &cache] {
        std::fs::create_dir(d).unwrap();
    }
    Dirs {
        _tmp: tmp,
        srv,
        local,
        cache,
    }
}

fn xftp(d: &Dirs, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(&d.local)
        .env("XDG_CACHE_HOME", &d.cache)
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

/// The summary's totals and its timeline hang together.
fn check(j: &serde_json::Value, len: u64, what: &str) {
    assert_eq!(j["status"], "ok", "{what}");
    assert_eq!(j["bytes"], len, "{what}");
    let per: Vec<u64> = j["per_stream_bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no per_stream_bytes"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(per.iter().sum::<u64>(), len, "{what}: {per:?}");
    assert_eq!(j["streams"], per.len() as u64, "{what}");
    let t = &j["streams_timeline"];
    assert!(t["start"].as_u64().unwrap_or(0) >= 1, "{what}: {t}");
    assert!(
        !t["start_reason"].as_str().unwrap_or("").is_empty(),
        "{what}: {t}"
    );
    assert!(t["steps"].is_array(), "{what}: {t}");
}

const MIB: u64 = 1 << 20;

#[test]
fn auto_put_and_get_identical_content_at_edge_sizes() {
    let d = dirs();
    let srv = serve(&d.srv);
    for (i, len) in [0, 1, 50 * MIB + 3].into_iter().enumerate() {
        let name = format!("a{i}.bin");
        write_prng_file(&d.local.join(&name), len, 7 + i as u64);
        let url = format!("ftp://127.0.0.1:{}/{name}", srv.port);
        let j = json_ok(
            &xftp(&d, &["put", &name, &url, "--json"]),
            &format!("put {len}"),
        );
        check(&j, len, &format!("put {len}"));
        // Our server lists MULT and MODE E: the count may change.
        assert_eq!(j["streams_timeline"]["adaptive"], true, "{j}");
        assert_eq!(
            sha256_file(&d.srv.join(&name)),
            sha256_file(&d.local.join(&name)),
            "put {len}"
        );
        let back = format!("back{i}.bin");
        let j = json_ok(
            &xftp(&d, &["get", &url, &back, "--json", "-p", "auto"]),
            &format!("get {len}"),
        );
        check(&j, len, &format!("get {len}"));
        assert_eq!(j["streams_timeline"]["adaptive"], true, "{j}");
        assert_eq!(
            sha256_file(&d.local.join(&back)),
            sha256_file(&d.srv.join(&name)),
            "get {len}"
        );
    }
}

#[test]
fn auto_active_mode_roundtrip() {
    let d = dirs();
    let srv = serve(&d.srv);
    let len = 20 * MIB + 11;
    write_prng_file(&d.local.join("act.bin"), len, 3);
    let url = format!("ftp://127.0.0.1:{}/act.bin", srv.port);
    let j = json_ok(
        &xftp(&d, &["put", "act.bin", &url, "--active", "--json"]),
        "put --active",
    );
    check(&j, len, "put --active");
    let j = json_ok(
        &xftp(&d, &["get", &url, "back.bin", "--active", "--json"]),
        "get --active",
    );
    check(&j, len, "get --active");
    assert_eq!(
        sha256_file(&d.local.join("back.bin")),
        sha256_file(&d.local.join("act.bin"))
    );
}

/// A proxy in front of the server that rewrites 229 replies so data
/// connections pass through it, and paces each data connection to
/// `rate` bytes/s: one connection cannot fill the path, several can.
mod throttle {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    pub fn start(server_port: u16, rate: u64) -> (u16, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let counter = counter.clone();
                thread::spawn(move || control(c, server_port, rate, counter));
            }
        });
        (port, count)
    }

    fn control(client: TcpStream, server_port: u16, rate: u64, count: Arc<AtomicUsize>) {
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
                let proxy = data_proxy(p, rate, count.clone());
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

    fn data_proxy(server_port: u16, rate: u64, count: Arc<AtomicUsize>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(s) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                pump(s.try_clone().unwrap(), c.try_clone().unwrap(), rate);
                pump(c, s, rate);
            }
        });
        port
    }

    /// Copy `from` to `to` at most `rate` bytes per second.
    fn pump(mut from: TcpStream, mut to: TcpStream, rate: u64) {
        thread::spawn(move || {
            let mut buf = vec![0u8; 4 * 1024];
            let t0 = Instant::now();
            let mut moved = 0u64;
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                moved += n as u64;
                let due = Duration::from_secs_f64(moved as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    thread::sleep(wait);
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

#[test]
fn auto_adds_connections_when_each_one_is_throttled() {
    let d = dirs();
    let srv = serve(&d.srv);
    let len = 24 * MIB;
    write_prng_file(&d.srv.join("slow.bin"), len, 9);
    // 2 MB/s per connection: one connection would need 12 s.
    let (port, carried) = throttle::start(srv.port, 2_000_000);
    let url = format!("ftp://127.0.0.1:{port}/slow.bin");
    let t0 = std::time::Instant::now();
    let j = json_ok(
        &xftp(&d, &["get", &url, "--json", "-v"]),
        "get via throttle",
    );
    let took = t0.elapsed();
    check(&j, len, "get via throttle");
    assert_eq!(
        sha256_file(&d.local.join("slow.bin")),
        sha256_file(&d.srv.join("slow.bin"))
    );
    let t = &j["streams_timeline"];
    let steps = t["steps"].as_array().unwrap();
    let grew = steps.iter().filter(|s| s["reason"] == "grow").count();
    let start = t["start"].as_u64().unwrap();
    let used = j["streams"].as_u64().unwrap();
    assert!(
        used > 2 && used > start && grew >= 1,
        "auto did not add connections on a throttled path: {used} used, start {start}, {t}"
    );
    assert_eq!(
        carried.load(std::sync::atomic::Ordering::SeqCst) as u64,
        used,
        "connections through the proxy"
    );
    // The most at once: above the start after a growth step, never above
    // the connections opened.
    let most = t["most_streams"].as_u64().unwrap();
    let stepped = steps.iter().filter_map(|s| s["streams"].as_u64()).max();
    assert!(
        most > start && most <= used && stepped.into_iter().all(|m| m <= most),
        "most_streams {most}: start {start}, used {used}, {t}"
    );
    println!("throttled get: {used} connections, {took:?}, {t}");
}

#[test]
fn bufsize_is_applied_and_reported() {
    let d = dirs();
    let srv = serve(&d.srv);
    let len = 3 * MIB + 5;
    write_prng_file(&d.local.join("b.bin"), len, 5);
    let url = format!("ftp://127.0.0.1:{}/b.bin", srv.port);
    let req = 256 * 1024u64;
    for args in [
        vec!["put", "b.bin", url.as_str(), "--bufsize", "256k", "--json"],
        vec!["get", url.as_str(), "g.bin", "--bufsize", "256k", "--json"],
    ] {
        let j = json_ok(&xftp(&d, &args), &format!("{args:?}"));
        check(&j, len, &format!("{args:?}"));
        assert_eq!(j["bufsize_requested"], req, "{j}");
        let in_force = j["bufsize_in_force"].as_u64().unwrap_or(0);
        assert!(
            in_force >= req,
            "in force {in_force} < requested {req}: {j}"
        );
        let reply = j["server_bufsize_reply"].as_str().unwrap_or("");
        assert!(reply.starts_with("200") && reply.contains("262144"), "{j}");
    }
    assert_eq!(
        sha256_file(&d.local.join("g.bin")),
        sha256_file(&d.local.join("b.bin"))
    );
    // Without --bufsize nothing is asked or reported.
    let j = json_ok(&xftp(&d, &["get", &url, "h.bin", "--json"]), "no bufsize");
    assert!(j.get("bufsize_requested").is_none(), "{j}");
}

#[test]
fn static_partitioning_with_fixed_n() {
    let d = dirs();
    let srv = serve(&d.srv);
    let len = 5 * MIB + 7;
    write_prng_file(&d.local.join("s.bin"), len, 11);
    let url = format!("ftp://127.0.0.1:{}/s.bin", srv.port);
    let j = json_ok(
        &xftp(&d, &["put", "s.bin", &url, "-p", "4", "--static", "--json"]),
        "put --static",
    );
    check(&j, len, "put --static");
    // Equal contiguous parts: every connection carries about a quarter.
    for b in j["per_stream_bytes"].as_array().unwrap() {
        let b = b.as_u64().unwrap();
        assert!(b > len / 4 - 300_000 && b < len / 4 + 300_000, "{j}");
    }
    let j = json_ok(
        &xftp(&d, &["get", &url, "t.bin", "-p", "4", "--static", "--json"]),
        "get --static",
    );
    check(&j, len, "get --static");
    assert_eq!(
        sha256_file(&d.local.join("t.bin")),
        sha256_file(&d.local.join("s.bin"))
    );
    let out = xftp(&d, &["get", &url, "u.bin", "--static"]);
    assert!(
        !out.status.success(),
        "--static with -p auto must be refused"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("-p N"));
}

#[test]
fn cache_is_written_and_the_next_transfer_starts_from_it() {
    let d = dirs();
    let srv = serve(&d.srv);
    let len = 4 * MIB;
    write_prng_file(&d.srv.join("c.bin"), len, 13);
    let url = format!("ftp://127.0.0.1:{}/c.bin", srv.port);
    // A fixed-N transfer is recorded too: that is how the cache learns N.
    let j = json_ok(&xftp(&d, &["get", &url, "-p", "3", "--json"]), "get -p 3");
    check(&j, len, "get -p 3");
    let file = d.cache.join("xftp").join("paths.json");
    let cached: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("cache file written")).unwrap();
    let key = format!("127.0.0.1:{}", srv.port);
    let recs = cached[&key]
        .as_array()
        .unwrap_or_else(|| panic!("{cached}"));
    assert_eq!(recs.len(), 1, "{cached}");
    assert_eq!(recs[0]["streams"], 3, "{cached}");
    assert_eq!(recs[0]["bytes"], len, "{cached}");
    // One held back by --limit-rate says nothing of the path: its RTT
    // only, no count and no rate.
    let j = json_ok(
        &xftp(
            &d,
            &[
                "get",
                &url,
                "c1.bin",
                "-p",
                "5",
                "--limit-rate",
                "40M",
                "--json",
            ],
        ),
        "get --limit-rate",
    );
    check(&j, len, "get --limit-rate");
    let cached: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let recs = cached[&key].as_array().unwrap();
    assert_eq!(recs.len(), 2, "{cached}");
    assert_eq!(
        (&recs[1]["streams"], &recs[1]["throughput_bps"]),
        (&0.into(), &0.0.into()),
        "{cached}"
    );
    // So does one too small to tell (its rate is the handshakes', its
    // count whatever it started with): several of them must not outvote
    // the transfer that measured the path.
    std::fs::write(d.srv.join("tiny.txt"), b"hello\n").unwrap();
    let tiny = format!("ftp://127.0.0.1:{}/tiny.txt", srv.port);
    for i in 0..3 {
        let name = format!("t{i}.txt");
        json_ok(
            &xftp(&d, &["get", &tiny, &name, "-p", "1", "--json"]),
            "get tiny",
        );
    }
    let cached: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let recs = cached[&key].as_array().unwrap();
    assert!(
        recs[2..]
            .iter()
            .all(|r| r["streams"] == 0 && r["throughput_bps"] == 0.0),
        "{cached}"
    );
    let j = json_ok(&xftp(&d, &["get", &url, "c2.bin", "--json"]), "get auto");
    let t = &j["streams_timeline"];
    assert_eq!(t["start"], 3, "{t}");
    assert!(
        t["start_reason"].as_str().unwrap().starts_with("cached"),
        "{t}"
    );
    // A fresh cache starts from the RTT instead (loopback: one connection).
    let e = dirs();
    let srv2 = serve(&e.srv);
    write_prng_file(&e.srv.join("c.bin"), len, 13);
    let url2 = format!("ftp://127.0.0.1:{}/c.bin", srv2.port);
    let j = json_ok(&xftp(&e, &["get", &url2, "--json"]), "get auto, no cache");
    let t = &j["streams_timeline"];
    assert!(t["start_reason"].as_str().unwrap().contains("RTT"), "{t}");
}

#[test]
fn probe_prints_what_it_measured() {
    let d = dirs();
    let srv = serve(&d.srv);
    let url = format!("ftp://127.0.0.1:{}/", srv.port);
    let j = json_ok(&xftp(&d, &["probe", &url, "--json"]), "probe --json");
    assert_eq!(j["mult"], true, "{j}");
    assert_eq!(j["mode_e"], true, "{j}");
    assert_eq!(j["rtt_noop_ms"].as_array().map(Vec::len), Some(5), "{j}");
    assert!(j["rtt_noop_median_ms"].as_f64().unwrap() > 0.0, "{j}");
    assert!(j["rtt_tcp_info_ms"].as_f64().is_some(), "{j}");
    // Loopback: one connection, unless the host was so loaded that the
    // measured RTT reached the 5 ms of a longer path; either way the choice
    // follows the RTT.
    let rtt = j["rtt_tcp_info_ms"].as_f64().unwrap();
    let want = if rtt < 5.0 { 1 } else { 2 };
    assert_eq!(j["initial_streams"], want, "loopback: {j}");
    assert_eq!(j["initial_streams_put"], want, "loopback: {j}");
    assert!(j["reason"].as_str().unwrap().contains("RTT"), "{j}");
    // The probe recorded the RTT.
    let cached: serde_json::Value = serde_json::from_slice(
        &std::fs::read(d.cache.join("xftp").join("paths.json")).expect("cache written"),
    )
    .unwrap();
    let key = format!("127.0.0.1:{}", srv.port);
    assert!(cached[&key][0]["rtt_us"].as_u64().unwrap() > 0, "{cached}");
    let out = xftp(&d, &["probe", &url]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for field in [
        "rtt (TCP_INFO)",
        "rtt (NOOP)",
        "MULT yes",
        "would start with",
    ] {
        assert!(text.contains(field), "{field} missing: {text}");
    }
    assert!(text.contains("1 fresh record"), "{text}");
    assert!(text.contains("probe  rtt"), "{text}");
    // `xftp cache` lists the destination, and forgets it.
    let list = xftp(&d, &["cache"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success() && text.contains(&key), "{text}");
    let gone = xftp(&d, &["cache", "--forget", &url]);
    assert!(
        gone.status.success(),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
    let j = json_ok(&xftp(&d, &["cache", "--json"]), "cache --json");
    assert!(j["destinations"].get(&key).is_none(), "{j}");
    let again = xftp(&d, &["cache", "--forget", &key]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("no records"));
    assert!(xftp(&d, &["cache", "--clear"]).status.success());
    // A failure is one JSON object too, and exit status 1.
    let out = xftp(&d, &["probe", "ftp://127.0.0.1:1/", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(j["status"], "error", "{j}");
    assert!(
        j["error"].as_str().unwrap().contains("cannot connect"),
        "{j}"
    );
}

// ---- a stock server (pyftpdlib) ----

fn pyftpd(dir: &Path, test: &str) -> Option<Pyftpd> {
    if !have_pyftpdlib(test) {
        return None;
    }
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-m", "pyftpdlib", "-i", "127.0.0.1", "-p", "0", "-w", "-d"])
        .arg(dir);
    Some(spawn_logging_server(cmd))
}

#[test]
fn stock_server_refusing_everything_still_works_with_auto() {
    let d = dirs();
    let Some(srv) = pyftpd(
        &d.srv,
        "stock_server_refusing_everything_still_works_with_auto",
    ) else {
        return;
    };
    let len = 2 * MIB + 1;
    write_prng_file(&d.local.join("p.bin"), len, 17);
    let url = format!("ftp://127.0.0.1:{}/p.bin", srv.port);
    let out = xftp(&d, &["put", "p.bin", &url, "--bufsize", "128k", "--json"]);
    let j = json_ok(&out, "put to pyftpdlib");
    check(&j, len, "put to pyftpdlib");
    assert_eq!(j["streams"], 1, "{j}");
    let t = &j["streams_timeline"];
    assert_eq!(t["adaptive"], false, "{t}");
    assert!(t["start_reason"].as_str().unwrap().contains("MULT"), "{t}");
    // SITE BUFSIZE refused: a notice, not an error; our buffers still set.
    let reply = j["server_bufsize_reply"].as_str().unwrap_or("");
    assert!(reply.starts_with('5'), "{j}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused SITE BUFSIZE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        j["bufsize_in_force"].as_u64().unwrap_or(0) >= 128 * 1024,
        "{j}"
    );
    let j = json_ok(
        &xftp(&d, &["get", &url, "q.bin", "--json"]),
        "get from pyftpdlib",
    );
    check(&j, len, "get from pyftpdlib");
    assert_eq!(
        sha256_file(&d.local.join("q.bin")),
        sha256_file(&d.local.join("p.bin"))
    );
}

fn serve(root: &Path) -> Server {
    serve_with(root, &[])
}
