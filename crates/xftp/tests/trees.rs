//! Directory trees (`-r`): both directions against `xftp serve`, with
//! nested and empty directories, odd names, an empty file, large and
//! small files over several sessions; times and permission bits kept; a
//! second run with -c skips what is complete; lftp mirror and
//! globus-url-copy -r against `xftp serve`; xftp against pyftpdlib.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;
use support::{have_pyftpdlib, serve, sha256_file, spawn_logging_server, write_prng_file, PYTHON};

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run xftp")
}

fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "bad JSON {text:?}: {e}; {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A tree: nested and empty directories, names with spaces and
/// non-ASCII, an empty file, many small files, two large ones; odd
/// times and modes.
fn make_tree(root: &Path) -> usize {
    let mut n = 0;
    for d in ["a/b/c", "empty/inner", "sp ace/ünï"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for i in 0..120u64 {
        let dir = ["a", "a/b", "a/b/c", "sp ace/ünï"][(i % 4) as usize];
        write_prng_file(&root.join(dir).join(format!("f{i}.dat")), i * 97 % 5000, i);
        n += 1;
    }
    write_prng_file(&root.join("big1.bin"), 12_000_000 + 1, 1);
    write_prng_file(&root.join("a/big2.bin"), 9_000_000 + 7, 2);
    std::fs::write(root.join("a/zero"), b"").unwrap();
    std::fs::write(root.join("sp ace/ünï/name with space.txt"), b"x").unwrap();
    n += 4;
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(root.join("a/f0.dat"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    std::fs::set_permissions(
        root.join("a/b/f1.dat"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    n
}

/// Every file of `a` is in `b` with the same bytes, and no more files.
fn same_tree(a: &Path, b: &Path) {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<(String, [u8; 32])>, dirs: &mut Vec<String>) {
        for e in std::fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                dirs.push(r.display().to_string());
                walk(root, &r, out, dirs);
            } else {
                out.push((r.display().to_string(), sha256_file(&root.join(&r))));
            }
        }
    }
    let (mut fa, mut fb, mut da, mut db) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    walk(a, Path::new(""), &mut fa, &mut da);
    walk(b, Path::new(""), &mut fb, &mut db);
    fa.sort();
    fb.sort();
    da.sort();
    db.sort();
    assert_eq!(da, db, "directories");
    assert_eq!(fa.len(), fb.len(), "file count");
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!(x, y, "content of {}", x.0);
    }
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn trees_both_ways_keep_bytes_times_and_modes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let work = dir.path().join("work");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let n = make_tree(&root.join("src"));
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);

    let out = xftp(
        &[
            "get",
            "-r",
            "-p",
            "4",
            "--concurrency",
            "6",
            "--json",
            &format!("{base}/src/"),
            "copy",
        ],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    let j = json(&out);
    assert_eq!(j["files"], n as u64, "{j}");
    assert_eq!(j["failed"], serde_json::json!([]));
    assert!(j["sessions"].as_u64().unwrap() >= 2, "{j}");
    // The two files of 8 MiB and more went one at a time with every stream.
    assert_eq!(j["large_files"], 2, "{j}");
    assert_eq!(j["large_bytes"], 12_000_001 + 9_000_007, "{j}");
    assert!(j["large_seconds"].as_f64().unwrap() > 0.0, "{j}");
    same_tree(&root.join("src"), &work.join("copy"));
    assert_eq!(
        mtime(&work.join("copy/a/f0.dat")),
        mtime(&root.join("src/a/f0.dat"))
    );
    assert_eq!(mode(&work.join("copy/a/b/f1.dat")), 0o600);

    // Up again to a new directory, with --verify on every file.
    let out = xftp(
        &[
            "put",
            "-r",
            "-p",
            "3",
            "--verify",
            "--json",
            "copy",
            &format!("{base}/up/"),
        ],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(json(&out)["files"], n as u64);
    same_tree(&root.join("src"), &root.join("up"));
    assert_eq!(
        mtime(&root.join("up/a/f0.dat")),
        mtime(&root.join("src/a/f0.dat"))
    );
    assert_eq!(mode(&root.join("up/a/b/f1.dat")), 0o600);

    // -c: nothing moves when all is there; a removed file comes back.
    std::fs::remove_file(work.join("copy/a/b/c/f2.dat")).unwrap();
    let out = xftp(
        &["get", "-r", "-c", "--json", &format!("{base}/src/"), "copy"],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    let j = json(&out);
    assert_eq!(
        (j["files"].as_u64(), j["skipped"].as_u64()),
        (Some(1), Some(n as u64 - 1)),
        "{j}"
    );
    same_tree(&root.join("src"), &work.join("copy"));

    // put -r -c: the files complete on the server are skipped; one
    // removed there and one changed here go again, and so does a new
    // directory's file (a directory made now is not listed).
    std::fs::remove_file(root.join("up/a/f0.dat")).unwrap();
    std::fs::write(work.join("copy/a/b/f1.dat"), b"changed here").unwrap();
    std::fs::create_dir_all(work.join("copy/a/new")).unwrap();
    std::fs::write(work.join("copy/a/new/n.dat"), b"new here").unwrap();
    let out = xftp(
        &["put", "-r", "-c", "--json", "copy", &format!("{base}/up/")],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    let j = json(&out);
    assert_eq!(
        (j["files"].as_u64(), j["skipped"].as_u64()),
        (Some(3), Some(n as u64 - 2)),
        "{j}"
    );
    same_tree(&work.join("copy"), &root.join("up"));
}

#[test]
fn a_tree_that_cannot_be_written_fails_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("t/sub")).unwrap();
    std::fs::create_dir_all(root.join("t/other")).unwrap();
    std::fs::write(root.join("t/sub/f"), b"data").unwrap();
    std::fs::write(root.join("t/other/g"), b"more").unwrap();
    std::fs::write(root.join("t/h"), b"top").unwrap();
    let srv = serve(&root, &[]);
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("copy")).unwrap();
    // A file where the tree needs a directory: that subtree fails, named
    // with the way out, and the rest is copied.
    std::fs::write(work.join("copy/sub"), b"in the way").unwrap();
    let url = format!("ftp://127.0.0.1:{}/t/", srv.port);
    let out = xftp(&["get", "-r", &url, "copy"], &work);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("copy/sub") && err.contains("a local file is in the way"),
        "{err}"
    );
    assert_eq!(std::fs::read(work.join("copy/other/g")).unwrap(), b"more");
    assert_eq!(std::fs::read(work.join("copy/h")).unwrap(), b"top");
    assert_eq!(std::fs::read(work.join("copy/sub")).unwrap(), b"in the way");
    // The target itself a file.
    std::fs::write(work.join("plain"), b"x").unwrap();
    let out = xftp(&["get", "-r", &url, "plain"], &work);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("plain is a file"),
        "{err}"
    );
    // A missing remote directory.
    let out = xftp(
        &["get", "-r", &format!("ftp://127.0.0.1:{}/nope/", srv.port)],
        &work,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("550"));
    // A tree's option given for one file is said to do nothing.
    let out = xftp(
        &[
            "get",
            "--concurrency",
            "2",
            &format!("ftp://127.0.0.1:{}/t/sub/f", srv.port),
            "one-f",
        ],
        &work,
    );
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--concurrency counts the files of a tree"),
        "{err}"
    );
    // With --json, a tree's object, saying why.
    let out = xftp(
        &[
            "get",
            "-r",
            "--json",
            &format!("ftp://127.0.0.1:{}/nope/", srv.port),
        ],
        &work,
    );
    assert!(!out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        (&j["status"], &j["files"]),
        (&"error".into(), &0.into()),
        "{j}"
    );
    assert!(
        j["error"].as_str().is_some_and(|e| e.contains("550")),
        "{j}"
    );
    assert!(j["failed"].is_array(), "{j}");
    // put -r of a file.
    let out = xftp(
        &[
            "put",
            "-r",
            "copy/sub",
            &format!("ftp://127.0.0.1:{}/x/", srv.port),
        ],
        &work,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    // A FIFO where a file of the tree goes (the small files come in a
    // batch, renamed into place one by one): that file fails, the FIFO
    // stays a FIFO, the others arrive.
    for i in 0..3 {
        std::fs::write(root.join(format!("t/sub/s{i}")), format!("{i}")).unwrap();
    }
    let fifo = work.join("again/sub/s1");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = xftp(
        &[
            "get",
            "-r",
            &format!("ftp://127.0.0.1:{}/t/", srv.port),
            "again",
        ],
        &work,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a FIFO") && err.contains("1 FAILED"),
        "{err}"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    for f in ["f", "s0", "s2"] {
        assert_eq!(
            std::fs::read(work.join("again/sub").join(f)).unwrap(),
            std::fs::read(root.join("t/sub").join(f)).unwrap()
        );
    }
}

#[test]
fn lftp_mirror_and_globus_url_copy_r_against_xftp_serve() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    make_tree(&root.join("src"));
    let srv = serve(&root, &[]);
    let have = |t: &str| Command::new(t).arg("--version").output().is_ok();
    if have("lftp") {
        let out = Command::new("lftp")
            .arg("-c")
            .arg(format!(
                "set net:max-retries 1; open ftp://127.0.0.1:{}; mirror --parallel=4 src {}",
                srv.port,
                dir.path().join("lftp").display()
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        same_tree(&root.join("src"), &dir.path().join("lftp"));
    } else {
        eprintln!("SKIP lftp mirror: lftp is not installed");
    }
    if Command::new("globus-url-copy")
        .arg("-version")
        .output()
        .is_ok()
    {
        let out = Command::new("globus-url-copy")
            .args(["-r", "-cc", "4"])
            .arg(format!("ftp://127.0.0.1:{}/src/", srv.port))
            .arg(format!("file://{}/", dir.path().join("guc").display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        same_tree(&root.join("src"), &dir.path().join("guc"));
    } else {
        eprintln!("SKIP globus-url-copy -r: not installed");
    }
}

#[test]
fn trees_against_pyftpdlib() {
    if !have_pyftpdlib("trees_against_pyftpdlib") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    let n = make_tree(&root.join("src"));
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-m", "pyftpdlib", "-i", "127.0.0.1", "-p", "0", "-w", "-d"])
        .arg(&root);
    let srv = spawn_logging_server(cmd);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let out = xftp(
        &["get", "-r", "--json", &format!("{base}/src/"), "copy"],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(json(&out)["files"], n as u64);
    same_tree(&root.join("src"), &work.join("copy"));
    assert_eq!(
        mtime(&work.join("copy/a/f0.dat")),
        mtime(&root.join("src/a/f0.dat"))
    );
    let out = xftp(
        &["put", "-r", "--json", "copy", &format!("{base}/up/")],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    same_tree(&root.join("src"), &root.join("up"));
    // pyftpdlib knows MFMT: the times come along.
    assert_eq!(
        mtime(&root.join("up/a/f0.dat")),
        mtime(&root.join("src/a/f0.dat"))
    );
    // -c against a stock server's MKD replies (550 for a directory that
    // is there): only what is missing or new goes.
    std::fs::remove_file(root.join("up/a/f0.dat")).unwrap();
    std::fs::create_dir_all(work.join("copy/a/new")).unwrap();
    std::fs::write(work.join("copy/a/new/n.dat"), b"new here").unwrap();
    let out = xftp(
        &["put", "-r", "-c", "--json", "copy", &format!("{base}/up/")],
        &work,
    );
    assert!(out.status.success(), "{out:?}");
    let j = json(&out);
    assert_eq!(
        (j["files"].as_u64(), j["skipped"].as_u64()),
        (Some(2), Some(n as u64 - 1)),
        "{j}"
    );
    same_tree(&work.join("copy"), &root.join("up"));
}

#[test]
fn a_tree_reports_its_progress_as_one_count() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("t/d")).unwrap();
    let mut total = 0;
    for i in 0..40u64 {
        let len = 50_000 + i * 1000;
        write_prng_file(&root.join(format!("t/d/f{i}")), len, i);
        total += len;
    }
    let srv = serve(&root, &[]);
    let out = xftp(
        &[
            "get",
            "-r",
            "--limit-rate",
            "2M",
            "--json-progress",
            "--json",
            &format!("ftp://127.0.0.1:{}/t/", srv.port),
            "copy",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let progress: Vec<_> = lines.iter().filter(|v| v["type"] == "progress").collect();
    assert!(progress.len() >= 2, "{text}");
    assert!(progress
        .iter()
        .all(|v| v["path"] == "40 files" && v["total"] == total));
    let b: Vec<u64> = progress
        .iter()
        .map(|v| v["bytes"].as_u64().unwrap())
        .collect();
    assert!(b.windows(2).all(|w| w[0] <= w[1]), "{b:?}");
    assert_eq!(*b.last().unwrap(), total);
    assert_eq!(lines.last().unwrap()["files"], 40);
}

/// MODE E blocks of one file from `s`, up to its EOF|EOD block (one
/// connection): the payload in offset order.
fn read_mode_e_file(s: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 17];
        s.read_exact(&mut h).expect("block header");
        let count = u64::from_be_bytes(h[1..9].try_into().unwrap());
        let offset = u64::from_be_bytes(h[9..17].try_into().unwrap());
        if h[0] & 0x40 != 0 {
            assert_eq!(h[0] & 0x08, 0x08, "EOF comes with EOD");
            assert_eq!(offset, 1, "one connection announced");
            assert_eq!(h[0] & 0x04, 0, "no CLOSE: the connection is kept");
            return out;
        }
        let mut b = vec![0u8; count as usize];
        s.read_exact(&mut b).unwrap();
        assert_eq!(offset, out.len() as u64, "one connection: blocks in order");
        out.extend_from_slice(&b);
    }
}

/// Data channel caching on the wire: after a MODE E download the data
/// connection stays open and the next RETR sent without a new PASV/EPSV
/// uses it; a refused RETR leaves it usable; a new EPSV or MODE S ends it.
#[test]
fn a_mode_e_download_keeps_its_data_connection_for_the_next() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    for (name, len) in [("a", 300_000u64), ("b", 0), ("c", 5)] {
        write_prng_file(&dir.path().join(name), len, len + 1);
    }
    let srv = serve(dir.path(), &[]);
    let mut c = support::Ctl::login(srv.port);
    assert!(c.cmd("FEAT").lines().any(|l| l.trim() == "CACHE"));
    assert!(c.cmd("TYPE I").starts_with("200"));
    assert!(c.cmd("MODE E").starts_with("200"));
    let r = c.cmd("EPSV");
    let port: u16 = r.split('|').nth(3).unwrap().parse().unwrap();
    let mut data = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    data.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    for (i, name) in ["a", "b", "c", "a"].iter().enumerate() {
        let r = c.cmd(&format!("RETR {name}"));
        assert!(r.starts_with("150"), "{r}");
        if i > 0 {
            assert!(r.contains("kept"), "{r}");
        }
        assert_eq!(
            read_mode_e_file(&mut data),
            std::fs::read(dir.path().join(name)).unwrap()
        );
        assert!(c.reply().starts_with("226"));
        if i == 1 {
            // Refused before any data: the connection stays in step.
            assert!(c.cmd("RETR nosuch").starts_with("550"));
        }
    }
    // An upload on the same connection: blocks, then EOF|EOD, no close.
    let body = b"uploaded over a kept connection";
    let r = c.cmd("STOR up.txt");
    assert!(r.starts_with("150") && r.contains("kept"), "{r}");
    let mut blocks = Vec::new();
    blocks.push(0u8);
    blocks.extend_from_slice(&(body.len() as u64).to_be_bytes());
    blocks.extend_from_slice(&0u64.to_be_bytes());
    blocks.extend_from_slice(body);
    blocks.push(0x48);
    blocks.extend_from_slice(&0u64.to_be_bytes());
    blocks.extend_from_slice(&1u64.to_be_bytes());
    std::io::Write::write_all(&mut data, &blocks).unwrap();
    assert!(c.reply().starts_with("226"));
    assert_eq!(std::fs::read(dir.path().join("up.txt")).unwrap(), body);
    // And the connection carries the next download.
    assert!(c.cmd("RETR up.txt").starts_with("150"));
    assert_eq!(read_mode_e_file(&mut data), body);
    assert!(c.reply().starts_with("226"));
    // Nothing more on it, and it is still open.
    data.set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let mut one = [0u8; 1];
    let e = data.read(&mut one).expect_err("no bytes, no close");
    assert!(matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    // A new plan replaces the kept connection: the server closes it.
    let r = c.cmd("EPSV");
    assert!(r.starts_with("229"), "{r}");
    data.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    assert_eq!(data.read(&mut one).unwrap_or(0), 0, "closed by the server");
    // Stream mode does not reuse anything: no plan, no transfer.
    let port2: u16 = r.split('|').nth(3).unwrap().parse().unwrap();
    let mut d2 = std::net::TcpStream::connect(("127.0.0.1", port2)).unwrap();
    assert!(c.cmd("RETR c").starts_with("150"));
    let _ = read_mode_e_file(&mut d2);
    assert!(c.reply().starts_with("226"));
    assert!(c.cmd("MODE S").starts_with("200"));
    let r = c.cmd("RETR c");
    assert!(r.starts_with("425"), "{r}");
    drop(d2);
}

/// Local names with a line break cannot be sent (no FTP command carries
/// one): `put -r` reports each as failed, with the fix, before anything
/// is sent. It used to break and reopen its session for each, with a
/// warning every time, and printed the raw line break in its report.
#[test]
fn put_r_reports_names_with_line_breaks_without_breaking_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(src.join("d\nir")).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    std::fs::write(src.join("a\nb"), b"x").unwrap();
    std::fs::write(src.join("c\rd"), b"y").unwrap();
    std::fs::write(src.join("d\nir/in"), b"z").unwrap();
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/up/", srv.port);
    let out = xftp(&["put", "-r", "src", &url], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("session broke"), "{err}");
    assert!(
        err.contains("a\\nb") && err.contains("c\\rd") && err.contains("d\\nir"),
        "{err}"
    );
    assert!(err.contains("rename it"), "{err}");
    for i in 0..20 {
        assert_eq!(
            std::fs::read(root.join(format!("up/f{i}"))).unwrap(),
            format!("{i}").as_bytes()
        );
    }
}

/// RNTO of a file to `name/` or `name/.` (a directory's name) is
/// refused as STOR to such a name is; a directory may take one.
#[test]
fn a_file_is_not_renamed_to_a_name_ending_in_a_slash() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("f"), b"f").unwrap();
    let srv = serve(&root, &[]);
    let mut c = support::Ctl::login(srv.port);
    for to in ["g/", "g/."] {
        assert!(c.cmd("RNFR f").starts_with("350"));
        let r = c.cmd(&format!("RNTO {to}"));
        assert!(r.starts_with("553"), "{to}: {r}");
    }
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"f");
    assert!(c.cmd("RNFR d").starts_with("350"));
    let r = c.cmd("RNTO e/");
    assert!(r.starts_with("250"), "{r}");
    assert!(root.join("e").is_dir());
}

