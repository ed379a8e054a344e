//! The fault matrix (docs/reliability.md): each case checks that nothing
//! is lost, nothing looks complete that is not, the error names the
//! cause, and the server goes on serving other sessions.
//!
//! Connections are cut with `ss -K` (the kernel's SOCK_DESTROY: the
//! socket is closed and the peer gets a reset), which needs root; the
//! disk-full cases mount a small tmpfs, also root. Without root these
//! cases skip with a message (CI runs as root).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{serve, sha256_file, write_prng_file, Ctl, Server};

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{test}: needs root (ss -K, mount) and XFTP_REQUIRE_PEERS=1");
    }
    eprintln!("SKIP {test}: needs root (ss -K to cut a connection, mount for a full disk)");
    true
}

fn xftp_bg(args: &[&str], cwd: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xftp")
}

fn xftp(args: &[&str], cwd: &Path) -> Output {
    xftp_bg(args, cwd).wait_with_output().expect("xftp")
}

/// Established TCP connections of process `pid`: (local port, peer port).
fn sockets_of(pid: u32) -> Vec<(u16, u16)> {
    let out = Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .output()
        .expect("ss");
    let port = |a: &str| a.rsplit(':').next().and_then(|p| p.parse().ok());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Recv-Q Send-Q Local Peer Process
            Some((port(f.get(2)?)?, port(f.get(3)?)?))
        })
        .collect()
}

/// The data connections of `pid` (not to `ctl_port`), waited for (up to
/// 10 s) until at least `n` are open.
fn data_sockets(pid: u32, ctl_port: u16, n: usize) -> Vec<(u16, u16)> {
    let t = Instant::now();
    loop {
        let v: Vec<_> = sockets_of(pid)
            .into_iter()
            .filter(|(_, peer)| *peer != ctl_port)
            .collect();
        if v.len() >= n || t.elapsed() > Duration::from_secs(10) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reset one connection (both ends see it end).
fn cut(local: u16, peer: u16) {
    let st = Command::new("ss")
        .args(["-K", "src", "127.0.0.1", "sport", "=", &format!(":{local}")])
        .args(["dst", "127.0.0.1", "dport", "=", &format!(":{peer}")])
        .stdout(Stdio::null())
        .status()
        .expect("ss -K");
    assert!(st.success(), "ss -K failed");
}

/// Wait for `child` at most `secs`.
fn finish(mut child: Child, secs: u64) -> Output {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("still running after {secs} s");
}

/// The server answers a new session and moves a file.
fn still_serving(srv: &Server, root: &Path, work: &Path) {
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("NOOP").starts_with("200"));
    std::fs::write(root.join("probe.txt"), b"still here").unwrap();
    let out = xftp(
        &[
            "get",
            &format!("ftp://127.0.0.1:{}/probe.txt", srv.port),
            "probe.txt",
        ],
        work,
    );
    assert!(out.status.success(), "the server stopped serving: {out:?}");
    let _ = std::fs::remove_file(work.join("probe.txt"));
}

fn no_part_files(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("xftp") || n.starts_with('.'))
        .collect()
}

const SIZE: u64 = 24_000_000 + 11;

/// `xftp serve` on `root/` holding `f.bin`, and `work/` holding `u.bin`
/// (both SIZE bytes, from seeds `seed` and `seed + 1`).
fn served_pair(seed: u64) -> (tempfile::TempDir, PathBuf, PathBuf, Server) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    write_prng_file(&root.join("f.bin"), SIZE, seed);
    write_prng_file(&work.join("u.bin"), SIZE, seed + 1);
    let srv = serve(&root, &[]);
    (dir, root, work, srv)
}

