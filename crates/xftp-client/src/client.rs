//! The session: connect, log in, negotiate streams, move files.

mod adaptive;
mod batch;
mod ranged;

pub use batch::{BatchItem, UploadItem};

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xftp_proto::cksum::Algorithm;
use xftp_proto::hostport;
use xftp_proto::Reply;
use xftp_tls::client::{ClientTls, ClientTlsConfig};
use xftp_tls::Stream;

use xftp_tune::meter::MeterSet;
use xftp_tune::{Controller, TuneConfig};

pub use adaptive::Timeline;
use adaptive::{EngineCtl, Grow, Live, Socks};
pub use ranged::AUTO_MAX as RANGED_AUTO_MAX;

use crate::control::{reply_text, unexpected, Cmd, Control};
use crate::error::{ClientError, Result};
use crate::negotiate::{self, Features};
use crate::progress::Progress;
use crate::resume;
use crate::sockbuf::{self, InForce};
use crate::watchdog::Watchdog;

/// Password sent for anonymous logins (RFC 1635 asks for an e-mail-like string).
pub const ANONYMOUS_PASSWORD: &str = "xftp@example.invalid";

/// How long a greeting may take before the user is told that the client
/// is still waiting for one.
const GREETING_NOTICE: Duration = Duration::from_secs(5);

/// Chunk size for single-stream copies.
const CHUNK: usize = 1024 * 1024;

/// How long the TLS handshake of a passive data connection waits for the
/// server's 1xx (plus two control round trips) before it goes ahead.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Largest listing kept in memory: a server that never stops sending a
/// listing must not exhaust our memory.
pub const MAX_LISTING: u64 = 64 * 1024 * 1024;

/// How data connections are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataMode {
    /// The client connects to the server (EPSV, falling back to PASV).
    #[default]
    Passive,
    /// The server connects to one client listening port (EPRT, falling back
    /// to PORT for IPv4).
    Active,
    /// The server connects to one client listening port per stream (xftp
    /// `MPRT`); with one stream this is the same as `Active`.
    Mprt,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Limit for each TCP connect (control and passive data connections).
    pub connect_timeout: Duration,
    /// Limit for each reply on the control connection.
    pub reply_timeout: Duration,
    /// A data connection on which nothing moves for this long is an error;
    /// also the limit for the server to open active-mode connections.
    pub data_timeout: Duration,
    /// How to set up data connections.
    pub data_mode: DataMode,
    /// Data connections to ask for with `MULT` (1 sends no MULT at all).
    /// Ignored when `auto` is set.
    pub streams: u32,
    /// SO_SNDBUF/SO_RCVBUF of every data socket, set before connect/listen,
    /// and asked of the server with `SITE BUFSIZE`. `None`: kernel
    /// autotuning at both ends (nothing is sent).
    pub bufsize: Option<u64>,
    /// Choose the number of connections, and change it while a transfer
    /// runs (`-p auto`).
    pub auto: Option<AutoConfig>,
    /// Static partitioning (PSockets): uploads cut the file into equal
    /// contiguous parts, one per connection; downloads ask the server for
    /// the same with `OPTS MULT STATIC`.
    pub static_split: bool,
    /// TLS on the control connection and every data connection (RFC 4217,
    /// PROT P); `None` for plain FTP.
    pub tls: Option<TlsSetup>,
    /// End-to-end verification: after each transfer the server's checksum
    /// (CKSM or HASH) is compared with one computed here.
    pub verify: Verify,
    /// Where transfers count their bytes as they move, for a display.
    pub progress: Option<Arc<Progress>>,
    /// The most bytes per second all data connections together move
    /// (`--limit-rate`).
    pub limit_rate: Option<Arc<crate::watchdog::RateLimit>>,
    /// Downloads are resumable (`-c`): a partial file and its record of
    /// ranges stay beside the target on failure, and the next run with
    /// `resume` fetches only what is missing.
    pub resume: bool,
    /// Cancelled when the user interrupts (SIGINT, SIGTERM): an upload
    /// then stops, resets its data connections and deletes what a server
    /// that writes in place holds of it ([`ClientError::Interrupted`]).
    pub interrupt: Option<tokio_util::sync::CancellationToken>,
}

/// Whether and how transfers are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// No verification (byte counts are still checked).
    #[default]
    Off,
    /// The strongest algorithm the server lists.
    Auto,
    /// This algorithm; an error if the server does not offer it.
    With(Algorithm),
}

/// A checksum both ends agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Its value, lower-case hex.
    pub value: String,
}

/// How a server computes checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Cksm,
    Hash,
}

/// How the session uses TLS.
#[derive(Debug, Clone)]
pub struct TlsSetup {
    /// Implicit TLS (ftps://): the handshake first, then the greeting.
    /// Otherwise explicit (ftpes://, --tls): AUTH TLS after the greeting.
    pub implicit: bool,
    /// The name the certificate must carry (the URL's host).
    pub server_name: String,
    /// Trusted CAs, or no verification.
    pub verify: ClientTlsConfig,
}

/// Settings of the automatic mode.
#[derive(Debug, Clone, Default)]
pub struct AutoConfig {
    /// The controller's knobs (its `max_streams` caps the count).
    pub tune: TuneConfig,
    /// The fastest recent transfer to this destination: (connections,
    /// bits per second), from the parameter cache.
    pub cached_best: Option<(u32, f64)>,
}

/// Buffer sizes of the data sockets: asked for and in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferReport {
    /// What `--bufsize` asked for.
    pub requested: u64,
    /// What the kernel reported on the first data socket (Linux doubles
    /// the request and, without privilege, clamps it).
    pub in_force: Option<InForce>,
    /// The server's reply to `SITE BUFSIZE` (code and text).
    pub server_reply: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(15),
            reply_timeout: Duration::from_secs(60),
            data_timeout: Duration::from_secs(60),
            data_mode: DataMode::Passive,
            streams: 1,
            bufsize: None,
            auto: None,
            static_split: false,
            tls: None,
            verify: Verify::Off,
            progress: None,
            limit_rate: None,
            resume: false,
            interrupt: None,
        }
    }
}

/// What a finished transfer moved.
#[derive(Debug, Clone)]
pub struct TransferReport {
    /// Payload bytes moved.
    pub bytes: u64,
    /// Payload bytes per data connection (one entry per connection used).
    pub per_stream_bytes: Vec<u64>,
    /// From the first data-connection command to the final reply.
    pub elapsed: Duration,
    /// How the number of connections was chosen and how it moved.
    pub timeline: Option<Timeline>,
    /// The checksum both ends computed (`--verify`).
    pub checksum: Option<Checksum>,
    /// Bytes a resumed download found already in place (not in `bytes`).
    pub already: u64,
    /// Payload bytes that arrived twice (the endgame's copies of records
    /// a stuck connection held); not in `bytes`.
    pub received_twice: u64,
    /// Payload bytes an upload sent twice (its endgame's copies of records
    /// a stuck connection held); not in `bytes`, in `per_stream_bytes`.
    pub sent_twice: u64,
}

impl TransferReport {
    /// Data connections used for the transfer.
    pub fn streams(&self) -> usize {
        self.per_stream_bytes.len()
    }

    /// A resumable transfer that found the copy complete: nothing moved.
    fn in_place(size: u64, start: Instant, checksum: Option<Checksum>) -> TransferReport {
        TransferReport {
            bytes: 0,
            per_stream_bytes: Vec::new(),
            elapsed: start.elapsed(),
            timeline: None,
            checksum,
            already: size,
            received_twice: 0,
            sent_twice: 0,
        }
    }
}

/// What a transfer's count may be fitted to (`Client::fit_count`).
#[derive(Clone, Copy, Debug)]
enum Fit {
    /// A download of these bytes; `None`: the size in the reply to the
    /// command sent before the port command (SIZE), if any.
    Download(Option<u64>),
    /// An upload of these bytes; a resumable one (`put -c`) must stay
    /// framed, which without MODE E takes two connections at least.
    Upload { bytes: u64, resumable: bool },
    /// A resumed download of these bytes. Without MODE E one connection
    /// would mean stream mode, whose REST refetches everything after the
    /// first hole: two at least then.
    Resume(u64),
    /// The session's count (a listing, or nothing known).
    Session,
}

/// Data connections being set up: what remains to do after the server's
/// 150 reply.
enum Setup {
    /// Passive: connections being opened to `target`.
    Connecting {
        set: tokio::task::JoinSet<Result<Stream>>,
        target: SocketAddr,
        /// Set once the server has answered the transfer command: the
        /// TLS handshakes wait for it.
        answered: tokio::sync::watch::Sender<bool>,
    },
    /// Active: accept `n` connections from the server on one port.
    Listen { listener: TcpListener, n: usize },
    /// MPRT: accept one connection on each port.
    ListenEach(Vec<TcpListener>),
}

/// What became of one directory of [`Client::mkd_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Made {
    /// Made now (MKD's 257): nothing is in it yet.
    New,
    /// There already (MKD refused, CWD into it accepted).
    There,
    /// Not there and not made: MKD's reply code and text.
    Refused(u16, String),
}

/// An FTP session over one control connection.
#[derive(Debug)]
pub struct Client {
    ctl: Control,
    cfg: ClientConfig,
    granted: u32,
    notices: Vec<String>,
    epsv_refused: bool,
    eprt_refused: bool,
    pending_login: Option<PendingLogin>,
    /// The login's replies did not come within this: the session is out
    /// of step.
    login_stalled: Option<Duration>,
    pending_prelude: Option<Prelude>,
    features: Option<Features>,
    /// MODE E accepted: transfers are framed even on one connection.
    mode_e: bool,
    /// The automatic choice: (connections, why, adaptive).
    start: Option<(u32, String, bool)>,
    buf_reply: Option<String>,
    buf_in_force: Option<InForce>,
    /// The controller of the last adaptive transfer.
    last_controller: Option<Controller>,
    /// `--verify` on one stream-mode connection: the local checksum,
    /// computed as the bytes pass (no second read of the file), and the
    /// bytes it covers.
    inline_digest: Option<(xftp_proto::cksum::Digest, u64)>,
    /// The last striped receive's copies (`TransferReport::received_twice`).
    received_twice: u64,
    /// The size a listing gave for the next download: its check where the
    /// server does not answer SIZE ([`Client::expect_listed_size`]).
    listed_size: Option<u64>,
    /// A failed exchange left replies unread that did not come in time:
    /// the next reply read may not be the next command's.
    out_of_step: bool,
    /// The final reply to a stream-mode transfer, read before the end of
    /// its data ([`Client::beside_control`]).
    early_final: Option<Reply>,
    /// The name progress shows while a transfer goes to another one (an
    /// upload to its temporary `.NAME.xftp-part`): the user's target.
    progress_name: Option<String>,
    /// Entries the server's listings said they left out, since the last
    /// [`Client::take_unlisted`].
    unlisted: usize,
    /// Entries listings said the server could not read (`take_unreadable`).
    unreadable: usize,
    /// `OPTS MLST` considered ([`Client::ask_unix_mode`]).
    mlst_chosen: bool,
    /// The algorithm of the upload being verified, for `inline_digest`.
    verify_alg: Option<Algorithm>,
    /// The connections asked for when the server refused MULT.
    mult_refused: Option<u32>,
    /// The server granted a MULT (an xftp server): the count can be
    /// set for each transfer.
    mult_ok: bool,
    /// The server accepted `OPTS MULT ENDGAME` (an xftp server): framed
    /// uploads announce their size with ALLO, and where it answers 200
    /// they run the endgame.
    endgame_ok: bool,
    /// The session's count while a small transfer asked the server for
    /// fewer (see `fit_count`): what the next transfer goes back to.
    session_grant: Option<u32>,
    /// Whether the server is a GridFTP server (FEAT lists SPAS or SPOR),
    /// once known.
    gridftp: Option<bool>,
    /// The GridFTP server refused `OPTS RETR Parallelism` (or MODE E):
    /// downloads use one connection.
    gridftp_retr_refused: bool,
    /// The user was told about GridFTP parallelism.
    gridftp_told: bool,
    /// The greeting names GridFTP: worth reading the login's replies
    /// before the first transfer to learn whether to use its parallelism.
    greets_gridftp: bool,
    /// The greeting is `xftp serve`'s: a server that fails a download
    /// whose file is written meanwhile (451), so its file's time need not
    /// be checked after the transfer.
    greets_xftp: bool,
    /// TLS for data connections (PROT P in force).
    data_tls: Option<ClientTls>,
    /// More sessions to the same server, for ranged downloads from a
    /// server without MULT ([`Client::set_sessions`]).
    sessions: Option<SessionFactory>,
}

/// Opens another logged-in session to the same server with the same
/// settings: how a download from a server without MULT gets its `-p N`
/// connections ([`Client::set_sessions`]).
#[derive(Clone)]
pub struct SessionFactory(pub Arc<dyn Fn() -> crate::tree::BoxFut<Result<Client>> + Send + Sync>);

impl std::fmt::Debug for SessionFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionFactory")
    }
}

/// A login sent but whose replies are not read yet.
#[derive(Debug)]
struct PendingLogin {
    user: Cmd,
    pass: Option<Cmd>,
    ty: Cmd,
    bufsize: Option<Cmd>,
    opts_static: Option<Cmd>,
    endgame: Option<Cmd>,
    feat: Option<Cmd>,
    mult: Option<Cmd>,
}

/// The automatic mode's MODE E and MULT, sent but not read yet.
#[derive(Debug)]
struct Prelude {
    mode_e: Option<Cmd>,
    mult: Option<(Cmd, u32)>,
}

impl Client {
    /// Resolve `host`, connect to `port` (trying each address in turn) and
    /// read the server's greeting.
    pub async fn connect(host: &str, port: u16, cfg: ClientConfig) -> Result<Client> {
        let addrs = resolve(host, port, cfg.connect_timeout).await?;
        let mut last = None;
        for addr in addrs {
            match connect_tcp(addr, None, cfg.connect_timeout).await {
                Ok(s) => return Client::from_stream(s, cfg).await,
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Resolve {
            host: host.to_owned(),
            reason: "no addresses".into(),
        }))
    }

    /// Use an already connected control stream; reads the greeting.
    pub async fn from_stream(stream: TcpStream, cfg: ClientConfig) -> Result<Client> {
        keepalive(&stream, cfg.reply_timeout);
        let peer = stream.peer_addr().ok();
        let tls = match &cfg.tls {
            Some(t) => Some((
                ClientTls::new(&t.verify, &t.server_name)
                    .map_err(|e| ClientError::Tls(e.to_string()))?,
                t.implicit,
            )),
            None => None,
        };
        let mut ctl = match &tls {
            Some((t, true)) => {
                let io = t.connect(stream, cfg.reply_timeout).await.map_err(|e| {
                    ClientError::tls_handshake(e, "implicit TLS (ftps://): ", false)
                })?;
                Control::new(io, cfg.reply_timeout)?
            }
            _ => Control::new(stream, cfg.reply_timeout)?,
        };
        let greet = Cmd::bare("(greeting)");
        // An FTP server greets at once; a port that says nothing first (an
        // implicit-TLS port waiting for a ClientHello, another service)
        // would leave the user looking at nothing for the whole timeout.
        let first = {
            let read = ctl.read_reply();
            tokio::pin!(read);
            tokio::select! {
                r = &mut read => r,
                () = tokio::time::sleep(GREETING_NOTICE), if cfg.reply_timeout > GREETING_NOTICE => {
                    tracing::warn!(
                        "no greeting from {} after {} s; waiting up to {} s (--timeout). An FTP server greets at once: is this an implicit-TLS port (ftps://) or another service?",
                        peer.map_or_else(|| "the server".to_owned(), |a| a.to_string()),
                        GREETING_NOTICE.as_secs(),
                        cfg.reply_timeout.as_secs()
                    );
                    read.await
                }
            }
        };
        let mut r = first.map_err(|e| match e {
            ClientError::Timeout { after, .. } => ClientError::NoGreeting { after },
            ClientError::Protocol(p) => ClientError::NotFtp(p.to_string()),
            // An FTP server that will not serve says so (421); one that
            // closes without a word is most often something else: an
            // implicit-TLS port waiting for a ClientHello that gave up.
            // (Not after an implicit-TLS handshake, which a server took.)
            ClientError::Closed if !matches!(tls, Some((_, true))) => {
                ClientError::NotFtp("the server closed the connection without one".into())
            }
            other => other,
        })?;
        // 120: "service ready in nnn minutes"; the 220 follows.
        while r.code == 120 {
            r = ctl.read_reply().await?;
        }
        if r.code != 220 {
            return Err(unexpected(&greet, &r));
        }
        let greets_gridftp = r
            .lines
            .iter()
            .any(|l| l.to_ascii_lowercase().contains("gridftp"));
        let greets_xftp = r.lines.first().is_some_and(|l| l.starts_with("xftp "));
        let data_tls = match tls {
            Some((t, implicit)) => {
                if !implicit {
                    let auth = Cmd::with("AUTH", "TLS");
                    ctl.send(&[&auth]).await?;
                    let r = ctl.read_reply().await?;
                    if r.code != 234 {
                        return Err(ClientError::Tls(format!(
                            "the server refused AUTH TLS ({} {}): it offers no TLS on this port (ftps:// is implicit TLS on its own port; plain ftp:// sends the password in clear)",
                            r.code,
                            reply_text(&r)
                        )));
                    }
                    ctl = ctl.start_tls(&t).await?;
                }
                // Every data connection is TLS too (RFC 4217 section 9).
                // OPTS TLS BIND: an xftp server then takes the session's
                // binding token as the proof that a data connection is
                // ours, and no data connection needs a session ticket (a
                // ticket is used once; uploads never bring new ones back).
                // Other servers refuse it: data connections then resume
                // the control session with the tickets in hand.
                let (pbsz, prot, bind) = (
                    Cmd::with("PBSZ", "0"),
                    Cmd::with("PROT", "P"),
                    Cmd::with("OPTS", "TLS BIND"),
                );
                ctl.send(&[&pbsz, &prot, &bind]).await?;
                ctl.expect(&pbsz, &[200]).await?;
                let r = ctl.read_reply().await?;
                if r.code != 200 {
                    return Err(ClientError::Tls(format!(
                        "the server refused PROT P ({} {}): data connections would travel in clear",
                        r.code,
                        reply_text(&r)
                    )));
                }
                let mut t = t;
                if ctl.read_reply().await?.code == 200 {
                    if let Some(token) = ctl.binding_token() {
                        t.bind(token);
                    }
                }
                Some(t)
            }
            None => None,
        };
        Ok(Client {
            ctl,
            cfg,
            granted: 1,
            notices: Vec::new(),
            epsv_refused: false,
            eprt_refused: false,
            pending_login: None,
            login_stalled: None,
            pending_prelude: None,
            features: None,
            mode_e: false,
            start: None,
            buf_reply: None,
            buf_in_force: None,
            last_controller: None,
            inline_digest: None,
            received_twice: 0,
            listed_size: None,
            out_of_step: false,
            early_final: None,
            progress_name: None,
            unlisted: 0,
            unreadable: 0,
            mlst_chosen: false,
            verify_alg: None,
            mult_refused: None,
            mult_ok: false,
            endgame_ok: false,
            session_grant: None,
            gridftp: None,
            gridftp_retr_refused: false,
            gridftp_told: false,
            greets_gridftp,
            greets_xftp,
            data_tls,
            sessions: None,
        })
    }

    /// How to open more sessions to this server: `-p N` against a server
    /// without MULT (or GridFTP parallelism) then downloads over N
    /// sessions fetching byte ranges (`REST` + `RETR`), as lftp's `pget`.
    /// Uploads keep one connection (a stock server has no ranged STOR).
    pub fn set_sessions(&mut self, f: SessionFactory) {
        self.sessions = Some(f);
    }

    /// TLS on the control connection (version, cipher suite), if any.
    pub fn tls_info(&self) -> Option<xftp_tls::TlsInfo> {
        self.ctl.tls_info()
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.ctl.peer()
    }

    /// Data connections each RETR/STOR uses (1 unless MULT granted more;
    /// a transfer too small for them all uses fewer).
    pub fn streams(&self) -> u32 {
        self.session_grant.unwrap_or(self.granted)
    }

    /// Messages for the user (e.g. "server does not support MULT"), taken
    /// out so each is shown once.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Log in and set binary type, in one round trip: USER, PASS, TYPE I
    /// (and `MULT n` when more than one stream is configured) are sent
    /// together. No user means anonymous with an e-mail-like password.
    pub async fn login(&mut self, user: Option<&str>, password: Option<&str>) -> Result<()> {
        self.login_pipelined(user, password).await?;
        self.settle().await
    }

