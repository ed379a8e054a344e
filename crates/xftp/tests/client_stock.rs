//! Interop: the xftp client against ProFTPD and Pure-FTPd, two more FTP
//! servers that ship with Debian and that no one here wrote. Neither has
//! MULT or MODE E, so `-p N` is ranged sessions (REST + RETR, cut at the
//! range's end); ProFTPD lists HASH (mod_digest), so `--verify` checks
//! the copy against its checksum, and MLSD, MFMT and SITE CHMOD, so trees
//! keep their times and modes both ways; Pure-FTPd answers a cut RETR
//! with one more 1xx line and no final reply, which a ranged session must
//! get past. Both do TLS.
//!
//! Their Debian packages conflict with vsftpd's (each is the system's FTP
//! server), so scripts/test-all does not install them: it unpacks them
//! (`apt-get download`, `dpkg-deb -x`) under target/peers/root, named by
//! XFTP_STOCK_ROOT, and the servers run from there on loopback. Skips
//! with a message without them or root; fails instead when
//! XFTP_REQUIRE_PEERS=1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod support;
use support::{
    assert_same_tree, chown_ftp, free_port, make_odd_tree, ok, s, sha256_file, wait_listening,
    write_prng_file, xftp_in,
};

/// Where the servers were unpacked.
fn stock_root() -> PathBuf {
    std::env::var_os("XFTP_STOCK_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/root"))
}

/// The unpacked binary `rel`, if it is there and we are root (both
/// servers switch to the `ftp` user).
fn have(test: &str, rel: &str) -> Option<PathBuf> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let bin = stock_root().join(rel);
    let why = if !root {
        "the stock servers switch to the ftp user, which needs root".to_string()
    } else if !bin.exists() {
        format!(
            "{} is missing (scripts/test-all unpacks it there as root; or set XFTP_STOCK_ROOT)",
            bin.display()
        )
    } else {
        return Some(bin);
    };
    if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{test}: {why} and XFTP_REQUIRE_PEERS=1");
    }
    eprintln!("SKIP {test}: {why}");
    None
}

