//! Resumable downloads (`xftp get -c`): downloads killed (SIGKILL) at
//! random points several times in a row finish with the right bytes and
//! move less than the whole file the last time; a source that changed is
//! refused; a server killed and restarted mid-transfer; REST with ranges
//! on the server. Kill times come from a seed printed at the start
//! (`XFTP_RESUME_SEED=N` repeats a run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod support;
use support::{serve, sha256_file, write_prng_file, xftp_killed, Ctl};

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("run xftp")
}

fn seed() -> u64 {
    let s = std::env::var("XFTP_RESUME_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("resume seed {s} (XFTP_RESUME_SEED={s} repeats this run)");
    s
}

/// xorshift64*
fn next(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "bad JSON {text:?}: {e}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn leftovers(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("xftp-part"))
        .collect()
}

const SIZE: u64 = 24_000_000 + 4_321;

/// Run `args` three times, each killed at a random point 0.7-1.4 s in
/// (after the first record of ranges, written every half second), then
/// wait `pause`; at least two of them must really have been cut.
fn cut_three_times(args: &[&str], cwd: &Path, rng: &mut u64, pause: Duration) {
    let mut cuts = 0;
    for _ in 0..3 {
        let ms = 700 + next(rng) % 700;
        if xftp_killed(args, cwd, Duration::from_millis(ms)) {
            cuts += 1;
        }
        std::thread::sleep(pause);
    }
    assert!(
        cuts >= 2,
        "{args:?}: the transfers ended before they could be cut"
    );
}

/// The resumed run succeeded, found bytes in place and moved the rest.
fn resumed_less_than_all(out: &Output, p: &str) {
    assert!(out.status.success(), "-p {p}: {out:?}");
    let j = json(out);
    let moved = j["bytes"].as_u64().unwrap();
    let already = j["bytes_already_present"].as_u64().unwrap_or(0);
    assert!(already > 0, "-p {p}: nothing was kept: {j}");
    assert!(
        moved < SIZE,
        "-p {p}: the resumed run moved the whole file: {j}"
    );
    assert_eq!(moved + already, SIZE, "-p {p}: {j}");
}

#[test]
fn killed_downloads_resume_to_the_whole_file() {
    let mut rng = seed() | 1;
    let (_dir, root, local) = root_and_local();
    write_prng_file(&root.join("f.bin"), SIZE, 42);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/f.bin", srv.port);
    for p in ["4", "1", "auto", "8"] {
        let name = format!("f-{p}.bin");
        // 4 MiB/s: the file takes about 5.7 s, and three cuts within
        // 1.4 s each leave part of it still to come.
        let args = ["get", "-c", "-p", p, "--limit-rate", "4M", &url, &name];
        cut_three_times(&args, &local, &mut rng, Duration::ZERO);
        assert!(
            !local.join(&name).exists(),
            "-p {p}: a cut file under its final name"
        );
        let out = xftp(&["get", "-c", "-p", p, "--json", &url, &name], &local);
        resumed_less_than_all(&out, p);
        assert_eq!(
            sha256_file(&local.join(&name)),
            sha256_file(&root.join("f.bin")),
            "-p {p}"
        );
    }
    assert!(leftovers(&local).is_empty(), "{:?}", leftovers(&local));
}

#[test]
fn a_finished_resumable_download_is_not_fetched_again() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&root.join("f.bin"), 3_000_017, 9);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/f.bin", srv.port);
    let get = |extra: &[&str]| {
        let mut args = vec!["get", "-c", "-p", "4", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&url, "f.bin"]);
        let out = xftp(&args, &local);
        assert!(out.status.success(), "{out:?}");
        json(&out)
    };
    let j = get(&[]);
    assert_eq!(j["bytes"], 3_000_017, "{j}");
    // The copy took the source's time: the next -c finds it complete.
    let src = std::fs::metadata(root.join("f.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let copy = std::fs::metadata(local.join("f.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(ms(src), ms(copy));
    let j = get(&[]);
    assert_eq!(
        (j["bytes"].as_u64(), j["bytes_already_present"].as_u64()),
        (Some(0), Some(3_000_017)),
        "{j}"
    );
    // Rewritten within the same second, same size: another version, which
    // the server's milliseconds tell; it moves again.
    write_prng_file(&root.join("f.bin"), 3_000_017, 19);
    set_time(&root.join("f.bin"), within_second(src));
    let j = get(&[]);
    assert_eq!(j["bytes"], 3_000_017, "{j}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
    let src = std::fs::metadata(root.join("f.bin"))
        .unwrap()
        .modified()
        .unwrap();
    // --verify still compares what is there.
    let j = get(&["--verify"]);
    assert_eq!(j["bytes"], 0, "{j}");
    assert!(j["checksum"].is_string(), "{j}");
    // Other bytes under the same size and time: --verify finds them and
    // the file moves again, whole.
    write_prng_file(&local.join("f.bin"), 3_000_017, 10);
    set_time(&local.join("f.bin"), src);
    let j = get(&["--verify"]);
    assert_eq!(j["bytes"], 3_000_017, "{j}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
    // Another time (or size) is no proof: the file moves again, whole.
    set_time(&local.join("f.bin"), old_time());
    let j = get(&[]);
    assert_eq!(j["bytes"], 3_000_017, "{j}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
    assert!(leftovers(&local).is_empty(), "{:?}", leftovers(&local));
}

/// A test's directory, with `root` (served) and `local` (the client's)
/// made in it.
fn root_and_local() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    (dir, root, local)
}

/// Milliseconds since the epoch.
fn ms(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// `t` moved by half a second within its own second.
fn within_second(t: std::time::SystemTime) -> std::time::SystemTime {
    let m = ms(t);
    let other = m - m % 1000 + (m % 1000 + 500) % 1000;
    std::time::UNIX_EPOCH + Duration::from_millis(other as u64)
}

fn set_time(p: &Path, t: std::time::SystemTime) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.set_modified(t).unwrap();
}

fn old_time() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

#[test]
fn a_finished_resumable_upload_is_not_sent_again() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&local.join("u.bin"), 2_500_003, 11);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/u.bin", srv.port);
    let put = |extra: &[&str]| {
        let mut args = vec!["put", "-c", "-p", "4", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["u.bin", &url]);
        let out = xftp(&args, &local);
        assert!(out.status.success(), "{out:?}");
        json(&out)
    };
    let j = put(&[]);
    assert_eq!(j["bytes"], 2_500_003, "{j}");
    // The server's copy took the local file's time (MFMT): the next -c
    // finds it complete and sends nothing.
    let t = std::fs::metadata(local.join("u.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let there = std::fs::metadata(root.join("u.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(ms(t), ms(there));
    let j = put(&[]);
    assert_eq!(
        (j["bytes"].as_u64(), j["bytes_already_present"].as_u64()),
        (Some(0), Some(2_500_003)),
        "{j}"
    );
    // The local file rewritten within the same second, same size: it goes
    // again.
    write_prng_file(&local.join("u.bin"), 2_500_003, 21);
    set_time(&local.join("u.bin"), within_second(t));
    let j = put(&[]);
    assert_eq!(j["bytes"], 2_500_003, "{j}");
    assert_eq!(
        sha256_file(&root.join("u.bin")),
        sha256_file(&local.join("u.bin"))
    );
    let t = std::fs::metadata(local.join("u.bin"))
        .unwrap()
        .modified()
        .unwrap();
    // Other bytes there under the same size and time: --verify sends the
    // file again.
    write_prng_file(&root.join("u.bin"), 2_500_003, 12);
    set_time(&root.join("u.bin"), t);
    let j = put(&["--verify"]);
    assert_eq!(j["bytes"], 2_500_003, "{j}");
    assert_eq!(
        sha256_file(&root.join("u.bin")),
        sha256_file(&local.join("u.bin"))
    );
    // A local file with another time goes again, whole.
    set_time(&local.join("u.bin"), old_time());
    let j = put(&[]);
    assert_eq!(j["bytes"], 2_500_003, "{j}");
    assert_eq!(
        sha256_file(&root.join("u.bin")),
        sha256_file(&local.join("u.bin"))
    );
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

#[test]
fn a_changed_source_is_refused_and_the_partial_kept() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&root.join("g.bin"), SIZE, 7);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/g.bin", srv.port);
    let args = ["get", "-c", "-p", "4", "--limit-rate", "10M", &url, "g.bin"];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    // Same size, another modification time.
    let st = Command::new("touch")
        .args(["-d", "2001-02-03 04:05:06"])
        .arg(root.join("g.bin"))
        .status()
        .unwrap();
    assert!(st.success());
    let out = xftp(&["get", "-c", &url, "g.bin"], &local);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("source changed")
            && err.contains("remove")
            && err.contains(".g.bin.xftp-part"),
        "{err}"
    );
    assert!(!local.join("g.bin").exists());
    assert_eq!(leftovers(&local).len(), 2, "partial and record kept");
    // Another size.
    write_prng_file(&root.join("g.bin"), SIZE - 1, 8);
    let out = xftp(&["get", "-c", &url, "g.bin"], &local);
    assert!(!out.status.success());
    // Another remote file into the same local name, though of the size
    // and time the partial's record has: not spliced either.
    write_prng_file(&root.join("g.bin"), SIZE, 7);
    write_prng_file(&root.join("other.bin"), SIZE, 9);
    for f in ["g.bin", "other.bin"] {
        Command::new("touch")
            .args(["-d", "2001-02-03 04:05:06"])
            .arg(root.join(f))
            .status()
            .unwrap();
    }
    let other = format!("ftp://127.0.0.1:{}/other.bin", srv.port);
    let out = xftp(&["get", "-c", &other, "g.bin"], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("begun from"), "{err}");
    // A whole copy fetched without -c supersedes the partial: it goes,
    // and a later -c is not refused for it.
    let out = xftp(&["get", &url, "g.bin"], &local);
    assert!(out.status.success(), "{out:?}");
    assert!(leftovers(&local).is_empty(), "{:?}", leftovers(&local));
    write_prng_file(&root.join("g.bin"), SIZE - 1, 8);
    let out = xftp(&["get", "-c", &url, "g.bin"], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&local.join("g.bin")),
        sha256_file(&root.join("g.bin"))
    );
}