    /// Like [`login`](Self::login), but the replies are read by the next
    /// operation, whose first commands go out in the same round trip (a
    /// download then needs one round trip less). Login errors surface from
    /// that operation.
    pub async fn login_pipelined(
        &mut self,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<()> {
        let (user, password) = match user {
            None => ("anonymous", Some(password.unwrap_or(ANONYMOUS_PASSWORD))),
            Some(u) => (u, password),
        };
        let want = self.cfg.streams;
        let auto = self.cfg.auto.is_some();
        let login = PendingLogin {
            user: Cmd::with("USER", user),
            pass: password.map(|p| Cmd::with("PASS", p)),
            ty: Cmd::with("TYPE", "I"),
            // GridFTP's spelling to a server that greets as one
            // (globus-gridftp-server refuses SITE BUFSIZE).
            bufsize: self.cfg.bufsize.map(|b| {
                if self.greets_gridftp {
                    Cmd::with("SBUF", b.to_string())
                } else {
                    Cmd::with("SITE", format!("BUFSIZE {b}"))
                }
            }),
            opts_static: self
                .cfg
                .static_split
                .then(|| Cmd::with("OPTS", "MULT STATIC")),
            // Downloads take duplicate records and complete without a
            // stuck connection's EOD (Receiver::file_endgame); this asks
            // an xftp server to send stuck records again. Others refuse it.
            // With one connection too: ALLO then guards a stream-mode
            // upload's size (`upload_body`).
            endgame: endgame_wanted().then(|| Cmd::with("OPTS", "MULT ENDGAME")),
            // The automatic mode needs to know what the server offers; the
            // count is chosen once the RTT is known (after these replies).
            feat: auto.then(|| Cmd::bare("FEAT")),
            mult: (!auto && want > 1).then(|| Cmd::with("MULT", want.to_string())),
        };
        // The automatic mode chooses its starting count now, from the RTT
        // of the TCP handshake and the cache, and sends MODE E and MULT in
        // the login flight: waiting for the login replies first would cost
        // a round trip. A server without them refuses both and the
        // transfer falls back to one plain connection.
        let prelude = match &self.cfg.auto {
            Some(a) if self.start.is_none() => {
                let max = a.tune.max_streams.clamp(1, 64);
                let (n0, why) = xftp_tune::initial_streams(
                    self.ctl.rtt(),
                    self.cfg.bufsize,
                    a.cached_best,
                    max,
                );
                let fixed = if self.cfg.data_mode == DataMode::Mprt {
                    Some("MPRT connections cannot be added")
                } else if self.cfg.static_split {
                    Some("static partitioning")
                } else {
                    None
                };
                let (why, adaptive) = match fixed {
                    Some(f) => (format!("{why} (fixed: {f})"), false),
                    None => (why, true),
                };
                tracing::info!("tune: starting with {n0} connection(s): {why}");
                self.start = Some((n0, why, adaptive));
                Some(Prelude {
                    // Not MODE E: a GridFTP server would accept that and
                    // refuse MULT, leaving the session in a mode we did not
                    // want. Only a server that knows MULT accepts this.
                    mode_e: adaptive.then(|| Cmd::with("OPTS", "MULT FRAMED")),
                    mult: (adaptive || n0 > 1).then(|| (Cmd::with("MULT", n0.to_string()), n0)),
                })
            }
            _ => None,
        };
        let mut batch: Vec<&Cmd> = vec![&login.user];
        batch.extend(login.pass.as_ref());
        batch.push(&login.ty);
        batch.extend(login.bufsize.as_ref());
        batch.extend(login.opts_static.as_ref());
        batch.extend(login.endgame.as_ref());
        batch.extend(login.feat.as_ref());
        batch.extend(login.mult.as_ref());
        if let Some(p) = &prelude {
            batch.extend(p.mode_e.as_ref());
            batch.extend(p.mult.as_ref().map(|m| &m.0));
        }
        self.ctl.send(&batch).await?;
        self.pending_login = Some(login);
        self.pending_prelude = prelude;
        Ok(())
    }

    /// Send `cmds`, then read the replies still owed to an earlier
    /// pipelined login, so the next reply read belongs to `cmds[0]`.
    async fn send(&mut self, cmds: &[&Cmd]) -> Result<()> {
        self.ctl.send(cmds).await?;
        self.settle().await
    }

    /// Read the replies of a pipelined login and of the automatic mode's
    /// MODE E / MULT, if any are outstanding.
    async fn settle(&mut self) -> Result<()> {
        // A server that greets and then stands still at the login
        // (overloaded, or the path stalled): nothing was transferred, and
        // the session is out of step for good (a caller that tries again
        // on it, as a tree's probe of the server's features does, gets the
        // same answer at once).
        let login_stalled = |after| ClientError::Timeout {
            what: crate::error::LOGIN_REPLY.into(),
            after,
        };
        if let Some(after) = self.login_stalled {
            return Err(login_stalled(after));
        }
        if let Some(login) = self.pending_login.take() {
            self.settle_login(login).await.map_err(|e| match e {
                ClientError::Timeout { after, .. } => {
                    self.login_stalled = Some(after);
                    login_stalled(after)
                }
                e => e,
            })?;
        }
        if let Some(p) = self.pending_prelude.take() {
            if let Some(m) = &p.mode_e {
                let r = self.ctl.read_reply().await?;
                if r.code == 200 {
                    self.mode_e = true;
                } else if r.is_failure() {
                    // A server without MULT refuses this too; the MULT
                    // reply that follows says so to the user.
                    tracing::info!(
                        "server refused framed transfers: {} {}",
                        r.code,
                        reply_text(&r)
                    );
                } else {
                    return Err(unexpected(m, &r));
                }
            }
            if let Some((c, want)) = &p.mult {
                if self.read_mult(c, *want).await? {
                    self.start = Some((
                        1,
                        "the server does not support MULT: one plain connection".to_string(),
                        false,
                    ));
                }
            }
        }
        Ok(())
    }

    async fn settle_login(&mut self, login: PendingLogin) -> Result<()> {
        let r = self.ctl.read_reply().await?;
        match r.code {
            230 => {
                // Logged in without a password; a pipelined PASS gets some
                // reply (202, 230 or 503), none of which matters.
                if login.pass.is_some() {
                    self.ctl.read_reply().await?;
                }
            }
            331 | 332 => {
                let Some(c_pass) = &login.pass else {
                    return Err(ClientError::Usage(
                        "the server wants a password for this user".into(),
                    ));
                };
                self.ctl.expect(c_pass, &[230, 202]).await?;
            }
            _ => return Err(unexpected(&login.user, &r)),
        }
        self.ctl.expect(&login.ty, &[200]).await?;
        if let Some(c) = &login.bufsize {
            let r = self.ctl.read_reply().await?;
            let text = format!("{} {}", r.code, reply_text(&r));
            if r.is_success() {
                tracing::info!("server buffers: {text}");
            } else if r.is_failure() {
                self.notices.push(format!(
                    "server refused {} ({text}); only this client's buffers are set",
                    c.display()
                ));
            } else {
                return Err(unexpected(c, &r));
            }
            self.buf_reply = Some(text);
        }
        if let Some(c) = &login.opts_static {
            let r = self.ctl.read_reply().await?;
            if r.is_failure() {
                self.notices.push(format!(
                    "server refused OPTS MULT STATIC ({} {}); it assigns records its own way",
                    r.code,
                    reply_text(&r)
                ));
            } else if !r.is_success() {
                return Err(unexpected(c, &r));
            }
        }
        if let Some(c) = &login.endgame {
            // Refused, nothing else changes.
            let r = self.ctl.read_reply().await?;
            if r.is_preliminary() {
                return Err(unexpected(c, &r));
            }
            self.endgame_ok = r.is_success();
        }
        if login.feat.is_some() {
            let r = self.ctl.read_reply().await?;
            self.features = Some(negotiate::features(&r));
        }
        if let Some(c_mult) = &login.mult {
            self.read_mult(c_mult, self.cfg.streams).await?;
        }
        Ok(())
    }

    /// The reply to `MULT want`: the grant, or 1 with a notice on refusal.
    async fn read_mult(&mut self, c_mult: &Cmd, want: u32) -> Result<bool> {
        {
            let r = self.ctl.read_reply().await?;
            if r.is_success() {
                self.granted =
                    negotiate::mult_granted(&r, want).ok_or_else(|| ClientError::BadReply {
                        command: c_mult.display(),
                        code: r.code,
                        text: reply_text(&r),
                        reason: format!("expected `200 MULT <n>` with 1 <= n <= {want}"),
                    })?;
                self.mult_ok = true;
                if self.granted < want {
                    self.notices.push(format!(
                        "server granted {} of {want} connections",
                        self.granted
                    ));
                }
            } else if r.is_failure() {
                self.granted = 1;
                self.mult_refused = Some(want);
                // Without MULT there are no records to assign: a refused
                // OPTS MULT STATIC says nothing more.
                self.notices
                    .retain(|m| !m.starts_with("server refused OPTS MULT STATIC"));
                self.notices
                    .push("server does not support MULT; using 1 connection".into());
                return Ok(true);
            } else {
                return Err(unexpected(c_mult, &r));
            }
        }
        Ok(false)
    }

    /// Send any command and expect one of `codes` (escape hatch).
    pub async fn command(
        &mut self,
        verb: &'static str,
        arg: Option<&str>,
        codes: &[u16],
    ) -> Result<Reply> {
        let c = match arg {
            Some(a) => Cmd::with(verb, a),
            None => Cmd::bare(verb),
        };
        self.send(&[&c]).await?;
        self.ctl.expect(&c, codes).await
    }

    /// The size of a remote file, `None` when the server cannot tell
    /// (no SIZE support, or a refusal such as 550).
    pub async fn size(&mut self, path: &str) -> Result<Option<u64>> {
        let c = Cmd::with("SIZE", path);
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        Ok(negotiate::size_value(&r))
    }

    /// Download `remote` to `local`. Data goes to a temporary file next to
    /// `local`, renamed over it only after the server's 226 and, when the
    /// server answers SIZE, a matching byte count. On any error nothing is
    /// left under either name.
    ///
    /// With [`ClientConfig::resume`], the download is resumable instead:
    /// see `download_resumable`.
    pub async fn download(&mut self, remote: &str, local: &Path) -> Result<TransferReport> {
        let r = self.download_inner(remote, local).await;
        self.in_step_after(r).await
    }

    /// The next [`download`](Client::download) is of a file a listing gave
    /// as `size` bytes: where the server does not answer SIZE, the copy is
    /// checked against it (a server that cut the file and said 226
    /// passed).
    pub fn expect_listed_size(&mut self, size: Option<u64>) {
        self.listed_size = size;
    }

    async fn download_inner(&mut self, remote: &str, local: &Path) -> Result<TransferReport> {
        let local = &local_target(local)?;
        self.inline_digest = None;
        self.received_twice = 0;
        let listed = self.listed_size.take();
        if self.cfg.resume {
            return self.download_resumable(remote, local, listed).await;
        }
        let tmp = temp_next_to(local, true)?;
        let start = Instant::now();
        let verify = self.verify_plan().await?;
        self.auto_prelude().await?;
        if let Some(n) = self.gridftp_parallel().await? {
            let r = self
                .download_gridftp(remote, local, tmp, start, n, verify)
                .await;
            if r.is_err() {
                // Best effort: leave the session in stream mode.
                let _ = self.leave_mode_e().await;
            }
            return r;
        }
        let c_size = Cmd::with("SIZE", remote);
        let (size_reply, setup) = self
            .prepare_data(false, Some(&c_size), Fit::Download(None))
            .await?;
        let expected = size_reply
            .as_ref()
            .and_then(negotiate::size_value)
            .or(listed);
        self.progress_begin(remote, expected);
        // Decided only now, with the login's replies read on the way (no
        // round trip of its own where it does not apply): ranged sessions
        // from a server without MULT. The data connection just set up
        // carries the first range.
        if let Some(size) = expected.filter(|&s| s >= 2 * ranged::RANGE_MIN) {
            if let Some(want) = self.ranged_want().await? {
                let file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
                let per_stream = match self
                    .fetch_ranges(
                        remote,
                        Arc::new(file),
                        &[(0, size)],
                        size,
                        want,
                        Some(setup),
                        None,
                    )
                    .await
                {
                    // FEAT said REST STREAM and REST was refused: the
                    // whole file over one connection, from the start.
                    Err(
                        e @ ClientError::Reply {
                            code: 500..=599, ..
                        },
                    ) if e.to_string().starts_with("REST ") => {
                        self.notices.push(format!(
                            "the server refused REST ({e}); downloading over one connection"
                        ));
                        if let Some(f) = self.features.as_mut() {
                            f.rest_stream = false;
                        }
                        drop(tmp);
                        return Box::pin(self.download_inner(remote, local)).await;
                    }
                    r => r?,
                };
                let timeline = self.timeline(false, per_stream.len() as u32);
                let done = Done {
                    per_stream,
                    expected: Some(size),
                    start,
                    timeline,
                };
                return self
                    .complete_download(remote, done, tmp, local, verify)
                    .await;
            }
        }
        let c_retr = Cmd::with("RETR", remote);
        // One stream from a server that does not fail a download whose file
        // is written meanwhile (xftp serve does, 451): the file's time
        // before and after tells a file rewritten in place, whose copy
        // would mix two versions. Asked in RETR's round trip (FEAT is not
        // asked for this: a server not known to be an xftp one is watched).
        // Nor from `xftp serve` (its greeting): that check cost `get -p 1`
        // a sixth round trip.
        let watch = !self.mode_e
            && self.granted <= 1
            && !self.greets_xftp
            && !self.features.as_ref().is_some_and(|f| f.mult);
        let before = if watch {
            let c_mdtm = Cmd::with("MDTM", remote);
            self.ctl.send(&[&c_mdtm, &c_retr]).await?;
            let r = self.ctl.read_reply().await?;
            (r.code == 213).then(|| reply_text(&r).trim().to_owned())
        } else {
            self.ctl.send(&[&c_retr]).await?;
            None
        };
        // Several connections: the transfer starts once most are open, and
        // one whose SYN was lost joins a second later.
        let early = self.granted > 1;
        let (conns, grow, late) = self.start_transfer_early(&c_retr, setup, early).await?;
        self.note_buffers(&conns);
        let n = (conns.len() + late.len()) as u32;
        let adaptive = self.adaptive_now(&grow);
        let per_stream = if adaptive {
            let file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
            let r = self
                .recv_adaptive(&c_retr, conns, late, grow, Arc::new(file), None, expected)
                .await;
            self.servers_reason(&c_retr, r).await?
        } else if !self.mode_e && n == 1 {
            let mut file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
            let count = self.progress_counter();
            self.inline_digest = verify.map(|(a, _)| (xftp_proto::cksum::Digest::new(a), 0));
            let got = self
                .recv_plain_file(&c_retr, conns, &mut file, tmp.path(), count)
                .await?;
            self.expect_complete(&c_retr).await?;
            self.unchanged_since(remote, before).await?;
            vec![got]
        } else {
            let file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
            let r = self
                .recv_striped(&c_retr, conns, late, Arc::new(file), expected, None)
                .await;
            self.servers_reason(&c_retr, r).await?
        };
        let timeline = self.timeline(adaptive, n);
        let done = Done {
            per_stream,
            expected,
            start,
            timeline,
        };
        self.complete_download(remote, done, tmp, local, verify)
            .await
    }

    /// The adaptive receive of a download: the controller grows and sheds
    /// connections while the engine writes records into `dst` (`have`: the
    /// ranges a resumed download already holds).
    #[allow(clippy::too_many_arguments)]
    async fn recv_adaptive(
        &mut self,
        c_retr: &Cmd,
        conns: Vec<Stream>,
        late: Late,
        grow: Grow,
        dst: Arc<dyn xftp_stripe::WriteAt>,
        have: Option<xftp_stripe::ranges::RangeSet>,
        expected: Option<u64>,
    ) -> Result<Vec<u64>> {
        let n = (conns.len() + late.len()) as u32;
        let started = conns.len();
        let dog = self.watchdog();
        let meters = MeterSet::new();
        let socks = Socks::default();
        let conns: Vec<_> = conns
            .into_iter()
            .map(|c| adaptive::wrap(&meters, &dog, Some(&socks), c))
            .collect();
        // The controller judges the payload of this transfer.
        let total = expected.map(|e| e - have.as_ref().map_or(0, |h| h.covered().min(e)));
        let rx = framed_receiver(dst, expected, have, conns, self.endgame_ok);
        let add = {
            let (ctl, meters, dog, socks) =
                (rx.control(), meters.clone(), dog.clone(), socks.clone());
            move |s: Stream| {
                ctl.add_connection(adaptive::wrap(&meters, &dog, Some(&socks), s))
                    .is_ok()
            }
        };
        let live = Live {
            ctl: EngineCtl::Recv(rx.control()),
            socks: Some(socks),
            meters,
            dog,
            grow,
            total,
            live_idx: Live::started_with(started),
            current: n,
            complete_on_226: None,
        };
        let ctlr = self.new_controller(n);
        let rep = late
            .beside(self.adapt(c_retr, rx.finish(), live, ctlr), add)
            .await?;
        self.received_twice += rep.duplicate_bytes;
        Ok(rep.streams.iter().map(|s| s.bytes).collect())
    }

    /// `-c`: download what `local`'s partial file lacks. The partial
    /// (`.NAME.xftp-part`) and its record of ranges stay on any failure,
    /// for the next `-c`; a source whose size or modification time
    /// changed since is refused.
    async fn download_resumable(
        &mut self,
        remote: &str,
        local: &Path,
        listed: Option<u64>,
    ) -> Result<TransferReport> {
        let start = Instant::now();
        let verify = self.verify_plan().await?;
        self.auto_prelude().await?;
        let c_size = Cmd::with("SIZE", remote);
        self.send(&[&c_size]).await?;
        let r = self.ctl.read_reply().await?;
        // 550: no such file (or not a plain one): the reply says so, not
        // that the server cannot tell sizes.
        if r.code == 550 {
            return Err(unexpected(&c_size, &r));
        }
        let size = negotiate::size_value(&r).or(listed).ok_or_else(|| {
            ClientError::Usage(format!(
                "-c: the server does not tell the size of {remote} (SIZE), so what is missing cannot be known; run without -c"
            ))
        })?;
        let mdtm = self.mdtm(remote).await?;
        // The copy a finished `-c` run left (it took the source's time, as
        // a tree's copies do): nothing to fetch. Without a time from the
        // server a copy of the same size is no proof, and moves again.
        let mtime = mdtm.as_deref().and_then(xftp_proto::facts::parse_time_ms);
        if mtime.is_some_and(|t| complete_copy(local, size, t)) {
            // With --verify a copy whose checksum differs is fetched again.
            if let Some(checksum) = self
                .verified_or_differs(remote, local, size, verify)
                .await?
            {
                tracing::info!("{}: complete already (same size and time)", local.display());
                return Ok(TransferReport::in_place(size, start, checksum));
            }
        }
        let source = format!("{}/{}", self.ctl.peer(), remote.trim_start_matches('/'));
        let meta = resume::SourceMeta { size, mdtm };
        let partial = match resume::Partial::open(local, &source, meta) {
            Ok(p) => p,
            Err(resume::ResumeError::Io(p, e)) => return Err(local_err(&p, e)),
            Err(resume::ResumeError::OtherSource { was, partial }) => {
                return Err(ClientError::SourceChanged {
                    partial,
                    was: format!("begun from {was}"),
                    now: format!("asked for {source}"),
                })
            }
            Err(resume::ResumeError::Changed { was, now, partial }) => {
                return Err(ClientError::SourceChanged {
                    partial,
                    was: describe_meta(&was),
                    now: describe_meta(&now),
                })
            }
        };
        let already = partial.already();
        partial
            .checkpoint()
            .map_err(|e| local_err(&partial.path, e))?;
        let mut guard = KeepPartial(Some(&partial));
        let missing = size - already;
        if already > 0 {
            tracing::info!("resuming: {already} of {size} bytes in place, {missing} to fetch");
        }
        let per_stream = if missing == 0 {
            Vec::new()
        } else if let Some(n) = self.gridftp_parallel().await? {
            // GridFTP's own parallelism and restart: the ranges we have go
            // in REST, the server sends the rest over n connections.
            let dst: Arc<dyn xftp_stripe::WriteAt> = partial.rec.clone();
            let checkpoints = AbortOnDrop(partial.spawn_checkpoints());
            let r = self
                .recv_gridftp(
                    remote,
                    dst,
                    Some(rest_set(&partial.had)),
                    None,
                    Some(size),
                    n,
                )
                .await;
            drop(checkpoints);
            if r.is_err() {
                let _ = self.leave_mode_e().await;
            }
            r?.0.streams.iter().map(|s| s.bytes).collect()
        } else if let Some(want) = self
            .ranged_want()
            .await?
            .filter(|_| missing >= 2 * ranged::RANGE_MIN)
        {
            let work = partial.had.missing(size);
            self.progress_begin(remote, Some(missing));
            let dst: Arc<dyn xftp_stripe::WriteAt> = partial.rec.clone();
            let checkpoints = AbortOnDrop(partial.spawn_checkpoints());
            let r = self
                .fetch_ranges(
                    remote,
                    dst,
                    &work,
                    size,
                    want,
                    None,
                    partial.meta.mdtm.clone(),
                )
                .await;
            drop(checkpoints);
            r?
        } else {
            self.fetch_missing(remote, &partial, size).await?
        };
        let adaptive = self.last_controller.is_some();
        let timeline = self.timeline(adaptive, per_stream.len().max(1) as u32);
        let moved: u64 = per_stream.iter().sum();
        let have = partial.rec.ranges();
        if !have.is_complete(size) {
            return Err(ClientError::ShortTransfer {
                expected: size,
                got: have.covered(),
            });
        }
        // The partial holds the source's bytes and no more (cut to its size
        // when opened): checked, as a longer file must never pass.
        let len = std::fs::metadata(&partial.path)
            .map_err(|e| local_err(&partial.path, e))?
            .len();
        if len != size {
            return Err(local_err(
                &partial.path,
                std::io::Error::other(format!(
                    "holds {len} bytes where the file has {size}: remove it and run again"
                )),
            ));
        }
        let checksum = match verify {
            Some(v) => match self.verify_file(remote, &partial.path, size, v).await {
                Ok(c) => Some(c),
                Err(e @ ClientError::ChecksumMismatch { .. }) => {
                    // Its record says every byte is in: kept, the next `-c`
                    // would put a copy known to differ in place.
                    guard.0 = None;
                    partial.discard();
                    return Err(e);
                }
                Err(e) => return Err(e),
            },
            None => None,
        };
        partial
            .checkpoint()
            .map_err(|e| local_err(&partial.path, e))?;
        set_new_file_mode(&partial.path, local);
        if let Some(t) = mtime {
            // So that the next `-c` knows the copy complete (above).
            let set = std::fs::File::options()
                .write(true)
                .open(&partial.path)
                .and_then(|f| f.set_modified(xftp_proto::facts::system_time_ms(t)));
            if let Err(e) = set {
                tracing::debug!("{}: time not set: {e}", partial.path.display());
            }
        }
        std::fs::rename(&partial.path, local).map_err(|e| local_err(local, e))?;
        partial.remove_record();
        guard.0 = None;
        Ok(TransferReport {
            bytes: moved,
            per_stream_bytes: per_stream,
            elapsed: start.elapsed(),
            timeline: Some(timeline),
            checksum,
            already,
            received_twice: std::mem::take(&mut self.received_twice),
            sent_twice: 0,
        })
    }

    /// One RETR of the ranges `partial` lacks: `REST a-b,...` when the
    /// transfer is framed (MULT or MODE E), `REST offset` past the
    /// contiguous head in stream mode (the bytes after a hole are then
    /// fetched again).
    async fn fetch_missing(
        &mut self,
        remote: &str,
        partial: &resume::Partial,
        size: u64,
    ) -> Result<Vec<u64>> {
        let missing = size.saturating_sub(partial.had.covered());
        let (_, setup) = self.prepare_data(false, None, Fit::Resume(missing)).await?;
        let framed = self.mode_e || self.granted > 1;
        // What the server is told we have (the largest ranges a REST line
        // holds: the rest is fetched again).
        let mut told = xftp_stripe::ranges::RangeSet::new();
        if framed {
            told = rest_set(&partial.had);
        } else {
            told.union(0, partial.had.contiguous_prefix());
        }
        if !told.is_empty() {
            let arg = if framed {
                xftp_proto::command::format_ranges(&told.iter().collect::<Vec<_>>())
            } else {
                told.contiguous_prefix().to_string()
            };
            let c = Cmd::with("REST", arg);
            self.send(&[&c]).await?;
            self.ctl.expect(&c, &[350]).await?;
        }
        self.progress_begin(remote, Some(size - told.covered()));
        let c_retr = Cmd::with("RETR", remote);
        self.ctl.send(&[&c_retr]).await?;
        // As for `get`: a framed download starts before a late connection.
        let (conns, grow, late) = self
            .start_transfer_early(&c_retr, setup, framed && self.granted > 1)
            .await?;
        self.note_buffers(&conns);
        let checkpoints = AbortOnDrop(partial.spawn_checkpoints());
        let dst: Arc<dyn xftp_stripe::WriteAt> = partial.rec.clone();
        let adaptive = self.adaptive_now(&grow);
        let r = if adaptive {
            self.recv_adaptive(&c_retr, conns, late, grow, dst, Some(told), Some(size))
                .await
        } else if !framed {
            let at = told.contiguous_prefix();
            match self.recv_plain_at(&c_retr, conns, partial, at, size).await {
                Ok(got) => self.expect_complete(&c_retr).await.map(|()| vec![got]),
                Err(e @ ClientError::PastEnd { .. }) => {
                    // Bytes past the end came from somewhere else than
                    // where they were written: none of this run's is kept.
                    drop(checkpoints);
                    if let Err(w) = partial.roll_back() {
                        return Err(local_err(&partial.path, w));
                    }
                    return Err(e);
                }
                Err(e) => Err(e),
            }
        } else {
            self.recv_striped(&c_retr, conns, late, dst, Some(size), Some(told))
                .await
        };
        drop(checkpoints);
        r
    }

    /// Stream mode into the partial file from `at`, every chunk recorded.
    /// A byte past `size` fails it ([`ClientError::PastEnd`]): a server
    /// that ignores REST sends the file from its start, and those bytes
    /// must not be recorded as the ones at `at`.
    async fn recv_plain_at(
        &mut self,
        c: &Cmd,
        mut conns: Vec<Stream>,
        partial: &resume::Partial,
        mut at: u64,
        size: u64,
    ) -> Result<u64> {
        let from = at;
        let past = |at: u64, n: usize| at.saturating_add(n as u64) > size;
        let conn = conns
            .pop()
            .ok_or_else(|| ClientError::Stripe("no data connection".into()))?;
        let mut conn = self.watchdog().guard(conn);
        let mut got = 0u64;
        // Through a pipe where the connection allows (see recv_plain_file).
        let pipe = if xftp_stripe::DataSocket::can_splice_in(&conn) {
            xftp_stripe::Pipe::with_capacity(CHUNK).ok()
        } else {
            None
        };
        if let Some(pipe) = pipe {
            loop {
                let fill = std::future::poll_fn(|cx| {
                    xftp_stripe::DataSocket::poll_splice_in(
                        std::pin::Pin::new(&mut conn),
                        cx,
                        &pipe,
                        pipe.capacity(),
                    )
                });
                let n = self
                    .beside_control(c, fill)
                    .await?
                    .map_err(ClientError::DataIo)?;
                if n == 0 {
                    return Ok(got);
                }
                if past(at, n) {
                    return Err(ClientError::PastEnd { size, from });
                }
                xftp_stripe::WriteAt::write_from_pipe(&*partial.rec, &pipe, n, at)
                    .map_err(|e| local_err(&partial.path, e))?;
                at += n as u64;
                got += n as u64;
            }
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = self
                .beside_control(c, conn.read(&mut buf))
                .await?
                .map_err(ClientError::DataIo)?;
            if n == 0 {
                return Ok(got);
            }
            if past(at, n) {
                return Err(ClientError::PastEnd { size, from });
            }
            // In place, like the engine's positional writes: a write into
            // the page cache costs less than handing it to another thread.
            xftp_stripe::WriteAt::write_at(&*partial.rec, &buf[..n], at)
                .map_err(|e| local_err(&partial.path, e))?;
            at += n as u64;
            got += n as u64;
        }
    }

    /// Make the next downloads resumable (`-c`), or not.
    pub fn set_resume(&mut self, on: bool) {
        self.cfg.resume = on;
    }

    /// The modification time of a remote file (MDTM), `None` when the
    /// server does not tell.
    pub async fn mdtm(&mut self, path: &str) -> Result<Option<String>> {
        let c = Cmd::with("MDTM", path);
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        Ok((r.code == 213).then(|| reply_text(&r).trim().to_owned()))
    }

    /// After a download from a server that does not fail one whose file is
    /// written meanwhile: the file's time now against `was` (its MDTM
    /// before, if it gave one). A file rewritten during the transfer gave
    /// a copy of two versions: [`ClientError::ChangedDuring`].
    async fn unchanged_since(&mut self, remote: &str, was: Option<String>) -> Result<()> {
        let Some(was) = was else {
            return Ok(());
        };
        match self.mdtm(remote).await? {
            Some(now) if now != was => Err(ClientError::ChangedDuring {
                was: format!("modified {was}"),
                now: format!("modified {now}"),
            }),
            _ => Ok(()),
        }
    }

    /// Whether MFMT may carry milliseconds: an xftp server (it lists MULT)
    /// takes them; a stock server may refuse a fraction (pyftpdlib does).
    pub(crate) async fn mfmt_fraction(&mut self) -> Result<bool> {
        Ok(self.features().await?.mult)
    }

    /// Upload `local` to `remote`. The bytes sent must equal the local
    /// file's length, and after the 226 the server's SIZE (when it answers)
    /// must agree too.
    ///
    /// With `--verify`, the file goes up under a temporary name beside
    /// `remote` (`.NAME.xftp-part`), is checked against the server's
    /// checksum, and only then renamed over `remote`; on a mismatch the
    /// temporary is deleted.
    pub async fn upload(&mut self, local: &Path, remote: &str) -> Result<TransferReport> {
        let r = self.upload_inner(local, remote).await;
        self.in_step_after(r).await
    }

    async fn upload_inner(&mut self, local: &Path, remote: &str) -> Result<TransferReport> {
        self.inline_digest = None;
        // An empty file has nothing to resume: a plain STOR (atomic on the
        // server all the same) saves the resumable upload's round trips.
        let empty = std::fs::metadata(local).is_ok_and(|m| m.is_file() && m.len() == 0);
        if self.cfg.resume && !empty {
            return self.upload_resumable(local, remote).await;
        }
        if self.cfg.resume && self.verify_plan().await?.is_none() {
            // The partial an earlier `put -c` of another version left
            // (`.NAME.xftp-part`, with its record) would stay for good:
            // it goes once the empty file is in place.
            let r = self.upload_as(local, remote).await?;
            let tmp = temp_remote_name(remote);
            let dele = Cmd::with("DELE", &tmp);
            self.send(&[&dele]).await?;
            if self.ctl.read_reply().await?.code == 250 {
                tracing::info!("deleted the partial upload {tmp} of an earlier version");
            }
            return Ok(r);
        }
        let Some(v) = self.verify_plan().await? else {
            return self.upload_as(local, remote).await;
        };
        let tmp = temp_remote_name(remote);
        self.verify_alg = Some(v.0);
        self.progress_name = Some(remote.to_owned());
        let sent = self.upload_as(local, &tmp).await;
        self.progress_name = None;
        self.verify_alg = None;
        let r = match sent {
            Ok(mut rep) => match self.verify_file(&tmp, local, rep.bytes, v).await {
                // Interrupted while the checksums were compared: the
                // target stays as it was (it was replaced, and the run
                // said it verified and then exited 130).
                Ok(_)
                    if self
                        .cfg
                        .interrupt
                        .as_ref()
                        .is_some_and(|s| s.is_cancelled()) =>
                {
                    Err(ClientError::Interrupted)
                }
                Ok(c) => {
                    rep.checksum = Some(c);
                    self.rename(&tmp, remote).await.map(|()| rep)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if r.is_err() {
            // Best effort: leave nothing half-checked behind.
            let c = Cmd::with("DELE", &tmp);
            if self.send(&[&c]).await.is_ok() {
                let _ = self.ctl.read_reply().await;
            }
        }
        r
    }

    /// `put -c`: a resumable upload to an xftp server. The file goes to
    /// `dir/.NAME.xftp-part` with `SITE RESUMABLE` (the server writes it in
    /// place and keeps it, with a record of its ranges, if the upload is
    /// cut); a later run asks `SITE RANGES`, and if the local file's size
    /// and modification time are still the ones recorded, sends only the
    /// rest (`REST a-b,...` + STOR). Then the partial is renamed into place.
    async fn upload_resumable(&mut self, local: &Path, remote: &str) -> Result<TransferReport> {
        let start = Instant::now();
        let md = std::fs::metadata(local).map_err(|e| local_err(local, e))?;
        if !md.is_file() {
            return Err(ClientError::Usage(format!(
                "{} is not a regular file",
                local.display()
            )));
        }
        let len = md.len();
        let mtime = md.modified().map_or(0, xftp_proto::facts::epoch_ms);
        // What the server's record of a partial upload names the source
        // by (the server only compares it): the file's change time to the
        // nanosecond, which the kernel sets at every write, `touch`,
        // rename or chmod and nobody can set back. Its modification time
        // could name two files: two of one size `touch`ed to one time (an
        // archive's, `cp -p`'s) were spliced into one upload. A record of
        // an older client (the modification time) differs, and that
        // upload starts over once, as after a rename of the local file.
        let stamp = {
            use std::os::unix::fs::MetadataExt;
            md.ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(md.ctime_nsec())
        };
        let stamp_text = |ns: i64| {
            format!(
                "changed at {}",
                xftp_proto::facts::format_time_of_ms(ns.div_euclid(1_000_000))
            )
        };
        let verify = self.verify_plan().await?;
        self.auto_prelude().await?;
        self.settle().await?;
        let f = self.features().await?;
        if !(f.mode_e && f.mult) {
            return Err(ClientError::UploadResumeUnsupported);
        }
        // A name no common file system holds (255 bytes on Linux and the
        // BSDs, 255 UTF-16 units on Windows and macOS): the whole upload
        // would go into the partial and fail at its rename.
        let last = remote.rsplit('/').next().unwrap_or(remote);
        if last.encode_utf16().count() > NAME_MAX_UNITS {
            return Err(ClientError::Usage(format!(
                "the remote name is {} characters long: no common file system holds more than {NAME_MAX_UNITS} in one name; give a shorter one",
                last.chars().count()
            )));
        }
        let tmp = temp_remote_name(remote);
        // What the server holds of an earlier attempt, and of the target
        // (in the same round trip).
        let c = Cmd::with("SITE", format!("RANGES {tmp}"));
        let (cs, cm) = (Cmd::with("SIZE", remote), Cmd::with("MDTM", remote));
        self.send(&[&c, &cs, &cm]).await?;
        let r = self.ctl.read_reply().await?;
        let rs = self.ctl.read_reply().await?;
        let rm = self.ctl.read_reply().await?;
        // The copy a finished `put -c` left (it set the time, MFMT).
        let complete = negotiate::size_value(&rs) == Some(len)
            && rm.code == 213
            && xftp_proto::facts::parse_time_ms(reply_text(&rm).trim())
                .is_some_and(|t| xftp_proto::facts::same_time(mtime, t));
        let mut have = None;
        if r.code == 213 {
            let text = reply_text(&r);
            let field = |k: &str| {
                text.split_ascii_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_owned)
            };
            let (size, time) = (
                field("size=").and_then(|v| v.parse::<u64>().ok()),
                field("mtime=").and_then(|v| v.parse::<i64>().ok()),
            );
            if size != Some(len) || time != Some(stamp) {
                // What the server holds is of an earlier version of the
                // local file (or of another file): of no use to this one.
                // Deleted (its record with it), this upload starts over;
                // kept, every later `put -c` would be refused for it.
                let was = format!(
                    "{} bytes, {} (server's record)",
                    size.unwrap_or(0),
                    stamp_text(time.unwrap_or(0))
                );
                let dele = Cmd::with("DELE", &tmp);
                self.send(&[&dele]).await?;
                if self.ctl.read_reply().await?.code != 250 {
                    return Err(ClientError::SourceChanged {
                        partial: PathBuf::from(&tmp),
                        was,
                        now: format!("{len} bytes, {}", stamp_text(stamp)),
                    });
                }
                self.notices.push(format!(
                    "the partial upload on the server ({was}) was of another version of {}: deleted; sending the file from the start",
                    local.display()
                ));
            } else {
                let mut h = xftp_stripe::ranges::RangeSet::new();
                if let Some(list) = field("ranges=").filter(|l| !l.is_empty()) {
                    for (a, b) in xftp_proto::command::parse_ranges(&list)? {
                        h.union(a, b.min(len));
                    }
                }
                have = Some(h);
            }
        } else if complete {
            if let Some(checksum) = self.verified_or_differs(remote, local, len, verify).await? {
                tracing::info!("{remote}: complete already on the server (same size and time)");
                return Ok(TransferReport::in_place(len, start, checksum));
            }
        }
        // Framed, so that ranges can be sent.
        let framed_before = self.mode_e;
        if !self.mode_e && self.granted <= 1 {
            let c = Cmd::with("MODE", "E");
            self.send(&[&c]).await?;
            self.ctl.expect(&c, &[200]).await?;
            self.mode_e = true;
        }
        let c = Cmd::with("SITE", format!("RESUMABLE {len} {stamp}"));
        self.send(&[&c]).await?;
        self.ctl.expect(&c, &[200]).await?;
        let file = std::fs::File::open(local).map_err(|e| local_err(local, e))?;
        // What a REST line holds of it; the rest is sent again.
        let have = have.map(|h| rest_set(&h));
        let already = have.as_ref().map_or(0, |h| h.covered());
        self.progress_name = Some(remote.to_owned());
        let r = self
            .upload_body(file, len, local, &tmp, start, have.as_ref())
            .await;
        self.progress_name = None;
        if !framed_before && self.mode_e {
            self.mode_e = false;
            let _ = self.leave_mode_e().await;
        }
        let mut rep = r?;
        if let Some(v) = verify {
            match self.verify_file(&tmp, local, len, v).await {
                Ok(c) => rep.checksum = Some(c),
                Err(e) => {
                    // A whole copy that differs is no partial worth keeping.
                    let c = Cmd::with("DELE", &tmp);
                    if self.send(&[&c]).await.is_ok() {
                        let _ = self.ctl.read_reply().await;
                    }
                    return Err(e);
                }
            }
        }
        // The source's time on the partial first, in the RNFR's round trip
        // (harmless if the rename fails; a rename keeps it), so that the
        // next `put -c` knows the copy complete (above).
        // To the millisecond: a server that resumes uploads is an xftp
        // server, which takes a fraction (RFC 3659's time-val).
        let t = mfmt_cmd(&tmp, mtime, true);
        let a = Cmd::with("RNFR", &tmp);
        self.send(&[&t, &a]).await?;
        if self.ctl.read_reply().await?.code != 213 {
            tracing::debug!("{tmp}: the server did not take the time (MFMT)");
        }
        self.ctl.expect(&a, &[350]).await?;
        let b = Cmd::with("RNTO", remote);
        self.send(&[&b]).await?;
        self.ctl.expect(&b, &[250]).await?;
        rep.already = already;
        Ok(rep)
    }

    /// For a copy complete by size and time: `Some` (with the checksum
    /// when `verify` asks for one) if it is taken as complete, `None` if
    /// its checksum differs from the source's and it must move again.
    async fn verified_or_differs(
        &mut self,
        remote: &str,
        local: &Path,
        size: u64,
        verify: Option<(Algorithm, Via)>,
    ) -> Result<Option<Option<Checksum>>> {
        let Some(v) = verify else {
            return Ok(Some(None));
        };
        match self.verify_file(remote, local, size, v).await {
            Ok(c) => Ok(Some(Some(c))),
            Err(ClientError::ChecksumMismatch { .. }) => {
                tracing::info!("{remote}: same size and time, another checksum: moving it again");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// RNFR `from`, RNTO `to`.
    pub async fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        let a = Cmd::with("RNFR", from);
        self.send(&[&a]).await?;
        self.ctl.expect(&a, &[350]).await?;
        let b = Cmd::with("RNTO", to);
        self.send(&[&b]).await?;
        self.ctl.expect(&b, &[250]).await?;
        Ok(())
    }

    async fn upload_as(&mut self, local: &Path, remote: &str) -> Result<TransferReport> {
        let file = std::fs::File::open(local).map_err(|e| local_err(local, e))?;
        let meta = file.metadata().map_err(|e| local_err(local, e))?;
        if !meta.is_file() {
            return Err(ClientError::Usage(format!(
                "{} is not a regular file",
                local.display()
            )));
        }
        let len = meta.len();
        let start = Instant::now();
        self.auto_prelude().await?;
        let Some(n) = self.gridftp_upload().await? else {
            return self
                .upload_body(file, len, local, remote, start, None)
                .await;
        };
        // One upload with n connections in MODE E, then back to MODE S.
        let plain = (self.granted, self.mode_e);
        (self.granted, self.mode_e) = (n, true);
        let r = self
            .upload_body(file, len, local, remote, start, None)
            .await;
        (self.granted, self.mode_e) = plain;
        match r {
            Ok(rep) => {
                self.leave_mode_e().await?;
                Ok(rep)
            }
            Err(e) => {
                let _ = self.leave_mode_e().await;
                Err(e)
            }
        }
    }

    /// The transfer part of [`Client::upload`].
    async fn upload_body(
        &mut self,
        file: std::fs::File,
        len: u64,
        local: &Path,
        remote: &str,
        start: Instant,
        have: Option<&xftp_stripe::ranges::RangeSet>,
    ) -> Result<TransferReport> {
        let already = have.map_or(0, |h| h.covered());
        // The local file as it was when the upload began.
        let stamp = xftp_stripe::FileStamp::new(&file, len);
        let (_, setup) = self
            .prepare_data(
                false,
                None,
                Fit::Upload {
                    bytes: len.saturating_sub(already),
                    resumable: self.cfg.resume,
                },
            )
            .await?;
        if let Some(h) = have.filter(|h| !h.is_empty()) {
            let list: Vec<(u64, u64)> = h.iter().collect();
            let c = Cmd::with("REST", xftp_proto::command::format_ranges(&list));
            self.send(&[&c]).await?;
            self.ctl.expect(&c, &[350]).await?;
        }
        self.progress_begin(remote, Some(len - already));
        let c_stor = Cmd::with("STOR", remote);
        // The endgame, as for downloads (docs/protocol.md): on a framed
        // upload to a server that took `OPTS MULT ENDGAME`, ALLO announces
        // the size, in the same flight as STOR; a 200 says the server
        // takes copies of records and completes once every byte is in.
        // In stream mode (`-p 1`) ALLO tells such a server the size
        // too, so that an upload cut short (the client killed, which
        // closes its data connection cleanly: the end of the file in
        // stream mode) is not kept under the file's name.
        let framed = self.mode_e || self.granted > 1;
        let c_allo = (self.endgame_ok
            && ((framed && len - already >= UPLOAD_ENDGAME_MIN) || (!framed && already == 0)))
            .then(|| Cmd::with("ALLO", len.to_string()));
        let mut flight: Vec<&Cmd> = c_allo.iter().collect();
        flight.push(&c_stor);
        // An interrupt that came while the data connection was set up: no
        // STOR, which on a stock server truncates the old file before a
        // byte moves (vsftpd's old file went, with nothing sent).
        if self
            .cfg
            .interrupt
            .as_ref()
            .is_some_and(|s| s.is_cancelled())
        {
            return Err(ClientError::Interrupted);
        }
        self.ctl.send(&flight).await?;
        let endgame = match &c_allo {
            Some(a) => {
                let r = self.ctl.read_reply().await?;
                if r.is_preliminary() {
                    return Err(unexpected(a, &r));
                }
                r.code == 200 && framed
            }
            None => false,
        };
        // As for a download: an xftp server takes the connections of a
        // framed upload as they come, so the upload starts once most are
        // open (not a static split, whose records are dealt out at the
        // start; not a GridFTP server, which has no MULT).
        let early = self.mult_ok && self.granted > 1 && !self.cfg.static_split;
        let (conns, grow, late) = self.start_transfer_early(&c_stor, setup, early).await?;
        self.note_buffers(&conns);
        let started = conns.len();
        let n = (started + late.len()) as u32;
        let adaptive = self.adaptive_now(&grow);
        let per_stream = if adaptive {
            let dog = self.watchdog();
            let meters = MeterSet::new();
            let socks = Socks::default();
            let conns: Vec<_> = conns
                .into_iter()
                .map(|c| adaptive::wrap(&meters, &dog, Some(&socks), c))
                .collect();
            let cfg = xftp_stripe::SendConfig {
                record_size: upload_record_size(len, have, n),
                endgame,
                source_check: Some(source_check(&file, len)),
                ..xftp_stripe::SendConfig::default()
            };
            let tx = match have {
                Some(h) => xftp_stripe::Sender::file_except(Arc::new(file), len, h, conns, &cfg),
                None => xftp_stripe::Sender::file(Arc::new(file), len, conns, &cfg),
            };
            let live_idx = Live::started_with(started);
            let add = {
                let (ctl, meters, dog, socks) =
                    (tx.control(), meters.clone(), dog.clone(), socks.clone());
                let idx = live_idx.clone();
                move |s: Stream| match ctl.add_connection(adaptive::wrap(
                    &meters,
                    &dog,
                    Some(&socks),
                    s,
                )) {
                    // A late connection can be retired like the others.
                    Ok(i) => {
                        if let Ok(mut l) = idx.lock() {
                            l.push(i);
                        }
                        true
                    }
                    Err(_) => false,
                }
            };
            let live = Live {
                ctl: EngineCtl::Send(tx.control()),
                socks: Some(socks),
                meters,
                dog,
                grow,
                total: Some(len),
                live_idx,
                current: n,
                complete_on_226: endgame.then_some(len - already),
            };
            let ctlr = self.new_controller(n);
            let stop = self.cfg.interrupt.clone();
            let rep = interruptible(
                &stop,
                late.beside(self.adapt(&c_stor, tx.finish(), live, ctlr), add),
            )
            .await??;
            (
                rep.streams.iter().map(|s| s.bytes).collect(),
                rep.bytes,
                rep.duplicate_bytes,
            )
        } else if !self.mode_e && n == 1 {
            let mut file = tokio::fs::File::from_std(file);
            let count = self.progress_counter();
            self.inline_digest = self
                .verify_alg
                .map(|a| (xftp_proto::cksum::Digest::new(a), 0));
            let v = match self
                .send_plain(conns, &mut file, local, len, count, Some(&stamp))
                .await
            {
                Ok(b) => vec![b],
                Err(ClientError::LocalFileWritten { .. }) => {
                    // As below: the data connection was reset before its
                    // end, so an xftp server kept what was there.
                    let reset = std::io::Error::other("reset: the local file was written");
                    let _ = self
                        .after_failure(&c_stor, ClientError::DataIo(reset))
                        .await;
                    let cleared = self.clear_cut_upload_quietly(remote).await;
                    return Err(ClientError::LocalFileWritten { cleared });
                }
                Err(ClientError::LocalFileChanged { expected, read, .. }) => {
                    // The data connection was reset; the server ends the
                    // transfer with an error. A stock server wrote what came
                    // under the target's name (STOR truncates it first), so
                    // it goes: a prefix of a file must not look like the
                    // file. An xftp server (MULT) kept nothing.
                    let reset = std::io::Error::other("reset: the local file changed");
                    let _ = self
                        .after_failure(&c_stor, ClientError::DataIo(reset))
                        .await;
                    let cleared = self.clear_cut_upload_quietly(remote).await;
                    return Err(ClientError::LocalFileChanged {
                        expected,
                        read,
                        cleared,
                    });
                }
                Err(e) => {
                    // A 226 too: some servers (pyftpdlib) take a reset
                    // upload for a whole one.
                    let (e, ended) = self.after_failure(&c_stor, e).await;
                    let answered = ended || matches!(e, ClientError::Reply { .. });
                    self.clear_cut_upload(remote, answered).await;
                    return Err(self.unless_interrupted(e));
                }
            };
            self.upload_answered(&c_stor, remote).await?;
            let b = v[0];
            (v, b, 0)
        } else {
            match self
                .send_striped(&c_stor, conns, late, file, len, have, endgame)
                .await
            {
                Ok(v) => {
                    self.upload_answered(&c_stor, remote).await?;
                    v
                }
                Err((e, sent)) => {
                    match self.after_failure(&c_stor, e).await {
                        (e, true) if endgame => {
                            tracing::info!("{e}, after the server had every byte (226): the upload is complete");
                            (sent, len - already, 0)
                        }
                        (e, ended) => {
                            let answered = ended || matches!(e, ClientError::Reply { .. });
                            self.clear_cut_upload(remote, answered).await;
                            return Err(self.unless_interrupted(e));
                        }
                    }
                }
            }
        };
        // The connections' counts hold the endgame's copies.
        let (per_stream, sent, sent_twice) = per_stream;
        if sent + already != len {
            return Err(ClientError::UploadMismatch {
                what: "bytes sent",
                expected: len,
                got: sent + already,
            });
        }
        if let Some(remote_len) = self.size(remote).await? {
            if remote_len != len {
                return Err(ClientError::UploadMismatch {
                    what: "the server's SIZE",
                    expected: len,
                    got: remote_len,
                });
            }
        }
        if stamp.changed() {
            // Rewritten in place at the same size, or touched: every byte
            // went, but not of one version. It goes, as a cut upload does.
            let c = Cmd::with("DELE", remote);
            let cleared = self.send(&[&c]).await.is_ok()
                && self.ctl.read_reply().await.is_ok_and(|r| r.code == 250);
            return Err(ClientError::LocalFileWritten { cleared });
        }
        let timeline = self.timeline(adaptive, n);
        Ok(TransferReport {
            bytes: sent,
            per_stream_bytes: per_stream,
            elapsed: start.elapsed(),
            timeline: Some(timeline),
            checksum: None,
            already: 0,
            received_twice: 0,
            sent_twice,
        })
    }

    /// The server's final reply to an upload whose data all went out: a
    /// refusal now (a disk full once the socket buffers had taken the
    /// file) leaves what the server wrote, which [`Client::clear_cut_upload`]
    /// deletes where it is in place.
    async fn upload_answered(&mut self, c_stor: &Cmd, remote: &str) -> Result<()> {
        match self.expect_complete(c_stor).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let answered = matches!(e, ClientError::Reply { .. });
                self.clear_cut_upload(remote, answered).await;
                Err(self.unless_interrupted(e))
            }
        }
    }

    /// After an upload failed once its data had begun to move: a server
    /// that writes STOR in place (a stock or GridFTP server; not an xftp
    /// server, which lists MULT and keeps the old file until the new one
    /// is whole) holds a prefix, or for MODE E scattered pieces, under the
    /// target's name, where it would pass for the file. It is deleted
    /// (STOR had truncated the old file already), where the server's
    /// final reply to the upload came (`answered`): otherwise the next
    /// reply read could be that one, not DELE's. Warns either way, since
    /// the user may need to act.
    async fn clear_cut_upload(&mut self, remote: &str, answered: bool) {
        match self.in_place(answered).await {
            Some(false) => {}
            Some(true) if answered && self.dele_bounded(remote).await => {
                tracing::warn!("deleted the incomplete copy the server had written under {remote}");
            }
            Some(true) => tracing::warn!(
                "the server may keep an incomplete copy under {remote} (it writes uploads in place, and could not be asked to delete it): delete it, or upload again"
            ),
            None => tracing::warn!(
                "if this server writes uploads in place, it may keep an incomplete copy under {remote}: check, and delete it or upload again"
            ),
        }
    }

    /// `e`, or [`ClientError::Interrupted`] once the user has interrupted:
    /// the server's reply to the reset upload is not the cause.
    fn unless_interrupted(&self, e: ClientError) -> ClientError {
        match &self.cfg.interrupt {
            Some(s) if s.is_cancelled() => ClientError::Interrupted,
            _ => e,
        }
    }

    /// The user's interrupt ([`ClientConfig::interrupt`]), for callers
    /// that stop taking new work once it fires.
    pub fn interrupt(&self) -> Option<tokio_util::sync::CancellationToken> {
        self.cfg.interrupt.clone()
    }

    /// [`Client::clear_cut_upload`] without the warnings, for an upload
    /// reset on purpose (the control connection in step); whether nothing
    /// of it is left.
    async fn clear_cut_upload_quietly(&mut self, remote: &str) -> bool {
        match self.in_place(true).await {
            Some(false) => true,
            Some(true) => self.dele_bounded(remote).await,
            None => false,
        }
    }

    /// Whether the server writes an upload in place under its name
    /// (`None`: not known, and not to be asked now). An xftp server
    /// (MULT) keeps it apart until it is whole. FEAT is asked, bounded,
    /// only where `may_ask` says the control connection is in step.
    async fn in_place(&mut self, may_ask: bool) -> Option<bool> {
        if self.mult_ok {
            return Some(false);
        }
        if let Some(f) = &self.features {
            return Some(!f.mult);
        }
        if !may_ask {
            return None;
        }
        match tokio::time::timeout(Duration::from_secs(5), self.features()).await {
            Ok(Ok(f)) => Some(!f.mult),
            _ => None,
        }
    }

    /// DELE, bounded (a session the network cut would hold it for the
    /// whole reply timeout); whether it was done.
    async fn dele_bounded(&mut self, remote: &str) -> bool {
        let dele = self.command("DELE", Some(remote), &[250]);
        matches!(
            tokio::time::timeout(Duration::from_secs(5), dele).await,
            Ok(Ok(_))
        )
    }

    // ---- automatic mode ----

    /// Automatic mode, before the first transfer: read the login and FEAT
    /// replies, take the control connection's RTT, choose the starting
    /// count, and send `MODE E` / `MULT n` without waiting: their replies
    /// are read with the transfer's first commands (same round trip).
    async fn auto_prelude(&mut self) -> Result<()> {
        let Some(auto) = self.cfg.auto.clone() else {
            return Ok(());
        };
        if let Some((_, _, adaptive)) = self.start {
            // A listing went back to MODE S since (listings are read in
            // stream mode): framed again, or the count could not change.
            if adaptive && !self.mode_e && self.pending_prelude.is_none() {
                let prelude = Prelude {
                    mode_e: Some(Cmd::with("MODE", "E")),
                    mult: None,
                };
                self.ctl.send(&[&Cmd::with("MODE", "E")]).await?;
                self.pending_prelude = Some(prelude);
            }
            return Ok(());
        }
        self.settle().await?;
        let feat = self.features.clone().unwrap_or_default();
        let max = auto.tune.max_streams.clamp(1, 64);
        let rtt = self.ctl.rtt();
        let (n0, why, adaptive) = if !feat.mult {
            (
                1,
                "the server does not list MULT in FEAT: one plain connection".to_string(),
                false,
            )
        } else {
            let (n, why) = xftp_tune::initial_streams(rtt, self.cfg.bufsize, auto.cached_best, max);
            let fixed = if !feat.mode_e {
                Some("the server does not list MODE E")
            } else if self.cfg.data_mode == DataMode::Mprt {
                Some("MPRT connections cannot be added")
            } else if self.cfg.static_split {
                Some("static partitioning")
            } else {
                None
            };
            match fixed {
                Some(f) => (n, format!("{why} (fixed: {f})"), false),
                None => (n, why, true),
            }
        };
        tracing::info!("tune: starting with {n0} connection(s): {why}");
        let prelude = Prelude {
            mode_e: adaptive.then(|| Cmd::with("MODE", "E")),
            mult: (n0 > 1).then(|| (Cmd::with("MULT", n0.to_string()), n0)),
        };
        let mut batch: Vec<&Cmd> = Vec::new();
        batch.extend(prelude.mode_e.as_ref());
        batch.extend(prelude.mult.as_ref().map(|m| &m.0));
        if !batch.is_empty() {
            self.ctl.send(&batch).await?;
            self.pending_prelude = Some(prelude);
        }
        self.start = Some((n0, why, adaptive));
        Ok(())
    }

    /// Whether the transfer that just started adapts its count.
    fn adaptive_now(&self, grow: &Grow) -> bool {
        self.mode_e && matches!(self.start, Some((_, _, true))) && !matches!(grow, Grow::Fixed)
    }

    fn new_controller(&self, n: u32) -> Controller {
        let mut tune = self
            .cfg
            .auto
            .as_ref()
            .map(|a| a.tune.clone())
            .unwrap_or_default();
        tune.max_streams = tune.max_streams.clamp(1, 64);
        // Starting from the cache's best count: that count is already the
        // answer of a growth phase, so hold it (probing now and then).
        let from_cache = self
            .cfg
            .auto
            .as_ref()
            .is_some_and(|a| a.cached_best.is_some())
            && matches!(self.start, Some((n0, _, _)) if n0 == n);
        let mut c = if from_cache {
            Controller::settled(tune, n)
        } else {
            Controller::new(tune, n)
        };
        if let Some(rtt) = self.ctl.rtt() {
            c.hint_rtt(rtt);
        }
        c
    }

    fn timeline(&mut self, adaptive: bool, n: u32) -> Timeline {
        let ctlr = if adaptive {
            self.last_controller.take()
        } else {
            None
        };
        let (start, mut why) = match &self.start {
            Some((n0, why, _)) => (*n0, why.clone()),
            None => (
                self.session_grant.unwrap_or(n),
                format!("fixed: {} connection(s) requested", self.cfg.streams),
            ),
        };
        let start = if self.session_grant.is_some() && n < start {
            why.push_str(&format!("; {n} for this transfer, one per record"));
            n
        } else {
            start
        };
        let final_streams = ctlr.as_ref().map_or(n, Controller::streams);
        adaptive::timeline(start, why, ctlr.as_ref(), final_streams, self.ctl.rtt())
    }

    /// Record the buffer sizes in force on the first data socket.
    fn note_buffers(&mut self, conns: &[Stream]) {
        if self.cfg.bufsize.is_none() || self.buf_in_force.is_some() {
            return;
        }
        if let Some(c) = conns.first() {
            match sockbuf::read(c.tcp()) {
                Ok(f) => {
                    tracing::info!(
                        "data socket buffers: {} requested, in force rcv {} snd {}",
                        self.cfg.bufsize.unwrap_or(0),
                        f.rcv,
                        f.snd
                    );
                    self.buf_in_force = Some(f);
                }
                Err(e) => tracing::warn!("cannot read the data socket buffers: {e}"),
            }
        }
    }

    /// `--bufsize`: requested, in force, and the server's answer.
    pub fn buffers(&self) -> Option<BufferReport> {
        self.cfg.bufsize.map(|requested| BufferReport {
            requested,
            in_force: self.buf_in_force,
            server_reply: self.buf_reply.clone(),
        })
    }

    /// The server's FEAT, asking for it when not known yet.
    pub async fn features(&mut self) -> Result<Features> {
        if let Some(f) = &self.features {
            return Ok(f.clone());
        }
        let c = Cmd::bare("FEAT");
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        let f = negotiate::features(&r);
        self.features = Some(f.clone());
        Ok(f)
    }

    /// Whether the session is still open after sitting idle: false when
    /// the server has closed it (an idle timeout's 421, then its close) or
    /// sent a reply nothing asked for. Waits for nothing: a quiet
    /// connection is taken as open.
    pub async fn still_open(&mut self) -> bool {
        if self.ctl.unanswered() > 0 {
            return true;
        }
        match self.ctl.read_reply_within(Duration::ZERO).await {
            Err(ClientError::Timeout { .. }) => true,
            Ok(r) => {
                tracing::info!("the server said, unasked: {}", reply_text(&r));
                false
            }
            Err(_) => false,
        }
    }

    /// Whether `--limit-rate` holds this session's transfers back: their
    /// throughput then says nothing of the path.
    pub fn rate_limited(&self) -> bool {
        self.cfg.limit_rate.is_some()
    }

    /// The kernel's smoothed RTT of the control connection (`TCP_INFO`).
    pub fn control_rtt(&self) -> Option<Duration> {
        self.ctl.rtt()
    }

    /// Time one `NOOP` round trip.
    pub async fn noop_rtt(&mut self) -> Result<Duration> {
        let c = Cmd::bare("NOOP");
        self.settle().await?;
        let t0 = Instant::now();
        self.ctl.send(&[&c]).await?;
        self.ctl.expect(&c, &[200]).await?;
        Ok(t0.elapsed())
    }

    /// `LIST [path]` over one plain data connection; the raw listing.
    ///
    /// An empty listing of a path that is no directory (CWD) and no file
    /// (SIZE) is [`ClientError::NotThere`]: some servers (vsftpd) answer
    /// a missing path with nothing and 226, which would read as an empty
    /// directory.
    pub async fn list(&mut self, path: Option<&str>) -> Result<Vec<u8>> {
        let c_list = match path {
            Some(p) if !p.is_empty() => Cmd::with("LIST", p),
            _ => Cmd::bare("LIST"),
        };
        let out = self.listing(c_list).await?;
        match path {
            // `-l` and such are options of the server's ls, not paths.
            Some(p) if out.is_empty() && !p.is_empty() && !p.starts_with('-') => {
                if !self.is_dir(p).await? && self.size(p).await?.is_none() {
                    return Err(ClientError::NotThere { path: p.to_owned() });
                }
                Ok(out)
            }
            _ => Ok(out),
        }
    }

    /// Whether `path` is a directory the session can enter: CWD into it
    /// and back to where the session was.
    pub async fn is_dir(&mut self, path: &str) -> Result<bool> {
        let home = self.pwd().await?;
        let there = Cmd::with("CWD", path);
        let back = Cmd::with("CWD", &home);
        self.send(&[&there, &back]).await?;
        let entered = self.ctl.read_reply().await?.code == 250;
        let r = self.ctl.read_reply().await?;
        home_left(&back, &r)?;
        Ok(entered)
    }

    /// A listing command over one plain data connection, at most
    /// [`MAX_LISTING`] bytes kept.
    async fn listing(&mut self, c: Cmd) -> Result<Vec<u8>> {
        let r = self.listing_inner(c).await;
        self.in_step_after(r).await
    }

    async fn listing_inner(&mut self, c: Cmd) -> Result<Vec<u8>> {
        // Listings are read in stream mode. A server in MODE E (left so by
        // this session's transfers) frames them as MODE E blocks, as
        // GridFTP does: back to MODE S first, in the same write as the
        // data plan.
        if self
            .pending_prelude
            .as_ref()
            .is_some_and(|p| p.mode_e.is_some())
        {
            self.settle().await?;
        }
        let mode = self.mode_e.then(|| Cmd::with("MODE", "S"));
        let (reply, setup) = self.prepare_data(true, mode.as_ref(), Fit::Session).await?;
        if let (Some(m), Some(r)) = (&mode, &reply) {
            if r.code != 200 {
                return Err(unexpected(m, r));
            }
            self.mode_e = false;
        }
        self.ctl.send(&[&c]).await?;
        let (conns, _) = self.start_transfer(&c, setup).await?;
        let mut out = Vec::new();
        let mut capped = Capped {
            out: &mut out,
            left: MAX_LISTING,
        };
        self.recv_plain(&c, conns, &mut capped, Path::new("(listing)"), None)
            .await
            .map_err(|e| match e {
                // The cap, not the local disk.
                ClientError::Local { path, .. } if path == Path::new("(listing)") => {
                    ClientError::Usage(format!(
                        "{}: the server's listing is longer than {} MiB, more than this client keeps: list a smaller directory",
                        c.display(),
                        MAX_LISTING >> 20
                    ))
                }
                e => e,
            })?;
        let done = self.expect_complete_reply(&c).await?;
        let left_out = negotiate::unlisted(&done);
        if left_out > 0 {
            tracing::info!("{}: {}", c.display(), reply_text(&done));
            let faults = negotiate::unreadable(&done).min(left_out);
            self.unlisted += left_out - faults;
            self.unreadable += faults;
        }
        Ok(out)
    }

    /// How many entries the server's listings have said they left out
    /// since the last call (`xftp serve`: names with a line break, links
    /// leading outside its root): a tree copied from them lacks these.
    pub fn take_unlisted(&mut self) -> usize {
        std::mem::take(&mut self.unlisted)
    }

    /// How many entries the server's listings have said it could not read
    /// since the last call (no permission, an I/O error): not counted by
    /// [`Client::take_unlisted`]; a tree copied from them is incomplete.
    pub fn take_unreadable(&mut self) -> usize {
        std::mem::take(&mut self.unreadable)
    }

    /// The entries of a remote directory (MLSD, RFC 3659), without `.`
    /// and `..`; a server without MLSD gives the error of its refusal.
    pub async fn mlsd(&mut self, path: &str) -> Result<Vec<xftp_proto::facts::Entry>> {
        Ok(self.mlsd_checked(path).await?.0)
    }

    /// [`Client::mlsd`], and the lines that name nothing this client can
    /// take: a name with `/`, `.` or `..` as a file's (which would leave the
    /// directory), a line without facts. A tree reports them rather than
    /// drop them unsaid.
    async fn mlsd_checked(
        &mut self,
        path: &str,
    ) -> Result<(Vec<xftp_proto::facts::Entry>, Vec<String>)> {
        use xftp_proto::facts::{parse_mlst, parse_mlsx, Kind};
        if !self.mlst_chosen {
            self.mlst_chosen = true;
            self.ask_unix_mode().await?;
        }
        let out = self.listing(Cmd::with("MLSD", path)).await?;
        let text = xftp_proto::name::decode(&out);
        let mut entries = Vec::new();
        let mut unreadable = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match parse_mlsx(line) {
                Some(e) if e.kind == Kind::SelfOrParent => {}
                Some(e) => entries.push(e),
                // `.` and `..` (listed as cdir and pdir, or as dirs by
                // some servers) are no loss.
                None if parse_mlst(line).is_some_and(|e| {
                    e.kind == Kind::SelfOrParent || matches!(e.name.as_str(), "." | "..")
                }) => {}
                None => unreadable.push(line.trim_end_matches('\r').to_owned()),
            }
        }
        Ok((entries, unreadable))
    }

    /// A server that offers the `UNIX.mode` fact without sending it
    /// (pyftpdlib) is asked for it (`OPTS MLST`, with the facts it sends
    /// already), so that a tree copied from its listings keeps its
    /// permission bits. A refusal changes nothing.
    async fn ask_unix_mode(&mut self) -> Result<()> {
        let Some(f) = self.features.as_ref() else {
            return Ok(());
        };
        let offered = |name: &str| {
            f.mlst_facts
                .iter()
                .any(|(n, on)| !on && n.eq_ignore_ascii_case(name))
        };
        if !offered("unix.mode") {
            return Ok(());
        }
        let mut facts: String = f
            .mlst_facts
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| format!("{n};"))
            .collect();
        facts.push_str("unix.mode;");
        let c = Cmd::with("OPTS", format!("MLST {facts}"));
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        if r.code != 200 {
            tracing::debug!("{}: {} {}", c.display(), r.code, reply_text(&r));
        }
        Ok(())
    }

    /// The entries of a remote directory, without `.` and `..`: from MLSD
    /// where FEAT lists MLST (exact sizes, times and modes), else read out
    /// of LIST lines ([`xftp_proto::facts::parse_list_line`]: sizes and
    /// modes, no times), as vsftpd has no MLSD. `LIST -a`, so that names
    /// starting with a dot are not left out; plain `LIST` where the server
    /// refuses the option.
    pub async fn entries(&mut self, path: &str) -> Result<Vec<xftp_proto::facts::Entry>> {
        Ok(self.entries_dotted(path).await?.0)
    }

    /// A LIST line that names no entry the client can take: not blank,
    /// no `total N`, not `.` or `..` (which every listing may hold), and
    /// not read by [`xftp_proto::facts::parse_list_line`] (a name of
    /// blanks only; a form it does not know).
    fn unreadable_list_line(line: &str) -> bool {
        let t = line.trim_end_matches(['\r', '\n']);
        !(t.trim().is_empty()
            || t.starts_with("total ")
            || t.ends_with(" .")
            || t.ends_with(" ..")
            || xftp_proto::facts::parse_list_line(t).is_some())
    }

    /// [`Client::entries`]; whether a `LIST -a` listing held the
    /// directory's own `.` entry (`None` for MLSD, or a server that
    /// refused `-a`); and the LIST lines that name nothing this client
    /// can take (`Client::unreadable_list_line`), which a tree reports
    /// rather than drop. A server that lists `.` for a directory it can
    /// read lists it for every one; where it is missing the server
    /// could not open the directory: vsftpd then answers 226 with the
    /// directory's own line (`d--------- ... name`), which read as a
    /// listing is a subdirectory of the same name and an empty tree.
    pub async fn entries_dotted(
        &mut self,
        path: &str,
    ) -> Result<(Vec<xftp_proto::facts::Entry>, Option<bool>, Vec<String>)> {
        if self.features().await?.mlst {
            let (entries, unreadable) = self.mlsd_checked(path).await?;
            return Ok((entries, None, unreadable));
        }
        let (out, dashed) = match self
            .listing(Cmd::with("LIST", format!("-a {}", list_arg(path))))
            .await
        {
            Err(ClientError::Reply { code, .. }) if (500..600).contains(&code) => {
                tracing::debug!("LIST -a refused: listing {path} without hidden names");
                (self.list(Some(path)).await?, false)
            }
            r => (r?, true),
        };
        let text = xftp_proto::name::decode(&out);
        let dot = dashed.then(|| {
            text.lines()
                .any(|l| l.starts_with('d') && l.trim_end().ends_with(" ."))
        });
        let unreadable = text
            .lines()
            .filter(|l| Self::unreadable_list_line(l))
            .map(str::to_owned)
            .collect();
        Ok((
            text.lines()
                .filter_map(xftp_proto::facts::parse_list_line)
                .collect(),
            dot,
            unreadable,
        ))
    }

    /// The facts of one path (MLST, RFC 3659) where FEAT lists MLST;
    /// `None` where it does not, or refuses.
    pub async fn mlst(&mut self, path: &str) -> Result<Option<xftp_proto::facts::Entry>> {
        if !self.features().await?.mlst {
            return Ok(None);
        }
        let c = Cmd::with("MLST", path);
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        if r.code != 250 {
            return Ok(None);
        }
        Ok(r.lines
            .iter()
            .skip(1)
            .find_map(|l| xftp_proto::facts::parse_mlst(l)))
    }

    /// Create a remote directory; `Ok(false)` when the server refuses
    /// (it may exist already).
    pub async fn mkd(&mut self, path: &str) -> Result<bool> {
        self.accepted(Cmd::with("MKD", path), |c| c == 257).await
    }

    /// The current remote directory (PWD).
    pub async fn pwd(&mut self) -> Result<String> {
        let c = Cmd::bare("PWD");
        let r = self.command("PWD", None, &[257]).await?;
        xftp_proto::reply::quoted_path(&r.text()).ok_or_else(|| ClientError::BadReply {
            command: c.display(),
            code: r.code,
            text: reply_text(&r),
            reason: "no quoted directory name".into(),
        })
    }

    /// Create remote directories, parents first, with the commands
    /// pipelined (a round trip for many, not one each). For each, whether
    /// it was made, was there already, or could not be made: a refusal is
    /// looked into with CWD (and CWD back to where the session was), so
    /// that a directory that could not be made is told from one that
    /// exists.
    pub async fn mkd_all(&mut self, paths: &[String]) -> Result<Vec<Made>> {
        let mut out = vec![Made::New; paths.len()];
        let mut refused = Vec::new();
        // Bounded, so the server's replies never wait on our reading.
        for (k, chunk) in paths.chunks(64).enumerate() {
            let cmds: Vec<Cmd> = chunk.iter().map(|p| Cmd::with("MKD", p)).collect();
            let refs: Vec<&Cmd> = cmds.iter().collect();
            self.send(&refs).await?;
            for i in 0..chunk.len() {
                let r = self.ctl.read_reply().await?;
                if r.code != 257 {
                    refused.push((k * 64 + i, (r.code, reply_text(&r))));
                }
            }
        }
        if refused.is_empty() {
            return Ok(out);
        }
        let home = self.pwd().await?;
        for chunk in refused.chunks(32) {
            let mut cmds = Vec::with_capacity(2 * chunk.len());
            for (i, _) in chunk {
                cmds.push(Cmd::with("CWD", &paths[*i]));
                cmds.push(Cmd::with("CWD", &home));
            }
            let refs: Vec<&Cmd> = cmds.iter().collect();
            self.send(&refs).await?;
            for (i, why) in chunk {
                let there = self.ctl.read_reply().await?.code == 250;
                let back = self.ctl.read_reply().await?;
                home_left(&Cmd::with("CWD", &home), &back)?;
                out[*i] = if there {
                    Made::There
                } else {
                    Made::Refused(why.0, why.1.clone())
                };
            }
        }
        Ok(out)
    }

    /// Send `c`; whether the reply's code passes `ok` (a refusal is no
    /// error).
    async fn accepted(&mut self, c: Cmd, ok: impl Fn(u16) -> bool) -> Result<bool> {
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply().await?;
        Ok(ok(r.code))
    }

    /// Set a remote file's modification time (MFMT, `ms` milliseconds
    /// after the epoch: to the millisecond on an xftp server, which lists
    /// MULT, else to the second); `Ok(false)` when the server refuses or
    /// does not know MFMT.
    pub async fn mfmt(&mut self, path: &str, ms: i64) -> Result<bool> {
        let fraction = self.mfmt_fraction().await?;
        self.accepted(mfmt_cmd(path, ms, fraction), facts_set).await
    }

    /// Set the times (MFMT, in milliseconds as [`Client::mfmt`]) and
    /// permission bits (SITE CHMOD) of many
    /// remote paths, pipelined in bounded flights (one round trip per 32
    /// paths, not two per path: a tree's directories on a long path).
    /// What the server refuses (no MFMT, no SITE CHMOD, a path it will
    /// not change) is left as the server has it; after a refusal of every
    /// MFMT or every CHMOD in a flight, that command is not sent again.
    pub async fn set_facts_all(
        &mut self,
        items: &[(String, Option<i64>, Option<u32>)],
    ) -> Result<()> {
        let (mut mfmt, mut chmod) = (true, true);
        let fraction = self.mfmt_fraction().await?;
        for chunk in items.chunks(32) {
            let mut cmds = Vec::with_capacity(2 * chunk.len());
            for (path, t, m) in chunk {
                if let (true, Some(t)) = (mfmt, t) {
                    cmds.push((true, mfmt_cmd(path, *t, fraction)));
                }
                if let (true, Some(m)) = (chmod, m) {
                    cmds.push((false, chmod_cmd(path, *m)));
                }
            }
            if cmds.is_empty() {
                break;
            }
            let refs: Vec<&Cmd> = cmds.iter().map(|(_, c)| c).collect();
            self.send(&refs).await?;
            let (mut times_ok, mut modes_ok) = (false, false);
            for (is_mfmt, _) in &cmds {
                let r = self.ctl.read_reply().await?;
                let ok = facts_set(r.code);
                if *is_mfmt {
                    times_ok |= ok;
                } else {
                    modes_ok |= ok;
                }
            }
            mfmt &= times_ok || !cmds.iter().any(|(m, _)| *m);
            chmod &= modes_ok || !cmds.iter().any(|(m, _)| !*m);
        }
        Ok(())
    }

    /// Set a remote file's permission bits (SITE CHMOD); `Ok(false)` when
    /// the server refuses.
    pub async fn chmod(&mut self, path: &str, mode: u32) -> Result<bool> {
        self.accepted(chmod_cmd(path, mode), facts_set).await
    }

    /// Say goodbye. Errors are ignored: the session is over either way.
    pub async fn quit(mut self) {
        // Everything the user asked for is done and checked by now, so the
        // 221 is not awaited: waiting would add a round trip to every run
        // (560 ms on a satellite path) and can change nothing.
        let c = Cmd::bare("QUIT");
        let _ = self.send(&[&c]).await;
        self.ctl.shutdown().await;
    }

    // ---- GridFTP parallelism ----

    /// The connections to use with a GridFTP server (no MULT; FEAT lists
    /// SPAS or SPOR) when more than one was asked for; `None` otherwise.
    async fn gridftp_want(&mut self) -> Result<Option<u32>> {
        if self.gridftp == Some(false) || self.cfg.data_mode == DataMode::Mprt {
            return Ok(None);
        }
        let unsettled = self.pending_login.is_some() || self.pending_prelude.is_some();
        if unsettled {
            // Reading the login's replies now costs a round trip (the
            // transfer's first commands would have gone with them), so
            // only where the greeting says GridFTP.
            if !self.greets_gridftp {
                return Ok(None);
            }
            self.settle().await?;
        }
        let Some(want) = self.mult_refused.filter(|&w| w > 1) else {
            return Ok(None);
        };
        if self.gridftp.is_none() {
            let feat = match self.features.clone() {
                Some(f) => f,
                None => self.features().await?,
            };
            self.gridftp = Some(feat.gridftp);
        }
        Ok((self.gridftp == Some(true)).then_some(want))
    }

    /// Tell the user once that GridFTP parallelism is in use.
    fn tell_gridftp(&mut self, n: u32, upload: bool) {
        if !self.gridftp_told {
            self.gridftp_told = true;
            self.notices
                .retain(|m| !m.starts_with("server does not support MULT"));
            let how = if upload {
                "opened by this client, the sender"
            } else {
                "OPTS RETR Parallelism: the server opens them"
            };
            self.notices.push(format!(
                "GridFTP server: {n} parallel connections in MODE E ({how})"
            ));
        }
    }

    /// For a download from a GridFTP server: switch to MODE E and ask for
    /// more connections with `OPTS RETR Parallelism=n,n,n;`, as
    /// globus-url-copy does. The server then opens the connections to our
    /// port (in MODE E the sender connects). Returns the count, or `None`
    /// to go on with one connection.
    async fn gridftp_parallel(&mut self) -> Result<Option<u32>> {
        if self.gridftp_retr_refused {
            return Ok(None);
        }
        match self.gridftp_want().await? {
            Some(want) => self.enter_gridftp_parallel(want).await,
            None => Ok(None),
        }
    }

    /// For an upload to a GridFTP server in passive mode: MODE E, so that
    /// the client, the sender, opens as many connections as it likes and
    /// announces their number in its EOF block.
    async fn gridftp_upload(&mut self) -> Result<Option<u32>> {
        if self.cfg.data_mode != DataMode::Passive {
            return Ok(None);
        }
        let Some(want) = self.gridftp_want().await? else {
            return Ok(None);
        };
        let mode = Cmd::with("MODE", "E");
        self.send(&[&mode]).await?;
        let r = self.ctl.read_reply().await?;
        if r.is_success() {
            self.tell_gridftp(want, true);
            Ok(Some(want))
        } else if r.is_failure() {
            tracing::info!(
                "GridFTP server refused MODE E: {} {}",
                r.code,
                reply_text(&r)
            );
            Ok(None)
        } else {
            Err(unexpected(&mode, &r))
        }
    }

    /// `MODE E` and `OPTS RETR Parallelism` for one download (each GridFTP
    /// download switches back to `MODE S` afterwards, so listings and
    /// uploads stay in stream mode).
    async fn enter_gridftp_parallel(&mut self, want: u32) -> Result<Option<u32>> {
        let mode = Cmd::with("MODE", "E");
        let opts = Cmd::with("OPTS", format!("RETR Parallelism={want},{want},{want};"));
        self.send(&[&mode, &opts]).await?;
        let (rm, ro) = (self.ctl.read_reply().await?, self.ctl.read_reply().await?);
        for (c, r) in [(&mode, &rm), (&opts, &ro)] {
            if !r.is_success() && !r.is_failure() {
                return Err(unexpected(c, r));
            }
        }
        let n = if rm.is_success() && ro.is_success() {
            self.tell_gridftp(want, false);
            want
        } else {
            self.gridftp_retr_refused = true;
            if rm.is_success() {
                self.leave_mode_e().await?;
            }
            tracing::info!(
                "GridFTP parallelism refused: {} {} / {} {}",
                rm.code,
                reply_text(&rm),
                ro.code,
                reply_text(&ro)
            );
            1
        };
        Ok((n > 1).then_some(n))
    }

    /// Back to stream mode after a GridFTP parallel download.
    async fn leave_mode_e(&mut self) -> Result<()> {
        let c = Cmd::with("MODE", "S");
        self.send(&[&c]).await?;
        self.ctl.expect(&c, &[200]).await?;
        Ok(())
    }

    /// RETR from a GridFTP server with `n` parallel connections: announce
    /// a port, accept the server's connections as they come (it may open
    /// fewer than asked) and let the MODE E EOF count decide the end.
    async fn download_gridftp(
        &mut self,
        remote: &str,
        local: &Path,
        tmp: tempfile::NamedTempFile,
        start: Instant,
        n: u32,
        verify: Option<(Algorithm, Via)>,
    ) -> Result<TransferReport> {
        let c_size = Cmd::with("SIZE", remote);
        let file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
        // A GridFTP server sends what the file holds as it reads it: one
        // rewritten meanwhile arrives mixed. Its time before and after
        // tells (as for one stream from a stock server).
        let was = self.mdtm(remote).await?;
        let (report, expected) = self
            .recv_gridftp(remote, Arc::new(file), None, Some(&c_size), None, n)
            .await?;
        self.unchanged_since(remote, was).await?;
        let per_stream: Vec<u64> = report.streams.iter().map(|s| s.bytes).collect();
        let timeline = adaptive::timeline(
            n,
            format!("GridFTP server without MULT: OPTS RETR Parallelism={n}"),
            None,
            per_stream.len() as u32,
            self.ctl.rtt(),
        );
        let done = Done {
            per_stream,
            expected,
            start,
            timeline,
        };
        self.complete_download(remote, done, tmp, local, verify)
            .await
    }

    /// A MODE E download from a GridFTP server that opens up to `n`
    /// connections to our port (`OPTS RETR Parallelism` was sent): into
    /// `dst`, from `have` on (`REST a-b,...`, GridFTP's restart) when
    /// resuming. `before` (SIZE) travels with the port command; its value
    /// or `size` is the size to check. Leaves the session in MODE S.
    async fn recv_gridftp(
        &mut self,
        remote: &str,
        dst: Arc<dyn xftp_stripe::WriteAt>,
        have: Option<xftp_stripe::ranges::RangeSet>,
        before: Option<&Cmd>,
        size: Option<u64>,
        n: u32,
    ) -> Result<(xftp_stripe::TransferReport, Option<u64>)> {
        let listener = self.listen().await?;
        let addr = listener.local_addr().map_err(ClientError::DataIo)?;
        let size_reply = self.announce_port(addr, before).await?;
        let expected = size.or_else(|| size_reply.as_ref().and_then(negotiate::size_value));
        if let Some(h) = have.as_ref().filter(|h| !h.is_empty()) {
            let list: Vec<(u64, u64)> = h.iter().collect();
            let c = Cmd::with("REST", xftp_proto::command::format_ranges(&list));
            self.send(&[&c]).await?;
            self.ctl.expect(&c, &[350]).await?;
        }
        self.progress_begin(
            remote,
            expected.map(|e| e - have.as_ref().map_or(0, |h| h.covered().min(e))),
        );
        let c_retr = Cmd::with("RETR", remote);
        self.ctl.send(&[&c_retr]).await?;
        self.expect_preliminary(&c_retr).await?;
        let (peer, t) = (self.ctl.peer().ip(), self.cfg.data_timeout);
        let tls = self.data_tls.clone();
        // Watching the control connection meanwhile: a server that fails
        // after its 150 (a directory given as the file) opens no
        // connection, and its reply says why at once.
        let first = self
            .beside_control(&c_retr, accept_from(&listener, peer, t, tls.as_ref()))
            .await??;
        self.note_buffers(std::slice::from_ref(&first));
        let dog = self.watchdog();
        let conns = vec![dog.guard(first)];
        let rx = framed_receiver(dst, expected, have, conns, self.endgame_ok);
        let ctl = rx.control();
        let (l, tls, dog) = (&listener, tls.as_ref(), &dog);
        let more = async move {
            for _ in 1..n {
                match accept_from(l, peer, t, tls).await {
                    Ok(s) => {
                        if ctl.add_connection(dog.guard(s)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::debug!("no more GridFTP data connections: {e}");
                        break;
                    }
                }
            }
            // The transfer decides when it is over, not this loop; but it
            // must know that no connection will be added (see Late::feed).
            drop(ctl);
            std::future::pending::<std::convert::Infallible>().await
        };
        let recv = async {
            tokio::select! {
                r = rx.finish() => r.map_err(|e| stripe_err(e, t)),
                never = more => match never {},
            }
        };
        let report = self.beside_control(&c_retr, recv).await??;
        self.expect_complete(&c_retr).await?;
        self.leave_mode_e().await?;
        Ok((report, expected))
    }

    // ---- progress ----

    /// The watchdog of a transfer's data connections, counting for the
    /// progress display.
    fn watchdog(&self) -> Arc<Watchdog> {
        Watchdog::with(
            self.cfg.data_timeout,
            self.cfg.progress.clone(),
            self.cfg.limit_rate.clone(),
        )
    }

    fn progress_begin(&self, label: &str, total: Option<u64>) {
        if let Some(p) = &self.cfg.progress {
            p.begin(self.progress_name.as_deref().unwrap_or(label), total);
        }
    }

    fn progress_counter(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.cfg.progress.as_ref().map(|p| p.counter())
    }

    // ---- verification ----

    /// With `--verify`: the algorithm and command to use, chosen before
    /// anything moves, so that a server without checksums fails the
    /// command before the transfer rather than after.
    /// With `--verify`: whether the server offers a checksum to verify
    /// with, asked before a batch of transfers (a tree) so that a server
    /// without one is refused once, before anything moves.
    pub async fn check_verify(&mut self) -> Result<()> {
        self.verify_plan().await.map(drop)
    }

    async fn verify_plan(&mut self) -> Result<Option<(Algorithm, Via)>> {
        if self.cfg.verify == Verify::Off {
            return Ok(None);
        }
        self.settle().await?;
        let f = self.features().await?;
        choose_checksum(&f, self.cfg.verify).map(Some)
    }

    /// The server's checksum of `path` (the whole file), by CKSM or HASH.
    /// The reply may take a while on a large file: the limit grows with
    /// `size` (at 50 MB/s).
    async fn remote_checksum(
        &mut self,
        path: &str,
        alg: Algorithm,
        via: Via,
        size: u64,
    ) -> Result<String> {
        let limit = self.cfg.reply_timeout + Duration::from_secs(size / 50_000_000);
        let c = match via {
            Via::Cksm => Cmd::with("CKSM", format!("{} 0 -1 {path}", alg.cksm_name())),
            Via::Hash => {
                let name = alg.hash_name().unwrap_or("SHA-256");
                let o = Cmd::with("OPTS", format!("HASH {name}"));
                self.send(&[&o]).await?;
                self.ctl.expect(&o, &[200]).await?;
                Cmd::with("HASH", path)
            }
        };
        self.send(&[&c]).await?;
        let r = self.ctl.read_reply_within(limit).await?;
        if r.code != 213 {
            return Err(unexpected(&c, &r));
        }
        checksum_value(&r.lines, alg, via).ok_or_else(|| {
            bad_reply(
                &c,
                &r,
                xftp_proto::ProtoError::BadArgument {
                    verb: match via {
                        Via::Cksm => "CKSM",
                        Via::Hash => "HASH",
                    },
                    reason: format!("no {alg} value of {} hex digits", alg.hex_len()),
                },
            )
        })
    }

    /// Compare the server's checksum of `remote` with ours of `file`.
    async fn verify_file(
        &mut self,
        remote: &str,
        file: &Path,
        size: u64,
        (alg, via): (Algorithm, Via),
    ) -> Result<Checksum> {
        let path = file.to_owned();
        // Computed while the bytes passed, when they went over one
        // stream-mode connection; else read back (from the page cache as
        // a rule).
        let inline = self
            .inline_digest
            .take()
            .filter(|(d, k)| d.algorithm() == alg && *k == size)
            .map(|(d, k)| (d.finish_hex(), k));
        let how = if inline.is_some() {
            "hashed as the bytes passed"
        } else {
            "hashed from the file"
        };
        let local = tokio::task::spawn_blocking(move || match inline {
            Some(v) => Ok(v),
            None => {
                let f = std::fs::File::open(&path)?;
                xftp_proto::cksum::digest_file(alg, &f, 0, None)
            }
        });
        // The server hashes its copy while we hash ours.
        let remote_value = match self.remote_checksum(remote, alg, via, size).await {
            // A ranged download can end with this session gone while the
            // others brought every byte (ProFTPD's mod_tls ends a session
            // whose data connection was cut): the copy is checked over a
            // new session of the same login.
            Err(e)
                if matches!(
                    e,
                    ClientError::Closed | ClientError::ControlIo(_) | ClientError::Tls(_)
                ) =>
            {
                match self.sessions.clone() {
                    None => Err(e),
                    Some(f) => {
                        tracing::info!(
                            "checksum: this session was lost ({e}); asking over a new one"
                        );
                        match (f.0)().await {
                            Ok(mut c) => {
                                let v = c.remote_checksum(remote, alg, via, size).await;
                                c.quit().await;
                                v
                            }
                            Err(e2) => {
                                tracing::info!("checksum: no new session: {e2}");
                                Err(e)
                            }
                        }
                    }
                }
            }
            r => r,
        };
        let local = local
            .await
            .map_err(|e| local_err(file, std::io::Error::other(e)))?
            .map_err(|e| local_err(file, e))?
            .0;
        let remote_value = remote_value?;
        if remote_value != local {
            return Err(ClientError::ChecksumMismatch {
                algorithm: alg,
                remote: remote_value,
                local,
            });
        }
        tracing::info!("verified: {alg} {local} ({how})");
        Ok(Checksum {
            algorithm: alg,
            value: local,
        })
    }

    /// The end of every download: the byte count against SIZE, the
    /// checksums with `--verify`, then the rename into place.
    async fn complete_download(
        &mut self,
        remote: &str,
        done: Done,
        tmp: tempfile::NamedTempFile,
        local: &Path,
        verify: Option<(Algorithm, Via)>,
    ) -> Result<TransferReport> {
        let bytes: u64 = done.per_stream.iter().sum();
        if let Some(exp) = done.expected {
            if exp != bytes {
                return Err(ClientError::ShortTransfer {
                    expected: exp,
                    got: bytes,
                });
            }
        }
        let checksum = match verify {
            Some(v) => Some(self.verify_file(remote, tmp.path(), bytes, v).await?),
            None => None,
        };
        // Checked again where the rename happens (a batch's files, a tree's,
        // were not checked before their data came): never onto a device.
        let target = local_target(local)?;
        // The sync and rename off the async threads: with many files in
        // flight, one session's fsync must not hold up the others.
        tokio::task::spawn_blocking(move || {
            finish_temp(tmp, &target)?;
            resume::drop_superseded(&target);
            Ok::<_, ClientError>(())
        })
        .await
        .map_err(|e| local_err(local, std::io::Error::other(e)))??;
        Ok(TransferReport {
            bytes,
            per_stream_bytes: done.per_stream,
            elapsed: done.start.elapsed(),
            timeline: Some(done.timeline),
            checksum,
            already: 0,
            received_twice: std::mem::take(&mut self.received_twice),
            sent_twice: 0,
        })
    }

    // ---- data connections ----

    /// Set up the data connections of the next transfer (one when `plain`,
    /// else as many as MULT granted, but no more than `fit` can use: see
    /// [`fit_count`](Self::fit_count)); `before` is sent in the same write
    /// and its reply (any code) returned.
    async fn prepare_data(
        &mut self,
        plain: bool,
        before: Option<&Cmd>,
        fit: Fit,
    ) -> Result<(Option<Reply>, Setup)> {
        if self.cfg.data_mode == DataMode::Mprt {
            // MPRT names one port per connection: the grant must be known.
            self.settle().await?;
        }
        let n = |c: &Client| if plain { 1 } else { c.granted as usize };
        let mode = match self.cfg.data_mode {
            DataMode::Mprt if n(self) == 1 => DataMode::Active,
            m => m,
        };
        match mode {
            DataMode::Passive => self.prepare_passive(plain, before, fit).await,
            DataMode::Active => {
                let listener = self.listen().await?;
                let addr = listener.local_addr().map_err(ClientError::DataIo)?;
                let before_reply = self.announce_port(addr, before).await?;
                if !plain {
                    self.fit_count(fit, before_reply.as_ref()).await?;
                }
                Ok((
                    before_reply,
                    Setup::Listen {
                        listener,
                        n: n(self),
                    },
                ))
            }
            DataMode::Mprt => {
                let n = n(self);
                let mut listeners = Vec::with_capacity(n);
                let mut addrs = Vec::with_capacity(n);
                for _ in 0..n {
                    let l = self.listen().await?;
                    addrs.push(l.local_addr().map_err(ClientError::DataIo)?);
                    listeners.push(l);
                }
                let c = Cmd::with("MPRT", hostport::format_mprt_arg(&addrs));
                let before_reply = self.send_with(before, &c).await?;
                self.ctl.expect(&c, &[200]).await?;
                Ok((before_reply, Setup::ListenEach(listeners)))
            }
        }
    }

    /// The count for the transfer about to start, told to an xftp server
    /// with `MULT` before its RETR or STOR (no round trip: the reply is
    /// read with the transfer's). A connection that gets no record carries
    /// nothing and costs a handshake (a TLS one too): a transfer of `b`
    /// bytes uses at most one connection per record of the smallest size
    /// its sender cuts (`Fit`), one for an empty file. The next transfer
    /// goes back to the session's count.
    async fn fit_count(&mut self, fit: Fit, size_reply: Option<&Reply>) -> Result<()> {
        if !self.mult_ok || self.cfg.data_mode == DataMode::Mprt {
            return Ok(());
        }
        let session = self.session_grant.unwrap_or(self.granted);
        let bytes = match fit {
            Fit::Download(b) => b.or_else(|| size_reply.and_then(negotiate::size_value)),
            Fit::Upload { bytes, .. } => Some(bytes),
            Fit::Resume(b) => Some(b),
            Fit::Session => None,
        };
        // Both ends cut small files into records this small
        // (`xftp_stripe::record_size_for`).
        let record = xftp_stripe::MIN_RECORD_SIZE;
        let framed = matches!(
            fit,
            Fit::Resume(_)
                | Fit::Upload {
                    resumable: true,
                    ..
                }
        );
        let least = if framed && !self.mode_e { 2 } else { 1 };
        let want = bytes.map_or(session, |b| {
            xftp_stripe::useful_connections(b, record)
                .max(least)
                .min(session)
        });
        if want < self.granted {
            // A lower count is always granted as asked.
            tracing::debug!("{want} connection(s) for this transfer (session: {session})");
            let c = Cmd::with("MULT", want.to_string());
            self.ctl.send_unawaited(&c).await?;
            self.granted = want;
        } else if want > self.granted {
            // Back up: other sessions from this address may have taken
            // what this one gave back, so the grant is read (a round trip,
            // after a small transfer only).
            let c = Cmd::with("MULT", want.to_string());
            self.send(&[&c]).await?;
            self.read_mult(&c, want).await?;
            if self.granted < want {
                // What the server holds for us now: the session's count.
                self.session_grant = None;
                return Ok(());
            }
        }
        self.session_grant = (self.granted != session).then_some(session);
        Ok(())
    }

    /// Send `before` (if any) and `c` together; read `before`'s reply.
    async fn send_with(&mut self, before: Option<&Cmd>, c: &Cmd) -> Result<Option<Reply>> {
        match before {
            Some(b) => {
                self.send(&[b, c]).await?;
                Ok(Some(self.ctl.read_reply().await?))
            }
            None => {
                self.send(&[c]).await?;
                Ok(None)
            }
        }
    }

    async fn prepare_passive(
        &mut self,
        plain: bool,
        before: Option<&Cmd>,
        fit: Fit,
    ) -> Result<(Option<Reply>, Setup)> {
        let peer = self.ctl.peer().ip();
        let mut before_reply = None;
        let mut target = None;
        if !self.epsv_refused {
            let c = Cmd::bare("EPSV");
            before_reply = self.send_with(before, &c).await?;
            let r = self.ctl.read_reply().await?;
            if r.code == 229 {
                let port =
                    hostport::parse_epsv_reply(&r.text()).map_err(|e| bad_reply(&c, &r, e))?;
                target = Some(SocketAddr::new(peer, port));
            } else if r.code >= 500 {
                tracing::debug!("EPSV refused ({}); falling back to PASV", r.code);
                self.epsv_refused = true;
            } else {
                return Err(unexpected(&c, &r));
            }
        }
        let target = match target {
            Some(t) => t,
            None => {
                let c = Cmd::bare("PASV");
                let b = if before_reply.is_none() { before } else { None };
                let br = self.send_with(b, &c).await?;
                before_reply = before_reply.or(br);
                let r = self.ctl.expect(&c, &[227]).await?;
                let announced =
                    hostport::parse_pasv_reply(&r.text()).map_err(|e| bad_reply(&c, &r, e))?;
                if negotiate::pasv_rewritten(announced, peer) {
                    tracing::info!(
                        "PASV announced {announced}; connecting to the control peer {peer} instead"
                    );
                }
                negotiate::pasv_target(announced, peer)
            }
        };
        if !plain {
            self.fit_count(fit, before_reply.as_ref()).await?;
        }
        // Open every connection at once, without waiting: they complete
        // while the RETR/STOR travels (one round trip saved), and each
        // other (they overlap, not queue). A TLS handshake waits for the
        // server's 1xx, as curl's does: pyftpdlib drops a data connection
        // whose ClientHello comes before it has read the command. The TCP
        // connect takes the round trip the command takes, so the wait
        // costs next to nothing; a server that would send its 1xx only
        // after the handshake gets it after `ANSWER_GRACE`.
        let n = if plain { 1 } else { self.granted as usize };
        let (answered, _) = tokio::sync::watch::channel(false);
        let grace = ANSWER_GRACE + self.ctl.rtt().unwrap_or_default() * 2;
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (t, buf) = (self.cfg.connect_timeout, self.cfg.bufsize);
            let tls = self.data_tls.clone();
            let mut go = answered.subscribe();
            set.spawn(async move {
                let s = connect_tcp(target, buf, t).await?;
                if tls.is_some()
                    && tokio::time::timeout(grace, go.wait_for(|a| *a))
                        .await
                        .is_err()
                {
                    tracing::debug!(
                        "no reply to the transfer command within {grace:?}: TLS handshake now"
                    );
                }
                secure_data(s, tls.as_ref(), t).await
            });
        }
        Ok((
            before_reply,
            Setup::Connecting {
                set,
                target,
                answered,
            },
        ))
    }

    /// A listening socket on the control connection's local address.
    async fn listen(&self) -> Result<TcpListener> {
        sockbuf::listen(SocketAddr::new(self.ctl.local().ip(), 0), self.cfg.bufsize)
            .map_err(ClientError::DataIo)
    }

    /// EPRT (or PORT when EPRT is refused and the address is IPv4).
    async fn announce_port(
        &mut self,
        addr: SocketAddr,
        before: Option<&Cmd>,
    ) -> Result<Option<Reply>> {
        let mut before_reply = None;
        if !self.eprt_refused {
            let c = Cmd::with("EPRT", hostport::format_eprt_arg(addr));
            before_reply = self.send_with(before, &c).await?;
            let r = self.ctl.read_reply().await?;
            if r.code == 200 {
                return Ok(before_reply);
            }
            if r.code < 500 || !addr.is_ipv4() {
                return Err(unexpected(&c, &r));
            }
            tracing::debug!("EPRT refused ({}); falling back to PORT", r.code);
            self.eprt_refused = true;
        }
        let SocketAddr::V4(v4) = addr else {
            return Err(ClientError::Usage(
                "the server refuses EPRT and PORT cannot carry an IPv6 address; use passive mode"
                    .into(),
            ));
        };
        let c = Cmd::with("PORT", hostport::format_port_arg(v4));
        let b = if before_reply.is_none() { before } else { None };
        let br = self.send_with(b, &c).await?;
        self.ctl.expect(&c, &[200]).await?;
        Ok(before_reply.or(br))
    }

    /// After RETR/STOR/LIST went out: the server's 1xx, and the data
    /// connections (passive: the connects finishing alongside; active:
    /// accepted from the server after the 1xx), and where more would come
    /// from.
    async fn start_transfer(&mut self, c: &Cmd, setup: Setup) -> Result<(Vec<Stream>, Grow)> {
        let (mut conns, grow, late) = self.start_transfer_early(c, setup, false).await?;
        conns.extend(late.all().await?);
        Ok((conns, grow))
    }

    /// [`start_transfer`](Self::start_transfer); with `early`, the connections not yet open [`EARLY_START`] after the first
    /// one opened are left to open in `Late`, for a transfer that can take
    /// them as they come.
    async fn start_transfer_early(
        &mut self,
        c: &Cmd,
        setup: Setup,
        early: bool,
    ) -> Result<(Vec<Stream>, Grow, Late)> {
        let peer = self.ctl.peer().ip();
        let t = self.cfg.data_timeout;
        let tls = self.data_tls.clone();
        match setup {
            Setup::Connecting {
                mut set,
                target,
                answered,
            } => {
                // In a block of its own: `connects` borrows `set`, whose
                // connections still opening are `Late` after it.
                let conns = {
                    let connects = early_ones(&mut set, early);
                    // A failed connect must not wait for a reply the server
                    // will only send after its own data timeout; but a server
                    // that refused the command (550 for LIST of a missing
                    // directory) closes its port too, and its reply, not the
                    // refused connect, says why: wait for it briefly.
                    let grace = Duration::from_secs(2) + self.ctl.rtt().unwrap_or_default() * 2;
                    let pre = self.expect_preliminary(c);
                    tokio::pin!(pre, connects);
                    tokio::select! {
                        r = &mut pre => {
                            r?;
                            answered.send_replace(true);
                            connects.await?
                        }
                        r = &mut connects => match r {
                            Ok(conns) => {
                                pre.await?;
                                conns
                            }
                            Err(e) => {
                                return Err(match tokio::time::timeout(grace, pre).await {
                                    Ok(Err(refused)) => refused,
                                    _ => e,
                                });
                            }
                        },
                    }
                };
                Ok((conns, Grow::Passive(target), Late::from_set(set)))
            }
            Setup::Listen { listener, n } => {
                self.expect_preliminary(c).await?;
                let listener = Arc::new(listener);
                // As for passive connections: each is accepted and
                // secured (TLS) on its own; once the first is ready, the
                // others have EARLY_START, and the rest join later. A
                // handshake that loses a segment holds back its own
                // connection, not the transfer.
                let mut set = tokio::task::JoinSet::new();
                for _ in 0..n {
                    let (l, tls) = (listener.clone(), tls.clone());
                    set.spawn(async move { accept_from(&l, peer, t, tls.as_ref()).await });
                }
                let conns = early_ones(&mut set, early).await?;
                Ok((conns, Grow::Active(listener), Late::from_set(set)))
            }
            Setup::ListenEach(ls) => {
                self.expect_preliminary(c).await?;
                // One connection on each port MPRT announced, each
                // accepted and secured on its own, started on as in
                // active mode (the order does not matter: records carry
                // their offsets).
                let mut set = tokio::task::JoinSet::new();
                for l in ls {
                    let tls = tls.clone();
                    set.spawn(async move { accept_from(&l, peer, t, tls.as_ref()).await });
                }
                let conns = early_ones(&mut set, early).await?;
                Ok((conns, Grow::Fixed, Late::from_set(set)))
            }
        }
    }

    /// A data connection of an upload failed (or the user interrupted it):
    /// a server that gave up on the upload (426 "No space left on device")
    /// resets the connections, and its reply, if it comes within a moment,
    /// says why better than the reset. Other errors are returned as they
    /// are. Also whether the transfer's final
    /// reply was a success (226, 250) after all. For an upload in the
    /// endgame that means it is complete: the server replies 226 only once
    /// every byte of the announced size is in, whatever our end of a data
    /// connection saw (one the server closed as it completed, or one reset
    /// on the way after its bytes arrived).
    pub(crate) async fn after_failure(&mut self, c: &Cmd, e: ClientError) -> (ClientError, bool) {
        if !matches!(
            e,
            ClientError::DataIo(_)
                | ClientError::Stripe(_)
                | ClientError::StripeFault(_)
                | ClientError::Interrupted
        ) {
            return (e, false);
        }
        let grace = Duration::from_secs(1) + self.ctl.rtt().unwrap_or_default() * 2;
        let deadline = tokio::time::Instant::now() + grace;
        // Progress and MULT replies may come first, and are not the
        // transfer's end.
        loop {
            let r = match tokio::time::timeout_at(deadline, self.ctl.read_reply()).await {
                Ok(Ok(r)) => r,
                // The control connection broke: the server ends a session
                // that lost it, and its data connections with it, so that
                // is the cause.
                Ok(Err(ctl @ (ClientError::ControlIo(_) | ClientError::Closed))) => {
                    return (ctl, false)
                }
                _ => return (e, false),
            };
            // (GridFTP ends a cut one with 500; 501, 502 and 504 refuse a
            // MULT or STAT sent during the transfer.)
            if r.code >= 400 && !matches!(r.code, 501 | 502 | 504) {
                return (unexpected(c, &r), false);
            }
            if matches!(r.code, 226 | 250) {
                return (e, true);
            }
        }
    }

    /// A framed download (`c`) whose data connections failed: the
    /// server's own reply, where it gives one, is the cause (a file that
    /// shrank while it was sent: "426 ... source ended at N"), rather than
    /// the connection it closed on that account.
    async fn servers_reason<T>(&mut self, c: &Cmd, r: Result<T>) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(e @ (ClientError::DataIo(_) | ClientError::Stripe(_))) => {
                match self.early_final.take() {
                    // Read already, during the transfer.
                    Some(r) if !matches!(r.code, 226 | 250) => Err(unexpected(c, &r)),
                    Some(_) => Err(e),
                    None => Err(self.after_failure(c, e).await.0),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// A transfer or listing (`r`) failed part-way, perhaps after its
    /// 150 (a data connection reset, a local write error): the replies
    /// the server still owes for it are skipped, so that the session's
    /// next command reads its own reply, not the 426 of this one. If they
    /// do not come within a moment the session is marked out of step
    /// ([`Client::in_step`]). `r` is returned as it is.
    async fn in_step_after<T>(&mut self, r: Result<T>) -> Result<T> {
        let e = match r {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        self.early_final = None;
        if e.session_broken()
            || self.pending_login.is_some()
            || self.pending_prelude.is_some()
            || self.ctl.unanswered() == 0
        {
            return Err(e);
        }
        let grace = Duration::from_secs(2) + self.ctl.rtt().unwrap_or_default() * 4;
        if !self.ctl.skip_unanswered(grace).await {
            tracing::info!(
                "the server's reply to a failed transfer did not come within {:.1} s: this session is not used again",
                grace.as_secs_f64()
            );
            self.out_of_step = true;
        }
        Err(e)
    }

    /// Whether the session can take another command: `false` after a
    /// failed transfer whose replies did not come (its control connection
    /// is out of step; open a new session).
    pub fn in_step(&self) -> bool {
        !self.out_of_step
    }

    /// How much one read of a stream-mode transfer may take (at most
    /// `max`): under `--limit-rate`, what the bucket holds, as the striped
    /// connections' reads are capped (`Guarded`); a whole 1 MiB chunk
    /// read and then paid for moved in bursts of half a second at 2 MB/s.
    fn rate_allowance(&self, max: usize) -> usize {
        self.cfg
            .limit_rate
            .as_ref()
            .map_or(max, |r| r.allowance().min(max))
    }

    /// Await `data` (a read of a stream-mode data connection, or a whole
    /// framed receive) while reading the control connection: a failure
    /// reply to `c` ends the transfer at once (a server that gave up may
    /// leave our end of the connections hearing nothing until the data
    /// timeout); a 226 that comes before the end of the data is kept for
    /// [`expect_complete`](Self::expect_complete); markers are passed
    /// over.
    ///
    /// After a failure reply, `data` has a moment more: our end may have
    /// failed first (a full local disk) and reset the connections, which
    /// is all the server's 426 can tell, and the data side's own error
    /// says more. If `data` ends within it, its outcome is returned and
    /// the reply kept for `expect_complete` and the next call, which
    /// fail with it.
    async fn beside_control<T>(
        &mut self,
        c: &Cmd,
        data: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        if let Some(r) = self
            .early_final
            .as_ref()
            .filter(|r| !matches!(r.code, 226 | 250))
        {
            return Err(unexpected(c, r));
        }
        let mut data = std::pin::pin!(data);
        loop {
            tokio::select! {
                biased;
                v = &mut data => return Ok(v),
                r = self.ctl.read_reply_within(Duration::from_secs(86_400)), if self.early_final.is_none() => {
                    let r = r?;
                    if r.is_preliminary() {
                        // GridFTP's performance and restart markers.
                        tracing::debug!("during {}: {} {}", c.display(), r.code, reply_text(&r));
                    } else if matches!(r.code, 226 | 250) {
                        // Complete on the server's side: the data is
                        // still to be read to its end.
                        self.early_final = Some(r);
                    } else {
                        let grace = Duration::from_millis(250) + self.ctl.rtt().unwrap_or_default() * 2;
                        let err = unexpected(c, &r);
                        self.early_final = Some(r);
                        return match tokio::time::timeout(grace, &mut data).await {
                            Ok(v) => Ok(v),
                            Err(_) => Err(err),
                        };
                    }
                }
            }
        }
    }

    /// 125/150 (or another 1xx) before a transfer.
    async fn expect_preliminary(&mut self, c: &Cmd) -> Result<()> {
        self.early_final = None;
        let r = self.ctl.read_reply().await?;
        if r.is_preliminary() {
            Ok(())
        } else {
            Err(unexpected(c, &r))
        }
    }

    /// 226/250 after a transfer.
    /// Preliminary replies before it are skipped: GridFTP servers send
    /// performance markers (112) and restart markers (111) during MODE E
    /// transfers.
    async fn expect_complete(&mut self, c: &Cmd) -> Result<()> {
        self.expect_complete_reply(c).await.map(drop)
    }

    /// [`expect_complete`](Self::expect_complete), returning the reply.
    async fn expect_complete_reply(&mut self, c: &Cmd) -> Result<Reply> {
        if let Some(r) = self.early_final.take() {
            return match r.code {
                226 | 250 => Ok(r),
                _ => Err(unexpected(c, &r)),
            };
        }
        // One timeout for the whole wait: a marker extends it only when it
        // counts more bytes than the last (a server that sends markers
        // forever and no final reply hung the client past --timeout).
        let limit = self.ctl.reply_timeout();
        let mut deadline = tokio::time::Instant::now() + limit;
        let mut moved = 0u64;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let r = match self.ctl.read_reply_within(left).await {
                Err(ClientError::Timeout { .. }) => {
                    return Err(ClientError::Timeout {
                        what: format!("the server's final reply to {}", c.display()),
                        after: limit,
                    })
                }
                r => r?,
            };
            if r.is_preliminary() {
                tracing::debug!("during {}: {} {}", c.display(), r.code, reply_text(&r));
                if let Some(n) = marker_bytes(&r.lines).filter(|&n| n > moved) {
                    moved = n;
                    deadline = tokio::time::Instant::now() + limit;
                }
                continue;
            }
            return match r.code {
                226 | 250 => Ok(r),
                _ => Err(unexpected(c, &r)),
            };
        }
    }

    /// One stream-mode connection into `out`, written in place (a write
    /// into the page cache costs less than handing it to another thread).
    async fn recv_plain<W: std::io::Write>(
        &mut self,
        c: &Cmd,
        mut conns: Vec<Stream>,
        out: &mut W,
        out_path: &Path,
        count: Option<Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<u64> {
        let mut conn = conns
            .pop()
            .ok_or_else(|| ClientError::Stripe("no data connection".into()))?;
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0u64;
        loop {
            let limit = self.cfg.data_timeout;
            let want = self.rate_allowance(buf.len());
            let n = match self
                .beside_control(c, tokio::time::timeout(limit, conn.read(&mut buf[..want])))
                .await?
            {
                Ok(r) => r.map_err(ClientError::DataIo)?,
                Err(_) => return Err(stall(self.cfg.data_timeout, got)),
            };
            if n == 0 {
                return Ok(got);
            }
            out.write_all(&buf[..n])
                .map_err(|e| local_err(out_path, e))?;
            if let Some((d, k)) = self.inline_digest.as_mut() {
                d.update(&buf[..n]);
                *k += n as u64;
            }
            crate::progress::add(&count, n);
            if let Some(r) = &self.cfg.limit_rate {
                r.take(n).await;
            }
            got += n as u64;
        }
    }

    /// [`recv_plain`](Self::recv_plain) into a file: from a plain TCP
    /// connection the bytes go through a pipe into the file (`splice`, no
    /// copy in user space), unless they must be seen on the way (an inline
    /// checksum) or paced (`--limit-rate`).
    async fn recv_plain_file(
        &mut self,
        c: &Cmd,
        mut conns: Vec<Stream>,
        file: &mut std::fs::File,
        out_path: &Path,
        count: Option<Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<u64> {
        use xftp_stripe::DataSocket;
        let direct = self.inline_digest.is_none()
            && self.cfg.limit_rate.is_none()
            && conns.len() == 1
            && conns.iter().all(|c| c.can_splice_in());
        let pipe = match direct.then(|| xftp_stripe::Pipe::with_capacity(CHUNK)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                tracing::debug!("no pipe, reading through a buffer: {e}");
                return self.recv_plain(c, conns, file, out_path, count).await;
            }
            None => return self.recv_plain(c, conns, file, out_path, count).await,
        };
        let mut conn = conns
            .pop()
            .ok_or_else(|| ClientError::Stripe("no data connection".into()))?;
        let mut got = 0u64;
        loop {
            let fill = std::future::poll_fn(|cx| {
                std::pin::Pin::new(&mut conn).poll_splice_in(cx, &pipe, pipe.capacity())
            });
            let limit = self.cfg.data_timeout;
            let n = match self
                .beside_control(c, tokio::time::timeout(limit, fill))
                .await?
            {
                Ok(r) => r.map_err(ClientError::DataIo)?,
                Err(_) => return Err(stall(self.cfg.data_timeout, got)),
            };
            if n == 0 {
                return Ok(got);
            }
            pipe.drain_to(std::os::fd::AsFd::as_fd(&*file), None, n)
                .map_err(|e| local_err(out_path, e))?;
            crate::progress::add(&count, n);
            got += n as u64;
        }
    }

    async fn send_plain<R: tokio::io::AsyncRead + Unpin>(
        &mut self,
        mut conns: Vec<Stream>,
        src: &mut R,
        src_path: &Path,
        len: u64,
        count: Option<Arc<std::sync::atomic::AtomicU64>>,
        stamp: Option<&xftp_stripe::FileStamp>,
    ) -> Result<u64> {
        let mut conn = ResetUnlessDone(conns.pop());
        let Some(c) = conn.0.as_mut() else {
            return Err(ClientError::Stripe("no data connection".into()));
        };
        let mut buf = vec![0u8; CHUNK];
        let mut sent = 0u64;
        let t = self.cfg.data_timeout;
        let stop = self.cfg.interrupt.clone();
        loop {
            if stop.as_ref().is_some_and(|s| s.is_cancelled()) {
                return Err(ClientError::Interrupted);
            }
            let want = self.rate_allowance(buf.len());
            let n = src
                .read(&mut buf[..want])
                .await
                .map_err(|e| local_err(src_path, e))?;
            if n == 0 {
                break;
            }
            // The file grew since its size was taken: stop before the
            // server has more than that (an error resets the connection).
            if sent + n as u64 > len {
                return Err(ClientError::LocalFileChanged {
                    expected: len,
                    read: sent + n as u64,
                    cleared: false,
                });
            }
            match interruptible(&stop, tokio::time::timeout(t, c.write_all(&buf[..n]))).await? {
                Ok(r) => r.map_err(ClientError::DataIo)?,
                Err(_) => return Err(stall(t, sent)),
            }
            if let Some((d, k)) = self.inline_digest.as_mut() {
                d.update(&buf[..n]);
                *k += n as u64;
            }
            crate::progress::add(&count, n);
            if let Some(r) = &self.cfg.limit_rate {
                interruptible(&stop, r.take(n)).await?;
            }
            sent += n as u64;
        }
        // It shrank: a clean close would tell the server the file ends
        // here (a stream-mode upload has no other end marker).
        if sent < len {
            return Err(ClientError::LocalFileChanged {
                expected: len,
                read: sent,
                cleared: false,
            });
        }
        // Written meanwhile at the same size (or touched): checked before
        // the clean close that completes the upload, so that the
        // connection is reset instead and an xftp server keeps the old
        // file (checked after the 226, the new one had replaced it and
        // its deletion left nothing).
        if stamp.is_some_and(|s| s.changed()) {
            return Err(ClientError::LocalFileWritten { cleared: false });
        }
        // Half-close: end of file for the server, then wait for its close.
        match tokio::time::timeout(t, c.shutdown()).await {
            Ok(r) => r.map_err(ClientError::DataIo)?,
            Err(_) => return Err(stall(t, sent)),
        }
        // Read what the server still sends (TLS session tickets, its
        // close_notify) until its close: a socket closed with unread data
        // sends a reset, and a reset makes the server's kernel drop the
        // upload's last bytes before the server has read them.
        let drain = async {
            let mut sink = [0u8; 4096];
            while let Ok(1..) = c.read(&mut sink).await {}
        };
        let _ = tokio::time::timeout(t.min(Duration::from_secs(10)), drain).await;
        conn.0 = None;
        Ok(sent)
    }

    /// Multi-stream download into `dst`: MODE E blocks on every connection
    /// (and on the `late` ones as they open), written at their offsets;
    /// the engine checks the completion rule and, when SIZE answered, the
    /// total (`have`: the ranges a resumed download already holds).
    async fn recv_striped(
        &mut self,
        c: &Cmd,
        conns: Vec<Stream>,
        late: Late,
        dst: Arc<dyn xftp_stripe::WriteAt>,
        expected: Option<u64>,
        have: Option<xftp_stripe::ranges::RangeSet>,
    ) -> Result<Vec<u64>> {
        let dog = self.watchdog();
        let conns: Vec<_> = conns.into_iter().map(|c| dog.guard(c)).collect();
        let rx = framed_receiver(dst, expected, have, conns, self.endgame_ok);
        let ctl = rx.control();
        let fin = late.beside(rx.finish(), move |s| {
            ctl.add_connection(dog.guard(s)).is_ok()
        });
        // The control connection is read while the data moves (a server
        // that gave up says so at once).
        let report = self
            .beside_control(c, fin)
            .await?
            .map_err(|e| stripe_err(e, self.cfg.data_timeout))?;
        self.received_twice += report.duplicate_bytes;
        self.expect_complete(c).await?;
        Ok(report.streams.iter().map(|s| s.bytes).collect())
    }

    /// Multi-stream upload; the engine half-closes every connection at the
    /// end (with `endgame`, once every byte is delivered). The bytes sent
    /// on each connection (the endgame's copies included), the payload
    /// (each byte once), and the copies.
    #[allow(clippy::too_many_arguments)]
    async fn send_striped(
        &mut self,
        c_stor: &Cmd,
        conns: Vec<Stream>,
        late: Late,
        file: std::fs::File,
        len: u64,
        have: Option<&xftp_stripe::ranges::RangeSet>,
        endgame: bool,
    ) -> std::result::Result<(Vec<u64>, u64, u64), (ClientError, Vec<u64>)> {
        let dog = self.watchdog();
        let meters = MeterSet::new();
        let conns: Vec<_> = conns
            .into_iter()
            .map(|c| adaptive::sending(&meters, &dog, c))
            .collect();
        let n = (conns.len() + late.len()) as u32;
        let cfg = xftp_stripe::SendConfig {
            record_size: upload_record_size(len, have, n),
            schedule: if self.cfg.static_split {
                xftp_stripe::Schedule::Static
            } else {
                xftp_stripe::Schedule::Dynamic
            },
            endgame,
            source_check: Some(source_check(&file, len)),
            ..xftp_stripe::SendConfig::default()
        };
        let sender = match have {
            Some(h) => xftp_stripe::Sender::file_except(Arc::new(file), len, h, conns, &cfg),
            None => xftp_stripe::Sender::file(Arc::new(file), len, conns, &cfg),
        };
        let ctl = sender.control();
        let stats = sender.control();
        let run = late.beside(sender.finish(), move |s| {
            ctl.add_connection(adaptive::sending(&meters, &dog, s))
                .is_ok()
        });
        // What each connection sent, for a failure that may be a success
        // after all (`after_failure`).
        let sent = || stats.stats().iter().map(|s| s.bytes).collect();
        // The control connection is watched meanwhile: a server that ends
        // the upload (426: a newer upload of the file took over) may
        // never take the data connections, and the sender would wait on
        // them for the whole --timeout, then blame the path.
        let stop = self.cfg.interrupt.clone();
        let run = async move { interruptible(&stop, run).await };
        let r = self.beside_control(c_stor, run).await;
        // The server's refusal, read during the transfer, is the cause
        // (the data connections it closed on that account are not), and
        // is not to be read again.
        // (After a success it stays, for `upload_answered` to read.)
        if !matches!(r, Ok(Ok(Ok(_)))) {
            if let Some(f) = self.early_final.take_if(|r| r.code >= 400) {
                return Err((unexpected(c_stor, &f), sent()));
            }
        }
        let report = match r {
            Ok(Ok(r)) => r.map_err(|e| (stripe_err(e, self.cfg.data_timeout), sent()))?,
            Ok(Err(e)) | Err(e) => return Err((e, sent())),
        };
        Ok((
            report.streams.iter().map(|s| s.bytes).collect(),
            report.bytes,
            report.duplicate_bytes,
        ))
    }
}

/// A path as LIST's argument: servers (vsftpd, xftp) read a leading `-`
/// as `ls` options, and would list the current directory instead, so
/// such a relative path goes as `./-name`.
pub fn list_arg(path: &str) -> std::borrow::Cow<'_, str> {
    if path.starts_with('-') {
        format!("./{path}").into()
    } else {
        path.into()
    }
}

/// `f`, or [`ClientError::Interrupted`] as soon as `stop` is cancelled
/// (`f` is dropped: its data connections are reset).
async fn interruptible<F: std::future::Future>(
    stop: &Option<tokio_util::sync::CancellationToken>,
    f: F,
) -> Result<F::Output> {
    match stop {
        Some(s) => tokio::select! {
            r = f => Ok(r),
            () = s.cancelled() => Err(ClientError::Interrupted),
        },
        None => Ok(f.await),
    }
}

/// How long a transfer on several connections waits for the others once
/// the first is open. Connections opened together open
/// within milliseconds of each other; one whose SYN or SYN-ACK was lost
/// waits a second (Linux's first retransmission timeout) and joins the
/// running transfer then. The server waits as long on its side.
const EARLY_START: Duration = Duration::from_millis(250);

/// The connections of `set` a transfer starts on: the first one ready,
/// and those ready within [`EARLY_START`] after it (with `early`; else
/// all of them). The rest stay in `set`, for [`Late`]. The first failure
/// fails them all.
async fn early_ones(
    set: &mut tokio::task::JoinSet<Result<Stream>>,
    early: bool,
) -> Result<Vec<Stream>> {
    let mut conns = Vec::with_capacity(set.len());
    let mut wait = xftp_stripe::EarlyStart::new(early.then_some(EARLY_START));
    while let Some(Some(r)) = wait.next(set.join_next()).await {
        conns.push(r.map_err(|e| ClientError::DataIo(std::io::Error::other(e)))??);
        wait.got_one();
    }
    Ok(conns)
}

/// Data connections still opening when a transfer starts
/// ([`Client::start_transfer_early`]).
#[derive(Default)]
struct Late(Option<tokio::task::JoinSet<Result<Stream>>>);

impl Late {
    /// The connections of `set` still opening when the transfer starts.
    fn from_set(set: tokio::task::JoinSet<Result<Stream>>) -> Late {
        if !set.is_empty() {
            tracing::debug!(
                late = set.len(),
                "starting before every data connection is open"
            );
        }
        Late((!set.is_empty()).then_some(set))
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    /// Every one, for a transfer that cannot take connections later; the
    /// first failure fails them all.
    async fn all(self) -> Result<Vec<Stream>> {
        let mut conns = Vec::new();
        if let Some(mut set) = self.0 {
            while let Some(r) = set.join_next().await {
                conns.push(r.map_err(|e| ClientError::DataIo(std::io::Error::other(e)))??);
            }
        }
        Ok(conns)
    }

    /// Run `transfer`, handing each late connection to `add` meanwhile
    /// (see [`feed`](Self::feed)); those not open when it ends are dropped.
    async fn beside<T>(
        self,
        transfer: impl std::future::Future<Output = T>,
        add: impl FnMut(Stream) -> bool,
    ) -> T {
        let more = self.feed(add);
        tokio::select! {
            r = transfer => r,
            never = more => match never {},
        }
    }

    /// Hand each connection to `add` as it opens, until `add` says the
    /// transfer takes no more (the rest are then dropped). One that fails
    /// to open is left out: the transfer runs on the others. Never
    /// returns; it runs beside the transfer.
    async fn feed(self, mut add: impl FnMut(Stream) -> bool) -> std::convert::Infallible {
        if let Some(mut set) = self.0 {
            while let Some(r) = set.join_next().await {
                match r.map_err(|e| ClientError::DataIo(std::io::Error::other(e))) {
                    Ok(Ok(s)) => {
                        if !add(s) {
                            break;
                        }
                    }
                    Ok(Err(e)) | Err(e) => {
                        tracing::info!("a data connection opened late failed: {e}")
                    }
                }
            }
        }
        // No more will come, and the receiver must know it: a transfer
        // whose connections all ended without its every byte waits while
        // a handle that could add one is alive.
        drop(add);
        std::future::pending().await
    }
}

/// The receiver of a framed download into `dst` (`have`: the ranges a
/// resumed download already holds). With the size known it takes copies
/// of records and completes once every byte is stored: an xftp server
/// asked for its endgame (`OPTS MULT ENDGAME`, sent whenever the client
/// may stripe) sends copies of a stuck connection's records and resets
/// that connection, on resumed downloads too, and a receiver that did
/// not take them would fail a transfer that delivered every byte.
/// `MFMT` setting `path`'s time to `ms` milliseconds after the epoch
/// (UTC); with `fraction`, to the millisecond (an xftp server), else to
/// the second (a stock server may refuse a fraction: pyftpdlib does).
fn mfmt_cmd(path: &str, ms: i64, fraction: bool) -> Cmd {
    let t = if fraction {
        xftp_proto::facts::format_time_of_ms(ms)
    } else {
        xftp_proto::facts::format_time(ms.div_euclid(1000))
    };
    Cmd::with("MFMT", format!("{t} {path}"))
}

/// `SITE CHMOD` of `path`'s permission bits.
fn chmod_cmd(path: &str, mode: u32) -> Cmd {
    Cmd::with("SITE", format!("CHMOD {:o} {path}", mode & 0o777))
}

fn framed_receiver<S>(
    dst: Arc<dyn xftp_stripe::WriteAt>,
    expected: Option<u64>,
    have: Option<xftp_stripe::ranges::RangeSet>,
    conns: Vec<S>,
    endgame: bool,
) -> xftp_stripe::Receiver<S>
where
    S: tokio::io::AsyncRead + xftp_stripe::DataSocket + Unpin + Send + 'static,
{
    // The endgame's looser rule (done once every byte is in, copies
    // welcome, no EOF needed) only where the server agreed to it (`OPTS
    // MULT ENDGAME`): from any other (GridFTP, a server that refused it) a
    // second copy of a range is compared however late it comes, and every
    // EOD and the EOF are counted.
    match (expected, have) {
        (Some(size), have) if endgame => {
            xftp_stripe::Receiver::file_endgame(dst, size, have.unwrap_or_default(), conns)
        }
        (_, Some(h)) => xftp_stripe::Receiver::file_resume(dst, expected, h, conns),
        (_, None) => xftp_stripe::Receiver::file(dst, expected, conns),
    }
}

/// Records for an upload of `len` bytes (less `have`, resumed) over `n`
/// connections: as the server cuts them for a download, small enough that
/// every connection gets about two.
fn upload_record_size(len: u64, have: Option<&xftp_stripe::ranges::RangeSet>, n: u32) -> u32 {
    let left = len - have.map_or(0, |h| h.covered().min(len));
    xftp_stripe::record_size_for(left, n as usize, xftp_stripe::DEFAULT_RECORD_SIZE)
}

/// Smallest upload that runs the endgame, as `xftp serve` has it for
/// downloads: on a smaller file the copies' extra round trip at the end
/// would cost more than a timeout it saves.
const UPLOAD_ENDGAME_MIN: u64 = 1 << 20;

/// `XFTP_ENDGAME=off` in the environment: do not ask for the endgame
/// (for measuring what it does: `bench/run endgame`).
fn endgame_wanted() -> bool {
    std::env::var_os("XFTP_ENDGAME").map_or(true, |v| v != "off")
}

/// The ranges of `have` one REST line can carry
/// ([`xftp_proto::command::ranges_for_rest`]), as a set.
fn rest_set(have: &xftp_stripe::ranges::RangeSet) -> xftp_stripe::ranges::RangeSet {
    let mut told = xftp_stripe::ranges::RangeSet::new();
    for (a, b) in xftp_proto::command::ranges_for_rest(have.iter()) {
        told.union(a, b);
    }
    told
}

/// The longest file name the common file systems hold, in UTF-16 units
/// (bytes, for ASCII names).
const NAME_MAX_UNITS: usize = 255;

/// `dir/.NAME.xftp-part` for `dir/NAME`: where a verified upload lands
/// until its checksum matched.
fn temp_remote_name(remote: &str) -> String {
    let (dir, name) = match remote.rfind('/') {
        Some(i) => remote.split_at(i + 1),
        None => ("", remote),
    };
    format!("{dir}.{}.xftp-part", xftp_proto::name::part_stem(name))
}

/// Aborts a task when dropped (a download future dropped by Ctrl-C).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Until disarmed, writes the partial's last record when dropped: on an
/// error or an interrupt, the next `-c` loses at most what was in flight.
/// A partial that holds no byte is removed instead: there is nothing to
/// resume (a RETR refused with 550 left an empty one, and the advice to
/// run again with -c).
struct KeepPartial<'a>(Option<&'a resume::Partial>);

impl Drop for KeepPartial<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            if p.rec.ranges().covered() == 0 {
                p.discard();
                return;
            }
            match p.checkpoint() {
                Ok(()) => tracing::info!(
                    "partial download kept in {} ({} of {} bytes); run again with -c to fetch the rest",
                    p.path.display(),
                    p.rec.ranges().covered(),
                    p.meta.size
                ),
                Err(e) => tracing::warn!("cannot record the partial download: {e}"),
            }
        }
    }
}

