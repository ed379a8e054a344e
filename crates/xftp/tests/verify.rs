//! End-to-end verification: the server's CKSM and HASH against values
//! computed by Python's hashlib and zlib, `xftp get/put --verify` in
//! every direction and stream count, a lying server (the copy is not
//! kept), a server without checksums (refused before anything moves),
//! globus-url-copy `-verify-checksum` against `xftp serve`, and the
//! progress output (`--json-progress`, nothing on a pipe, a bar on a
//! terminal).

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;
use support::{
    have_pyftpdlib, serve, sha256_file, spawn_logging_server, write_prng_file, Ctl, Pyftpd, PYTHON,
};

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .env_remove("XFTP_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .expect("run xftp")
}

fn last_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {text:?}: {e}"))
}

/// Python's own values for a file: hashlib and zlib, no code of ours.
fn python_digests(path: &Path, offset: u64, len: Option<u64>) -> serde_json::Value {
    let script = r#"
import hashlib, json, sys, zlib
d = open(sys.argv[1], 'rb').read()
off = int(sys.argv[2]); n = int(sys.argv[3])
d = d[off:] if n < 0 else d[off:off + n]
print(json.dumps({
    "MD5": hashlib.md5(d).hexdigest(), "SHA1": hashlib.sha1(d).hexdigest(),
    "SHA256": hashlib.sha256(d).hexdigest(), "SHA512": hashlib.sha512(d).hexdigest(),
    "ADLER32": format(zlib.adler32(d), "08x"), "CRC32": format(zlib.crc32(d), "08x"),
}))
"#;
    let out = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .arg(path)
        .arg(offset.to_string())
        .arg(len.map_or(-1, |n| n as i64).to_string())
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cksm_and_hash_agree_with_python() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    write_prng_file(&root.join("data.bin"), 3_000_017, 11);
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("a name with spaces"), b"123456789").unwrap();
    let srv = serve(&root, &[]);
    let mut c = Ctl::login(srv.port);

    let feat = c.cmd("FEAT");
    assert!(feat.contains(" CKSM ") && feat.contains("SHA256"), "{feat}");
    assert!(
        feat.contains(" HASH ") && feat.contains("SHA-256*"),
        "{feat}"
    );

    for (file, off, len) in [
        ("data.bin", 0u64, None),
        ("data.bin", 100, Some(1000u64)),
        ("data.bin", 2_999_999, None),
        ("data.bin", 0, Some(1 << 40)),
        ("empty", 0, None),
    ] {
        let want = python_digests(&root.join(file), off, len);
        for alg in ["MD5", "SHA1", "SHA256", "SHA512", "ADLER32", "CRC32"] {
            let l = len.map_or("-1".to_string(), |n| n.to_string());
            let r = c.cmd(&format!("CKSM {alg} {off} {l} /{file}"));
            assert_eq!(
                r.trim(),
                format!("213 {}", want[alg].as_str().unwrap()),
                "CKSM {alg} {off} {l} {file}"
            );
        }
    }
    // Lower-case names and names with spaces; CRC32C by its RFC 3720 vector.
    assert_eq!(
        c.cmd("CKSM crc32c 0 -1 a name with spaces").trim(),
        "213 e3069283"
    );
    assert_eq!(
        c.cmd("CKSM sha256 0 -1 a name with spaces").trim(),
        "213 15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225"
    );

    // HASH: the default algorithm, then another one.
    let want = python_digests(&root.join("data.bin"), 0, None);
    let r = c.cmd("HASH data.bin");
    assert_eq!(
        r.trim(),
        format!(
            "213 SHA-256 0-3000016 {} data.bin",
            want["SHA256"].as_str().unwrap()
        )
    );
    assert!(c.cmd("OPTS HASH SHA-512").starts_with("200 SHA-512"));
    assert!(c.cmd("FEAT").contains("SHA-512*"));
    let r = c.cmd("HASH data.bin");
    assert!(r.contains(want["SHA512"].as_str().unwrap()), "{r}");
    assert!(c.cmd("OPTS HASH").starts_with("200 SHA-512"));
    assert!(c.cmd("OPTS HASH TIGER").starts_with("504"));

    // Bad input: clear codes, and nothing outside the root.
    for (cmd, code) in [
        ("CKSM WHIRLPOOL 0 -1 data.bin", "504"),
        ("CKSM MD5 3000018 -1 data.bin", "501"),
        ("CKSM MD5 0 -1 missing", "550"),
        ("CKSM MD5 0 -1 sub", "550"),
        ("CKSM MD5 0 -1 ../../../../etc/passwd", "550"),
        ("CKSM MD5 x -1 data.bin", "501"),
        ("CKSM MD5 0", "501"),
        ("HASH missing", "550"),
    ] {
        let r = c.cmd(cmd);
        assert!(r.starts_with(code), "{cmd}: {r}");
    }
    assert!(c.cmd("NOOP").starts_with("200"), "the session goes on");
}

