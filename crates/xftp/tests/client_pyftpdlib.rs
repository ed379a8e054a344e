//! Interop: `xftp get/put/ls` against pyftpdlib, an FTP server nobody here
//! wrote. Skips with a message when /usr/bin/python3 lacks pyftpdlib, but
//! fails instead when XFTP_REQUIRE_PEERS=1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;
use support::{have_pyftpdlib, sha256_file, spawn_logging_server, write_prng_file, Pyftpd, PYTHON};

const MIB: u64 = 1024 * 1024;

/// Anonymous, writable pyftpdlib serving `dir`.
fn pyftpd(dir: &Path) -> Pyftpd {
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-m", "pyftpdlib", "-i", "127.0.0.1", "-p", "0", "-d"])
        .arg(dir)
        .arg("-w");
    spawn_logging_server(cmd)
}

/// pyftpdlib with one named user (`alice` / `s3cret`) and no anonymous login.
fn pyftpd_with_user(dir: &Path) -> Pyftpd {
    let script = r#"
import logging, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer
logging.basicConfig(level=logging.INFO)
auth = DummyAuthorizer()
auth.add_user("alice", "s3cret", sys.argv[1], perm="elradfmwMT")
FTPHandler.authorizer = auth
FTPHandler.auth_failed_timeout = 0.1
FTPServer(("127.0.0.1", 0), FTPHandler).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(dir);
    spawn_logging_server(cmd)
}

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .env_remove("XFTP_PASSWORD")
        .output()
        .expect("run xftp")
}

fn json_of(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON line expected, got {text:?}"
    );
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("bad JSON {text:?}: {e}"))
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
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

/// Upload then download each size; compare by sha256 at every step.
fn roundtrip(sizes: &[u64], mode: &[&str], test: &str) {
    if !have_pyftpdlib(test) {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    let base = format!("ftp://127.0.0.1:{}", server.port);
    for (i, &len) in sizes.iter().enumerate() {
        let name = format!("f{len}.bin");
        let src = d.local.join(format!("src-{name}"));
        write_prng_file(&src, len, 0x9E37_79B9 + i as u64);
        let want = sha256_file(&src);

        let mut args = vec!["put", src.to_str().unwrap()];
        let url = format!("{base}/{name}");
        args.push(&url);
        args.extend_from_slice(mode);
        args.push("--json");
        let out = xftp(&args, &d.local);
        assert_ok(&out, &format!("put {len} B {mode:?}"));
        let j = json_of(&out);
        assert_eq!(j["status"], "ok");
        assert_eq!(j["bytes"], len);
        assert_eq!(j["streams"], 1);
        assert_eq!(j["per_stream_bytes"], serde_json::json!([len]));
        assert_eq!(
            sha256_file(&d.srv.join(&name)),
            want,
            "server copy of {len} B differs"
        );

        let mut args = vec!["get", &url, "--json"];
        args.extend_from_slice(mode);
        let out = xftp(&args, &d.local);
        assert_ok(&out, &format!("get {len} B {mode:?}"));
        let j = json_of(&out);
        assert_eq!(j["status"], "ok");
        assert_eq!(j["bytes"], len);
        assert_eq!(
            sha256_file(&d.local.join(&name)),
            want,
            "downloaded {len} B differs"
        );
    }
    // Nothing but the sources and the downloads: no temporary files left.
    for e in entries(&d.local) {
        assert!(!e.contains("xftp-part"), "temporary file left behind: {e}");
    }
}

#[test]
fn small_files_passive() {
    roundtrip(&[0, 1, MIB + 7], &[], "small_files_passive");
}

#[test]
fn small_files_active() {
    roundtrip(&[0, 1, MIB + 7], &["--active"], "small_files_active");
}

#[test]
fn large_file_passive() {
    roundtrip(&[256 * MIB], &[], "large_file_passive");
}

#[test]
fn listing_passive_and_active() {
    if !have_pyftpdlib("listing_passive_and_active") {
        return;
    }
    let d = dirs();
    std::fs::write(d.srv.join("alpha.txt"), b"a").unwrap();
    std::fs::create_dir(d.srv.join("sub dir")).unwrap();
    std::fs::write(d.srv.join("sub dir").join("inner.bin"), b"xyz").unwrap();
    let server = pyftpd(&d.srv);
    for mode in [&[][..], &["--active"][..]] {
        let url = format!("ftp://127.0.0.1:{}/", server.port);
        let mut args = vec!["ls", url.as_str()];
        args.extend_from_slice(mode);
        let out = xftp(&args, &d.local);
        assert_ok(&out, "ls");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("alpha.txt") && text.contains("sub dir"),
            "{text}"
        );
        // A percent-encoded directory path.
        let url = format!("ftp://127.0.0.1:{}/sub%20dir/", server.port);
        let mut args = vec!["ls", url.as_str()];
        args.extend_from_slice(mode);
        let out = xftp(&args, &d.local);
        assert_ok(&out, "ls sub dir");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("inner.bin") && !text.contains("alpha.txt"),
            "{text}"
        );
    }
    // `probe` says what get and put would do with a server without MULT:
    // ranged sessions for downloads (one on loopback), one connection up.
    let url = format!("ftp://127.0.0.1:{}/", server.port);
    let out = xftp(&["probe", &url, "--json"], &d.local);
    let j = json_of(&out);
    assert_eq!(j["mult"], false, "{j}");
    let reason = j["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("does not list MULT") && reason.contains("uploads over one connection"),
        "{j}"
    );
}

