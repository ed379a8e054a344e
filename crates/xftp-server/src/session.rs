//! One control connection: login, navigation, data-connection setup and
//! transfers. Replies are decided here, next to the command that causes
//! them.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xftp_proto::cksum::Algorithm;
use xftp_proto::command::TransferType;
use xftp_proto::path::VPath;
use xftp_proto::{hostport, BufSize, Command, LineReader, ProtoError, Reply};
use xftp_stripe::{Receiver, Schedule, SendConfig, Sender};
use xftp_tls::server::SessionTls;
use xftp_tls::Stream;
use xftp_tune::meter::MeterSet;

use crate::live::{self, Grow, Live};

use crate::auth::Access;
use crate::data::{self, DataError, DataPlan};
use crate::fs::{self, FsError};
use crate::secure::DataTls;
use crate::transfer::{self, Progress, TransferError, Upload, UploadKind};
use crate::{Config, TlsMode};

/// REST counts the bytes as sent (RFC 3659 5), and in TYPE A those are
/// converted (CRLF) while the file's are not: an offset could not be
/// placed without reading the file up to it. TYPE I resumes.
const REST_IN_ASCII: &str = "REST with TYPE A is not supported (the offset would count converted bytes); use TYPE I to resume.";

/// Replies kept for one write at most (see `Session::send`).
const MAX_UNSENT: usize = 64 * 1024;

/// Command lines that may wait while a transfer runs (see
/// `Session::run_transfer`); a client that sends more is ended with a 421
/// rather than holding the server's memory.
const MAX_QUEUED: usize = 256;

/// Failed logins before the server hangs up.
const MAX_LOGIN_FAILURES: u32 = 3;

/// Send one line and close (used when the server is full).
pub async fn refuse(mut stream: TcpStream, msg: &str) {
    let _ = stream.write_all(msg.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// [`refuse`] on the implicit-TLS port, where a client reads nothing
/// before the handshake: the reply goes after it (a bare close told
/// such a client only "TLS handshake: eof", never why).
pub async fn refuse_tls(stream: TcpStream, cfg: &Config, msg: &str) {
    const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
    let Some(tls) = cfg.tls.as_ref().and_then(|t| t.session(1).ok()) else {
        return;
    };
    if let Ok(mut s) = tls.accept_control(stream, HANDSHAKE_LIMIT).await {
        let _ = s.write_all(msg.as_bytes()).await;
        let _ = s.shutdown().await;
    }
}

/// Run a session to its end. With `tls_first` (the implicit-TLS port) the
/// TLS handshake comes before the greeting.
pub async fn run(
    stream: TcpStream,
    tls_first: bool,
    cfg: Arc<Config>,
    shared: Arc<crate::Shared>,
    shutdown: CancellationToken,
    now: CancellationToken,
) -> std::io::Result<()> {
    let peer = stream.peer_addr()?;
    let local = stream.local_addr()?;
    let (ctl, tls) = if tls_first {
        let Some(server_tls) = cfg.tls.clone() else {
            return Err(std::io::Error::other("implicit TLS without a certificate"));
        };
        let tls = server_tls
            .session(cfg.max_streams as usize)
            .map_err(std::io::Error::other)?;
        match tls.accept_control(stream, cfg.data_timeout).await {
            Ok(s) => (s, Some(tls)),
            Err(e) => {
                tracing::info!(%peer, "implicit TLS handshake failed: {}", xftp_tls::explain_handshake_error(&e));
                return Ok(());
            }
        }
    } else {
        (Stream::Plain(stream), None)
    };
    let mut s = Session {
        streams_claim: shared.streams.claim(peer.ip()),
        root: cfg.root.clone(),
        cfg,
        shared,
        ctl,
        tls,
        pbsz: false,
        prot_private: false,
        bind_token: None,
        peer,
        local,
        reader: LineReader::new(),
        queued: VecDeque::new(),
        early: VecDeque::new(),
        unsent: Vec::new(),
        login: Login::AwaitUser,
        failures: 0,
        cwd: VPath::root(),
        ttype: TransferType::Ascii,
        rest: 0,
        rest_ranges: None,
        resumable: None,
        rnfr: None,
        data: DataPlan::None,
        cached: Vec::new(),
        streams: 1,
        epsv_all: false,
        facts: fs::FactSet::ALL,
        bufsize: None,
        schedule: Schedule::Dynamic,
        mode_e: false,
        endgame: false,
        allo: None,
        mult_set: false,
        shutdown,
        now,
        stop_upload: None,
        upload_limit: None,
        hash_alg: Algorithm::Sha256,
    };
    s.reply(220, "xftp ready").await?;
    loop {
        match s.main_loop().await? {
            Flow::StartTls => {
                // The handshake takes over the connection; a session
                // whose handshake fails ends (the client hears nothing
                // more in clear).
                let Some(tls) = s.tls.clone() else {
                    return Ok(());
                };
                s.flush_replies().await?;
                let tcp = match s.ctl.into_plain() {
                    Ok(t) => t,
                    Err(_) => return Ok(()),
                };
                s.ctl = match tls.accept_control(tcp, s.cfg.data_timeout).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::info!(peer = %s.peer, "AUTH TLS handshake failed: {}", xftp_tls::explain_handshake_error(&e));
                        return Ok(());
                    }
                };
                // Commands sent in clear after AUTH are dropped, not run
                // as if they had come through TLS (STARTTLS command
                // injection, CVE-2011-0411).
                s.queued.clear();
                s.reader = LineReader::new();
                // RFC 2228 3: after AUTH the user logs in again; a login
                // made in clear does not carry over.
                s.login = Login::AwaitUser;
                s.root = s.cfg.root.clone();
                s.cwd = VPath::root();
            }
            _ => return Ok(()),
        }
    }
}

/// Login state: each state accepts only what can follow it.
#[derive(Debug)]
enum Login {
    AwaitUser,
    AwaitPass { user: String, anonymous: bool },
    LoggedIn { user: String, access: Access },
}

/// What happened to a transfer task.
enum Outcome<T> {
    Done(T),
    Failed(TransferError),
    Aborted,
}

enum Flow {
    Continue,
    Quit,
    /// AUTH TLS was accepted: the handshake comes next.
    StartTls,
}

struct Session {
    cfg: Arc<Config>,
    shared: Arc<crate::Shared>,
    /// Where this session may go: the served root, or the user's home.
    root: crate::Root,
    /// This session's share of its address's data connections.
    streams_claim: crate::limits::StreamClaim,
    /// The control connection (TLS after AUTH TLS or on the implicit port).
    ctl: Stream,
    /// This session's TLS (ticket key) once AUTH TLS was accepted.
    tls: Option<SessionTls>,
    /// PBSZ was sent (after AUTH TLS).
    pbsz: bool,
    /// PROT P: data connections are TLS.
    prot_private: bool,
    /// OPTS TLS BIND: each data connection proves it belongs to this
    /// session by sending this token first (instead of resuming).
    bind_token: Option<[u8; xftp_tls::TOKEN_LEN]>,
    peer: SocketAddr,
    local: SocketAddr,
    reader: LineReader,
    /// Lines already read but not yet handled (pipelined commands).
    queued: VecDeque<Result<Vec<u8>, ProtoError>>,
    /// Lines read while a data connection was awaited: the transfer that
    /// follows sees them first, as if read during it (STAT, MULT); what
    /// it leaves goes to `queued`.
    early: VecDeque<Result<Vec<u8>, ProtoError>>,
    /// Replies not yet written: those to a pipelined flight go out
    /// together ([`Session::send`]).
    unsent: Vec<u8>,
    login: Login,
    failures: u32,
    cwd: VPath,
    ttype: TransferType,
    rest: u64,
    /// REST a-b,...: the ranges a resuming receiver has (MODE E RETR),
    /// or that a resumable upload's partial holds (STOR).
    rest_ranges: Option<xftp_stripe::ranges::RangeSet>,
    /// SITE RESUMABLE: the next STOR is kept on failure.
    resumable: Option<crate::resumable::Meta>,
    rnfr: Option<PathBuf>,
    data: DataPlan,
    /// The data connections of the last MODE E download, open after its
    /// EOD (GridFTP data channel caching): the next one reuses them when
    /// no PASV, EPSV, PORT, EPRT or MPRT came in between.
    cached: Vec<Stream>,
    /// Data connections per transfer, granted by MULT.
    streams: u32,
    epsv_all: bool,
    /// The facts MLST and MLSD give (`OPTS MLST`).
    facts: fs::FactSet,
    /// SO_SNDBUF/SO_RCVBUF for data sockets; `None` = kernel autotuning.
    bufsize: Option<u64>,
    /// How multi-stream sends assign records to connections (OPTS MULT).
    schedule: Schedule,
    /// MODE E: framed transfers even on one connection.
    mode_e: bool,
    /// OPTS MULT ENDGAME: the client takes duplicate records, so large
    /// framed sends may use the endgame (stuck records sent again).
    endgame: bool,
    /// ALLO n from a client that asked for the endgame: the size of the
    /// next framed STOR, which then takes the endgame's copies of records
    /// and completes once every byte is in (`Receiver::file_endgame`).
    /// Taken by the next transfer command.
    allo: Option<u64>,
    /// The client negotiated with MULT (not GridFTP-style MODE E alone).
    mult_set: bool,
    shutdown: CancellationToken,
    /// The server's hard stop (the grace is over, or a second signal):
    /// a running transfer is ended with a 421.
    now: CancellationToken,
    /// The running stream-mode upload's stop signal (see `halt`).
    stop_upload: Option<CancellationToken>,
    /// The running upload's size limit (`--max-upload-size`).
    upload_limit: Option<u64>,
    /// The algorithm of HASH (OPTS HASH), SHA-256 until changed.
    hash_alg: Algorithm,
}

/// Stop a transfer task. A stream-mode upload (`stop` given) is asked to
/// stop and waits for its file writes to land before it rolls back (an
/// append's rollback must not be followed by a write still on its way);
/// anything else, or an upload that does not stop within 5 s, is aborted.
async fn halt<T>(task: &mut JoinHandle<Result<T, TransferError>>, stop: Option<CancellationToken>) {
    if let Some(stop) = stop {
        stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), &mut *task)
            .await
            .is_ok()
        {
            return;
        }
    }
    task.abort();
    let _ = task.await;
}

/// The 552 for an upload over `--max-upload-size`, the same whether it is
/// refused by its announced size or stopped when it passes the limit.
fn too_large(max: u64) -> String {
    format!("Upload refused: larger than this server's limit of {max} bytes; nothing was stored.")
}

