//! The multi-stream acceptance matrix: sizes 0, 1, record size − 1, record
//! size, record size + 1 and 100 MiB + 13 B; N in {1, 2, 3, 8, 64}; upload
//! and download; passive, active and MPRT data connections. Every file is
//! compared by SHA-256 at both ends, and the JSON must say how many
//! connections were used (N, or one per record for a file with fewer).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use sha2::{Digest, Sha256};

const RS: usize = 256 * 1024;

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

fn serve() -> Server {
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--anonymous-write",
            "--max-streams",
            "64",
        ])
        .arg("--record-size")
        .arg(RS.to_string())
        .arg("--root")
        .arg(root.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    Server { child, port, root }
}

fn make_file(path: &Path, len: usize, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut left = len;
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        let n = left.min(8);
        f.write_all(&b[..n]).unwrap();
        left -= n;
    }
    f.flush().unwrap();
}

fn sha(path: &Path) -> Vec<u8> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
    h.finalize().to_vec()
}

fn xftp(args: &[String]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "xftp {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("xftp {args:?}: bad JSON {e}"))
}

#[test]
fn sizes_by_streams_by_direction_by_connection_form() {
    let srv = serve();
    let local = tempfile::tempdir().unwrap();
    let sizes = [0, 1, RS - 1, RS, RS + 1, 100 * 1024 * 1024 + 13];
    for (i, len) in sizes.into_iter().enumerate() {
        let src = local.path().join(format!("src{i}"));
        make_file(&src, len, 100 + i as u64);
        let want = sha(&src);
        for n in [1u32, 2, 3, 8, 64] {
            for form in ["passive", "active", "mprt"] {
                let name = format!("f{i}-{n}-{form}");
                let url = format!("ftp://127.0.0.1:{}/{name}", srv.port);
                let mut common = vec!["-p".to_string(), n.to_string(), "--json".to_string()];
                if form != "passive" {
                    common.push(format!("--{form}"));
                }
                let mut put = vec!["put".to_string(), src.display().to_string(), url.clone()];
                put.extend(common.clone());
                let j = xftp(&put);
                assert_eq!(j["bytes"], len as u64, "{put:?}: {j}");
                assert_eq!(sha(&srv.root.path().join(&name)), want, "{put:?}");
                let down = local.path().join(format!("{name}.down"));
                let mut get = vec!["get".to_string(), url, down.display().to_string()];
                get.extend(common);
                let j = xftp(&get);
                assert_eq!(j["bytes"], len as u64, "{get:?}: {j}");
                assert_eq!(sha(&down), want, "{get:?}");
                // Data connections used: N (a plain transfer uses one), but
                // no more than the file has records of the server's
                // smallest size (16 KiB) except with MPRT, whose ports go
                // out before the size is known.
                let used = if form == "mprt" {
                    u64::from(n)
                } else {
                    (len as u64).div_ceil(16 * 1024).clamp(1, u64::from(n))
                };
                assert_eq!(j["streams"], used, "{get:?}: {j}");
                std::fs::remove_file(&down).unwrap();
                std::fs::remove_file(srv.root.path().join(&name)).unwrap();
            }
        }
    }
}
