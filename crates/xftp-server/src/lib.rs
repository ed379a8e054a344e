//! The xftp FTP server.
//!
//! A standards-compliant FTP server (RFC 959, 2389, 2428, 3659) with the
//! xftp extensions for multi-stream transfers (`MULT`, `MPRT`; see
//! docs/protocol.md). Protocol parsing lives in `xftp-proto`; the striping
//! of one file over many data connections in `xftp-stripe`. This crate is
//! the async shell: one task per control connection.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::sync::Arc;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let mut config = xftp_server::Config::new(std::path::Path::new("/srv/ftp"))?;
//! config.anonymous = true;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! xftp_server::serve(listener, Arc::new(config), shutdown).await
//! # }
//! ```

pub mod auth;
pub mod fs;

mod data;
mod limits;
mod live;
mod resumable;
mod secure;
mod session;
mod transfer;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use auth::{check_entry, Access, UserDb};
pub use fs::Root;

/// Server settings. Build with [`Config::new`] and adjust the fields.
#[derive(Debug, Clone)]
pub struct Config {
    /// The served directory; clients cannot leave it.
    pub root: Root,
    /// Allow `USER anonymous` / `USER ftp` with any password.
    pub anonymous: bool,
    /// Anonymous users may write (STOR, DELE, MKD, ...).
    pub anonymous_write: bool,
    /// Named users.
    pub users: UserDb,
    /// Most data connections one transfer may use (MULT).
    pub max_streams: u32,
    /// Data connections granted to a bare `MULT`.
    pub default_streams: u32,
    /// Close a control connection idle this long (421).
    pub idle_timeout: Duration,
    /// Give up on a data connection that does not arrive (425).
    pub data_timeout: Duration,
    /// Abort a transfer whose data connections move nothing this long (426).
    pub stall_timeout: Duration,
    /// How long a stopping server waits for running transfers before it
    /// ends their sessions (see [`serve_all`]).
    pub shutdown_grace: Duration,
    /// Most concurrent sessions (more get 421).
    pub max_sessions: usize,
    /// Record size of multi-stream transfers sent by the server.
    pub record_size: u32,
    /// Smallest data-socket buffer a client may ask for (SITE BUFSIZE).
    pub min_bufsize: u64,
    /// Largest data-socket buffer a client may ask for.
    pub max_bufsize: u64,
    /// The server's certificate, if it offers TLS.
    pub tls: Option<Arc<xftp_tls::server::ServerTls>>,
    /// Whether TLS is offered or required (needs `tls`).
    pub tls_mode: TlsMode,
    /// A TLS data connection must resume its control session's TLS
    /// session (vsftpd's `require_ssl_reuse`); see docs/security.md.
    pub tls_require_reuse: bool,
    /// Failed logins from one address before it must wait (0: never).
    pub login_max_failures: u32,
    /// The window those failures are counted in, and the wait after.
    pub login_window: Duration,
    /// Most concurrent sessions from one client address.
    pub max_sessions_per_ip: usize,
    /// Most data connections granted by MULT to one client address over
    /// all its sessions.
    pub max_streams_per_ip: u32,
    /// Largest upload accepted (552 beyond it); `None`: no limit.
    pub max_upload_size: Option<u64>,
    /// Passive data ports come from this range (inclusive); `None`: any.
    pub passive_ports: Option<(u16, u16)>,
    /// The IPv4 address PASV replies name (behind NAT); `None`: the
    /// control connection's local address.
    pub public_address: Option<std::net::Ipv4Addr>,
}

/// How the server treats clients without TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: AUTH is refused.
    #[default]
    Off,
    /// AUTH TLS and PROT P are offered; clear sessions are served too.
    Optional,
    /// Nothing before AUTH TLS but AUTH, FEAT, HELP, NOOP, SYST and QUIT;
    /// every transfer needs PROT P.
    Required,
}

impl Config {
    /// Defaults for serving `root`: no anonymous access, no users.
    pub fn new(root: &Path) -> std::io::Result<Config> {
        Ok(Config {
            root: Root::new(root)?,
            anonymous: false,
            anonymous_write: false,
            users: UserDb::default(),
            max_streams: 64,
            default_streams: 4,
            idle_timeout: Duration::from_secs(300),
            data_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(30),
            max_sessions: 512,
            record_size: 256 * 1024,
            min_bufsize: 2048,
            max_bufsize: 256 << 20,
            tls: None,
            tls_mode: TlsMode::Off,
            tls_require_reuse: true,
            login_max_failures: 5,
            login_window: Duration::from_secs(300),
            max_sessions_per_ip: 32,
            max_streams_per_ip: 256,
            max_upload_size: None,
            passive_ports: None,
            public_address: None,
        })
    }
}

/// Password checks (Argon2id, 19 MiB each) running at once.
const PASSWORD_CHECKS: usize = 2;

/// How long a session has, after the hard stop, to end its transfer and
/// send its 421.
const HARD_STOP_WAIT: Duration = Duration::from_secs(2);

/// Accept control connections on `listener` until `shutdown` is cancelled;
/// then stop accepting and wait for running sessions to end, for at most
/// [`Config::shutdown_grace`] (see [`serve_all`]).
pub async fn serve(
    listener: TcpListener,
    config: Arc<Config>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_all(listener, None, config, shutdown, CancellationToken::new()).await
}

