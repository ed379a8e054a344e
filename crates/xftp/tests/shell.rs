//! `xftp shell` against `xftp serve`: a script from a pipe (every command,
//! files checked by SHA-256, the first failing command ends the script and
//! is named by line), and an interactive session on a pseudo-terminal under
//! script(1) and under tmux (the prompt, a get, a password prompt that
//! echoes nothing, the history file).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod support;
use support::{serve, sha256_file, write_prng_file, xftp_killed};

const XFTP: &str = env!("CARGO_BIN_EXE_xftp");

/// Run `xftp shell ARGS` with `script` on stdin; killed after 120 s.
fn run_script(args: &[&str], script: &str, cwd: &Path, cache: &Path) -> Output {
    run_paced(args, &[script], Duration::ZERO, cwd, cache)
}

/// [`run_script`] with the script in `chunks`, `pause` between them.
fn run_paced(args: &[&str], chunks: &[&str], pause: Duration, cwd: &Path, cache: &Path) -> Output {
    let mut child = Command::new(XFTP)
        .arg("shell")
        .args(args)
        .current_dir(cwd)
        .env_remove("XFTP_PASSWORD")
        .env("XDG_CACHE_HOME", cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xftp shell");
    let mut stdin = child.stdin.take().unwrap();
    let chunks: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
    let feeder = std::thread::spawn(move || {
        for (i, c) in chunks.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            if stdin.write_all(c.as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("xftp shell did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = feeder.join();
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_script_from_a_pipe_runs_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    for d in [&root, &local, &local.join("down")] {
        std::fs::create_dir_all(d).unwrap();
    }
    write_prng_file(&root.join("big.bin"), 3_000_017, 1);
    write_prng_file(&root.join("other.bin"), 70_000, 2);
    write_prng_file(&local.join("up1.dat"), 1_234_567, 3);
    write_prng_file(&local.join("up2.dat"), 654_321, 4);
    std::fs::write(local.join("notes.txt"), b"remember the milk\r\n").unwrap();
    std::fs::write(local.join("my file.txt"), b"a name with a space").unwrap();
    let srv = serve(&root, &[]);

    let script = format!(
        "# a comment, then a blank line

open ftp://127.0.0.1:{port}/
mkdir in
cd in
pwd
put up1.dat
mput up?.dat *.txt
ls
ascii
dir
binary
mult 4
bufsize 64k
verify on
status
get up1.dat copy1.dat
rename up2.dat renamed.dat
lcd down
lpwd
mget renamed.dat my\\ * n*.txt
delete notes.txt
cd /
active
mget *.bin
passive
sockbuf auto
win 128k
mult
verify off
status
help
help win
bye
",
        port = srv.port
    );
    let out = run_script(&[], &script, &local, &cache);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{so}\nstderr:\n{se}");

    // What the server holds.
    let sha = |p: &Path| sha256_file(p);
    assert_eq!(sha(&root.join("in/up1.dat")), sha(&local.join("up1.dat")));
    assert_eq!(
        sha(&root.join("in/renamed.dat")),
        sha(&local.join("up2.dat"))
    );
    assert!(!root.join("in/up2.dat").exists(), "renamed away");
    assert!(!root.join("in/notes.txt").exists(), "deleted");
    assert_eq!(
        std::fs::read(root.join("in/my file.txt")).unwrap(),
        b"a name with a space"
    );
    // What came down (after `lcd down`).
    let down = local.join("down");
    assert_eq!(sha(&local.join("copy1.dat")), sha(&local.join("up1.dat")));
    assert_eq!(sha(&down.join("renamed.dat")), sha(&local.join("up2.dat")));
    assert_eq!(
        std::fs::read(down.join("notes.txt")).unwrap(),
        b"remember the milk\r\n",
        "binary after an ascii listing"
    );
    assert_eq!(
        std::fs::read(down.join("my file.txt")).unwrap(),
        b"a name with a space"
    );
    assert_eq!(sha(&down.join("big.bin")), sha(&root.join("big.bin")));
    assert_eq!(sha(&down.join("other.bin")), sha(&root.join("other.bin")));

    // stdout: pwd, lpwd, the listings, status and help.
    assert!(so.lines().any(|l| l == "/in"), "{so}");
    assert!(so.lines().any(|l| l.ends_with("/down")), "{so}");
    assert!(so.lines().any(|l| l.ends_with(" up1.dat")), "{so}");
    assert!(so.contains("Mult: 4"), "{so}");
    assert!(so.contains("Bufsize: 65536 bytes"), "{so}");
    assert!(so.contains("Verify: on"), "{so}");
    assert!(so.contains("Data connections: passive"), "{so}");
    assert!(so.contains("Mult: auto"), "{so}");
    assert!(so.contains("Bufsize: 131072 bytes"), "{so}");
    assert!(so.contains("Verify: off"), "{so}");
    assert!(so.contains("mput [-c] PATTERN..."), "{so}");
    assert!(so.contains("(also: win, sockbuf)"), "{so}");
    // stderr: the summaries, the reconnect, the verification.
    assert!(se.contains("Connected to 127.0.0.1"), "{se}");
    assert!(
        se.contains("reconnecting to 127.0.0.1") && se.contains("to apply mult, bufsize, verify"),
        "{se}"
    );
    assert!(se.contains("up1.dat: 1234567 bytes in"), "{se}");
    assert!(se.contains("4 connections"), "{se}");
    assert!(se.contains("verified, SHA256"), "{se}");
    assert!(se.contains("mget: 3 files"), "{se}");
    assert!(se.contains("TYPE A"), "ascii says what it does: {se}");
    assert!(!se.contains("line "), "no failure: {se}");
}

/// mget and mput match as a shell does: a quoted or escaped wildcard is
/// itself, and `*` leaves out names with a leading dot.
#[test]
fn quoted_wildcards_are_literal_and_star_skips_dot_files() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    for d in [&root.join("gl"), &local.join("up"), &local.join("down")] {
        std::fs::create_dir_all(d).unwrap();
    }
    for n in ["s*.txt", "sxyz.txt", "[b].txt", "b.txt", ".hid.txt"] {
        std::fs::write(root.join("gl").join(n), n).unwrap();
        std::fs::write(local.join("up").join(n), n).unwrap();
    }
    std::fs::write(local.join("up/qa"), "qa").unwrap();
    let srv = serve(&root, &[]);
    let script = format!(
        "open ftp://127.0.0.1:{port}/gl/\nlcd down\nmget s\\*.txt \"[b].txt\"\n\
         mkdir /in\ncd /in\nlcd ../up\nmput s* 'q?' \"[b].txt\"\n\
         mkdir /all\ncd /all\nmput *\n",
        port = srv.port
    );
    // `'q?'` is the file of that name (not `qa`, say).
    std::fs::write(local.join("up/q?"), "q").unwrap();
    let out = run_script(&[], &script, &local, &cache);
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&local.join("down")), ["[b].txt", "s*.txt"], "{se}");
    assert_eq!(
        names(&root.join("in")),
        ["[b].txt", "q?", "s*.txt", "sxyz.txt"],
        "{se}"
    );
    assert!(root.join("all/b.txt").exists(), "{se}");
    assert!(!root.join("all/.hid.txt").exists(), "{se}");
}

/// Names that are not UTF-8. The server's PWD reply carries the
/// directory's bytes (it sent U+FFFD, and `get` then fetched the file of a
/// look-alike directory named with U+FFFD itself), and `mput` matches a
/// local directory holding such a name (the glob crate's walk panicked).
#[test]
fn names_that_are_not_utf8_reach_the_right_files() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    let latin1 = root
        .join("mix")
        .join(std::ffi::OsStr::from_bytes(b"l\xe9d"));
    let lookalike = root.join("mix/l\u{FFFD}d");
    for d in [&latin1, &lookalike, &local.join("MG")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(latin1.join("f"), "RIGHT").unwrap();
    std::fs::write(lookalike.join("f"), "WRONG").unwrap();
    let b_e9 = std::ffi::OsStr::from_bytes(b"b\xe9");
    std::fs::write(local.join("MG").join(b_e9), "a").unwrap();
    std::fs::write(local.join("MG/ok.txt"), "b").unwrap();
    let srv = serve(&root, &[]);
    let script = format!(
        "open ftp://127.0.0.1:{}/\ncd mix/l\u{F7E9}d\nget f\nlcd MG\nmput *.txt\nmput b*\n",
        srv.port
    );
    let out = run_script(&[], &script, &local, &cache);
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    assert!(!se.contains("panicked"), "{se}");
    assert_eq!(std::fs::read(local.join("f")).unwrap(), b"RIGHT", "{se}");
    assert_eq!(std::fs::read(latin1.join("ok.txt")).unwrap(), b"b", "{se}");
    assert_eq!(std::fs::read(latin1.join(b_e9)).unwrap(), b"a", "{se}");
}

/// A file of mget's that fails (here: its local name leads to a device)
/// does not keep the others from coming; the command fails at the end,
/// naming the count.
#[test]
fn mget_goes_on_past_a_file_that_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(root.join("a.dat"), b"a").unwrap();
    std::fs::write(root.join("b.dat"), b"b").unwrap();
    std::fs::write(root.join("c.dat"), b"c").unwrap();
    std::os::unix::fs::symlink("/dev/null", local.join("b.dat")).unwrap();
    let srv = serve(&root, &[]);
    let script = format!("open ftp://127.0.0.1:{}/\nmget *.dat\n", srv.port);
    let out = run_script(&[], &script, &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(se.contains("mget: 1 of 3 files failed"), "{se}");
    assert_eq!(std::fs::read(local.join("a.dat")).unwrap(), b"a");
    assert_eq!(std::fs::read(local.join("c.dat")).unwrap(), b"c");
}

#[test]
fn the_first_failing_command_ends_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(root.join("here.txt"), b"here").unwrap();
    std::fs::write(local.join("late.txt"), b"never sent").unwrap();
    let srv = serve(&root, &[]);

    // A missing remote file: line 3 fails, line 4 never runs.
    let script = "get here.txt\n\nget missing.bin\nput late.txt\n";
    let url = format!("ftp://127.0.0.1:{}/", srv.port);
    let out = run_script(&[&url], script, &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(se.contains("line 3:") && se.contains("missing.bin"), "{se}");
    assert!(
        se.contains("550") && se.contains("`ls`"),
        "names the fix: {se}"
    );
    assert_eq!(std::fs::read(local.join("here.txt")).unwrap(), b"here");
    assert!(!local.join("missing.bin").exists());
    assert!(!root.join("late.txt").exists(), "the script stopped");

    // An unknown command fails too.
    let out = run_script(&[&url], "pwd\nfrobnicate now\npwd\n", &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("line 2: unknown command \"frobnicate\""),
        "{se}"
    );
    assert_eq!(text(&out.stdout).lines().count(), 1, "one pwd only");

    // So do a remote pattern that matches nothing, and a usage error.
    for (script, needle) in [
        ("mget *.nothing\n", "no remote file matches"),
        ("mput *.nothing\n", "no local file matches"),
        ("rename onlyone\n", "usage: rename FROM TO"),
        // No blank after a command that takes nothing.
        ("pwd extra\n", "usage: pwd\n"),
        ("bufsize 1\n", "bufsize: \"1\" is under the 2 KiB"),
        ("get \"\"\n", "an empty name"),
        ("get f nodir/\n", "nodir/ does not exist as a directory"),
        ("mult 65\n", "mult:"),
        ("cd \"unclosed\n", "unclosed"),
    ] {
        let out = run_script(&[&url], script, &local, &cache);
        let se = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{script}: {se}");
        assert!(
            se.contains("line 1:") && se.contains(needle),
            "{script}: {se}"
        );
    }

    // Not connected: a clear message; a server that is not there: the fix.
    let out = run_script(&[], "ls\n", &local, &cache);
    assert!(
        text(&out.stderr).contains("not connected — open"),
        "{out:?}"
    );
    drop(srv);
    let out = run_script(&[&url], "ls\n", &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(se.contains("is an FTP server running"), "{se}");
}

/// A program on a pseudo-terminal: its output, read by a thread.
struct Pty {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    rx: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Pty {
    /// `xftp shell ARGS` under `script -qefc`.
    fn start(args: &str, cwd: &Path, cache: &Path) -> Pty {
        let cmd = format!("'{XFTP}' shell {args}");
        let mut child = Command::new("script")
            .args(["-qefc", &cmd, "/dev/null"])
            .current_dir(cwd)
            .env_remove("XFTP_PASSWORD")
            .env("XDG_CACHE_HOME", cache)
            .env("TERM", "xterm")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn script");
        let mut out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Pty {
            stdin: child.stdin.take(),
            child,
            rx,
            seen: Vec::new(),
        }
    }

    /// Wait until the output holds `n` occurrences of `what`.
    fn expect(&mut self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let all = text(&self.seen);
            if all.matches(what).count() >= n {
                return all;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(b) => self.seen.extend(b),
                Err(_) => panic!("no {n}× {what:?} within 60 s; output so far:\n{all}"),
            }
        }
    }

    /// Type a line (the terminal's Enter is a carriage return).
    fn type_line(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(format!("{line}\r").as_bytes()).unwrap();
        s.flush().unwrap();
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                while let Ok(b) = self.rx.recv_timeout(Duration::from_millis(200)) {
                    self.seen.extend(b);
                }
                return s;
            }
            assert!(Instant::now() < deadline, "the shell did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have(tool: &str, test: &str) -> bool {
    let ok = Command::new(tool)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!("SKIP {test}: {tool} is not installed (util-linux script, or tmux)");
    }
    ok
}

fn useradd(users: &Path, name: &str, pw: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("pw");
    std::fs::write(&f, pw).unwrap();
    let out = Command::new(XFTP)
        .args(["useradd", "--users"])
        .arg(users)
        .arg("--password-file")
        .arg(&f)
        .arg(name)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn open_host_port_then_user_logs_in_where_anonymous_is_refused() {
    // ftp(1)'s idiom: `open host port`, refused for anonymous, then
    // `user NAME PASSWORD` logs in to that server.
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(root.join("sub/f"), b"alice's").unwrap();
    let users = dir.path().join("users.txt");
    useradd(&users, "alice", "alice-pw");
    let srv = support::serve_with(&root, &["--users", users.to_str().unwrap()]);
    let script = format!(
        "open 127.0.0.1 {}\nuser alice alice-pw\ncd sub\nget f\n",
        srv.port
    );
    let out = run_script(&[], &script, &local, &cache);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("refuses anonymous logins"), "{err}");
    // Said with its line, as a script's failures are, though no failure.
    assert!(err.contains("xftp: line 1: "), "{err}");
    assert!(err.contains("as alice"), "{err}");
    assert_eq!(std::fs::read(local.join("f")).unwrap(), b"alice's");
    // A wrong password is still a failure, and `user` may be tried again.
    let script = format!(
        "open 127.0.0.1 {}\nuser alice wrong\nuser alice alice-pw\n",
        srv.port
    );
    let out = run_script(&[], &script, &local, &cache);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("line 2"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn on_a_terminal_under_script() {
    if !have("script", "on_a_terminal_under_script") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&root.join("big.bin"), 2_000_003, 7);
    let users = dir.path().join("users.txt");
    useradd(&users, "alice", "alice-pw");
    let srv = serve(&root, &["--users", users.to_str().unwrap()]);

    let mut pty = Pty::start(
        &format!("ftp://alice@127.0.0.1:{}/", srv.port),
        &local,
        &cache,
    );
    // No password anywhere: the shell asks, and echoes nothing of it.
    pty.expect("Password for alice@127.0.0.1: ", 1);
    pty.type_line("alice-pw");
    let login = pty.expect("xftp> ", 1);
    assert!(
        !login.contains("alice-pw"),
        "the password was echoed: {login}"
    );
    pty.type_line("get big.bin");
    let all = pty.expect("xftp> ", 2);
    assert!(all.contains("as alice"), "{all}");
    assert!(all.contains("big.bin: 2000003 bytes in"), "{all}");
    pty.type_line("user alice alice-pw");
    pty.expect("xftp> ", 3);
    pty.type_line("nonsense");
    let all = pty.expect("xftp> ", 4);
    assert!(
        all.contains("unknown command"),
        "errors do not end the session: {all}"
    );
    pty.type_line("quit");
    let status = pty.wait();
    assert!(status.success(), "{}", text(&pty.seen));
    assert_eq!(
        sha256_file(&local.join("big.bin")),
        sha256_file(&root.join("big.bin"))
    );
    let history = std::fs::read_to_string(cache.join("xftp/shell_history")).unwrap();
    assert!(history.contains("get big.bin"), "{history}");
    assert!(history.contains("user alice"), "{history}");
    assert!(
        !history.contains("alice-pw"),
        "no password in the history: {history}"
    );
}

/// tmux on a private socket, killed when dropped.
struct Tmux {
    sock: std::path::PathBuf,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.sock)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tmux")
    }

    /// The pane's text (capture-pane drops trailing blanks: the prompt
    /// reads `xftp>`).
    fn screen(&self) -> String {
        text(&self.run(&["capture-pane", "-p", "-t", "sh"]).stdout)
    }

    fn wait_for(&self, what: impl Fn(&str) -> bool, why: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.screen();
            if what(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{why}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn on_a_terminal_under_tmux() {
    if !have("tmux", "on_a_terminal_under_tmux") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(root.join("pub")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&root.join("pub/data.bin"), 1_500_000, 9);
    let srv = serve(&root, &[]);

    let tmux = Tmux {
        sock: dir.path().join("tmux.sock"),
    };
    let cmd = format!(
        "'{XFTP}' shell ftp://127.0.0.1:{}/pub/; echo shell-exit=$?; sleep 30",
        srv.port
    );
    let out = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "sh",
        "-x",
        "150",
        "-y",
        "40",
        "-c",
        local.to_str().unwrap(),
        "-e",
        &format!("XDG_CACHE_HOME={}", cache.display()),
        "-e",
        "XFTP_PASSWORD=",
        &cmd,
    ]);
    assert!(out.status.success(), "tmux: {}", text(&out.stderr));
    tmux.wait_for(|s| s.contains("xftp>"), "no prompt");
    let out = tmux.run(&["send-keys", "-t", "sh", "get data.bin", "Enter"]);
    assert!(out.status.success());
    let s = tmux.wait_for(
        |s| s.contains("data.bin: 1500000 bytes in") && s.matches("xftp>").count() >= 2,
        "no summary and second prompt",
    );
    assert!(s.contains("remote directory /pub"), "{s}");
    tmux.run(&["send-keys", "-t", "sh", "status", "Enter"]);
    tmux.wait_for(|s| s.contains("Remote directory: /pub"), "no status");
    tmux.run(&["send-keys", "-t", "sh", "quit", "Enter"]);
    tmux.wait_for(
        |s| s.contains("shell-exit=0"),
        "the shell did not end with 0",
    );
    assert_eq!(
        sha256_file(&local.join("data.bin")),
        sha256_file(&root.join("pub/data.bin"))
    );
}

#[test]
fn tls_sessions_and_their_status() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    write_prng_file(&local.join("up.bin"), 300_000, 5);
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let srv = serve(
        &root,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls",
            "required",
        ],
    );
    let cacert = cert.to_str().unwrap();
    let script = format!(
        "open ftpes://localhost:{}/\nput up.bin\nmult 3\nget up.bin back.bin\nstatus\n",
        srv.port
    );
    let out = run_script(&["--cacert", cacert], &script, &local, &cache);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{so}\n{se}");
    assert!(so.contains("connected, TLS TLSv1."), "{so}");
    assert!(
        se.contains("Connected to localhost:") && se.contains(", TLSv1."),
        "{se}"
    );
    assert!(se.contains("3 connections"), "{se}");
    assert_eq!(
        sha256_file(&root.join("up.bin")),
        sha256_file(&local.join("up.bin"))
    );
    assert_eq!(
        sha256_file(&local.join("back.bin")),
        sha256_file(&local.join("up.bin"))
    );

    // Clear text to a server that requires TLS: the fix names ftpes://.
    let script = format!("open ftp://localhost:{}/\n", srv.port);
    let out = run_script(&[], &script, &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("line 1:") && se.contains("open ftpes://localhost:"),
        "{se}"
    );
    // A certificate option and a clear session: refused before the login
    // (whose password would go in clear), as `get` refuses it.
    let script = format!("open 127.0.0.1 {}\n", srv.port);
    let out = run_script(&["--cacert", cacert], &script, &local, &cache);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("are for TLS") && se.contains("ftpes://127.0.0.1:"),
        "{se}"
    );
}

