//! The client against a deliberately misbehaving server (a few lines of
//! scripted FTP in this file): short transfers, stalls, NAT-style PASV
//! addresses, an upload the server then reports with the wrong SIZE. Each
//! case checks the exit status and that no complete-looking file is left.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How the fake server misbehaves.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// SIZE says 1000, RETR sends 600 bytes then 226.
    ShortWith226,
    /// SIZE says 1000, RETR sends 1000 bytes then 226 (the control case).
    Honest,
    /// SIZE says 1000, RETR sends 1500 bytes then 226 (the file grew).
    Grown,
    /// STOR: reads a little, replies 426 (disk full) and closes the data
    /// connection with data unread, which resets it.
    DiskFull,
    /// STOR: reads 64 KiB every 50 ms and reports on the command channel
    /// how the data connection ended: "DATA EOF" (a clean close, the end
    /// of the file in stream mode) or "DATA RESET".
    SlowStore,
    /// RETR sends 100 bytes and then holds the data connection open.
    Stall,
    /// EPSV refused; PASV announces 10.1.2.3 (a NAT's inside address).
    NatPasv,
    /// STOR accepted, but SIZE afterwards reports one byte less.
    UploadSizeLies,
    /// RETR: 150 and data, then 426 instead of 226.
    AbortAfterData,
    /// EPSV names a port already closed again; LIST is refused with 550
    /// a moment later (a missing directory: the server gave up the port).
    RefusedList,
    /// No MULT, REST STREAM in FEAT (ranged downloads), one session
    /// allowed (421 to the others): the first RETR's data connection is
    /// reset 100 KB in, then 426; every later RETR is sent whole from its
    /// REST offset.
    RangedResetOnce,
    /// SIZE is answered with a reply line of 4 MB.
    HugeLine,
    /// SIZE is answered with a multi-line reply that never ends.
    EndlessReply,
    /// EPSV names port 0.
    PortZero,
    /// LIST gives the file `a` twice (no MLSD: FEAT is refused).
    DupListing,
    /// FEAT lists MLST; MLSD names `ok.txt` and three files whose names
    /// would leave the directory (`../x`, `/abs`, `sub/../../x`).
    HostileMlsd,
    /// RETR sends [`pattern`] from the REST offset: the first 600 bytes
    /// only, then 226 (cut), ...
    PatternCut,
    /// ... all of it from byte 0 whatever REST said, then 226, ...
    PatternIgnoresRest,
    /// ... or honestly the rest, then 226.
    Pattern,
    /// RETR is refused with a text that holds terminal escapes.
    EscapesInReply,
    /// FEAT lists REST STREAM, but REST is refused (502); RETR sends the
    /// whole [`MULT_LEN`] pattern.
    RestRefused,
    /// MLSD lists `ok.txt` at 1000 bytes; SIZE is refused; RETR sends
    /// 600 bytes, then 226.
    ListedSizeShort,
    /// RETR sends the file, then GridFTP performance markers (112) that
    /// count no more bytes, every 200 ms, and never a final reply.
    MarkersForever,
    /// An xftp-like server that grants MULT but refuses the endgame (OPTS
    /// MULT ENDGAME): RETR sends [`pattern`] on two connections, the
    /// second half first as zeros on the first connection and then, a
    /// moment later, as itself on the second.
    MultCopyDiffers,
}

/// The file of the `Pattern*` scripts: a byte pattern that shows any
/// misplaced range.
fn pattern() -> Vec<u8> {
    pattern_of(FILE_LEN)
}

fn pattern_of(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// The file of [`Script::MultCopyDiffers`]: large enough for two
/// connections.
const MULT_LEN: usize = 4 << 20;

const FILE_LEN: usize = 1000;

/// Serve one session on 127.0.0.1; returns the port and a receiver of the
/// command lines seen.
fn fake_server(script: Script) -> (u16, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let Ok((ctl, _)) = l.accept() else { return };
        // One session: any other connection is turned away.
        thread::spawn(move || {
            while let Ok((mut c, _)) = l.accept() {
                let _ = c.write_all(b"421 one session only\r\n");
            }
        });
        let _ = session(ctl, script, &tx);
    });
    (port, rx)
}

/// The file of [`Script::RangedResetOnce`]: three ranges of a MiB and a
/// bit, a byte pattern that shows any misplaced range.
const RANGED_LEN: usize = (3 << 20) + 5;

fn ranged_body() -> Vec<u8> {
    (0..RANGED_LEN).map(|i| (i % 251) as u8).collect()
}

/// The data connection of a transfer: 425 without a passive listener,
/// else 150 and the client's connection (`None` after the 425).
fn data_conn(
    listener: &mut Option<TcpListener>,
    w: &mut TcpStream,
) -> std::io::Result<Option<TcpStream>> {
    let Some(dl) = listener.take() else {
        w.write_all(b"425 no data connection\r\n")?;
        return Ok(None);
    };
    w.write_all(b"150 here it comes\r\n")?;
    Ok(Some(dl.accept()?.0))
}