/// One of eight data connections reset mid-transfer: the sender sends
/// what it carried again on the other seven (MODE E with the endgame:
/// xftp on both ends, a file of 1 MiB and more) and the file completes.
/// All eight reset: the transfer fails, says why, and leaves nothing that
/// looks complete.
#[test]
fn data_connections_reset_mid_transfer() {
    if skip_unless_root("data_connections_reset_mid_transfer") {
        return;
    }
    let (_dir, root, work, srv) = served_pair(3);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    for (form, get, every) in ["passive", "--active", "--mprt"]
        .into_iter()
        .flat_map(|f| [(f, true), (f, false)])
        .flat_map(|(f, g)| [(f, g, false), (f, g, true)])
    {
        {
            let what = format!(
                "{} {form}, {} reset",
                if get { "get" } else { "put" },
                if every {
                    "every connection"
                } else {
                    "one connection"
                }
            );
            let mut args = vec!["-p", "8", "--limit-rate", "12M", "--timeout", "10"];
            if form != "passive" {
                args.push(form);
            }
            let (src, dst) = if get {
                (format!("{base}/f.bin"), "got.bin".to_string())
            } else {
                ("u.bin".to_string(), format!("{base}/up.bin"))
            };
            let mut all = vec![if get { "get" } else { "put" }];
            all.extend(&args);
            all.push(&src);
            all.push(&dst);
            let child = xftp_bg(&all, &work);
            let pid = child.id();
            std::thread::sleep(Duration::from_millis(500));
            let data = data_sockets(pid, srv.port, 8);
            assert!(data.len() >= 8, "{what}: data connections {data:?}");
            for d in &data[..if every { data.len() } else { 1 }] {
                cut(d.0, d.1);
            }
            let out = finish(child, 60);
            if !every {
                assert!(out.status.success(), "{what}: {out:?}");
                let (a, b) = if get {
                    (root.join("f.bin"), work.join("got.bin"))
                } else {
                    (work.join("u.bin"), root.join("up.bin"))
                };
                assert_eq!(sha256_file(&a), sha256_file(&b), "{what}");
                for f in [work.join("got.bin"), root.join("up.bin")] {
                    let _ = std::fs::remove_file(f);
                }
                still_serving(&srv, &root, &work);
                continue;
            }
            assert!(
                !out.status.success(),
                "{what}: a cut transfer reported success"
            );
            let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
            assert!(
                err.contains("data connection")
                    || err.contains("reset")
                    || err.contains("abort")
                    || err.contains("426")
                    || err.contains("multi-stream"),
                "{what}: the error does not name the cause: {err}"
            );
            if get {
                assert!(
                    !work.join("got.bin").exists(),
                    "{what}: a cut file under its name"
                );
                assert!(
                    no_part_files(&work).is_empty(),
                    "{what}: {:?}",
                    no_part_files(&work)
                );
            } else {
                // The server keeps nothing of a cut upload under its name.
                std::thread::sleep(Duration::from_millis(300));
                assert!(!root.join("up.bin").exists(), "{what}: a cut upload kept");
            }
            still_serving(&srv, &root, &work);
        }
    }
    // A resumable download cut on every connection completes with -c.
    let url = format!("{base}/f.bin");
    let child = xftp_bg(
        &["get", "-c", "-p", "8", "--limit-rate", "12M", &url, "r.bin"],
        &work,
    );
    std::thread::sleep(Duration::from_millis(500));
    let data = data_sockets(child.id(), srv.port, 8);
    assert!(data.len() >= 8);
    for d in &data {
        cut(d.0, d.1);
    }
    let out = finish(child, 60);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-c"));
    let out = xftp(&["get", "-c", "-p", "8", &url, "r.bin"], &work);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&work.join("r.bin")),
        sha256_file(&root.join("f.bin"))
    );
}

#[test]
fn the_control_connection_dropped_mid_transfer() {
    if skip_unless_root("the_control_connection_dropped_mid_transfer") {
        return;
    }
    let (_dir, root, work, srv) = served_pair(5);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    for get in [true, false] {
        let (verb, src, dst) = if get {
            ("get", format!("{base}/f.bin"), "got.bin".to_string())
        } else {
            ("put", "u.bin".to_string(), format!("{base}/up.bin"))
        };
        let child = xftp_bg(
            &[
                verb,
                "-p",
                "4",
                "--limit-rate",
                "12M",
                "--timeout",
                "10",
                &src,
                &dst,
            ],
            &work,
        );
        std::thread::sleep(Duration::from_millis(500));
        // Mid-transfer: data is moving.
        let _ = data_sockets(child.id(), srv.port, 2);
        let ctl: Vec<_> = sockets_of(child.id())
            .into_iter()
            .filter(|(_, peer)| *peer == srv.port)
            .collect();
        assert_eq!(ctl.len(), 1, "{verb}: control connection {ctl:?}");
        cut(ctl[0].0, ctl[0].1);
        let out = finish(child, 60);
        assert!(
            !out.status.success(),
            "{verb}: success without a control connection"
        );
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(err.contains("control connection"), "{verb}: {err}");
        std::thread::sleep(Duration::from_millis(500));
        if get {
            assert!(!work.join("got.bin").exists());
        } else {
            assert!(
                !root.join("up.bin").exists(),
                "an upload without its 226 kept"
            );
        }
        still_serving(&srv, &root, &work);
    }
}

