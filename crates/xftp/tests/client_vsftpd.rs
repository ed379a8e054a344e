//! Interop: the xftp client against vsftpd, the FTP server most Linux
//! distributions ship, which has no MLSD, MULT, MODE E or checksums:
//! plain get and put, directory trees read out of LIST, the shell's mget,
//! and TLS under vsftpd's check that every data connection resumes the
//! control connection's TLS session (`require_ssl_reuse`, on by default).
//! Skips with a message without /usr/sbin/vsftpd or root (vsftpd chroots
//! anonymous users); fails instead when XFTP_REQUIRE_PEERS=1.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;
use support::{
    assert_same_tree, chown_ftp, free_port, json, make_odd_tree as make_tree, ok, s, sha256_file,
    wait_listening, write_prng_file, xftp_in as xftp,
};

const VSFTPD: &str = "/usr/sbin/vsftpd";

fn have_vsftpd(test: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let ok = Path::new(VSFTPD).exists() && root;
    if !ok {
        let why = if root {
            "vsftpd is not installed (apt-get install vsftpd)"
        } else {
            "vsftpd's anonymous login needs root (it chroots)"
        };
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("{test}: {why} and XFTP_REQUIRE_PEERS=1");
        }
        eprintln!("SKIP {test}: {why}");
    }
    ok
}

/// vsftpd on 127.0.0.1 serving `root` to anonymous users (uploads into
/// `root/pub`), optionally with TLS; ended by PID when dropped.
struct Vsftpd {
    child: Child,
    port: u16,
    _conf: tempfile::TempDir,
}

impl Drop for Vsftpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vsftpd(root: &Path, tls: Option<(&Path, &Path)>, extra: &str) -> Vsftpd {
    let conf = tempfile::tempdir().unwrap();
    // A directory the session processes chroot into when idle: root's,
    // not writable by anyone else.
    let empty = conf.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let port = free_port();
    let mut text = format!(
        "listen=YES\nlisten_ipv6=NO\nlisten_address=127.0.0.1\nlisten_port={port}\n\
         background=NO\nanonymous_enable=YES\nlocal_enable=NO\nno_anon_password=YES\n\
         anon_root={}\nwrite_enable=YES\nanon_upload_enable=YES\n\
         anon_mkdir_write_enable=YES\nanon_other_write_enable=YES\nanon_umask=022\n\
         pasv_enable=YES\npasv_address=127.0.0.1\nseccomp_sandbox=NO\n\
         secure_chroot_dir={}\nvsftpd_log_file={}\nxferlog_enable=YES\n",
        root.display(),
        empty.display(),
        conf.path().join("vsftpd.log").display(),
    );
    if let Some((cert, key)) = tls {
        text += &format!(
            "ssl_enable=YES\nallow_anon_ssl=YES\nforce_anon_logins_ssl=YES\n\
             force_anon_data_ssl=YES\nrsa_cert_file={}\nrsa_private_key_file={}\n",
            cert.display(),
            key.display()
        );
    }
    text += extra;
    let path = conf.path().join("vsftpd.conf");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let child = Command::new(VSFTPD)
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vsftpd");
    let mut server = Vsftpd {
        child,
        port,
        _conf: conf,
    };
    wait_listening(&mut server.child, port, "vsftpd", || {
        format!("config:\n{text}")
    });
    server
}

/// The served tree: root owned by root (vsftpd refuses a writable chroot),
/// `pub` owned by the `ftp` user for uploads.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    local: PathBuf,
}

fn dirs() -> Dirs {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let local = tmp.path().join("local");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&local).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(root.join("pub")).unwrap();
    chown_ftp(&root.join("pub"));
    Dirs {
        _tmp: tmp,
        root,
        local,
    }
}

