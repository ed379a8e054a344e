//! Loopback throughput of a PsockStream against a single TcpStream.
//!
//! `psbench tcp BYTES` or `psbench psock N BYTES`; prints one JSON line:
//! {"mode":..,"streams":..,"bytes":..,"seconds":..,"gbit_s":..}.
//! Both ends run in this process (one tokio runtime); run by bench/psock.sh.

use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xftp_psock::{PsockConfig, PsockListener, PsockStream};

const CHUNK: usize = 1 << 20;

async fn pump_out<W: AsyncWrite + Unpin>(w: &mut W, total: u64) -> std::io::Result<()> {
    let buf = vec![0x5au8; CHUNK];
    let mut left = total;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        w.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    w.shutdown().await
}

async fn drain<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "usage: psbench tcp BYTES | psbench psock N BYTES",
        )
    };
    let parse = |s: &String| s.parse::<u64>().map_err(|_| bad());
    let (mode, n, total) = match &args[..] {
        [_, m, b] if m == "tcp" => ("tcp", 1u64, parse(b)?),
        [_, m, n, b] if m == "psock" => ("psock", parse(n)?, parse(b)?),
        _ => return Err(bad()),
    };
    let t;
    let got;
    if mode == "tcp" {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let rx = tokio::spawn(async move {
            let (mut s, _) = l.accept().await?;
            drain(&mut s).await
        });
        t = Instant::now();
        let mut c = TcpStream::connect(addr).await?;
        pump_out(&mut c, total).await?;
        got = rx.await.map_err(std::io::Error::other)??;
    } else {
        let mut cfg = PsockConfig::default();
        if let Some(rs) = std::env::var("PSBENCH_RECORD")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            cfg.record_size = Some(rs);
        }
        let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone()).await?;
        let addr = l.local_addr();
        let rx = tokio::spawn(async move {
            let mut s = l.accept().await?;
            let n = drain(&mut s).await?;
            s.shutdown().await?;
            Ok::<_, std::io::Error>(n)
        });
        t = Instant::now();
        let k = u16::try_from(n).map_err(|_| bad())?;
        let mut c = PsockStream::connect(addr, k, &cfg).await?;
        pump_out(&mut c, total).await?;
        drain(&mut c).await?;
        got = rx.await.map_err(std::io::Error::other)??;
    }
    let secs = t.elapsed().as_secs_f64();
    if got != total {
        return Err(std::io::Error::other(format!("received {got} of {total}")));
    }
    println!(
        "{{\"mode\":\"{mode}\",\"streams\":{n},\"bytes\":{total},\"seconds\":{secs:.3},\"gbit_s\":{:.2}}}",
        total as f64 * 8.0 / secs / 1e9
    );
    Ok(())
}