#[test]
fn a_server_killed_mid_transfer_is_resumed_after_its_restart() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&root.join("h.bin"), SIZE, 9);
    let mut srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/h.bin", srv.port);
    let child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args([
            "get",
            "-c",
            "-p",
            "4",
            "--limit-rate",
            "10M",
            "--timeout",
            "5",
            &url,
            "h.bin",
        ])
        .current_dir(&local)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    srv.child.kill().unwrap();
    let _ = srv.child.wait();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the download survived its server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("partial download is kept")
            && err.contains("-c")
            && !err.contains("nothing was kept"),
        "{err}"
    );
    assert!(!local.join("h.bin").exists());
    let srv2 = serve(&root, &[]);
    let url2 = format!("ftp://127.0.0.1:{}/h.bin", srv2.port);
    let out = xftp(&["get", "-c", "-p", "4", "--json", &url2, "h.bin"], &local);
    assert!(out.status.success(), "{out:?}");
    let j = json(&out);
    assert!(j["bytes_already_present"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(
        sha256_file(&local.join("h.bin")),
        sha256_file(&root.join("h.bin"))
    );
    assert!(leftovers(&local).is_empty());
}

#[test]
fn rest_with_ranges_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    write_prng_file(&dir.path().join("r.bin"), 1000, 1);
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    // Stream mode takes only REST OFFSET.
    assert!(c.cmd("REST 0-10,20-30").starts_with("350"));
    assert!(
        c.cmd("RETR r.bin").starts_with("504"),
        "ranges in stream mode"
    );
    assert!(c.cmd("MODE E").starts_with("200"));
    assert!(c.cmd("TYPE I").starts_with("200"));
    assert!(c.cmd("REST 0-2000").starts_with("350"));
    let r = c.cmd("RETR r.bin");
    assert!(r.starts_with("554") && r.contains("changed"), "{r}");
    assert!(c.cmd("REST 10-5").starts_with("501"));
    assert!(c.cmd("REST 0-10").starts_with("350"));
    assert!(c.cmd("STOR x").starts_with("504"), "ranges on an upload");
    assert!(c.cmd("NOOP").starts_with("200"));
}