#[test]
fn get_into_directory_and_put_to_directory_url() {
    if !have_pyftpdlib("get_into_directory_and_put_to_directory_url") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    std::fs::create_dir(d.srv.join("in")).unwrap();
    let src = d.local.join("payload.bin");
    write_prng_file(&src, 4096 + 3, 7);
    let url = format!("ftp://127.0.0.1:{}/in/", server.port);
    assert_ok(
        &xftp(&["put", "payload.bin", &url], &d.local),
        "put to dir URL",
    );
    assert_eq!(
        sha256_file(&d.srv.join("in/payload.bin")),
        sha256_file(&src)
    );

    let dest = d.local.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let url = format!("ftp://127.0.0.1:{}/in/payload.bin", server.port);
    assert_ok(&xftp(&["get", &url, "dest"], &d.local), "get into dir");
    assert_eq!(sha256_file(&dest.join("payload.bin")), sha256_file(&src));
}

#[test]
fn missing_remote_file_fails_and_leaves_nothing() {
    if !have_pyftpdlib("missing_remote_file_fails_and_leaves_nothing") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    for mode in [&[][..], &["--active"][..]] {
        let url = format!("ftp://127.0.0.1:{}/no-such-file.bin", server.port);
        let mut args = vec!["get", url.as_str(), "--json"];
        args.extend_from_slice(mode);
        let out = xftp(&args, &d.local);
        assert!(!out.status.success(), "missing file must fail");
        let j = json_of(&out);
        assert_eq!(j["status"], "error");
        let err = j["error"].as_str().unwrap_or_default();
        assert!(err.contains("550") && err.contains("xftp ls"), "{err}");
        assert_eq!(
            entries(&d.local),
            Vec::<String>::new(),
            "nothing may be left"
        );
    }
}

/// `get -c` of a file the server lists but will not send (pyftpdlib's
/// anonymous user without the retrieve permission: SIZE answers, RETR is
/// refused with 550): no empty partial is left behind, and the message
/// does not advise a run with -c that cannot help.
#[test]
fn get_c_of_a_file_the_server_refuses_leaves_no_empty_partial() {
    if !have_pyftpdlib("get_c_of_a_file_the_server_refuses_leaves_no_empty_partial") {
        return;
    }
    let d = dirs();
    std::fs::write(d.srv.join("noread.bin"), b"secret").unwrap();
    let script = r#"
import logging, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer
logging.basicConfig(level=logging.INFO)
auth = DummyAuthorizer()
auth.add_anonymous(sys.argv[1], perm="el")
FTPHandler.authorizer = auth
FTPServer(("127.0.0.1", 0), FTPHandler).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(&d.srv);
    let server = spawn_logging_server(cmd);
    let url = format!("ftp://127.0.0.1:{}/noread.bin", server.port);
    let out = xftp(&["get", "-c", &url], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("550"), "{err}");
    assert!(!err.contains("run the same command again"), "{err}");
    assert_eq!(entries(&d.local), Vec::<String>::new(), "{err}");
}