fn session(ctl: TcpStream, script: Script, seen: &mpsc::Sender<String>) -> std::io::Result<()> {
    let mut w = ctl.try_clone()?;
    let mut r = BufReader::new(ctl);
    let mut data_listener: Option<TcpListener> = None;
    let mut uploaded = 0usize;
    let (mut rest, mut retrs) = (0usize, 0u32);
    w.write_all(b"220 fake server\r\n")?;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let cmd = line.trim_end().to_owned();
        let _ = seen.send(cmd.clone());
        let verb = cmd.split(' ').next().unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "USER" => "331 password please".into(),
            "PASS" => "230 in".into(),
            "TYPE" => "200 ok".into(),
            "SIZE" if matches!(script, Script::HugeLine) => {
                let _ = w.write_all(b"213 ");
                let chunk = vec![b'9'; 65536];
                for _ in 0..64 {
                    if w.write_all(&chunk).is_err() {
                        return Ok(());
                    }
                }
                "".into()
            }
            "SIZE" if matches!(script, Script::EndlessReply) => {
                let _ = w.write_all(b"213-here comes the size\r\n");
                loop {
                    if w.write_all(b" still coming\r\n").is_err() {
                        return Ok(());
                    }
                }
            }
            "EPSV" if matches!(script, Script::PortZero) => {
                "229 Entering Extended Passive Mode (|||0|)".into()
            }
            "SIZE" if matches!(script, Script::ListedSizeShort) => "502 no SIZE here".into(),
            "SIZE" => match script {
                Script::UploadSizeLies => format!("213 {}", uploaded.saturating_sub(1)),
                Script::RangedResetOnce => format!("213 {RANGED_LEN}"),
                Script::MultCopyDiffers | Script::RestRefused => format!("213 {MULT_LEN}"),
                _ => format!("213 {FILE_LEN}"),
            },
            "FEAT" if matches!(script, Script::MultCopyDiffers) => {
                "211-Features:\r\n MULT\r\n MODE E\r\n SIZE\r\n211 End".into()
            }
            "MULT" if matches!(script, Script::MultCopyDiffers) => {
                "200 MULT 2 granted (server maximum 2).".into()
            }
            "MODE" if matches!(script, Script::MultCopyDiffers) => "200 mode set".into(),
            "RETR" if matches!(script, Script::EscapesInReply) => {
                "550 \x1b]0;PWNED\x07\x1b[2Jno such file".into()
            }
            "RETR" if matches!(script, Script::MultCopyDiffers) => {
                let Some(dl) = data_listener.take() else {
                    w.write_all(b"425 no data connection\r\n")?;
                    continue;
                };
                w.write_all(b"150 here it comes\r\n")?;
                let (mut d0, _) = dl.accept()?;
                let (mut d1, _) = dl.accept()?;
                let body = pattern_of(MULT_LEN);
                let half = MULT_LEN / 2;
                let block = |d: &mut TcpStream, desc: u8, off: usize, data: &[u8]| {
                    let mut h = vec![desc];
                    h.extend_from_slice(&(data.len() as u64).to_be_bytes());
                    h.extend_from_slice(&(off as u64).to_be_bytes());
                    h.extend_from_slice(data);
                    d.write_all(&h)
                };
                block(&mut d0, 0, 0, &body[..half])?;
                block(&mut d0, 0, half, &vec![0u8; MULT_LEN - half])?;
                thread::sleep(Duration::from_millis(300));
                block(&mut d1, 0, half, &body[half..])?;
                // EOD on both, EOF (two connections) on the first.
                let _ = block(&mut d0, 0x48, 2, &[]);
                let _ = block(&mut d1, 0x08, 0, &[]);
                drop((d0, d1));
                "226 done".into()
            }
            "FEAT" if matches!(script, Script::RangedResetOnce) => {
                "211-Features:\r\n REST STREAM\r\n211 End".into()
            }
            "REST" if matches!(script, Script::RestRefused) => "502 REST not implemented".into(),
            "FEAT" if matches!(script, Script::RestRefused) => {
                "211-Features:\r\n SIZE\r\n REST STREAM\r\n211 End".into()
            }
            "RETR" if matches!(script, Script::RestRefused) => {
                let Some(mut d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                // The client may close early once it has what it wants.
                let _ = d.write_all(&pattern_of(MULT_LEN));
                drop(d);
                "226 done".into()
            }
            "REST" => {
                rest = cmd[5..].trim().parse().unwrap_or(0);
                "350 restarting".into()
            }
            "ABOR" => "225 no transfer to abort".into(),
            "PWD" => "257 \"/\" is the directory".into(),
            "RETR" if matches!(script, Script::RangedResetOnce) => {
                let Some(d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                let body = ranged_body();
                let from = std::mem::take(&mut rest).min(RANGED_LEN);
                retrs += 1;
                let mut d = socket2::Socket::from(d);
                if retrs == 1 {
                    let _ = d.write_all(&body[from..from + 100_000]);
                    // A reset, not a close: the client's read fails.
                    d.set_linger(Some(Duration::ZERO))?;
                    drop(d);
                    "426 connection reset".into()
                } else {
                    // The client closes when it has its range: the rest
                    // fails to go out.
                    match d.write_all(&body[from..]) {
                        Ok(()) => "226 done".into(),
                        Err(_) => "426 connection closed".into(),
                    }
                }
            }
            "EPSV" if matches!(script, Script::NatPasv) => "500 EPSV not understood".into(),
            "EPSV" if matches!(script, Script::RefusedList) => {
                let p = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                format!("229 Entering Extended Passive Mode (|||{p}|)")
            }
            "MLST" if matches!(script, Script::ListedSizeShort) => {
                "250-listed\r\n type=dir;modify=20200101000000; d/\r\n250 end".into()
            }
            "MDTM" if matches!(script, Script::ListedSizeShort) => "213 20200101000000".into(),
            "FEAT" if matches!(script, Script::ListedSizeShort) => {
                "211-Features:\r\n MDTM\r\n SIZE\r\n REST STREAM\r\n EPSV\r\n MLST type*;size*;modify*;\r\n211 End".into()
            }
            "FEAT" if matches!(script, Script::HostileMlsd) => {
                "211-Features:\r\n MLST type*;size*;modify*;\r\n211 End".into()
            }
            "MLSD" if matches!(script, Script::ListedSizeShort) => {
                let Some(mut d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                d.write_all(format!("type=file;size={FILE_LEN}; ok.txt\r\n").as_bytes())?;
                drop(d);
                "226 listed".into()
            }
            "MLSD" if matches!(script, Script::HostileMlsd) => {
                let Some(mut d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                for name in [
                    "../../escape1.txt",
                    "/tmp/escape2.txt",
                    "sub/../../escape3.txt",
                    "ok.txt",
                ] {
                    d.write_all(format!("type=file;size={FILE_LEN}; {name}\r\n").as_bytes())?;
                }
                d.write_all(b"type=cdir; /d\r\ntype=pdir; /\r\ntype=dir; ..\r\n")?;
                drop(d);
                "226 listed".into()
            }
            "LIST" if matches!(script, Script::DupListing) => {
                let Some(mut d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                let line = format!("-rw-r--r--   1 0  0  {FILE_LEN} Jan  5 12:00 a\r\n");
                d.write_all(b"drwxr-xr-x   2 0  0  4096 Jan  5 12:00 .\r\n")?;
                d.write_all(line.as_bytes())?;
                d.write_all(line.as_bytes())?;
                drop(d);
                "226 listed".into()
            }
            "LIST" => {
                thread::sleep(Duration::from_millis(300));
                "550 /nowhere: No such file or directory".into()
            }
            "EPSV" => {
                let dl = TcpListener::bind("127.0.0.1:0")?;
                let p = dl.local_addr()?.port();
                data_listener = Some(dl);
                format!("229 Entering Extended Passive Mode (|||{p}|)")
            }
            "PASV" => {
                let dl = TcpListener::bind("127.0.0.1:0")?;
                let p = dl.local_addr()?.port();
                data_listener = Some(dl);
                format!(
                    "227 Entering Passive Mode (10,1,2,3,{},{})",
                    p >> 8,
                    p & 0xff
                )
            }
            "RETR" => {
                let Some(mut d) = data_conn(&mut data_listener, &mut w)? else {
                    continue;
                };
                let body = vec![b'x'; FILE_LEN];
                let from = std::mem::take(&mut rest).min(FILE_LEN);
                match script {
                    Script::MarkersForever => {
                        d.write_all(&body)?;
                        drop(d);
                        let marker = b"112-Perf Marker\r\n Timestamp: 1\r\n Stripe Bytes Transferred: 1000\r\n112 End.\r\n";
                        while w.write_all(marker).is_ok() {
                            thread::sleep(Duration::from_millis(200));
                        }
                        return Ok(());
                    }
                    Script::PatternCut => {
                        d.write_all(&pattern()[from..600.max(from)])?;
                        drop(d);
                        "226 done (not really)".into()
                    }
                    Script::PatternIgnoresRest => {
                        d.write_all(&pattern())?;
                        drop(d);
                        "226 done".into()
                    }
                    Script::Pattern => {
                        d.write_all(&pattern()[from..])?;
                        drop(d);
                        "226 done".into()
                    }
                    Script::ShortWith226 | Script::ListedSizeShort => {
                        d.write_all(&body[..600])?;
                        drop(d);
                        "226 done (not really)".into()
                    }
                    Script::Stall => {
                        d.write_all(&body[..100])?;
                        thread::sleep(Duration::from_secs(30));
                        drop(d);
                        "226 late".into()
                    }
                    Script::Grown => {
                        d.write_all(&body)?;
                        d.write_all(&body[..500])?;
                        drop(d);
                        "226 done".into()
                    }
                    Script::AbortAfterData => {
                        d.write_all(&body)?;
                        drop(d);
                        "426 connection closed; transfer aborted".into()
                    }
                    _ => {
                        d.write_all(&body)?;
                        drop(d);
                        "226 done".into()
                    }
                }
            }
            "STOR" => {
                let Some(dl) = data_listener.take() else {
                    w.write_all(b"425 no data connection\r\n")?;
                    continue;
                };
                w.write_all(b"150 send it\r\n")?;
                let (mut d, _) = dl.accept()?;
                if matches!(script, Script::SlowStore) {
                    let mut buf = vec![0u8; 65536];
                    loop {
                        match d.read(&mut buf) {
                            Ok(0) => {
                                let _ = seen.send("DATA EOF".into());
                                break;
                            }
                            Ok(_) => thread::sleep(Duration::from_millis(50)),
                            Err(_) => {
                                let _ = seen.send("DATA RESET".into());
                                break;
                            }
                        }
                    }
                    continue;
                }
                if matches!(script, Script::DiskFull) {
                    let mut some = [0u8; 65536];
                    d.read_exact(&mut some)?;
                    w.write_all(
                        b"426 Connection closed; transfer aborted: No space left on device\r\n",
                    )?;
                    drop(d);
                    continue;
                }
                let mut got = Vec::new();
                d.read_to_end(&mut got)?;
                uploaded = got.len();
                "226 stored".into()
            }
            "QUIT" => {
                w.write_all(b"221 bye\r\n")?;
                return Ok(());
            }
            _ => "502 not implemented".into(),
        };
        w.write_all(format!("{reply}\r\n").as_bytes())?;
    }
}

fn xftp(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run xftp")
}

/// Send SIG`sig` (INT, TERM) to a child xftp and collect its output.
fn signal_and_wait(child: std::process::Child, sig: &str) -> Output {
    let killed = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    child.wait_with_output().unwrap()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn honest_server_control_case_succeeds() {
    let (port, _) = fake_server(Script::Honest);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("f.bin")).unwrap().len(),
        FILE_LEN
    );
}

/// A listing that names a file twice: fetched once (twice, both copies
/// would be written into one target at once).
#[test]
fn a_name_listed_twice_is_fetched_once() {
    let (port, seen) = fake_server(Script::DupListing);
    let dir = tempfile::tempdir().unwrap();
    let out = xftp(
        &[
            "get",
            "-r",
            "--json",
            &format!("ftp://127.0.0.1:{port}/d/"),
            "got",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{out:?}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["files"], 1, "{j}");
    assert_eq!(
        std::fs::read(dir.path().join("got/a")).unwrap().len(),
        FILE_LEN
    );
    let retrs = seen.try_iter().filter(|c| c.starts_with("RETR")).count();
    assert_eq!(retrs, 1);
}

/// Names that would leave the target are not taken, and not dropped
/// unsaid either: the tree fails with what they were.
#[test]
fn a_refused_rest_falls_back_to_one_connection() {
    // FEAT promised REST STREAM; `-p 4` from a server without MULT fetches
    // ranges, whose REST is refused: the file comes whole over one.
    let (port, _) = fake_server(Script::RestRefused);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", "-p", "4", &url], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("refused REST"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("f.bin")).unwrap(),
        pattern_of(MULT_LEN)
    );
}

#[test]
fn a_servers_terminal_escapes_reach_stderr_escaped() {
    let (port, _) = fake_server(Script::EscapesInReply);
    let dir = tempfile::tempdir().unwrap();
    let out = xftp(&["get", &format!("ftp://127.0.0.1:{port}/f")], dir.path());
    assert!(!out.status.success());
    assert!(!out.stderr.contains(&0x1b) && !out.stderr.contains(&0x07));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\\u{1b}]0;PWNED") && err.contains("no such file"),
        "{err}"
    );
}