#[test]
fn killed_uploads_resume_to_the_whole_file() {
    let mut rng = seed() | 1;
    let (_dir, root, local) = root_and_local();
    write_prng_file(&local.join("u.bin"), SIZE, 43);
    let srv = serve(&root, &[]);
    for p in ["4", "1", "auto"] {
        let url = format!("ftp://127.0.0.1:{}/u-{p}.bin", srv.port);
        let args = ["put", "-c", "-p", p, "--limit-rate", "4M", "u.bin", &url];
        // After each cut the server notices it and writes its last record.
        cut_three_times(&args, &local, &mut rng, Duration::from_millis(300));
        assert!(
            !root.join(format!("u-{p}.bin")).exists(),
            "-p {p}: a cut upload under its name"
        );
        let out = xftp(
            &["put", "-c", "-p", p, "--verify", "--json", "u.bin", &url],
            &local,
        );
        resumed_less_than_all(&out, p);
        assert_eq!(
            sha256_file(&root.join(format!("u-{p}.bin"))),
            sha256_file(&local.join("u.bin")),
            "-p {p}"
        );
    }
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

#[test]
fn a_changed_local_file_is_not_spliced_into_an_upload() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&local.join("v.bin"), SIZE, 44);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/v.bin", srv.port);
    let args = ["put", "-c", "-p", "4", "--limit-rate", "10M", "v.bin", &url];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    std::thread::sleep(Duration::from_millis(300));
    // Another version of the file, same size.
    write_prng_file(&local.join("v.bin"), SIZE, 45);
    let st = Command::new("touch")
        .args(["-d", "2001-02-03 04:05:06"])
        .arg(local.join("v.bin"))
        .status()
        .unwrap();
    assert!(st.success());
    // What the server holds of the earlier version is of no use: it is
    // deleted and the new version goes up whole, nothing spliced (and a
    // later -c is not refused for it forever).
    let out = xftp(&["put", "-c", "v.bin", &url], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("was of another version") && err.contains("from the start"),
        "{err}"
    );
    assert_eq!(
        sha256_file(&root.join("v.bin")),
        sha256_file(&local.join("v.bin"))
    );
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "no partial or record left: {left:?}");
}