/// A tree of small files moves pipelined over kept data connections
/// (FEAT CACHE), both ways: a data connection reset mid-file and a
/// session's control connection cut both cost a retry, not a file: the
/// run completes with every file intact and no temporary left.
#[test]
fn a_tree_download_goes_on_through_cut_connections() {
    if skip_unless_root("a_tree_download_goes_on_through_cut_connections") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("root"), dir.path().join("work"));
    for d in 0..3u64 {
        let sub = root.join("t").join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for i in 0..100u64 {
            write_prng_file(&sub.join(format!("f{i}")), 16_384 + i, d * 1000 + i);
        }
    }
    std::fs::create_dir_all(&work).unwrap();
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let runs = [
        (
            "get",
            format!("{base}/t/"),
            "t".to_string(),
            root.join("t"),
            work.join("t"),
        ),
        (
            "put",
            "t".to_string(),
            format!("{base}/up/"),
            work.join("t"),
            root.join("up"),
        ),
    ];
    for (verb, src, dst, from, to) in runs {
        // About 3 s at this rate: time to cut while files are moving.
        let child = xftp_bg(
            &[
                verb,
                "-r",
                "--concurrency",
                "2",
                "--limit-rate",
                "1500K",
                "--json",
                &src,
                &dst,
            ],
            &work,
        );
        std::thread::sleep(Duration::from_millis(1000));
        let data = data_sockets(child.id(), srv.port, 1);
        assert!(!data.is_empty(), "{verb}: no data connection to cut");
        cut(data[0].0, data[0].1);
        std::thread::sleep(Duration::from_millis(800));
        let ctl: Vec<_> = sockets_of(child.id())
            .into_iter()
            .filter(|(_, peer)| *peer == srv.port)
            .collect();
        assert!(!ctl.is_empty(), "{verb}: no control connection to cut");
        cut(ctl[0].0, ctl[0].1);
        let out = finish(child, 120);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{verb}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(v["files"], 300, "{verb}: {text}");
        assert_eq!(
            v["failed"].as_array().map(Vec::len),
            Some(0),
            "{verb}: {text}"
        );
        std::thread::sleep(Duration::from_millis(300));
        for d in 0..3 {
            let (a, b) = (from.join(format!("d{d}")), to.join(format!("d{d}")));
            assert!(
                no_part_files(&b).is_empty(),
                "{verb}: {:?}",
                no_part_files(&b)
            );
            for i in 0..100 {
                let f = format!("f{i}");
                assert_eq!(
                    sha256_file(&a.join(&f)),
                    sha256_file(&b.join(&f)),
                    "{verb}: d{d}/{f}"
                );
            }
        }
    }
}

