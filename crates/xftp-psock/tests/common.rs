//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// 1 MiB of pseudo-random bytes.
pub fn block() -> Vec<u8> {
    let mut x = 0x9e37_79b9u32;
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Write `total` bytes (the block, rotated per chunk so order matters) with
/// write sizes varying; returns the SHA-256 of what was written.
pub async fn write_pattern<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    total: u64,
) -> std::io::Result<[u8; 32]> {
    let b = block();
    let mut h = Sha256::new();
    let mut left = total;
    let mut i = 0usize;
    while left > 0 {
        let start = (i * 4099) % b.len();
        let n = ((b.len() - start) as u64)
            .min(left)
            .min(300_000 + (i as u64 % 7) * 50_000) as usize;
        let chunk = &b[start..start + n];
        w.write_all(chunk).await?;
        h.update(chunk);
        left -= n as u64;
        i += 1;
    }
    Ok(h.finalize().into())
}

/// Read to the end; returns (bytes, SHA-256).
pub async fn read_hash<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<(u64, [u8; 32])> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((total, h.finalize().into()));
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
}

/// A loopback TCP relay in front of a listener, so tests can stall or
/// reset individual connections of a group.
pub struct Relay {
    pub addr: std::net::SocketAddr,
    /// Pauses client->server forwarding of a connection (by accept order).
    pub pause: Vec<watch::Sender<bool>>,
    kill: Arc<Mutex<Vec<Option<tokio::sync::oneshot::Sender<()>>>>>,
}

impl Relay {
    pub async fn start(target: std::net::SocketAddr, n: usize) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut pause = Vec::new();
        let mut pause_rx = Vec::new();
        for _ in 0..n {
            let (t, r) = watch::channel(false);
            pause.push(t);
            pause_rx.push(r);
        }
        let kill = Arc::new(Mutex::new(Vec::new()));
        let k2 = kill.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while let Ok((c, _)) = l.accept().await {
                let s = TcpStream::connect(target).await.unwrap();
                let gate = pause_rx
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| watch::channel(false).1);
                let (kt, kr) = tokio::sync::oneshot::channel();
                k2.lock().unwrap().push(Some(kt));
                tokio::spawn(forward(c, s, gate, kr));
                i += 1;
            }
        });
        Relay { addr, pause, kill }
    }

    /// Reset both sides of relayed connection `i` (RST, not FIN).
    pub fn kill(&self, i: usize) {
        if let Some(k) = self.kill.lock().unwrap().get_mut(i).and_then(Option::take) {
            let _ = k.send(());
        }
    }
}

async fn forward(
    c: TcpStream,
    s: TcpStream,
    mut gate: watch::Receiver<bool>,
    kill: tokio::sync::oneshot::Receiver<()>,
) {
    let (mut cr, mut cw) = c.into_split();
    let (mut sr, mut sw) = s.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            while *gate.borrow() {
                if gate.changed().await.is_err() {
                    break;
                }
            }
            let n = cr.read(&mut buf).await?;
            if n == 0 {
                sw.shutdown().await?;
                return Ok::<_, std::io::Error>(());
            }
            sw.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = sr.read(&mut buf).await?;
            if n == 0 {
                cw.shutdown().await?;
                return Ok::<_, std::io::Error>(());
            }
            cw.write_all(&buf[..n]).await?;
        }
    };
    tokio::select! {
        _ = async { let _ = tokio::join!(up, down); } => {}
        _ = kill => {
            let _ = cr.as_ref().set_zero_linger();
            let _ = sr.as_ref().set_zero_linger();
        }
    }
}