#[test]
fn upload_into_missing_directory_fails() {
    if !have_pyftpdlib("upload_into_missing_directory_fails") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    let src = d.local.join("x.bin");
    write_prng_file(&src, 100, 3);
    let url = format!("ftp://127.0.0.1:{}/nodir/x.bin", server.port);
    let out = xftp(&["put", "x.bin", &url], &d.local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("550"), "{err}");
    assert!(!d.srv.join("nodir").exists());
}

#[test]
fn named_user_right_and_wrong_password() {
    if !have_pyftpdlib("named_user_right_and_wrong_password") {
        return;
    }
    let d = dirs();
    std::fs::write(d.srv.join("secret.txt"), b"for alice only\n").unwrap();
    let server = pyftpd_with_user(&d.srv);
    let port = server.port;

    // Wrong password (in the URL): 530, non-zero exit, no file.
    let url = format!("ftp://alice:wrong@127.0.0.1:{port}/secret.txt");
    let out = xftp(&["get", &url], &d.local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("530") && err.contains("password"), "{err}");
    assert!(!d.local.join("secret.txt").exists());

    // Anonymous is refused by this server, and the message says what to do.
    let url = format!("ftp://127.0.0.1:{port}/secret.txt");
    let out = xftp(&["get", &url], &d.local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("530") && err.contains("anonymous"), "{err}");

    // Right password from XFTP_PASSWORD.
    let url = format!("ftp://alice@127.0.0.1:{port}/secret.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", &url])
        .current_dir(&d.local)
        .env("XFTP_PASSWORD", "s3cret")
        .output()
        .unwrap();
    assert_ok(&out, "get with XFTP_PASSWORD");
    assert_eq!(
        std::fs::read(d.local.join("secret.txt")).unwrap(),
        b"for alice only\n"
    );

    // Right password from --password-file.
    let pw = d.local.join("pw");
    std::fs::write(&pw, "s3cret\n").unwrap();
    let out = xftp(
        &[
            "get",
            &url,
            "copy.txt",
            "--password-file",
            pw.to_str().unwrap(),
        ],
        &d.local,
    );
    assert_ok(&out, "get with --password-file");
    assert_eq!(
        std::fs::read(d.local.join("copy.txt")).unwrap(),
        b"for alice only\n"
    );

    // A named user without any password source is refused before connecting.
    let out = xftp(&["get", &url, "none.txt"], &d.local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("XFTP_PASSWORD") && err.contains("--password-file"),
        "{err}"
    );
}

#[test]
fn multi_stream_request_falls_back_to_one_connection() {
    if !have_pyftpdlib("multi_stream_request_falls_back_to_one_connection") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    write_prng_file(&d.srv.join("m.bin"), 300_001, 11);
    let url = format!("ftp://127.0.0.1:{}/m.bin", server.port);
    let out = xftp(&["get", &url, "-p", "4", "--json"], &d.local);
    assert_ok(&out, "get -p 4 against a stock server");
    let j = json_of(&out);
    assert_eq!(j["streams"], 1);
    assert_eq!(j["bytes"], 300_001);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not support MULT; using 1 connection"),
        "{err}"
    );
    assert_eq!(
        sha256_file(&d.local.join("m.bin")),
        sha256_file(&d.srv.join("m.bin"))
    );
    // With --static the notice is the same: OPTS MULT STATIC refused too
    // says nothing more where there is no MULT.
    std::fs::remove_file(d.local.join("m.bin")).unwrap();
    let out = xftp(&["get", &url, "-p", "4", "--static"], &d.local);
    assert_ok(&out, "get -p 4 --static against a stock server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not support MULT") && !err.contains("STATIC"),
        "{err}"
    );
}