#[test]
fn reget_and_reput_continue_what_a_cut_transfer_left() {
    const SIZE: u64 = 12_000_007;
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    for d in [&root, &local] {
        std::fs::create_dir_all(d).unwrap();
    }
    write_prng_file(&root.join("f.bin"), SIZE, 7);
    write_prng_file(&local.join("u.bin"), SIZE, 8);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    // At 4 MiB/s the transfers take about 3 s: cut after 1.2 s, past the
    // first record of ranges (written every half second).
    let get = format!("{base}/f.bin");
    let put = format!("{base}/up.bin");
    let cut = Duration::from_millis(1200);
    assert!(xftp_killed(
        &["get", "-c", "-p", "4", "--limit-rate", "4M", &get, "f.bin"],
        &local,
        cut
    ));
    assert!(xftp_killed(
        &["put", "-c", "-p", "4", "--limit-rate", "4M", "u.bin", &put],
        &local,
        cut
    ));
    assert!(!local.join("f.bin").exists() && !root.join("up.bin").exists());

    let script = format!("open {base}/\nmult 4\nreget f.bin\nreput u.bin up.bin\nquit\n");
    let out = run_script(&[], &script, &local, &cache);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        sha256_file(&local.join("f.bin")),
        sha256_file(&root.join("f.bin"))
    );
    assert_eq!(
        sha256_file(&root.join("up.bin")),
        sha256_file(&local.join("u.bin"))
    );
    // Each moved only what was missing, and says what it found.
    for name in ["f.bin", "up.bin"] {
        assert!(moved(&err, name) < SIZE, "{name} moved whole: {err}");
        assert!(
            err.contains(&format!("{name}: ")) && err.contains("bytes were in place already"),
            "{err}"
        );
    }
    assert_eq!(
        err.matches("bytes were in place already").count(),
        2,
        "{err}"
    );
    // Nothing left behind at either end.
    assert_no_partials(&[&local, &root]);
}

