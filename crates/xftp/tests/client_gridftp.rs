//! Interop: `xftp get/put/ls` against globus-gridftp-server used as a plain
//! FTP server (a second stock server nobody here wrote). It refuses MULT,
//! so `-p 4` uses GridFTP's own parallelism (MODE E; OPTS RETR
//! Parallelism for downloads). Skips with a message when the
//! server is missing or we are not root (its anonymous user needs setuid),
//! but fails instead when XFTP_REQUIRE_PEERS=1.

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{sha256_file, write_prng_file};

const SERVER: &str = "globus-gridftp-server";

struct Gridftp {
    child: Child,
    port: u16,
}

impl Drop for Gridftp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn usable(test: &str) -> bool {
    let have = Command::new(SERVER)
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let why = match (have, root) {
        (true, true) => return true,
        (false, _) => {
            "globus-gridftp-server is not installed (apt-get install globus-gridftp-server-progs)"
        }
        (true, false) => "globus-gridftp-server's anonymous user needs root",
    };
    if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{test}: {why}, and XFTP_REQUIRE_PEERS=1");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

fn start(log: &Path) -> Gridftp {
    // The server takes a fixed port: pick one that is free right now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(SERVER)
        .args([
            "-aa",
            "-anonymous-user",
            "nobody",
            "-hostname",
            "127.0.0.1",
            "-p",
        ])
        .arg(port.to_string())
        .args(["-d", "error", "-disable-usage-stats", "-l"])
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn globus-gridftp-server");
    let server = Gridftp { child, port };
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "gridftp server not listening after 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run xftp")
}

fn ok_json(out: &Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}

/// A temporary directory with `srv/` inside, both open to the server's
/// anonymous user (nobody), who reads and writes there.
fn served_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let srv = tmp.path().join("srv");
    std::fs::create_dir(&srv).unwrap();
    std::fs::set_permissions(&srv, std::fs::Permissions::from_mode(0o777)).unwrap();
    (tmp, srv)
}