/// CWD into a directory the server's user cannot enter (no x bit) is
/// refused, as chdir would be; it was taken, and every command after it
/// failed. The server runs as nobody here (as root, modes do not hold).
#[test]
fn cwd_into_a_directory_the_server_cannot_enter_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("nox")).unwrap();
    std::fs::create_dir_all(root.join("ok")).unwrap();
    for d in [dir.path(), root.as_path(), &root.join("ok")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(root.join("nox"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let as_server = || {
        if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_xftp"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_xftp"))
        }
    };
    let srv = support::serve_spawned(
        as_server()
            .args(["serve", "--anonymous", "--listen", "127.0.0.1:0", "--root"])
            .arg(&root)
            .stderr(std::process::Stdio::null()),
    );
    let port = srv.port;
    // A root it may not list at all is refused at start, not served.
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut refused = as_server()
        .args(["serve", "--anonymous", "--listen", "127.0.0.1:0", "--root"])
        .arg(&closed)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a server that takes the root does not end by itself.
    let t0 = std::time::Instant::now();
    while refused.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            let _ = refused.kill();
            let _ = refused.wait();
            panic!("a root it may not list was served");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = refused.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("may not list it"),
        "{err}"
    );
    let mut c = support::Ctl::login(port);
    let r = c.cmd("CWD nox");
    assert!(
        r.starts_with("550") && r.contains("Permission denied"),
        "{r}"
    );
    assert!(c.cmd("PWD").contains("\"/\""));
    // Its facts say so too: listable, not enterable.
    let r = c.cmd("MLST nox");
    let perm = r.split("perm=").nth(1).and_then(|p| p.split(';').next());
    assert_eq!(perm, Some("l"), "{r}");
    assert!(c.cmd("CWD ok").starts_with("250"));
}