#[test]
fn a_tree_file_shorter_than_its_listing_fails_where_size_is_refused() {
    let (port, _) = fake_server(Script::ListedSizeShort);
    let dir = tempfile::tempdir().unwrap();
    let out = xftp(
        &["get", "-r", &format!("ftp://127.0.0.1:{port}/d/"), "got"],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("short transfer"), "{err}");
    assert!(!dir.path().join("got/ok.txt").exists(), "{err}");
}

#[test]
fn names_that_would_leave_the_tree_are_reported_not_dropped() {
    let (port, _) = fake_server(Script::HostileMlsd);
    let dir = tempfile::tempdir().unwrap();
    let out = xftp(
        &["get", "-r", &format!("ftp://127.0.0.1:{port}/d/"), "got"],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("3 line(s) of its listing"), "{err}");
    assert!(err.contains("escape1.txt"), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("got/ok.txt")).unwrap().len(),
        FILE_LEN
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["got"], "nothing written beside the target");
}

#[test]
fn a_refused_listing_reports_the_reply_not_the_closed_port() {
    // The server's 550 explains the refused data connection.
    let (port, _) = fake_server(Script::RefusedList);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/nowhere/");
    let out = xftp(&["ls", &url], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("550") && err.contains("No such file or directory"),
        "{err}"
    );
}

