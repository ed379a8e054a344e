//! The in-process server the client's tests run against.
#![allow(dead_code)]

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub struct Server {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn server() -> Server {
    server_with(|_| {}).await
}

pub async fn server_with(tweak: impl FnOnce(&mut xftp_server::Config)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = xftp_server::Config::new(dir.path()).unwrap();
    cfg.anonymous = true;
    cfg.anonymous_write = true;
    tweak(&mut cfg);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    tokio::spawn(xftp_server::serve(l, Arc::new(cfg), stop.clone()));
    Server { port, dir, stop }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}