#[test]
fn names_that_are_not_utf8_go_both_ways_as_their_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let work = dir.path().join("work");
    let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9");
    // 0xFF is Telnet's IAC on the control connection: sent doubled.
    let iac = std::ffi::OsStr::from_bytes(b"x\xffy");
    std::fs::create_dir_all(root.join("src").join(latin1)).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(root.join("src").join(latin1).join(iac), b"one").unwrap();
    std::fs::write(root.join("src").join(iac), b"two").unwrap();
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let out = xftp(&["get", "-r", &format!("{base}/src/"), "copy"], &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(work.join("copy").join(latin1).join(iac)).unwrap(),
        b"one"
    );
    assert_eq!(std::fs::read(work.join("copy").join(iac)).unwrap(), b"two");
    // One file by URL, %-escaped, into the name it has.
    let out = xftp(&["get", &format!("{base}/src/caf%E9/x%FFy")], &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(work.join(iac)).unwrap(), b"one");
    // And back up, under the same bytes.
    let out = xftp(&["put", "-r", "copy", &format!("{base}/back/")], &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(root.join("back").join(latin1).join(iac)).unwrap(),
        b"one"
    );
    assert_eq!(std::fs::read(root.join("back").join(iac)).unwrap(), b"two");
    // A listing: on stdout as the server's bytes; in JSON with the same
    // escapes as everywhere else, not lossily.
    let out = xftp(&["ls", &format!("{base}/src/")], &work);
    assert!(out.stdout.windows(3).any(|w| w == b"x\xffy"), "{out:?}");
    let out = xftp(&["ls", "--json", &format!("{base}/src/")], &work);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listing = j["listing"].as_str().unwrap_or_default();
    assert!(
        listing.contains("x\u{F7FF}y") && listing.contains("caf\u{F7E9}"),
        "{listing}"
    );
}