/// `local` is a regular file (not followed through a link) of `size`
/// bytes modified at `mtime_ms` (to the server's precision,
/// [`xftp_proto::facts::same_time`]), with no partial download beside it:
/// a copy a finished `-c` run left.
fn complete_copy(local: &Path, size: u64, mtime_ms: i64) -> bool {
    if resume::partial_path(local).exists() {
        return false;
    }
    std::fs::symlink_metadata(local).is_ok_and(|m| {
        m.is_file()
            && m.len() == size
            && m.modified().is_ok_and(|t| {
                xftp_proto::facts::same_time(xftp_proto::facts::epoch_ms(t), mtime_ms)
            })
    })
}

fn describe_meta(m: &resume::SourceMeta) -> String {
    match &m.mdtm {
        Some(t) => format!("{} bytes, modified {t}", m.size),
        None => format!("{} bytes", m.size),
    }
}

/// A new file's mode: the one of the file it replaces (a private file
/// stays private), else 0644 (under the usual umask), not the 0600 of a
/// temporary.
fn set_new_file_mode(tmp: &Path, target: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::symlink_metadata(target)
            .ok()
            .filter(|m| m.is_file())
            .map_or(0o666 & !umask(), |m| m.permissions().mode() & 0o777);
        let _ = std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode));
    }
}

