//! `--retries`: a transfer whose server dies mid-way (SIGKILL) and comes
//! back on the same port a second later completes in the same command,
//! the later runs moving only what is missing (`-c`); a tree runs again
//! over the files that failed; a refusal is not run again.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod support;
use support::{assert_same_tree, free_port, json, s, sha256_file, wait_listening, write_prng_file};

const SIZE: u64 = 24 << 20;

/// `xftp serve` on 127.0.0.1:`port`, killed (SIGKILL) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_on(root: &Path, port: u16) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["serve", "--root", s(root), "--anonymous-write", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn xftp serve");
    wait_listening(&mut child, port, "xftp serve", String::new);
    Server(child)
}

/// Bytes in the files under `dir` (hidden ones too), recursively.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// Run xftp in `cwd` with `args`; once `watch` holds a few MiB more than
/// before (the transfer is under way; 20 s at most), kill its server
/// (SIGKILL), and start it again on the same port a second later.
fn through_a_crash(args: &[&str], cwd: &Path, root: &Path, port: u16, watch: &Path) -> Output {
    let before = bytes_under(watch);
    let srv = serve_on(root, port);
    let child = support::spawn_xftp(args, cwd);
    let t0 = std::time::Instant::now();
    while bytes_under(watch) < before + (3 << 20) && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(srv);
    std::thread::sleep(Duration::from_secs(1));
    let _srv = serve_on(root, port);
    child.wait_with_output().expect("wait for xftp")
}

/// The options every run here shares: slow enough to be cut, retries
/// enough to outlast the restart (0.3 + 0.6 + 1.2 + ... s).
const SLOW: [&str; 8] = [
    "--limit-rate",
    "8M",
    "--timeout",
    "5",
    "--retries",
    "6",
    "--retry-wait",
    "0.3",
];

fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let local = dir.path().join("local");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    (dir, root, local)
}

fn ran_again(out: &Output) -> serde_json::Value {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("trying again in"), "{err}");
    let j = json(out);
    assert!(j["runs"].as_u64().unwrap_or(1) >= 2, "{j}\n{err}");
    j
}

#[test]
fn a_download_outlives_its_server_crash() {
    let (_d, root, local) = dirs();
    write_prng_file(&root.join("f.bin"), SIZE, 1);
    let port = free_port();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let mut args = vec!["get", "-c", "-p", "4", "--json", &url, "f.bin"];
    args.extend(SLOW);
    let out = through_a_crash(&args, &local, &root, port, &local);
    let j = ran_again(&out);
    assert!(j["bytes_already_present"].as_u64().unwrap_or(0) > 0, "{j}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
}

#[test]
fn an_upload_outlives_its_server_crash() {
    let (_d, root, local) = dirs();
    write_prng_file(&local.join("u.bin"), SIZE, 2);
    let port = free_port();
    let url = format!("ftp://127.0.0.1:{port}/u.bin");
    let mut args = vec!["put", "-c", "-p", "4", "--json", "u.bin", &url];
    args.extend(SLOW);
    let out = through_a_crash(&args, &local, &root, port, &root);
    ran_again(&out);
    assert_eq!(
        sha256_file(&local.join("u.bin")),
        sha256_file(&root.join("u.bin"))
    );
}

#[test]
fn a_download_without_c_starts_over_and_completes() {
    let (_d, root, local) = dirs();
    write_prng_file(&root.join("f.bin"), SIZE, 3);
    let port = free_port();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let mut args = vec!["get", "-p", "2", "--json", &url, "f.bin"];
    args.extend(SLOW);
    let out = through_a_crash(&args, &local, &root, port, &local);
    let j = ran_again(&out);
    assert!(j.get("bytes_already_present").is_none(), "{j}");
    assert_eq!(j["bytes"].as_u64(), Some(SIZE), "{j}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("from the start"), "{err}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
}

#[test]
fn a_tree_runs_again_over_the_files_that_failed() {
    let (_d, root, local) = dirs();
    let top = root.join("tree");
    std::fs::create_dir_all(top.join("sub")).unwrap();
    for i in 0..6u64 {
        write_prng_file(&top.join(format!("sub/big{i}")), 5 << 20, 10 + i);
        write_prng_file(&top.join(format!("small{i}")), 1000 + i, 20 + i);
    }
    let port = free_port();
    let url = format!("ftp://127.0.0.1:{port}/tree/");
    let mut args = vec!["get", "-r", "-c", "-p", "2", "--json", &url, "copy"];
    args.extend(SLOW);
    let out = through_a_crash(&args, &local, &root, port, &local);
    let j = ran_again(&out);
    assert_eq!(j["failed"].as_array().map(Vec::len), Some(0), "{j}");
    // Every file counted once, none skipped: the later runs took only
    // the files that had failed.
    assert_eq!(
        (j["files"].as_u64(), j["skipped"].as_u64()),
        (Some(12), Some(0)),
        "{j}"
    );
    assert_same_tree(&top, &local.join("copy"));
}

#[test]
fn a_tree_upload_runs_again_over_the_files_that_failed() {
    let (_d, root, local) = dirs();
    let top = local.join("tree");
    std::fs::create_dir_all(top.join("sub")).unwrap();
    for i in 0..6u64 {
        write_prng_file(&top.join(format!("sub/big{i}")), 5 << 20, 30 + i);
        write_prng_file(&top.join(format!("small{i}")), 1000 + i, 40 + i);
    }
    let port = free_port();
    let url = format!("ftp://127.0.0.1:{port}/up/");
    // No -c: only what failed goes again, whole.
    let mut args = vec!["put", "-r", "-p", "2", "--json", "tree", &url];
    args.extend(SLOW);
    let out = through_a_crash(&args, &local, &root, port, &root);
    let j = ran_again(&out);
    assert_eq!(j["failed"].as_array().map(Vec::len), Some(0), "{j}");
    assert_eq!(
        (j["files"].as_u64(), j["skipped"].as_u64()),
        (Some(12), Some(0)),
        "{j}"
    );
    // The server's temporaries of the uploads its crash cut
    // (`.NAME.xftp-part-*`, which a killed process cannot remove) aside,
    // the trees are the same.
    for d in ["up", "up/sub"] {
        for e in std::fs::read_dir(root.join(d)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".xftp-part-") {
                std::fs::remove_file(e.path()).unwrap();
            }
        }
    }
    assert_same_tree(&top, &root.join("up"));
}

#[test]
fn a_refusal_is_not_run_again() {
    let (_d, root, local) = dirs();
    let port = free_port();
    let _srv = serve_on(&root, port);
    let url = format!("ftp://127.0.0.1:{port}/missing.bin");
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", "--retries", "5", "--retry-wait", "5", "--json", &url])
        .current_dir(&local)
        .env("HOME", &local)
        .stdin(Stdio::null())
        .output()
        .expect("run xftp");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("550"), "{err}");
    assert!(!err.contains("trying again"), "{err}");
    assert!(json(&out).get("runs").is_none(), "{err}");
}

#[test]
fn retry_wait_out_of_range_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", "--retry-wait", "61", "ftp://127.0.0.1:1/x"])
        .stdin(Stdio::null())
        .output()
        .expect("run xftp");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("number of seconds from 0 to 60"), "{err}");
}