#[test]
fn entries_the_server_cannot_list_are_reported_not_dropped_silently() {
    // A name with a line break cannot go in a CRLF listing, and a link
    // leading outside the served root is not served: `xftp serve` leaves
    // both out of its listings and says so in the final reply, and
    // `get -r` tells the user that its copy lacks them, even with -q.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let work = dir.path().join("work");
    std::fs::create_dir_all(root.join("src/sub")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(root.join("src/plain"), b"one").unwrap();
    std::fs::write(root.join("src/sub/two\nlines"), b"two").unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("src/out")).unwrap();
    // And a directory whose path on the server is longer than the system
    // takes (PATH_MAX, 4096): its parent lists, but it cannot be read.
    let deep = root.join("src/deep");
    std::fs::create_dir_all(&deep).unwrap();
    let levels = (4095 - deep.as_os_str().len()) / 251 + 1;
    let made = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; cd \"$1\"; n=$(printf 'n%.0s' $(seq 250)); for i in $(seq {levels}); do mkdir $n; cd $n; done; echo x > leaf"
        ))
        .arg("bash")
        .arg(&deep)
        .status()
        .unwrap();
    assert!(made.success());
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/src/", srv.port);
    // The names and the link are left out by the server's rules; the
    // deep directory, which it could not read, fails the copy.
    let out = xftp(&["get", "-r", &url, "copy", "--json"], &work);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    assert_eq!(j["unlisted"], 2, "{j}");
    assert_eq!(j["files"], 1, "{j}");
    let failed = j["failed"].to_string();
    assert!(
        failed.contains("deep/") && failed.contains("could not read 1 of its entries"),
        "{j}"
    );
    assert_eq!(std::fs::read(work.join("copy/plain")).unwrap(), b"one");
    let out = xftp(&["get", "-r", "-q", &url, "again"], &work);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 entries the server did not list"), "{err}");
    // The listing itself says so, for any client.
    let out = xftp(
        &[
            "ls",
            "-v",
            &format!("ftp://127.0.0.1:{}/src/sub/", srv.port),
        ],
        &work,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the server left 1 entry out of this listing"),
        "{err}"
    );
    assert!(
        err.contains("1 entry not listed (1 with a line break"),
        "{err}"
    );
}