#[test]
fn get_and_put_against_vsftpd_without_mult() {
    if !have_vsftpd("get_and_put_against_vsftpd_without_mult") {
        return;
    }
    let d = dirs();
    let server = vsftpd(&d.root, None, "");
    let base = format!("ftp://127.0.0.1:{}/pub", server.port);
    for (i, len) in [0u64, 1, 3 << 20, (7 << 20) + 12_345]
        .into_iter()
        .enumerate()
    {
        let src = d.local.join(format!("src{i}"));
        write_prng_file(&src, len, 0x5eed + i as u64);
        for p in ["auto", "4"] {
            let url = format!("{base}/f{i}-{p}");
            let out = ok(xftp(&["put", "-p", p, s(&src), &url], &d.local), "put");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("does not support MULT"), "{err}");
            let served = d.root.join(format!("pub/f{i}-{p}"));
            assert_eq!(
                sha256_file(&served),
                sha256_file(&src),
                "put {len} B -p {p}"
            );
            let got = d.local.join(format!("got{i}-{p}"));
            let out = ok(xftp(&["get", "-p", p, &url, s(&got)], &d.local), "get");
            assert_eq!(sha256_file(&got), sha256_file(&src), "get {len} B -p {p}");
            // -p 4 on a file of two ranges (MiB) or more: a session a
            // MiB, four at most.
            let err = String::from_utf8_lossy(&out.stderr);
            let ranged = p == "4" && len >= 2 << 20;
            let k = len.div_ceil(1 << 20).min(4);
            assert_eq!(
                err.contains(&format!("{k} sessions, each fetching byte ranges (REST)")),
                ranged,
                "{err}"
            );
        }
    }
    // A missing file: the server's refusal, and no local file left.
    let got = d.local.join("none");
    let out = xftp(&["get", &format!("{base}/missing"), s(&got)], &d.local);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("550"));
    assert!(!got.exists());
    // vsftpd lists a missing path as nothing and 226: ls says it is
    // missing and fails; an empty directory lists as empty and passes.
    let out = xftp(&["ls", &format!("{base}/missing/")], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no such file or directory on the server"),
        "{err}"
    );
    std::fs::create_dir(d.root.join("pub/empty")).unwrap();
    let out = ok(
        xftp(&["ls", &format!("{base}/empty/")], &d.local),
        "ls empty",
    );
    assert!(out.stdout.is_empty());
    // vsftpd reads `LIST -name` as options (and lists the current
    // directory): a name that starts with `-` goes as `./-name`.
    let top = format!("ftp://127.0.0.1:{}", server.port);
    let out = xftp(&["ls", &format!("{top}/-missing/")], &d.local);
    assert!(
        !out.status.success(),
        "{} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn trees_against_vsftpd_are_listed_with_list() {
    if !have_vsftpd("trees_against_vsftpd_are_listed_with_list") {
        return;
    }
    let d = dirs();
    let server = vsftpd(&d.root, None, "");
    let base = format!("ftp://127.0.0.1:{}/pub", server.port);
    // Up: vsftpd has no MFMT or SITE CHMOD, so modes are the server's
    // umask's, and the check below is on the way down.
    let src = d.local.join("src");
    make_tree(&src);
    let out = ok(
        xftp(&["put", "-r", s(&src), &format!("{base}/up/")], &d.local),
        "put -r",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("7 files"), "{err}");
    for f in [
        ".dotfile",
        ".hidden dir/x",
        "a/b/c/deep.bin",
        "Jan 5 12:00 odd",
    ] {
        assert_eq!(
            sha256_file(&d.root.join("pub/up").join(f)),
            sha256_file(&src.join(f)),
            "{f}"
        );
    }
    // Into a directory whose parent is missing: an error, even for an
    // empty tree (nothing was made, so nothing may look done).
    let empty = d.local.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = xftp(
        &["put", "-r", s(&empty), &format!("{base}/no/such/")],
        &d.local,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("MKD"), "{err}");
    // Into the login directory (an empty path, which is there already):
    // vsftpd's anonymous root is not writable, so each subdirectory is
    // refused and listed as failed, and the command fails.
    let one = d.local.join("one");
    std::fs::create_dir_all(one.join("sub")).unwrap();
    let out = xftp(
        &[
            "put",
            "-r",
            s(&one),
            &format!("ftp://127.0.0.1:{}/", server.port),
        ],
        &d.local,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("sub/") && !err.contains("MKD :"),
        "{err}"
    );
    // Down: a tree the server holds, with its modes, read out of LIST.
    let served = d.root.join("pub/tree");
    make_tree(&served);
    chown_ftp(&served);
    let got = d.local.join("got");
    let out = ok(
        xftp(&["get", "-r", &format!("{base}/tree/"), s(&got)], &d.local),
        "get -r",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("7 files"));
    assert_same_tree(&served, &got);
}