/// Set `path`'s modification time to `secs` and `ms` milliseconds.
fn touch_at(path: &std::path::Path, secs: u64, ms: u64) {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms);
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(t))
        .unwrap();
}

#[test]
fn a_source_rewritten_within_the_same_second_is_not_spliced() {
    // Size and time to the second are the same before and after; the
    // milliseconds differ (the server's MDTM has them, the upload's
    // record has the local file's nanoseconds).
    let (_dir, root, local) = root_and_local();
    let srv = serve(&root, &[]);
    // A download.
    write_prng_file(&root.join("g.bin"), SIZE, 7);
    touch_at(&root.join("g.bin"), 1_795_985_000, 100);
    let url = format!("ftp://127.0.0.1:{}/g.bin", srv.port);
    let args = ["get", "-c", "-p", "4", "--limit-rate", "10M", &url, "g.bin"];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    write_prng_file(&root.join("g.bin"), SIZE, 8);
    touch_at(&root.join("g.bin"), 1_795_985_000, 900);
    let out = xftp(&["get", "-c", &url, "g.bin"], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("source changed"),
        "{err}"
    );
    assert!(!local.join("g.bin").exists());
    // An upload: the server's partial of the earlier version goes, and
    // the new one goes up whole.
    write_prng_file(&local.join("v.bin"), SIZE, 44);
    touch_at(&local.join("v.bin"), 1_795_985_000, 100);
    let url = format!("ftp://127.0.0.1:{}/v.bin", srv.port);
    let args = ["put", "-c", "-p", "4", "--limit-rate", "10M", "v.bin", &url];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    std::thread::sleep(Duration::from_millis(300));
    write_prng_file(&local.join("v.bin"), SIZE, 45);
    touch_at(&local.join("v.bin"), 1_795_985_000, 900);
    let out = xftp(&["put", "-c", "v.bin", &url], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("was of another version"), "{err}");
    assert_eq!(
        sha256_file(&root.join("v.bin")),
        sha256_file(&local.join("v.bin"))
    );
}

#[test]
fn a_tree_whose_file_changed_since_its_partial_says_how_to_go_on() {
    // `get -r -c` cut during its one large file, which then changes on
    // the server: every later -c run fails that file, and says which
    // partial to remove (as `get -c` of the file alone does).
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(root.join("t")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&root.join("t/b1"), SIZE, 3);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/t/", srv.port);
    let args = [
        "get",
        "-r",
        "-c",
        "-p",
        "4",
        "--limit-rate",
        "10M",
        &url,
        "t",
    ];
    assert!(xftp_killed(&args, &local, Duration::from_millis(900)));
    write_prng_file(&root.join("t/b1"), SIZE, 4);
    touch_at(&root.join("t/b1"), 1_000_000_000, 0);
    let out = xftp(&["get", "-r", "-c", &url, "t"], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("source changed") && err.contains("remove") && err.contains(".b1.xftp-part"),
        "{err}"
    );
}

