//! Helpers shared by the integration tests of the `xftp` binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// `xftp serve` on 127.0.0.1:0, ended by PID when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `xftp serve --root ROOT --listen 127.0.0.1:0 --anonymous-write EXTRA..`
/// and wait for its `listening on HOST:PORT` line.
pub fn serve(root: &Path, extra: &[&str]) -> Server {
    serve_with(root, &[&["--anonymous-write"], extra].concat())
}

/// `xftp serve` on 127.0.0.1 with `args` alone (no anonymous login unless
/// they ask for it).
pub fn serve_with(root: &Path, args: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xftp"));
    cmd.args(["serve", "--root"])
        .arg(root)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stderr(Stdio::null());
    serve_spawned(&mut cmd)
}

/// Spawn `cmd`, an `xftp serve` however started (under `ulimit`, through
/// `setpriv`), and wait for its `listening on HOST:PORT` line.
pub fn serve_spawned(cmd: &mut Command) -> Server {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn xftp serve");
    let stdout = child.stdout.take().expect("stdout piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    let mut server = Server { child, port: 0 };
    server.port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no `listening on HOST:PORT` line: {line:?}"));
    server
}

/// A file of `len` deterministic pseudo-random bytes (xorshift*).
pub fn write_prng_file(path: &Path, len: u64, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = seed | 1;
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        for chunk in buf[..n].chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

/// SHA-256 of a file.
pub fn sha256_file(path: &Path) -> [u8; 32] {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).unwrap();
    h.finalize().into()
}

/// Debian's pyftpdlib lives in the system Python.
pub const PYTHON: &str = "/usr/bin/python3";

/// A pyftpdlib server on 127.0.0.1, ended by PID when dropped.
pub struct Pyftpd {
    pub child: Child,
    pub port: u16,
}

impl Drop for Pyftpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// True when pyftpdlib is there; otherwise skip (or fail under
/// XFTP_REQUIRE_PEERS=1).
pub fn have_pyftpdlib(test: &str) -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import pyftpdlib"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("{test}: {PYTHON} cannot import pyftpdlib and XFTP_REQUIRE_PEERS=1 (apt-get install python3-pyftpdlib)");
        }
        eprintln!(
            "SKIP {test}: {PYTHON} cannot import pyftpdlib (apt-get install python3-pyftpdlib)"
        );
    }
    ok
}

/// Start a process that logs `starting FTP server on 127.0.0.1:PORT` on
/// stderr; keep draining its stderr so it never blocks on a full pipe.
pub fn spawn_logging_server(mut cmd: Command) -> Pyftpd {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pyftpdlib");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            // "starting FTP server on ..." (pyftpdlib's TLS handler: "FTP+SSL").
            let Some(rest) = line
                .split("starting FTP server on 127.0.0.1:")
                .nth(1)
                .or_else(|| line.split("starting FTP+SSL server on 127.0.0.1:").nth(1))
            else {
                continue;
            };
            {
                let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let (Some(tx), Ok(p)) = (tx.take(), port.parse::<u16>()) {
                    let _ = tx.send(p);
                }
            }
        }
    });
    let mut server = Pyftpd { child, port: 0 };
    server.port = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("pyftpdlib did not report its port within 20 s");
    server
}

/// A line-at-a-time control connection.
pub struct Ctl {
    w: std::net::TcpStream,
    r: BufReader<std::net::TcpStream>,
}

impl Ctl {
    pub fn login(port: u16) -> Ctl {
        let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = Ctl {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        };
        assert!(c.reply().starts_with("220"));
        assert!(c.cmd("USER anonymous").starts_with("331"));
        assert!(c.cmd("PASS x@y").starts_with("230"));
        c
    }

    /// The last line of the reply (multi-line replies included).
    pub fn reply(&mut self) -> String {
        let mut all = String::new();
        loop {
            let mut line = String::new();
            assert!(self.r.read_line(&mut line).unwrap() > 0, "closed");
            all.push_str(&line);
            let b = line.as_bytes();
            if b.len() >= 4 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b' ' {
                return all;
            }
        }
    }

    pub fn cmd(&mut self, c: &str) -> String {
        self.w_line(c);
        self.reply()
    }

    /// Send a command line without waiting for its reply.
    pub fn w_line(&mut self, c: &str) {
        self.w.write_all(format!("{c}\r\n").as_bytes()).unwrap();
    }

    /// EPSV, and the data port its 229 reply names.
    pub fn epsv_port(&mut self) -> u16 {
        let r = self.cmd("EPSV");
        r.split("|||")
            .nth(1)
            .and_then(|x| x.split('|').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in the EPSV reply: {r}"))
    }
}

/// Give `p` (recursively) to the `ftp` user that the stock servers'
/// anonymous sessions run as.
pub fn chown_ftp(p: &Path) {
    let st = Command::new("chown")
        .args(["-R", "ftp:ftp"])
        .arg(p)
        .status()
        .unwrap();
    assert!(
        st.success(),
        "chown ftp:ftp {} (is there an ftp user?)",
        p.display()
    );
}

/// Run the xftp binary in `cwd`, with `cwd` as HOME (its path cache) and no
/// XFTP_PASSWORD from the environment.
pub fn xftp_in(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .env_remove("XFTP_PASSWORD")
        .env("HOME", cwd)
        .output()
        .expect("run xftp")
}

/// `out`, after checking that it succeeded (its output in the message if not).
pub fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// A path as UTF-8.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A tree with what LIST makes hard: hidden names, blanks in names,
/// nested and empty directories, modes.
pub fn make_odd_tree(top: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(top.join("a/b/c")).unwrap();
    std::fs::create_dir_all(top.join("empty dir")).unwrap();
    std::fs::create_dir_all(top.join(".hidden dir")).unwrap();
    let files = [
        ("top.bin", 200_000u64),
        ("a/one two.txt", 13),
        ("a/b/zero", 0),
        ("a/b/c/deep.bin", 1 << 20),
        (".dotfile", 7),
        (".hidden dir/x", 99),
        ("Jan 5 12:00 odd", 5),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        write_prng_file(&top.join(name), *len, 77 + i as u64);
    }
    std::fs::set_permissions(
        top.join("a/one two.txt"),
        std::fs::Permissions::from_mode(0o754),
    )
    .unwrap();
}

/// Every file under `a` and `b` the same (bytes and permission bits), and
/// the same directories.
pub fn assert_same_tree(a: &Path, b: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut names = Vec::new();
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        names.push(e.file_name());
        let (pa, pb) = (e.path(), b.join(e.file_name()));
        assert!(pb.exists(), "{} missing", pb.display());
        if e.file_type().unwrap().is_dir() {
            assert!(pb.is_dir(), "{} is not a directory", pb.display());
            assert_same_tree(&pa, &pb);
        } else {
            assert_eq!(sha256_file(&pa), sha256_file(&pb), "{}", pb.display());
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&pa), mode(&pb), "mode of {}", pb.display());
        }
    }
    let n = std::fs::read_dir(b).unwrap().count();
    assert_eq!(n, names.len(), "{} has other entries", b.display());
}

