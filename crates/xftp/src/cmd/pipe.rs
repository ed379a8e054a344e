//! `xftp send` and `xftp recv`: stdin to stdout over a parallel stream.
//!
//! Either side may listen (`--listen ADDR`) or connect (`HOST:PORT`); the
//! connecting side chooses the number of connections with `-p N`.
//!
//! Completion is confirmed end to end: `send` shuts down its direction and
//! then waits until `recv` closes the reverse direction, which `recv` does
//! only after the whole stream reached stdout. So both exit 0 only when
//! every byte arrived.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use xftp_psock::{PsockConfig, PsockListener, PsockStream, PsockTls};

/// Copy buffer: large enough that one read fills several records.
const BUF: usize = 1024 * 1024;

/// Where to find the peer.
#[derive(clap::Args, Debug, Clone)]
pub struct Endpoint {
    /// Peer to connect to, HOST:PORT (omit when using --listen).
    #[arg(value_name = "HOST:PORT", required_unless_present = "listen")]
    pub peer: Option<String>,
    /// Listen on ADDR (HOST:PORT; port 0 picks a free port) and accept one
    /// group of connections. Prints `listening on HOST:PORT` on stderr.
    #[arg(long, value_name = "ADDR", conflicts_with = "peer")]
    pub listen: Option<String>,
    /// Number of TCP connections (used by the connecting side).
    #[arg(short = 'p', long = "parallel", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub parallel: u16,
    /// Record size in bytes sent on the connections (default: 1 MiB on
    /// one connection, 128 KiB on more; 4 KiB to 8 MiB, as each record
    /// costs a header and a reorder step).
    #[arg(long, value_name = "BYTES", value_parser = parse_record_size)]
    pub record_size: Option<u32>,
    /// Write a JSON summary to stderr at the end.
    #[arg(long)]
    pub json: bool,
    /// Listening side: TLS on every connection with this certificate
    /// chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key", requires = "listen")]
    pub tls_cert: Option<PathBuf>,
    /// Listening side: the private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Connecting side: TLS on every connection, the listener's
    /// certificate checked against the system's CAs (or --cacert).
    #[arg(long, conflicts_with = "listen")]
    pub tls: bool,
    /// Connecting side: trust only the CA certificate(s) in this PEM file
    /// (implies --tls).
    #[arg(long, value_name = "FILE", conflicts_with = "listen")]
    pub cacert: Option<PathBuf>,
    /// Connecting side: TLS without checking the listener's certificate
    /// (implies --tls; anyone on the path can pose as the listener).
    #[arg(long, conflicts_with = "listen")]
    pub insecure: bool,
}

/// `--record-size`: 4 KiB to 8 MiB, with k/M suffixes as the other sizes.
fn parse_record_size(s: &str) -> Result<u32, String> {
    // Within u32 by the range.
    super::transfer::byte_count_within(s, 4 << 10, 8 << 20, "4k to 8M").map(|n| n as u32)
}

/// `xftp send`: stdin to the peer.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    pub ep: Endpoint,
}

/// `xftp recv`: from the peer to stdout.
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    #[command(flatten)]
    pub ep: Endpoint,
}

/// The result of one run, rendered at the end.
#[derive(Serialize, Debug, Default)]
struct Summary {
    status: &'static str,
    bytes: u64,
    seconds: f64,
    streams: usize,
    /// Payload bytes per second over the whole run (bytes despite the
    /// name, like the `get`/`put` summaries).
    throughput_bps: f64,
    per_stream_bytes: Vec<u64>,
    error: Option<String>,
}

fn config(ep: &Endpoint) -> anyhow::Result<PsockConfig> {
    if ep.listen.is_none() && (ep.tls_cert.is_some() || ep.tls_key.is_some()) {
        // clap's `requires` does not hold once both are given.
        anyhow::bail!("--tls-cert and --tls-key are for the listening side (--listen); the connecting side asks for TLS with --tls (and --cacert FILE for a private CA)");
    }
    let tls = if let (Some(c), Some(k)) = (&ep.tls_cert, &ep.tls_key) {
        Some(PsockTls::Server(std::sync::Arc::new(
            xftp_tls::server::ServerTls::load(c, k).context("loading --tls-cert/--tls-key")?,
        )))
    } else if ep.tls || ep.cacert.is_some() || ep.insecure {
        let peer = ep.peer.as_deref().context("no peer address given")?;
        // The name the certificate must carry: the host of HOST:PORT.
        let host = match peer.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => peer,
        };
        if ep.insecure {
            eprintln!("xftp: warning: --insecure: the listener's certificate is not checked; the connections are encrypted, but anyone on the path can pose as the listener");
        }
        let verify = xftp_tls::client::ClientTlsConfig {
            cacert: ep.cacert.clone(),
            insecure: ep.insecure,
        };
        Some(PsockTls::Client(
            xftp_tls::client::ClientTls::new(&verify, host).context("setting up TLS")?,
        ))
    } else {
        None
    };
    Ok(PsockConfig {
        record_size: ep.record_size,
        tls,
        ..PsockConfig::default()
    })
}