/// A tmpfs of `size`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount");
        assert!(st.success(), "mount tmpfs");
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_on_either_side() {
    if skip_unless_root("a_full_disk_on_either_side") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.bin");
    write_prng_file(&big, 6_000_000, 8);
    // The server's disk is full: the upload fails with 452/552, nothing
    // stays under its name, and the server goes on.
    let sroot = Tmpfs::mount(&dir.path().join("sroot"), "2m");
    let srv = serve(&sroot.0, &[]);
    for p in ["1", "4"] {
        let out = xftp(
            &[
                "put",
                "-p",
                p,
                "big.bin",
                &format!("ftp://127.0.0.1:{}/big.bin", srv.port),
            ],
            dir.path(),
        );
        assert!(!out.status.success());
        // RFC 959's 452 (insufficient storage), not a broken connection.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("452 Insufficient storage space") && err.contains("out of space"),
            "-p {p}: {err}"
        );
        assert!(!sroot.0.join("big.bin").exists());
        let left: Vec<_> = std::fs::read_dir(&sroot.0).unwrap().collect();
        assert!(left.is_empty(), "-p {p}: the server kept {left:?}");
    }
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("NOOP").starts_with("200"));
    drop(srv);
    drop(sroot);

    // The client's disk is full: a clear error, no file under its name.
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(&big, root.join("big.bin")).unwrap();
    let srv = serve(&root, &[]);
    let local = Tmpfs::mount(&dir.path().join("local"), "2m");
    for p in ["1", "4"] {
        let out = xftp(
            &[
                "get",
                "-p",
                p,
                &format!("ftp://127.0.0.1:{}/big.bin", srv.port),
                "big.bin",
            ],
            &local.0,
        );
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("No space left") && err.contains("the local disk is full"),
            "-p {p}: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(&local.0).unwrap().collect();
        assert!(left.is_empty(), "-p {p}: left {left:?}");
    }
    // The shell's reget keeps its partial there: the message says so,
    // not "nothing was kept".
    let mut sh = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["shell", &format!("ftp://127.0.0.1:{}/", srv.port)])
        .current_dir(&local.0)
        .env("HOME", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sh.stdin
        .take()
        .unwrap()
        .write_all(b"mult 4\nreget big.bin\n")
        .unwrap();
    let out = sh.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("partial download is kept") && !err.contains("nothing was kept"),
        "{err}"
    );
    // A tree's small files (pipelined over kept connections): the full
    // disk here is what fails them, not the server's 426 that follows
    // the connections this end reset, and they are not fetched again.
    for e in std::fs::read_dir(&local.0).unwrap() {
        let _ = std::fs::remove_file(e.unwrap().path());
    }
    std::fs::create_dir_all(root.join("t")).unwrap();
    for i in 0..6 {
        write_prng_file(&root.join(format!("t/f{i}")), 500_000, 20 + i);
    }
    let out = xftp(
        &[
            "get",
            "-r",
            &format!("ftp://127.0.0.1:{}/t/", srv.port),
            "t",
        ],
        &local.0,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("No space left"), "{err}");
    assert!(!err.contains("426"), "{err}");
}

#[test]
fn a_client_that_stops_reading_is_timed_out_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    write_prng_file(&dir.path().join("big.bin"), 64_000_000, 9);
    let srv = serve(dir.path(), &["--stall-timeout", "2"]);
    // Log in, ask for a large file, open the data connection, never read.
    let mut c = Ctl::login(srv.port);
    let port = c.epsv_port();
    let data = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let t = Instant::now();
    let r = c.cmd("RETR big.bin");
    assert!(r.starts_with("150"), "{r}");
    // Meanwhile another session is served at full speed.
    let work = tempfile::tempdir().unwrap();
    let out = xftp(
        &[
            "get",
            "-p",
            "4",
            &format!("ftp://127.0.0.1:{}/big.bin", srv.port),
            "b.bin",
        ],
        work.path(),
    );
    assert!(out.status.success(), "{out:?}");
    // The stalled transfer ends with 426 after the stall timeout.
    let end = c.reply();
    assert!(end.starts_with("426") || end.starts_with("451"), "{end}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    drop(data);
    assert!(c.cmd("NOOP").starts_with("200"), "the session goes on");
}

