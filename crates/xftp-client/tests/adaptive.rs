//! The client's control loop changing the connection count of a running
//! transfer, against the real server in-process, through a proxy that
//! paces every data connection to 2 MB/s (so more connections carry more).
//!
//! The controller is the real one with a configuration that never sees a
//! queue and never stops growing for lack of gain: its decisions are then a
//! known sequence (double every epoch up to the cap), which isolates what
//! is tested here — MULT mid-transfer, new data connections joining the
//! engine, content intact — from the controller's judgement (tested in
//! xftp-tune, and end to end in crates/xftp/tests/tune_auto.rs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xftp_client::xftp_tune::TuneConfig;
use xftp_client::{AutoConfig, Client, ClientConfig, DataMode};

mod common;
use common::{pattern, server, server_with, Server};

/// Growth every epoch, whatever goodput and RTT say.
fn forced_growth() -> AutoConfig {
    AutoConfig {
        tune: TuneConfig {
            max_streams: 8,
            gain: -1.0,
            queue_delay_min: Duration::from_secs(3600),
            heavy_queue_min: Duration::from_secs(3600),
            heavy_loss: f64::INFINITY,
            min_epoch: Duration::from_millis(200),
            ..TuneConfig::default()
        },
        cached_best: None,
    }
}

async fn client(port: u16, mode: DataMode) -> Client {
    let cfg = ClientConfig {
        auto: Some(forced_growth()),
        data_mode: mode,
        ..ClientConfig::default()
    };
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    c
}