/// The process's umask, which chmod does not apply as open(2) does: a new
/// file gets 0666 less it, as `touch` or `cp` would make it. Read from
/// /proc (umask(2) cannot be read without being set, a race with other
/// threads' file creation); 022 where /proc does not say.
#[cfg(unix)]
fn umask() -> u32 {
    static MASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            })
            .unwrap_or(0o022)
            & 0o777
    })
}

/// What a finished download moved, before its checks.
struct Done {
    per_stream: Vec<u64>,
    expected: Option<u64>,
    start: Instant,
    timeline: Timeline,
}

/// The checksum in a 213 reply to CKSM (`213 HEX`) or HASH (`213 ALG
/// RANGE HEX NAME`), lower case; `None` without one of the algorithm's
/// length. The last line that holds one counts: ProFTPD's HASH sends
/// `213-Computing SHA-256 digest` lines while it reads a large file.
fn checksum_value(lines: &[String], alg: Algorithm, via: Via) -> Option<String> {
    lines.iter().rev().find_map(|line| {
        let mut words = line.split_ascii_whitespace();
        let v = match via {
            Via::Cksm => words.next(),
            Via::Hash => words.nth(2),
        }?;
        (v.len() == alg.hex_len() && v.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| v.to_ascii_lowercase())
    })
}