#[test]
fn ranged_sessions_slow_to_log_in_are_dropped_and_said_so() {
    if !have_pyftpdlib("ranged_sessions_slow_to_log_in_are_dropped_and_said_so") {
        return;
    }
    // A server that greets every session after the first 5 s late: the
    // first fetches the whole file long before, and the others, with
    // nothing left to take, are dropped (not waited for) and named as
    // not needed in the notice.
    let script = r#"
import logging, sys, threading, time
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import ThreadedFTPServer
logging.basicConfig(level=logging.INFO)
auth = DummyAuthorizer()
auth.add_anonymous(sys.argv[1])
seen = [0]
lock = threading.Lock()
class Slow(FTPHandler):
    def on_connect(self):
        with lock:
            seen[0] += 1
            n = seen[0]
        if n > 1:
            time.sleep(5)
Slow.authorizer = auth
server = ThreadedFTPServer(("127.0.0.1", 0), Slow)
# (The threaded server does not log its port.)
sys.stderr.write("starting FTP server on 127.0.0.1:%d\n" % server.address[1])
sys.stderr.flush()
server.serve_forever()
"#;
    let d = dirs();
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(&d.srv);
    let server = spawn_logging_server(cmd);
    write_prng_file(&d.srv.join("r.bin"), 4 * MIB + 7, 12);
    let url = format!("ftp://127.0.0.1:{}/r.bin", server.port);
    let out = xftp(&["get", &url, "-p", "4", "--json"], &d.local);
    assert_ok(&out, "get -p 4 from a server slow to greet");
    assert_eq!(json_of(&out)["bytes"], 4 * MIB + 7);
    assert_eq!(
        sha256_file(&d.local.join("r.bin")),
        sha256_file(&d.srv.join("r.bin"))
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("4 sessions, each fetching byte ranges (REST); 3 of them not needed"),
        "{err}"
    );
}

#[test]
fn connection_refused_is_reported() {
    // No peer needed: a port that was free a moment ago, below the
    // ephemeral range, where no other test's connection or passive
    // listener lands in the meantime.
    let port = support::free_port();
    let d = dirs();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url, "--json"], &d.local);
    assert!(!out.status.success());
    let j = json_of(&out);
    assert_eq!(j["status"], "error");
    let err = j["error"].as_str().unwrap_or_default();
    assert!(err.contains("refused") && err.contains("port"), "{err}");
    assert_eq!(entries(&d.local), Vec::<String>::new());
}

#[test]
fn hostile_file_names_and_missing_directory_listing() {
    if !have_pyftpdlib("hostile_file_names_and_missing_directory_listing") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    // Spaces, non-ASCII, '?', '#', a quote and a leading dash.
    let name = "-hüllo w?rld #1 'q'.bin";
    let encoded = "-h%C3%BCllo%20w%3Frld%20%231%20'q'.bin";
    let src = d.local.join("src.bin");
    write_prng_file(&src, 70_001, 21);
    let url = format!("ftp://127.0.0.1:{}/{encoded}", server.port);
    assert_ok(
        &xftp(&["put", "src.bin", &url], &d.local),
        "put hostile name",
    );
    assert_eq!(sha256_file(&d.srv.join(name)), sha256_file(&src));
    assert_ok(
        &xftp(&["get", &url, "back.bin"], &d.local),
        "get hostile name",
    );
    assert_eq!(sha256_file(&d.local.join("back.bin")), sha256_file(&src));

    let url = format!("ftp://127.0.0.1:{}/no-such-dir/", server.port);
    let out = xftp(&["ls", &url], &d.local);
    assert!(
        !out.status.success(),
        "listing a missing directory must fail"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("550"), "{err}");
}