/// The proxy rewrites 229 replies (passive) and EPRT commands (active) so
/// every data connection passes through it, paced to `rate` bytes/s.
mod throttle {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    pub fn start(server_port: u16, rate: u64, count: Arc<AtomicUsize>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let count = count.clone();
                thread::spawn(move || control(c, server_port, rate, count));
            }
        });
        port
    }

    fn control(client: TcpStream, server_port: u16, rate: u64, count: Arc<AtomicUsize>) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else {
            return;
        };
        let (Ok(c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        let up_count = count.clone();
        thread::spawn(move || {
            let mut lines = BufReader::new(c2);
            let mut line = String::new();
            loop {
                line.clear();
                match lines.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if let Some(p) = eprt_port(&line) {
                    let proxy = active_proxy(p, rate, up_count.clone());
                    line = format!("EPRT |1|127.0.0.1|{proxy}|\r\n");
                }
                if s2.write_all(line.as_bytes()).is_err() {
                    break;
                }
            }
            let _ = s2.shutdown(Shutdown::Write);
        });
        let mut client = client;
        let mut lines = BufReader::new(server);
        let mut line = String::new();
        loop {
            line.clear();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(p) = epsv_port(&line) {
                let proxy = data_proxy(p, rate, count.clone());
                line = format!("229 Entering Extended Passive Mode (|||{proxy}|)\r\n");
            }
            if client.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        let _ = client.shutdown(Shutdown::Write);
    }

    fn epsv_port(line: &str) -> Option<u16> {
        if !line.starts_with("229 ") {
            return None;
        }
        let start = line.find("(|||")? + 4;
        let end = start + line[start..].find('|')?;
        line[start..end].parse().ok()
    }

    fn eprt_port(line: &str) -> Option<u16> {
        let rest = line.strip_prefix("EPRT |1|127.0.0.1|")?;
        rest.split('|').next()?.parse().ok()
    }

    /// Active mode: the server connects here; we connect to the client.
    fn active_proxy(client_port: u16, rate: u64, count: Arc<AtomicUsize>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(c) = TcpStream::connect(("127.0.0.1", client_port)) else {
                    return;
                };
                pump(s.try_clone().unwrap(), c.try_clone().unwrap(), rate);
                pump(c, s, rate);
            }
        });
        port
    }

    fn data_proxy(server_port: u16, rate: u64, count: Arc<AtomicUsize>) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(s) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    return;
                };
                pump(s.try_clone().unwrap(), c.try_clone().unwrap(), rate);
                pump(c, s, rate);
            }
        });
        port
    }

    fn pump(mut from: TcpStream, mut to: TcpStream, rate: u64) {
        thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            let t0 = Instant::now();
            let mut moved = 0u64;
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                moved += n as u64;
                let due = Duration::from_secs_f64(moved as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    thread::sleep(wait);
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}

fn check_grew(r: &xftp_client::TransferReport, len: u64, what: &str) {
    assert_eq!(r.bytes, len, "{what}");
    assert_eq!(r.per_stream_bytes.iter().sum::<u64>(), len, "{what}");
    let t = r.timeline.as_ref().expect("timeline");
    assert!(t.adaptive, "{what}: {t:?}");
    assert_eq!(t.start, 1, "{what}: loopback starts at 1: {t:?}");
    assert!(
        r.per_stream_bytes.len() >= 4,
        "{what}: connections were not added: {:?} {t:?}",
        r.per_stream_bytes
    );
    // Connections that joined late carried payload too.
    assert!(
        r.per_stream_bytes.iter().filter(|&&b| b > 0).count() >= 4,
        "{what}: {:?}",
        r.per_stream_bytes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_grows_mid_transfer_and_keeps_every_byte() {
    let srv = server().await;
    let count = Arc::new(AtomicUsize::new(0));
    let port = throttle::start(srv.port, 2_000_000, count.clone());
    let local = tempfile::tempdir().unwrap();
    let data = pattern(12 << 20, 1);
    std::fs::write(local.path().join("up.bin"), &data).unwrap();
    let mut c = client(port, DataMode::Passive).await;
    let r = c
        .upload(&local.path().join("up.bin"), "up.bin")
        .await
        .unwrap();
    c.quit().await;
    check_grew(&r, data.len() as u64, "upload");
    assert_eq!(count.load(Ordering::SeqCst), r.per_stream_bytes.len());
    assert!(
        std::fs::read(srv.dir.path().join("up.bin")).unwrap() == data,
        "uploaded content differs"
    );
}

/// Download a 12 MiB file from `srv` through the throttle in passive mode
/// and check it arrived intact; returns the report and the number of data
/// connections the proxy carried.
async fn throttled_download(srv: &Server, seed: u8) -> (xftp_client::TransferReport, usize) {
    let count = Arc::new(AtomicUsize::new(0));
    let port = throttle::start(srv.port, 2_000_000, count.clone());
    let data = pattern(12 << 20, seed);
    std::fs::write(srv.dir.path().join("down.bin"), &data).unwrap();
    let local = tempfile::tempdir().unwrap();
    let mut c = client(port, DataMode::Passive).await;
    let r = c
        .download("down.bin", &local.path().join("down.bin"))
        .await
        .unwrap();
    c.quit().await;
    assert_eq!(r.bytes, data.len() as u64);
    assert!(
        std::fs::read(local.path().join("down.bin")).unwrap() == data,
        "downloaded content differs"
    );
    (r, count.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_grows_mid_transfer_and_keeps_every_byte() {
    let srv = server().await;
    let (r, carried) = throttled_download(&srv, 2).await;
    check_grew(&r, r.bytes, "download");
    assert_eq!(carried, r.per_stream_bytes.len());
}

/// A download opens the connections it asks for together with `MULT`,
/// before the grant. The server grants 3 of the 4 asked: the one it never
/// takes waits on its passive port, carries nothing, and is reset when the
/// transfer ends, which must neither lose a byte nor fail the transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_keeps_every_byte_when_granted_fewer_than_it_opened() {
    let srv = server_with(|cfg| cfg.max_streams = 3).await;
    let (r, _) = throttled_download(&srv, 4).await;
    let used = r.per_stream_bytes.iter().filter(|&&b| b > 0).count();
    assert_eq!(used, 3, "{:?} {:?}", r.per_stream_bytes, r.timeline);
    assert!(
        r.per_stream_bytes.len() > used,
        "no connection was opened ahead of the grant: {:?}",
        r.per_stream_bytes
    );
}

/// Active mode: the server opens the added connections to our listening
/// port (through the proxy, which stands in for it in EPRT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_mode_grows_both_ways() {
    let srv = server().await;
    let count = Arc::new(AtomicUsize::new(0));
    let port = throttle::start(srv.port, 2_000_000, count.clone());
    let data = pattern(12 << 20, 3);
    std::fs::write(srv.dir.path().join("a.bin"), &data).unwrap();
    let local = tempfile::tempdir().unwrap();
    let mut c = client(port, DataMode::Active).await;
    let r = c
        .download("a.bin", &local.path().join("a.bin"))
        .await
        .unwrap();
    check_grew(&r, data.len() as u64, "active download");
    assert!(std::fs::read(local.path().join("a.bin")).unwrap() == data);
    let r2 = c
        .upload(&local.path().join("a.bin"), "b.bin")
        .await
        .unwrap();
    c.quit().await;
    check_grew(&r2, data.len() as u64, "active upload");
    assert!(std::fs::read(srv.dir.path().join("b.bin")).unwrap() == data);
    assert_eq!(
        count.load(Ordering::SeqCst),
        r.per_stream_bytes.len() + r2.per_stream_bytes.len()
    );
}