#[test]
fn one_stream_hashes_as_the_bytes_pass() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    write_prng_file(&root.join("s.bin"), 3_000_000 + 1, 12);
    write_prng_file(&dir.path().join("u.bin"), 2_000_000 + 3, 13);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    for (p, how) in [("1", "as the bytes passed"), ("4", "from the file")] {
        let out = xftp(
            &[
                "-v",
                "get",
                "-p",
                p,
                "--verify",
                &format!("{base}/s.bin"),
                &format!("s{p}.bin"),
            ],
            dir.path(),
        );
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(how), "get -p {p}: {err}");
        let out = xftp(
            &[
                "-v",
                "put",
                "-p",
                p,
                "--verify",
                "u.bin",
                &format!("{base}/u{p}.bin"),
            ],
            dir.path(),
        );
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(how), "put -p {p}: {err}");
        assert_eq!(
            sha256_file(&root.join(format!("u{p}.bin"))),
            sha256_file(&dir.path().join("u.bin"))
        );
        assert_eq!(
            sha256_file(&dir.path().join(format!("s{p}.bin"))),
            sha256_file(&root.join("s.bin"))
        );
    }
}

#[test]
fn get_and_put_verify_in_every_form() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&root.join("src.bin"), 5_000_000 + 333, 5);
    write_prng_file(&local.join("up.bin"), 4_000_000 + 17, 6);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    for (p, alg, extra) in [
        ("1", None, None),
        ("4", Some("md5"), None),
        ("8", Some("adler32"), Some("--active")),
        ("3", Some("crc32c"), Some("--mprt")),
        ("auto", Some("sha512"), None),
    ] {
        let verify = match alg {
            Some(a) => format!("--verify={a}"),
            None => "--verify".to_string(),
        };
        let mut args = vec!["get", "-p", p, &verify, "--json"];
        args.extend(extra);
        let src = format!("{base}/src.bin");
        let out_name = format!("got-{p}.bin");
        args.push(&src);
        args.push(&out_name);
        let out = xftp(&args, &local);
        assert!(out.status.success(), "get {args:?}: {out:?}");
        let j = last_json(&out);
        let want_alg = alg.unwrap_or("sha256").to_ascii_uppercase();
        assert_eq!(j["checksum_algorithm"], want_alg.as_str(), "{j}");
        assert_eq!(
            sha256_file(&local.join(&out_name)),
            sha256_file(&root.join("src.bin"))
        );
        let dst = format!("{base}/up-{p}.bin");
        let mut args = vec!["put", "-p", p, &verify, "--json"];
        args.extend(extra);
        args.push("up.bin");
        args.push(&dst);
        let out = xftp(&args, &local);
        assert!(out.status.success(), "put {args:?}: {out:?}");
        let j = last_json(&out);
        assert_eq!(j["checksum_algorithm"], want_alg.as_str(), "{j}");
        assert_eq!(
            sha256_file(&root.join(format!("up-{p}.bin"))),
            sha256_file(&local.join("up.bin"))
        );
    }
    // No temporary is left on either side.
    for d in [&root, &local] {
        for e in std::fs::read_dir(d).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!name.contains("xftp-part"), "left behind: {name}");
        }
    }
}