#[test]
fn short_transfer_with_226_is_an_error_and_leaves_nothing() {
    let (port, _) = fake_server(Script::ShortWith226);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url, "--json"], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("short transfer") && err.contains("600") && err.contains("1000"),
        "{err}"
    );
    // Nothing kept without -c, and the message says how to keep it, once.
    assert!(err.contains("with -c a cut download is kept"), "{err}");
    assert!(!err.contains("nothing was kept"), "{err}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    // The JSON object says what moved before the failure.
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        (&j["status"], &j["bytes"]),
        (&"error".into(), &600.into()),
        "{j}"
    );
    assert_eq!(j["per_stream_bytes"], serde_json::json!([600]), "{j}");
}

#[test]
fn a_server_that_ignores_rest_leaves_the_partial_as_it_was() {
    // A cut `-c` run keeps 600 bytes; the next one meets a server that
    // answers REST 600 with 350 and sends the file from byte 0. Those
    // bytes are not the ones at 600: that run fails and its bytes are not
    // recorded, so that an honest server's run completes the right file
    // (it was renamed into place with bytes 0-399 at 600, "complete
    // already").
    let dir = tempfile::tempdir().unwrap();
    let get = |script| {
        let (port, _) = fake_server(script);
        let url = format!("ftp://127.0.0.1:{port}/f.bin");
        xftp(&["get", "-c", "-p", "1", &url], dir.path())
    };
    assert!(!get(Script::PatternCut).status.success());
    let out = get(Script::PatternIgnoresRest);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ignored REST") && err.contains("without -c") && !err.contains("with -c"),
        "{err}"
    );
    assert!(!dir.path().join("f.bin").exists());
    let out = get(Script::Pattern);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(std::fs::read(dir.path().join("f.bin")).unwrap(), pattern());
}