#[test]
fn resumable_uploads_on_the_server_refuse_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let srv = serve(dir.path(), &[]);
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("SITE RANGES nothing").starts_with("550"));
    assert!(c.cmd("SITE RESUMABLE x 1").starts_with("501"));
    // Stream mode cannot be resumable.
    assert!(c.cmd("SITE RESUMABLE 10 1").starts_with("200"));
    assert!(c.cmd("STOR p").starts_with("504"));
    assert!(c.cmd("MODE E").starts_with("200"));
    assert!(c.cmd("TYPE I").starts_with("200"));
    // Ranges the server never recorded.
    assert!(c.cmd("SITE RESUMABLE 10 1").starts_with("200"));
    assert!(c.cmd("REST 0-5").starts_with("350"));
    let r = c.cmd("STOR p");
    assert!(r.starts_with("554") && r.contains("SITE RANGES"), "{r}");
    // REST ranges before a plain STOR.
    assert!(c.cmd("REST 0-5").starts_with("350"));
    assert!(c.cmd("STOR q").starts_with("504"));
    assert!(c.cmd("NOOP").starts_with("200"));
    // A name no file system holds is refused before anything is sent
    // (it went whole into the partial and failed at the rename).
    let local = tempfile::tempdir().unwrap();
    write_prng_file(&local.path().join("u.bin"), 300_000, 3);
    let long = "c".repeat(256);
    let url = format!("ftp://127.0.0.1:{}/{long}", srv.port);
    let out = xftp(&["put", "-c", "u.bin", &url], local.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("256 characters long"), "{err}");
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

/// A MODE E block: descriptor, count and offset (big-endian), payload.
fn mode_e_block(desc: u8, offset: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![desc];
    v.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// One writer per partial: a newer upload of it (a client's next run,
/// while the server still holds the last one) stops the older one, which
/// records what it stored first; the newer one keeps all of it. A complete
/// upload keeps its record (all ranges) until the partial is renamed or
/// deleted, so a client that missed the 226 finds nothing left to send.
#[test]
fn a_newer_upload_of_a_partial_takes_over_from_an_older_one() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let srv = serve(root, &[]);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let prep = |c: &mut Ctl| {
        assert!(c.cmd("TYPE I").starts_with("200"));
        assert!(c.cmd("MODE E").starts_with("200"));
        assert!(c.cmd("SITE RESUMABLE 300000 1").starts_with("200"));
    };
    // The older upload: the first 100 000 bytes, then silence, its data
    // connection left open (a client that is gone, unseen yet).
    let mut a = Ctl::login(srv.port);
    prep(&mut a);
    let mut da = stor_on(&mut a, "p");
    da.write_all(&mode_e_block(0, 0, &data[..100_000])).unwrap();
    // Its record names them within a checkpoint or two.
    let mut b = Ctl::login(srv.port);
    let mut ranges = String::new();
    for _ in 0..50 {
        ranges = b.cmd("SITE RANGES p");
        if ranges.contains("ranges=0-100000") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ranges.contains("ranges=0-100000"), "{ranges}");
    // The newer upload sends the rest and takes the partial over.
    prep(&mut b);
    assert!(b.cmd("REST 0-100000").starts_with("350"));
    let mut db = stor_on(&mut b, "p");
    // The older one was stopped, and says so.
    let r = a.reply();
    assert!(
        r.starts_with("426") && r.contains("a newer upload of this file took over"),
        "{r}"
    );
    db.write_all(&mode_e_block(0, 100_000, &data[100_000..]))
        .unwrap();
    db.write_all(&eof_and_eod()).unwrap();
    let r = b.reply();
    assert!(r.starts_with("226"), "{r}");
    drop((da, db));
    assert_eq!(std::fs::read(root.join("p")).unwrap(), data);
    // Complete, and recorded so until it is moved into place.
    let r = b.cmd("SITE RANGES p");
    assert!(r.contains("ranges=0-300000"), "{r}");
    assert!(b.cmd("RNFR p").starts_with("350"));
    assert!(b.cmd("RNTO q").starts_with("250"));
    assert!(b.cmd("SITE RANGES q").starts_with("550"));
    assert_eq!(std::fs::read(root.join("q")).unwrap(), data);
    assert!(leftovers_all(root).is_empty(), "{:?}", leftovers_all(root));

    // An older upload still waiting for its data connection (its client
    // gone before it opened one) is taken over too, at once.
    let mut a = Ctl::login(srv.port);
    prep(&mut a);
    let _ = a.epsv_port();
    assert!(a.cmd("STOR r").starts_with("150"));
    let mut b = Ctl::login(srv.port);
    prep(&mut b);
    let mut db = stor_on(&mut b, "r");
    let r = a.reply();
    assert!(r.starts_with("426") && r.contains("took over"), "{r}");
    db.write_all(&[mode_e_block(0, 0, &data), eof_and_eod()].concat())
        .unwrap();
    let r = b.reply();
    assert!(r.starts_with("226"), "{r}");
    assert_eq!(std::fs::read(root.join("r")).unwrap(), data);
}

/// `STOR name` in passive mode: its data connection, once the 150 came.
fn stor_on(c: &mut Ctl, name: &str) -> std::net::TcpStream {
    let port = c.epsv_port();
    c.w_line(&format!("STOR {name}"));
    let d = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let r = c.reply();
    assert!(r.starts_with("150"), "{r}");
    d
}