async fn open(ep: &Endpoint) -> anyhow::Result<PsockStream> {
    let cfg = config(ep)?;
    if let Some(addr) = &ep.listen {
        let mut l = PsockListener::bind(addr.as_str(), cfg)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        {
            use std::io::Write;
            let mut e = std::io::stderr().lock();
            writeln!(e, "listening on {}", l.local_addr())?;
            e.flush()?;
        }
        Ok(l.accept().await?)
    } else {
        let peer = ep.peer.as_deref().context("no peer address given")?;
        // A host alone or a URL is not an address to connect to: said as
        // such, not as the resolver's "invalid socket address".
        if peer.contains("://")
            || !peer
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            anyhow::bail!(
                "{peer:?} is not HOST:PORT: give the address `--listen` printed at the other end, e.g. 192.0.2.7:7000 or [2001:db8::7]:7000"
            );
        }
        PsockStream::connect(peer, ep.parallel, &cfg)
            .await
            .with_context(|| format!("cannot connect to {peer}"))
    }
}

/// Bytes this run has moved so far, for the summary of a run a signal
/// stops ([`print_interrupted`]).
static MOVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// With `--json`, the summary of a run a signal stopped (SIGINT,
/// SIGTERM): status `error`, the bytes moved until then.
pub fn print_interrupted(why: &str, total: std::time::Duration) {
    let bytes = MOVED.load(std::sync::atomic::Ordering::Relaxed);
    let seconds = total.as_secs_f64();
    let s = Summary {
        status: "error",
        bytes,
        seconds,
        throughput_bps: if seconds > 0.0 {
            bytes as f64 / seconds
        } else {
            0.0
        },
        error: Some(format!("interrupted ({why})")),
        ..Summary::default()
    };
    if let Ok(line) = serde_json::to_string(&s) {
        eprintln!("{line}");
    }
}

/// Copy `r` to `w` until end of input, counting bytes.
/// Which end of a [`pump`] failed.
enum Pumped {
    /// Reading its source.
    Read(std::io::Error),
    /// Writing its sink.
    Write(std::io::Error),
}