#[test]
fn gridftp_server_as_a_stock_ftp_server() {
    if !usable("gridftp_server_as_a_stock_ftp_server") {
        return;
    }
    let (tmp, srv) = served_dir();
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let server = start(&tmp.path().join("gridftp.log"));
    // GridFTP paths are absolute: ftp://host:port//abs/path.
    let base = format!("ftp://127.0.0.1:{}/{}", server.port, srv.display());

    for (i, len) in [0u64, 1, 1024 * 1024 + 7].into_iter().enumerate() {
        let name = format!("f{len}.bin");
        write_prng_file(&srv.join(&name), len, 40 + i as u64);
        let want = sha256_file(&srv.join(&name));
        for (mode, local_name) in [("", "p"), ("--active", "a")] {
            let dest = format!("{local_name}-{name}");
            let url = format!("{base}/{name}");
            let mut args = vec!["get", url.as_str(), dest.as_str(), "--json"];
            if !mode.is_empty() {
                args.push(mode);
            }
            let j = ok_json(&xftp(&args, &local), &format!("get {len} B {mode}"));
            assert_eq!(j["bytes"], len);
            assert_eq!(sha256_file(&local.join(&dest)), want, "get {len} B {mode}");
        }
        // Upload it back under another name, passive then active.
        for mode in ["", "--active"] {
            let url = format!("{base}/up{mode}-{name}");
            let src = format!("p-{name}");
            let mut args = vec!["put", src.as_str(), url.as_str(), "--json"];
            if !mode.is_empty() {
                args.push(mode);
            }
            let j = ok_json(&xftp(&args, &local), &format!("put {len} B {mode}"));
            assert_eq!(j["bytes"], len);
            assert_eq!(sha256_file(&srv.join(format!("up{mode}-{name}"))), want);
        }
    }

    // A multi-stream download from a server without MULT: GridFTP's own
    // parallelism (MODE E, OPTS RETR Parallelism, the server connects).
    let big = "big.bin";
    write_prng_file(&srv.join(big), 6 * 1024 * 1024 + 3, 77);
    let url = format!("{base}/{big}");
    let out = xftp(&["get", &url, "m.bin", "-p", "4", "--json"], &local);
    let j = ok_json(&out, "get -p 4");
    assert_eq!(j["streams"], 4, "{j}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("GridFTP server: 4 parallel"), "{stderr}");
    assert!(!stderr.contains("does not support MULT"), "{stderr}");
    assert_eq!(
        sha256_file(&local.join("m.bin")),
        sha256_file(&srv.join(big))
    );
    // An upload over 4 connections in MODE E (the client, the sender,
    // connects; the server may send 112 performance markers before 226).
    let out = xftp(
        &[
            "put",
            "m.bin",
            &format!("{base}/up-m.bin"),
            "-p",
            "4",
            "--json",
        ],
        &local,
    );
    let j = ok_json(&out, "put -p 4");
    assert_eq!(j["streams"], 4, "{j}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("opened by this client"), "{stderr}");
    assert_eq!(
        sha256_file(&srv.join("up-m.bin")),
        sha256_file(&srv.join(big))
    );

    // The probe knows it for a GridFTP server: MODE E, no MULT, a count
    // fixed for the transfer.
    let j = ok_json(
        &xftp(&["probe", &format!("{base}/"), "--json"], &local),
        "probe",
    );
    assert_eq!(
        (&j["gridftp"], &j["mode_e"], &j["mult"], &j["adaptive"]),
        (
            &serde_json::json!(true),
            &serde_json::json!(true),
            &serde_json::json!(false),
            &serde_json::json!(false)
        ),
        "{j}"
    );
    assert!(j["reason"].as_str().unwrap().contains("GridFTP"), "{j}");

    // Listing, and a missing file.
    let out = xftp(&["ls", &format!("{base}/")], &local);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("f1048583.bin"));
    let out = xftp(&["get", &format!("{base}/missing.bin")], &local);
    assert!(!out.status.success());
    assert!(!local.join("missing.bin").exists());
    // The same through the parallel path: a clear failure, no file.
    let out = xftp(&["get", &format!("{base}/missing.bin"), "-p", "4"], &local);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("RETR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!local.join("missing.bin").exists());
}

/// One session of the library: a parallel GridFTP download or upload
/// switches the session to MODE E and back, so listings, a second
/// download and an upload that follow still work.
#[test]
fn gridftp_parallel_download_leaves_the_session_usable() {
    if !usable("gridftp_parallel_download_leaves_the_session_usable") {
        return;
    }
    let (tmp, srv) = served_dir();
    write_prng_file(&srv.join("a.bin"), 3 * 1024 * 1024 + 1, 91);
    let want = sha256_file(&srv.join("a.bin"));
    let server = start(&tmp.path().join("gridftp.log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = xftp_client::ClientConfig {
            streams: 3,
            ..xftp_client::ClientConfig::default()
        };
        let mut c = xftp_client::Client::connect("127.0.0.1", server.port, cfg)
            .await
            .unwrap();
        c.login_pipelined(None, None).await.unwrap();
        let remote = format!("{}/a.bin", srv.display());
        for round in 0..2 {
            let dst = tmp.path().join(format!("got{round}"));
            let r = c.download(&remote, &dst).await.unwrap();
            assert_eq!(r.per_stream_bytes.len(), 3, "round {round}");
            assert_eq!(sha256_file(&dst), want, "round {round}");
            let listing = c.list(Some(&srv.display().to_string())).await.unwrap();
            assert!(
                String::from_utf8_lossy(&listing).contains("a.bin"),
                "round {round}: {}",
                String::from_utf8_lossy(&listing)
            );
        }
        let up = format!("{}/up.bin", srv.display());
        let r = c.upload(&tmp.path().join("got0"), &up).await.unwrap();
        assert_eq!(r.bytes, 3 * 1024 * 1024 + 1);
        assert_eq!(r.per_stream_bytes.len(), 3);
        // Still in stream mode: a listing after the upload works.
        let listing = c.list(Some(&srv.display().to_string())).await.unwrap();
        assert!(String::from_utf8_lossy(&listing).contains("up.bin"));
        c.quit().await;
    });
    assert_eq!(sha256_file(&srv.join("up.bin")), want);
}

/// A parallel download the server fails after its 150 (a directory given
/// as the file: `500 ... Is a directory`) fails at once with the server's
/// reply, not after the data timeout for connections that never come;
/// the session goes on.
#[test]
fn a_parallel_download_the_server_fails_after_150_fails_at_once() {
    if !usable("a_parallel_download_the_server_fails_after_150_fails_at_once") {
        return;
    }
    let (tmp, srv) = served_dir();
    std::fs::create_dir_all(srv.join("adir")).unwrap();
    write_prng_file(&srv.join("b.bin"), 1024 * 1024 + 3, 92);
    let server = start(&tmp.path().join("gridftp.log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = xftp_client::ClientConfig {
            streams: 4,
            data_timeout: std::time::Duration::from_secs(30),
            ..xftp_client::ClientConfig::default()
        };
        let mut c = xftp_client::Client::connect("127.0.0.1", server.port, cfg)
            .await
            .unwrap();
        c.login_pipelined(None, None).await.unwrap();
        let t0 = std::time::Instant::now();
        let r = c
            .download(&format!("{}/adir", srv.display()), &tmp.path().join("ad"))
            .await;
        let e = r.expect_err("a directory is no file").to_string();
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{e}");
        assert!(e.contains("500") || e.contains("directory"), "{e}");
        let dst = tmp.path().join("b");
        c.download(&format!("{}/b.bin", srv.display()), &dst)
            .await
            .unwrap();
        assert_eq!(sha256_file(&dst), sha256_file(&srv.join("b.bin")));
        c.quit().await;
    });
}

