//! Parallel sockets: one ordered, reliable byte stream over N TCP
//! connections (PSockets, MFTP's multi-connection sub-layer), for any
//! application.
//!
//! A group of N connections is set up by [`PsockListener`] and
//! [`PsockStream::connect`]; the resulting [`PsockStream`] implements
//! tokio's `AsyncRead`/`AsyncWrite` in both directions. Data is cut into
//! records framed as GridFTP MODE E blocks whose offset field is the stream
//! offset, scheduled dynamically (the next record goes to whichever
//! connection can take it) and put back in order by a reorder buffer with a
//! fixed cap. All of that is the `xftp-stripe` engine, the same one that
//! moves files; this crate adds the grouping handshake and the stream
//! adapters. [`blocking`] wraps it for `std::io::Read`/`Write` programs.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use xftp_psock::{PsockConfig, PsockListener, PsockStream};
//!
//! let cfg = PsockConfig::default();
//! let mut listener = PsockListener::bind("127.0.0.1:0", cfg.clone()).await?;
//! let addr = listener.local_addr();
//! let server = tokio::spawn(async move {
//!     let mut s = listener.accept().await?;
//!     let mut v = Vec::new();
//!     s.read_to_end(&mut v).await?;
//!     s.shutdown().await?;
//!     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(v)
//! });
//! let mut c = PsockStream::connect(addr, 4, &cfg).await?;
//! c.write_all(b"hello over four connections").await?;
//! c.shutdown().await?;
//! let mut rest = Vec::new();
//! c.read_to_end(&mut rest).await?; // the peer closed its side: all received
//! assert_eq!(server.await?.unwrap(), b"hello over four connections");
//! # Ok(()) }
//! ```

pub mod blocking;
mod direct;
pub mod handshake;
mod listener;
mod stream;

use std::time::Duration;

pub use listener::PsockListener;
pub use stream::PsockStream;
pub use xftp_stripe::{StreamStats, StripeError};

use handshake::Status;

/// Settings shared by both ends.
#[derive(Clone, Debug)]
pub struct PsockConfig {
    /// Size of the records this side sends. `None` (the default) chooses
    /// by the number of connections: up to 1 MiB on one, 128 KiB on more
    /// (see [`PsockConfig::send_record`]).
    pub record_size: Option<u32>,
    /// Cap of the receive reorder buffer in bytes (default 16 MiB). It
    /// must hold at least two of the peer's records.
    pub reorder_cap: usize,
    /// Bytes the application may write ahead of the connections
    /// (default 4 MiB).
    pub send_buffer: usize,
    /// Time for one connection to complete its handshake (default 10 s).
    pub handshake_timeout: Duration,
    /// Time for a whole group to arrive before it is dropped (default 30 s).
    pub group_timeout: Duration,
    /// Most incomplete groups a listener holds at once (default 64).
    pub max_pending_groups: usize,
    /// TLS, if any: the listening side gives [`PsockTls::Server`], the
    /// connecting side [`PsockTls::Client`]. Every connection shakes hands
    /// before the group's hello, which (session id included) then travels
    /// encrypted: no one on the path can join a group.
    pub tls: Option<PsockTls>,
}

/// TLS on every connection of a group.
#[derive(Clone, Debug)]
pub enum PsockTls {
    /// The listening side: its certificate.
    Server(std::sync::Arc<xftp_tls::server::ServerTls>),
    /// The connecting side: how it verifies the listener.
    Client(xftp_tls::client::ClientTls),
}

impl Default for PsockConfig {
    fn default() -> Self {
        Self {
            record_size: None,
            reorder_cap: 16 * 1024 * 1024,
            send_buffer: 4 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            group_timeout: Duration::from_secs(30),
            max_pending_groups: 64,
            tls: None,
        }
    }
}

impl PsockConfig {
    /// The largest peer record size this side accepts: half the reorder
    /// cap, so that an in-order record always fits (see docs/psock.md).
    pub fn max_peer_record(&self) -> u32 {
        u32::try_from(self.reorder_cap / 2).unwrap_or(u32::MAX)
    }

    /// The record size this side sends on a group of `n` connections.
    ///
    /// Without an explicit `record_size`: 128 KiB on two or more
    /// connections, and on one connection a quarter of the reorder cap
    /// (a power of two, at most 1 MiB).
    ///
    /// A record costs a hand-off at each end, so larger records are
    /// cheaper on fast paths; but a transfer over several connections ends
    /// unevenly by up to one record per connection, which at 64 KiB
    /// windows and 100 ms (640 KB/s a connection) is 0.2 s for 128 KiB and
    /// 1.6 s for 1 MiB. On one connection there is no such imbalance and no
    /// reordering, so only the cost remains. The receiver hands over the
    /// arrived part of a record as it comes, so a large record does not
    /// delay the reader either.
    pub fn send_record(&self, n: u16) -> u32 {
        if let Some(r) = self.record_size {
            return r.max(1);
        }
        let r = if n <= 1 {
            let quarter = (self.reorder_cap / 4).max(1);
            let pow2 = 1usize << (usize::BITS - 1 - quarter.leading_zeros());
            u32::try_from(pow2.clamp(MULTI_RECORD, SINGLE_RECORD_MAX)).unwrap_or(u32::MAX)
        } else {
            MULTI_RECORD as u32
        };
        r.min(self.max_peer_record()).max(1)
    }
}