/// vsftpd answers LIST of a directory it cannot open with 226 and the
/// directory's own line: read as a listing, an empty tree holding a
/// subdirectory of the same name. The tree must fail instead, naming it,
/// and still copy the rest.
#[test]
fn a_directory_the_server_cannot_read_fails_the_tree() {
    if !have_vsftpd("a_directory_the_server_cannot_read_fails_the_tree") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    let tree = d.root.join("pub/tree");
    std::fs::create_dir_all(tree.join("ok")).unwrap();
    std::fs::create_dir_all(tree.join("locked")).unwrap();
    std::fs::write(tree.join("ok/a"), b"a").unwrap();
    std::fs::write(tree.join("locked/b"), b"b").unwrap();
    // Owned by root, mode 0: the anonymous user (ftp) can neither list
    // nor enter it.
    std::fs::set_permissions(tree.join("locked"), std::fs::Permissions::from_mode(0o0)).unwrap();
    let server = vsftpd(&d.root, None, "");
    let base = format!("ftp://127.0.0.1:{}/pub/tree", server.port);
    let got = d.local.join("got");
    let out = xftp(&["get", "-r", &format!("{base}/"), s(&got)], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("locked/: the server could not read"), "{err}");
    assert!(err.contains("1 FAILED"), "{err}");
    assert_eq!(std::fs::read(got.join("ok/a")).unwrap(), b"a");
    assert!(!got.join("locked/locked").exists(), "{err}");
    // The unreadable directory as the top: an error, nothing made.
    let top = d.local.join("top");
    let out = xftp(
        &["get", "-r", &format!("{base}/locked/"), s(&top)],
        &d.local,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot read this directory"), "{err}");
    assert!(!top.exists(), "{err}");
    // The same names readable: the tree is whole and the run passes
    // (a readable directory lists its `.`).
    std::fs::set_permissions(tree.join("locked"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let again = d.local.join("again");
    ok(
        xftp(&["get", "-r", &format!("{base}/"), s(&again)], &d.local),
        "get -r readable",
    );
    assert_eq!(std::fs::read(again.join("locked/b")).unwrap(), b"b");
    // Names of blanks only: a LIST line cannot say where such a name
    // ends, so it is not read; the tree says so and fails, rather than
    // leave the files out in silence.
    std::fs::write(tree.join("ok/ "), b"one blank").unwrap();
    std::fs::write(tree.join("ok/ x"), b"leading blank").unwrap();
    let blanks = d.local.join("blanks");
    let out = xftp(&["get", "-r", &format!("{base}/"), s(&blanks)], &d.local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("ok/: 1 line(s) of its listing"), "{err}");
    assert_eq!(
        std::fs::read(blanks.join("ok/ x")).unwrap(),
        b"leading blank"
    );
}

#[test]
fn tls_against_vsftpd_reuses_the_control_session() {
    if !have_vsftpd("tls_against_vsftpd_reuses_the_control_session") {
        return;
    }
    let d = dirs();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let pki = tempfile::tempdir().unwrap();
    let (cert, key) = (pki.path().join("cert.pem"), pki.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let server = vsftpd(&d.root, Some((&cert, &key)), "");
    // The certificate names localhost; vsftpd forces TLS on anonymous
    // logins and data here, and refuses a data connection that does not
    // resume the control connection's session.
    let base = format!("ftp://localhost:{}/pub", server.port);
    let src = d.local.join("src");
    write_prng_file(&src, (5 << 20) + 3, 9);
    ok(
        xftp(
            &[
                "put",
                "--tls",
                "--cacert",
                s(&cert),
                s(&src),
                &format!("{base}/f"),
            ],
            &d.local,
        ),
        "put --tls",
    );
    assert_eq!(sha256_file(&d.root.join("pub/f")), sha256_file(&src));
    let got = d.local.join("got");
    ok(
        xftp(
            &[
                "get",
                "--tls",
                "--cacert",
                s(&cert),
                &format!("{base}/f"),
                s(&got),
            ],
            &d.local,
        ),
        "get --tls",
    );
    assert_eq!(sha256_file(&got), sha256_file(&src));
    let out = ok(
        xftp(
            &["ls", "--tls", "--cacert", s(&cert), &format!("{base}/")],
            &d.local,
        ),
        "ls --tls",
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.lines().any(|l| l.trim_end().ends_with(" f")),
        "{listing}"
    );
    // Without TLS, vsftpd refuses the login: the error says so.
    let out = xftp(
        &["get", &format!("{base}/f"), s(&d.local.join("plain"))],
        &d.local,
    );
    assert!(!out.status.success());
    assert!(!d.local.join("plain").exists());
}

#[test]
fn shell_against_vsftpd_mget_from_list_and_mult_as_ranges() {
    if !have_vsftpd("shell_against_vsftpd_mget_from_list_and_mult_as_ranges") {
        return;
    }
    let d = dirs();
    let server = vsftpd(&d.root, None, "");
    let served = d.root.join("pub/m");
    std::fs::create_dir_all(served.join("sub.bin")).unwrap();
    for (i, name) in ["a.bin", "b c.bin", ".h.bin", "skip.txt"]
        .iter()
        .enumerate()
    {
        write_prng_file(&served.join(name), 1000 + i as u64, i as u64);
    }
    write_prng_file(&served.join("big.dat"), (3 << 20) + 5, 99);
    chown_ftp(&served);
    let script = "cd pub/m\nmget *.bin\nmult 3\nget big.dat\nquit\n";
    let out = ok(
        support::shell_script(
            &format!("ftp://127.0.0.1:{}/", server.port),
            &d.local,
            script,
        ),
        "shell mget",
    );
    for name in ["a.bin", "b c.bin"] {
        assert_eq!(
            sha256_file(&d.local.join(name)),
            sha256_file(&served.join(name)),
            "{name}"
        );
    }
    // `mult 3` against a server without MULT: three ranged sessions.
    assert_eq!(
        sha256_file(&d.local.join("big.dat")),
        sha256_file(&served.join("big.dat"))
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("3 sessions, each fetching byte ranges"),
        "{err}"
    );
    // Each notice once: the refused MULT with the first transfer, and
    // after `mult 3` the sessions in its place (not both).
    assert_eq!(
        err.matches("does not support MULT; using 1 connection")
            .count(),
        1,
        "{err}"
    );
    // The directory matching the pattern is not a file; the glob, as a
    // shell's, leaves out hidden names; the rest does not match.
    for name in ["sub.bin", "skip.txt"] {
        assert!(!d.local.join(name).exists(), "{name}: {out:?}");
    }
}

#[test]
fn ranged_downloads_survive_refused_sessions_and_resume() {
    if !have_vsftpd("ranged_downloads_survive_refused_sessions_and_resume") {
        return;
    }
    let d = dirs();
    // Two sessions per address at most: of -p 6, four are refused (421).
    let server = vsftpd(&d.root, None, "max_per_ip=2\n");
    let url = format!("ftp://127.0.0.1:{}/pub/big", server.port);
    let served = d.root.join("pub/big");
    write_prng_file(&served, (24 << 20) + 999, 31);
    chown_ftp(&served);
    let want = sha256_file(&served);
    let got = d.local.join("got");
    // Held to 24 MiB/s, so that the first session does not fetch every
    // byte before the others have logged in on a loaded machine ("5 of
    // them not needed", and no 421 to see).
    let out = ok(
        xftp(
            &[
                "get",
                "-p",
                "6",
                "--limit-rate",
                "24M",
                "--json",
                &url,
                s(&got),
            ],
            &d.local,
        ),
        "get -p 6 with two sessions allowed",
    );
    assert_eq!(sha256_file(&got), want);
    let j = json(&out);
    assert_eq!(j["bytes"], (24 << 20) + 999);
    let per = j["per_stream_bytes"].as_array().unwrap();
    assert!(
        (1..=2).contains(&per.len()),
        "at most the two sessions the server allows carried data: {j}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 of 6 sessions opened") && err.contains("421"),
        "{err}"
    );
    // Cut, then resumed with ranges: the partial's holes are fetched by
    // several sessions, and the result is whole.
    let server = vsftpd(&d.root, None, "");
    let url = format!("ftp://127.0.0.1:{}/pub/big", server.port);
    let part = d.local.join("r");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", "-c", "-p", "4", "--limit-rate", "8M", &url, s(&part)])
        .current_dir(&d.local)
        .env("HOME", &d.local)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let st = child.wait().unwrap();
    assert!(!st.success(), "the cut download did not fail");
    assert!(!part.exists(), "a cut download must not look complete");
    let out = ok(
        xftp(
            &["get", "-c", "-p", "4", "--json", &url, s(&part)],
            &d.local,
        ),
        "get -c -p 4 (resume)",
    );
    let j = json(&out);
    let already = j["bytes_already_present"].as_u64().unwrap_or(0);
    assert!(already > 0, "nothing was kept from the cut run: {j}");
    assert_eq!(j["bytes"].as_u64().unwrap() + already, (24 << 20) + 999);
    assert_eq!(sha256_file(&part), want);
}