async fn pump<R, W>(r: &mut R, w: &mut W, count: &mut u64) -> Result<(), Pumped>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF];
    // Bytes written since the last flush. A producer that pauses (`tail
    // -f`, a log) has what it wrote sent after a moment, not held until a
    // record fills; one that keeps up never waits for the timer.
    let mut unflushed = false;
    loop {
        let mut read = std::pin::pin!(r.read(&mut buf));
        let n = match tokio::time::timeout(FLUSH_AFTER, &mut read).await {
            Ok(n) => n.map_err(Pumped::Read)?,
            Err(_) => {
                if unflushed {
                    w.flush().await.map_err(Pumped::Write)?;
                }
                read.await.map_err(Pumped::Read)?
            }
        };
        if n == 0 {
            return Ok(());
        }
        w.write_all(&buf[..n]).await.map_err(Pumped::Write)?;
        unflushed = true;
        *count += n as u64;
        MOVED.store(*count, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long the input may pause before what came of it is sent on.
const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(10);

/// How long a receiver waits for its first byte before it says what may
/// be wrong (a peer of protocol version 1, which exchanges no roles).
const QUIET_HINT: std::time::Duration = std::time::Duration::from_secs(10);

/// The group version from which each end says first what it is, and the
/// receiver confirms what it wrote out (docs/psock.md): two senders or
/// two receivers joined by mistake fail at once, and a sender never takes
/// a peer that merely closed for a receipt.
const ROLES_FROM: u8 = 2;
const ROLE_SEND: [u8; 4] = *b"XPs2";
const ROLE_RECV: [u8; 4] = *b"XPr2";
/// The receiver's receipt: these 4 bytes and the count written out (u64,
/// big-endian).
const RECEIPT: [u8; 4] = *b"XPok";

/// An error of the connections in words: a peer that vanished (its host
/// down, the path cut) is found out by the members' keepalive after about
/// 40 s of silence, which the OS reports as a bare "timed out".
fn peer_error(e: std::io::Error) -> std::io::Error {
    let e = xftp_tls::plain_io_error(e);
    if e.kind() == std::io::ErrorKind::TimedOut {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the peer stopped answering (no reply for about 40 s: its host down or the path cut); the stream is incomplete",
        )
    } else {
        e
    }
}

/// Say what this end is and check the peer is the other kind.
async fn exchange_roles(s: &mut PsockStream, mine: [u8; 4]) -> anyhow::Result<()> {
    s.write_all(&mine).await.context("sending our role")?;
    s.flush().await.context("sending our role")?;
    let mut peer = [0u8; 4];
    s.read_exact(&mut peer)
        .await
        .map_err(peer_error)
        .context("reading the peer's role (it closed first)")?;
    if matches!(
        (mine, peer),
        (ROLE_SEND, ROLE_RECV) | (ROLE_RECV, ROLE_SEND)
    ) {
        return Ok(());
    }
    // Closed in step, so that the peer reads our role (and says the same)
    // rather than a connection cut under it.
    let _ = s.shutdown().await;
    match (mine, peer) {
        (ROLE_SEND, ROLE_SEND) => anyhow::bail!(
            "the peer is an `xftp send` too, not `xftp recv`: nothing was sent; run `xftp recv` at one end"
        ),
        (ROLE_RECV, ROLE_RECV) => anyhow::bail!(
            "the peer is an `xftp recv` too, not `xftp send`: nothing can arrive; run `xftp send` at one end"
        ),
        _ => anyhow::bail!("the peer is neither `xftp send` nor `xftp recv` (it said {peer:?})"),
    }
}

/// A sender's check of what came back: the receipt for every byte sent.
fn check_receipt(back: &[u8], sent: u64) -> anyhow::Result<()> {
    let Some(count) = back
        .strip_prefix(&RECEIPT)
        .and_then(|c| <[u8; 8]>::try_from(c).ok())
        .map(u64::from_be_bytes)
    else {
        anyhow::bail!(
            "the receiver closed without its receipt ({} bytes came back): what it wrote out is unknown",
            back.len()
        );
    };
    if count != sent {
        anyhow::bail!("the receiver wrote out {count} of the {sent} bytes sent");
    }
    Ok(())
}

/// `xftp send`.
pub async fn send(a: SendArgs) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let mut stream = None;
    let r: anyhow::Result<()> = async {
        let s = stream.insert(open(&a.ep).await?);
        let roles = s.version() >= ROLES_FROM;
        if roles {
            exchange_roles(s, ROLE_SEND).await?;
        }
        let mut stdin = tokio::io::stdin();
        match pump(&mut stdin, s, &mut bytes).await {
            Ok(()) => {}
            Err(Pumped::Read(e)) => return Err(e).context("reading stdin"),
            Err(Pumped::Write(e)) => {
                return Err(peer_error(e)).context(
                    "sending stdin (the receiver ended it: its own message says why, e.g. its output was closed)",
                )
            }
        }
        s.shutdown().await.context("finishing the stream")?;
        // Wait for the receiver's end-of-stream: it closes only after
        // writing everything out.
        let mut extra = Vec::new();
        s.read_to_end(&mut extra)
            .await
            .map_err(peer_error)
            .context("waiting for the receiver's confirmation (it ended without one: its own message says why)")?;
        if roles {
            return check_receipt(&extra, bytes);
        }
        // An older `xftp recv` sends nothing back: data from the peer
        // means it sent too, and neither stream went anywhere.
        if !extra.is_empty() {
            anyhow::bail!(
                "the peer sent {} bytes back: it is an `xftp send` too, not `xftp recv`, and nothing was delivered",
                extra.len()
            );
        }
        Ok(())
    }
    .await;
    let per = stream
        .as_ref()
        .map(|s| s.sent_stats().iter().map(|x| x.bytes).collect())
        .unwrap_or_default();
    finish(&a.ep, t0, bytes, per, r)
}