/// `put -c` of an empty file: nothing to resume, so a plain STOR, which
/// a stock server takes too (a non-empty one needs an xftp server).
#[test]
fn put_c_of_an_empty_file_works_on_a_stock_server() {
    if !have_pyftpdlib("put_c_of_an_empty_file_works_on_a_stock_server") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    std::fs::write(d.local.join("empty"), b"").unwrap();
    std::fs::write(d.srv.join("empty"), b"old").unwrap();
    let url = format!("ftp://127.0.0.1:{}/empty", server.port);
    assert_ok(
        &xftp(&["put", "-c", "empty", &url], &d.local),
        "put -c empty",
    );
    assert_eq!(std::fs::read(d.srv.join("empty")).unwrap(), b"");
    write_prng_file(&d.local.join("full"), 10, 1);
    let url = format!("ftp://127.0.0.1:{}/full", server.port);
    let out = xftp(&["put", "-c", "-p", "4", "full", &url], &d.local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs an xftp server"), "{err}");
    // No plan announced that never runs.
    assert!(!err.contains("using 1 connection"), "{err}");
}

/// pyftpdlib lists a link to a directory as the directory (with its
/// `unique` fact): `get -r` takes a link back up the tree once, not into
/// itself until the path is too long.
#[test]
fn get_r_does_not_loop_through_a_link_back_up_the_tree() {
    if !have_pyftpdlib("get_r_does_not_loop_through_a_link_back_up_the_tree") {
        return;
    }
    let d = dirs();
    std::fs::create_dir_all(d.srv.join("tree/sub")).unwrap();
    std::fs::write(d.srv.join("tree/a"), b"a").unwrap();
    std::fs::write(d.srv.join("tree/sub/b"), b"b").unwrap();
    std::os::unix::fs::symlink(".", d.srv.join("tree/current")).unwrap();
    std::os::unix::fs::symlink("..", d.srv.join("tree/sub/up")).unwrap();
    let server = pyftpd(&d.srv);
    let url = format!("ftp://127.0.0.1:{}/tree/", server.port);
    let out = xftp(&["get", "-r", &url, "copy", "--json"], &d.local);
    assert_ok(&out, "get -r of a tree with links back up");
    let j = json_of(&out);
    // a and sub/b; `current` and `sub/up` lead back to the top, whose own
    // `unique` MLST gave: both left out, not copied once more.
    assert_eq!(j["other"], 2, "{j}");
    assert_eq!((&j["files"], &j["dirs"]), (&2.into(), &1.into()), "{j}");
    let deepest = walkdir_depth(&d.local.join("copy"));
    assert_eq!(deepest, 1, "the copy went {deepest} levels deep");
    assert_eq!(std::fs::read(d.local.join("copy/sub/b")).unwrap(), b"b");
}

fn walkdir_depth(p: &Path) -> usize {
    std::fs::read_dir(p)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| 1 + walkdir_depth(&e.path()))
        .max()
        .unwrap_or(0)
}

/// A one-connection upload whose local file shrinks or grows while it is
/// sent fails, and the stock server's copy (written in place under the
/// target's name) is deleted: a prefix must not look like the file.
#[test]
fn an_upload_of_a_file_that_changes_leaves_no_copy_on_a_stock_server() {
    if !have_pyftpdlib("an_upload_of_a_file_that_changes_leaves_no_copy_on_a_stock_server") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    let shrink = |p: &Path| support::shrink(p, 3_000_000);
    let grow = |p: &Path| {
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        std::io::Write::write_all(&mut f, &[7u8; 1_000_000]).unwrap();
    };
    for (name, out) in [
        (
            "shrunk",
            support::put_while_changing(
                &d.local,
                &format!("ftp://127.0.0.1:{}/shrunk", server.port),
                shrink,
            ),
        ),
        (
            "grown",
            support::put_while_changing(
                &d.local,
                &format!("ftp://127.0.0.1:{}/grown", server.port),
                grow,
            ),
        ),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(
            err.contains("the local file changed while it was sent")
                && err.contains("the server holds nothing of this upload"),
            "{name}: {err}"
        );
        assert!(!d.srv.join(name).exists(), "{name} left on the server");
    }
}