#[test]
fn copies_that_differ_fail_a_transfer_without_the_endgame() {
    // Without the endgame agreed, every EOD counts and a second copy of a
    // range is compared however late it comes: the zeros that came first
    // were taken as the file, and the transfer "succeeded".
    let (port, seen) = fake_server(Script::MultCopyDiffers);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", "-p", "2", "--timeout", "5", &url], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    let said: Vec<String> = seen.try_iter().collect();
    assert!(said.iter().any(|c| c == "MULT 2"), "{said:?}");
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("overlaps") || err.contains("differ"), "{err}");
    assert!(err.contains("the server sent data"), "{err}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn markers_that_count_nothing_more_do_not_hold_off_the_timeout() {
    let (port, _) = fake_server(Script::MarkersForever);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", "-p", "1", "--timeout", "2", &url])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: without the fix it waits for ever.
    while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("final reply"), "{err}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn a_file_that_grew_during_the_download_is_not_called_short() {
    let (port, _) = fake_server(Script::Grown);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("size changed: received 1500 bytes")
            && err.contains("changed on the server during the transfer")
            && !err.contains("with -c"),
        "{err}"
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn an_upload_the_server_gives_up_on_reports_its_reason() {
    // The reset data connection is not the story: the server's 426 is.
    let (port, seen) = fake_server(Script::DiskFull);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 32 << 20]).unwrap();
    let url = format!("ftp://127.0.0.1:{port}/big");
    let out = xftp(&["put", "big", &url, "-p", "1"], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    // A stock server wrote the prefix under the target's name: the client
    // asks it to go, and says it may still be there (this one has no DELE).
    let cmds: Vec<String> = seen.try_iter().collect();
    assert!(cmds.iter().any(|c| c == "DELE big"), "{cmds:?}");
    assert!(
        err.contains("may keep an incomplete copy under big"),
        "{err}"
    );
}

#[test]
fn stalled_data_connection_times_out() {
    let (port, _) = fake_server(Script::Stall);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let t0 = std::time::Instant::now();
    let out = xftp(&["get", &url, "--timeout", "1"], dir.path());
    assert!(!out.status.success());
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the stall was not cut short"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("timed out") && err.contains("--timeout"),
        "{err}"
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn an_interrupted_download_leaves_nothing() {
    // SIGINT and SIGTERM mid-transfer (the stalled server holds the data
    // connection open): the temporary is removed, exit 128 + signal.
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let (port, _) = fake_server(Script::Stall);
        let dir = tempfile::tempdir().unwrap();
        let url = format!("ftp://127.0.0.1:{port}/f.bin");
        let child = Command::new(env!("CARGO_BIN_EXE_xftp"))
            .args(["get", &url, "--json"])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the download's temporary exists.
        let t0 = std::time::Instant::now();
        while entries(dir.path()).is_empty() && t0.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(entries(dir.path()).len(), 1, "no temporary appeared");
        let out = signal_and_wait(child, sig);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert!(err.contains(&format!("interrupted (SIG{sig})")), "{err}");
        // Without -c nothing is kept, and the message says how to keep it.
        assert!(err.contains("with -c a cut download is kept"), "{err}");
        // With --json, the one object a failure prints.
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(j["status"], "error", "{j}");
        assert_eq!(j["error"], format!("interrupted (SIG{sig})"), "{j}");
        assert_eq!(entries(dir.path()), Vec::<String>::new());
    }
}

#[test]
fn an_interrupted_stream_mode_upload_resets_its_data_connection() {
    // In stream mode a clean close is the end of the file: an upload cut
    // short by Ctrl-C must reset the connection, or the server stores a
    // short file as complete.
    let (port, seen) = fake_server(Script::SlowStore);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![1u8; 16 << 20]).unwrap();
    let url = format!("ftp://127.0.0.1:{port}/big");
    let child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["put", "big", &url, "-p", "1"])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the upload to start, then interrupt it.
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if seen
            .recv_timeout(Duration::from_secs(10))
            .is_ok_and(|l| l.starts_with("STOR"))
        {
            break;
        }
    }
    thread::sleep(Duration::from_millis(300));
    let out = signal_and_wait(child, "INT");
    assert_eq!(out.status.code(), Some(130));
    let end = loop {
        match seen.recv_timeout(Duration::from_secs(10)) {
            Ok(l) if l.starts_with("DATA") => break l,
            Ok(_) => continue,
            Err(e) => panic!("the data connection did not end: {e}"),
        }
    };
    assert_eq!(end, "DATA RESET");
}