#[test]
fn links_to_directories_are_listed_as_links() {
    // A link to a directory inside the root is listed as a link (`l ...
    // name -> target`, `type=OS.unix=symlink`), as ls and vsftpd do:
    // a client's recursive delete then removes the link, not what it
    // leads to (lftp's `rm -r` emptied the target when it read `d`), and
    // `get -r` does not loop through `current -> .`. A link to a file is
    // listed as the file. MLSD gives `unique` facts.
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("root"), dir.path().join("work"));
    std::fs::create_dir_all(root.join("top/real")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(root.join("top/real/precious"), b"keep").unwrap();
    std::fs::write(root.join("top/a"), b"a").unwrap();
    std::os::unix::fs::symlink("real", root.join("top/lnk")).unwrap();
    std::os::unix::fs::symlink(".", root.join("top/current")).unwrap();
    std::os::unix::fs::symlink("a", root.join("top/alink")).unwrap();
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);

    let out = xftp(&["ls", &format!("{base}/top/")], &work);
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = |name: &str| {
        list.lines()
            .find(|l| l.split_whitespace().nth(8) == Some(name))
            .unwrap_or_else(|| panic!("no {name}: {list}"))
            .to_string()
    };
    assert!(line("lnk").starts_with('l') && line("lnk").ends_with("lnk -> real"));
    assert!(line("current").ends_with("current -> /top"), "{list}");
    assert!(line("alink").starts_with('-'), "{list}");
    assert!(line("real").starts_with('d'), "{list}");

    let mut c = support::Ctl::login(srv.port);
    let port = c.epsv_port();
    let mut d = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(c.cmd("MLSD top").starts_with("150"));
    let mut mlsd = String::new();
    std::io::Read::read_to_string(&mut d, &mut mlsd).unwrap();
    assert!(c.reply().starts_with("226"));
    let facts = |name: &str| {
        mlsd.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("no {name}: {mlsd}"))
            .to_ascii_lowercase()
    };
    let unique = |l: &str| {
        l.split(';')
            .find(|f| f.starts_with("unique="))
            .map(str::to_string)
    };
    assert!(facts("lnk").starts_with("type=os.unix=symlink;"), "{mlsd}");
    assert_eq!(unique(&facts("lnk")), unique(&facts("real")), "{mlsd}");
    assert!(unique(&facts("real")).is_some(), "{mlsd}");
    assert!(facts("alink").starts_with("type=file;"), "{mlsd}");
    // MLST of the link says the same as MLSD; of the directory, `dir`.
    let link = c.cmd("MLST top/lnk").to_ascii_lowercase();
    assert!(link.contains(" type=os.unix=symlink;"), "{link}");
    let real = c.cmd("MLST top/real").to_ascii_lowercase();
    assert!(real.contains(" type=dir;"), "{real}");

    // What a recursive delete does with an `l` entry: DELE of the link.
    assert!(c.cmd("RMD top/lnk").starts_with("550"));
    assert!(c.cmd("DELE top/lnk").starts_with("250"));
    assert!(!root.join("top/lnk").exists());
    assert_eq!(
        std::fs::read(root.join("top/real/precious")).unwrap(),
        b"keep"
    );

    // get -r leaves the directory link out and ends.
    let out = xftp(
        &["get", "-r", &format!("{base}/top/"), "copy", "--json"],
        &work,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    assert_eq!(
        (j["files"].as_u64(), j["other"].as_u64()),
        (Some(3), Some(1)),
        "{j}"
    );
    assert!(!work.join("copy/current").exists());
    assert_eq!(std::fs::read(work.join("copy/alink")).unwrap(), b"a");
}

