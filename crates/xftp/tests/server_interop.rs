//! `xftp serve` against FTP clients nobody here wrote: curl, lftp and
//! Python's ftplib. Files of 0 B, 1 B, 1 MiB + 7 B and 256 MiB, compared
//! by SHA-256. A missing client is skipped with a notice, unless
//! XFTP_REQUIRE_PEERS=1 (set by .ci/run), which turns it into a failure.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sha2::{Digest, Sha256};

struct Server {
    child: Child,
    port: u16,
    root: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Server {
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root.path())
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("listening on 127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Server { child, port, root }
}

fn have(prog: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("{prog} is required (XFTP_REQUIRE_PEERS=1) but not installed");
        }
        eprintln!("SKIP: {prog} not installed (apt-get install {prog})");
    }
    found
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Deterministic non-repeating content, fast enough for 256 MiB in debug builds.
fn make_file(path: &Path, len: usize, seed: u64) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut left = len;
    let mut buf = Vec::with_capacity(1 << 16);
    while left > 0 {
        buf.clear();
        while buf.len() < (1 << 16) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.extend_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

fn sha(path: &Path) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path).unwrap();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize().to_vec()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const SIZES: [(usize, &str); 4] = [
    (0, "empty"),
    (1, "one"),
    (1024 * 1024 + 7, "mib7"),
    (256 * 1024 * 1024, "big256"),
];

fn sources(dir: &Path) -> Vec<(PathBuf, String, usize)> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, (len, name))| {
            let p = dir.join(name);
            make_file(&p, *len, i as u64 + 1);
            (p, name.to_string(), *len)
        })
        .collect()
}

#[test]
fn curl_download_upload_list_passive_and_active() {
    if !have("curl") {
        return;
    }
    let srv = serve(&["--anonymous-write"]);
    let local = tempfile::tempdir().unwrap();
    for (src, name, len) in sources(srv.root.path()) {
        let big = len > 64 << 20;
        let modes: &[&[&str]] = if big { &[&[]] } else { &[&[], &["-P", "-"]] };
        for mode in modes {
            let url = format!("ftp://127.0.0.1:{}/{name}", srv.port);
            let out = local.path().join(format!("{name}.down"));
            run(Command::new("curl")
                .args(["-s", "-S"])
                .args(*mode)
                .arg("-o")
                .arg(&out)
                .arg(&url));
            assert_eq!(sha(&out), sha(&src), "curl {mode:?} download of {name}");
            let up_url = format!("ftp://127.0.0.1:{}/up-{name}", srv.port);
            run(Command::new("curl")
                .args(["-s", "-S"])
                .args(*mode)
                .arg("-T")
                .arg(&src)
                .arg(&up_url));
            assert_eq!(
                sha(&srv.root.path().join(format!("up-{name}"))),
                sha(&src),
                "curl {mode:?} upload of {name}"
            );
        }
    }
    let out = Command::new("curl")
        .args(["-s", "-S", &format!("ftp://127.0.0.1:{}/", srv.port)])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.lines().any(|l| l.ends_with(" mib7")), "{listing}");
    let out = Command::new("curl")
        .args(["-s", "-S", "-l", &format!("ftp://127.0.0.1:{}/", srv.port)])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(names.lines().any(|l| l == "up-one"), "{names}");
    // A missing file is an error for curl (550), not an empty file.
    let st = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            &format!("ftp://127.0.0.1:{}/missing", srv.port),
        ])
        .status()
        .unwrap();
    assert!(!st.success());
}