/// A server process, ended by PID when dropped, with its scratch files.
struct Daemon {
    child: Child,
    port: u16,
    _conf: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(mut cmd: Command, port: u16, conf: tempfile::TempDir, what: &str) -> Daemon {
    let log = std::fs::File::create(conf.path().join("stderr.log")).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut d = Daemon {
        child,
        port,
        _conf: conf,
    };
    let log = d._conf.path().join("stderr.log");
    wait_listening(&mut d.child, port, what, || {
        format!("{:?}", std::fs::read_to_string(&log))
    });
    d
}

/// ProFTPD on 127.0.0.1 serving `root` to anonymous users (uploads into
/// `root/pub`), with mod_digest for HASH; with `tls` (certificate and key
/// files), mod_tls requiring TLS on logins and data, and its default check
/// that every data connection resumes the control connection's session.
fn proftpd(bin: &Path, root: &Path, tls: Option<(&Path, &Path)>) -> Daemon {
    let conf = tempfile::tempdir().unwrap();
    let port = free_port();
    let c = conf.path();
    let tls = match tls {
        None => String::new(),
        Some((cert, key)) => format!(
            "LoadModule mod_tls.c\nTLSEngine on\nTLSRequired on\n\
             TLSProtocol TLSv1.2 TLSv1.3\nTLSRSACertificateFile {}\n\
             TLSRSACertificateKeyFile {}\nTLSLog {}/tls.log\n",
            cert.display(),
            key.display(),
            c.display()
        ),
    };
    let text = format!(
        "ServerType standalone\nDefaultServer on\nPort {port}\nDefaultAddress 127.0.0.1\n\
         SocketBindTight on\nUseIPv6 off\nUser nobody\nGroup nogroup\n\
         PidFile {c}/proftpd.pid\nScoreboardFile {c}/scoreboard\nDelayTable none\n\
         WtmpLog off\nUseReverseDNS off\nTransferLog none\nSystemLog {c}/system.log\n\
         ModulePath {modules}\nLoadModule mod_digest.c\n{tls}\
         <Anonymous {root}>\n  User ftp\n  Group nogroup\n  UserAlias anonymous ftp\n\
         RequireValidShell off\n  AllowOverwrite on\n  <Directory pub>\n    <Limit WRITE SITE_CHMOD>\n\
         AllowAll\n    </Limit>\n  </Directory>\n</Anonymous>\n",
        c = c.display(),
        modules = stock_root().join("usr/lib/proftpd").display(),
        root = root.display(),
    );
    let path = c.join("proftpd.conf");
    std::fs::write(&path, text).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-n").arg("-c").arg(&path);
    start(cmd, port, conf, "proftpd")
}

/// Pure-FTPd on 127.0.0.1 with one virtual user, `bob` (password
/// `secret`), chrooted to `root` as the `ftp` user; TLS allowed with
/// `tls` (a PEM file with the key and the certificate).
fn pureftpd(bin: &Path, root: &Path, tls: Option<&Path>) -> Daemon {
    let conf = tempfile::tempdir().unwrap();
    let port = free_port();
    let id = |flag: &str| {
        let o = Command::new("id").args([flag, "ftp"]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // SHA-512 crypt of "secret" with the salt "xftptest" (`openssl passwd
    // -6 -salt xftptest secret`): pure-pw would hash with argon2id at a
    // cost of 3 s per login.
    let hash = "$6$xftptest$tdx6kyqLhGVoH8GzMDOn7UqRwbsMrrZ6Ub/hH0a/Go0KgE3GVdwaiwUChp0gjIvMyffca8DeVaibjOzlVvgGf.";
    let passwd = conf.path().join("pureftpd.passwd");
    std::fs::write(
        &passwd,
        format!(
            "bob:{hash}:{}:{}::{}/./::::::::::::\n",
            id("-u"),
            id("-g"),
            root.display()
        ),
    )
    .unwrap();
    let pdb = conf.path().join("pureftpd.pdb");
    let st = Command::new(stock_root().join("usr/bin/pure-pw"))
        .arg("mkdb")
        .arg(&pdb)
        .arg("-f")
        .arg(&passwd)
        .status()
        .expect("run pure-pw");
    assert!(st.success(), "pure-pw mkdb");
    let mut cmd = Command::new(bin);
    cmd.arg("-S")
        .arg(format!("127.0.0.1,{port}"))
        .arg("-l")
        .arg(format!("puredb:{}", pdb.display()))
        .args(["-E", "-A", "-H", "-4"]);
    if let Some(pem) = tls {
        cmd.args(["-Y", "2", "-2"]).arg(pem);
    }
    start(cmd, port, conf, "pure-ftpd")
}

/// A served tree (root's, readable by all) with `pub` the `ftp` user's,
/// and a local directory.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let local = tmp.path().join("local");
    std::fs::create_dir_all(root.join("pub")).unwrap();
    std::fs::create_dir(&local).unwrap();
    for d in [tmp.path(), &root] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    chown_ftp(&root.join("pub"));
    (tmp, root, local)
}

#[test]
fn proftpd_ranges_hash_checks_trees_and_tls() {
    let test = "proftpd_ranges_hash_checks_trees_and_tls";
    let Some(bin) = have(test, "usr/sbin/proftpd") else {
        return;
    };
    let (_tmp, root, local) = dirs();
    let server = proftpd(&bin, &root, None);
    let base = format!("ftp://127.0.0.1:{}/pub", server.port);
    let src = local.join("src");
    let len = (7 << 20) + 12_345;
    write_prng_file(&src, len, 41);
    // Up and down, each checked end to end against the server's HASH.
    let out = ok(
        xftp_in(&["put", "--verify", s(&src), &format!("{base}/f")], &local),
        "put --verify",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("verified"), "{err}");
    assert_eq!(sha256_file(&root.join("pub/f")), sha256_file(&src));
    let got = local.join("got");
    let out = ok(
        xftp_in(
            &["get", "-p", "4", "--verify", &format!("{base}/f"), s(&got)],
            &local,
        ),
        "get -p 4 --verify",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("4 sessions, each fetching byte ranges (REST)") && err.contains("verified"),
        "{err}"
    );
    assert_eq!(sha256_file(&got), sha256_file(&src));
    // -q: nothing on stderr, not even the notice of the refused MULT.
    let quiet = local.join("quiet");
    let out = ok(
        xftp_in(&["get", "-q", &format!("{base}/f"), s(&quiet)], &local),
        "get -q",
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(sha256_file(&quiet), sha256_file(&src));
    // A tree up (MFMT and SITE CHMOD set times and modes) and down again
    // (MLSD gives them): the same bytes and modes at the end.
    let tree = local.join("tree");
    make_odd_tree(&tree);
    ok(
        xftp_in(&["put", "-r", s(&tree), &format!("{base}/up/")], &local),
        "put -r",
    );
    assert_same_tree(&tree, &root.join("pub/up"));
    let back = local.join("back");
    let out = ok(
        xftp_in(&["get", "-r", &format!("{base}/up/"), s(&back)], &local),
        "get -r",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("7 files"));
    assert_same_tree(&tree, &back);
    // (To the second: MFMT and MLSD's times are whole seconds here.)
    let mtime = |p: &Path| {
        let t = std::fs::metadata(p).unwrap().modified().unwrap();
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
    };
    assert_eq!(
        mtime(&tree.join("a/b/c/deep.bin")),
        mtime(&back.join("a/b/c/deep.bin"))
    );
    // The shell after `cd`: its ranged sessions log in at the top and are
    // given the file's absolute path (not one relative to where the shell
    // is, which they are not: 550).
    let big = root.join("pub/big");
    write_prng_file(&big, 48 << 20, 47);
    chown_ftp(&big);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["-vv", "shell", &format!("ftp://127.0.0.1:{}/", server.port)])
        .current_dir(&local)
        .env("HOME", &local)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"cd pub\nmult 3\nget big big-shell\nquit\n")
            .unwrap();
    }
    let out = ok(child.wait_with_output().unwrap(), "shell: cd, mult 3, get");
    assert_eq!(sha256_file(&local.join("big-shell")), sha256_file(&big));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3 sessions, each fetching byte ranges"),
        "{err}"
    );
    assert!(
        err.contains("RETR /pub/big") && !err.contains(" 550 "),
        "{err}"
    );
    drop(server);
    // Under TLS (mod_tls, required): ranged sessions each resume the TLS
    // session of their own control connection, and an upload is checked.
    let pki = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (crt, key) = (pki.path().join("cert.pem"), pki.path().join("key.pem"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let server = proftpd(&bin, &root, Some((&crt, &key)));
    let base = format!("ftp://localhost:{}/pub", server.port);
    let tls = ["--tls", "--cacert", s(&crt)];
    let got = local.join("got-tls");
    let mut args = vec!["get", "-p", "3", "--verify"];
    args.extend(tls);
    let url = format!("{base}/f");
    args.extend([url.as_str(), s(&got)]);
    let out = ok(xftp_in(&args, &local), "get -p 3 --tls");
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 sessions"));
    assert_eq!(sha256_file(&got), sha256_file(&src));
    let mut args = vec!["put", "--verify"];
    args.extend(tls);
    let up = format!("{base}/f-tls");
    args.extend([s(&src), up.as_str()]);
    ok(xftp_in(&args, &local), "put --tls --verify");
    assert_eq!(sha256_file(&root.join("pub/f-tls")), sha256_file(&src));
    let out = xftp_in(&["get", &url, s(&local.join("plain"))], &local);
    assert!(!out.status.success(), "a plain login was let in");
    assert!(!local.join("plain").exists());
}

#[test]
fn pureftpd_ranges_past_its_cut_replies_and_tls() {
    let test = "pureftpd_ranges_past_its_cut_replies_and_tls";
    let Some(bin) = have(test, "usr/sbin/pure-ftpd") else {
        return;
    };
    let (_tmp, root, local) = dirs();
    let served = root.join("pub/big");
    let len = (9 << 20) + 777;
    write_prng_file(&served, len, 43);
    chown_ftp(&root);
    let want = sha256_file(&served);
    let pki = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, pem) = (pki.path().join("cert.pem"), pki.path().join("both.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(
        &pem,
        format!("{}{}", c.signing_key.serialize_pem(), c.cert.pem()),
    )
    .unwrap();
    let pw = local.join("pw");
    std::fs::write(&pw, "secret\n").unwrap();
    let user = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--password-file", s(&pw)]);
        xftp_in(&a, &local)
    };
    {
        let server = pureftpd(&bin, &root, None);
        let url = format!("ftp://bob@127.0.0.1:{}/pub/big", server.port);
        // Four sessions, each reusing its session for the next range
        // after Pure-FTPd's reply to the cut (a 1xx, then nothing).
        let got = local.join("got");
        let out = ok(user(&["-vv", "get", "-p", "4", &url, s(&got)]), "get -p 4");
        assert_eq!(sha256_file(&got), want);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("resynchronising"), "{err}");
        assert!(!err.contains("timed out"), "{err}");
        // No checksum command: --verify is refused with the reason, and
        // nothing is left behind.
        let nope = local.join("nope");
        let out = user(&["get", "--verify", &url, s(&nope)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("no checksum command"),
            "{err}"
        );
        assert!(!nope.exists());
        // Up, plain.
        let out = ok(
            user(&["put", s(&got), &format!("{url}-up")]),
            "put to pure-ftpd",
        );
        drop(out);
        assert_eq!(sha256_file(&root.join("pub/big-up")), want);
    }
    // TLS required by the server: ranged sessions each under TLS.
    let server = pureftpd(&bin, &root, Some(&pem));
    let url = format!("ftp://bob@localhost:{}/pub/big", server.port);
    let got = local.join("got-tls");
    let out = ok(
        user(&[
            "get",
            "-p",
            "3",
            "--tls",
            "--cacert",
            s(&cert),
            &url,
            s(&got),
        ]),
        "get -p 3 --tls",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 sessions"), "{err}");
    assert_eq!(sha256_file(&got), want);
    let out = user(&["get", &url, s(&local.join("plain"))]);
    assert!(!out.status.success(), "a plain login was let in");
}