/// What follows the first `n` words of `s` (a path that may hold spaces).
fn after_words(s: &str, n: usize) -> &str {
    let mut rest = s.trim_start();
    for _ in 0..n {
        rest = rest
            .split_once(char::is_whitespace)
            .map_or("", |x| x.1)
            .trim_start();
    }
    rest
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The FEAT HASH list, the current algorithm starred.
fn hash_feat(current: Algorithm) -> String {
    Algorithm::ALL
        .into_iter()
        .filter_map(|a| {
            a.hash_name()
                .map(|n| format!("{n}{}", if a == current { "*" } else { "" }))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Largest file whose SIZE in TYPE A is counted (see `Session::size`).
const ASCII_SIZE_MAX: u64 = 16 << 20;

/// Whether a queued command line is one the server answers at once,
/// without waiting on the client or the disk for long: replies before it
/// may wait for its own. (Login, settings, queries of a name, a passive
/// listener; PASS takes its password check's half second, but its client
/// waits for the 230 in any case.)
fn answered_at_once(line: &Result<Vec<u8>, ProtoError>) -> bool {
    let Ok(line) = line else {
        return true;
    };
    matches!(
        Command::verb_of(line).as_str(),
        "USER"
            | "PASS"
            | "ACCT"
            | "TYPE"
            | "MODE"
            | "STRU"
            | "OPTS"
            | "FEAT"
            | "MULT"
            | "SIZE"
            | "MDTM"
            | "PWD"
            | "XPWD"
            | "CWD"
            | "XCWD"
            | "CDUP"
            | "SYST"
            | "NOOP"
            | "REST"
            | "EPSV"
            | "PASV"
            | "PBSZ"
            | "PROT"
            | "ALLO"
            | "HELP"
    )
}

fn quote(path: &str) -> String {
    // RFC 959 appendix II: a quote inside a 257 path is doubled.
    path.replace('"', "\"\"")
}

fn fs_reply(e: &FsError) -> (u16, String) {
    (550, e.to_string())
}

/// The text of a reply for an OS error on `v`: the path, and the error in
/// words ([`fs::io_text`]).
fn io_said(v: &VPath, e: &std::io::Error) -> String {
    format!("{}: {}.", v.display(), fs::io_text(e))
}

impl Session {
    async fn reply(&mut self, code: u16, text: impl Into<String>) -> std::io::Result<()> {
        self.send(&Reply::new(code, text)).await
    }

    /// Send a reply, or keep it to go out with the next ones while the
    /// client's pipelined flight goes on with commands answered at once.
    /// Each reply in a segment of its own made xftp's login flight (nine
    /// replies) overflow an 8-packet router queue: the ninth waited out a
    /// retransmission timeout, 1.9 s on a 560 ms path. Anything that may
    /// wait on the client (a data connection, TLS) or take long is not
    /// in the list, so its predecessors' replies are never held by it.
    async fn send(&mut self, r: &Reply) -> std::io::Result<()> {
        tracing::debug!(peer = %self.peer, "-> {}", r);
        self.unsent.extend_from_slice(&r.encode());
        if self.unsent.len() < MAX_UNSENT && self.queued.front().is_some_and(answered_at_once) {
            return Ok(());
        }
        self.flush_replies().await
    }

    /// Write the replies kept by [`Session::send`].
    async fn flush_replies(&mut self) -> std::io::Result<()> {
        if self.unsent.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.unsent);
        // A client that reads no replies must not hold its session (and
        // its place under the session limits) forever: the idle timeout
        // bounds a blocked write as it bounds a silent client.
        let limit = self.cfg.idle_timeout;
        let write = async {
            self.ctl.write_all(&out).await?;
            // TLS keeps what the socket did not take; a reply must go now.
            self.ctl.flush().await
        };
        match tokio::time::timeout(limit, write).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read no reply for {} s", limit.as_secs()),
            )),
        }
    }

    fn peer_ip(&self) -> IpAddr {
        self.peer.ip()
    }

    /// The next command line, or `None` when the client has gone, the
    /// session idled out, or the server shuts down.
    async fn next_line(&mut self) -> std::io::Result<Option<Result<Vec<u8>, ProtoError>>> {
        let mut buf = [0u8; 4096];
        // The whole next line must arrive within the idle timeout: a
        // client that sends a byte now and then (slowloris) does not
        // hold its session open by it.
        let deadline = tokio::time::Instant::now() + self.cfg.idle_timeout;
        loop {
            // Left by a data connection that was not opened after all.
            self.queued.extend(self.early.drain(..));
            if let Some(l) = self.queued.pop_front() {
                return Ok(Some(l));
            }
            self.flush_replies().await?;
            let read = tokio::select! {
                _ = self.shutdown.cancelled() => {
                    let _ = self.reply(421, "Server shutting down.").await;
                    return Ok(None);
                }
                r = tokio::time::timeout_at(deadline, self.ctl.read(&mut buf)) => r,
            };
            match read {
                Err(_) => {
                    let secs = self.cfg.idle_timeout.as_secs();
                    let _ = self
                        .reply(
                            421,
                            format!("Idle timeout ({secs} s), closing control connection."),
                        )
                        .await;
                    return Ok(None);
                }
                Ok(Ok(0)) => return Ok(None),
                Ok(Ok(n)) => {
                    let mut out = Vec::new();
                    self.reader.feed(&buf[..n], &mut out);
                    self.read_past_urgent_mark(&mut buf, &mut out);
                    self.queued.extend(out);
                }
                Ok(Err(e)) => return Err(e),
            }
        }
    }

    /// Feed what is left in the control socket after a read. A read stops
    /// at the TCP urgent mark, and tokio takes a short read for a drained
    /// socket and waits for the next packet: an ABOR sent as urgent data
    /// (ftplib sends all of "ABOR\r\n" so, the LF being the urgent byte,
    /// kept in line by SO_OOBINLINE) would wait for its LF until the idle
    /// timeout. A non-blocking read on the descriptor itself sees it.
    fn read_past_urgent_mark(
        &mut self,
        buf: &mut [u8],
        out: &mut Vec<Result<Vec<u8>, ProtoError>>,
    ) {
        use std::io::Read;
        // Under TLS the urgent byte is inside a record (clients do not send
        // urgent data through TLS), and reading the socket would steal
        // TLS bytes.
        if self.ctl.is_tls() {
            return;
        }
        let sock = socket2::SockRef::from(self.ctl.tcp());
        // Ends at WouldBlock, or at 0 (EOF: the next async read sees it);
        // a few reads at most, so a client that never stops sending does
        // not keep this task from yielding.
        for _ in 0..4 {
            match (&*sock).read(buf) {
                Ok(n @ 1..) => self.reader.feed(&buf[..n], out),
                _ => break,
            }
        }
    }

    async fn main_loop(&mut self) -> std::io::Result<Flow> {
        while let Some(line) = self.next_line().await? {
            let line = match line {
                Ok(l) => l,
                Err(ProtoError::LineTooLong { limit }) => {
                    self.reply(500, format!("Command line too long (limit {limit} bytes)."))
                        .await?;
                    continue;
                }
                Err(e) => {
                    self.reply(500, e.to_string()).await?;
                    continue;
                }
            };
            if line.is_empty() {
                continue;
            }
            match self.dispatch(&line).await? {
                Flow::Continue => {}
                Flow::Quit => break,
                Flow::StartTls => return Ok(Flow::StartTls),
            }
        }
        let _ = self.flush_replies().await;
        let _ = self.ctl.shutdown().await;
        Ok(Flow::Quit)
    }

    fn access(&self) -> Option<Access> {
        match &self.login {
            Login::LoggedIn { access, .. } => Some(*access),
            _ => None,
        }
    }

    async fn dispatch(&mut self, line: &[u8]) -> std::io::Result<Flow> {
        let verb = Command::verb_of(line);
        tracing::debug!(peer = %self.peer, "<- {}", loggable(line));
        let cmd = match Command::parse(line) {
            Ok(c) => c,
            Err(ProtoError::BadVerb) => {
                self.reply(500, "Syntax error, command unrecognized.")
                    .await?;
                return Ok(Flow::Continue);
            }
            Err(e @ ProtoError::BadArgument { .. })
                if matches!(verb.as_str(), "TYPE" | "MODE" | "STRU") =>
            {
                // RFC 959: a well-formed but unsupported parameter is 504.
                self.reply(504, e.to_string()).await?;
                return Ok(Flow::Continue);
            }
            Err(e) => {
                self.reply(501, e.to_string()).await?;
                return Ok(Flow::Continue);
            }
        };
        // RNFR must be followed immediately by RNTO.
        let rnfr = self.rnfr.take();
        let pre_login_ok = matches!(
            cmd,
            Command::User(_)
                | Command::Pass(_)
                | Command::Quit
                | Command::Noop
                | Command::Feat
                | Command::Help(_)
                | Command::Syst
                | Command::Opts(_)
                | Command::Unknown(_)
                | Command::Auth(_)
                | Command::Pbsz(_)
                | Command::Prot(_)
                | Command::Ccc
        );
        let before_tls_ok = matches!(
            cmd,
            Command::Auth(_)
                | Command::Feat
                | Command::Help(_)
                | Command::Noop
                | Command::Syst
                | Command::Quit
        );
        if self.cfg.tls_mode == TlsMode::Required && !self.ctl.is_tls() && !before_tls_ok {
            self.reply(
                530,
                "This server requires TLS: send AUTH TLS first (ftpes://, curl --ssl-reqd).",
            )
            .await?;
            return Ok(Flow::Continue);
        }
        if !pre_login_ok && self.access().is_none() {
            self.reply(530, "Please log in with USER and PASS.").await?;
            return Ok(Flow::Continue);
        }
        match cmd {
            Command::User(name) => self.user(name).await?,
            Command::Pass(pw) => return self.pass(pw).await,
            Command::Quit => {
                self.reply(221, "Goodbye.").await?;
                return Ok(Flow::Quit);
            }
            Command::Noop => self.reply(200, "NOOP ok.").await?,
            Command::Syst => self.reply(215, "UNIX Type: L8").await?,
            Command::Feat => self.feat().await?,
            Command::Help(_) => self.help().await?,
            Command::Opts(o) => self.opts(&o).await?,
            Command::Stat(None) => self.stat().await?,
            Command::Stat(Some(p)) => self.stat_path(&p).await?,
            Command::Type(t) => {
                self.ttype = t;
                let name = match t {
                    TransferType::Ascii => "A",
                    TransferType::Image => "I",
                };
                self.reply(200, format!("Type set to {name}.")).await?
            }
            Command::Mode('S') => {
                self.mode_e = false;
                self.cached.clear();
                self.reply(200, "Mode set to S.").await?
            }
            Command::Mode('E') => {
                self.mode_e = true;
                self.reply(
                    200,
                    "Mode set to E (block framing on every data connection).",
                )
                .await?
            }
            Command::Mode(m) => {
                self.reply(
                    504,
                    format!("MODE {m} not supported (use MODE S; MULT for parallel transfers)."),
                )
                .await?
            }
            Command::Stru('F') => self.reply(200, "Structure set to F.").await?,
            Command::Stru(s) => self.reply(504, format!("STRU {s} not supported.")).await?,
            Command::Pwd => {
                let p = quote(&self.cwd.display());
                self.reply(257, format!("\"{p}\" is the current directory."))
                    .await?
            }
            Command::Cwd(p) => self.cwd(&p).await?,
            Command::Cdup => {
                self.cwd = self.cwd.parent();
                let p = self.cwd.display();
                self.reply(200, format!("Directory changed to {p}."))
                    .await?
            }
            Command::List(a) => self.listing(ListKind::List, a).await?,
            Command::Nlst(a) => self.listing(ListKind::Nlst, a).await?,
            Command::Mlsd(a) => self.listing(ListKind::Mlsd(self.facts), a).await?,
            Command::Mlst(a) => self.mlst(a).await?,
            Command::Size(p) => self.size(&p).await?,
            Command::Mdtm(p) => self.mdtm(&p).await?,
            Command::Cksm(a) => self.cksm(a).await?,
            Command::Mfmt(t, p) => self.mfmt(t, &p).await?,
            Command::Hash(p) => self.hash(&p).await?,
            Command::Allo(Some(n)) if self.endgame => {
                self.allo = Some(n);
                self.reply(
                    200,
                    format!("ALLO {n}: the STOR next is of {n} bytes; framed, it takes copies of records (endgame); in stream mode, a shorter one is not kept."),
                )
                .await?
            }
            Command::Allo(_) => {
                self.allo = None;
                self.reply(202, "ALLO not needed.").await?
            }
            Command::Retr(p) => self.retr(&p).await?,
            Command::Stor(p) => self.store(&p, false).await?,
            Command::Appe(p) => self.store(&p, true).await?,
            Command::Stou(p) => self.store_unique(p.as_deref()).await?,
            Command::RestRanges(r) => {
                let mut have = xftp_stripe::ranges::RangeSet::new();
                for (a, b) in &r {
                    have.union(*a, *b);
                }
                let msg = format!(
                    "Restart ranges accepted ({} bytes in {} ranges); RETR sends the rest.",
                    have.covered(),
                    r.len()
                );
                self.rest = 0;
                self.rest_ranges = Some(have);
                self.reply(350, msg).await?
            }
            Command::Rest(n) => {
                self.rest_ranges = None;
                self.rest = n;
                self.reply(350, format!("Restarting at {n}. Send RETR or STOR."))
                    .await?
            }
            Command::Dele(p) => self.dele(&p).await?,
            Command::Mkd(p) => self.mkd(&p).await?,
            Command::Rmd(p) => self.rmd(&p).await?,
            Command::Rnfr(p) => self.rnfr(&p).await?,
            Command::Rnto(p) => self.rnto(&p, rnfr).await?,
            Command::Abor => {
                self.data = DataPlan::None;
                self.reply(226, "No transfer to abort.").await?
            }
            Command::Port(a) => self.active(SocketAddr::V4(a), "PORT").await?,
            Command::Eprt(a) => self.active(a, "EPRT").await?,
            Command::Pasv => self.pasv().await?,
            Command::Epsv(arg) => self.epsv(arg).await?,
            Command::Mult(n) => {
                self.mult_set = true;
                let asked = n
                    .unwrap_or(self.cfg.default_streams)
                    .clamp(1, self.cfg.max_streams.max(1));
                let room = crate::limits::connection_room()
                    .map(|r| u32::try_from(r).unwrap_or(u32::MAX).max(1));
                let want = room.map_or(asked, |r| asked.min(r));
                let g = self.streams_claim.set(want, self.cfg.max_streams_per_ip);
                self.streams = g;
                let max = self.cfg.max_streams;
                if want < asked && g == want {
                    tracing::warn!(
                        asked,
                        granted = g,
                        "MULT held down by the open-file limit (ulimit -n)"
                    );
                    self.reply(
                        200,
                        format!("MULT {g} granted (server maximum {max}; its open-file limit has room for {g} more now)."),
                    )
                    .await?
                } else if g < want {
                    self.reply(
                        200,
                        format!("MULT {g} granted (server maximum {max}; your address holds the rest of its {} connections).", self.cfg.max_streams_per_ip),
                    )
                    .await?
                } else {
                    self.reply(200, format!("MULT {g} granted (server maximum {max})."))
                        .await?
                }
            }
            Command::Mprt(addrs) => self.mprt(addrs).await?,
            Command::Site(s) => self.site(&s).await?,
            Command::Auth(m) => return self.auth(&m).await,
            Command::Pbsz(_) => {
                if self.ctl.is_tls() {
                    self.pbsz = true;
                    self.reply(200, "PBSZ=0").await?
                } else {
                    self.reply(503, "PBSZ needs AUTH TLS first.").await?
                }
            }
            Command::Prot(level) => self.prot(level).await?,
            Command::Ccc => {
                self.reply(534, "CCC refused: the control connection stays encrypted.")
                    .await?
            }
            Command::Sbuf(b) => self.set_bufsize_clamped(b).await?,
            Command::Unknown(v) => match v.as_str() {
                "ACCT" | "SMNT" | "REIN" => {
                    self.reply(502, format!("{v} not implemented.")).await?
                }
                _ => self.reply(500, format!("Unknown command {v}.")).await?,
            },
            _ => self.reply(502, "Command not implemented.").await?,
        }
        Ok(Flow::Continue)
    }

    // ---- login ----

    async fn user(&mut self, name: String) -> std::io::Result<()> {
        self.cached.clear();
        let anonymous = matches!(name.to_ascii_lowercase().as_str(), "anonymous" | "ftp");
        if anonymous && !self.cfg.anonymous {
            self.login = Login::AwaitUser;
            return self
                .reply(530, "Anonymous access is disabled on this server.")
                .await;
        }
        let text = if anonymous {
            "Anonymous login okay, send your e-mail address as password.".to_string()
        } else {
            format!("Password required for {name}.")
        };
        self.login = Login::AwaitPass {
            user: name,
            anonymous,
        };
        self.reply(331, text).await
    }

    async fn pass(&mut self, pw: String) -> std::io::Result<Flow> {
        let (user, anonymous) = match std::mem::replace(&mut self.login, Login::AwaitUser) {
            Login::AwaitPass { user, anonymous } => (user, anonymous),
            other @ Login::LoggedIn { .. } => {
                self.login = other;
                self.reply(503, "Already logged in.").await?;
                return Ok(Flow::Continue);
            }
            Login::AwaitUser => {
                self.reply(503, "Login with USER first.").await?;
                return Ok(Flow::Continue);
            }
        };
        let ip = self.peer_ip();
        // A named user's password counts against the address's limit
        // while it is checked (see `LoginThrottle::attempt`); an anonymous
        // login is neither counted nor, when it succeeds, clears a count.
        let shared = self.shared.clone();
        let gate = if anonymous {
            shared
                .throttle
                .locked(ip, std::time::Instant::now())
                .map_or(Ok(None), Err)
        } else {
            shared.throttle.attempt(ip, &user).await.map(Some)
        };
        let pending = match gate {
            Ok(p) => p,
            Err(wait) => return self.locked_out(wait).await,
        };
        let grant = if anonymous {
            Some(crate::auth::Grant {
                access: if self.cfg.anonymous_write {
                    Access::ReadWrite
                } else {
                    Access::ReadOnly
                },
                home: None,
            })
        } else {
            let cfg = self.cfg.clone();
            let u = user.clone();
            // Each check holds 19 MiB (Argon2id) on a blocking thread:
            // only a few at once, or a burst of guesses takes gigabytes.
            let _permit = self.shared.hashing.acquire().await.ok();
            tokio::task::spawn_blocking(move || cfg.users.login(&u, &pw))
                .await
                .ok()
                .flatten()
        };
        // A user with a home is confined to it: it becomes the session's
        // root. A home that is missing (or leads out of the served root)
        // refuses the login rather than serving the whole root.
        // The password's verdict, for the address's count: right clears
        // this name's failures (a missing home below is no guess).
        if let Some(p) = pending {
            if grant.is_some() {
                p.succeeded();
            } else if let Some(wait) = p.failed(std::time::Instant::now()) {
                tracing::warn!(peer = %self.peer, "address locked out for {} s after repeated failed logins", wait.as_secs());
            }
        }
        let grant = match grant {
            Some(g) => match &g.home {
                None => Some((g.access, self.cfg.root.clone())),
                Some(h) => match crate::Root::new(&self.cfg.root.path().join(h)) {
                    Ok(r) if r.path().starts_with(self.cfg.root.path()) => Some((g.access, r)),
                    _ => {
                        tracing::warn!(peer = %self.peer, %user, home = %h, "login refused: home directory missing or outside the root");
                        self.reply(530, "Login refused: your home directory is not available.")
                            .await?;
                        return Ok(Flow::Continue);
                    }
                },
            },
            None => None,
        };
        match grant {
            Some((access, root)) => {
                self.root = root;
                self.cwd = VPath::root();
                let mode = match access {
                    Access::ReadOnly => "read-only",
                    Access::ReadWrite => "read-write",
                };
                tracing::info!(peer = %self.peer, %user, mode, "login");
                self.login = Login::LoggedIn { user, access };
                self.failures = 0;
                self.reply(230, format!("Login successful ({mode})."))
                    .await?;
                Ok(Flow::Continue)
            }
            None => {
                self.failures += 1;
                tracing::warn!(peer = %self.peer, %user, "login failed");
                // Slow down password guessing.
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Some(wait) = self.shared.throttle.locked(ip, std::time::Instant::now()) {
                    return self.locked_out(wait).await;
                }
                if self.failures >= MAX_LOGIN_FAILURES {
                    self.reply(421, "Too many failed logins, closing connection.")
                        .await?;
                    return Ok(Flow::Quit);
                }
                self.reply(530, "Login incorrect.").await?;
                Ok(Flow::Continue)
            }
        }
    }

    fn may_write(&self) -> bool {
        self.access() == Some(Access::ReadWrite)
    }

    async fn deny_write(&mut self) -> std::io::Result<()> {
        self.reply(550, "Permission denied: this login is read-only.")
            .await
    }

    // ---- information ----

    fn offers_tls(&self) -> bool {
        self.cfg.tls.is_some() && self.cfg.tls_mode != TlsMode::Off
    }

    /// AUTH: TLS (RFC 4217); the handshake follows the 234.
    async fn auth(&mut self, mech: &str) -> std::io::Result<Flow> {
        let Some(server_tls) = self.cfg.tls.clone().filter(|_| self.offers_tls()) else {
            self.reply(502, "TLS is not configured on this server.")
                .await?;
            return Ok(Flow::Continue);
        };
        if self.ctl.is_tls() {
            self.reply(503, "TLS is already on.").await?;
            return Ok(Flow::Continue);
        }
        // TLS-C and SSL are old names of TLS; TLS-P also protects data.
        if !matches!(mech, "TLS" | "TLS-C" | "SSL" | "TLS-P") {
            self.reply(504, format!("AUTH {mech} not supported; use AUTH TLS."))
                .await?;
            return Ok(Flow::Continue);
        }
        match server_tls.session(self.cfg.max_streams as usize) {
            Ok(t) => self.tls = Some(t),
            Err(e) => {
                self.reply(431, format!("TLS unavailable: {e}")).await?;
                return Ok(Flow::Continue);
            }
        }
        if mech == "TLS-P" {
            self.pbsz = true;
            self.prot_private = true;
        }
        self.reply(234, format!("AUTH {mech} successful.")).await?;
        Ok(Flow::StartTls)
    }

    /// PROT (RFC 4217 section 9): C or P.
    async fn prot(&mut self, level: char) -> std::io::Result<()> {
        if !self.pbsz {
            return self.reply(503, "PROT needs PBSZ 0 first.").await;
        }
        self.cached.clear();
        match level {
            'P' => {
                self.prot_private = true;
                self.reply(200, "Protection level set to P (data connections use TLS).")
                    .await
            }
            'C' if self.cfg.tls_mode == TlsMode::Required => {
                self.reply(
                    534,
                    "PROT C refused: this server requires protected data connections.",
                )
                .await
            }
            'C' => {
                self.prot_private = false;
                self.reply(
                    200,
                    "Protection level set to C (data connections in clear).",
                )
                .await
            }
            'S' | 'E' => {
                self.reply(
                    536,
                    format!("PROT {level} is not supported with TLS; use P or C."),
                )
                .await
            }
            _ => {
                self.reply(504, format!("Unknown protection level {level}."))
                    .await
            }
        }
    }

    /// TLS for data connections, when PROT P is in force. `sending`: the
    /// server sends on them, so the client reads them and they may carry
    /// new session tickets (on an upload the client never reads, and
    /// unread tickets make its kernel reset the connection at close).
    fn data_tls(&self, sending: bool) -> Option<DataTls> {
        use xftp_tls::server::Proof;
        // A client that negotiated OPTS TLS BIND sends its token first on
        // every data connection, also where no proof is required
        // (--tls-allow-fresh-data): read, or it would be taken for data.
        let proof = match (self.bind_token, self.cfg.tls_require_reuse) {
            (Some(t), _) => Proof::Token(t),
            (None, true) => Proof::Resume,
            (None, false) => Proof::None,
        };
        match (&self.tls, self.prot_private) {
            (Some(tls), true) => Some(DataTls {
                tls: tls.clone(),
                proof,
                timeout: self.cfg.data_timeout,
                tickets: sending,
            }),
            _ => None,
        }
    }

    async fn feat(&mut self) -> std::io::Result<()> {
        let tls: &[&str] = if self.offers_tls() {
            &["AUTH TLS", "PBSZ", "PROT"]
        } else {
            &[]
        };
        let mlst = self.facts.feat();
        let lines = [
            "Extensions supported:",
            "EPRT",
            "EPSV",
            "CKSM MD5:10;ADLER32:10;CRC32:10;CRC32C:10;SHA1:10;SHA256:11;SHA512:12;",
            "MDTM",
            "MFMT",
            &mlst,
            "MULT",
            "MODE E",
            "CACHE",
            "MPRT",
            "REST STREAM",
            "SIZE",
            "TVFS",
            "UTF8",
        ];
        let hash = format!("HASH {}", hash_feat(self.hash_alg));
        let lines = lines
            .iter()
            .chain(tls)
            .map(|s| s.to_string())
            .chain([hash, "End".to_string()])
            .collect();
        let r = Reply::multi(211, lines);
        self.send(&r).await
    }

    async fn help(&mut self) -> std::io::Result<()> {
        let lines = vec![
            "Commands recognized:".to_string(),
            "USER PASS QUIT NOOP SYST STAT HELP FEAT OPTS TYPE MODE STRU".to_string(),
            "PWD CWD CDUP LIST NLST MLSD MLST SIZE MDTM RETR STOR STOU APPE REST".to_string(),
            "DELE MKD RMD RNFR RNTO ABOR PORT PASV EPRT EPSV ALLO MULT MPRT".to_string(),
            "CKSM HASH MFMT AUTH PBSZ PROT (SITE HELP for SITE)".to_string(),
            "Help OK.".to_string(),
        ];
        self.send(&Reply::multi(214, lines)).await
    }

    async fn opts(&mut self, o: &str) -> std::io::Result<()> {
        let up = o.trim().to_ascii_uppercase();
        if up == "UTF8 ON" || up == "UTF8" || up == "UTF-8 ON" {
            self.reply(200, "UTF8 mode on (names are passed through as bytes).")
                .await
        } else if up == "UTF8 OFF" {
            self.reply(200, "UTF8 mode off (names are passed through as bytes).")
                .await
        } else if let Some(rest) = up.strip_prefix("RETR ") {
            // GridFTP: OPTS RETR Parallelism=<start>,<min>,<max>; — the
            // number of MODE E connections the server (the sender) opens.
            let mut granted = None;
            for opt in rest.split(';').map(str::trim).filter(|o| !o.is_empty()) {
                match opt.split_once('=') {
                    Some(("PARALLELISM", v)) => {
                        let start = v
                            .split(',')
                            .next()
                            .and_then(|n| n.trim().parse::<u32>().ok());
                        match start {
                            Some(n) if n >= 1 => {
                                granted = Some(n.min(self.cfg.max_streams.max(1)));
                            }
                            _ => {
                                return self
                                    .reply(501, format!("Bad Parallelism value {v:?}."))
                                    .await
                            }
                        }
                    }
                    _ => {
                        return self
                            .reply(501, format!("Option not understood: RETR {opt}"))
                            .await
                    }
                }
            }
            match granted {
                Some(want) => {
                    // The address's budget, as for MULT.
                    let g = self.streams_claim.set(want, self.cfg.max_streams_per_ip);
                    self.streams = g;
                    self.reply(200, format!("Parallelism set to {g}.")).await
                }
                None => self.reply(200, "OPTS RETR: nothing to change.").await,
            }
        } else if up == "HASH" {
            let name = self.hash_alg.hash_name().unwrap_or("SHA-256");
            self.reply(200, name).await
        } else if let Some(name) = up.strip_prefix("HASH ") {
            match Algorithm::parse(name) {
                Ok(a) if a.hash_name().is_some() => {
                    self.hash_alg = a;
                    self.reply(200, a.hash_name().unwrap_or_default()).await
                }
                _ => {
                    self.reply(
                        504,
                        format!(
                            "Unknown hash algorithm {:?}; known: {}.",
                            name.trim(),
                            hash_feat(self.hash_alg).replace('*', "")
                        ),
                    )
                    .await
                }
            }
        } else if up == "TLS BIND" {
            match xftp_tls::binding_token(&self.ctl) {
                Some(t) => {
                    self.bind_token = Some(t);
                    self.reply(
                        200,
                        "Data connections will send the session's binding token first.",
                    )
                    .await
                }
                None => self.reply(503, "OPTS TLS BIND needs AUTH TLS first.").await,
            }
        } else if let Some(rest) = up.strip_prefix("MULT") {
            match rest.trim() {
                "STATIC" => {
                    self.schedule = Schedule::Static;
                    self.reply(200, "MULT schedule static: n equal contiguous parts.")
                        .await
                }
                "FRAMED" => {
                    // Same as MODE E, but only servers that know MULT accept
                    // it: a client can send it speculatively with its login.
                    self.mode_e = true;
                    self.reply(
                        200,
                        "MULT framing on: MODE E blocks on every data connection.",
                    )
                    .await
                }
                "ENDGAME" => {
                    self.endgame = true;
                    self.reply(
                        200,
                        "MULT endgame on: stuck records of large files are sent again on idle connections.",
                    )
                    .await
                }
                "DYNAMIC" => {
                    self.schedule = Schedule::Dynamic;
                    self.reply(
                        200,
                        "MULT schedule dynamic: next record to the first free connection.",
                    )
                    .await
                }
                _ => {
                    self.reply(501, "OPTS MULT takes STATIC, DYNAMIC, FRAMED or ENDGAME.")
                        .await
                }
            }
        } else if up == "MLST" || up.starts_with("MLST ") {
            // RFC 3659 7.9: the facts named (none, without a list) from now
            // on; the reply lists those taken.
            self.facts = fs::FactSet::parse(o.trim().get(4..).unwrap_or(""));
            let names = self.facts.names();
            let text = if names.is_empty() {
                "MLST OPTS".to_string()
            } else {
                format!("MLST OPTS {names}")
            };
            self.reply(200, text).await
        } else {
            self.reply(501, format!("Option not understood: {o}")).await
        }
    }

    async fn stat(&mut self) -> std::io::Result<()> {
        let user = match &self.login {
            Login::LoggedIn { user, .. } => user.clone(),
            _ => "-".into(),
        };
        let lines = vec![
            "xftp server status:".to_string(),
            format!("Connected from {}", self.peer),
            format!("Logged in as {user}"),
            format!(
                "TYPE: {}, STRU: F, MODE: {}, MULT: {} (max {})",
                if self.ttype == TransferType::Image {
                    "I"
                } else {
                    "A"
                },
                if self.mode_e { "E" } else { "S" },
                self.streams,
                self.cfg.max_streams
            ),
            self.bufsize_text(),
            "End of status".to_string(),
        ];
        self.send(&Reply::multi(211, lines)).await
    }

    async fn stat_path(&mut self, arg: &[u8]) -> std::io::Result<()> {
        match self.build_listing(ListKind::List, Some(arg.to_vec())).await {
            Ok((bytes, unlisted)) => {
                let mut lines = vec![format!("Status of {}:", xftp_proto::name::decode(arg))];
                for l in bytes.split(|b| *b == b'\n') {
                    let l = xftp_proto::name::decode(l)
                        .trim_end_matches('\r')
                        .to_string();
                    if !l.is_empty() {
                        lines.push(l);
                    }
                }
                if let Some(u) = unlisted.describe() {
                    lines.push(u);
                }
                lines.push("End of status".into());
                self.send(&Reply::multi(213, lines)).await
            }
            Err((code, text)) => self.reply(code, text).await,
        }
    }

    async fn site(&mut self, s: &str) -> std::io::Result<()> {
        let mut words = s.split_ascii_whitespace();
        let word = words.next().unwrap_or("").to_ascii_uppercase();
        let arg = words.next();
        let extra = words.next();
        match (word.as_str(), arg) {
            ("HELP", _) => {
                self.reply(
                    214,
                    "SITE commands: HELP, BUFSIZE n|auto, WIN n|auto, RBUFSZ n|auto, SBUFSZ n|auto (also SBUF n), CHMOD mode path, RESUMABLE size mtime, RANGES path",
                )
                .await
            }
            ("BUFSIZE" | "WIN" | "RBUFSZ" | "SBUFSZ" | "RBUFSIZ" | "SBUFSIZ", Some(a)) => {
                // "64 k" would silently mean 64 bytes.
                if let Some(x) = extra {
                    return self
                        .reply(
                            501,
                            format!("SITE {word} takes one size (e.g. 65536, 64k, 4M or auto); {x:?} is one word too many."),
                        )
                        .await;
                }
                match xftp_proto::parse_bufsize("SITE", a) {
                    Ok(b) => self.set_bufsize(b).await,
                    Err(e) => self.reply(501, e.to_string()).await,
                }
            }
            // It announces an upload: refused as the upload would be.
            ("RESUMABLE", Some(_)) if !self.may_write() => self.deny_write().await,
            ("RESUMABLE", Some(size)) => {
                let meta = size.parse().ok().zip(extra.and_then(|t| t.parse().ok()));
                match meta {
                    Some((size, mtime)) => {
                        self.resumable = Some(crate::resumable::Meta { size, mtime });
                        self.reply(
                            200,
                            "The next STOR is resumable: written in place, kept with its ranges on failure.",
                        )
                        .await
                    }
                    None => {
                        self.reply(501, "SITE RESUMABLE SIZE MTIME (bytes, and the source's time as an integer: xftp sends nanoseconds since the epoch).")
                            .await
                    }
                }
            }
            ("RANGES", Some(_)) => {
                let path = after_words(s, 1).to_owned();
                self.site_ranges(&path).await
            }
            ("CHMOD", Some(m)) => {
                // The path is everything after the mode (it may hold spaces).
                let path = after_words(s, 2).to_owned();
                self.chmod(m, &path).await
            }
            // Known, but the argument is missing: RFC 959's 501, not 500.
            ("CHMOD", None) => self.reply(501, "SITE CHMOD MODE PATH (octal mode).").await,
            ("RANGES", None) => self.reply(501, "SITE RANGES PATH.").await,
            ("RESUMABLE", None) => {
                self.reply(501, "SITE RESUMABLE SIZE MTIME (bytes, and the source's time as an integer: xftp sends nanoseconds since the epoch).")
                    .await
            }
            // GridFTP clients announce themselves; nothing to do.
            ("CLIENTINFO", _) => self.reply(250, "Client info noted.").await,
            ("BUFSIZE" | "WIN" | "RBUFSZ" | "SBUFSZ" | "RBUFSIZ" | "SBUFSIZ", None) => {
                let now = self.bufsize_text();
                self.reply(200, now).await
            }
            _ => {
                self.reply(500, format!("Unknown SITE command {word} (try SITE HELP)."))
                    .await
            }
        }
    }

    fn bufsize_text(&self) -> String {
        match (self.bufsize, xftp_tune::sockbuf::probe_capped(self.bufsize)) {
            (None, Ok(f)) => format!(
                "Data socket buffers: kernel autotuning (initial rcv {}, snd {}).",
                f.rcv, f.snd
            ),
            (Some(b), Ok(f)) => format!(
                "Data socket buffers: {b} requested, in force rcv {}, snd {}.",
                f.rcv, f.snd
            ),
            (_, Err(e)) => format!("Data socket buffers: unknown ({e})."),
        }
    }

    /// GridFTP's SBUF: a size out of range is held to it, as
    /// globus-gridftp-server lets the kernel do (globus-url-copy gives up
    /// on a refusal of `-tcp-bs`); SITE BUFSIZE refuses it, and xftp's
    /// client says so.
    async fn set_bufsize_clamped(&mut self, b: BufSize) -> std::io::Result<()> {
        let (lo, hi) = (self.cfg.min_bufsize, self.cfg.max_bufsize);
        match b {
            BufSize::Bytes(n) if n < lo || n > hi => {
                self.bufsize = Some(n.clamp(lo, hi));
                let t = self.bufsize_text();
                self.reply(200, format!("{t} (held to {lo} to {hi} bytes)"))
                    .await
            }
            b => self.set_bufsize(b).await,
        }
    }

    async fn set_bufsize(&mut self, b: BufSize) -> std::io::Result<()> {
        match b {
            BufSize::Auto => {
                self.bufsize = None;
                let t = self.bufsize_text();
                self.reply(200, t).await
            }
            BufSize::Bytes(n) if n < self.cfg.min_bufsize || n > self.cfg.max_bufsize => {
                let (lo, hi) = (self.cfg.min_bufsize, self.cfg.max_bufsize);
                self.reply(
                    501,
                    format!("Buffer size {n} out of range ({lo} to {hi} bytes, or auto)."),
                )
                .await
            }
            BufSize::Bytes(n) => {
                self.bufsize = Some(n);
                let t = self.bufsize_text();
                self.reply(200, t).await
            }
        }
    }

    // ---- paths ----

    fn vpath(&self, arg: &[u8]) -> Result<VPath, (u16, String)> {
        self.cwd.resolve(arg).map_err(|e| (501, e.to_string()))
    }

    /// Reply with the FTP code and text for a file-system error on `v`.
    async fn reply_fs(&mut self, v: &VPath, e: &FsError) -> std::io::Result<()> {
        let (c, t) = fs_reply(e);
        self.reply(c, format!("{}: {t}.", v.display())).await
    }

    /// The path of a write command, or `None` after replying: 550 for a
    /// read-only login, 501 for a path that cannot be resolved.
    async fn write_target(&mut self, arg: &[u8]) -> std::io::Result<Option<VPath>> {
        if !self.may_write() {
            self.deny_write().await?;
            return Ok(None);
        }
        match self.vpath(arg) {
            Ok(v) => Ok(Some(v)),
            Err((c, t)) => {
                self.reply(c, t).await?;
                Ok(None)
            }
        }
    }

    async fn cwd(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let v = match self.vpath(arg) {
            Ok(v) => v,
            Err((c, t)) => return self.reply(c, t).await,
        };
        match self.root.existing(&v) {
            Ok(p) if p.is_dir() => {
                // A directory the server's user cannot enter would take
                // the CWD and fail every command after it.
                if let Err(e) = fs::can_enter(&p) {
                    return self.reply(550, io_said(&v, &e)).await;
                }
                self.cwd = v;
                let d = self.cwd.display();
                self.reply(250, format!("Directory changed to {d}.")).await
            }
            Ok(_) => {
                self.reply(550, format!("{}: Not a directory.", v.display()))
                    .await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    /// Resolve to an existing real path or reply with the error.
    async fn existing(&mut self, arg: &[u8]) -> std::io::Result<Option<(VPath, PathBuf)>> {
        let v = match self.vpath(arg) {
            Ok(v) => v,
            Err((c, t)) => {
                self.reply(c, t).await?;
                return Ok(None);
            }
        };
        match self.root.existing(&v) {
            Ok(p) => Ok(Some((v, p))),
            Err(e) => {
                let (c, t) = fs_reply(&e);
                self.reply(c, format!("{}: {t}.", v.display())).await?;
                Ok(None)
            }
        }
    }

    async fn size(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some((v, p)) = self.existing(arg).await? else {
            return Ok(());
        };
        let md = match self.root.stat(&p) {
            Ok(m) => m,
            Err(e) => return self.reply_fs(&v, &e).await,
        };
        if !md.is_file() {
            return self
                .reply(550, format!("{}: not a plain file.", v.display()))
                .await;
        }
        if self.ttype == TransferType::Image {
            return self.reply(213, md.len().to_string()).await;
        }
        // Counting reads the whole file: a few bytes of SIZE commands
        // (anonymous, pipelined) would cost gigabytes of reading.
        // vsftpd and ProFTPD refuse SIZE in TYPE A outright.
        if md.len() > ASCII_SIZE_MAX {
            return self
                .reply(
                    550,
                    format!(
                        "{}: SIZE in TYPE A reads the whole file to count its line ends; refused over {} MiB: send TYPE I first.",
                        v.display(),
                        ASCII_SIZE_MAX >> 20
                    ),
                )
                .await;
        }
        // RFC 3659 4: SIZE reports the bytes a transfer in the current TYPE
        // would carry, so count the CRs TYPE A adds.
        let root = self.root.clone();
        let n = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            use std::io::Read;
            let mut f = root.open_read(&p)?;
            let mut conv = xftp_proto::ascii::ToWire::new();
            let mut buf = vec![0u8; 256 * 1024];
            let mut n = 0;
            loop {
                let k = f.read(&mut buf)?;
                if k == 0 {
                    return Ok(n);
                }
                n += conv.wire_len(&buf[..k]);
            }
        })
        .await;
        match n {
            Ok(Ok(n)) => self.reply(213, n.to_string()).await,
            Ok(Err(e)) => self.reply(550, io_said(&v, &e)).await,
            Err(e) => self.reply(451, e.to_string()).await,
        }
    }

    /// GridFTP CKSM: the checksum of a file or of a range of it, read on a
    /// blocking thread (the session waits; other sessions do not).
    async fn cksm(&mut self, a: xftp_proto::cksum::CksmArgs) -> std::io::Result<()> {
        let alg = match Algorithm::parse(&a.algorithm) {
            Ok(alg) => alg,
            Err(e) => return self.reply(504, format!("{e}.")).await,
        };
        let Some((v, p)) = self.existing(&a.path).await? else {
            return Ok(());
        };
        match self.digest(&v, p, alg, a.offset, a.length).await {
            Ok((hex, _)) => self.reply(213, hex).await,
            Err((code, text)) => self.reply(code, text).await,
        }
    }

    /// HASH (draft-bryan-ftpext-hash): `213 ALG 0-LAST HEX PATH`, the
    /// range inclusive as in the draft.
    async fn hash(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some((v, p)) = self.existing(arg).await? else {
            return Ok(());
        };
        let alg = self.hash_alg;
        match self.digest(&v, p, alg, 0, None).await {
            Ok((hex, n)) => {
                let name = alg.hash_name().unwrap_or("SHA-256");
                let last = n.saturating_sub(1);
                self.reply(
                    213,
                    format!("{name} 0-{last} {hex} {}", xftp_proto::name::decode(arg)),
                )
                .await
            }
            Err((code, text)) => self.reply(code, text).await,
        }
    }

    async fn digest(
        &mut self,
        v: &VPath,
        p: PathBuf,
        alg: Algorithm,
        offset: u64,
        len: Option<u64>,
    ) -> Result<(String, u64), (u16, String)> {
        let started = std::time::Instant::now();
        let root = self.root.clone();
        let r = tokio::task::spawn_blocking(move || {
            let f = root.open_read(&p)?;
            xftp_proto::cksum::digest_file(alg, &f, offset, len)
        })
        .await;
        match r {
            Ok(Ok((hex, n))) => {
                tracing::debug!(
                    "{alg} of {} ({n} bytes) in {:.3} s",
                    v.display(),
                    started.elapsed().as_secs_f64()
                );
                Ok((hex, n))
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidInput => {
                Err((501, format!("{}: {e}.", v.display())))
            }
            Ok(Err(e)) => Err((550, io_said(v, &e))),
            Err(e) => Err((451, format!("checksum failed: {e}."))),
        }
    }

    /// The address is locked out for `wait` more: 421, and the session
    /// ends.
    async fn locked_out(&mut self, wait: Duration) -> std::io::Result<Flow> {
        self.reply(
            421,
            format!(
                "Too many failed logins from your address; try again in {} s.",
                wait.as_secs().max(1)
            ),
        )
        .await?;
        Ok(Flow::Quit)
    }

    /// MFMT: set a file's or a directory's modification time (a copied
    /// tree keeps its times).
    async fn mfmt(&mut self, ms: i64, arg: &[u8]) -> std::io::Result<()> {
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        let p = match self.root.existing(&v) {
            Ok(p) => p,
            Err(e) => return self.reply_fs(&v, &e).await,
        };
        let when = xftp_proto::facts::system_time_ms(ms);
        // A directory is opened through its checked handle (opening it by
        // name again could follow a swap); a file as for reading.
        let open = || -> std::io::Result<std::fs::File> {
            if p.is_dir() {
                let fd = self.root.pin(&p).map_err(FsError::into_io)?;
                std::fs::File::open(fs::proc_path(std::os::fd::AsFd::as_fd(&fd)))
            } else {
                self.root.open_read(&p)
            }
        };
        // The time the file has now: a file system clamps what it cannot
        // hold (year 9999 became 2446 on ext4), and the reply says so.
        let r = open().and_then(|f| {
            f.set_modified(when)?;
            f.metadata()
        });
        match r {
            Ok(md) => {
                let t = md
                    .modified()
                    .map_or_else(|_| fs::mdtm_string(0), xftp_proto::facts::format_time_ms);
                self.reply(213, format!("Modify={t}; {}", v.display()))
                    .await
            }
            Err(e) => self.reply(550, io_said(&v, &e)).await,
        }
    }

    /// SITE CHMOD mode path: permission bits only (no setuid, setgid or
    /// sticky bits from a client).
    async fn chmod(&mut self, mode: &str, path: &str) -> std::io::Result<()> {
        let Ok(m) = u32::from_str_radix(mode, 8) else {
            return self
                .reply(501, format!("SITE CHMOD: {mode:?} is not an octal mode."))
                .await;
        };
        if path.is_empty() {
            return self.reply(501, "SITE CHMOD mode path: no path.").await;
        }
        let Some(v) = self.write_target(path.as_bytes()).await? else {
            return Ok(());
        };
        // As RMD and RNFR: the root (a user's home) is not the client's
        // to change; mode 0 on it locks every session out of it.
        if v.is_root() {
            return self
                .reply(550, "Cannot change the root directory's permissions.")
                .await;
        }
        let p = match self.root.existing(&v) {
            Ok(p) => p,
            Err(e) => return self.reply_fs(&v, &e).await,
        };
        use std::os::unix::fs::PermissionsExt;
        let pinned = match self.root.pin(&p) {
            Ok(fd) => fd,
            Err(e) => return self.reply_fs(&v, &e).await,
        };
        let p = fs::proc_path(std::os::fd::AsFd::as_fd(&pinned));
        match std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m & 0o777)) {
            Ok(()) => {
                self.reply(200, format!("SITE CHMOD {:o} done.", m & 0o777))
                    .await
            }
            Err(e) => self.reply(550, io_said(&v, &e)).await,
        }
    }

    async fn mdtm(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some((v, p)) = self.existing(arg).await? else {
            return Ok(());
        };
        match self.root.stat(&p) {
            Ok(md) if md.is_file() => {
                let t = md
                    .modified()
                    .map_or_else(|_| fs::mdtm_string(0), xftp_proto::facts::format_time_ms);
                self.reply(213, t).await
            }
            Ok(_) => {
                self.reply(550, format!("{}: not a plain file.", v.display()))
                    .await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    async fn dele(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        if v.is_root() {
            return self.reply(550, "Cannot delete the root directory.").await;
        }
        let r = self.root.entry(&v).and_then(|p| {
            let (dir, name) = self.root.pin_parent(&p)?;
            let dir = std::os::fd::AsFd::as_fd(&dir);
            fs::unlink_at(dir, name, false)?;
            // A resumable upload's partial takes its record along.
            crate::resumable::remove_record(&fs::proc_path(dir).join(name));
            Ok(())
        });
        match r {
            Ok(()) => self.reply(250, format!("{} deleted.", v.display())).await,
            Err(FsError::IsDir) => {
                self.reply(
                    550,
                    format!("{}: Is a directory (RMD removes one).", v.display()),
                )
                .await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    async fn mkd(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        let r = self.root.creatable(&v).and_then(|p| {
            let (dir, name) = self.root.pin_parent(&p)?;
            fs::mkdir_at(std::os::fd::AsFd::as_fd(&dir), name)
        });
        match r {
            Ok(()) => {
                let q = quote(&v.display());
                self.reply(257, format!("\"{q}\" created.")).await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    async fn rmd(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        if v.is_root() {
            return self.reply(550, "Cannot remove the root directory.").await;
        }
        let r = self.root.entry(&v).and_then(|p| {
            let (dir, name) = self.root.pin_parent(&p)?;
            fs::unlink_at(std::os::fd::AsFd::as_fd(&dir), name, true)
        });
        match r {
            Ok(()) => self.reply(250, format!("{} removed.", v.display())).await,
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    async fn rnfr(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        if v.is_root() {
            return self.reply(550, "Cannot rename the root directory.").await;
        }
        match self.root.entry(&v) {
            Ok(p) => {
                self.rnfr = Some(p);
                self.reply(350, "Ready for RNTO.").await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    async fn rnto(&mut self, arg: &[u8], from: Option<PathBuf>) -> std::io::Result<()> {
        let Some(from) = from else {
            return self.reply(503, "RNTO must come right after RNFR.").await;
        };
        // "f/" and "f/." name a directory: a file renamed to them would
        // take a name no later path with the slash could reach.
        let t = arg.trim_ascii_end();
        if (t.ends_with(b"/") || t.ends_with(b"/.")) && !from.is_dir() {
            return self
                .reply(
                    553,
                    "A file's new name cannot end with '/' (a directory's may).",
                )
                .await;
        }
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        let r = self.root.creatable(&v).and_then(|to| {
            let (from_dir, from_name) = self.root.pin_parent(&from)?;
            let (to_dir, to_name) = self.root.pin_parent(&to)?;
            // A resumable upload's partial moved over a file replaces it
            // as STOR does: the replaced file's permission bits are kept
            // (`put -c` made a 0600 file 0644). Set on the partial, opened
            // without following a link, before the move.
            if matches!(crate::resumable::read(&from), Ok(Some(_))) {
                use std::os::unix::fs::PermissionsExt;
                let keep = std::fs::symlink_metadata(&to)
                    .ok()
                    .filter(|md| md.is_file())
                    .map(|md| md.permissions().mode() & 0o777);
                if let Some(mode) = keep {
                    if let Ok(f) = fs::open_plain(
                        &from,
                        std::fs::OpenOptions::new().write(true),
                        libc::O_NOFOLLOW | libc::O_NONBLOCK,
                    ) {
                        let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
                    }
                }
            }
            use std::os::fd::AsFd;
            fs::rename_at(from_dir.as_fd(), from_name, to_dir.as_fd(), to_name)
        });
        match r {
            Ok(()) => {
                // A completed resumable upload, moved into place: its
                // record is of no more use.
                crate::resumable::remove_record(&from);
                self.reply(250, format!("Renamed to {}.", v.display()))
                    .await
            }
            Err(FsError::Io(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.reply(
                    550,
                    format!("{}: a directory cannot move into itself.", v.display()),
                )
                .await
            }
            Err(e) => self.reply_fs(&v, &e).await,
        }
    }

    // ---- data connection setup ----

    async fn active(&mut self, addr: SocketAddr, verb: &str) -> std::io::Result<()> {
        if self.epsv_all {
            return self.reply(501, "EPSV ALL is in effect: use EPSV.").await;
        }
        if let Err(why) = data::check_active_addr(addr, self.peer_ip()) {
            return self.reply(501, why).await;
        }
        self.data = DataPlan::Active(addr);
        self.cached.clear();
        self.reply(200, format!("{verb} command successful.")).await
    }

    async fn mprt(&mut self, addrs: Vec<SocketAddr>) -> std::io::Result<()> {
        if self.epsv_all {
            return self.reply(501, "EPSV ALL is in effect: use EPSV.").await;
        }
        if addrs.len() != self.streams as usize {
            let g = self.streams;
            return self
                .reply(
                    501,
                    format!(
                        "MPRT needs exactly {g} addresses (MULT granted {g}), got {}.",
                        addrs.len()
                    ),
                )
                .await;
        }
        for (i, a) in addrs.iter().enumerate() {
            if let Err(why) = data::check_active_addr(*a, self.peer_ip()) {
                return self.reply(501, why).await;
            }
            if addrs[..i].contains(a) {
                return self.reply(501, format!("MPRT lists {a} twice.")).await;
            }
        }
        self.data = DataPlan::Multi(addrs);
        self.cached.clear();
        self.reply(200, "MPRT command successful.").await
    }

    async fn pasv(&mut self) -> std::io::Result<()> {
        if self.epsv_all {
            return self.reply(501, "EPSV ALL is in effect: use EPSV.").await;
        }
        let ip = match self.local.ip().to_canonical() {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(_) => {
                return self
                    .reply(500, "PASV is IPv4-only; use EPSV on an IPv6 connection.")
                    .await
            }
        };
        // The session's earlier listener goes first: with a narrow
        // --passive-ports range its port may be the only one free.
        self.data = DataPlan::None;
        match data::passive_listener(IpAddr::V4(ip), self.bufsize, self.cfg.passive_ports).and_then(
            |l| {
                let port = l.local_addr()?.port();
                Ok((l, port))
            },
        ) {
            Ok((l, port)) => {
                self.data = DataPlan::Passive(l);
                self.cached.clear();
                // Behind NAT the client must be told the outside address.
                let shown = self.cfg.public_address.unwrap_or(ip);
                let a = std::net::SocketAddrV4::new(shown, port);
                self.reply(227, hostport::format_pasv_reply(a)).await
            }
            Err(e) => {
                self.reply(425, format!("Cannot open passive port: {e}"))
                    .await
            }
        }
    }

    async fn epsv(&mut self, arg: Option<String>) -> std::io::Result<()> {
        let want_v6 = !matches!(self.local.ip().to_canonical(), IpAddr::V4(_));
        match arg.as_deref() {
            None => {}
            Some(a) if a.eq_ignore_ascii_case("ALL") => {
                self.epsv_all = true;
                return self.reply(200, "EPSV ALL accepted.").await;
            }
            Some("1") if !want_v6 => {}
            Some("2") if want_v6 => {}
            // RFC 2428: any other protocol number is one not supported.
            Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let p = if want_v6 { 2 } else { 1 };
                return self
                    .reply(522, format!("Network protocol not supported, use ({p})"))
                    .await;
            }
            Some(other) => return self.reply(501, format!("Bad EPSV argument {other}.")).await,
        }
        self.data = DataPlan::None;
        match data::passive_listener(self.local.ip(), self.bufsize, self.cfg.passive_ports)
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
        {
            Ok((port, l)) => {
                self.data = DataPlan::Passive(l);
                self.cached.clear();
                self.reply(229, hostport::format_epsv_reply(port)).await
            }
            Err(e) => {
                self.reply(425, format!("Cannot open passive port: {e}"))
                    .await
            }
        }
    }

    /// Open `n` data connections from the current plan, replying 425 on
    /// failure. The plan is used up either way.
    async fn open_data(
        &mut self,
        n: usize,
        sending: bool,
        early: bool,
    ) -> std::io::Result<Option<(Vec<Stream>, Option<Grow>, live::Joining)>> {
        // The client may need a reply still kept to open them.
        self.flush_replies().await?;
        let plan = std::mem::take(&mut self.data);
        let open = data::open(
            plan,
            n,
            self.peer_ip(),
            self.local.ip(),
            self.cfg.data_timeout,
            self.bufsize,
            early.then_some(EARLY_START),
        );
        // The control connection is read meanwhile: an ABOR before the
        // client connects ends the wait at once (not at the data timeout).
        let opened = match self.watching_control(open).await? {
            None => {
                self.reply(426, "Transfer aborted before its data connection opened.")
                    .await?;
                self.reply(226, "ABOR command successful.").await?;
                return Ok(None);
            }
            Some(r) => r,
        };
        let opened = match opened {
            Ok(c) => c,
            Err(DataError::Timeout) => {
                self.reply(425, "Data connection timed out.").await?;
                return Ok(None);
            }
            Err(e) => {
                self.reply(425, format!("Cannot open data connection: {e}"))
                    .await?;
                return Ok(None);
            }
        };
        let (conns, grow, connects) = opened;
        // Under TLS the start waits for the first handshake, and the
        // others for `EARLY_START` more, as it waits for connections.
        let tls = self.data_tls(sending);
        let secured = match (tls.as_ref(), grow.as_ref()) {
            // One passive connection (a stock client's): a stranger from
            // the client's address must not take its slot.
            (Some(t), Some(Grow::Passive(l))) if n == 1 && conns.len() == 1 => {
                let first = conns.into_iter().next().expect("one connection");
                crate::secure::first_secured(t, l, self.peer_ip(), first, self.cfg.data_timeout)
                    .await
                    .map(|s| crate::secure::Secured {
                        conns: vec![s],
                        handshakes: None,
                        failed: 0,
                    })
            }
            _ => {
                crate::secure::secure_early(tls.as_ref(), conns, early.then_some(EARLY_START)).await
            }
        };
        match secured {
            Ok(s) => Ok(Some((
                s.conns,
                grow,
                live::Joining {
                    connects,
                    handshakes: s.handshakes,
                    failed: s.failed,
                },
            ))),
            Err(e) => {
                // RFC 4217: 522, TLS negotiation on the data connection failed.
                self.reply(522, format!("Data connection refused: {e}"))
                    .await?;
                Ok(None)
            }
        }
    }

    /// Run `work` while reading the control connection: `None` if ABOR
    /// came first (the commands around it are queued), NOOP answered,
    /// anything else kept for the transfer to see (`early`).
    async fn watching_control<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> std::io::Result<Option<T>> {
        // An ABOR sent with the command, in the same segment, was read
        // already: it is among the queued lines, not on the socket.
        let abor = self.queued.iter().position(|l| {
            l.as_ref()
                .is_ok_and(|l| Command::verb_of(l).eq_ignore_ascii_case("ABOR"))
        });
        if let Some(i) = abor {
            self.queued.remove(i);
            return Ok(None);
        }
        tokio::pin!(work);
        let mut buf = [0u8; 4096];
        loop {
            tokio::select! {
                r = &mut work => return Ok(Some(r)),
                n = self.ctl.read(&mut buf) => {
                    let n = match n {
                        Ok(0) | Err(_) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::ConnectionAborted,
                                "control connection closed while a data connection was awaited",
                            ))
                        }
                        Ok(n) => n,
                    };
                    let mut lines = Vec::new();
                    self.reader.feed(&buf[..n], &mut lines);
                    self.read_past_urgent_mark(&mut buf, &mut lines);
                    let mut rest = lines.into_iter();
                    while let Some(l) = rest.next() {
                        let verb = l.as_ref().map(|l| Command::verb_of(l)).unwrap_or_default();
                        if verb == "ABOR" {
                            let before: Vec<_> = self.early.drain(..).collect();
                            self.queued.extend(before);
                            self.queued.extend(rest);
                            return Ok(None);
                        } else if verb == "NOOP" {
                            self.reply(200, "NOOP ok.").await?;
                            self.flush_replies().await?;
                        } else if self.queued.len() + self.early.len() >= MAX_QUEUED {
                            let _ = self
                                .reply(421, format!("More than {MAX_QUEUED} commands sent while a data connection was awaited; closing the session."))
                                .await;
                            return Err(std::io::Error::other("too many commands queued"));
                        } else {
                            self.early.push_back(l);
                        }
                    }
                }
            }
        }
    }

    /// Wait for a transfer task while still reading the control connection:
    /// ABOR cancels it, STAT reports progress, anything else waits in the
    /// queue until the transfer is over.
    async fn run_transfer<T: Send + 'static>(
        &mut self,
        mut task: JoinHandle<Result<T, TransferError>>,
        progress: Progress,
        mut live: Option<Live>,
    ) -> std::io::Result<Outcome<T>> {
        // The 150 (and whatever came before it) goes out now.
        self.flush_replies().await?;
        // Set by `store` for a stream-mode upload just before; this
        // transfer's alone.
        let mut stop = self.stop_upload.take();
        let limit = self.upload_limit.take();
        let mut buf = [0u8; 4096];
        let moved = |live: &Option<Live>| match live {
            Some(lv) => lv.meters.totals().bytes,
            None => progress.load(Ordering::Relaxed),
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last = (moved(&live), tokio::time::Instant::now());
        // What came while the data connections were awaited, first.
        let mut pending: Vec<_> = self.early.drain(..).collect();
        loop {
            let lines = if !pending.is_empty() {
                std::mem::take(&mut pending)
            } else {
                tokio::select! {
                    _ = tick.tick() => {
                        // A data connection that moves nothing for this long is
                        // dead (peer gone without a reset): give up, 426.
                        let now = moved(&live);
                        // An upload past the limit stops now, not at its end.
                        if let Some(max) = limit.filter(|m| now > *m) {
                            halt(&mut task, stop.take()).await;
                            return Ok(Outcome::Failed(TransferError::TooLarge(max)));
                        }
                        if now != last.0 {
                            last = (now, tokio::time::Instant::now());
                        } else if last.1.elapsed() >= self.cfg.stall_timeout {
                            halt(&mut task, stop.take()).await;
                            let secs = self.cfg.stall_timeout.as_secs();
                            return Ok(Outcome::Failed(TransferError::Network(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("no data moved for {secs} s"),
                            ))));
                        }
                        continue;
                    }
                    () = self.now.cancelled() => {
                        halt(&mut task, stop.take()).await;
                        let _ = self
                            .reply(421, "Server shutting down; the transfer was not completed.")
                            .await;
                        let _ = self.flush_replies().await;
                        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "transfer ended by the shutdown"));
                    }
                    r = &mut task => {
                        return Ok(match r {
                            Ok(Ok(t)) => Outcome::Done(t),
                            Ok(Err(e)) => Outcome::Failed(e),
                            Err(e) => Outcome::Failed(TransferError::Storage(std::io::Error::other(e.to_string()))),
                        });
                    }
                    n = self.ctl.read(&mut buf) => {
                        let n = match n {
                            Ok(0) | Err(_) => {
                                // Client gone: stop the transfer (an upload is rolled back).
                                halt(&mut task, stop.take()).await;
                                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "control connection closed during transfer"));
                            }
                            Ok(n) => n,
                        };
                        let mut lines = Vec::new();
                        self.reader.feed(&buf[..n], &mut lines);
                        self.read_past_urgent_mark(&mut buf, &mut lines);
                        lines
                    }
                }
            };
            let mut rest = lines.into_iter();
            while let Some(l) = rest.next() {
                let verb = l.as_ref().map(|l| Command::verb_of(l)).unwrap_or_default();
                if verb == "ABOR" {
                    halt(&mut task, stop.take()).await;
                    self.queued.extend(rest);
                    return Ok(Outcome::Aborted);
                } else if verb == "STAT" && l.as_ref().is_ok_and(|l| l.len() <= 5) {
                    let text = match &live {
                        Some(lv) => {
                            lv.meters.refresh();
                            xftp_tune::meter::format_progress(&lv.meters.totals())
                        }
                        None => format!(
                            "Transfer in progress: {} bytes.",
                            progress.load(Ordering::Relaxed)
                        ),
                    };
                    self.reply(213, text).await?;
                    self.flush_replies().await?;
                } else if verb == "NOOP" {
                    // Answered at once: clients time round trips with it.
                    self.reply(200, "NOOP ok.").await?;
                    self.flush_replies().await?;
                } else if let (Some(lv), Ok(Ok(Command::Mult(n)))) =
                    (live.as_mut(), l.as_ref().map(|l| Command::parse(l)))
                {
                    let want = n
                        .unwrap_or(self.cfg.default_streams)
                        .clamp(1, self.cfg.max_streams.max(1));
                    let want = self.streams_claim.set(want, self.cfg.max_streams_per_ip);
                    let (code, text) = lv.set_streams(want);
                    if code == 200 {
                        self.streams = want.clamp(1, self.cfg.max_streams.max(1));
                    }
                    self.reply(code, text).await?;
                    self.flush_replies().await?;
                } else if self.queued.len() >= MAX_QUEUED {
                    halt(&mut task, stop.take()).await;
                    let _ = self
                        .reply(421, format!("More than {MAX_QUEUED} commands sent during a transfer; closing the session."))
                        .await;
                    return Err(std::io::Error::other(
                        "too many commands queued during a transfer",
                    ));
                } else {
                    self.queued.push_back(l);
                }
            }
        }
    }

    async fn finish<T>(
        &mut self,
        outcome: Outcome<T>,
        ok: impl FnOnce(T) -> String,
    ) -> std::io::Result<()> {
        match outcome {
            Outcome::Done(t) => self.reply(226, ok(t)).await,
            // The checks carry what was left of the limit; the reply names
            // the limit.
            Outcome::Failed(TransferError::TooLarge(left)) => {
                // RFC 959: 552, exceeded storage allocation.
                let max = self.cfg.max_upload_size.unwrap_or(left);
                self.reply(552, too_large(max)).await
            }
            Outcome::Failed(TransferError::TooLargeKept { max: left, from }) => {
                let max = self.cfg.max_upload_size.unwrap_or(left);
                self.reply(
                    552,
                    format!("Upload stopped at this server's limit of {max} bytes; what came before it was written in place from byte {from} (REST) on."),
                )
                .await
            }
            Outcome::Failed(TransferError::Storage(e)) => self.storage_failed(&e.to_string()).await,
            // The file system under a striped transfer: the server's, not
            // the connection's, fault.
            Outcome::Failed(TransferError::Stripe(xftp_stripe::StripeError::Io {
                conn: None,
                message,
                ..
            })) => self.storage_failed(&message).await,
            Outcome::Failed(e) => {
                self.reply(426, format!("Connection closed; transfer aborted: {e}"))
                    .await
            }
            Outcome::Aborted => {
                self.reply(426, "Transfer aborted.").await?;
                self.reply(226, "ABOR command successful.").await
            }
        }
    }

    /// A download whose file changed while it was sent: its copy is of no
    /// one version (a log being written, a file rewritten in place), so
    /// the transfer fails rather than end with a 226.
    async fn source_changed(&mut self, v: &VPath) -> std::io::Result<()> {
        self.reply(
            451,
            format!(
                "{}: the file changed during the transfer (its size or modification time): the copy is of no one version; fetch it again once the file is complete.",
                v.display()
            ),
        )
        .await
    }

    /// A transfer's end when the local file system failed it: 452 when
    /// it is out of space (ENOSPC, EDQUOT), else 451.
    async fn storage_failed(&mut self, why: &str) -> std::io::Result<()> {
        if xftp_stripe::names_out_of_space(why) {
            self.reply(
                452,
                format!("Insufficient storage space, transfer aborted: {why}"),
            )
            .await
        } else {
            self.reply(451, format!("Local error, transfer aborted: {why}"))
                .await
        }
    }

    /// The connections kept from the last framed transfer, for a framed
    /// transfer of `n` connections with no new data plan; `None` when
    /// there are none to reuse (the count changed: they are closed).
    fn take_cached(&mut self, n: usize) -> Option<Vec<Stream>> {
        let reuse = self.can_reuse(n);
        let kept = std::mem::take(&mut self.cached);
        reuse.then_some(kept)
    }

    /// Whether the next framed transfer of `n` connections would reuse
    /// the kept ones (see [`take_cached`](Self::take_cached)).
    fn can_reuse(&self, n: usize) -> bool {
        matches!(self.data, DataPlan::None) && !self.cached.is_empty() && self.cached.len() == n
    }

    /// Framed transfers carry MODE E blocks: with MULT > 1, or MODE E.
    fn framed(&self) -> bool {
        self.streams > 1 || self.mode_e
    }

    /// Whether PASV, EPSV, PORT, EPRT or MPRT set up this transfer's data
    /// connections; if not, says 425 (before any 150, so the client is not
    /// told a transfer started). Kept MODE E connections are not a plan:
    /// `take_cached` is asked first where they apply.
    async fn data_planned(&mut self) -> std::io::Result<bool> {
        if self.cfg.tls_mode == TlsMode::Required && !self.prot_private {
            self.data = DataPlan::None;
            self.reply(
                521,
                "Data connections must be protected on this server: send PBSZ 0 and PROT P.",
            )
            .await?;
            return Ok(false);
        }
        if !matches!(self.data, DataPlan::None) {
            return Ok(true);
        }
        let why = if self.mode_e {
            "No data connection: use PASV, EPSV, PORT, EPRT or MPRT first (MODE E keeps connections only after a transfer that succeeded, for the next of the same count)."
        } else {
            "No data connection: use PASV, EPSV, PORT, EPRT or MPRT first."
        };
        self.reply(425, why).await?;
        Ok(false)
    }

    fn live(&self, meters: MeterSet, ctl: live::Ctl, grow: Option<Grow>, n: usize) -> Live {
        let sending = matches!(ctl, live::Ctl::Send(_));
        Live::new(
            meters,
            ctl,
            grow,
            n as u32,
            self.cfg.max_streams,
            self.peer_ip(),
            self.local.ip(),
            self.bufsize,
            self.cfg.data_timeout,
            self.data_tls(sending),
        )
    }

    async fn retr(&mut self, arg: &[u8]) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.rest);
        let have = self.rest_ranges.take();
        self.allo = None;
        if rest > 0 && self.ttype == TransferType::Ascii {
            return self.reply(504, REST_IN_ASCII).await;
        }
        let Some((v, p)) = self.existing(arg).await? else {
            return Ok(());
        };
        if p.is_dir() {
            return self
                .reply(550, format!("{}: Is a directory.", v.display()))
                .await;
        }
        let file = match self.root.open_read(&p) {
            Ok(f) => f,
            Err(e) => return self.reply(550, io_said(&v, &e)).await,
        };
        let md = match file.metadata() {
            Ok(m) => m,
            Err(e) => return self.reply(550, io_said(&v, &e)).await,
        };
        let len = md.len();
        if rest > len {
            return self
                .reply(
                    554,
                    format!("Invalid REST parameter: {rest} is past the end ({len} bytes)."),
                )
                .await;
        }
        let source = xftp_stripe::FileStamp::new(&file, len);
        let ascii = self.ttype == TransferType::Ascii;
        let framed = self.framed();
        let n = self.streams as usize;
        if let Some(h) = &have {
            if !framed || ascii {
                return self
                    .reply(
                        504,
                        "REST with ranges needs MODE E (or MULT > 1) and TYPE I; stream mode takes REST OFFSET.",
                    )
                    .await;
            }
            if h.max_end() > len {
                return self
                    .reply(
                        554,
                        format!(
                            "Invalid REST ranges: they reach {} but the file has {len} bytes (has it changed?).",
                            h.max_end()
                        ),
                    )
                    .await;
            }
        }
        if framed && (ascii || rest > 0) {
            return self
                .reply(
                    504,
                    "Framed (MULT > 1 or MODE E) transfers need TYPE I and no REST.",
                )
                .await;
        }
        let kind = if ascii { "ASCII" } else { "BINARY" };
        let cached = if framed { self.take_cached(n) } else { None };
        if cached.is_none() && !self.data_planned().await? {
            return Ok(());
        }
        let how = if cached.is_some() {
            "Using kept"
        } else {
            "Opening"
        };
        self.reply(
            150,
            format!(
                "{how} {kind} mode data connection for {} ({len} bytes, {n} connection(s)).",
                v.display()
            ),
        )
        .await?;
        let (conns, grow, joining) = match cached {
            Some(c) => (c, None, live::Joining::default()),
            // A download on several connections starts once most are in
            // (the schedule can take the others later; a static split
            // cannot).
            None => match self
                .open_data(n, true, n > 1 && self.schedule != Schedule::Static)
                .await?
            {
                Some(opened) => opened,
                None => return Ok(()),
            },
        };
        let progress: Progress = Arc::new(AtomicU64::new(0));
        if !framed {
            let Some(conn) = conns.into_iter().next() else {
                return self.reply(425, "No data connection.").await;
            };
            let task = tokio::spawn(transfer::send_stream(
                file,
                rest,
                conn,
                ascii,
                progress.clone(),
            ));
            let out = self.run_transfer(task, progress, None).await?;
            if matches!(out, Outcome::Done(_)) && source.changed() {
                return self.source_changed(&v).await;
            }
            self.finish(out, |b| format!("Transfer complete ({b} bytes)."))
                .await
        } else {
            let meters = MeterSet::new();
            let started = conns.len();
            let conns: Vec<_> = conns
                .into_iter()
                .map(|c| meters.wrap(c).bound_backlog())
                .collect();
            // The endgame's extra round trip at the end (every byte
            // acknowledged before the last EOD) pays only on files that
            // take many round trips; its connections are not kept.
            // Under TLS too: `xftp_tls::Ledger` tells the plaintext a
            // connection delivered from the ciphertext its kernel socket
            // had acknowledged.
            let endgame = self.endgame && len >= ENDGAME_MIN;
            let cfg = SendConfig {
                record_size: xftp_stripe::record_size_for(len, n, self.cfg.record_size),
                schedule: self.schedule,
                keep_open: !endgame,
                endgame,
                // A file written meanwhile fails the download on its own
                // (451, `transfer.rs`).
                source_check: None,
            };
            let sender = match &have {
                Some(h) => Sender::file_except(Arc::new(file), len, h, conns, &cfg),
                None => Sender::file(Arc::new(file), len, conns, &cfg),
            };
            let ctl = live::Ctl::Send(sender.control());
            let mut lv = self.live(meters, ctl, grow, started);
            lv.join_rest(joining, n.saturating_sub(started));
            let task = tokio::spawn(async move { Ok(sender.finish_kept().await?) });
            let out = match self.run_transfer(task, progress, Some(lv)).await? {
                Outcome::Done((r, kept)) => {
                    // Every connection ended with its EOD and stays open
                    // for the next transfer (data channel caching).
                    self.cached = kept.into_iter().map(|c| c.into_inner()).collect();
                    Outcome::Done(r)
                }
                Outcome::Failed(e) => Outcome::Failed(e),
                Outcome::Aborted => Outcome::Aborted,
            };
            // (Its connections ended with their EODs, in step: kept for
            // the next transfer as after a 226.)
            if matches!(out, Outcome::Done(_)) && source.changed() {
                return self.source_changed(&v).await;
            }
            self.finish(out, |r| {
                format!(
                    "Transfer complete ({} bytes on {} connections).",
                    r.bytes,
                    r.streams.len()
                )
            })
            .await
        }
    }

    async fn store(&mut self, arg: &[u8], append: bool) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.rest);
        let have = self.rest_ranges.take();
        let allo = self.allo.take();
        if rest > 0 && self.ttype == TransferType::Ascii {
            return self.reply(504, REST_IN_ASCII).await;
        }
        if arg.ends_with(b"/") {
            // "f.txt/" names a directory; it must not replace f.txt.
            return self.reply(553, "A file name cannot end with '/'.").await;
        }
        if let Some(meta) = self.resumable.take() {
            if append || rest > 0 {
                return self
                    .reply(
                        504,
                        "A resumable upload is a STOR (REST with ranges for the rest).",
                    )
                    .await;
            }
            return self.store_resumable(arg, meta, have, allo).await;
        }
        if have.is_some() {
            return self
                .reply(
                    504,
                    "REST with ranges applies to RETR, or to a STOR after SITE RESUMABLE.",
                )
                .await;
        }
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        let kind = if append {
            UploadKind::Append
        } else if rest > 0 {
            UploadKind::Resume
        } else {
            UploadKind::Replace
        };
        // STOR renames onto the name (replacing a link, never its target);
        // APPE and REST+STOR open the file, which follows a link, so its
        // target is checked to be inside the root.
        let Some(target) = self.upload_target(&v, kind != UploadKind::Replace).await? else {
            return Ok(());
        };
        self.receive(&v, &target, kind, rest, allo).await
    }

    /// STOU [base]: a STOR under a name no file has: the base (from the
    /// argument, else `stou` in the current directory) if it is free, else
    /// `base.1`, `base.2`, ... The name goes out in the 150 reply as RFC
    /// 1123 has it (`150 FILE: name`); the file is created exclusively and
    /// written in place, and removed if the upload fails.
    async fn store_unique(&mut self, arg: Option<&[u8]>) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.rest);
        let ranges = self.rest_ranges.take();
        let allo = self.allo.take();
        if rest > 0 || ranges.is_some() || self.resumable.take().is_some() {
            return self
                .reply(504, "STOU writes a new file: no REST or SITE RESUMABLE.")
                .await;
        }
        let Some(base) = self.write_target(arg.unwrap_or(b"stou")).await? else {
            return Ok(());
        };
        let name = base.file_name().map(<[u8]>::to_vec).unwrap_or_default();
        for i in 0..1000u32 {
            let v = if i == 0 {
                base.clone()
            } else {
                let mut n = name.clone();
                n.extend_from_slice(format!(".{i}").as_bytes());
                match base.parent().join(&n) {
                    Ok(v) => v,
                    Err(e) => return self.reply(553, format!("{e}.")).await,
                }
            };
            let target = match self.root.creatable(&v) {
                Ok(p) => p,
                Err(e) => {
                    let (_, t) = fs_reply(&e);
                    return self.reply(553, format!("{}: {t}.", v.display())).await;
                }
            };
            // Any name that is there (a file, a directory, a link) is taken;
            // only one that is not is free.
            match std::fs::symlink_metadata(&target) {
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return self.receive(&v, &target, UploadKind::Unique, 0, allo).await;
                }
                Err(e) => return self.reply(553, io_said(&v, &e)).await,
            }
        }
        self.reply(
            553,
            format!(
                "{}: no unique name free (tried .1 to .999).",
                base.display()
            ),
        )
        .await
    }

    /// The data of an upload into `target` (`v` as the client names it;
    /// `allo`: its size, announced with ALLO for the endgame).
    async fn receive(
        &mut self,
        v: &VPath,
        target: &std::path::Path,
        kind: UploadKind,
        rest: u64,
        allo: Option<u64>,
    ) -> std::io::Result<()> {
        let ascii = self.ttype == TransferType::Ascii;
        let framed = self.framed();
        let n = self.streams as usize;
        if framed && (ascii || !matches!(kind, UploadKind::Replace | UploadKind::Unique)) {
            return self
                .reply(
                    504,
                    "Framed (MULT > 1 or MODE E) uploads need TYPE I, STOR (or STOU) and no REST.",
                )
                .await;
        }
        // The client sends copies of the records a stuck connection holds
        // (its endgame) and may reset that connection: the receiver takes
        // identical copies and is done once every byte of the announced
        // size is in. Its connections are not kept for the next transfer.
        let endgame = allo.filter(|_| framed);
        // In stream mode the announced size is checked at the end (a new
        // file only: REST and APPE add to one).
        let exact = allo.filter(|_| {
            !framed
                && !ascii
                && rest == 0
                && matches!(kind, UploadKind::Replace | UploadKind::Unique)
        });
        if let Some(max) = self
            .cfg
            .max_upload_size
            .filter(|m| endgame.is_some_and(|s| s > *m))
        {
            return self.reply(552, too_large(max)).await;
        }
        // Without MULT the client chose how many connections to send on
        // (a GridFTP client's -p): the ones it left open are its count.
        let n = if framed && !self.mult_set && self.can_reuse(self.cached.len()) {
            self.cached.len()
        } else {
            n
        };
        let reuse = framed && self.can_reuse(n);
        if !reuse && !self.data_planned().await? {
            return Ok(());
        }
        let (upload, file, offset) = match Upload::begin(&self.root, target, kind, rest) {
            Ok(x) => x,
            // RFC 959: 450, file unavailable (busy).
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return self.reply(450, format!("{}: {e}.", v.display())).await
            }
            // STOU's name, taken by another upload since it was chosen.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return self
                    .reply(450, format!("{}: taken meanwhile; try again.", v.display()))
                    .await
            }
            Err(e) => return self.reply(553, io_said(v, &e)).await,
        };
        if let Some(max) = self.cfg.max_upload_size.filter(|m| offset > *m) {
            return self.reply(552, too_large(max)).await;
        }
        let cached = if reuse { self.take_cached(n) } else { None };
        let how = if cached.is_some() {
            " (kept data connections)"
        } else {
            ""
        };
        let text = if kind == UploadKind::Unique {
            format!("FILE: {}", v.display())
        } else {
            format!(
                "Ready to receive {} on {n} connection(s){how}.",
                v.display()
            )
        };
        self.reply(150, text).await?;
        // A framed upload on several connections negotiated with MULT
        // starts once most are in, as a download does: the receiver takes
        // the others as they come (a lost SYN costs its connection a
        // second). Without MULT the client's count is not known here.
        let early = framed && n > 1 && self.mult_set;
        let (conns, grow, joining) = match cached {
            Some(c) => (c, None, live::Joining::default()),
            None => match self.open_data(n, false, early).await? {
                Some(opened) => opened,
                None => return Ok(()),
            },
        };
        let started = conns.len();
        let progress: Progress = Arc::new(AtomicU64::new(0));
        let prog = progress.clone();
        // The limit is on the file an upload leaves, not its bytes alone:
        // what REST skipped and what APPE appends to count, or a REST past
        // the limit (a sparse file) and APPE after APPE would grow a file
        // without bound. The checks below count this upload's bytes
        // against what is left.
        let limit = self.cfg.max_upload_size.map(|m| m.saturating_sub(offset));
        self.upload_limit = limit;
        let (task, lv) = if !framed {
            // Stopped by `halt`, which waits for its file writes.
            let stop = CancellationToken::new();
            self.stop_upload = Some(stop.clone());
            let task = tokio::spawn(async move {
                let conn = conns.into_iter().next().ok_or_else(|| {
                    TransferError::Network(std::io::Error::other("no data connection"))
                })?;
                let b = transfer::recv_stream(file, offset, conn, ascii, prog, stop, limit).await?;
                // The size an xftp client announced (ALLO after OPTS MULT
                // ENDGAME): a clean close before it is a client that died,
                // not the end of the file.
                if let Some(size) = exact.filter(|&s| s != b) {
                    return Err(TransferError::Network(std::io::Error::other(format!(
                        "the data connection ended after {b} of the {size} bytes announced (ALLO); nothing was stored"
                    ))));
                }
                upload.commit().map_err(TransferError::Storage)?;
                Ok((b, 1, Vec::new()))
            });
            (task, None)
        } else {
            let meters = MeterSet::new();
            let conns: Vec<_> = conns.into_iter().map(|c| meters.wrap(c)).collect();
            let receiver = match endgame {
                Some(size) => Receiver::file_endgame(
                    Arc::new(file),
                    size,
                    xftp_stripe::ranges::RangeSet::new(),
                    conns,
                ),
                // Read to each connection's EOD and no further: the client
                // may send the next file on them (data channel caching).
                None => Receiver::file_kept(Arc::new(file), None, conns),
            };
            let ctl = live::Ctl::Recv(receiver.control());
            let mut lv = self.live(meters, ctl, grow, started);
            lv.join_rest(joining, n - started);
            if !self.mult_set {
                // A GridFTP client opens as many connections as it likes:
                // more than we take (`accept_any` stops at the maximum)
                // would wait in the listen queue for ever. With MULT the
                // count is negotiated, and an adaptive sender's EOF counts
                // every connection it ever used, retired ones too, which
                // may add up to more than the maximum at any one time.
                receiver
                    .control()
                    .limit_connections(u64::from(self.cfg.max_streams.max(1)));
                lv.accept_any();
            }
            let task = tokio::spawn(async move {
                let (r, kept) = receiver.finish_kept().await?;
                if let Some(max) = limit.filter(|m| r.bytes > *m) {
                    return Err(TransferError::TooLarge(max));
                }
                upload.commit().map_err(TransferError::Storage)?;
                let kept = kept.into_iter().map(|c| c.into_inner()).collect();
                Ok((r.bytes, r.streams.len(), kept))
            });
            (task, Some(lv))
        };
        let out = match self.run_transfer(task, progress, lv).await? {
            Outcome::Done((b, k, kept)) => {
                self.cached = kept;
                Outcome::Done((b, k))
            }
            // REST+STOR writes in place, and what it wrote before the limit
            // stays (it is how a stock client resumes): not "nothing".
            Outcome::Failed(TransferError::TooLarge(max)) if kind == UploadKind::Resume => {
                Outcome::Failed(TransferError::TooLargeKept { max, from: rest })
            }
            Outcome::Failed(e) => Outcome::Failed(e),
            Outcome::Aborted => Outcome::Aborted,
        };
        // STOU's name again, for clients that show only the final reply.
        let named = if kind == UploadKind::Unique {
            format!(" FILE: {}", v.display())
        } else {
            String::new()
        };
        self.finish(out, |(b, k)| {
            format!("Transfer complete ({b} bytes on {k} connection(s)).{named}")
        })
        .await
    }

    /// Where an upload to `v` writes: the name itself (`in_place`: APPE,
    /// REST+STOR, resumable STOR, which follow a link, so its target is
    /// checked to be inside the root) or a name to rename onto (STOR,
    /// replacing a link, never its target). `None` after a 553 reply
    /// (RFC 959: file name not allowed; a missing directory, outside the
    /// root, a directory).
    async fn upload_target(
        &mut self,
        v: &VPath,
        in_place: bool,
    ) -> std::io::Result<Option<PathBuf>> {
        let target = if in_place {
            self.root.in_place(v)
        } else {
            self.root.creatable(v)
        };
        match target {
            Ok(p) if p.is_dir() => {
                self.reply(553, format!("{}: Is a directory.", v.display()))
                    .await?;
                Ok(None)
            }
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                let (_, t) = fs_reply(&e);
                self.reply(553, format!("{}: {t}.", v.display())).await?;
                Ok(None)
            }
        }
    }

    /// SITE RANGES path: what a resumable upload's partial holds.
    async fn site_ranges(&mut self, path: &str) -> std::io::Result<()> {
        let Some((v, p)) = self.existing(path.as_bytes()).await? else {
            return Ok(());
        };
        match crate::resumable::read(&p) {
            Ok(Some((m, r))) => {
                let list: Vec<(u64, u64)> = r.iter().collect();
                self.reply(
                    213,
                    format!(
                        "size={} mtime={} ranges={}",
                        m.size,
                        m.mtime,
                        xftp_proto::command::format_ranges(&list)
                    ),
                )
                .await
            }
            Ok(None) => {
                self.reply(
                    550,
                    format!("{}: no resumable upload recorded.", v.display()),
                )
                .await
            }
            Err(e) => self.reply(451, io_said(&v, &e)).await,
        }
    }

    /// STOR after SITE RESUMABLE: written in place into the named file
    /// (a client's temporary name), kept with its record on failure; with
    /// REST ranges, only the rest arrives.
    async fn store_resumable(
        &mut self,
        arg: &[u8],
        meta: crate::resumable::Meta,
        have: Option<xftp_stripe::ranges::RangeSet>,
        allo: Option<u64>,
    ) -> std::io::Result<()> {
        use crate::resumable;
        let Some(v) = self.write_target(arg).await? else {
            return Ok(());
        };
        let Some(target) = self.upload_target(&v, true).await? else {
            return Ok(());
        };
        if !self.framed() || self.ttype == TransferType::Ascii {
            return self
                .reply(
                    504,
                    "Resumable uploads need MODE E (or MULT > 1) and TYPE I.",
                )
                .await;
        }
        if let Some(max) = self.cfg.max_upload_size.filter(|m| meta.size > *m) {
            return self.reply(552, too_large(max)).await;
        }
        // The record goes beside the file: never over a file of the user's.
        let record = resumable::record_path(&target);
        if std::fs::symlink_metadata(&record).is_ok()
            && !matches!(resumable::read(&target), Ok(Some(_)))
        {
            return self
                .reply(
                    553,
                    format!(
                        "{}.ranges exists and is not a resumable upload's record: upload under another name.",
                        v.display()
                    ),
                )
                .await;
        }
        // One writer per partial: an older upload of it still running here
        // (its client gone, unseen yet) records what it holds and stops.
        let Some(hold) = self
            .shared
            .partials
            .take(&target, resumable::TAKE_OVER_WAIT)
            .await
        else {
            return self
                .reply(
                    450,
                    format!(
                        "{}: an earlier upload of it is still being written here; try again in a moment.",
                        v.display()
                    ),
                )
                .await;
        };
        // Everything on disk is kept in the record, also what an older
        // upload stored after the client asked SITE RANGES.
        let mut on_disk = None;
        if let Some(h) = &have {
            // The ranges must be what this server recorded, of this source.
            let ok = match resumable::read(&target) {
                Ok(Some((m, r))) => {
                    let ok = m == meta
                        && h.iter()
                            .all(|(a, b)| r.at_or_after(a).is_some_and(|(s, e)| s <= a && b <= e));
                    on_disk = Some(r);
                    ok
                }
                _ => false,
            };
            if !ok {
                return self
                    .reply(
                        554,
                        format!(
                            "{}: the ranges are not what this partial upload holds (ask SITE RANGES).",
                            v.display()
                        ),
                    )
                    .await;
            }
        }
        if !self.data_planned().await? {
            return Ok(());
        }
        let file = self.root.open_in(
            &target,
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(have.is_none()),
            0,
        );
        let file = match file {
            Ok(f) => f,
            Err(e) => return self.reply(553, io_said(&v, &e)).await,
        };
        // Bytes past the announced size are no part of the file (a larger
        // partial's tail): kept, the finished upload would hold them, and
        // the client's SIZE check fail on every run.
        if file.metadata().is_ok_and(|m| m.len() > meta.size) {
            if let Err(e) = file.set_len(meta.size) {
                return self.reply(451, io_said(&v, &e)).await;
            }
        }
        let have = have.unwrap_or_default();
        let rec = Arc::new(xftp_stripe::RecordedFile::new(
            file,
            on_disk.unwrap_or_else(|| have.clone()),
        ));
        let writer = hold.writer.clone();
        if let Err(e) = writer.checkpoint(&rec, &target, meta) {
            return self.reply(451, io_said(&v, &e)).await;
        }
        let n = self.streams as usize;
        self.reply(
            150,
            format!(
                "Ready to receive {} on {n} connection(s), resumable ({} of {} bytes in place).",
                v.display(),
                have.covered(),
                meta.size
            ),
        )
        .await?;
        // Early, as in `receive`.
        let early = n > 1 && self.mult_set;
        // A newer upload of the partial may take over while this one still
        // waits for its connections (its client gone).
        let stop = writer.stop.clone();
        let opened = tokio::select! {
            o = self.open_data(n, false, early) => o?,
            () = stop.cancelled() => {
                return self
                    .reply(426, "Transfer aborted: a newer upload of this file took over.")
                    .await;
            }
        };
        let Some((conns, grow, joining)) = opened else {
            return Ok(());
        };
        let started = conns.len();
        let progress: Progress = Arc::new(AtomicU64::new(0));
        let meters = MeterSet::new();
        let conns: Vec<_> = conns.into_iter().map(|c| meters.wrap(c)).collect();
        let dst: Arc<dyn xftp_stripe::WriteAt> = rec.clone();
        // With ALLO of the whole size, the client's endgame (see `receive`);
        // the copies are checked against the partial's bytes.
        let receiver = if allo == Some(meta.size) {
            Receiver::file_endgame(dst, meta.size, have, conns)
        } else {
            Receiver::file_resume(dst, Some(meta.size), have, conns)
        };
        let ctl = live::Ctl::Recv(receiver.control());
        let mut lv = self.live(meters, ctl, grow, started);
        lv.join_rest(joining, n - started);
        if !self.mult_set {
            receiver
                .control()
                .limit_connections(u64::from(self.cfg.max_streams.max(1)));
            lv.accept_any();
        }
        let (rec2, path2, writer2) = (rec.clone(), target.clone(), writer.clone());
        // Aborted with the transfer task, however that ends.
        let checkpoints = AbortOnDrop(tokio::spawn(async move {
            let mut t = tokio::time::interval(resumable::CHECKPOINT_EVERY);
            t.tick().await;
            loop {
                t.tick().await;
                let (r, p, w) = (rec2.clone(), path2.clone(), writer2.clone());
                let _ = tokio::task::spawn_blocking(move || w.checkpoint(&r, &p, meta)).await;
            }
        }));
        // Stopped by `halt` (the session ends, ABOR) or by a newer upload
        // of the same partial: what arrived is recorded first.
        self.stop_upload = Some(stop.clone());
        let task = tokio::spawn(async move {
            // Let go (dropped) only after the last record below.
            let _hold = hold;
            let r = tokio::select! {
                r = receiver.finish() => r,
                () = stop.cancelled() => Err(xftp_stripe::StripeError::Aborted(
                    if writer.taken_over.load(std::sync::atomic::Ordering::SeqCst) {
                        "a newer upload of this file took over".into()
                    } else {
                        "the upload was stopped".into()
                    },
                )),
            };
            drop(checkpoints);
            let target2 = target.clone();
            match r {
                Ok(r) => {
                    // Recorded whole, not removed: should the 226 not reach
                    // the client, its next run finds nothing missing instead
                    // of no record (and a fresh start). RNTO and DELE of the
                    // partial remove the record.
                    writer
                        .checkpoint(&rec, &target2, meta)
                        .map_err(TransferError::Storage)?;
                    xftp_stripe::remove_stale_temps(&resumable::record_path(&target2));
                    Ok((r.bytes, r.streams.len()))
                }
                Err(e) => {
                    // What arrived stays, for the next attempt.
                    let _ = tokio::task::spawn_blocking(move || {
                        writer.checkpoint(&rec, &target2, meta)
                    })
                    .await;
                    Err(e.into())
                }
            }
        });
        let out = self.run_transfer(task, progress, Some(lv)).await?;
        self.finish(out, |(b, k)| {
            format!("Transfer complete ({b} bytes on {k} connection(s)).")
        })
        .await
    }

    // ---- listings ----

    async fn build_listing(
        &self,
        kind: ListKind,
        arg: Option<Vec<u8>>,
    ) -> Result<(Vec<u8>, Unlisted), (u16, String)> {
        // `ls` options (`LIST -la`) are accepted and ignored: words of
        // letters after a `-`, unless the argument names an entry (a
        // directory called `-ldir`), which is listed.
        let names_entry = |a: &[u8]| self.vpath(a).is_ok_and(|v| self.root.existing(&v).is_ok());
        let arg = arg.map(|a| {
            if names_entry(&a) {
                return a;
            }
            let mut a: &[u8] = &a;
            loop {
                let end = a.iter().position(|b| *b == b' ').unwrap_or(a.len());
                let word = &a[..end];
                let flags = word.len() > 1
                    && word[0] == b'-'
                    && word[1..].iter().all(u8::is_ascii_alphanumeric);
                if !flags {
                    break;
                }
                a = &a[end..];
                while a.first() == Some(&b' ') {
                    a = &a[1..];
                }
            }
            a.to_vec()
        });
        let arg = arg.filter(|a| !a.is_empty());
        let v = match &arg {
            Some(a) => self.vpath(a)?,
            None => self.cwd.clone(),
        };
        let writable = self.may_write();
        let root = self.root.clone();
        let real = match self.root.existing(&v) {
            Ok(r) => r,
            Err(e) => {
                // `NLST *.txt` (ftp(1)'s mget) and `LIST dir/a?`: a last
                // component with wildcards that names nothing is matched
                // against its directory's names, as a shell (and vsftpd)
                // would. Only there: no wildcards in directories above, no
                // recursion.
                let glob = match (&arg, v.file_name()) {
                    (Some(a), Some(last)) if !matches!(kind, ListKind::Mlsd(_)) => {
                        wildcard(last).map(|p| (p, a.clone()))
                    }
                    _ => None,
                };
                let Some((pattern, a)) = glob else {
                    let (c, t) = fs_reply(&e);
                    return Err((c, format!("{}: {t}.", v.display())));
                };
                let dir = self.root.existing(&v.parent()).map_err(|e| {
                    let (c, t) = fs_reply(&e);
                    (c, format!("{}: {t}.", v.parent().display()))
                })?;
                // Names come back as the pattern was given: `d/*.txt`
                // lists `d/a.txt`, which RETR takes as it is.
                let prefix = match a.iter().rposition(|b| *b == b'/') {
                    Some(i) => a[..=i].to_vec(),
                    None => Vec::new(),
                };
                let shown = v.display();
                return tokio::task::spawn_blocking(move || {
                    matching(&root, &dir, kind, writable, &pattern, &prefix)
                })
                .await
                .map_err(|e| (451, e.to_string()))?
                .map_err(|e| (550, format!("{shown}: {e}")));
            }
        };
        // A file named by the argument is listed as it was named
        // (`NLST d1/a` gives `d1/a`, as `NLST d1/a*` does), so that a
        // client fetching what the listing says gets that file.
        let named = arg.clone();
        tokio::task::spawn_blocking(move || listing(&root, &real, kind, writable, named.as_deref()))
            .await
            .map_err(|e| (451, e.to_string()))?
            .map_err(|e| (550, format!("{}: {e}", v.display())))
    }

    async fn listing(&mut self, kind: ListKind, arg: Option<Vec<u8>>) -> std::io::Result<()> {
        let (body, unlisted) = match self.build_listing(kind, arg).await {
            Ok(b) => b,
            Err((code, text)) => {
                // A directory that cannot be listed also uses up the data plan.
                self.data = DataPlan::None;
                return self.reply(code, text).await;
            }
        };
        if self.mode_e {
            return self.listing_framed(body, unlisted).await;
        }
        if !self.data_planned().await? {
            return Ok(());
        }
        self.reply(150, "Here comes the directory listing.").await?;
        let Some((conns, _, _)) = self.open_data(1, true, false).await? else {
            return Ok(());
        };
        let progress: Progress = Arc::new(AtomicU64::new(0));
        let prog = progress.clone();
        let task = tokio::spawn(async move {
            let mut conns = conns;
            let Some(c) = conns.pop() else {
                return Err(TransferError::Network(std::io::Error::other(
                    "no data connection",
                )));
            };
            let mut c = transfer::ResetIfCut::new(c);
            c.write_all(&body).await.map_err(TransferError::Network)?;
            c.finish().await.map_err(TransferError::Network)?;
            prog.store(body.len() as u64, Ordering::Relaxed);
            Ok(())
        });
        let out = self.run_transfer(task, progress, None).await?;
        self.finish(out, |_| match unlisted.describe() {
            Some(u) => format!("Directory send OK; {u}"),
            None => "Directory send OK.".to_string(),
        })
        .await
    }

    /// A listing in MODE E, as GridFTP sends it (`globus-url-copy -r
    /// -fast` reads MLSD so): MODE E blocks on the transfer's connections,
    /// kept ones reused, each ending with its EOD and kept for the next
    /// transfer (data channel caching), as a download's are.
    async fn listing_framed(&mut self, body: Vec<u8>, unlisted: Unlisted) -> std::io::Result<()> {
        let n = self.streams.max(1) as usize;
        let cached = self.take_cached(n);
        if cached.is_none() && !self.data_planned().await? {
            return Ok(());
        }
        let how = if cached.is_some() { "kept" } else { "new" };
        self.reply(
            150,
            format!("Here comes the directory listing (MODE E, {how} data connections)."),
        )
        .await?;
        let conns = match cached {
            Some(c) => c,
            None => match self.open_data(n, true, false).await? {
                Some((c, _, _)) => c,
                None => return Ok(()),
            },
        };
        let len = body.len() as u64;
        let cfg = SendConfig {
            record_size: xftp_stripe::record_size_for(len, n, self.cfg.record_size),
            schedule: Schedule::Dynamic,
            keep_open: true,
            endgame: false,
            source_check: None,
        };
        let sender = Sender::file(Arc::new(xftp_stripe::MemFile::from(body)), len, conns, &cfg);
        let progress: Progress = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(async move { Ok(sender.finish_kept().await?) });
        let out = match self.run_transfer(task, progress, None).await? {
            Outcome::Done((r, kept)) => {
                self.cached = kept;
                Outcome::Done(r)
            }
            Outcome::Failed(e) => Outcome::Failed(e),
            Outcome::Aborted => Outcome::Aborted,
        };
        self.finish(out, |_| match unlisted.describe() {
            Some(u) => format!("Directory send OK; {u}"),
            None => "Directory send OK.".to_string(),
        })
        .await
    }

    async fn mlst(&mut self, arg: Option<Vec<u8>>) -> std::io::Result<()> {
        let v = match arg {
            Some(a) => match self.vpath(&a) {
                Ok(v) => v,
                Err((c, t)) => return self.reply(c, t).await,
            },
            None => self.cwd.clone(),
        };
        let md = match self.root.existing(&v).and_then(|p| self.root.stat(&p)) {
            Ok(m) => m,
            Err(e) => {
                let (c, t) = fs_reply(&e);
                return self.reply(c, format!("{}: {t}.", v.display())).await;
            }
        };
        // A link to a directory is a link, as MLSD lists it (a client's
        // `rm -r` of it must not recurse into what it leads to).
        let link = md.is_dir()
            && v.file_name().is_some()
            && self
                .root
                .entry(&v)
                .ok()
                .and_then(|p| std::fs::symlink_metadata(p).ok())
                .is_some_and(|m| m.file_type().is_symlink());
        let kind = link.then_some("OS.unix=symlink");
        let facts = self
            .facts
            .select(fs::mlsx_facts(&md, self.may_write(), kind));
        let lines = vec![
            format!("Listing {}", v.display()),
            format!("{facts}{}", v.display()),
            "End".to_string(),
        ];
        self.send(&Reply::multi(250, lines)).await
    }
}