#[test]
fn lftp_get_put_ls_mirror_and_pget() {
    if !have("lftp") {
        return;
    }
    let srv = serve(&["--anonymous-write"]);
    let local = tempfile::tempdir().unwrap();
    let srcs = sources(srv.root.path());
    for (src, name, _) in &srcs {
        let script = format!(
            "set cmd:fail-exit yes; set net:max-retries 1; open -p {} 127.0.0.1; lcd {}; get {name} -o {name}.down; put {} -o up-{name}",
            srv.port,
            local.path().display(),
            src.display()
        );
        run(Command::new("lftp").args(["-c", &script]));
        assert_eq!(
            sha(&local.path().join(format!("{name}.down"))),
            sha(src),
            "lftp get {name}"
        );
        assert_eq!(
            sha(&srv.root.path().join(format!("up-{name}"))),
            sha(src),
            "lftp put {name}"
        );
    }
    // pget: byte ranges over 4 connections (REST offsets).
    let script = format!(
        "set cmd:fail-exit yes; open -p {} 127.0.0.1; lcd {}; pget -n 4 mib7 -o pget.out; ls",
        srv.port,
        local.path().display()
    );
    let out = Command::new("lftp").args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha(&local.path().join("pget.out")), sha(&srcs[2].0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("mib7"));
    // mirror a small tree.
    std::fs::create_dir_all(srv.root.path().join("tree/sub")).unwrap();
    std::fs::write(srv.root.path().join("tree/sub/x"), b"x").unwrap();
    let script = format!(
        "set cmd:fail-exit yes; open -p {} 127.0.0.1; lcd {}; mirror tree tree-copy",
        srv.port,
        local.path().display()
    );
    run(Command::new("lftp").args(["-c", &script]));
    assert_eq!(
        std::fs::read(local.path().join("tree-copy/sub/x")).unwrap(),
        b"x"
    );
}

#[test]
fn python_ftplib_passive_and_active() {
    let Some(py) = python_with_ftplib() else {
        return;
    };
    let srv = serve(&["--anonymous-write"]);
    let local = tempfile::tempdir().unwrap();
    let srcs = sources(srv.root.path());
    let script = r#"
import ftplib, hashlib, sys
port, local = int(sys.argv[1]), sys.argv[2]
names = sys.argv[3:]
for pasv in (True, False):
    f = ftplib.FTP()
    f.connect('127.0.0.1', port, timeout=60)
    f.login()
    f.set_pasv(pasv)
    for n in names:
        h = hashlib.sha256()
        f.retrbinary('RETR ' + n, h.update, blocksize=1 << 20)
        print('get', n, h.hexdigest())
        if pasv or n != 'big256':
            with open(local + '/' + n + '.ftplib', 'wb') as out:
                f.retrbinary('RETR ' + n, out.write)
            with open(local + '/' + n + '.ftplib', 'rb') as src:
                f.storbinary('STOR py-' + ('p' if pasv else 'a') + '-' + n, src, blocksize=1 << 20)
    assert 'one' in f.nlst()
    lines = []
    f.retrlines('LIST', lines.append)
    assert any(l.endswith(' mib7') for l in lines), lines
    f.quit()
"#;
    let mut cmd = Command::new(py);
    cmd.arg("-c")
        .arg(script)
        .arg(srv.port.to_string())
        .arg(local.path());
    for (_, n, _) in &srcs {
        cmd.arg(n);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "ftplib: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for (src, name, _) in &srcs {
        let want: String = sha(src).iter().map(|b| format!("{b:02x}")).collect();
        let line = format!("get {name} {want}");
        assert_eq!(
            stdout.lines().filter(|l| *l == line).count(),
            2,
            "ftplib hash of {name}:\n{stdout}"
        );
        assert_eq!(
            sha(&srv.root.path().join(format!("py-p-{name}"))),
            sha(src),
            "ftplib passive upload {name}"
        );
        if name != "big256" {
            assert_eq!(
                sha(&srv.root.path().join(format!("py-a-{name}"))),
                sha(src),
                "ftplib active upload {name}"
            );
        }
    }
}