/// A path given relative to the login directory (anonymous: one that
/// does not exist) is refused with GridFTP's 500, which the CLI explains
/// as it does a 550: paths on this server are absolute, `//abs/path`.
#[test]
fn a_relative_path_on_gridftp_gets_the_absolute_path_hint() {
    if !usable("a_relative_path_on_gridftp_gets_the_absolute_path_hint") {
        return;
    }
    let (tmp, srv) = served_dir();
    write_prng_file(&srv.join("c.bin"), 1000, 93);
    let server = start(&tmp.path().join("gridftp.log"));
    let url = format!(
        "ftp://127.0.0.1:{}/{}",
        server.port,
        srv.join("c.bin")
            .display()
            .to_string()
            .trim_start_matches('/')
    );
    let out = xftp(&["get", &url, "c"], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("//abs/path"), "{err}");
    // Absolute already, and missing: no advice to write it so.
    let url = format!(
        "ftp://127.0.0.1:{}/{}",
        server.port,
        srv.join("gone.bin").display()
    );
    let out = xftp(&["get", &url, "g"], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        !err.contains("//abs/path") && err.contains("permissions"),
        "{err}"
    );
}

/// A file rewritten in place while a GridFTP server sends it over four
/// connections (it sends what it reads): the file's time before and
/// after tells, and nothing is put in place.
#[test]
fn a_file_rewritten_during_a_gridftp_download_is_refused() {
    if !usable("a_file_rewritten_during_a_gridftp_download_is_refused") {
        return;
    }
    let (tmp, srv) = served_dir();
    let f = srv.join("r.bin");
    write_prng_file(&f, 16 << 20, 94);
    let server = start(&tmp.path().join("gridftp.log"));
    let url = format!("ftp://127.0.0.1:{}/{}", server.port, f.display());
    let child = support::spawn_xftp(
        &["get", "-p", "4", "--limit-rate", "8M", &url, "r.bin"],
        tmp.path(),
    );
    std::thread::sleep(std::time::Duration::from_millis(1000));
    {
        use std::io::{Seek, Write};
        let mut w = std::fs::File::options().write(true).open(&f).unwrap();
        w.seek(std::io::SeekFrom::Start(12 << 20)).unwrap();
        w.write_all(&vec![0x5a; 1 << 20]).unwrap();
        w.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("changed on the server during the download"),
        "{err}"
    );
    assert!(!tmp.path().join("r.bin").exists(), "{err}");
}

/// The shell against globus-gridftp-server: `mult 4` connects again,
/// and the login lands where it did (anonymous: a PWD of `/nonexistent`
/// that CWD refuses, so no CWD back to it); get and put then go over
/// GridFTP's parallelism.
#[test]
fn the_shell_reconnects_to_a_login_directory_it_cannot_cwd_into() {
    if !usable("the_shell_reconnects_to_a_login_directory_it_cannot_cwd_into") {
        return;
    }
    let (tmp, srv) = served_dir();
    write_prng_file(&srv.join("a.bin"), 2_000_003, 92);
    let server = start(&tmp.path().join("gridftp.log"));
    let got = tmp.path().join("got.bin");
    let script = format!(
        "mult 4\nget /{src} {got}\nput {got} /{up}\n",
        src = srv.join("a.bin").display(),
        got = got.display(),
        up = srv.join("up.bin").display(),
    );
    let out = support::shell_script(
        &format!("ftp://127.0.0.1:{}/", server.port),
        tmp.path(),
        &script,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("4 connections"), "{err}");
    assert_eq!(sha256_file(&got), sha256_file(&srv.join("a.bin")));
    assert_eq!(
        sha256_file(&srv.join("up.bin")),
        sha256_file(&srv.join("a.bin"))
    );
}