/// Entries a listing leaves out, counted so that its final reply can say
/// so (docs/protocol.md, "Listings"): a client copying a tree learns that
/// its copy lacks them.
#[derive(Debug, Clone, Copy, Default)]
struct Unlisted {
    /// Names holding CR or LF, which a CRLF listing cannot carry.
    line_break: usize,
    /// Symbolic links leading outside the root, or to nothing.
    links: usize,
    /// Entries the server could not read (no permission, a path too long
    /// for the system, an I/O error): a tree copied from the listing lacks
    /// them, and an xftp client fails it.
    unreadable: usize,
}

impl Unlisted {
    /// `N entries not listed (...).`, or nothing when none were.
    fn describe(&self) -> Option<String> {
        let n = self.line_break + self.links + self.unreadable;
        if n == 0 {
            return None;
        }
        let mut why = Vec::new();
        if self.line_break > 0 {
            why.push(format!("{} with a line break in the name", self.line_break));
        }
        if self.links > 0 {
            why.push(format!(
                "{} symbolic link(s) leading outside the root or to nothing",
                self.links
            ));
        }
        if self.unreadable > 0 {
            why.push(format!(
                "{} the server could not read (no permission, a path too long, or an I/O error)",
                self.unreadable
            ));
        }
        let entries = if n == 1 { "entry" } else { "entries" };
        Some(format!("{n} {entries} not listed ({}).", why.join(", ")))
    }
}