/// The algorithm and command for `--verify`: the one asked for, or the
/// strongest the server lists; CKSM before HASH.
fn choose_checksum(f: &Features, want: Verify) -> Result<(Algorithm, Via)> {
    let offered = |a: Algorithm| {
        if f.cksm.contains(&a) {
            Some((a, Via::Cksm))
        } else if f.hash.contains(&a) {
            Some((a, Via::Hash))
        } else {
            None
        }
    };
    let listed = || {
        let mut names: Vec<&str> = f.cksm.iter().map(|a| a.cksm_name()).collect();
        names.extend(f.hash.iter().map(|a| a.cksm_name()));
        names.sort_unstable();
        names.dedup();
        names.join(", ")
    };
    if f.cksm.is_empty() && f.hash.is_empty() {
        return Err(ClientError::Usage(
            "--verify: the server lists no checksum command (CKSM or HASH) in FEAT, so the copy cannot be checked; drop --verify, or compare checksums by other means".into(),
        ));
    }
    match want {
        Verify::With(a) => offered(a).ok_or_else(|| {
            ClientError::Usage(format!(
                "--verify={}: the server does not offer it (it offers {}); pick one of those",
                a.cksm_name().to_ascii_lowercase(),
                listed()
            ))
        }),
        _ => Algorithm::ALL.into_iter().find_map(offered).ok_or_else(|| {
            ClientError::Usage(format!(
                "--verify: no algorithm in common with the server (it offers {})",
                listed()
            ))
        }),
    }
}

