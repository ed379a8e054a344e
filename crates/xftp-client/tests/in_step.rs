//! A session stays in step after a failed transfer. The scripted server
//! sends part of a file, resets the data connection, and only then
//! replies `426` to the RETR (as a server does that learns of the reset
//! from its own socket). The client fails the download on the reset; the
//! `426` is still on its way. The next command on the same session must
//! read its own reply, not that `426`: a session reused out of step reads
//! every later reply one command late (a SIZE taken for an MDTM, a
//! resumed download checked against another file's size).

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use xftp_client::{Client, ClientConfig, ClientError};

mod common;
use common::{pattern, Script};

async fn scripted_server(l: TcpListener, data: Vec<u8>) {
    let mut ctl = Script::accept(&l).await;
    let mut pasv: Option<TcpListener> = None;
    let mut held = Vec::new();
    while let Some(line) = ctl.next().await {
        let mut words = line.split_ascii_whitespace();
        let verb = words.next().unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "EPSV" => {
                let d = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let p = d.local_addr().unwrap().port();
                pasv = Some(d);
                format!("229 Entering Extended Passive Mode (|||{p}|)")
            }
            "SIZE" => match words.next() {
                Some("first") | Some("held") => format!("213 {}", data.len()),
                Some("second") => "213 777".into(),
                _ => "550 no such file".into(),
            },
            "MDTM" => "213 20260101000000".into(),
            "RETR" if words.next() == Some("held") => {
                // Part of the file, then nothing: the connection stays
                // open while the server replies that it gave up.
                let d = pasv.take().expect("EPSV before RETR");
                assert!(ctl.say("150 here it comes").await);
                let (mut conn, _) = d.accept().await.unwrap();
                conn.write_all(&data[..data.len() / 4]).await.unwrap();
                held.push(conn);
                tokio::time::sleep(Duration::from_millis(200)).await;
                "426 Connection closed; transfer aborted: data connection reset".into()
            }
            "RETR" => {
                let d = pasv.take().expect("EPSV before RETR");
                assert!(ctl.say("150 here it comes").await);
                let (mut conn, _) = d.accept().await.unwrap();
                // Let the client's connect complete before the reset.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = conn.write_all(&data[..data.len() / 3]).await;
                // A reset, not an orderly close: no EOF that might pass
                // for the end of the file.
                let s = socket2::SockRef::from(&conn);
                s.set_linger(Some(Duration::ZERO)).unwrap();
                drop(conn);
                // The server's own reply comes after the client saw
                // the reset.
                tokio::time::sleep(Duration::from_millis(300)).await;
                "426 Connection closed; transfer aborted".into()
            }
            _ => "502 not here".into(),
        };
        if !ctl.say(&reply).await {
            return;
        }
    }
}

#[tokio::test]
async fn the_next_command_after_a_cut_download_reads_its_own_reply() {
    let data = pattern(3 * 1024 * 1024, 4);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(scripted_server(l, data.clone()));
    let cfg = ClientConfig {
        streams: 1,
        ..ClientConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    let e = c
        .download("first", &dir.path().join("first"))
        .await
        .expect_err("the data connection was reset");
    assert!(
        matches!(e, ClientError::DataIo(_) | ClientError::Reply { .. }),
        "{e:?}"
    );
    assert!(
        !dir.path().join("first").exists(),
        "a cut download left a file under its name"
    );
    assert!(c.in_step(), "the 426 came within the grace");
    // Out of step, this would read the RETR's 426 (an error), and the
    // MDTM after it the SIZE's 213 777.
    assert_eq!(c.size("second").await.unwrap(), Some(777));
    assert_eq!(
        c.mdtm("second").await.unwrap().as_deref(),
        Some("20260101000000")
    );
    c.quit().await;
    server.abort();
}

/// The same server gives up on a stream-mode download and leaves its
/// data connection open: the client takes the 426 at once, not after its
/// data timeout, and the session stays in step.
#[tokio::test]
async fn a_426_during_a_stream_mode_download_ends_it_at_once() {
    let data = pattern(3 * 1024 * 1024, 5);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(scripted_server(l, data.clone()));
    let cfg = ClientConfig {
        streams: 1,
        data_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    for resume in [false, true] {
        c.set_resume(resume);
        let e = tokio::time::timeout(
            Duration::from_secs(20),
            c.download("held", &dir.path().join("held")),
        )
        .await
        .expect("the 426 ends the download, not the data timeout")
        .expect_err("the server gave up");
        assert_eq!(e.reply_code(), Some(426), "resume {resume}: {e:?}");
        assert!(!dir.path().join("held").exists());
        assert_eq!(c.size("second").await.unwrap(), Some(777));
    }
    c.quit().await;
    server.abort();
}

/// A framed download on two connections that the server gives up on
/// (426) while the client's ends of the connections hear nothing: the
/// client reads the 426 at once instead of waiting for its data timeout.
async fn server_that_gives_up(l: TcpListener) {
    let mut ctl = Script::accept(&l).await;
    let mut port = None;
    let mut held = Vec::new();
    while let Some(line) = ctl.next().await {
        let mut words = line.split_ascii_whitespace();
        let verb = words.next().unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "MULT" => "200 MULT 2 granted (server maximum 2).".into(),
            "EPRT" => {
                port = line.split('|').nth(3).and_then(|p| p.parse::<u16>().ok());
                "200 ok".into()
            }
            "SIZE" => match words.next() {
                Some("big") => "213 4194304".into(),
                Some("second") => "213 777".into(),
                _ => "550 no such file".into(),
            },
            "RETR" => {
                assert!(ctl.say("150 here it comes").await);
                let p = port.take().expect("EPRT before RETR");
                for _ in 0..2 {
                    held.push(
                        tokio::net::TcpStream::connect(("127.0.0.1", p))
                            .await
                            .unwrap(),
                    );
                }
                // One block of 64 KiB at offset 0, then nothing: the
                // connections stay open, as if their peer had vanished.
                let mut block = vec![0u8];
                block.extend_from_slice(&65536u64.to_be_bytes());
                block.extend_from_slice(&0u64.to_be_bytes());
                block.extend(std::iter::repeat(7u8).take(65536));
                held[0].write_all(&block).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                "426 Connection closed; transfer aborted: data connection reset".into()
            }
            _ => "502 not here".into(),
        };
        if !ctl.say(&reply).await {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_426_during_a_framed_download_ends_it_at_once() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let server = tokio::spawn(server_that_gives_up(l));
    let cfg = ClientConfig {
        streams: 2,
        data_mode: xftp_client::DataMode::Active,
        data_timeout: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    let t0 = std::time::Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(20),
        c.download("big", &dir.path().join("big")),
    )
    .await
    .expect("the 426 ends the download, not the data timeout")
    .expect_err("the server gave up");
    assert_eq!(e.reply_code(), Some(426), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(
        !dir.path().join("big").exists(),
        "a download the server gave up on left a file under its name"
    );
    assert_eq!(c.size("second").await.unwrap(), Some(777));
    c.quit().await;
    server.abort();
}
