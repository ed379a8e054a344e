//! An active-mode download (and upload) starts on the connections the
//! server has opened and takes a late one when it comes: against a
//! scripted server that opens three of four granted connections at once
//! and the fourth only after three seconds (as a lost SYN makes it a
//! second or more later). The same with MPRT, one port per connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use xftp_client::{Client, ClientConfig, DataMode};
use xftp_stripe::{MemFile, Receiver, SendConfig, Sender};

mod common;
use common::{pattern, Script};

/// A control connection answering what `download` and `upload` send;
/// RETR is served by `serve_retr`, STOR by `serve_stor`, which keeps what
/// it received in `data` and in `got`.
async fn scripted_server(l: TcpListener, mut data: Vec<u8>, got: Arc<Mutex<Vec<u8>>>) {
    let mut ctl = Script::accept(&l).await;
    // Where each connection goes: EPRT's one port four times, or MPRT's
    // four ports.
    let mut ports: Option<Vec<u16>> = None;
    while let Some(line) = ctl.next().await {
        let verb = line.split(' ').next().unwrap_or("").to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "MULT" => "200 MULT 4 granted (server maximum 4).".into(),
            "SIZE" => format!("213 {}", data.len()),
            "EPRT" => {
                let a: Vec<&str> = line.split('|').collect();
                ports = a
                    .get(3)
                    .and_then(|p| p.parse::<u16>().ok())
                    .map(|p| vec![p; 4]);
                "200 ok".into()
            }
            "MPRT" => {
                let v: Vec<u16> = line
                    .split_ascii_whitespace()
                    .skip(1)
                    .filter_map(|spec| spec.split('|').nth(3)?.parse().ok())
                    .collect();
                assert_eq!(v.len(), 4, "{line}");
                ports = Some(v);
                "200 ok".into()
            }
            "RETR" => {
                assert!(ctl.say("150 here it comes").await);
                let p = ports.clone().expect("EPRT or MPRT before RETR");
                serve_retr(&p, &data).await;
                "226 done".into()
            }
            "STOR" => {
                assert!(ctl.say("150 send it").await);
                let p = ports.clone().expect("EPRT or MPRT before STOR");
                data = serve_stor(&p).await;
                got.lock().unwrap().clone_from(&data);
                "226 done".into()
            }
            _ => "502 not here".into(),
        };
        if !ctl.say(&reply).await {
            return;
        }
    }
}

/// Three connections at once and the transfer on them; the fourth three
/// seconds later, added to the running transfer if it still runs.
async fn serve_retr(ports: &[u16], data: &[u8]) {
    let mut conns = Vec::new();
    for &port in &ports[..3] {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    let port = ports[3];
    let cfg = SendConfig {
        record_size: 64 * 1024,
        ..SendConfig::default()
    };
    let sender = Sender::file(
        Arc::new(MemFile::from(data.to_vec())),
        data.len() as u64,
        conns,
        &cfg,
    );
    let ctl = sender.control();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = ctl.add_connection(s);
        }
    });
    sender.finish().await.unwrap();
    late.abort();
}

/// The upload's receiving end: three connections at once, the fourth
/// three seconds later, added to the running receive if it still runs.
async fn serve_stor(ports: &[u16]) -> Vec<u8> {
    let mut conns = Vec::new();
    for &port in &ports[..3] {
        conns.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    let port = ports[3];
    let dst = Arc::new(MemFile::default());
    let receiver = Receiver::file(dst.clone(), None, conns);
    let ctl = receiver.control();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = ctl.add_connection(s);
        }
    });
    receiver.finish().await.unwrap();
    late.abort();
    dst.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_upload_does_not_wait_for_a_late_connection() {
    upload_without_the_late_one(DataMode::Active).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mprt_upload_does_not_wait_for_a_late_connection() {
    upload_without_the_late_one(DataMode::Mprt).await;
}

async fn upload_without_the_late_one(data_mode: DataMode) {
    // Large enough for four connections of 256 KiB records.
    let data = pattern(2 * 1024 * 1024 + 7, 5);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(scripted_server(l, Vec::new(), got.clone()));
    let cfg = ClientConfig {
        streams: 4,
        data_mode,
        ..ClientConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, &data).unwrap();
    let t = Instant::now();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    let r = c.upload(&src, "f").await.unwrap();
    let took = t.elapsed();
    assert_eq!(r.bytes, data.len() as u64);
    assert_eq!(r.per_stream_bytes.len(), 3, "{:?}", r.per_stream_bytes);
    // Waiting for the fourth would take its three seconds.
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    assert!(
        *got.lock().unwrap() == data,
        "the server received other bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_download_does_not_wait_for_a_late_connection() {
    download_without_the_late_one(DataMode::Active).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mprt_download_does_not_wait_for_a_late_connection() {
    download_without_the_late_one(DataMode::Mprt).await;
}

async fn download_without_the_late_one(data_mode: DataMode) {
    let data = pattern(512 * 1024 + 7, 9);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(scripted_server(l, data.clone(), Arc::default()));
    let cfg = ClientConfig {
        streams: 4,
        data_mode,
        ..ClientConfig::default()
    };
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("f");
    let t = Instant::now();
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    let r = c.download("f", &dst).await.unwrap();
    let took = t.elapsed();
    assert_eq!(std::fs::read(&dst).unwrap(), data);
    assert_eq!(r.per_stream_bytes.len(), 3, "{:?}", r.per_stream_bytes);
    // Waiting for the fourth would take its three seconds.
    assert!(took < Duration::from_millis(2500), "took {took:?}");
}