/// The reply to a CWD back to the login directory after a check: a
/// login directory that cannot be entered (globus-gridftp-server's
/// anonymous user has `/nonexistent`) is no failure, as no relative path
/// resolved from it before either; anything else is.
fn home_left(back: &Cmd, r: &Reply) -> Result<()> {
    match r.code {
        250 => Ok(()),
        550 => {
            tracing::debug!("{}: {} {}", back.display(), r.code, reply_text(r));
            Ok(())
        }
        _ => Err(unexpected(back, r)),
    }
}

/// The engine's check, as an upload's last record goes out, that the
/// local file is as it was (`SendConfig::source_check`).
fn source_check(file: &std::fs::File, len: u64) -> xftp_stripe::SourceCheck {
    let stamp = xftp_stripe::FileStamp::new(file, len);
    xftp_stripe::SourceCheck(Arc::new(move || stamp.changed()))
}

/// Whether a reply to MFMT or SITE CHMOD says it was done: any 2xx (RFC
/// 3659's MFMT answers 213, most servers' CHMOD 200, globus-gridftp-server
/// 250 to both; taken for refusals, one file's time and mode were set and
/// no other's).
fn facts_set(code: u16) -> bool {
    code / 100 == 2
}

/// The bytes a GridFTP marker counts: the sum of a performance marker's
/// (112) `Stripe Bytes Transferred`, or what a restart marker's (111)
/// ranges cover; `None` for any other preliminary reply.
fn marker_bytes(lines: &[String]) -> Option<u64> {
    let mut sum = None;
    for line in lines {
        let line = line.trim();
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("Stripe Bytes Transferred") {
                let n = v.trim().parse::<u64>().ok()?;
                sum = Some(sum.unwrap_or(0u64).saturating_add(n));
            }
        } else if let Some(ranges) = line
            .get(..12)
            .filter(|p| p.eq_ignore_ascii_case("Range Marker"))
            .map(|_| &line[12..])
        {
            for r in ranges.trim().split(',') {
                let (a, b) = r.trim().split_once('-')?;
                let (a, b) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
                sum = Some(sum.unwrap_or(0u64).saturating_add(b.saturating_sub(a)));
            }
        }
    }
    sum
}