#[test]
fn get_r_keeps_directory_times_and_modes_and_leaves_nothing_for_a_missing_tree() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("root"), dir.path().join("work"));
    std::fs::create_dir_all(root.join("t/a/b")).unwrap();
    std::fs::create_dir_all(root.join("t/ro")).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(root.join("t/a/b/f"), b"f").unwrap();
    std::fs::write(root.join("t/ro/g"), b"g").unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_577_934_245);
    for (d, mode) in [
        ("t/a", 0o750),
        ("t/a/b", 0o711),
        ("t/ro", 0o555),
        ("t", 0o751),
    ] {
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::File::open(root.join(d))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let out = xftp(&["get", "-r", &format!("{base}/t/"), "copy"], &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The owner keeps full rights: a remote 555 comes back 755. The top
    // takes its time and mode as the others do.
    for (d, mode) in [("a", 0o750), ("a/b", 0o711), ("ro", 0o755), ("", 0o751)] {
        let md = std::fs::metadata(work.join("copy").join(d)).unwrap();
        assert_eq!(md.mode() & 0o777, mode, "{d}");
        assert_eq!(md.modified().unwrap(), old, "{d}");
    }
    // A missing tree, or a file given as one: no empty directory left.
    for remote in ["nope/", "t/a/b/f/"] {
        let out = xftp(&["get", "-r", &format!("{base}/{remote}"), "gone"], &work);
        assert!(!out.status.success());
        assert!(!work.join("gone").exists(), "{remote}");
    }
}

/// `put -r` sets the directories' times and modes on the server too,
/// once their files are in (each file written changes its directory's
/// time); the owner keeps full rights, as on a download.
#[test]
fn put_r_keeps_directory_times_and_modes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("root"), dir.path().join("work"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(work.join("t/a/b")).unwrap();
    std::fs::create_dir_all(work.join("t/ro")).unwrap();
    std::fs::write(work.join("t/a/b/f"), b"f").unwrap();
    std::fs::write(work.join("t/ro/g"), b"g").unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_577_934_245);
    for (d, mode) in [
        ("t", 0o755),
        ("t/a", 0o750),
        ("t/a/b", 0o711),
        ("t/ro", 0o555),
    ] {
        std::fs::set_permissions(work.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::File::open(work.join(d))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/up/", srv.port);
    let out = xftp(&["put", "-r", "t", &url], &work);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (d, mode) in [("", 0o755), ("a", 0o750), ("a/b", 0o711), ("ro", 0o755)] {
        let md = std::fs::metadata(root.join("up").join(d)).unwrap();
        assert_eq!(md.mode() & 0o777, mode, "{d:?}");
        assert_eq!(md.modified().unwrap(), old, "{d:?}");
    }
    assert_eq!(std::fs::read(root.join("up/a/b/f")).unwrap(), b"f");
    // Restore what tempfile needs to clean up.
    std::fs::set_permissions(work.join("t/ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `put -r` of a tree with a subdirectory the client cannot read: that
/// directory is named among the failures and the command fails, but the
/// rest of the tree is sent. As root (who reads everything) the client
/// runs as `nobody` through setpriv.
#[test]
fn put_r_sends_the_rest_of_a_tree_around_an_unreadable_subdirectory() {
    let root_user = unsafe { libc::geteuid() } == 0;
    if root_user && Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("SKIP: root, and no setpriv to run the client as nobody");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let open =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    open(dir.path(), 0o755);
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let work = dir.path().join("work");
    for d in ["t/ok", "t/closed", "cache"] {
        std::fs::create_dir_all(work.join(d)).unwrap();
    }
    open(&work.join("cache"), 0o777);
    std::fs::write(work.join("t/a.txt"), b"top").unwrap();
    std::fs::write(work.join("t/ok/b.txt"), b"inside").unwrap();
    std::fs::write(work.join("t/closed/secret"), b"unread").unwrap();
    open(&work.join("t/closed"), 0o000);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/up/", srv.port);
    let mut cmd = if root_user {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_xftp"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_xftp"))
    };
    let out = cmd
        .args(["put", "-r", "t", &url])
        .current_dir(&work)
        .env("XDG_CACHE_HOME", work.join("cache"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    open(&work.join("t/closed"), 0o755);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("closed/") && err.contains("cannot read"),
        "{err}"
    );
    assert_eq!(std::fs::read(root.join("up/a.txt")).unwrap(), b"top");
    assert_eq!(std::fs::read(root.join("up/ok/b.txt")).unwrap(), b"inside");
    assert!(!root.join("up/closed/secret").exists());
}

/// A tree holding a cut resumable transfer's partial and record
/// (`.NAME.xftp-part`, `.NAME.xftp-part.ranges`, as `xftp serve` lists
/// its own): they are left out both ways, and `NAME` arrives whole with
/// `-c`, whose own partial and record have those names.
#[test]
fn resumable_partials_in_a_tree_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("t")).unwrap();
    write_prng_file(&root.join("t/big"), 3_000_001, 7);
    std::fs::write(root.join("t/.big.xftp-part"), b"22 bytes of something!").unwrap();
    std::fs::write(
        root.join("t/.big.xftp-part.ranges"),
        b"{\"not\":\"ranges\"}",
    )
    .unwrap();
    // No NAME before the suffix: no resume left it, an ordinary file.
    std::fs::write(root.join("t/.xftp-part"), b"mine").unwrap();
    let srv = serve(&root, &[]);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let url = format!("ftp://127.0.0.1:{}/t/", srv.port);
    let out = xftp(&["get", "-r", "-c", &url, "copy"], &work);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Counted as what they are, not as links or special files.
    assert!(err.contains("2 partials of cut transfers"), "{err}");
    assert!(!err.contains("special files"), "{err}");
    assert_eq!(
        sha256_file(&work.join("copy/big")),
        sha256_file(&root.join("t/big"))
    );
    let mut names: Vec<_> = std::fs::read_dir(work.join("copy"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, [".xftp-part", "big"], "{err}");
    // Up: a local partial left by an earlier `get -c` stays here.
    std::fs::write(work.join("copy/.other.xftp-part"), b"partial").unwrap();
    let out = xftp(
        &[
            "put",
            "-r",
            "copy",
            &format!("ftp://127.0.0.1:{}/up/", srv.port),
        ],
        &work,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(root.join("up/big").exists());
    assert!(!root.join("up/.other.xftp-part").exists());
}

/// A tree downloaded into a directory the server serves (the server on
/// this host, sharing its disk) would copy itself into itself, level after
/// level, until paths grew too long (819 levels, then exit 0). The copy
/// is told by its `unique` fact and left out, loudly; a target that is
/// the very directory downloaded copies nothing.
#[test]
fn a_tree_downloaded_into_what_the_server_serves_does_not_copy_itself() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sub")).unwrap();
    std::fs::write(root.path().join("a.txt"), b"a").unwrap();
    std::fs::write(root.path().join("sub/b.txt"), b"b").unwrap();
    let srv = serve(root.path(), &[]);
    let url = format!("ftp://127.0.0.1:{}/", srv.port);
    let out = xftp(&["get", "-r", &url, "copy"], root.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("download's own target"), "{err}");
    let copy = root.path().join("copy");
    assert_eq!(std::fs::read(copy.join("a.txt")).unwrap(), b"a");
    assert_eq!(std::fs::read(copy.join("sub/b.txt")).unwrap(), b"b");
    assert!(!copy.join("copy").exists(), "the copy copied itself");
    // The directory downloaded, as its own target.
    let url = format!("ftp://127.0.0.1:{}/sub/", srv.port);
    let out = xftp(&["get", "-r", &url, "sub"], root.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the very directory"), "{err}");
    assert_eq!(std::fs::read(root.path().join("sub/b.txt")).unwrap(), b"b");
}