#[derive(Debug, Clone, Copy)]
enum ListKind {
    List,
    Nlst,
    /// With the facts selected.
    Mlsd(fs::FactSet),
}

/// How long a download waits for its other data connections once the
/// first is in (`data::open`'s `early`). Connections opened together
/// arrive within a few milliseconds of each other; one whose SYN was
/// lost comes a second later, and joins the running transfer then.
const EARLY_START: Duration = Duration::from_millis(250);

/// Smallest file sent with the endgame (see `OPTS MULT ENDGAME`). On a
/// link whose queue holds two packets, 2 MiB over 8 connections took
/// 7.4-8.0 s, 15 s or 29 s without it (a connection's timeouts doubling
/// with the file's last records on it) and 7.8-11.2 s with it; a single
/// file on clean paths paid nothing measurable (docs/tuning.md).
const ENDGAME_MIN: u64 = 1 << 20;

/// A shell pattern (`*`, `?`, `[...]`) where `name` holds one.
fn wildcard(name: &[u8]) -> Option<glob::Pattern> {
    if !name.iter().any(|b| matches!(b, b'*' | b'?' | b'[')) {
        return None;
    }
    glob::Pattern::new(&xftp_proto::name::decode(name)).ok()
}

/// The entries of `dir` whose names match `pattern` (a shell's rules:
/// `*` does not match a leading dot), as [`listing`] gives them, each
/// name after `prefix`. None matching is 550, as a missing name is.
fn matching(
    root: &fs::Root,
    dir: &std::path::Path,
    kind: ListKind,
    writable: bool,
    pattern: &glob::Pattern,
    prefix: &[u8],
) -> std::io::Result<(Vec<u8>, Unlisted)> {
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "No such file or directory",
        ));
    }
    let keep = |name: &[u8]| pattern.matches_with(&xftp_proto::name::decode(name), opts);
    let (body, unlisted) = listing_where(root, dir, kind, writable, &keep, prefix, None)?;
    if body.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "No such file or directory (nothing matches)",
        ));
    }
    Ok((body, unlisted))
}