/// A stalled connection surfaces as a timeout; the rest keeps the engine's words.
fn stripe_err(e: xftp_stripe::StripeError, limit: Duration) -> ClientError {
    match e {
        xftp_stripe::StripeError::Io {
            kind: std::io::ErrorKind::TimedOut,
            ..
        } => ClientError::Timeout {
            what: "the data connections to move (stalled)".into(),
            after: limit,
        },
        // The size the server gave is not what came: the file changed on
        // the server, or the transfer was cut (the same words as a stream
        // download's).
        xftp_stripe::StripeError::SizeMismatch { expected, got } => {
            ClientError::ShortTransfer { expected, got }
        }
        // Found before the last record went: the server completed nothing.
        xftp_stripe::StripeError::SourceChanged => ClientError::LocalFileWritten { cleared: true },
        // The local file shrank while a framed upload read it.
        xftp_stripe::StripeError::SourceShort { at, len } => ClientError::LocalFileChanged {
            expected: len,
            read: at,
            cleared: true,
        },
        other if other.may_pass() => ClientError::Stripe(other.to_string()),
        other => ClientError::StripeFault(other.to_string()),
    }
}

fn stall(after: Duration, so_far: u64) -> ClientError {
    ClientError::Timeout {
        what: format!("the data connection to move (stalled after {so_far} bytes)"),
        after,
    }
}