/// The end of a one-connection MODE E transfer: EOF (one EOD), then EOD.
fn eof_and_eod() -> Vec<u8> {
    [mode_e_block(0x40, 1, &[]), mode_e_block(0x08, 0, &[])].concat()
}

/// Every file in `d` but the uploads' final names, `q` and `r`.
fn leftovers_all(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "q" && n != "r")
        .collect()
}

/// The temporary of an upload whose server died (killed mid-upload: no
/// one holds it locked, untouched for long) is removed by the next upload
/// into its directory; a client's resumable partial is not.
#[test]
fn a_dead_uploads_temporary_is_swept_by_the_next_upload_there() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    let dead = root.join("sub/.big.iso.xftp-part-0123456789abcdef");
    let partial = root.join("sub/.other.xftp-part");
    for p in [&dead, &partial] {
        std::fs::write(p, vec![1u8; 4096]).unwrap();
        let st = Command::new("touch")
            .args(["-d", "2001-02-03 04:05:06"])
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    }
    write_prng_file(&local.join("n.bin"), 1000, 3);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/sub/n.bin", srv.port);
    let out = xftp(&["put", "n.bin", &url], &local);
    assert!(out.status.success(), "{out:?}");
    // Swept off the session's threads: give it a moment.
    for _ in 0..50 {
        if !dead.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!dead.exists(), "the dead upload's temporary is still there");
    assert!(partial.exists());
    assert!(root.join("sub/n.bin").exists());
}

/// RNTO and DELE take a resumable upload's record along, and only a
/// record: a user's own `NAME.ranges` beside `NAME` stays.
#[test]
fn rename_and_delete_leave_a_users_ranges_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("data"), b"1,2,3").unwrap();
    std::fs::write(root.join("data.ranges"), b"0-10\n").unwrap();
    std::fs::write(root.join("more"), b"x").unwrap();
    std::fs::write(root.join("more.ranges"), b"mine").unwrap();
    let srv = serve(root, &[]);
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("RNFR data").starts_with("350"));
    assert!(c.cmd("RNTO data2").starts_with("250"));
    assert!(c.cmd("DELE more").starts_with("250"));
    assert_eq!(std::fs::read(root.join("data.ranges")).unwrap(), b"0-10\n");
    assert_eq!(std::fs::read(root.join("more.ranges")).unwrap(), b"mine");
    // Nor does a resumable upload write its record over one.
    assert!(c.cmd("TYPE I").starts_with("200"));
    assert!(c.cmd("MODE E").starts_with("200"));
    assert!(c.cmd("SITE RESUMABLE 10 1").starts_with("200"));
    let r = c.cmd("STOR data");
    assert!(r.starts_with("553") && r.contains("another name"), "{r}");
    assert_eq!(std::fs::read(root.join("data.ranges")).unwrap(), b"0-10\n");
}

/// The same against `xftp serve`: the reset upload is dropped, and a file
/// already under the target's name stays as it was.
#[test]
fn an_upload_of_a_file_that_changes_leaves_the_old_copy_on_an_xftp_server() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local) = (dir.path().join("root"), dir.path().join("local"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(root.join("t.bin"), b"the old copy").unwrap();
    let srv = serve(&root, &[]);
    let out = support::put_while_changing(
        &local,
        &format!("ftp://127.0.0.1:{}/t.bin", srv.port),
        |p| support::shrink(p, 3_000_000),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the local file changed") && err.contains("holds nothing"),
        "{err}"
    );
    assert_eq!(std::fs::read(root.join("t.bin")).unwrap(), b"the old copy");
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

/// A name of 240 bytes (80 CJK characters) fits a file name, but its
/// partial's record (`.NAME.xftp-part.ranges`) would not: the partials
/// of long names are shortened, both ways.
#[test]
fn resumable_transfers_of_a_long_name_work() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local) = (dir.path().join("root"), dir.path().join("local"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    let name = "\u{65e5}".repeat(80);
    write_prng_file(&root.join(&name), 300_003, 5);
    write_prng_file(&local.join(format!("u{name}")), 200_003, 6);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let u = format!("u{name}");
    let (get, put) = (format!("{base}/{name}"), format!("{base}/{u}"));
    for args in [["get", "-c", &get, "."], ["put", "-c", &u, &put]] {
        let out = xftp(&args, &local);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        sha256_file(&local.join(&name)),
        sha256_file(&root.join(&name))
    );
    assert_eq!(sha256_file(&root.join(&u)), sha256_file(&local.join(&u)));
}

/// A -c transfer refused for good (over the upload limit, a missing
/// file) does not say that what arrived is kept for the next run.
#[test]
fn a_refused_resumable_transfer_does_not_promise_a_partial() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local) = (dir.path().join("root"), dir.path().join("local"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&local.join("u"), 300_000, 3);
    let srv = serve(&root, &["--max-upload-size", "100k"]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    let put = xftp(&["put", "-c", "u", &format!("{base}/u")], &local);
    let get = xftp(&["get", "-c", &format!("{base}/missing")], &local);
    for (what, out, code) in [("put", put, "552"), ("get", get, "550")] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(code), "{what}: {err}");
        assert!(
            !err.contains("kept") && !err.contains("keeps"),
            "{what}: {err}"
        );
    }
    assert!(!local.join(".missing.xftp-part").exists());
}