#[test]
fn curl_with_named_user_and_read_only_anonymous() {
    if !have("curl") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let users = tmp.path().join("users");
    let pwfile = tmp.path().join("pw");
    std::fs::write(&pwfile, "s3cret\n").unwrap();
    run(Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["useradd", "--users"])
        .arg(&users)
        .arg("alice")
        .arg("--password-file")
        .arg(&pwfile));
    // The anonymous names could never log in from the users file.
    for name in ["anonymous", "FTP"] {
        let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
            .args(["useradd", "--users"])
            .arg(&users)
            .arg(name)
            .arg("--password-file")
            .arg(&pwfile)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is the anonymous login"), "{err}");
    }
    let srv = serve(&["--anonymous", "--users", users.to_str().unwrap()]);
    let src = tmp.path().join("f");
    make_file(&src, 1000, 9);
    // alice may write.
    run(Command::new("curl")
        .args(["-s", "-S", "-T"])
        .arg(&src)
        .arg(format!("ftp://alice:s3cret@127.0.0.1:{}/f", srv.port)));
    assert_eq!(sha(&srv.root.path().join("f")), sha(&src));
    // A wrong password fails.
    let st = Command::new("curl")
        .args(["-s", "-T"])
        .arg(&src)
        .arg(format!("ftp://alice:nope@127.0.0.1:{}/g", srv.port))
        .status()
        .unwrap();
    assert!(!st.success());
    // Anonymous is read-only: upload refused, download fine.
    let st = Command::new("curl")
        .args(["-s", "-T"])
        .arg(&src)
        .arg(format!("ftp://127.0.0.1:{}/h", srv.port))
        .status()
        .unwrap();
    assert!(!st.success());
    assert!(!srv.root.path().join("h").exists());
    let out = tmp.path().join("down");
    run(Command::new("curl")
        .args(["-s", "-S", "-o"])
        .arg(&out)
        .arg(format!("ftp://127.0.0.1:{}/f", srv.port)));
    assert_eq!(sha(&out), sha(&src));
}

#[test]
fn globus_url_copy_mode_e_both_directions() {
    // GridFTP's client speaks MODE E with OPTS RETR Parallelism (downloads:
    // the server connects N times to its PORT) and opens as many passive
    // connections as it likes for uploads, announcing the count in EOF.
    if !have("globus-url-copy") {
        return;
    }
    let srv = serve(&["--anonymous-write"]);
    let local = tempfile::tempdir().unwrap();
    for (i, len) in [0usize, 1, 1024 * 1024 + 7, 16 * 1024 * 1024]
        .into_iter()
        .enumerate()
    {
        let src = local.path().join(format!("src{i}"));
        make_file(&src, len, 40 + i as u64);
        for p in ["1", "4"] {
            let up = format!("ftp://127.0.0.1:{}/up{i}-{p}", srv.port);
            run(Command::new("globus-url-copy")
                .args(["-p", p])
                .arg(format!("file://{}", src.display()))
                .arg(&up));
            let stored = srv.root.path().join(format!("up{i}-{p}"));
            assert_eq!(
                sha(&stored),
                sha(&src),
                "globus-url-copy -p {p} upload of {len} B"
            );
            let down = local.path().join(format!("down{i}-{p}"));
            run(Command::new("globus-url-copy")
                .args(["-p", p])
                .arg(&up)
                .arg(format!("file://{}", down.display())));
            assert_eq!(
                sha(&down),
                sha(&src),
                "globus-url-copy -p {p} download of {len} B"
            );
        }
    }
}

/// A tree (several files in one session) up and down with `-p 4`: the
/// connections a GridFTP client left open after a MODE E upload carry
/// the next file, whatever their count (no MULT says it).
#[test]
fn globus_url_copy_trees_with_parallel_streams() {
    if !have("globus-url-copy") {
        return;
    }
    let srv = serve(&["--anonymous-write"]);
    let local = tempfile::tempdir().unwrap();
    let tree = local.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    let mut names = Vec::new();
    for i in 0..4u64 {
        let name = match i {
            0 => "sub/deeper/f0".to_string(),
            1 => "sub/f1".to_string(),
            _ => format!("f{i}"),
        };
        make_file(&tree.join(&name), 300_000 + i as usize * 77_777, 60 + i);
        names.push(name);
    }
    // `-fast` keeps the data connections from one transfer to the next
    // and reads the MLSD listings of the tree in MODE E over them, as
    // globus-gridftp-server sends them (it aborted on an assertion when
    // the listing came in stream mode).
    for (k, flags) in [&["-p", "4"][..], &["-p", "4", "-fast"], &["-fast"]]
        .iter()
        .enumerate()
    {
        run(Command::new("globus-url-copy")
            .args(["-cd", "-r"])
            .args(*flags)
            .arg(format!("file://{}/", tree.display()))
            .arg(format!("ftp://127.0.0.1:{}/up{k}/", srv.port)));
        let back = local.path().join(format!("back{k}"));
        run(Command::new("globus-url-copy")
            .args(["-cd", "-r"])
            .args(*flags)
            .arg(format!("ftp://127.0.0.1:{}/up{k}/", srv.port))
            .arg(format!("file://{}/", back.display())));
        for name in &names {
            let src = sha(&tree.join(name));
            assert_eq!(
                sha(&srv.root.path().join(format!("up{k}")).join(name)),
                src,
                "upload of {name} with {flags:?}"
            );
            assert_eq!(
                sha(&back.join(name)),
                src,
                "download of {name} with {flags:?}"
            );
        }
    }
}