fn bad_reply(c: &Cmd, r: &Reply, e: xftp_proto::ProtoError) -> ClientError {
    ClientError::BadReply {
        command: c.display(),
        code: r.code,
        text: reply_text(r),
        reason: e.to_string(),
    }
}

pub(crate) fn local_err(path: &Path, source: std::io::Error) -> ClientError {
    ClientError::Local {
        path: path.to_owned(),
        source,
    }
}

async fn resolve(host: &str, port: u16, limit: Duration) -> Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let fail = |reason: String| ClientError::Resolve {
        host: host.to_owned(),
        reason,
    };
    match tokio::time::timeout(limit, tokio::net::lookup_host((host, port))).await {
        Ok(Ok(it)) => {
            let v: Vec<SocketAddr> = it.collect();
            if v.is_empty() {
                Err(fail("no addresses".into()))
            } else {
                Ok(v)
            }
        }
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(_) => Err(fail(format!(
            "no answer within {:.0} s",
            limit.as_secs_f64()
        ))),
    }
}

/// Open a data connection with the configured buffers set before connect
/// (and its TLS handshake under PROT P).
async fn connect_data(
    addr: SocketAddr,
    bufsize: Option<u64>,
    limit: Duration,
    tls: Option<&ClientTls>,
) -> Result<Stream> {
    let s = connect_tcp(addr, bufsize, limit).await?;
    secure_data(s, tls, limit).await
}

/// A TCP connection (a data connection's before any TLS, with `bufsize`'s
/// buffers set first; the control connection's with none).
/// TCP keepalive on the control connection: a probe after 2 s of
/// silence, then every 2 s, until the reply timeout. A connection the
/// server no longer has is answered with a reset at the first probe, and
/// fails at once instead of at the reply timeout: one whose handshake's
/// last segment was lost to a reset (the server never accepted it, and we
/// would wait for a greeting that cannot come), or one a middlebox
/// dropped while a long transfer kept it idle. A connection that answers
/// nothing fails about when the reply timeout would have ended it.
fn keepalive(stream: &TcpStream, reply_timeout: Duration) {
    let (every, probes) = keepalive_plan(reply_timeout);
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_EVERY)
        .with_interval(every);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let ka = ka.with_retries(probes);
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "macos")))]
    let _ = probes;
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&ka) {
        tracing::debug!("control connection: no TCP keepalive: {e}");
    }
}

/// Idle time before the control connection's first keepalive probe, and
/// the shortest time between probes.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(2);

/// Probes that go unanswered before the kernel gives up, and the time
/// between them: together about `reply_timeout`. At most 60 probes (the
/// kernel takes 127): a longer timeout spaces them out, as a count
/// capped at 2 s each ended a stalled transfer after 122 s whatever
/// `--timeout` said.
fn keepalive_plan(reply_timeout: Duration) -> (Duration, u32) {
    let every = KEEPALIVE_EVERY.max(Duration::from_secs(reply_timeout.as_secs().div_ceil(60)));
    let probes = (reply_timeout.as_secs() / every.as_secs()).clamp(1, 60) as u32;
    (every, probes)
}

async fn connect_tcp(addr: SocketAddr, bufsize: Option<u64>, limit: Duration) -> Result<TcpStream> {
    sockbuf::connect(addr, bufsize, limit)
        .await
        .map_err(|e| match e {
            Some(source) => ClientError::Connect { addr, source },
            None => ClientError::Timeout {
                what: format!("a TCP connection to {addr}"),
                after: limit,
            },
        })
}

/// The TLS handshake of a data connection (the FTP client is the TLS
/// client whichever end connected, RFC 4217); it resumes the control
/// connection's session, which the server requires.
async fn secure_data(s: TcpStream, tls: Option<&ClientTls>, limit: Duration) -> Result<Stream> {
    // A framed upload ends each connection with a 17-byte EOD block
    // written after the data: Nagle would hold it until the data is
    // acknowledged, a round trip (more with delayed ACKs) per transfer.
    let _ = s.set_nodelay(true);
    match tls {
        None => Ok(Stream::Plain(s)),
        Some(t) => t
            .connect_data(s, limit)
            .await
            .map_err(|e| ClientError::tls_handshake(e, "data connection: ", true)),
    }
}

/// Accept one connection coming from `peer` (the control connection's
/// server); connections from anywhere else are dropped.
async fn accept_from(
    l: &TcpListener,
    peer: IpAddr,
    limit: Duration,
    tls: Option<&ClientTls>,
) -> Result<Stream> {
    let s = accept_tcp_from(l, peer, limit).await?;
    secure_data(s, tls, limit).await
}

/// The TCP part of [`accept_from`].
async fn accept_tcp_from(l: &TcpListener, peer: IpAddr, limit: Duration) -> Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, l.accept()).await {
            Ok(Ok((s, from))) if from.ip() == peer => return Ok(s),
            Ok(Ok((_, from))) => {
                tracing::warn!("dropping a data connection from {from}: not the server {peer}");
            }
            Ok(Err(e)) => return Err(ClientError::DataIo(e)),
            Err(_) => {
                return Err(ClientError::Timeout {
                    what: "the server to open the data connection".into(),
                    after: limit,
                })
            }
        }
    }
}

/// Where a download into `local` goes: `local` itself when it is a
/// regular file or not there yet, or the file a symbolic link leads to (as
/// curl and wget write through one; the rename that ends a download would
/// otherwise replace the link, and `/dev/stdout` with it). Anything else
/// is refused before a byte moves: a download is written beside its
/// target and renamed onto it, which would replace a device node (such as
/// `/dev/null`), a FIFO or a socket with a plain file.
pub(crate) fn local_target(local: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let link = match std::fs::symlink_metadata(local) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(local.to_owned()),
        Err(e) => return Err(local_err(local, e)),
        Ok(md) => md.file_type().is_symlink(),
    };
    let md = match std::fs::metadata(local) {
        Ok(md) => md,
        Err(e) if link && e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClientError::Usage(format!(
                "{} is a symbolic link to nothing — give the path of a file to write",
                local.display()
            )))
        }
        Err(e) => return Err(local_err(local, e)),
    };
    let path = if link && md.is_file() {
        // Only a link of our own (or root's, as /dev/stdout is): one that
        // someone else put in a shared directory must not send the
        // download into a file of theirs choosing.
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::symlink_metadata(local)
            .map_err(|e| local_err(local, e))?
            .uid();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if owner != me && owner != 0 {
            return Err(ClientError::Usage(format!(
                "{} is a symbolic link owned by another user (uid {owner}): \
                 not written through — remove it or give another path",
                local.display()
            )));
        }
        std::fs::canonicalize(local).map_err(|e| local_err(local, e))?
    } else {
        local.to_owned()
    };
    let ft = md.file_type();
    if ft.is_file() {
        return Ok(path);
    }
    let what = if ft.is_dir() {
        "a directory"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    // (/dev/null as a target is mostly a measurement.)
    let measure = if ft.is_dir() {
        ""
    } else {
        " (to measure a transfer without keeping it, download into a file on tmpfs and remove it)"
    };
    Err(ClientError::Usage(format!(
        "{} is {what}: xftp writes a download beside its target and renames it into place, \
         which would replace it — give the path of a regular file{measure}",
        local.display()
    )))
}

/// A temporary file in the target's directory, so the final rename stays
/// on one file system and is atomic; `sweep`: first remove those of
/// killed downloads of the same target (a single file's download: a
/// tree's would scan its directory once per file).
fn temp_next_to(target: &Path, sweep: bool) -> Result<tempfile::NamedTempFile> {
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "download".into());
    // ".NAME.XXXXXX.xftp-part" must fit in a file name (255 bytes), as
    // NAME alone does: shorten NAME, on a character boundary.
    let mut keep = name
        .len()
        .min(255 - ".".len() - ".XXXXXX".len() - ".xftp-part".len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    name.truncate(keep);
    let prefix = format!(".{name}.");
    if sweep {
        sweep_dead_temps(&dir, &prefix);
    }
    let tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".xftp-part")
        .tempfile_in(&dir)
        .map_err(|e| local_err(&dir, e))?;
    // Held while this run lives: a later run leaves it alone (see
    // `sweep_dead_temps`); a killed run's lock goes with its process.
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the lock goes with the file.
    unsafe { libc::flock(tmp.as_file().as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok(tmp)
}

/// How old an unlocked temporary must be to be taken for a dead run's:
/// a new one is locked a moment after it is made.
const DEAD_TEMP_AGE: Duration = Duration::from_secs(10);

/// Remove the temporaries (`PREFIX` + 6 characters + `.xftp-part`) of
/// downloads of the same target that were killed (SIGKILL, a power cut)
/// before they could clean up: no process holds their lock. Hidden, they
/// would take the disk for good (a killed 20 MB download's stayed through
/// every later run). A `-c` partial (`.NAME.xftp-part`) does not match.
fn sweep_dead_temps(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        let Some(mid) = n
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(".xftp-part"))
        else {
            continue;
        };
        if mid.len() != 6 || !mid.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        let path = e.path();
        let Some(f) = resume::unlocked(&path) else {
            continue;
        };
        let old = f
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= DEAD_TEMP_AGE));
        if old && std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "{}: removed the temporary of a download that was killed",
                path.display()
            );
        }
    }
}

#[cfg(test)]
#[test]
fn temporaries_of_killed_downloads_go_and_live_or_new_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("f.bin");
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    let put = |name: &str, age: Option<std::time::SystemTime>| {
        let p = dir.path().join(name);
        let f = std::fs::File::create(&p).unwrap();
        if let Some(t) = age {
            f.set_modified(t).unwrap();
        }
        p
    };
    let dead = put(".f.bin.Ab3xYz.xftp-part", Some(old));
    let young = put(".f.bin.Qq1234.xftp-part", None);
    let partial = put(".f.bin.xftp-part", Some(old));
    let other = put(".g.bin.Ab3xYz.xftp-part", Some(old));
    // A live run's: locked.
    let live = temp_next_to(&target, true).unwrap();
    live.as_file().set_modified(old).unwrap();
    let next = temp_next_to(&target, true).unwrap();
    assert!(!dead.exists());
    assert!(young.exists() && partial.exists() && other.exists());
    assert!(live.path().exists() && next.path().exists());
}

#[cfg(test)]
#[test]
fn a_download_never_replaces_a_device_fifo_or_link() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let link = dir.path().join("l");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let dangling = dir.path().join("d");
    std::os::unix::fs::symlink(dir.path().join("none"), &dangling).unwrap();
    let fifo = dir.path().join("p");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let new = dir.path().join("new");
    assert_eq!(local_target(&file).unwrap(), file);
    assert_eq!(local_target(&new).unwrap(), new);
    // Through the link: the file is replaced, the link stays.
    assert_eq!(
        local_target(&link).unwrap(),
        std::fs::canonicalize(&file).unwrap()
    );
    // A link someone else owns is not written through (root can make one).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = dir.path().join("theirs");
        std::os::unix::fs::symlink(&file, &theirs).unwrap();
        std::os::unix::fs::lchown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = local_target(&theirs).unwrap_err().to_string();
        assert!(e.contains("owned by another user"), "{e}");
    }
    for (p, what) in [
        (Path::new("/dev/null"), "a character device"),
        (fifo.as_path(), "a FIFO"),
        (dir.path(), "a directory"),
        (dangling.as_path(), "a symbolic link to nothing"),
    ] {
        let e = local_target(p).unwrap_err().to_string();
        assert!(e.contains(what), "{}: {e}", p.display());
    }
}

#[cfg(test)]
#[test]
fn markers_count_their_bytes() {
    let lines = |t: &str| t.lines().map(str::to_owned).collect::<Vec<_>>();
    let perf = "Perf Marker\n Timestamp: 1.5\n Stripe Index: 0\n Stripe Bytes Transferred: 4096\n Total Stripe Count: 1\nEnd.";
    assert_eq!(marker_bytes(&lines(perf)), Some(4096));
    assert_eq!(marker_bytes(&lines("Range Marker 0-29,30-89")), Some(88));
    assert_eq!(
        marker_bytes(&lines("Perf Marker\n Timestamp: 1\nEnd")),
        None
    );
    assert_eq!(marker_bytes(&lines("Opening data connection")), None);
    assert_eq!(marker_bytes(&lines("Range Marker 0-x")), None);
}

#[cfg(test)]
#[test]
fn a_temporary_fits_where_its_target_does() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "d".repeat(255),
        "\u{e9}".repeat(127),
        "\u{1f600}".repeat(63),
    ] {
        let target = dir.path().join(&name);
        let tmp = temp_next_to(&target, true).unwrap();
        std::fs::write(tmp.path(), b"x").unwrap();
        finish_temp(tmp, &target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
    }
}

#[cfg(all(test, unix))]
#[test]
fn a_replaced_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let new = dir.path().join("new");
    finish_temp(temp_next_to(&new, false).unwrap(), &new).unwrap();
    // As open(2) would make it under this process's umask.
    assert_eq!(mode(&new), 0o666 & !umask());
    let private = dir.path().join("private");
    std::fs::write(&private, b"old").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    finish_temp(temp_next_to(&private, false).unwrap(), &private).unwrap();
    assert_eq!(mode(&private), 0o600);
}

/// A stream-mode upload's data connection. In stream mode a clean close
/// is the end of the file, so one dropped before the whole file went out
/// (an error, or the command interrupted by Ctrl-C) is reset instead:
/// the server then rolls the upload back rather than store a short file
/// as complete.
struct ResetUnlessDone(Option<Stream>);

impl Drop for ResetUnlessDone {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = socket2::SockRef::from(s.tcp()).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Give the finished file ordinary permissions and rename it into place.
fn finish_temp(tmp: tempfile::NamedTempFile, target: &Path) -> Result<()> {
    tmp.as_file()
        .sync_all()
        .map_err(|e| local_err(tmp.path(), e))?;
    set_new_file_mode(tmp.path(), target);
    tmp.persist(target)
        .map(|_| ())
        .map_err(|e| local_err(target, e.error))
}

/// A `Vec` sink that refuses to grow past a limit.
struct Capped<'a> {
    out: &'a mut Vec<u8>,
    left: u64,
}

impl std::io::Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other(format!(
                "listing longer than {MAX_LISTING} bytes"
            )));
        }
        self.left -= buf.len() as u64;
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[test]
fn checksums_out_of_213_replies() {
    let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let hex = "0202c9cd27bb524fe216c08eaeda9d4b71f3ca75cd674c6af1b03d8b21612f9b";
    let upper = hex.to_ascii_uppercase();
    // GridFTP's CKSM, draft HASH, and ProFTPD's HASH with a progress line.
    assert_eq!(
        checksum_value(&l(&[&upper]), Algorithm::Sha256, Via::Cksm).as_deref(),
        Some(hex)
    );
    let last = format!("SHA-256 0-50000000 {hex} pub/big.bin");
    assert_eq!(
        checksum_value(&l(&[&last]), Algorithm::Sha256, Via::Hash).as_deref(),
        Some(hex)
    );
    let proftpd = l(&["Computing SHA-256 digest", &last]);
    assert_eq!(
        checksum_value(&proftpd, Algorithm::Sha256, Via::Hash).as_deref(),
        Some(hex)
    );
    // A value of another length, or none: no checksum.
    assert_eq!(
        checksum_value(&l(&[&last]), Algorithm::Sha512, Via::Hash),
        None
    );
    assert_eq!(
        checksum_value(
            &l(&["Computing SHA-256 digest"]),
            Algorithm::Sha256,
            Via::Hash
        ),
        None
    );
    assert_eq!(
        checksum_value(
            &l(&["SHA-256 0-5 nothex name"]),
            Algorithm::Sha256,
            Via::Hash
        ),
        None
    );
}

#[cfg(test)]
#[test]
fn keepalive_probes_last_about_the_reply_timeout() {
    for secs in [1u64, 30, 60, 120, 121, 300, 900, 3600] {
        let (every, probes) = keepalive_plan(Duration::from_secs(secs));
        let total = KEEPALIVE_EVERY.as_secs() + every.as_secs() * u64::from(probes);
        assert!((1..=60).contains(&probes), "{secs}: {probes}");
        // The connection is given up about when a reply would be.
        assert!(
            total + 2 >= secs && total <= secs + every.as_secs() + 2,
            "{secs} s: {probes} probes every {every:?}"
        );
    }
}