#[test]
fn pasv_fallback_uses_the_control_peer_address() {
    let (port, seen) = fake_server(Script::NatPasv);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("f.bin")).unwrap().len(),
        FILE_LEN
    );
    let cmds: Vec<String> = seen.try_iter().collect();
    assert!(cmds.iter().any(|c| c == "EPSV"), "{cmds:?}");
    assert!(cmds.iter().any(|c| c == "PASV"), "{cmds:?}");
}

#[test]
fn upload_with_wrong_server_size_is_an_error() {
    let (port, _) = fake_server(Script::UploadSizeLies);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("u.bin"), vec![7u8; 500]).unwrap();
    let url = format!("ftp://127.0.0.1:{port}/u.bin");
    let out = xftp(&["put", "u.bin", &url], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SIZE") && err.contains("499") && err.contains("500"),
        "{err}"
    );
}

#[test]
fn abort_after_all_data_is_an_error() {
    let (port, _) = fake_server(Script::AbortAfterData);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("426"), "{err}");
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn login_is_pipelined_and_anonymous() {
    let (port, seen) = fake_server(Script::Honest);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cmds: Vec<String> = seen.try_iter().collect();
    assert_eq!(cmds[0], "USER anonymous");
    assert!(
        cmds[1].starts_with("PASS ") && cmds[1].contains('@'),
        "{cmds:?}"
    );
    assert_eq!(cmds[2], "TYPE I");
    // SIZE goes out with EPSV, before RETR, so a short transfer is caught.
    let size = cmds
        .iter()
        .position(|c| c == "SIZE f.bin")
        .expect("SIZE sent");
    let retr = cmds
        .iter()
        .position(|c| c == "RETR f.bin")
        .expect("RETR sent");
    assert!(size < retr, "{cmds:?}");
}

#[test]
fn crlf_in_url_path_is_refused_before_connecting() {
    // A listener that would record any connection attempt.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/a%0D%0ADELE%20b");
    let out = xftp(&["get", &url, "x"], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CR"), "{err}");
    assert!(l.accept().is_err(), "no connection may be made");
}

#[test]
fn a_directory_where_a_file_is_expected_points_to_r() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tree")).unwrap();
    let url = format!("ftp://127.0.0.1:{port}/up/");
    let out = xftp(&["put", "tree", &url], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "tree is a directory — send the whole tree with `xftp put -r tree {url}`"
        )),
        "{err}"
    );
    let out = xftp(&["get", &url, "x"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("`xftp get -r {url} LOCAL_DIR`")),
        "{err}"
    );
    assert!(l.accept().is_err(), "no connection is needed to tell");
}

#[test]
fn a_closed_stderr_is_no_crash() {
    // `xftp get ... 2>&1 | head -1`: the reader has left when the error
    // is written. The exit status is the command's (1: nothing listens
    // on that port), not a panic's 101.
    let dir = tempfile::tempdir().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["get", &format!("ftp://127.0.0.1:{port}/f"), "f"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
}

#[test]
fn a_server_that_greets_and_then_stands_still_is_named_at_the_login() {
    // An overloaded server, or a path that stalled after the greeting:
    // the login's replies never come. Nothing was transferred, so no word
    // of data connections (--active) or of what -c would have kept; a
    // tree says the same, not a later command's timeout.
    let dir = tempfile::tempdir().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // (Left running: it holds every connection open to the test's end.)
    thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming() {
            let Ok(mut c) = c else { break };
            let _ = c.write_all(b"220 hello\r\n");
            held.push(c);
        }
    });
    for args in [
        vec!["get", "--timeout", "1"],
        vec!["get", "-r", "--timeout", "1"],
        vec!["ls", "--timeout", "1"],
    ] {
        let url = match args.get(1) {
            Some(&"-r") => format!("ftp://127.0.0.1:{port}/d/"),
            _ if args[0] == "ls" => format!("ftp://127.0.0.1:{port}/"),
            _ => format!("ftp://127.0.0.1:{port}/f"),
        };
        let mut argv = args.clone();
        argv.push(&url);
        if args[0] == "get" {
            argv.push("out");
        }
        let out = xftp(&argv, dir.path());
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("waiting for the server's answer to the login")
                && err.contains("stopped answering at the login")
                && !err.contains("--active")
                && !err.contains("what arrived"),
            "{args:?}: {err}"
        );
        assert!(entries(dir.path()).is_empty(), "{args:?}");
    }
}