#[test]
fn mget_and_mput_with_c_continue_a_cut_file_and_skip_complete_ones() {
    const SIZE: u64 = 12_000_007;
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    for d in [&root, &local] {
        std::fs::create_dir_all(d).unwrap();
    }
    write_prng_file(&root.join("a.bin"), SIZE, 11);
    write_prng_file(&root.join("b.bin"), 300_001, 12);
    write_prng_file(&local.join("c.up"), SIZE, 13);
    write_prng_file(&local.join("d.up"), 200_003, 14);
    let srv = serve(&root, &[]);
    let base = format!("ftp://127.0.0.1:{}", srv.port);
    // A cut download of a.bin and a cut upload of c.up, as in the reget
    // test: 4 MiB/s, cut after 1.2 s.
    let cut = Duration::from_millis(1200);
    let (get, put) = (format!("{base}/a.bin"), format!("{base}/c.up"));
    assert!(xftp_killed(
        &["get", "-c", "-p", "4", "--limit-rate", "4M", &get, "a.bin"],
        &local,
        cut
    ));
    assert!(xftp_killed(
        &["put", "-c", "-p", "4", "--limit-rate", "4M", "c.up", &put],
        &local,
        cut
    ));
    assert!(!local.join("a.bin").exists() && !root.join("c.up").exists());

    let script = format!("open {base}/\nmult 4\nmget -c *.bin\nmput -c *.up\nquit\n");
    let out = run_script(&[], &script, &local, &cache);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    for (a, b) in [("a.bin", "a.bin"), ("b.bin", "b.bin")] {
        assert_eq!(sha256_file(&local.join(a)), sha256_file(&root.join(b)));
    }
    for n in ["c.up", "d.up"] {
        assert_eq!(sha256_file(&root.join(n)), sha256_file(&local.join(n)));
    }
    // The cut files continued; the others moved whole.
    assert!(moved(&err, "a.bin") < SIZE, "{err}");
    assert!(moved(&err, "c.up") < SIZE, "{err}");
    assert_eq!(moved(&err, "b.bin"), 300_001, "{err}");
    assert_eq!(moved(&err, "d.up"), 200_003, "{err}");

    // Again: all four are complete, nothing moves.
    let out = run_script(&[], &script, &local, &cache);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.matches("complete already").count(),
        4,
        "every file is in place: {err}"
    );
    assert!(err.contains("mget: 2 files, 0 bytes"), "{err}");
    assert!(err.contains("mput: 2 files, 0 bytes"), "{err}");

    // Without -c the same command moves them again; `-c` alone is an error.
    let out = run_script(
        &[],
        &format!("open {base}/\nmget *.bin\nmget -c\nquit\n"),
        &local,
        &cache,
    );
    let err = text(&out.stderr);
    assert!(err.contains("mget: 2 files, 12300008 bytes"), "{err}");
    assert!(err.contains("mget -c needs a pattern"), "{err}");
    assert_no_partials(&[&local, &root]);
}