/// ftp(1)'s `mget *.txt` sends `NLST *.txt` and fetches the names that
/// come back: the server matches a last component with wildcards against
/// its directory (`d/*.txt` gives `d/x.txt`); `*` skips dot files; no
/// match is 550.
#[test]
fn nlst_and_list_expand_wildcards_in_the_last_component() {
    let Some(py) = python_with_ftplib() else {
        return;
    };
    let srv = serve(&["--anonymous"]);
    let root = srv.root.path();
    std::fs::create_dir_all(root.join("d")).unwrap();
    for f in ["a.txt", "b.txt", "c.bin", ".h.txt", "d/x.txt", "d/y.dat"] {
        std::fs::write(root.join(f), f).unwrap();
    }
    let script = r#"
import ftplib, sys
f = ftplib.FTP()
f.connect('127.0.0.1', int(sys.argv[1]), timeout=60)
f.login()
assert f.nlst('*.txt') == ['a.txt', 'b.txt'], f.nlst('*.txt')
assert f.nlst('d/*.t?t') == ['d/x.txt'], f.nlst('d/*.t?t')
lines = []
f.retrlines('LIST [ab].*', lines.append)
assert [l.split()[-1] for l in lines] == ['a.txt', 'b.txt'], lines
for pat in ('*.zip', 'nod/*.txt', 'd/*/x'):
    try:
        f.nlst(pat)
        raise SystemExit('no error for ' + pat)
    except ftplib.error_perm as e:
        assert str(e).startswith('550'), e
f.retrbinary('RETR d/x.txt', lambda b: None)
f.quit()
"#;
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(srv.port.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ftplib: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Python with ftplib, or `None` after saying why the test skips (a
/// failure instead under XFTP_REQUIRE_PEERS=1).
fn python_with_ftplib() -> Option<&'static str> {
    let py = python();
    let ok = Command::new(py)
        .arg("-c")
        .arg("import ftplib")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("python3 with ftplib is required");
        }
        eprintln!("SKIP: no python3");
        return None;
    }
    Some(py)
}

/// Run as root, the server warns that file modes do not hold for its
/// logins; run as another user (setpriv, as docs/security.md advises), it
/// does not.
#[test]
fn serving_as_root_is_warned_about() {
    let root = tempfile::tempdir().unwrap();
    let start = |cmd: &mut Command| {
        let mut child = cmd
            .args(["serve", "--anonymous", "--listen", "127.0.0.1:0", "--root"])
            .arg(root.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening on"), "{line}");
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let xftp = env!("CARGO_BIN_EXE_xftp");
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let err = start(&mut Command::new(xftp));
    assert_eq!(err.contains("running as root"), is_root, "{err}");
    if !is_root {
        eprintln!("serving_as_root_is_warned_about: not root, the unprivileged half only");
        return;
    }
    std::fs::set_permissions(
        root.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let err = start(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        xftp,
    ]));
    assert!(!err.contains("running as root"), "{err}");
}

/// Waits far past any use ("never") are taken as a century, not an
/// overflow: `serve --idle-timeout 18446744073709551615` panicked in
/// every session, `get --timeout 1e19` at its first wait.
#[test]
fn absurdly_long_waits_are_taken_as_long_ones() {
    let max = u64::MAX.to_string();
    let mut args = vec!["--anonymous"];
    for f in [
        "--idle-timeout",
        "--data-timeout",
        "--stall-timeout",
        "--login-window",
        "--shutdown-grace",
    ] {
        args.extend([f, max.as_str()]);
    }
    let srv = serve(&args);
    std::fs::write(srv.root.path().join("f"), b"hello").unwrap();
    let work = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{}/f", srv.port);
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .current_dir(work.path())
        .env("XDG_CACHE_HOME", work.path())
        .args([
            "get",
            &url,
            "f",
            "--timeout",
            "1e19",
            "--connect-timeout",
            "1e300",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(std::fs::read(work.path().join("f")).unwrap(), b"hello");
}