/// A stock server writes an upload in place, and pyftpdlib even answers a
/// reset upload with 226: Ctrl-C must not leave a prefix under the
/// file's name, for a single file or a tree.
#[test]
fn an_interrupted_put_leaves_no_prefix_on_a_stock_server() {
    if !have_pyftpdlib("an_interrupted_put_leaves_no_prefix_on_a_stock_server") {
        return;
    }
    let d = dirs();
    let server = pyftpd(&d.srv);
    write_prng_file(&d.local.join("big.bin"), 12 * MIB, 5);
    let url = format!("ftp://127.0.0.1:{}/big.bin", server.port);
    let args = [
        "put",
        "--json",
        "--limit-rate",
        "4M",
        "big.bin",
        url.as_str(),
    ];
    let (out, running) =
        support::xftp_interrupted(&args, &d.local, std::time::Duration::from_millis(800));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(running, "the upload ended before the signal: {err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert_eq!(json_of(&out)["error"], "interrupted (SIGINT)", "{err}");
    assert!(err.contains("deleted the incomplete copy"), "{err}");
    assert!(!d.srv.join("big.bin").exists(), "a prefix was left: {err}");

    let tree = d.local.join("tree");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..4 {
        write_prng_file(&tree.join(format!("f{i}")), 4 * MIB, i);
    }
    let url = format!("ftp://127.0.0.1:{}/tree/", server.port);
    let args = ["put", "-r", "--limit-rate", "4M", "tree", url.as_str()];
    let (out, running) =
        support::xftp_interrupted(&args, &d.local, std::time::Duration::from_millis(800));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(running, "the upload ended before the signal: {err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    for e in std::fs::read_dir(d.srv.join("tree")).unwrap() {
        let e = e.unwrap();
        let len = e.metadata().unwrap().len();
        assert_eq!(len, 4 * MIB, "{:?} is cut short: {err}", e.file_name());
    }
}

/// pyftpdlib, anonymous and writable, reading uploads at 2 MiB/s (its
/// `ThrottledDTPHandler`): an upload that is still running when a signal
/// comes, whatever the machine's speed.
fn pyftpd_slow_uploads(dir: &Path) -> Pyftpd {
    pyftpd_throttled(dir, "read_limit")
}

/// pyftpdlib, anonymous and writable, with `limit` (`read_limit`:
/// uploads, `write_limit`: downloads) at 2 MiB/s a data connection.
fn pyftpd_throttled(dir: &Path, limit: &str) -> Pyftpd {
    let script = r#"
import logging, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler, ThrottledDTPHandler
from pyftpdlib.servers import FTPServer
logging.basicConfig(level=logging.INFO)
auth = DummyAuthorizer()
auth.add_anonymous(sys.argv[1], perm="elradfmwMT")
setattr(ThrottledDTPHandler, sys.argv[2], 2 * 1024 * 1024)
FTPHandler.authorizer = auth
FTPHandler.dtp_handler = ThrottledDTPHandler
# sendfile(2) would bypass the throttle.
FTPHandler.use_sendfile = False
FTPServer(("127.0.0.1", 0), FTPHandler).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(dir).arg(limit);
    spawn_logging_server(cmd)
}

/// Ctrl-C (SIGINT) during the shell's `put` stops the upload as `xftp put`
/// does: the data connection reset, the server's reply read, and the cut
/// copy deleted, not left under the file's name.
#[test]
fn an_interrupted_put_in_the_shell_leaves_no_prefix() {
    if !have_pyftpdlib("an_interrupted_put_in_the_shell_leaves_no_prefix") {
        return;
    }
    use std::io::Write;
    let d = dirs();
    let server = pyftpd_slow_uploads(&d.srv);
    write_prng_file(&d.local.join("big.bin"), 12 * MIB, 6);
    let url = format!("ftp://127.0.0.1:{}/", server.port);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["shell", "-p", "1", url.as_str()])
        .current_dir(&d.local)
        .env("HOME", &d.local)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn xftp shell");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"put big.bin\nls\n")
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let signalled = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    let out = child.wait_with_output().expect("wait for xftp shell");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(signalled, "{err}");
    assert!(err.contains("stopping the upload"), "{err}");
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(!d.srv.join("big.bin").exists(), "a prefix was left: {err}");
}