/// [`serve`] on `listener` and, if given, implicit TLS (the "ftps"
/// convention: the TLS handshake comes first, before the 220) on
/// `implicit`. Needs `config.tls` for the implicit listener. The session
/// limit counts both.
///
/// Stopping comes in two steps. `shutdown` stops accepting: a session
/// waiting for a command ends at once with a 421, one in a transfer ends
/// when the transfer does. Sessions still open after
/// [`Config::shutdown_grace`], or once `now` is cancelled, are ended: a
/// running transfer stops with a 421 (a stream-mode data connection is
/// reset, so its end cannot pass for the end of the file; an upload's
/// temporary file is left unrenamed), and a session that cannot say so
/// within a few seconds is closed without a word. A transfer to a peer
/// that vanished would otherwise hold the server for its stall timeout.
pub async fn serve_all(
    listener: TcpListener,
    implicit: Option<TcpListener>,
    config: Arc<Config>,
    shutdown: CancellationToken,
    now: CancellationToken,
) -> std::io::Result<()> {
    let tracker = TaskTracker::new();
    let active = Arc::new(AtomicUsize::new(0));
    let shared = Arc::new(Shared {
        throttle: limits::LoginThrottle::new(config.login_max_failures, config.login_window),
        per_ip: Arc::new(limits::PerAddress::default()),
        streams: Arc::new(limits::StreamBudget::default()),
        partials: Arc::new(resumable::Writers::default()),
        hashing: tokio::sync::Semaphore::new(PASSWORD_CHECKS),
    });
    loop {
        let mut tls_first = false;
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = accept_opt(implicit.as_ref()) => {
                tls_first = true;
                match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Clients send ABOR (or the Telnet IP/DM before it) as TCP urgent
        // data (RFC 959 4.1.3; Python's ftplib sends all of "ABOR\r\n" so):
        // without OOBINLINE the kernel takes the urgent byte, the final LF,
        // out of the stream, and the command never completes.
        if let Err(e) = socket2::SockRef::from(&stream).set_out_of_band_inline(true) {
            tracing::debug!(%peer, "SO_OOBINLINE: {e}");
        }
        let n = active.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = ActiveGuard(active.clone());
        let cfg = config.clone();
        let stop = shutdown.clone();
        let shared = shared.clone();
        let now = now.clone();
        let hard = now.clone();
        let session = async move {
            let _guard = guard;
            let refuse = |stream, msg: String| {
                let cfg = cfg.clone();
                async move {
                    if tls_first {
                        session::refuse_tls(stream, &cfg, &msg).await;
                    } else {
                        session::refuse(stream, &msg).await;
                    }
                }
            };
            if n > cfg.max_sessions {
                refuse(stream, "421 Too many sessions, try again later.\r\n".into()).await;
                return;
            }
            let Some(_place) = shared.per_ip.enter(peer.ip(), cfg.max_sessions_per_ip) else {
                tracing::warn!(%peer, "session refused: too many from this address");
                refuse(
                    stream,
                    "421 Too many sessions from your address, try again later.\r\n".into(),
                )
                .await;
                return;
            };
            if let Some(wait) = shared.throttle.locked(peer.ip(), std::time::Instant::now()) {
                tracing::warn!(%peer, "session refused: too many failed logins");
                let msg = format!(
                    "421 Too many failed logins from your address; try again in {} s.\r\n",
                    wait.as_secs().max(1)
                );
                refuse(stream, msg).await;
                return;
            }
            tracing::info!(%peer, implicit_tls = tls_first, "session start");
            if let Err(e) = session::run(stream, tls_first, cfg, shared, stop, now).await {
                tracing::info!(%peer, "session ended: {e}");
            } else {
                tracing::info!(%peer, "session end");
            }
        };
        tracker.spawn(async move {
            tokio::pin!(session);
            tokio::select! {
                () = &mut session => {}
                () = hard.cancelled() => {
                    // A session in a transfer ends it with a 421 (and
                    // resets a stream-mode data connection); one that
                    // cannot say so in time is dropped.
                    if tokio::time::timeout(HARD_STOP_WAIT, &mut session).await.is_err() {
                        tracing::warn!(%peer, "session ended by the shutdown");
                    }
                }
            }
        });
    }
    // New clients are refused rather than left in the backlog.
    drop(listener);
    drop(implicit);
    tracker.close();
    let open = active.load(Ordering::SeqCst);
    if open > 0 {
        tracing::info!(
            sessions = open,
            grace_s = config.shutdown_grace.as_secs_f64(),
            "stopping: waiting for running transfers"
        );
    }
    tokio::select! {
        () = tracker.wait() => {}
        () = now.cancelled() => {}
        () = tokio::time::sleep(config.shutdown_grace) => {
            tracing::warn!(
                sessions = active.load(Ordering::SeqCst),
                "stopping: grace period over, ending the sessions still open"
            );
            now.cancel();
        }
    }
    tracker.wait().await;
    Ok(())
}

/// Accept on `l`, or never without one (accept is cancel-safe).
async fn accept_opt(
    l: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// State shared by every session of one server.
#[derive(Debug)]
pub(crate) struct Shared {
    pub throttle: limits::LoginThrottle,
    pub per_ip: Arc<limits::PerAddress>,
    pub streams: Arc<limits::StreamBudget>,
    /// The resumable uploads under way, by partial file.
    pub partials: Arc<resumable::Writers>,
    /// Permits for password checks ([`PASSWORD_CHECKS`]).
    pub hashing: tokio::sync::Semaphore,
}

struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