/// pyftpdlib with CKSM and HASH added by a handler: honest, or lying.
fn pyftpd_with_checksums(dir: &Path, lie: bool) -> Pyftpd {
    let script = r#"
import hashlib, logging, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler, proto_cmds
from pyftpdlib.servers import FTPServer
logging.basicConfig(level=logging.INFO)
LIE = sys.argv[2] == "lie"
proto_cmds["CKSM"] = dict(perm=None, auth=True, arg=True, help="CKSM alg off len path")
proto_cmds["HASH"] = dict(perm=None, auth=True, arg=True, help="HASH path")
class H(FTPHandler):
    proto_cmds = proto_cmds
    def ftp_FEAT(self, line):
        self.push("211-Features:\r\n SIZE\r\n HASH SHA-256*;MD5\r\n" +
                  ("" if not LIE else " CKSM SHA256\r\n") + "211 End\r\n")
    def digest(self, path):
        real = self.fs.ftp2fs(path if path.startswith("/") else "/" + path)
        with open(real, "rb") as f:
            d = f.read()
        h = hashlib.sha256(d).hexdigest()
        if LIE:
            h = ("0" if h[0] != "0" else "1") + h[1:]
        return h, len(d)
    def ftp_CKSM(self, line):
        self.respond("213 " + self.digest(line.split(" ", 3)[3])[0])
    def ftp_HASH(self, line):
        h, n = self.digest(line)
        self.respond("213 SHA-256 0-%d %s %s" % (max(n - 1, 0), h, line))
    def ftp_OPTS(self, line):
        if line.upper().startswith("HASH"):
            self.respond("200 SHA-256")
        else:
            FTPHandler.ftp_OPTS(self, line)
auth = DummyAuthorizer()
auth.add_anonymous(sys.argv[1], perm="elradfmwMT")
H.authorizer = auth
FTPServer(("127.0.0.1", 0), H).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-c")
        .arg(script)
        .arg(dir)
        .arg(if lie { "lie" } else { "honest" });
    spawn_logging_server(cmd)
}

fn no_temporaries(d: &Path) {
    for e in std::fs::read_dir(d).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains("xftp-part"),
            "left behind in {}: {name}",
            d.display()
        );
    }
}