#[test]
fn a_cut_download_resumes_over_gridftp_parallelism() {
    if !usable("a_cut_download_resumes_over_gridftp_parallelism") {
        return;
    }
    let (tmp, srv) = served_dir();
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let server = start(&tmp.path().join("gridftp.log"));
    let len = 20_000_000 + 9;
    write_prng_file(&srv.join("r.bin"), len, 77);
    let url = format!("ftp://127.0.0.1:{}/{}/r.bin", server.port, srv.display());
    // 4 MiB/s: cut after 1.5 s, well before the end.
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", "-c", "-p", "4", "--limit-rate", "4M", &url, "r.bin"])
        .current_dir(&local)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(matches!(child.try_wait(), Ok(None)), "ended before the cut");
    child.kill().unwrap();
    let _ = child.wait();
    assert!(!local.join("r.bin").exists());
    let out = xftp(&["get", "-c", "-p", "4", "--json", &url, "r.bin"], &local);
    let j = ok_json(&out, "resumed get from globus-gridftp-server");
    let moved = j["bytes"].as_u64().unwrap();
    let already = j["bytes_already_present"].as_u64().unwrap_or(0);
    assert!(already > 0 && moved < len, "{j}");
    assert_eq!(moved + already, len, "{j}");
    assert!(
        j["streams"].as_u64().unwrap() > 1,
        "GridFTP parallelism used: {j}"
    );
    assert_eq!(
        sha256_file(&local.join("r.bin")),
        sha256_file(&srv.join("r.bin"))
    );
}

/// `put -r` to globus-gridftp-server: every file keeps its time and mode
/// (the server answers MFMT and SITE CHMOD with 250, which was taken for
/// a refusal after the first file), and a second run into the directory
/// the first made succeeds (the check that it exists went back to the
/// anonymous user's `/nonexistent` login directory, and failed on that).
#[test]
fn a_tree_upload_keeps_every_files_facts_and_runs_again() {
    if !usable("a_tree_upload_keeps_every_files_facts_and_runs_again") {
        return;
    }
    let (tmp, srv) = served_dir();
    let tree = tmp.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(978_307_200);
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let f = tree.join(name);
        write_prng_file(&f, 1000 + i as u64, 60 + i as u64);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let server = start(&tmp.path().join("gridftp.log"));
    let url = format!("ftp://127.0.0.1:{}/{}/t/", server.port, srv.display());
    for run in 0..2 {
        let out = xftp(
            &["put", "-r", "-p", "1", "--concurrency", "1", "t", &url],
            tmp.path(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "run {run}: {err}");
    }
    for name in ["a", "b", "c"] {
        let md = std::fs::metadata(srv.join("t").join(name)).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{name}");
        assert_eq!(md.modified().unwrap(), old, "{name}");
    }
}

/// `--bufsize` reaches globus-gridftp-server: it refuses `SITE BUFSIZE`,
/// and takes GridFTP's `SBUF`, which the client sends then.
#[test]
fn bufsize_reaches_gridftp_as_sbuf() {
    if !usable("bufsize_reaches_gridftp_as_sbuf") {
        return;
    }
    let (tmp, srv) = served_dir();
    write_prng_file(&srv.join("b.bin"), 100_000, 71);
    let server = start(&tmp.path().join("gridftp.log"));
    let url = format!("ftp://127.0.0.1:{}/{}/b.bin", server.port, srv.display());
    let out = xftp(
        &["get", "--bufsize", "1M", "--json", &url, "b.bin"],
        tmp.path(),
    );
    let j = ok_json(&out, "get --bufsize 1M");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("refused"), "{err}");
    let reply = j["server_bufsize_reply"].as_str().unwrap_or("");
    assert!(reply.starts_with('2'), "{j}");
    assert_eq!(
        sha256_file(&tmp.path().join("b.bin")),
        sha256_file(&srv.join("b.bin"))
    );
}
