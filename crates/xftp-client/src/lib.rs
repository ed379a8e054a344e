//! Async FTP client for xftp, on tokio.
//!
//! Every operation is "send a command, expect these codes": anything else
//! becomes a [`ClientError`] that keeps the server's code and text. Command
//! arguments containing CR or LF are refused before anything is sent.
//!
//! * Login is pipelined: USER, PASS, TYPE I (and `MULT n`) go out in one
//!   write; anonymous when no user is given.
//! * Data connections are passive by default (EPSV, falling back to PASV;
//!   a PASV address that differs from the control peer is replaced by the
//!   control peer's address, the usual NAT workaround), or active (EPRT,
//!   falling back to PORT for IPv4; the client listens on the control
//!   connection's local address).
//! * Downloads land in a temporary file beside the target, renamed only on
//!   success and after the byte count matched the server's SIZE.
//! * Uploads check the bytes sent against the local length and, afterwards,
//!   the server's SIZE.
//! * Timeouts on connect, on every reply and on stalled data connections.
//! * Automatic mode ([`AutoConfig`], `-p auto`): FEAT with the login, a
//!   starting count from the control connection's RTT and the parameter
//!   cache, then a framed (MODE E) transfer whose connection count a
//!   [`xftp_tune::Controller`] changes while it runs (`MULT n` mid-transfer,
//!   connections added to or retired from the engine). See docs/tuning.md.
//! * `bufsize`: SO_SNDBUF/SO_RCVBUF on data sockets before connect/listen,
//!   and `SITE BUFSIZE` to the server ([`BufferReport`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), xftp_client::ClientError> {
//! use xftp_client::{Client, ClientConfig};
//! let mut c = Client::connect("127.0.0.1", 2121, ClientConfig::default()).await?;
//! c.login(None, None).await?;
//! let report = c.download("pub/file.bin", std::path::Path::new("file.bin")).await?;
//! println!("{} bytes", report.bytes);
//! c.quit().await;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod client;
mod control;
mod error;
pub mod negotiate;
pub mod progress;
mod resume;
pub mod sockbuf;
pub mod tree;
pub mod url;
mod watchdog;

pub use client::{
    list_arg, AutoConfig, BatchItem, BufferReport, Checksum, Client, ClientConfig, DataMode, Made,
    SessionFactory, Timeline, TlsSetup, TransferReport, UploadItem, Verify, ANONYMOUS_PASSWORD,
    MAX_LISTING, RANGED_AUTO_MAX,
};
pub use error::{ClientError, Result};
pub use negotiate::Features;
pub use progress::{Progress, Snapshot};
pub use resume::{partial_path, remove_partial_fix};
pub use url::{FtpUrl, UrlTls};
pub use watchdog::RateLimit;
pub use xftp_proto::cksum::Algorithm;
/// TLS settings and the stream type of data connections.
pub use xftp_tls;
/// The tuning crate (cache, controller), for callers of the automatic mode.
pub use xftp_tune;