/// The JSON object an `xftp --json` run printed.
pub fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("bad JSON {text:?}: {e}"))
}

/// A loopback port free a moment ago, for a server that takes its port
/// on the command line.
/// A port for a server that takes its port as a number (vsftpd,
/// ProFTPD, ...): free now, and below the kernel's ephemeral range, so
/// that no other test's passive listener or outgoing connection takes it
/// before the server binds it (a vsftpd's passive port once did, and the
/// server started on it could not listen).
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.max(10_100));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 32);
    for _ in 0..1000 {
        // xorshift: a different start in each test and process.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = from + (x % u64::from(to - from)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait (10 s at most) until `child`, a server started for a test, takes
/// connections on 127.0.0.1:`port`; if it exits first, panic with
/// `detail()` (its configuration, its log).
pub fn wait_listening(child: &mut Child, port: u16, what: &str, detail: impl Fn() -> String) {
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("{what} exited at once ({st}): {}", detail());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what} did not listen on {port} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `xftp ARGS` in `cwd` and SIGKILL it after `after`; whether it was
/// still running then (cut).
pub fn xftp_killed(args: &[&str], cwd: &Path, after: Duration) -> bool {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn xftp");
    std::thread::sleep(after);
    let killed = matches!(child.try_wait(), Ok(None));
    let _ = child.kill();
    let _ = child.wait();
    killed
}

/// Start `xftp ARGS` in `cwd` (HOME there too, so its path cache is the
/// test's), stdout and stderr piped.
pub fn spawn_xftp(args: &[&str], cwd: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .env("HOME", cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xftp")
}

/// `xftp put -p 1 --limit-rate 4M LOCAL URL` in `cwd`, with `change`
/// done to LOCAL (12 MB) after 0.6 s, mid-transfer: what the upload
/// then says.
pub fn put_while_changing(cwd: &Path, url: &str, change: impl FnOnce(&Path)) -> Output {
    let local = cwd.join("changing.bin");
    write_prng_file(&local, 12_000_000, 77);
    let child = spawn_xftp(
        &["put", "-p", "1", "--limit-rate", "4M", "changing.bin", url],
        cwd,
    );
    std::thread::sleep(Duration::from_millis(600));
    change(&local);
    child.wait_with_output().expect("wait for xftp put")
}

/// Cut `path` to `len` bytes in place (a file shrinking under a reader).
pub fn shrink(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap()
}

/// Run `xftp ARGS` in `cwd` and send it SIGINT after `after`: its output,
/// and whether it was still running when the signal went.
pub fn xftp_interrupted(args: &[&str], cwd: &Path, after: Duration) -> (Output, bool) {
    let child = spawn_xftp(args, cwd);
    std::thread::sleep(after);
    let pid = child.id().to_string();
    let running = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .is_ok_and(|s| s.success());
    (child.wait_with_output().expect("wait for xftp"), running)
}

/// Kills a child process (ours, by PID) when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether emulated links can be made here (root, /dev/net/tun); if not,
/// says why `test` is skipped, or fails under XFTP_REQUIRE_PEERS=1 (CI).
pub fn netem_ready(test: &str) -> bool {
    match xftp_netem::Link::preflight() {
        Ok(()) => true,
        Err(e) => {
            let msg = format!("skipping the {test} test: {e}");
            if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
                panic!("{msg} (XFTP_REQUIRE_PEERS=1)");
            }
            eprintln!("{msg}");
            false
        }
    }
}

/// `xftp serve --listen 198.18.0.2:2121 --root root` (and `args`) in the
/// B namespace of `link`, once it says it listens; ended by PID when
/// dropped.
pub fn serve_in_b(link: &xftp_netem::Link, root: &Path, args: &[&str]) -> KillOnDrop {
    let mut server = link.command_b(env!("CARGO_BIN_EXE_xftp"));
    server
        .args(["serve", "--listen", "198.18.0.2:2121", "--root"])
        .arg(root)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut server = KillOnDrop(server.spawn().expect("spawn xftp serve"));
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the listening line");
    assert!(line.contains("listening"), "{line:?}");
    server
}

/// `xftp shell URL` in `cwd` (also its HOME), `script` on its stdin.
pub fn shell_script(url: &str, cwd: &Path, script: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["shell", url])
        .current_dir(cwd)
        .env("HOME", cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xftp shell");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .expect("write the script");
    child.wait_with_output().expect("xftp shell")
}
