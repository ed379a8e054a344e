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

/// The control connection of a scripted FTP server: the greeting, the
/// command lines, the replies. The login and the usual settings are
/// answered here; the test answers the rest.
pub struct Script {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

impl Script {
    /// Take the next connection on `l` and greet it.
    pub async fn accept(l: &tokio::net::TcpListener) -> Script {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let (s, _) = l.accept().await.unwrap();
        let (r, mut w) = s.into_split();
        w.write_all(b"220 scripted\r\n").await.unwrap();
        Script {
            lines: tokio::io::BufReader::new(r).lines(),
            w,
        }
    }

    /// The next command line for the test to answer: USER, PASS, TYPE,
    /// OPTS and MODE are answered here (331, 230, 200). `None` at QUIT
    /// (answered 221) or when the client is gone.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            let line = self.lines.next_line().await.ok()??;
            let verb = line
                .split_ascii_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            let reply = match verb.as_str() {
                "USER" => "331 go on",
                "PASS" => "230 in",
                "TYPE" | "OPTS" | "MODE" => "200 ok",
                "QUIT" => {
                    self.say("221 bye").await;
                    return None;
                }
                _ => return Some(line),
            };
            if !self.say(reply).await {
                return None;
            }
        }
    }

    /// Send the reply line `reply`; `false` when the client is gone.
    pub async fn say(&mut self, reply: &str) -> bool {
        use tokio::io::AsyncWriteExt;
        self.w
            .write_all(format!("{reply}\r\n").as_bytes())
            .await
            .is_ok()
    }
}