#[test]
fn a_port_that_is_no_ftp_servers_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    // Silent after accepting (an HTTP server waits for a request), then
    // an SSH banner: neither is an FTP greeting.
    for banner in [None, Some("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            if let Some(b) = banner {
                c.write_all(b.as_bytes()).unwrap();
            }
            let _ = c.read(&mut [0u8; 64]);
            thread::sleep(Duration::from_millis(1500));
        });
        let url = format!("ftp://127.0.0.1:{port}/f");
        let out = xftp(&["get", "--timeout", "1", &url, "f"], dir.path());
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no FTP server's greeting")
                && err.contains(&format!("is 127.0.0.1:{port} an FTP server's address?")),
            "{banner:?}: {err}"
        );
        if banner.is_some() {
            assert!(err.contains("SSH-2.0"), "{err}");
        } else {
            assert!(err.contains("no complete one within 1 s"), "{err}");
        }
        t.join().unwrap();
        assert!(entries(dir.path()).is_empty());
    }
    // Closed without a word (an implicit-TLS port that gave up waiting
    // for a ClientHello): named as no greeting, with ftps:// in the hint,
    // not as a server that hung up and may be tried again.
    // So is explicit TLS (ftpes://), which also waits for a greeting
    // first; neither is retried.
    for scheme in ["ftp", "ftpes"] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = thread::spawn(move || drop(l.accept().unwrap()));
        let out = xftp(
            &[
                "get",
                &format!("{scheme}://127.0.0.1:{port}/f"),
                "f",
                "--retries",
                "2",
            ],
            dir.path(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("no FTP server's greeting: the server closed the connection without one")
                && err.contains("ftps:// for implicit TLS")
                && !err.contains("runs"),
            "{scheme}: {err}"
        );
        t.join().unwrap();
    }
    // Silent for longer than a greeting takes: the user hears that the
    // client still waits, and why that is odd, before the timeout.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = thread::spawn(move || {
        let c = l.accept().unwrap();
        thread::sleep(Duration::from_millis(5600));
        drop(c);
    });
    let out = xftp(
        &["get", &format!("ftp://127.0.0.1:{port}/f"), "f"],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("no greeting from 127.0.0.1:{port} after 5 s"))
            && err.contains("implicit-TLS port (ftps://)"),
        "{err}"
    );
    t.join().unwrap();
}

/// Round trips (issue 3 point 9), counted without a clock on the client
/// side: this server holds its replies until the client has gone quiet
/// for a moment, then sends them all and starts a new "flight". A command
/// the client sends without waiting for an answer lands in the same flight
/// as the commands before it.
fn flight_recorder() -> (u16, mpsc::Receiver<(u32, String)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let Ok((ctl, _)) = l.accept() else { return };
        let _ = flights(ctl, &tx);
    });
    (port, rx)
}

fn flights(ctl: TcpStream, seen: &mpsc::Sender<(u32, String)>) -> std::io::Result<()> {
    // Quiet time that ends a flight: far longer than the gap between two
    // writes the client issues back to back.
    ctl.set_read_timeout(Some(Duration::from_millis(1000)))?;
    let mut w = ctl.try_clone()?;
    let mut r = BufReader::new(ctl);
    w.write_all(b"220 flight recorder\r\n")?;
    let mut flight = 1u32;
    let mut pending = String::new();
    let mut data: Option<TcpListener> = None;
    let mut line = Vec::new();
    loop {
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !pending.is_empty() {
                    w.write_all(pending.as_bytes())?;
                    pending.clear();
                    flight += 1;
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        let cmd = String::from_utf8_lossy(&line).trim_end().to_owned();
        line.clear();
        let _ = seen.send((flight, cmd.clone()));
        let verb = cmd.split(' ').next().unwrap_or("").to_ascii_uppercase();
        match verb.as_str() {
            "USER" => pending.push_str("331 password\r\n"),
            "PASS" => pending.push_str("230 in\r\n"),
            "TYPE" => pending.push_str("200 ok\r\n"),
            "SIZE" => pending.push_str(&format!("213 {FILE_LEN}\r\n")),
            "EPSV" => {
                let dl = TcpListener::bind("127.0.0.1:0")?;
                let p = dl.local_addr()?.port();
                data = Some(dl);
                pending.push_str(&format!("229 Entering Extended Passive Mode (|||{p}|)\r\n"));
            }
            "RETR" => {
                w.write_all(pending.as_bytes())?;
                pending.clear();
                let Some(dl) = data.take() else {
                    w.write_all(b"425 no data connection\r\n")?;
                    continue;
                };
                w.write_all(b"150 here\r\n")?;
                let (mut d, _) = dl.accept()?;
                d.write_all(&[b'y'; FILE_LEN])?;
                drop(d);
                w.write_all(b"226 done\r\n")?;
                flight += 1;
            }
            "QUIT" => {
                w.write_all(pending.as_bytes())?;
                w.write_all(b"221 bye\r\n")?;
                return Ok(());
            }
            _ => pending.push_str("502 no\r\n"),
        }
    }
}

/// The flights of one download with `extra` arguments.
fn download_flights(extra: &[&str]) -> Vec<(u32, String)> {
    let (port, seen) = flight_recorder();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let mut args = vec!["get", url.as_str()];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(&args)
        .current_dir(dir.path())
        .env("XDG_CACHE_HOME", dir.path().join("cache"))
        .output()
        .expect("run xftp");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("f.bin")).unwrap().len(),
        FILE_LEN
    );
    seen.try_iter().collect()
}

fn flight_of(log: &[(u32, String)], prefix: &str) -> u32 {
    log.iter()
        .find(|(_, c)| c.starts_with(prefix))
        .map(|(f, _)| *f)
        .unwrap_or_else(|| panic!("{prefix} not sent: {log:?}"))
}