#[test]
fn a_partial_that_is_too_long_or_wrong_never_goes_into_place() {
    let (_dir, root, local) = root_and_local();
    let len: u64 = 1_000_003;
    write_prng_file(&root.join("f.bin"), len, 21);
    set_time(&root.join("f.bin"), old_time());
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/f.bin", srv.port);
    let partial = local.join(".f.bin.xftp-part");
    // A partial longer than the file (an earlier, larger version's,
    // its record lost): cut to the file's size, not renamed with its tail.
    std::fs::write(&partial, vec![7u8; 3_000_000]).unwrap();
    let out = xftp(&["get", "-c", "-p", "4", &url, "f.bin"], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::metadata(local.join("f.bin")).unwrap().len(), len);
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
    std::fs::remove_file(local.join("f.bin")).unwrap();
    // A partial whose record says it is whole, with other bytes: --verify
    // finds it, and it goes, so that no later -c puts it in place.
    std::fs::write(&partial, vec![7u8; len as usize]).unwrap();
    let record = serde_json::json!({
        "version": 1,
        "source": format!("127.0.0.1:{}/f.bin", srv.port),
        "size": len,
        "mdtm": "20010909014640",
        "ranges": [[0, len]],
    });
    std::fs::write(local.join(".f.bin.xftp-part.ranges"), record.to_string()).unwrap();
    let out = xftp(&["get", "-c", "--verify", &url, "f.bin"], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("not kept") && !err.contains("with -c"),
        "{err}"
    );
    assert_eq!(leftovers(&local), Vec::<String>::new(), "{err}");
    let out = xftp(&["get", "-c", &url, "f.bin"], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
}

#[test]
fn a_servers_partial_longer_than_the_file_is_cut_when_the_upload_resumes() {
    let (_dir, root, local) = root_and_local();
    write_prng_file(&local.join("w.bin"), SIZE, 46);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/w.bin", srv.port);
    let args = ["put", "-c", "-p", "4", "--limit-rate", "10M", "w.bin", &url];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    std::thread::sleep(Duration::from_millis(300));
    // A tail past the file's size in the server's partial (its record
    // still names what arrived): the resumed upload must not keep it.
    let part = root.join(".w.bin.xftp-part");
    let f = std::fs::File::options().write(true).open(&part).unwrap();
    f.set_len(SIZE + 1).unwrap();
    drop(f);
    let out = xftp(&["put", "-c", "w.bin", &url], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&root.join("w.bin")),
        sha256_file(&local.join("w.bin"))
    );
}