/// A file replaced (renamed over) while its ranges come over several
/// sessions: some ranges are of each version, so the download fails and
/// nothing is put in place (it passed as whole, two versions spliced).
#[test]
fn a_file_replaced_during_a_ranged_download_is_refused() {
    if !have_pyftpdlib("a_file_replaced_during_a_ranged_download_is_refused") {
        return;
    }
    let d = dirs();
    let server = pyftpd_throttled(&d.srv, "write_limit");
    write_prng_file(&d.srv.join("g.bin"), 16 * MIB, 7);
    let url = format!("ftp://127.0.0.1:{}/g.bin", server.port);
    let child = support::spawn_xftp(&["get", "-p", "4", &url, "g.bin"], &d.local);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    write_prng_file(&d.srv.join(".new"), 16 * MIB, 8);
    // A different time too, as a new file written a second later has.
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(d.srv.join(".new"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    std::fs::rename(d.srv.join(".new"), d.srv.join("g.bin")).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("changed on the server during the download"),
        "{err}"
    );
    assert!(!d.local.join("g.bin").exists(), "{err}");
}

/// pyftpdlib whose uploads of names starting `fail` run out of space
/// after 1 MB (ENOSPC from its file's write: a 451 or 552 reply).
fn pyftpd_disk_full_for_fail(dir: &Path) -> Pyftpd {
    let script = r#"
import errno, logging, os, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer
from pyftpdlib.filesystems import AbstractedFS
logging.basicConfig(level=logging.INFO)
class Full:
    def __init__(self, f): self._f = f; self.n = 0
    def write(self, b):
        if self.n + len(b) > 1000000:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.n += len(b); return self._f.write(b)
    def __getattr__(self, a): return getattr(self._f, a)
class FS(AbstractedFS):
    def open(self, filename, mode):
        f = super().open(filename, mode)
        if ('w' in mode or 'a' in mode) and os.path.basename(filename).startswith('fail'):
            return Full(f)
        return f
auth = DummyAuthorizer()
auth.add_anonymous(sys.argv[1], perm="elradfmwMT")
FTPHandler.authorizer = auth
FTPHandler.abstracted_fs = FS
FTPServer(("127.0.0.1", 0), FTPHandler).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c").arg(script).arg(dir);
    spawn_logging_server(cmd)
}

/// A stock server that refuses an upload once its data is all sent (a
/// disk full after the socket buffers took a small file): what it wrote
/// under the file's name is deleted, in a tree as for one file, and the
/// files that went are whole.
#[test]
fn uploads_refused_after_their_data_leave_no_prefix_on_a_stock_server() {
    if !have_pyftpdlib("uploads_refused_after_their_data_leave_no_prefix_on_a_stock_server") {
        return;
    }
    let d = dirs();
    let server = pyftpd_disk_full_for_fail(&d.srv);
    let tree = d.local.join("ft");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    write_prng_file(&tree.join("fail_mid.bin"), 3 * MIB, 1);
    write_prng_file(&tree.join("ok_mid.bin"), 3 * MIB, 3);
    write_prng_file(&tree.join("sub/fail_2m.bin"), 2 * MIB, 5);
    let url = format!("ftp://127.0.0.1:{}/ft/", server.port);
    let out = xftp(&["put", "-r", "ft", &url], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!d.srv.join("ft/fail_mid.bin").exists(), "{err}");
    assert!(!d.srv.join("ft/sub/fail_2m.bin").exists(), "{err}");
    assert_eq!(
        std::fs::read(d.srv.join("ft/ok_mid.bin")).unwrap(),
        std::fs::read(tree.join("ok_mid.bin")).unwrap()
    );
    let url = format!("ftp://127.0.0.1:{}/fail_one.bin", server.port);
    let out = xftp(&["put", "ft/fail_mid.bin", &url], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!d.srv.join("fail_one.bin").exists(), "{err}");
}

/// pyftpdlib offers the `unix.mode` fact without sending it: `get -r`
/// asks for it (OPTS MLST), and the copies keep their permission bits.
#[test]
fn get_r_keeps_modes_from_a_server_that_offers_them_unasked() {
    if !have_pyftpdlib("get_r_keeps_modes_from_a_server_that_offers_them_unasked") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    std::fs::create_dir_all(d.srv.join("m")).unwrap();
    for (name, mode) in [("run", 0o755), ("private", 0o640)] {
        std::fs::write(d.srv.join("m").join(name), name).unwrap();
        std::fs::set_permissions(
            d.srv.join("m").join(name),
            std::fs::Permissions::from_mode(mode),
        )
        .unwrap();
    }
    let server = pyftpd(&d.srv);
    let url = format!("ftp://127.0.0.1:{}/m/", server.port);
    assert_ok(&xftp(&["get", "-r", &url, "m"], &d.local), "get -r");
    for (name, mode) in [("run", 0o755), ("private", 0o640)] {
        let m = std::fs::metadata(d.local.join("m").join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, mode, "{name}");
    }
}

/// `-r --verify` against a server without checksums is refused once,
/// before anything moves: no directory made on either side.
#[test]
fn a_tree_with_verify_is_refused_before_anything_moves_without_checksums() {
    if !have_pyftpdlib("a_tree_with_verify_is_refused_before_anything_moves_without_checksums") {
        return;
    }
    let d = dirs();
    std::fs::create_dir_all(d.srv.join("t/sub")).unwrap();
    std::fs::write(d.srv.join("t/sub/a"), b"a").unwrap();
    std::fs::write(d.srv.join("t/b"), b"b").unwrap();
    let server = pyftpd(&d.srv);
    let url = format!("ftp://127.0.0.1:{}/t/", server.port);
    let out = xftp(&["get", "-r", "--verify", &url, "copy"], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("--verify:").count(), 1, "{err}");
    assert!(!d.local.join("copy").exists(), "{err}");
    std::fs::create_dir_all(d.local.join("up/sub")).unwrap();
    std::fs::write(d.local.join("up/sub/c"), b"c").unwrap();
    let url = format!("ftp://127.0.0.1:{}/up/", server.port);
    let out = xftp(&["put", "-r", "--verify", "up", &url], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!d.srv.join("up").exists(), "{err}");
}

/// A stock server that stops answering (SIGSTOP) during a ranged
/// download: the sessions find the stall, wait a moment (not another
/// whole --timeout) for the server to answer their ABOR, take no other
/// range, and the error names the stall, not a reply timeout.
#[test]
fn a_server_that_stops_during_a_ranged_download_is_reported_as_the_stall() {
    if !have_pyftpdlib("a_server_that_stops_during_a_ranged_download_is_reported_as_the_stall") {
        return;
    }
    let d = dirs();
    let server = pyftpd_throttled(&d.srv, "write_limit");
    write_prng_file(&d.srv.join("s.bin"), 64 * MIB, 9);
    let url = format!("ftp://127.0.0.1:{}/s.bin", server.port);
    let child = support::spawn_xftp(
        &["get", "-p", "4", "--timeout", "3", &url, "s.bin"],
        &d.local,
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = server.child.id().to_string();
    let stopped = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(stopped.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("no data moved"), "{err}");
    assert!(!d.local.join("s.bin").exists(), "{err}");
}

/// A file rewritten in place (same size) while one stream downloads it:
/// the copy would hold the old start and the new end; the time the
/// server gives before and after tells, and nothing is put in place.
#[test]
fn a_file_rewritten_in_place_during_a_one_stream_download_is_refused() {
    if !have_pyftpdlib("a_file_rewritten_in_place_during_a_one_stream_download_is_refused") {
        return;
    }
    let d = dirs();
    let server = pyftpd_throttled(&d.srv, "write_limit");
    write_prng_file(&d.srv.join("g.bin"), 8 * MIB, 7);
    let url = format!("ftp://127.0.0.1:{}/g.bin", server.port);
    let child = support::spawn_xftp(&["get", "-p", "1", &url, "g.bin"], &d.local);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::File::options()
            .write(true)
            .open(d.srv.join("g.bin"))
            .unwrap();
        f.seek(std::io::SeekFrom::Start(7 * MIB)).unwrap();
        f.write_all(&vec![0x5a; MIB as usize]).unwrap();
        // A time of another second, as a write a second later leaves.
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("changed on the server during the download"),
        "{err}"
    );
    assert!(!d.local.join("g.bin").exists(), "{err}");
}

/// `ftp://anonymous@host/` names the anonymous login, which needs no
/// password (none is asked for, as with no user at all).
#[test]
fn an_anonymous_user_in_the_url_needs_no_password() {
    if !have_pyftpdlib("an_anonymous_user_in_the_url_needs_no_password") {
        return;
    }
    let d = dirs();
    std::fs::write(d.srv.join("a.txt"), b"hello").unwrap();
    let server = pyftpd(&d.srv);
    let url = format!("ftp://anonymous@127.0.0.1:{}/a.txt", server.port);
    let out = xftp(&["get", "-q", &url, "a.txt"], &d.local);
    assert_ok(&out, "get as anonymous@");
    assert_eq!(std::fs::read(d.local.join("a.txt")).unwrap(), b"hello");
}