#[test]
fn hash_on_a_stock_server_and_a_lying_server() {
    if !have_pyftpdlib("hash_on_a_stock_server_and_a_lying_server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&root.join("f.bin"), 1_000_003, 9);
    write_prng_file(&local.join("u.bin"), 700_001, 10);

    // Honest HASH only (no CKSM): the client goes by HASH.
    let honest = pyftpd_with_checksums(&root, false);
    let base = format!("ftp://127.0.0.1:{}", honest.port);
    let out = xftp(
        &[
            "get",
            "--verify",
            "--json",
            &format!("{base}/f.bin"),
            "ok.bin",
        ],
        &local,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(last_json(&out)["checksum_algorithm"], "SHA256");
    assert_eq!(
        sha256_file(&local.join("ok.bin")),
        sha256_file(&root.join("f.bin"))
    );
    let out = xftp(
        &[
            "put",
            "--verify",
            "--json",
            "u.bin",
            &format!("{base}/u.bin"),
        ],
        &local,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&root.join("u.bin")),
        sha256_file(&local.join("u.bin"))
    );
    drop(honest);

    // A server whose checksums are wrong: the download is not kept, the
    // upload is deleted, both fail loudly.
    let liar = pyftpd_with_checksums(&root, true);
    let base = format!("ftp://127.0.0.1:{}", liar.port);
    let out = xftp(
        &["get", "--verify", &format!("{base}/f.bin"), "bad.bin"],
        &local,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checksum mismatch") && err.contains("not kept"),
        "{err}"
    );
    assert!(!local.join("bad.bin").exists());
    no_temporaries(&local);
    let out = xftp(
        &["put", "--verify", "u.bin", &format!("{base}/u2.bin")],
        &local,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!root.join("u2.bin").exists());
    no_temporaries(&root);
    // An algorithm the server does not offer is refused before anything moves.
    let out = xftp(
        &[
            "get",
            "--verify=crc32c",
            &format!("{base}/f.bin"),
            "never.bin",
        ],
        &local,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not offer it"), "{err}");
    assert!(!local.join("never.bin").exists());
}

#[test]
fn a_server_without_checksums_is_refused_before_the_transfer() {
    if !have_pyftpdlib("a_server_without_checksums_is_refused_before_the_transfer") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_prng_file(&dir.path().join("f.bin"), 10_000, 1);
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-m", "pyftpdlib", "-i", "127.0.0.1", "-p", "0", "-d"])
        .arg(dir.path());
    let srv = spawn_logging_server(cmd);
    let local = tempfile::tempdir().unwrap();
    let out = xftp(
        &[
            "get",
            "--verify",
            &format!("ftp://127.0.0.1:{}/f.bin", srv.port),
            "f.bin",
        ],
        local.path(),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no checksum command") && err.contains("drop --verify"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
}

#[test]
fn globus_url_copy_verifies_against_xftp_serve() {
    let have = Command::new("globus-url-copy")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !have {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("globus-url-copy missing and XFTP_REQUIRE_PEERS=1");
        }
        eprintln!("SKIP globus_url_copy_verifies_against_xftp_serve: globus-url-copy is not installed (apt-get install globus-gass-copy-progs)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    write_prng_file(&root.join("g.bin"), 2_000_000 + 5, 21);
    write_prng_file(&dir.path().join("up.bin"), 1_500_000 + 7, 22);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let dst = dir.path().join("g.copy");
    for (src, dst, check) in [
        (
            format!("{base}/g.bin"),
            format!("file://{}", dst.display()),
            (root.join("g.bin"), dst.clone()),
        ),
        (
            format!("file://{}", dir.path().join("up.bin").display()),
            format!("{base}/up.bin"),
            (dir.path().join("up.bin"), root.join("up.bin")),
        ),
    ] {
        // globus-url-copy hashes the local side with OpenSSL: no Adler-32 there.
        for algo in ["MD5", "SHA1", "SHA256"] {
            let _ = std::fs::remove_file(&check.1);
            let out = Command::new("globus-url-copy")
                .args(["-verify-checksum", "-algo", algo, "-p", "4"])
                .arg(&src)
                .arg(&dst)
                .output()
                .expect("run globus-url-copy");
            assert!(
                out.status.success(),
                "globus-url-copy -verify-checksum -algo {algo} {src} {dst}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(sha256_file(&check.0), sha256_file(&check.1));
        }
    }
}

#[test]
fn progress_as_json_lines_and_nothing_on_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    write_prng_file(&root.join("p.bin"), 8_000_000, 3);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/p.bin", srv.port);
    let out = xftp(
        &["get", "-p", "4", "--json-progress", "--json", &url, "a.bin"],
        dir.path(),
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(lines.len() >= 2, "{text}");
    let progress: Vec<_> = lines.iter().filter(|v| v["type"] == "progress").collect();
    assert!(!progress.is_empty(), "{text}");
    let last = progress.last().unwrap();
    assert_eq!(last["total"], 8_000_000u64, "{last}");
    assert_eq!(last["bytes"], 8_000_000u64, "{last}");
    assert_eq!(lines.last().unwrap()["status"], "ok");
    // Byte counts never go down.
    let b: Vec<u64> = progress
        .iter()
        .map(|v| v["bytes"].as_u64().unwrap())
        .collect();
    assert!(b.windows(2).all(|w| w[0] <= w[1]), "{b:?}");

    // An upload that goes to a temporary name first (--verify, -c) is
    // shown under the name the user gave, not `.NAME.xftp-part`.
    for extra in ["--verify", "-c"] {
        let url = format!("ftp://127.0.0.1:{}/up.bin", srv.port);
        let out = xftp(
            &["put", extra, "--json-progress", "--json", "a.bin", &url],
            dir.path(),
        );
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"path\":\"up.bin\""), "{extra}: {text}");
        assert!(!text.contains("xftp-part"), "{extra}: {text}");
    }

    // On a pipe: the summary line only, no bar, no escape sequences.
    let out = xftp(&["get", "-p", "2", &url, "b.bin"], dir.path());
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");
    // --quiet: nothing at all.
    let out = xftp(&["get", "-q", &url, "c.bin"], dir.path());
    assert!(out.status.success());
    assert!(out.stderr.is_empty() && out.stdout.is_empty(), "{out:?}");
}

#[test]
fn a_bar_on_a_terminal() {
    // script(1) gives the command a pseudo-terminal and copies what it
    // draws to stdout.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIP a_bar_on_a_terminal: script(1) is missing (apt-get install bsdutils)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    write_prng_file(&root.join("t.bin"), 30_000_000, 4);
    // Slow enough to draw: one stream, a small buffer.
    let srv = serve(&root, &[]);
    let cmd = format!(
        "{} get -p 2 ftp://127.0.0.1:{}/t.bin t.bin",
        env!("CARGO_BIN_EXE_xftp"),
        srv.port
    );
    let out = Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .current_dir(dir.path())
        .env("TERM", "xterm")
        .env("COLUMNS", "120")
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("xftp get: 30000000 bytes"), "{shown:?}");
    assert!(
        shown.contains("streams") || shown.contains("stream "),
        "no progress bar drawn: {shown:?}"
    );
    assert_eq!(
        sha256_file(&dir.path().join("t.bin")),
        sha256_file(&root.join("t.bin"))
    );
}