#[test]
fn slow_clients_do_not_hold_sessions_and_a_real_client_is_served() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), b"hello").unwrap();
    let srv = serve(
        dir.path(),
        &["--idle-timeout", "2", "--max-sessions-per-ip", "8"],
    );
    // Twelve slow clients from 127.0.0.2: a byte every 300 ms, never a
    // whole line. Eight get in, four are refused at once (421); the eight
    // are closed when a whole line has not come within the idle timeout,
    // although bytes keep trickling in.
    let t = Instant::now();
    let mut slow: Vec<TcpStream> = (0..12)
        .map(|_| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(
                &"127.0.0.2:0"
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
            s.connect(
                &format!("127.0.0.1:{}", srv.port)
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
            let s: TcpStream = s.into();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            s
        })
        .collect();
    let real = tempfile::tempdir().unwrap();
    let mut refused = 0;
    let mut closed = vec![false; slow.len()];
    let mut greeting = vec![Vec::new(); slow.len()];
    while t.elapsed() < Duration::from_secs(8) && closed.iter().any(|c| !c) {
        for (i, s) in slow.iter_mut().enumerate() {
            if closed[i] {
                continue;
            }
            let _ = s.write_all(b"U");
            let mut b = [0u8; 512];
            match s.read(&mut b) {
                Ok(0) => {
                    closed[i] = true;
                    if String::from_utf8_lossy(&greeting[i]).contains("421 ")
                        && !String::from_utf8_lossy(&greeting[i]).contains("Idle")
                    {
                        refused += 1;
                    }
                }
                Ok(n) => greeting[i].extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed[i] = true,
                Err(_) => {}
            }
        }
        // A real client from 127.0.0.1 is served all along.
        let out = xftp(
            &[
                "get",
                &format!("ftp://127.0.0.1:{}/f.txt", srv.port),
                "f.txt",
            ],
            real.path(),
        );
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(refused, 4, "the per-address limit");
    assert!(
        closed.iter().all(|c| *c),
        "slow sessions still open after 8 s"
    );
    let idle_closed = greeting
        .iter()
        .filter(|g| String::from_utf8_lossy(g).contains("Idle timeout"))
        .count();
    assert_eq!(idle_closed, 8, "closed by the line deadline");
}

#[test]
fn a_fifo_in_the_served_tree_holds_no_session() {
    // Opening a FIFO waits for its other end: each command that opens a
    // file must refuse it at once, or a few of them stall the server.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    write_prng_file(&dir.path().join("f.bin"), 100_000, 5);
    let srv = serve(dir.path(), &[]);
    let t = Instant::now();
    for _ in 0..3 {
        let mut c = Ctl::login(srv.port);
        assert!(c.cmd("TYPE I").starts_with("200"));
        for cmd in [
            "SIZE pipe",
            "MDTM pipe",
            "HASH pipe",
            "CKSM MD5 0 -1 pipe",
            "MFMT 20200101000000 pipe",
        ] {
            let r = c.cmd(cmd);
            assert!(r.starts_with("550"), "{cmd}: {r}");
        }
        for cmd in ["RETR pipe", "APPE pipe"] {
            let port = c.epsv_port();
            let _data = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let r = c.cmd(cmd);
            assert!(r.starts_with("550") || r.starts_with("553"), "{cmd}: {r}");
        }
        // Listed as what it is, not as a file to fetch.
        let r = c.cmd("MLST pipe");
        assert!(r.contains("type=OS.unix=fifo"), "{r}");
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // And the server goes on: a real client gets a file.
    let work = tempfile::tempdir().unwrap();
    let out = xftp(
        &[
            "get",
            &format!("ftp://127.0.0.1:{}/f.bin", srv.port),
            "f.bin",
        ],
        work.path(),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&work.path().join("f.bin")),
        sha256_file(&dir.path().join("f.bin"))
    );
}

/// A client's `SITE BUFSIZE` is held to the operator's limits
/// (`net.core.rmem_max`/`wmem_max`) also when the server runs as root:
/// with SO_RCVBUFFORCE an anonymous client that asked for 256 MiB and did
/// not read pinned 512 MiB of the host's TCP memory per connection.
#[test]
fn site_bufsize_stays_within_the_operators_limits() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    let r = c.cmd("SITE BUFSIZE 256M");
    assert!(r.starts_with("200"), "{r}");
    let in_force = |what: &str| -> u64 {
        r.split(&format!("{what} "))
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {what} in {r}"))
    };
    let sysctl = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // (STAT tells the mode in force.)
    assert!(c.cmd("MODE E").starts_with("200"));
    assert!(c.cmd("STAT").contains("MODE: E"));
    // The kernel doubles what it is given, for its bookkeeping.
    assert!(in_force("rcv") <= 2 * sysctl("rmem_max"), "{r}");
    assert!(in_force("snd") <= 2 * sysctl("wmem_max"), "{r}");
}