/// `get -r -c` and `put -r -c` skip a copy of the same size and time, to
/// the millisecond `xftp serve` tells: a file rewritten within the same
/// second, same size, moves again; with `--verify` a copy whose bytes
/// differ under the same size and time moves again too.
#[test]
fn trees_tell_a_file_rewritten_within_the_same_second() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(root.join("t")).unwrap();
    std::fs::create_dir_all(local.join("u")).unwrap();
    write_prng_file(&root.join("t/a"), 70_001, 1);
    write_prng_file(&root.join("t/b"), 70_001, 5);
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/t/", srv.port);
    let get = || {
        let out = xftp(&["get", "-r", "-c", &url, "t"], &local);
        assert!(out.status.success(), "{out:?}");
    };
    get();
    let was = std::fs::metadata(root.join("t/a"))
        .unwrap()
        .modified()
        .unwrap();
    write_prng_file(&root.join("t/a"), 70_001, 3);
    set_time(&root.join("t/a"), within_second(was));
    get();
    for f in ["a", "b"] {
        assert_eq!(
            sha256_file(&local.join("t").join(f)),
            sha256_file(&root.join("t").join(f)),
            "{f}"
        );
    }
    // The other way.
    write_prng_file(&local.join("u/c"), 70_001, 7);
    let up = format!("ftp://127.0.0.1:{}/u/", srv.port);
    let put = || {
        let out = xftp(&["put", "-r", "-c", "u", &up], &local);
        assert!(out.status.success(), "{out:?}");
    };
    put();
    let was = std::fs::metadata(local.join("u/c"))
        .unwrap()
        .modified()
        .unwrap();
    write_prng_file(&local.join("u/c"), 70_001, 9);
    set_time(&local.join("u/c"), within_second(was));
    put();
    assert_eq!(
        sha256_file(&root.join("u/c")),
        sha256_file(&local.join("u/c"))
    );
    // Other bytes under the same size and time: skipped by -c alone, found
    // by -c --verify and moved again, both ways.
    let t_b = std::fs::metadata(local.join("t/b"))
        .unwrap()
        .modified()
        .unwrap();
    write_prng_file(&local.join("t/b"), 70_001, 11);
    set_time(&local.join("t/b"), t_b);
    get();
    assert_ne!(
        sha256_file(&local.join("t/b")),
        sha256_file(&root.join("t/b"))
    );
    let out = xftp(&["get", "-r", "-c", "--verify", &url, "t"], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&local.join("t/b")),
        sha256_file(&root.join("t/b"))
    );
    let t_c = std::fs::metadata(root.join("u/c"))
        .unwrap()
        .modified()
        .unwrap();
    write_prng_file(&root.join("u/c"), 70_001, 13);
    set_time(&root.join("u/c"), t_c);
    let out = xftp(&["put", "-r", "-c", "--verify", "u", &up], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256_file(&root.join("u/c")),
        sha256_file(&local.join("u/c"))
    );
}

/// `put -c` of a file that is empty now, after a cut `put -c` of an
/// earlier version: the empty file goes in place and the earlier
/// version's partial (with its record) does not stay behind for good.
#[test]
fn an_empty_file_put_with_c_removes_an_earlier_versions_partial() {
    let (_dir, root, local) = root_and_local();
    let srv = serve(&root, &[]);
    write_prng_file(&local.join("z.bin"), SIZE, 31);
    let url = format!("ftp://127.0.0.1:{}/z.bin", srv.port);
    let args = ["put", "-c", "-p", "4", "--limit-rate", "10M", "z.bin", &url];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!leftovers(&root).is_empty(), "a partial to begin with");
    std::fs::write(local.join("z.bin"), b"").unwrap();
    let out = xftp(&["put", "-c", "z.bin", &url], &local);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read(root.join("z.bin")).unwrap(), b"");
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
}

/// Two files of one size given one modification time (an archive's,
/// `cp -p`'s): a cut `put -c` of the first, then `put -c` of the second
/// under the same local name, is not resumed into a splice of the two.
#[test]
fn another_file_of_the_same_size_and_time_is_not_spliced_into_an_upload() {
    let (_dir, root, local) = root_and_local();
    let srv = serve(&root, &[]);
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_577_836_800);
    write_prng_file(&local.join("data.bin"), SIZE, 41);
    write_prng_file(&local.join("other.bin"), SIZE, 43);
    set_time(&local.join("data.bin"), t);
    set_time(&local.join("other.bin"), t);
    let url = format!("ftp://127.0.0.1:{}/data.bin", srv.port);
    let args = [
        "put",
        "-c",
        "-p",
        "4",
        "--limit-rate",
        "10M",
        "data.bin",
        &url,
    ];
    assert!(xftp_killed(&args, &local, Duration::from_millis(700)));
    std::thread::sleep(Duration::from_millis(300));
    std::fs::rename(local.join("other.bin"), local.join("data.bin")).unwrap();
    let out = xftp(&["put", "-c", "data.bin", &url], &local);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("was of another version"), "{err}");
    assert_eq!(
        sha256_file(&root.join("data.bin")),
        sha256_file(&local.join("data.bin"))
    );
}

/// `put -c` over an existing file replaces it as `put` does: the replaced
/// file's permission bits are kept (it made a 0600 file 0644).
#[test]
fn a_resumable_upload_keeps_the_replaced_files_mode() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, root, local) = root_and_local();
    write_prng_file(&local.join("m.bin"), SIZE, 46);
    std::fs::write(root.join("m.bin"), b"old").unwrap();
    std::fs::set_permissions(root.join("m.bin"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let srv = serve(&root, &[]);
    let url = format!("ftp://127.0.0.1:{}/m.bin", srv.port);
    let out = xftp(&["put", "-c", "m.bin", &url], &local);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sha256_file(&root.join("m.bin")),
        sha256_file(&local.join("m.bin"))
    );
    let mode = std::fs::metadata(root.join("m.bin"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}
