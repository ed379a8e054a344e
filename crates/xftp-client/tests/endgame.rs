//! An upload's endgame: against a scripted server that takes the endgame
//! (`OPTS MULT ENDGAME`, `ALLO` answered 200) and never reads one of the
//! four connections, as if it sat in a retransmission timeout for good.
//! The client sends that connection's records again on the others, the
//! server completes once every byte is in, and the client resets the
//! stuck connection instead of waiting on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use xftp_client::{Client, ClientConfig, DataMode};
use xftp_stripe::{MemFile, Receiver};

mod common;
use common::{pattern, Script};

/// Answers what `upload` sends; STOR's data arrives on four connections
/// to the client's EPRT port, of which the last is never read.
async fn scripted_server(l: TcpListener, got: Arc<Mutex<Option<Vec<u8>>>>) {
    let mut ctl = Script::accept(&l).await;
    let mut port = None;
    let mut allo = None;
    let mut stuck = None;
    while let Some(line) = ctl.next().await {
        let mut words = line.split_ascii_whitespace();
        let verb = words.next().unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "MULT" => "200 MULT 4 granted (server maximum 4).".into(),
            "EPRT" => {
                port = line.split('|').nth(3).and_then(|p| p.parse::<u16>().ok());
                "200 ok".into()
            }
            "ALLO" => {
                allo = words.next().and_then(|n| n.parse::<u64>().ok());
                "200 ALLO: copies taken".into()
            }
            "SIZE" => match got.lock().unwrap().as_ref() {
                Some(d) => format!("213 {}", d.len()),
                None => "550 no such file".into(),
            },
            "STOR" => {
                assert!(ctl.say("150 send it").await);
                let size = allo.take().expect("ALLO before STOR");
                let p = port.expect("EPRT before STOR");
                let mut conns = Vec::new();
                for i in 0..4 {
                    let s = TcpSocket::new_v4().unwrap();
                    if i == 3 {
                        // Its window closes after a few KiB: nothing of
                        // a record is acknowledged whole.
                        s.set_recv_buffer_size(4096).unwrap();
                    }
                    conns.push(s.connect(([127, 0, 0, 1], p).into()).await.unwrap());
                }
                stuck = conns.pop();
                let dst = Arc::new(MemFile::default());
                Receiver::file_endgame(dst.clone(), size, Default::default(), conns)
                    .finish()
                    .await
                    .unwrap();
                *got.lock().unwrap() = Some(dst.to_vec());
                "226 done".into()
            }
            _ => "502 not here".into(),
        };
        if !ctl.say(&reply).await {
            return;
        }
    }
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_sends_a_stuck_connections_records_again_on_the_others() {
    let data = pattern(6 * 1024 * 1024 + 11, 9);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(None));
    let server = tokio::spawn(scripted_server(l, got.clone()));
    let cfg = ClientConfig {
        streams: 4,
        data_mode: DataMode::Active,
        ..ClientConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, &data).unwrap();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    // Without the endgame the upload waits on the stuck connection for
    // good (the data timeout, a minute, then fails).
    let r = tokio::time::timeout(Duration::from_secs(30), c.upload(&src, "f"))
        .await
        .expect("the upload ends without the stuck connection")
        .unwrap();
    assert_eq!(r.bytes, data.len() as u64);
    assert!(r.sent_twice > 0, "nothing sent again");
    // Whole records per connection: with the copies, every byte at least.
    assert!(r.per_stream_bytes.iter().sum::<u64>() >= r.bytes, "{r:?}");
    assert!(
        got.lock().unwrap().as_deref() == Some(&data[..]),
        "the server received other bytes"
    );
    c.quit().await;
    server.abort();
}

/// A server that resets every data connection of an upload and then
/// replies 226 (as one that completed and closed the connections under a
/// client still finishing might): under the endgame (`ALLO` answered 200)
/// its 226 says it holds every byte, so the upload is complete although
/// the client's connections failed; without the endgame the same replies
/// leave the upload failed. Either way the client still checks SIZE.
async fn resetting_server(l: TcpListener, take_endgame: bool, len: u64) {
    let mut ctl = Script::accept(&l).await;
    let mut port = None;
    while let Some(line) = ctl.next().await {
        let verb = line
            .split_ascii_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "MULT" => "200 MULT 4 granted (server maximum 4).".into(),
            "EPRT" => {
                port = line.split('|').nth(3).and_then(|p| p.parse::<u16>().ok());
                "200 ok".into()
            }
            "ALLO" if take_endgame => "200 ALLO: copies taken".into(),
            "SIZE" => format!("213 {len}"),
            "STOR" => {
                assert!(ctl.say("150 send it").await);
                let p = port.expect("EPRT before STOR");
                for _ in 0..4 {
                    let s = TcpSocket::new_v4().unwrap();
                    let c = s.connect(([127, 0, 0, 1], p).into()).await.unwrap();
                    // Closed with a reset.
                    socket2::SockRef::from(&c)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    drop(c);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                "226 done".into()
            }
            _ => "502 not here".into(),
        };
        if !ctl.say(&reply).await {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_226_after_a_failed_connection_completes_an_upload_only_in_the_endgame() {
    let data = pattern(6 * 1024 * 1024 + 11, 5);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, &data).unwrap();
    for endgame in [true, false] {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(resetting_server(l, endgame, data.len() as u64));
        let cfg = ClientConfig {
            streams: 4,
            data_mode: DataMode::Active,
            ..ClientConfig::default()
        };
        let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
        c.login(None, None).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(30), c.upload(&src, "f"))
            .await
            .expect("the upload ends");
        if endgame {
            let r = r.expect("under the endgame the server's 226 completes the upload");
            assert_eq!(r.bytes, data.len() as u64);
        } else {
            let e = r.expect_err("without the endgame a failed connection fails the upload");
            assert!(e.is_transient(), "{e}");
        }
        c.quit().await;
        server.abort();
    }
}
