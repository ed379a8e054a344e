//! Test harness: an in-process server on port 0 and a raw control client
//! that asserts reply codes.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use xftp_proto::{Reply, ReplyParser};
use xftp_server::Config;

pub struct Server {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start(tweak: impl FnOnce(&mut Config)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    start_in(dir, tweak).await
}

pub async fn start_in(dir: tempfile::TempDir, tweak: impl FnOnce(&mut Config)) -> Server {
    let mut cfg = Config::new(dir.path()).unwrap();
    cfg.anonymous = true;
    cfg.anonymous_write = true;
    tweak(&mut cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(xftp_server::serve(listener, Arc::new(cfg), stop.clone()));
    Server { addr, dir, stop }
}

pub struct Ctl {
    pub s: TcpStream,
    p: ReplyParser,
}

impl Ctl {
    pub async fn connect(addr: SocketAddr) -> Ctl {
        let s = TcpStream::connect(addr).await.unwrap();
        let mut c = Ctl {
            s,
            p: ReplyParser::new(),
        };
        c.expect(220).await;
        c
    }

    pub async fn login(addr: SocketAddr) -> Ctl {
        let mut c = Ctl::connect(addr).await;
        c.cmd("USER anonymous", 331).await;
        c.cmd("PASS a@b", 230).await;
        c.cmd("TYPE I", 200).await;
        c
    }

    pub async fn read_reply(&mut self) -> Option<Reply> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(r) = self.p.next_reply().unwrap() {
                return Some(r);
            }
            let n = tokio::time::timeout(Duration::from_secs(20), self.s.read(&mut buf))
                .await
                .expect("reply timed out")
                .unwrap();
            if n == 0 {
                return None;
            }
            self.p.feed(&buf[..n]);
        }
    }

    pub async fn expect(&mut self, code: u16) -> Reply {
        let r = self.read_reply().await.expect("connection closed");
        assert_eq!(r.code, code, "unexpected reply {r}");
        r
    }

    pub async fn send_raw(&mut self, data: &[u8]) {
        self.s.write_all(data).await.unwrap();
    }

    pub async fn cmd(&mut self, line: &str, code: u16) -> Reply {
        self.send_raw(format!("{line}\r\n").as_bytes()).await;
        self.expect(code).await
    }

    /// EPSV and connect `n` data connections.
    pub async fn epsv_connect(&mut self, n: usize) -> Vec<TcpStream> {
        let r = self.cmd("EPSV", 229).await;
        let port = xftp_proto::hostport::parse_epsv_reply(&r.text()).unwrap();
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
        }
        v
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

pub async fn read_all(mut s: TcpStream) -> Vec<u8> {
    let mut v = Vec::new();
    s.read_to_end(&mut v).await.unwrap();
    v
}