/// Automatic record size on two or more connections.
const MULTI_RECORD: usize = 128 * 1024;
/// Largest automatic record size on one connection.
const SINGLE_RECORD_MAX: usize = 1024 * 1024;

impl From<handshake::HelloError> for PsockError {
    fn from(e: handshake::HelloError) -> Self {
        PsockError::Protocol(e)
    }
}

/// Why setting up or using a parallel stream failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PsockError {
    /// Socket I/O failed (the OS error is the source: `{:#}` shows it).
    #[error("{context}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The listener refused a connection of our group.
    #[error("listener refused connection {index}: {status}")]
    Rejected {
        /// Index of the refused connection.
        index: u16,
        /// The listener's reason.
        status: Status,
    },
    /// The peer does not speak this protocol. (Not a `source`: the text
    /// already says it, and `{:#}` would say it twice.)
    #[error("peer is not a parallel-sockets endpoint: {0}")]
    Protocol(handshake::HelloError),
    /// TLS could not be set up (the text names the cause and the fix).
    #[error("TLS: {0}")]
    Tls(String),
    /// The group's handshake did not complete in time.
    #[error("handshake timed out")]
    Timeout,
    /// A connecting group's handshake did not complete in time: `ready`
    /// of its `count` connections had been accepted by then.
    #[error("handshake timed out: {ready} of the {count} connections were accepted in time (a listener out of file descriptors, or with a full accept queue, leaves the others waiting: try fewer connections with -p, or raise its `ulimit -n`)")]
    GroupTimeout {
        /// Connections whose handshake completed.
        ready: u16,
        /// Connections of the group.
        count: u16,
    },
    /// Invalid arguments (N out of range, record size too large, ...).
    #[error("invalid parameter: {0}")]
    Invalid(&'static str),
    /// The peer speaks another protocol, which this names (an FTP
    /// server's greeting).
    #[error("peer is not a parallel-sockets endpoint: {0}")]
    Foreign(&'static str),
    /// The listener has stopped.
    #[error("listener closed")]
    Closed,
}

impl PsockError {
    pub(crate) fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io {
            context,
            source: xftp_tls::plain_io_error(source),
        }
    }
}

/// TCP keepalive on a member connection: a peer that vanished (its host
/// down, the path cut, no reset ever coming) is found out in about 40 s
/// of silence, and the reads and writes waiting on it fail. Without it a
/// receiver whose sender's host died waited for ever; a live peer that is
/// merely idle answers the probes and is not disturbed.
pub(crate) fn keepalive(tcp: &tokio::net::TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(10))
        .with_interval(std::time::Duration::from_secs(5));
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let ka = ka.with_retries(6);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        tracing::debug!("no TCP keepalive on a member connection: {e}");
    }
}

impl From<PsockError> for std::io::Error {
    fn from(e: PsockError) -> Self {
        match e {
            PsockError::Io { source, .. } => source,
            PsockError::Timeout | PsockError::GroupTimeout { .. } => {
                std::io::Error::new(std::io::ErrorKind::TimedOut, e)
            }
            other => std::io::Error::other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_record_size_is_large_only_on_one_connection() {
        let cfg = PsockConfig::default(); // 16 MiB reorder cap
        let kib = |n| cfg.send_record(n) / 1024;
        assert_eq!(kib(1), 1024);
        assert_eq!(kib(0), 1024);
        assert_eq!(kib(2), 128);
        assert_eq!(kib(128), 128);
        let small = PsockConfig {
            reorder_cap: 1 << 20,
            ..PsockConfig::default()
        };
        assert_eq!(small.send_record(1), 256 * 1024);
        assert_eq!(small.send_record(4), 128 * 1024);
        let tiny = PsockConfig {
            reorder_cap: 128 * 1024,
            ..PsockConfig::default()
        };
        assert_eq!(tiny.send_record(1), 64 * 1024);
        assert_eq!(tiny.send_record(2), 64 * 1024);
        let fixed = PsockConfig {
            record_size: Some(65536),
            ..PsockConfig::default()
        };
        assert_eq!(fixed.send_record(1), 65536);
        // Every automatic choice is acceptable to a peer of the same size.
        for c in [&cfg, &small, &tiny] {
            for n in 0..=u16::MAX {
                assert!(c.send_record(n) <= c.max_peer_record());
            }
        }
    }
}