/// `xftp recv`.
pub async fn recv(a: RecvArgs) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let mut stream = None;
    let r: anyhow::Result<()> = async {
        let s = stream.insert(open(&a.ep).await?);
        let roles = s.version() >= ROLES_FROM;
        if roles {
            exchange_roles(s, ROLE_RECV).await?;
        }
        let mut stdout = tokio::io::stdout();
        // Two older `xftp recv`s joined by mistake wait for each other for
        // ever: a first byte that does not come is said once (a sender
        // with nothing to send yet looks the same, so this waits on).
        // With roles exchanged, the peer is known to be a sender.
        let hint = if roles { None } else { Some(QUIET_HINT) };
        let mut first = vec![0u8; BUF];
        let n = {
            let mut read = std::pin::pin!(s.read(&mut first));
            let waited = match hint {
                Some(h) => tokio::time::timeout(h, &mut read).await,
                None => Ok((&mut read).await),
            };
            match waited {
                Ok(r) => r,
                Err(_) => {
                    eprintln!(
                        "xftp recv: nothing has arrived in {} s: the other end must be `xftp send` (two `xftp recv`s wait for each other for ever), or it has sent nothing yet; waiting on",
                        QUIET_HINT.as_secs()
                    );
                    read.await
                }
            }
        }
        .map_err(peer_error)
        .context("receiving the stream")?;
        if n > 0 {
            stdout
                .write_all(&first[..n])
                .await
                .context("writing stdout")?;
            bytes += n as u64;
            MOVED.store(bytes, std::sync::atomic::Ordering::Relaxed);
            match pump(s, &mut stdout, &mut bytes).await {
                Ok(()) => {}
                Err(Pumped::Read(e)) => {
                    return Err(peer_error(e)).context("receiving the stream")
                }
                Err(Pumped::Write(e)) => return Err(e).context("writing stdout"),
            }
        }
        stdout.flush().await.context("writing stdout")?;
        // Confirms to the sender that everything arrived (and, with
        // roles, how much: a peer that merely closes is no receiver).
        if roles {
            let mut receipt = RECEIPT.to_vec();
            receipt.extend_from_slice(&bytes.to_be_bytes());
            s.write_all(&receipt)
                .await
                .context("confirming to the sender")?;
        }
        s.shutdown().await.context("confirming to the sender")?;
        Ok(())
    }
    .await;
    let per = stream
        .as_ref()
        .map(|s| s.received_stats().iter().map(|x| x.bytes).collect())
        .unwrap_or_default();
    finish(&a.ep, t0, bytes, per, r)
}

fn finish(
    ep: &Endpoint,
    t0: Instant,
    bytes: u64,
    per_stream_bytes: Vec<u64>,
    r: anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    let seconds = t0.elapsed().as_secs_f64();
    let s = Summary {
        status: if r.is_ok() { "ok" } else { "error" },
        bytes,
        seconds,
        streams: per_stream_bytes.len(),
        throughput_bps: if seconds > 0.0 {
            bytes as f64 / seconds
        } else {
            0.0
        },
        per_stream_bytes,
        error: r.as_ref().err().map(|e| format!("{e:#}")),
    };
    if ep.json {
        eprintln!("{}", serde_json::to_string(&s)?);
    }
    match r {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("xftp: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_peer_gone_silent_is_said_in_words() {
        let e = super::peer_error(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        assert!(e.to_string().contains("stopped answering"), "{e}");
        let e = super::peer_error(std::io::Error::from_raw_os_error(libc::ECONNRESET));
        assert!(!e.to_string().contains("stopped answering"), "{e}");
    }

    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        ep: Endpoint,
    }

    #[test]
    fn flags() {
        let t = T::try_parse_from(["x", "h:1", "-p", "8", "--json"]).unwrap();
        assert_eq!(t.ep.peer.as_deref(), Some("h:1"));
        assert_eq!(t.ep.parallel, 8);
        assert!(t.ep.json);
        let t = T::try_parse_from(["x", "--listen", "127.0.0.1:0"]).unwrap();
        assert_eq!(t.ep.listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(t.ep.parallel, 4);
        assert!(
            T::try_parse_from(["x"]).is_err(),
            "peer or --listen required"
        );
        assert!(T::try_parse_from(["x", "h:1", "--listen", "a:0"]).is_err());
        assert!(T::try_parse_from(["x", "h:1", "-p", "0"]).is_err());
        assert!(T::try_parse_from(["x", "h:1", "--parallel", "2000"]).is_err());
    }
}