#[test]
fn a_session_the_server_closed_while_idle_is_opened_again_for_the_next_command() {
    let dir = tempfile::tempdir().unwrap();
    let (root, local, cache) = (
        dir.path().join("root"),
        dir.path().join("local"),
        dir.path().join("cache"),
    );
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(root.join("d/f.txt"), b"hello").unwrap();
    let srv = serve(&root, &["--idle-timeout", "1"]);
    let base = format!("ftp://127.0.0.1:{}/", srv.port);
    // The server closes the session 1 s into the pause; the script goes
    // on, in the directory it had changed to.
    let out = run_paced(
        &[&base],
        &["cd d\n", "get f.txt x\npwd\nquit\n"],
        Duration::from_millis(2500),
        &local,
        &cache,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the server closed the idle connection"),
        "{err}"
    );
    assert_eq!(std::fs::read(local.join("x")).unwrap(), b"hello");
    assert_eq!(text(&out.stdout).trim(), "/d");
}

/// The bytes the shell's summary line for `name` says moved
/// (`NAME: BYTES bytes in ...`).
fn moved(err: &str, name: &str) -> u64 {
    err.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no summary for {name}: {err}"))
}

/// No partial (`*xftp-part*`) left in any of `dirs`.
fn assert_no_partials(dirs: &[&Path]) {
    for d in dirs {
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("xftp-part"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[test]
fn lcd_reads_a_tilde_as_home() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("sub")).unwrap();
    let out = Command::new(XFTP)
        .arg("shell")
        .current_dir(dir.path())
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(b"lcd ~/sub\nlpwd\nlcd ~\nlpwd\n")?;
            c.wait_with_output()
        })
        .unwrap();
    let o = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = o.lines().collect();
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(lines, [canon(&home.join("sub")), canon(&home)], "{o}");
}