/// Names of the form `.NAME.xftp-part-<16 hex>` are the server's
/// temporaries of uploads in progress: hidden from listings and swept when
/// a dead upload leaves one. A client's STOR, STOU, APPE, MKD or RNTO to
/// such a name is refused (it was stored with 226, hidden, and deleted by
/// the next sweep); other names that merely look alike are listed, and a
/// leftover temporary can still be deleted by name.
#[test]
fn the_servers_temporary_names_are_not_given_to_clients() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("x"), b"x").unwrap();
    std::fs::write(root.join(".old.xftp-part-00112233aabbccdd"), b"left").unwrap();
    let srv = serve(root, &[]);
    let mut c = Ctl::login(srv.port);
    let reserved = ".data.xftp-part-0123456789abcdef";
    for cmd in ["STOR", "APPE", "MKD"] {
        let r = c.cmd(&format!("{cmd} {reserved}"));
        assert!(r.starts_with("55"), "{cmd}: {r}");
        assert!(r.contains("temporaries"), "{cmd}: {r}");
    }
    assert!(c.cmd("RNFR x").starts_with("350"));
    let r = c.cmd(&format!("RNTO {reserved}"));
    assert!(r.starts_with("553") || r.starts_with("550"), "{r}");
    assert!(!root.join(reserved).exists());
    // A look-alike without the 16 hex digits is an ordinary name.
    let port = c.epsv_port();
    c.w_line("STOR .data.xftp-part-abc");
    let mut d = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(c.reply().starts_with("150"));
    d.write_all(b"kept").unwrap();
    drop(d);
    assert!(c.reply().starts_with("226"));
    let port = c.epsv_port();
    c.w_line("NLST -a");
    let mut d = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(c.reply().starts_with("150"));
    let mut names = String::new();
    d.read_to_string(&mut names).unwrap();
    assert!(c.reply().starts_with("226"));
    assert!(names.contains(".data.xftp-part-abc"), "{names}");
    assert!(!names.contains(".old.xftp-part-"), "{names}");
    let r = c.cmd("DELE .old.xftp-part-00112233aabbccdd");
    assert!(r.starts_with("250"), "{r}");
}

/// A REST offset past the largest file the file system holds is refused
/// before the 150, in words (it got 150, then "451 ... Invalid argument").
#[test]
fn a_rest_past_the_largest_file_is_refused_before_the_transfer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.bin"), b"0123456789").unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("TYPE I").starts_with("200"));
    assert!(c.cmd("REST 18446744073709551615").starts_with("350"));
    let _ = c.epsv_port();
    let r = c.cmd("STOR r.bin");
    assert!(r.starts_with("553") && r.contains("largest file"), "{r}");
    assert_eq!(
        std::fs::read(dir.path().join("r.bin")).unwrap(),
        b"0123456789"
    );
}

/// RFC 2428: EPSV with a protocol number the server does not take is 522
/// (naming the one it does), a malformed argument 501 in its own words;
/// EPRT is answered as EPRT.
#[test]
fn epsv_and_eprt_replies_follow_rfc_2428() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    let r = c.cmd("EPSV 3");
    assert!(r.starts_with("522") && r.contains("(1)"), "{r}");
    let r = c.cmd("EPSV foo");
    assert!(r.starts_with("501") && r.contains("foo"), "{r}");
    let r = c.cmd("EPRT |1|127.0.0.1|40000|");
    assert!(r.starts_with("200 EPRT"), "{r}");
}

/// RFC 3659 7.9: OPTS MLST selects the facts MLST and MLSD give from then
/// on, names those taken in its reply, and FEAT marks them; unknown names
/// are left out, and no list selects none.
#[test]
fn opts_mlst_selects_the_facts_given() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), b"0123456789").unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    let r = c.cmd("OPTS MLST Size;type;bogus;");
    assert!(r.starts_with("200 MLST OPTS type;size;\r"), "{r}");
    let r = c.cmd("MLST f.txt");
    assert!(r.contains(" type=file;size=10; /f.txt"), "{r}");
    let r = c.cmd("FEAT");
    assert!(
        r.contains("MLST type*;size*;modify;perm;UNIX.mode;unique;"),
        "{r}"
    );
    let port = c.epsv_port();
    c.w_line("MLSD");
    let mut d = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(c.reply().starts_with("150"));
    let mut listing = String::new();
    d.read_to_string(&mut listing).unwrap();
    assert!(c.reply().starts_with("226"));
    assert!(
        listing.contains("type=file;size=10; f.txt\r\n"),
        "{listing}"
    );
    assert!(!listing.contains("modify="), "{listing}");
    let r = c.cmd("OPTS MLST");
    assert!(r.starts_with("200 MLST OPTS\r"), "{r}");
    let r = c.cmd("MLST f.txt");
    assert!(r.contains("\n  /f.txt") || r.contains("\n /f.txt"), "{r}");
}

/// GridFTP's SBUF holds a size out of range to the server's limits (as
/// globus-gridftp-server takes any: globus-url-copy -tcp-bs 1024 failed);
/// SITE BUFSIZE still refuses it.
#[test]
fn sbuf_holds_a_size_out_of_range_and_site_bufsize_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    let r = c.cmd("SBUF 1024");
    assert!(r.starts_with("200") && r.contains("2048 requested"), "{r}");
    let r = c.cmd("SITE BUFSIZE 1024");
    assert!(r.starts_with("501"), "{r}");
}