fn listing(
    root: &fs::Root,
    real: &std::path::Path,
    kind: ListKind,
    writable: bool,
    named: Option<&[u8]>,
) -> std::io::Result<(Vec<u8>, Unlisted)> {
    listing_where(root, real, kind, writable, &|_| true, b"", named)
}

/// [`listing`] of the entries whose names `keep` takes, each listed as
/// `prefix` and its name.
fn listing_where(
    root: &fs::Root,
    real: &std::path::Path,
    kind: ListKind,
    writable: bool,
    keep: &dyn Fn(&[u8]) -> bool,
    prefix: &[u8],
    named: Option<&[u8]>,
) -> std::io::Result<(Vec<u8>, Unlisted)> {
    use std::os::unix::ffi::OsStrExt;
    // Read through the directory as checked ([`fs::Root::stat`]).
    let pinned = root.pin(real).map_err(FsError::into_io)?;
    let at = fs::proc_path(std::os::fd::AsFd::as_fd(&pinned));
    let md = std::fs::metadata(&at)?;
    let mut out = Vec::new();
    let mut unlisted = Unlisted::default();
    // `link_to`: a symbolic link to a directory, and where it leads.
    let mut push = |name: &[u8], md: &std::fs::Metadata, link_to: Option<&[u8]>| {
        let shown;
        let name = if prefix.is_empty() {
            name
        } else {
            shown = [prefix, name].concat();
            &shown[..]
        };
        match kind {
            ListKind::List => out.extend_from_slice(&fs::list_line(name, md, link_to)),
            ListKind::Nlst => out.extend_from_slice(name),
            ListKind::Mlsd(facts) => {
                let kind = link_to.map(|_| "OS.unix=symlink");
                out.extend_from_slice(facts.select(fs::mlsx_facts(md, writable, kind)).as_bytes());
                out.extend_from_slice(name);
            }
        }
        out.extend_from_slice(b"\r\n");
    };
    if !md.is_dir() {
        if matches!(kind, ListKind::Mlsd(_)) {
            return Err(std::io::Error::other("Not a directory"));
        }
        let name = match named {
            Some(n) => n.to_vec(),
            None => real
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .unwrap_or_default(),
        };
        push(&name, &md, None);
        return Ok((out, unlisted));
    }
    let mut entries = Vec::new();
    for e in std::fs::read_dir(&at)? {
        match e {
            Ok(e) => entries.push(e),
            Err(_) => unlisted.unreadable += 1,
        }
    }
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let name = name.as_bytes();
        // Uploads in progress (see `Upload`) are not listed.
        if fs::is_upload_temp(name) || !keep(name) {
            continue;
        }
        if name.contains(&b'\n') || name.contains(&b'\r') {
            // Cannot be represented in a CRLF listing.
            unlisted.line_break += 1;
            continue;
        }
        // An entry whose path is longer than the system takes (PATH_MAX)
        // could be listed through the held directory but not served by
        // its path: left out and counted, as one that cannot be read.
        if real.as_os_str().len() + 1 + name.len() >= libc::PATH_MAX as usize {
            unlisted.unreadable += 1;
            continue;
        }
        let Ok(lmd) = std::fs::symlink_metadata(e.path()) else {
            unlisted.unreadable += 1;
            continue;
        };
        // Links are listed only if they stay inside the root; dangling or
        // escaping links are left out. A link to a file is listed as the
        // file. A link to a directory is listed as a link (`l`,
        // `OS.unix=symlink`), as ls and vsftpd do: a client's `rm -r`
        // then removes the link, not what it leads to (lftp's did, when it
        // read `d`), and a tree walk does not loop through `x -> .`.
        if !lmd.file_type().is_symlink() {
            push(name, &lmd, None);
            continue;
        }
        let (target, md) = match std::fs::canonicalize(e.path()) {
            Ok(t) if t.starts_with(root.path()) => match root.stat(&t) {
                Ok(m) => (t, m),
                Err(_) => {
                    unlisted.links += 1;
                    continue;
                }
            },
            _ => {
                unlisted.links += 1;
                continue;
            }
        };
        if md.is_dir() {
            // What the link says where it stays below its directory (a
            // mirror then makes the same link), else the target's path in
            // the root: never a path on the server's disk.
            let raw = std::fs::read_link(e.path()).ok().filter(|r| {
                r.is_relative()
                    && r.components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)))
            });
            let shown = match raw {
                Some(r) => r.as_os_str().as_bytes().to_vec(),
                None => {
                    let inside = target.strip_prefix(root.path()).unwrap_or(&target);
                    let mut v = b"/".to_vec();
                    v.extend_from_slice(inside.as_os_str().as_bytes());
                    v
                }
            };
            push(name, &md, Some(&shown));
        } else {
            push(name, &md, None);
        }
    }
    Ok((out, unlisted))
}

/// A command line as the log shows it: whatever follows a PASS or ACCT
/// verb is masked, however it is separated from it (a tab, a colon, a
/// leading space: a client's odd line is still a password).
fn loggable(line: &[u8]) -> std::borrow::Cow<'_, str> {
    let t = line.trim_ascii_start();
    let head = t.get(..4).map(<[u8]>::to_ascii_uppercase);
    match head.as_deref() {
        Some(v @ (b"PASS" | b"ACCT")) => {
            std::borrow::Cow::Owned(format!("{} ****", String::from_utf8_lossy(v)))
        }
        _ => String::from_utf8_lossy(line),
    }
}