/// `-p auto` (the default) needs no more round trips than a fixed count:
/// its starting count comes from the handshake RTT and the cache, so
/// `OPTS MULT FRAMED` and MULT go out with the login, and SIZE and EPSV in the same flight.
/// This server refuses both (it lists nothing), and the download falls back
/// to one plain connection.
#[test]
fn auto_download_needs_two_control_flights_before_the_data() {
    let log = download_flights(&[]);
    for c in [
        "USER",
        "PASS",
        "TYPE",
        "FEAT",
        "OPTS MULT ENDGAME",
        "OPTS MULT FRAMED",
        "MULT",
        "SIZE",
        "EPSV",
    ] {
        assert_eq!(flight_of(&log, c), 1, "{c}: {log:?}");
    }
    assert_eq!(flight_of(&log, "RETR"), 2, "{log:?}");
}

#[test]
fn download_needs_two_control_flights_before_the_data() {
    let (port, seen) = flight_recorder();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ftp://127.0.0.1:{port}/f.bin");
    let out = xftp(&["get", &url, "-p", "1"], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("f.bin")).unwrap().len(),
        FILE_LEN
    );
    let log: Vec<(u32, String)> = seen.try_iter().collect();
    let flight_of = |prefix: &str| {
        log.iter()
            .find(|(_, c)| c.starts_with(prefix))
            .map(|(f, _)| *f)
            .unwrap_or_else(|| panic!("{prefix} not sent: {log:?}"))
    };
    // USER, PASS, TYPE I, SIZE and EPSV travel together...
    for c in ["USER", "PASS", "TYPE", "SIZE"] {
        assert_eq!(
            flight_of(c),
            flight_of("EPSV"),
            "{c} not pipelined: {log:?}"
        );
    }
    // ...and RETR follows right after the EPSV reply.
    assert_eq!(flight_of("RETR"), flight_of("EPSV") + 1, "{log:?}");
}

#[test]
fn a_hostile_server_gets_a_clear_error_and_no_file() {
    for (script, words) in [
        (Script::HugeLine, "longer than 8192 bytes"),
        (Script::EndlessReply, "lines"),
        (Script::PortZero, "port"),
    ] {
        let (port, _seen) = fake_server(script);
        let dir = tempfile::tempdir().unwrap();
        let t = std::time::Instant::now();
        let out = xftp(
            &[
                "get",
                "-p",
                "1",
                "--timeout",
                "10",
                &format!("ftp://127.0.0.1:{port}/f"),
                "f",
            ],
            dir.path(),
        );
        assert!(!out.status.success(), "{script:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.to_lowercase().contains(words), "{script:?}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{script:?} took {:?}",
            t.elapsed()
        );
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{script:?}");
    }
}

#[test]
fn a_range_reset_mid_read_leaves_its_session_in_step() {
    // The first range's data connection is reset: the session reads past
    // that RETR's 426 (ABOR, PWD) and fetches the ranges again on the
    // same control connection; every later reply goes to its own command.
    let (port, seen) = fake_server(Script::RangedResetOnce);
    let dir = tempfile::tempdir().unwrap();
    let out = xftp(
        &[
            "get",
            "-p",
            "2",
            "--timeout",
            "10",
            &format!("ftp://127.0.0.1:{port}/f"),
            "got",
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("got")).unwrap(),
        ranged_body()
    );
    let cmds: Vec<String> = seen.try_iter().collect();
    let retrs = cmds.iter().filter(|c| c.starts_with("RETR")).count();
    assert!(retrs >= 3, "{cmds:?}");
    assert!(cmds.iter().any(|c| c == "PWD"), "no resync: {cmds:?}");
}

/// Local mistakes are named before anything connects (port 1 has no
/// server): `-` as a target, a target directory that is not there, a
/// tree to upload that is missing or is a file.
#[test]
fn local_mistakes_are_named_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    for (args, says) in [
        (
            &["get", "ftp://127.0.0.1:1/f", "-"][..],
            "(standard output) is not a target",
        ),
        (
            &["get", "ftp://127.0.0.1:1/f", "nd/"],
            "nd/ does not exist as a directory",
        ),
        (
            &["put", "-r", "missing", "ftp://127.0.0.1:1/x/"],
            "missing does not exist",
        ),
        (
            &["put", "-r", "file", "ftp://127.0.0.1:1/x/"],
            "file is not a directory",
        ),
        (
            &["put", "nothere", "ftp://127.0.0.1:1/x/"],
            "nothere: no such file",
        ),
    ] {
        let out = xftp(args, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(!err.contains("cannot connect"), "{args:?}: {err}");
    }
    assert!(!dir.path().join("-").exists() && !dir.path().join("nd").exists());
}

#[test]
fn a_tree_concurrency_of_zero_is_refused() {
    // Not silently one: a count of sessions in flight is 1 to 1024.
    let dir = tempfile::tempdir().unwrap();
    for n in ["0", "1025"] {
        let out = xftp(
            &["get", "-r", "--concurrency", n, "ftp://127.0.0.1:1/d/", "x"],
            dir.path(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("--concurrency"), "{err}");
    }
}
