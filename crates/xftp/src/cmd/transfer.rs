//! `xftp get`, `xftp put`, `xftp ls`: thin shells over `xftp-client`.
//!
//! Each command computes a [`Summary`] first and renders it after, as text
//! on stderr or as one JSON object on stdout (`--json`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use xftp_client::tree::TreeReport;
use xftp_client::xftp_tune::{self, Cache, PathRecord, TuneConfig};
use xftp_client::{
    AutoConfig, Client, ClientConfig, ClientError, DataMode, FtpUrl, Timeline, TransferReport,
    Verify,
};

/// Largest `-p` accepted.
const MAX_PARALLEL: u32 = 64;

/// How long cached path records are used.
const CACHE_AGE: Duration = Duration::from_secs(24 * 3600);

/// `-p`: chosen automatically, or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    /// Choose and adapt (the default).
    Auto,
    /// Exactly this many (1 = plain FTP).
    Fixed(u32),
}

/// Options of get and put.
#[derive(clap::Args, Debug)]
pub struct TransferArgs {
    /// Data connections: `auto` (the default: start from the RTT and the
    /// cached history of this destination, then add or shed connections
    /// while the transfer runs) or a fixed number 1..=64 (1 = plain FTP).
    #[arg(short = 'p', long = "parallel", value_name = "N|auto", default_value = "auto", value_parser = parse_parallel, allow_negative_numbers = true)]
    parallel: Parallel,
    /// TCP buffer size of the data sockets at both ends (bytes, or with
    /// k/M/G; `auto` = kernel autotuning, the default). Sent to the server
    /// as SITE BUFSIZE.
    #[arg(long, value_name = "BYTES", default_value = "auto", value_parser = parse_bufsize_arg, allow_negative_numbers = true)]
    bufsize: BufArg,
    /// Static partitioning (PSockets): the file is cut into N equal parts,
    /// one per connection (put), or the server is asked to do so (get,
    /// OPTS MULT STATIC). Needs a fixed -p N.
    #[arg(long = "static")]
    static_split: bool,
    /// Check the copy end to end: the server computes a checksum (CKSM or
    /// HASH) of its file, xftp one of the local file, and a mismatch fails
    /// the command (a download is not put in place; an upload stays
    /// under a temporary name until it matched, and is deleted if not).
    /// --verify=ALG: sha256, sha512, sha1, md5, crc32c, adler32 or crc32; without
    /// it, the strongest the server offers.
    #[arg(long, value_name = "ALG", num_args = 0..=1, require_equals = true, default_missing_value = "auto", value_parser = parse_verify)]
    verify: Option<Verify>,
    /// Move at most this many bytes per second, all connections together
    /// (k, M, G: powers of 1024), as curl's --limit-rate.
    #[arg(long, value_name = "BYTES", value_parser = parse_rate)]
    limit_rate: Option<u64>,
    /// With -r: files in flight at once, each on its own session (half of
    /// them, at most 4, take the large files with the -p settings, the
    /// others the small ones with one connection each).
    /// (Default 8; 1-1024.)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: Option<u16>,
    /// Copy a directory tree: get -r URL/dir/ [LOCALDIR], put -r LOCALDIR
    /// URL/dir/. Times and permission bits are kept where the server
    /// allows (MLSD; MFMT, SITE CHMOD); symbolic links are left out.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// No progress bar, no summary line and no notices such as "server
    /// does not support MULT" (errors are still printed).
    #[arg(short, long)]
    quiet: bool,
    /// Print a JSON object on stdout every second while data moves
    /// (`"type":"progress"`: bytes, total, rate, streams), for programs
    /// that drive xftp; with --json the summary follows as the last line.
    #[arg(long)]
    json_progress: bool,
    /// After a failure that may pass (a reset or timed-out connection, a
    /// cut transfer, a server that refused the connection or answered
    /// 4yz, such as 421, 425 or 426, but not 452), run the transfer
    /// again, up to N more times. With -c each run moves only what is missing; without it, a
    /// file starts over. With -r, only the files that failed so go again.
    #[arg(long, value_name = "N", default_value_t = 0)]
    retries: u32,
    /// Seconds before a run again (--retries). While the server cannot be
    /// reached (a refused or timed-out connection, no greeting, 421) each
    /// wait is twice the one before, at most 60 s; after a run that
    /// reached it, the wait is this again.
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_wait)]
    retry_wait: Duration,
}

fn parse_wait(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|x| Duration::try_from_secs_f64(x).ok())
        .filter(|d| *d <= MAX_RETRY_WAIT)
        .ok_or_else(|| format!("{s:?} is not a number of seconds from 0 to 60"))
}

/// The longest wait between two runs (`--retry-wait` doubles up to it).
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);

/// `--retries`: the runs of one transfer.
struct Retry {
    left: u32,
    /// `--retry-wait`.
    base: Duration,
    /// The wait after the next failure to reach the server.
    wait: Duration,
    runs: u32,
    resume: bool,
}

impl Retry {
    fn new(t: &TransferArgs, resume: bool) -> Retry {
        Retry {
            left: t.retries,
            base: t.retry_wait,
            wait: t.retry_wait,
            runs: 1,
            resume,
        }
    }

    /// Whether a run is left for a failure that may pass.
    fn due(&self) -> bool {
        self.left > 0
    }

    /// After a run that failed with `e`: whether to run again (having
    /// said why and waited).
    async fn again(&mut self, what: &str, e: &anyhow::Error) -> bool {
        match e.downcast_ref::<MayPass>() {
            Some(m) if self.due() => {
                let (why, unreachable) = (m.short.clone(), m.unreachable);
                self.next(what, &why, unreachable).await;
                true
            }
            _ => false,
        }
    }

    /// Say why the last run failed and when the next starts, and wait:
    /// longer each time while the server cannot be reached
    /// (`unreachable`), else `--retry-wait` (the server answered; the
    /// path or a connection failed).
    async fn next(&mut self, what: &str, why: &str, unreachable: bool) {
        if !unreachable {
            self.wait = self.base;
        }
        self.runs += 1;
        self.left -= 1;
        let how = if self.resume {
            "only what is missing (-c)"
        } else {
            "from the start: -c would keep what arrived"
        };
        eprintln!(
            "xftp {what}: {why} — trying again in {:.1} s (run {} of at most {}; {how})",
            self.wait.as_secs_f64(),
            self.runs,
            self.runs + self.left,
        );
        tokio::time::sleep(self.wait).await;
        if unreachable {
            self.wait = (self.wait * 2).min(MAX_RETRY_WAIT);
        }
    }

    /// Run `once` until it succeeds, fails in a way that would not pass,
    /// or the runs are spent; the summary counts the runs.
    async fn runs_of<F, Fut>(&mut self, what: &str, mut once: F) -> anyhow::Result<Summary>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Summary>>,
    {
        loop {
            match once().await {
                Err(e) if self.again(what, &e).await => {}
                r => return r.map(|s| s.runs(self.runs)).map_err(|e| self.last(e)),
            }
        }
    }

    /// The error of the last run.
    fn last(&self, e: anyhow::Error) -> anyhow::Error {
        if self.runs > 1 {
            anyhow::anyhow!("{e:#} (the last of {} runs)", self.runs)
        } else {
            e
        }
    }
}

/// An error that may pass when the transfer runs again
/// ([`ClientError::is_transient`]); shown as the error it holds, and in
/// the line that announces the next run as the client's error alone
/// (`short`: the hints of what to do are for the last run).
#[derive(Debug)]
struct MayPass {
    shown: anyhow::Error,
    short: String,
    /// [`ClientError::server_unreachable`].
    unreachable: bool,
}

impl std::fmt::Display for MayPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.shown)
    }
}

impl std::error::Error for MayPass {}

/// What to say of `e` when it may pass, and whether the server could not
/// be reached (`None`: it would not pass).
fn short_if_transient(e: &ClientError) -> Option<(String, bool)> {
    e.is_transient()
        .then(|| (e.to_string(), e.server_unreachable()))
}

/// `shown`, marked as an error that may pass when `short` says so.
fn mark(shown: anyhow::Error, short: Option<(String, bool)>) -> anyhow::Error {
    match short {
        Some((short, unreachable)) => anyhow::Error::new(MayPass {
            shown,
            short,
            unreachable,
        }),
        None => shown,
    }
}

/// `-v` as given, for the per-stream rates of the progress bar.
static VERBOSE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Remember `-v` (the progress bar adds per-stream rates).
pub fn set_verbose(v: u8) {
    VERBOSE.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The progress counters (made by `make`, when anything is shown) and
/// their display for one command.
fn progress_for(
    t: &TransferArgs,
    json: bool,
    make: fn() -> std::sync::Arc<xftp_client::Progress>,
) -> (
    Option<std::sync::Arc<xftp_client::Progress>>,
    super::progress::Mode,
) {
    let v = VERBOSE.load(std::sync::atomic::Ordering::Relaxed);
    let mode = super::progress::Mode::choose(t.quiet, json, t.json_progress, v);
    // Counted for `--json` too, so that a failure's summary can say what
    // had moved before it.
    let p = (mode.bar || mode.json || json).then(make);
    if let Some(p) = &p {
        COUNTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p.clone());
    }
    (p, mode)
}

/// The progress counters of every run of this command, read when it fails.
static COUNTED: std::sync::Mutex<Vec<std::sync::Arc<xftp_client::Progress>>> =
    std::sync::Mutex::new(Vec::new());

/// The bytes every run's data connections carried, and the last run's
/// counters.
fn counted() -> (u64, Option<xftp_client::Snapshot>) {
    let runs = COUNTED.lock().unwrap_or_else(|e| e.into_inner());
    let snaps: Vec<_> = runs.iter().map(|p| p.snapshot()).collect();
    (
        snaps.iter().map(|s| s.bytes).sum(),
        snaps.into_iter().last(),
    )
}

/// What the data connections carried before a failure: the bytes of
/// every run so far, and the last run's connections, seconds and rate.
fn fill_counted(s: &mut Summary) {
    let (bytes, last) = counted();
    s.bytes = bytes;
    if let Some(last) = last {
        s.per_stream_bytes = last.per_stream.clone();
        s.streams = last.per_stream.len();
        s.seconds = last.elapsed.as_secs_f64();
        if s.seconds > 0.0 {
            s.throughput_bps = last.bytes as f64 / s.seconds;
        }
    }
}

/// A number of bytes on the command line (`--limit-rate`,
/// `--max-upload-size`, `--record-size`): digits with k, M or G (powers of
/// 1024; `MiB` and `MB` too).
pub(crate) fn parse_byte_count(s: &str) -> Result<u64, String> {
    xftp_proto::parse_bytes(s).map_err(|e| match e {
        xftp_proto::BytesError::NotANumber => {
            format!("{s:?} is not a number of bytes (e.g. 64k, 4M, 2G: powers of 1024)")
        }
        xftp_proto::BytesError::TooLarge => format!("{s:?} is too large"),
    })
}

/// [`parse_byte_count`] within `lo..=hi` bytes (`range` says it in words).
pub(crate) fn byte_count_within(s: &str, lo: u64, hi: u64, range: &str) -> Result<u64, String> {
    let n = parse_byte_count(s)?;
    if (lo..=hi).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{s:?} is outside {range}"))
    }
}

fn parse_rate(s: &str) -> Result<u64, String> {
    match parse_byte_count(s)? {
        0 => Err(format!(
            "{s:?}: give a rate in bytes per second, e.g. 10M (leave the option out for no limit)"
        )),
        n => Ok(n),
    }
}

fn parse_verify(s: &str) -> Result<Verify, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Verify::Auto);
    }
    xftp_client::Algorithm::parse(s)
        .map(Verify::With)
        .map_err(|e| e.to_string())
}

/// Options shared by get, put and ls.
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Active mode: the server opens the data connections to us (EPRT,
    /// falling back to PORT). Default is passive (EPSV, falling back to PASV).
    #[arg(long)]
    active: bool,
    /// Active mode with one listening port per data connection (xftp MPRT).
    #[arg(long)]
    mprt: bool,
    /// Print exactly one JSON object on stdout when done.
    #[arg(long)]
    pub(crate) json: bool,
    /// Read the password from the first line of FILE (instead of the URL or
    /// the XFTP_PASSWORD environment variable).
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Seconds to wait for a TCP connection to open.
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    connect_timeout: f64,
    /// Seconds to wait for a server reply, or for a stalled data connection.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout: f64,
    /// TLS on an ftp:// URL (AUTH TLS, every data connection under PROT P),
    /// as ftpes:// does; ftps:// is implicit TLS (port 990 by default).
    #[arg(long)]
    pub(crate) tls: bool,
    /// Trust only the CA certificate(s) in this PEM file, instead of the
    /// system's.
    #[arg(long, value_name = "FILE")]
    pub(crate) cacert: Option<PathBuf>,
    /// Do not verify the server's certificate (encrypted, but anyone on
    /// the path can pose as the server).
    #[arg(long)]
    pub(crate) insecure: bool,
}

/// The TLS a command asks for: the URL's scheme, or `--tls`.
pub(crate) fn tls_setup(
    url: &FtpUrl,
    tls: bool,
    cacert: Option<&std::path::Path>,
    insecure: bool,
) -> anyhow::Result<Option<xftp_client::TlsSetup>> {
    use xftp_client::UrlTls;
    let implicit = match (url.tls, tls) {
        (UrlTls::Implicit, _) => true,
        (UrlTls::Explicit, _) | (UrlTls::None, true) => false,
        (UrlTls::None, false) => {
            if cacert.is_some() || insecure {
                anyhow::bail!(
                    "--cacert and --insecure are for TLS: use an ftpes:// or ftps:// URL, or add --tls"
                );
            }
            return Ok(None);
        }
    };
    if insecure {
        eprintln!(
            "xftp: warning: --insecure: the server's certificate is not checked; the connection is encrypted, but anyone on the path can pose as the server"
        );
    }
    if let Some(f) = cacert {
        xftp_client::xftp_tls::client::ClientTls::check_cacert(f).context("--cacert")?;
    }
    Ok(Some(xftp_client::TlsSetup {
        implicit,
        server_name: url.host.clone(),
        verify: xftp_client::xftp_tls::client::ClientTlsConfig {
            cacert: cacert.map(|p| p.to_path_buf()),
            insecure,
        },
    }))
}

/// `xftp get URL [LOCAL]`
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// ftp://[user[:password]@]host[:port]/path
    url: String,
    /// Local file or existing directory (default: the remote file name in
    /// the current directory).
    local: Option<PathBuf>,
    /// Resumable: keep a cut download's partial file (`.NAME.xftp-part`)
    /// and its record of received ranges, and fetch only what is missing
    /// when run again with -c. A source whose size or modification time
    /// changed is refused. Give -c on the first run too.
    #[arg(short = 'c', long = "continue")]
    resume: bool,
    #[command(flatten)]
    t: TransferArgs,
    #[command(flatten)]
    common: CommonArgs,
}

/// `xftp put LOCAL URL`
#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// Local file to upload.
    local: PathBuf,
    /// ftp://[user[:password]@]host[:port]/path (a path ending in / gets the
    /// local file name appended).
    url: String,
    /// Resumable (xftp servers): the file goes up as `.NAME.xftp-part`,
    /// kept by the server with a record of its ranges if the upload is
    /// cut; run again with -c to send only what is missing. Refused if the
    /// local file's size or modification time changed since. With -r:
    /// files the server holds with the same size and time are skipped.
    #[arg(short = 'c', long = "continue")]
    resume: bool,
    #[command(flatten)]
    t: TransferArgs,
    #[command(flatten)]
    common: CommonArgs,
}

/// `xftp ls URL`
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// ftp://[user[:password]@]host[:port]/dir/
    url: String,
    #[command(flatten)]
    common: CommonArgs,
}

/// What a cut or stopped download without -c leaves, and how to keep it.
pub const NOT_KEPT: &str = "what arrived was removed: with -c a cut download is kept, and the same command with -c fetches only what is missing";

impl GetArgs {
    /// What to say when the download is stopped by a signal: without -c
    /// nothing of it is kept (a tree keeps the files it completed).
    pub fn stopped_hint(&self) -> Option<&'static str> {
        (!self.resume && !self.t.recursive).then_some(NOT_KEPT)
    }

    /// Whether the summary goes out as JSON.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

impl PutArgs {
    /// Whether the summary goes out as JSON.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

impl LsArgs {
    /// Whether the summary goes out as JSON.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// The one JSON object of a get, put or ls stopped by a signal, as for any
/// other failure.
pub fn print_interrupted(why: &str, total: Duration) {
    let mut s = Summary::failed(format!("interrupted ({why})"), total);
    fill_counted(&mut s);
    if let Ok(line) = serde_json::to_string(&s) {
        out!("{line}");
    }
}

fn parse_parallel(s: &str) -> Result<Parallel, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Parallel::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_PARALLEL).contains(&n) => Ok(Parallel::Fixed(n)),
        _ => Err(format!(
            "{s:?} is not `auto` or a number of connections from 1 to {MAX_PARALLEL}"
        )),
    }
}

/// `--bufsize`: `None` is kernel autotuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufArg(pub Option<u64>);

pub(crate) fn parse_bufsize_arg(s: &str) -> Result<BufArg, String> {
    bufsize_checked(s).map(BufArg)
}

/// A buffer size as `--bufsize` and the shell's `bufsize` take it
/// (`None`: kernel autotuning); the error says why, without naming the
/// option (each caller does).
pub(crate) fn bufsize_checked(s: &str) -> Result<Option<u64>, String> {
    // The protocol's SITE BUFSIZE 0 means autotuning; typed here it is
    // more likely a slip than a wish.
    if s.trim() == "0" {
        return Err(
            "0 is no buffer size: give bytes (64k, 4M), or auto for the kernel's autotuning".into(),
        );
    }
    match xftp_proto::parse_bufsize("--bufsize", s) {
        Ok(xftp_proto::BufSize::Auto) => Ok(None),
        // What a socket can be given at all (Linux keeps at least about
        // 2 KiB, and its limits are ints): outside it, the request was
        // surely mistyped.
        Ok(xftp_proto::BufSize::Bytes(n)) if n < BUFSIZE_MIN => Err(format!(
            "{s:?} is under the 2 KiB a socket buffer holds at least (give bytes, or k/M/G: 64k, 4M)"
        )),
        Ok(xftp_proto::BufSize::Bytes(n)) if n > BUFSIZE_MAX => Err(format!(
            "{s:?} is over the 1 GiB any kernel gives a socket buffer (give bytes, or k/M/G: 64k, 4M)"
        )),
        Ok(xftp_proto::BufSize::Bytes(n)) => Ok(Some(n)),
        Err(xftp_proto::ProtoError::BadArgument { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
    }
}

/// The range of `--bufsize` (and the shell's `bufsize`).
const BUFSIZE_MIN: u64 = 2 << 10;
const BUFSIZE_MAX: u64 = 1 << 30;

/// The result of one command, rendered after the fact.
#[derive(Debug, Serialize)]
struct Summary {
    status: &'static str,
    bytes: u64,
    /// From the first data-connection command to the final reply.
    seconds: f64,
    /// From the TCP connect to the final reply.
    total_seconds: f64,
    streams: usize,
    throughput_bps: f64,
    per_stream_bytes: Vec<u64>,
    /// How the connection count was chosen and moved (get and put).
    #[serde(skip_serializing_if = "Option::is_none")]
    streams_timeline: Option<Timeline>,
    /// `--bufsize` as requested (absent: kernel autotuning).
    #[serde(skip_serializing_if = "Option::is_none")]
    bufsize_requested: Option<u64>,
    /// The smaller of SO_RCVBUF and SO_SNDBUF read back from a data socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    bufsize_in_force: Option<u64>,
    /// The server's reply to SITE BUFSIZE.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_bufsize_reply: Option<String>,
    /// Whether the control and data connections used TLS.
    tls: bool,
    /// The TLS version ("TLSv1.3"), when TLS was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_version: Option<String>,
    /// The TLS cipher suite, when TLS was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cipher: Option<String>,
    /// A resumed download (`-c`): bytes that were already in place
    /// (`bytes` counts only what this run moved).
    #[serde(skip_serializing_if = "is_zero")]
    bytes_already_present: u64,
    /// Payload bytes that arrived twice: copies of records a stuck
    /// connection held, or a lost one carried, sent again by a server in
    /// the endgame (not in `bytes`).
    #[serde(skip_serializing_if = "is_zero")]
    bytes_received_twice: u64,
    /// Payload bytes an upload sent twice: its endgame's copies of
    /// records a stuck connection held, or a lost one carried (not in
    /// `bytes`; in `per_stream_bytes`).
    #[serde(skip_serializing_if = "is_zero")]
    bytes_sent_twice: u64,
    /// `--verify`: the algorithm both ends used.
    #[serde(skip_serializing_if = "Option::is_none")]
    checksum_algorithm: Option<String>,
    /// `--verify`: the value both ends computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    listing: Option<String>,
    /// Runs of the transfer (`--retries`), when more than one.
    #[serde(skip_serializing_if = "is_one")]
    runs: u32,
}

impl Summary {
    fn ok(r: &TransferReport, total: Duration) -> Summary {
        let secs = r.elapsed.as_secs_f64();
        Summary {
            status: "ok",
            bytes: r.bytes,
            seconds: secs,
            total_seconds: total.as_secs_f64(),
            streams: r.streams(),
            throughput_bps: if secs > 0.0 {
                r.bytes as f64 / secs
            } else {
                0.0
            },
            per_stream_bytes: r.per_stream_bytes.clone(),
            streams_timeline: r.timeline.clone(),
            bufsize_requested: None,
            bufsize_in_force: None,
            server_bufsize_reply: None,
            tls: false,
            tls_version: None,
            tls_cipher: None,
            bytes_already_present: r.already,
            bytes_received_twice: r.received_twice,
            bytes_sent_twice: r.sent_twice,
            checksum_algorithm: r.checksum.as_ref().map(|c| c.algorithm.to_string()),
            checksum: r.checksum.as_ref().map(|c| c.value.clone()),
            error: None,
            listing: None,
            runs: 1,
        }
    }

    fn runs(mut self, runs: u32) -> Summary {
        self.runs = runs;
        self
    }

    fn with_tls(mut self, info: Option<xftp_client::xftp_tls::TlsInfo>) -> Summary {
        if let Some(i) = info {
            self.tls = true;
            self.tls_version = Some(i.version);
            self.tls_cipher = Some(i.cipher);
        }
        self
    }

    fn failed(msg: String, total: Duration) -> Summary {
        Summary {
            status: "error",
            bytes: 0,
            seconds: 0.0,
            total_seconds: total.as_secs_f64(),
            streams: 0,
            throughput_bps: 0.0,
            per_stream_bytes: Vec::new(),
            streams_timeline: None,
            bufsize_requested: None,
            bufsize_in_force: None,
            server_bufsize_reply: None,
            tls: false,
            tls_version: None,
            tls_cipher: None,
            bytes_already_present: 0,
            bytes_received_twice: 0,
            bytes_sent_twice: 0,
            checksum_algorithm: None,
            checksum: None,
            error: Some(msg),
            listing: None,
            runs: 1,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// [`explain`], and with `-c` what was kept for the next run (`kept`),
/// unless the error leaves nothing worth resuming: a changed source, a
/// usage error, an upload whose checksum differs.
fn explain_resumable(
    e: ClientError,
    op: Op,
    url: &FtpUrl,
    resume: bool,
    kept: Option<&str>,
) -> anyhow::Error {
    let short = short_if_transient(&e);
    // A download cut midway without -c: say what -c would have kept.
    // (Not a file that grew: -c would refuse it as changed.)
    let cut = match &e {
        // Nothing was transferred yet.
        e if e.at_login() => false,
        ClientError::Closed
        | ClientError::Timeout { .. }
        | ClientError::ControlIo(_)
        | ClientError::DataIo(_)
        | ClientError::Stripe(_)
        | ClientError::StripeFault(_) => true,
        ClientError::ShortTransfer { expected, got } => got < expected,
        e => matches!(e.reply_code(), Some(426 | 451)),
    };
    // "Kept, run it again" only where that is so and may help: a partial
    // download on the disk (`kept` is None where there is none), an
    // upload that the network cut or that may pass (not a 552 quota, a
    // 553 read-only disk: the server keeps nothing there, and the same
    // command fails the same way).
    let keeps = resume
        && kept.is_some()
        && !matches!(
            e,
            ClientError::SourceChanged { .. }
                | ClientError::Usage(_)
                | ClientError::UploadResumeUnsupported
        )
        && !(op == Op::Put && matches!(e, ClientError::ChecksumMismatch { .. }))
        && (op == Op::Get || cut || e.is_transient());
    // What happened to the bytes is said once: here, where it is known.
    let told = keeps || (cut && !resume && op == Op::Get);
    let e = explain_noting(e, op, url, !told);
    let e = if let (true, Some(kept)) = (keeps, kept) {
        anyhow::anyhow!("{e:#} — {kept}")
    } else if told {
        anyhow::anyhow!("{e:#} — {NOT_KEPT}")
    } else {
        e
    };
    mark(e, short)
}

/// Which command failed: the hint depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Get,
    Put,
    Ls,
}

/// Options that only a tree uses, given for one file: said, not ignored
/// without a word.
fn warn_tree_only(t: &TransferArgs) {
    if t.concurrency.is_some() && !t.recursive && !t.quiet {
        eprintln!("xftp: warning: --concurrency counts the files of a tree (-r) in flight; one file ignores it");
    }
}

pub async fn get(a: GetArgs) -> anyhow::Result<ExitCode> {
    warn_tree_only(&a.t);
    let start = Instant::now();
    let json = a.common.json;
    let mut retry = Retry::new(&a.t, a.resume);
    if a.t.recursive {
        let r = async {
            let url = FtpUrl::parse(&a.url)?;
            let name = url
                .path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .filter(|n| !n.is_empty())
                .unwrap_or("")
                .to_owned();
            let target = match (&a.local, name.is_empty()) {
                (Some(l), _) => l.clone(),
                (None, false) => xftp_proto::name::to_path(&name),
                // The server's top directory has no name to take.
                (None, true) => {
                    let t = PathBuf::from("xftp-tree");
                    if !a.t.quiet {
                        let into = if t.exists() { "into the existing" } else { "into" };
                        eprintln!(
                            "xftp: the server's top directory goes {into} ./{} (give LOCALDIR to choose)",
                            t.display()
                        );
                    }
                    t
                }
            };
            let mut only = None;
            let mut done: Option<TreeReport> = None;
            loop {
                let (progress, mode) = progress_for(&a.t, json, xftp_client::Progress::pooled);
                let connect =
                    tree_connector(&url, &a.common, &a.t, a.resume, false, progress.clone())?;
                let mut opt = tree_options(&a.t, a.resume, progress.clone());
                opt.only = only.take();
                let display = super::progress::start(progress, mode);
                let r = xftp_client::tree::get_tree(connect, &url.path, &target, &opt).await;
                display.finish().await;
                match tree_run(&mut retry, &mut done, r, Op::Get, &url, start).await? {
                    TreeNext::Again(files) => only = files,
                    TreeNext::Done => break,
                }
            }
            done.context("no run of the tree finished")
        }
        .await;
        return tree_finish(r, json, a.t.quiet, start, "get", retry.runs);
    }
    let result = retry.runs_of("get", || get_once(&a, start)).await;
    finish_runs(result, json, a.t.quiet, start, "get", retry.runs)
}

/// What follows a run of a tree.
enum TreeNext {
    /// Run again (the wait is over) over these files, which failed in a
    /// way that may pass (`None`: the whole tree).
    Again(Option<std::sync::Arc<std::collections::HashSet<String>>>),
    /// The tree is done: its report is complete.
    Done,
}

/// One run of a tree (`-r`) with `--retries`: its report goes into
/// `done`, and what follows.
async fn tree_run(
    retry: &mut Retry,
    done: &mut Option<TreeReport>,
    r: Result<TreeReport, ClientError>,
    op: Op,
    url: &FtpUrl,
    start: Instant,
) -> anyhow::Result<TreeNext> {
    let what = if op == Op::Put { "put" } else { "get" };
    let rep = match r {
        Ok(rep) => rep,
        Err(e) => {
            let e = explain(e, op, url);
            // The tree as a whole failed (its listing, its first
            // session): the next run does what this one did.
            if retry.again(what, &e).await {
                return Ok(TreeNext::Again(done.as_ref().map(|d| {
                    std::sync::Arc::new(d.may_pass.iter().cloned().collect())
                })));
            }
            let Some(d) = done.as_mut() else {
                return Err(retry.last(e));
            };
            // An earlier run's report stands; the files this run was to
            // move again failed with it.
            let why = format!("{:#}", retry.last(e));
            let again = std::mem::take(&mut d.may_pass);
            d.failed.retain(|(p, _)| !again.contains(p));
            d.failed.extend(again.into_iter().map(|p| (p, why.clone())));
            d.failed.sort();
            d.elapsed = start.elapsed();
            return Ok(TreeNext::Done);
        }
    };
    let d = match done.take() {
        None => rep,
        Some(mut d) => {
            d.then(rep);
            d.elapsed = start.elapsed();
            d
        }
    };
    let d = done.insert(d);
    if d.may_pass.is_empty() || !retry.due() {
        return Ok(TreeNext::Done);
    }
    let first = d
        .failed
        .iter()
        .find(|(p, _)| d.may_pass.first() == Some(p))
        .map(|(p, why)| format!("{p}: {why}"))
        .unwrap_or_default();
    let why = format!(
        "{} file{} failed in a way that may pass (the first: {first})",
        d.may_pass.len(),
        if d.may_pass.len() == 1 { "" } else { "s" }
    );
    let next = std::sync::Arc::new(d.may_pass.iter().cloned().collect());
    // The tree's run reached the server.
    retry.next(what, &why, false).await;
    Ok(TreeNext::Again(Some(next)))
}

/// One run of `xftp get` of a file.
async fn get_once(a: &GetArgs, start: Instant) -> anyhow::Result<Summary> {
    let json = a.common.json;
    let url = FtpUrl::parse(&a.url)?;
    let name = url.file_name().map(str::to_owned).ok_or_else(|| {
        anyhow::anyhow!(
            "{} names a directory, not a file — give the file's path, e.g. ftp://{}/dir/file (list with `xftp ls`), or fetch the whole tree with `xftp get -r {} LOCAL_DIR`",
            a.url,
            url.authority(),
            a.url
        )
    })?;
    let target = match &a.local {
        None => xftp_proto::name::to_path(&name),
        Some(p) if p.is_dir() => p.join(xftp_proto::name::to_path(&name)),
        // Checked before connecting: each is a mistake the user can fix.
        Some(p) if p.as_os_str() == "-" => anyhow::bail!(
            "`-` (standard output) is not a target: a download goes to a file and is renamed into place once complete — give a file name (./- for a file named -)"
        ),
        Some(p) if p.as_os_str().as_encoded_bytes().ends_with(b"/") => anyhow::bail!(
            "{} does not exist as a directory — make it first (mkdir -p), or drop the trailing / to name the file",
            p.display()
        ),
        Some(p) => match p.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Said before connecting, and of the directory: found later,
            // the error named the partial's temporary file.
            Some(d) if d.exists() && !d.is_dir() => anyhow::bail!(
                "{} is not a directory, so {} cannot be written there — name another target",
                d.display(),
                p.display()
            ),
            Some(d) if !d.exists() => anyhow::bail!(
                "{} does not exist, so {} cannot be written there — make it first (mkdir -p {})",
                d.display(),
                p.display(),
                d.display()
            ),
            _ => p.clone(),
        },
    };
    let (progress, mode) = progress_for(&a.t, json, xftp_client::Progress::new);
    let (cfg, password) =
        client_config(&url, &a.common, Some(&a.t), Some(false), progress.clone())?;
    let mut client = open(&url, cfg.clone(), password.as_deref()).await?;
    client.set_resume(a.resume);
    client.set_sessions(session_factory(
        &url.host,
        url.port,
        url.user.as_deref(),
        cfg,
        password,
    ));
    let display = super::progress::start(progress, mode);
    let r = client.download(&url.path, &target).await;
    display.finish().await;
    show_notices(&mut client, a.t.quiet);
    let r = r.map_err(|e| {
        let partial = xftp_client::partial_path(&target);
        // A refusal that says what to do itself (another run holds the
        // partial, or it is not a plain file) changed nothing to resume.
        let kept = (partial.exists() && !says_its_fix(&e)).then(|| format!(
            "the partial download is kept in {}: run the same command again (with -c) to fetch only what is missing",
            partial.display()
        ));
        explain_resumable(e, Op::Get, &url, a.resume, kept.as_deref())
    })?;
    let summary = conclude(&client, &url, &r, start, false);
    client.quit().await;
    Ok(summary)
}

/// The fix for a TCP connect that failed: out of descriptors is ours to
/// fix; a port other than the control connection's is a data
/// connection's (the server answered on its own port); else `control`.
pub(crate) fn connect_hint(
    addr: std::net::SocketAddr,
    source: &std::io::Error,
    control_port: Option<u16>,
    control: &str,
) -> String {
    if source.raw_os_error() == Some(libc::EMFILE) || source.raw_os_error() == Some(libc::ENFILE) {
        "this process is out of file descriptors: raise `ulimit -n`, or use fewer connections (-p)"
            .into()
    } else if control_port.is_some_and(|p| p != addr.port()) {
        format!(
            "that is a data connection (port {}): the server answered on its own port, then did not take it (out of descriptors or connections?) or a firewall is in the way; try again with fewer connections (-p), or --active",
            addr.port()
        )
    } else {
        control.into()
    }
}

/// The longest wait a flag sets: longer is taken as this (a century).
/// An `Instant` plus 1e19 s overflows, and a panic is no answer to
/// `--timeout 1e19`.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `--WHAT SECS` as a wait: positive, at most [`LONGEST_WAIT`] (`inf`
/// too).
pub(crate) fn positive_secs(s: f64, what: &str) -> anyhow::Result<Duration> {
    // (`min` would take NaN for the century.)
    Some(s)
        .filter(|s| !s.is_nan())
        .and_then(|s| Duration::try_from_secs_f64(s.min(LONGEST_WAIT.as_secs_f64())).ok())
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{what} must be a positive number of seconds"))
}

/// A local error whose text already says what to do (a resume lock held
/// by another run, a partial that is no plain file).
fn says_its_fix(e: &ClientError) -> bool {
    // A server that ignores REST: running the same command again fails
    // the same way.
    matches!(e, ClientError::PastEnd { .. })
        || matches!(e, ClientError::Local { source, .. } if {
            let t = source.to_string();
            t.contains("another xftp is resuming") || t.contains("remove it and run again")
        })
}

pub async fn put(a: PutArgs) -> anyhow::Result<ExitCode> {
    warn_tree_only(&a.t);
    let start = Instant::now();
    let json = a.common.json;
    let mut retry = Retry::new(&a.t, a.resume);
    if a.t.recursive {
        let r = async {
            let url = FtpUrl::parse(&a.url)?;
            if !a.local.exists() {
                anyhow::bail!(
                    "{} does not exist — put -r takes a local directory",
                    a.local.display()
                );
            }
            if !a.local.is_dir() {
                anyhow::bail!(
                    "{} is not a directory — put -r takes a local directory (put without -r sends one file)",
                    a.local.display()
                );
            }
            let mut only = None;
            let mut done: Option<TreeReport> = None;
            loop {
                let (progress, mode) = progress_for(&a.t, json, xftp_client::Progress::pooled);
                let connect =
                    tree_connector(&url, &a.common, &a.t, false, true, progress.clone())?;
                // -c: files complete on the server are skipped; the others
                // go whole (a tree's uploads are not resumable).
                let mut opt = tree_options(&a.t, a.resume, progress.clone());
                opt.only = only.take();
                let display = super::progress::start(progress, mode);
                let r = xftp_client::tree::put_tree(connect, &a.local, &url.path, &opt).await;
                display.finish().await;
                match tree_run(&mut retry, &mut done, r, Op::Put, &url, start).await? {
                    TreeNext::Again(files) => only = files,
                    TreeNext::Done => break,
                }
            }
            done.context("no run of the tree finished")
        }
        .await;
        return tree_finish(r, json, a.t.quiet, start, "put", retry.runs);
    }
    let result = retry.runs_of("put", || put_once(&a, start)).await;
    finish_runs(result, json, a.t.quiet, start, "put", retry.runs)
}

/// One run of `xftp put` of a file.
async fn put_once(a: &PutArgs, start: Instant) -> anyhow::Result<Summary> {
    let json = a.common.json;
    let url = FtpUrl::parse(&a.url)?;
    let mut remote = url.path.clone();
    if url.is_dir_path() {
        let name = a
            .local
            .file_name()
            .map(xftp_proto::name::from_os)
            .ok_or_else(|| anyhow::anyhow!("{} has no usable file name", a.local.display()))?;
        remote.push_str(&name);
    }
    if a.local.is_dir() {
        anyhow::bail!(
            "{} is a directory — send the whole tree with `xftp put -r {} {}`",
            a.local.display(),
            a.local.display(),
            a.url
        );
    }
    if !a.local.is_file() {
        if a.local.symlink_metadata().is_err() {
            anyhow::bail!("{}: no such file — check the local path", a.local.display());
        }
        anyhow::bail!(
            "{} is not a readable regular file (a FIFO, a device or a link to nothing) — check the local path",
            a.local.display()
        );
    }
    let (progress, mode) = progress_for(&a.t, json, xftp_client::Progress::new);
    let mut client = session(&url, &a.common, Some(&a.t), Some(true), progress.clone()).await?;
    client.set_resume(a.resume);
    let display = super::progress::start(progress, mode);
    let r = client.upload(&a.local, &remote).await;
    display.finish().await;
    // "using 1 connection" before a refusal of -c would announce a plan
    // that never runs.
    if matches!(
        &r,
        Err(ClientError::UploadResumeUnsupported | ClientError::Interrupted)
    ) {
        client.take_notices();
    } else {
        show_notices(&mut client, a.t.quiet);
    }
    let r = r.map_err(|e| {
        let kept = "the server keeps what arrived: run the same command again (with -c) to send only what is missing";
        explain_resumable(e, Op::Put, &url, a.resume, Some(kept))
    })?;
    let summary = conclude(&client, &url, &r, start, true);
    client.quit().await;
    Ok(summary)
}

pub async fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let json = a.common.json;
    let result = async {
        let url = FtpUrl::parse(&a.url)?;
        let mut client = session(&url, &a.common, None, None, None).await?;
        let t0 = Instant::now();
        let listing = client
            .list(Some(&xftp_client::list_arg(&url.path)))
            .await
            .map_err(|e| explain(e, Op::Ls, &url))?;
        let elapsed = t0.elapsed();
        let tls = client.tls_info();
        // The final reply's "N entries not listed" (xftp serve): said, so
        // that a listing is not taken for all there is.
        let unlisted = client.take_unlisted();
        if unlisted > 0 && !a.common.json {
            eprintln!(
                "xftp ls: the server left {unlisted} entr{} out of this listing (see its final reply with -v)",
                if unlisted == 1 { "y" } else { "ies" }
            );
        }
        client.quit().await;
        Ok::<_, anyhow::Error>((listing, elapsed, tls))
    }
    .await;
    let summary = result.map(|(listing, elapsed, tls)| {
        let r = TransferReport {
            bytes: listing.len() as u64,
            per_stream_bytes: vec![listing.len() as u64],
            elapsed,
            timeline: None,
            checksum: None,
            already: 0,
            received_twice: 0,
            sent_twice: 0,
        };
        let mut s = Summary::ok(&r, start.elapsed()).with_tls(tls);
        if json {
            // Bytes that are not UTF-8 as everywhere else (xftp_proto::name),
            // so that a name taken from it goes back as the same bytes.
            s.listing = Some(xftp_proto::name::decode(&listing));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&listing);
            let _ = out.flush();
        }
        s
    });
    finish(summary, json, false, start, "ls")
}

/// The parameter-cache key of a destination: `host:port`, the host as
/// DNS and IP addresses compare (`LOCALHOST` is `localhost`,
/// `[0:0:0:0:0:0:0:1]` is `[::1]`), so one path keeps one history.
pub fn cache_key(url: &FtpUrl) -> String {
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{}", url.port),
        Ok(ip) => format!("{ip}:{}", url.port),
        Err(_) => format!("{}:{}", host.to_ascii_lowercase(), url.port),
    }
}

/// The parameter cache, `None` when no cache directory is known.
pub fn load_cache() -> Option<Cache> {
    Cache::default_path().map(|p| Cache::load(&p))
}

/// Smallest transfer whose count and rate go into the path cache: a
/// smaller one is over in a few round trips, its rate is the handshakes'
/// and its count whatever it started with (five gets of a 6-byte file at
/// one connection outvoted two of 5 MB at one and one at eight). Its RTT
/// is kept.
pub const RECORD_MIN_BYTES: u64 = 1 << 20;

/// Add a transfer's record to the parameter cache (a failure to save is
/// a warning; no cache directory known, nothing).
pub fn record_path(dest: &str, rec: PathRecord) {
    match Cache::default_path() {
        Some(p) => {
            if let Err(e) = Cache::record_at(&p, dest, rec) {
                eprintln!("xftp: warning: cannot save the path cache: {e}");
            }
        }
        // A service's environment often has neither: said with -v only.
        None => tracing::info!(
            "no path cache: neither XDG_CACHE_HOME nor HOME names an absolute directory"
        ),
    }
}

/// Build the summary of a finished transfer and record it in the
/// parameter cache (a failure to save is a warning).
fn conclude(
    client: &Client,
    url: &FtpUrl,
    r: &TransferReport,
    start: Instant,
    upload: bool,
) -> Summary {
    let mut s = Summary::ok(r, start.elapsed()).with_tls(client.tls_info());
    if let Some(b) = client.buffers() {
        s.bufsize_requested = Some(b.requested);
        s.bufsize_in_force = b.in_force.map(|f| f.rcv.min(f.snd));
        s.server_bufsize_reply = b.server_reply;
    }
    if let Some(t) = &r.timeline {
        let secs = r.elapsed.as_secs_f64();
        // Held back by --limit-rate, or too small to tell: the RTT only,
        // as `xftp probe` records (no count, no rate), so that no later
        // `-p auto` starts from a count chosen under a limit or by chance.
        let limited = client.rate_limited() || r.bytes < RECORD_MIN_BYTES;
        let rec = PathRecord {
            when: xftp_tune::cache::now_secs(),
            rtt_us: t.rtt_floor_us.unwrap_or(0),
            streams: if limited { 0 } else { t.best_streams },
            throughput_bps: if secs > 0.0 && !limited {
                r.bytes as f64 * 8.0 / secs
            } else {
                0.0
            },
            bytes: if limited { 0 } else { r.bytes },
            upload: Some(upload),
            started: t.adaptive.then_some(t.start),
        };
        record_path(&cache_key(url), rec);
    }
    s
}

/// Connect, log in and negotiate streams; notices go to stderr.
pub(crate) async fn session(
    url: &FtpUrl,
    c: &CommonArgs,
    t: Option<&TransferArgs>,
    upload: Option<bool>,
    progress: Option<std::sync::Arc<xftp_client::Progress>>,
) -> anyhow::Result<Client> {
    let (cfg, password) = client_config(url, c, t, upload, progress)?;
    open(url, cfg, password.as_deref()).await
}

/// The settings of a session, and the password to log in with.
pub(crate) fn client_config(
    url: &FtpUrl,
    c: &CommonArgs,
    t: Option<&TransferArgs>,
    upload: Option<bool>,
    progress: Option<std::sync::Arc<xftp_client::Progress>>,
) -> anyhow::Result<(ClientConfig, Option<String>)> {
    let password = password_for(url, c)?;
    let (streams, auto) = match t.map(|t| t.parallel) {
        None => (1, None),
        Some(Parallel::Fixed(n)) => (n, None),
        Some(Parallel::Auto) => {
            // This direction's best: a path's two can differ.
            let cached_best = load_cache().and_then(|c| c.best(&cache_key(url), CACHE_AGE, upload));
            // Goodput at --limit-rate is the limit's: no growth from it.
            let tune = TuneConfig {
                ceiling_bps: t.and_then(|t| t.limit_rate).map(|r| r as f64 * 8.0),
                ..TuneConfig::default()
            };
            (1, Some(AutoConfig { tune, cached_best }))
        }
    };
    let static_split = t.is_some_and(|t| t.static_split);
    if static_split && auto.is_some() {
        anyhow::bail!("--static needs a fixed number of connections: add -p N");
    }
    let secs = positive_secs;
    let cfg = ClientConfig {
        connect_timeout: secs(c.connect_timeout, "connect-timeout")?,
        reply_timeout: secs(c.timeout, "timeout")?,
        data_timeout: secs(c.timeout, "timeout")?,
        data_mode: if c.mprt {
            DataMode::Mprt
        } else if c.active {
            DataMode::Active
        } else {
            DataMode::Passive
        },
        streams,
        bufsize: t.and_then(|t| t.bufsize.0),
        auto,
        static_split,
        tls: tls_setup(url, c.tls, c.cacert.as_deref(), c.insecure)?,
        verify: t.and_then(|t| t.verify).unwrap_or_default(),
        progress,
        limit_rate: t
            .and_then(|t| t.limit_rate)
            .map(xftp_client::RateLimit::new),
        resume: false,
        interrupt: Some(interrupt_token()),
    };
    Ok((cfg, password))
}

/// Cancelled on the first SIGINT or SIGTERM during `put`: the upload stops
/// and cleans up after itself on the server (see `main`).
pub(crate) fn interrupt_token() -> tokio_util::sync::CancellationToken {
    static TOKEN: std::sync::OnceLock<tokio_util::sync::CancellationToken> =
        std::sync::OnceLock::new();
    TOKEN.get_or_init(Default::default).clone()
}

/// Connect and log in.
pub(crate) async fn open(
    url: &FtpUrl,
    cfg: ClientConfig,
    password: Option<&str>,
) -> anyhow::Result<Client> {
    let mut client = Client::connect(&url.host, url.port, cfg)
        .await
        .map_err(|e| explain(e, Op::Ls, url))?;
    // The login replies are read by the first operation, whose commands
    // travel in the same round trip.
    client
        .login_pipelined(url.user.as_deref(), password)
        .await
        .map_err(|e| explain(e, Op::Ls, url))?;
    Ok(client)
}

/// More sessions like the first, for a ranged download from a server
/// without MULT (`Client::set_sessions`): the same host, settings and
/// login (also the shell's).
pub(super) fn session_factory(
    host: &str,
    port: u16,
    user: Option<&str>,
    cfg: ClientConfig,
    password: Option<String>,
) -> xftp_client::SessionFactory {
    let (host, user) = (host.to_owned(), user.map(str::to_owned));
    xftp_client::SessionFactory(std::sync::Arc::new(move || {
        let (host, user, cfg, password) =
            (host.clone(), user.clone(), cfg.clone(), password.clone());
        Box::pin(async move {
            let mut c = Client::connect(&host, port, cfg).await?;
            c.login_pipelined(user.as_deref(), password.as_deref())
                .await?;
            Ok(c)
        })
    }))
}

/// The sessions of a tree transfer: the caller's settings for the
/// large files, one plain connection for the small ones.
fn tree_connector(
    url: &FtpUrl,
    common: &CommonArgs,
    t: &TransferArgs,
    resume: bool,
    upload: bool,
    progress: Option<std::sync::Arc<xftp_client::Progress>>,
) -> anyhow::Result<xftp_client::tree::Connect> {
    let (large, password) = client_config(url, common, Some(t), Some(upload), progress)?;
    let mut small = large.clone();
    small.streams = 1;
    small.auto = None;
    small.static_split = false;
    let url = url.clone();
    Ok(std::sync::Arc::new(move |role| {
        let cfg = match role {
            xftp_client::tree::Role::Large => large.clone(),
            xftp_client::tree::Role::Small => small.clone(),
        };
        let (url, password) = (url.clone(), password.clone());
        Box::pin(async move {
            let mut c = Client::connect(&url.host, url.port, cfg).await?;
            c.login_pipelined(url.user.as_deref(), password.as_deref())
                .await?;
            c.set_resume(resume);
            Ok(c)
        })
    }))
}

/// `-r`: the summary of a tree.
#[derive(Debug, Serialize)]
struct TreeSummary {
    status: &'static str,
    files: usize,
    dirs: usize,
    bytes: u64,
    skipped: usize,
    /// Entries that are neither files nor directories: left out.
    other: usize,
    /// Partials and records of cut resumable transfers: left out.
    partials: usize,
    /// Entries the server said it left out of its listings (names with a
    /// line break, links leading outside its root): not copied.
    unlisted: usize,
    seconds: f64,
    throughput_bps: f64,
    sessions: usize,
    /// The large files, moved one at a time with every stream: how many,
    /// their bytes, and seconds from the first one's start to the last
    /// one's end.
    large_files: usize,
    large_bytes: u64,
    large_seconds: f64,
    /// (path, why) for every file that failed.
    failed: Vec<(String, String)>,
    /// Runs of the tree (`--retries`), when more than one.
    #[serde(skip_serializing_if = "is_one")]
    runs: u32,
    /// Why the tree as a whole failed (no session, no listing): the
    /// cause and the fix, as on stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn tree_finish(
    r: anyhow::Result<xftp_client::tree::TreeReport>,
    json: bool,
    quiet: bool,
    start: Instant,
    what: &str,
    runs: u32,
) -> anyhow::Result<ExitCode> {
    let r = match r {
        Ok(r) => r,
        // `main` reports the interrupt (and its JSON object).
        Err(_) if interrupt_token().is_cancelled() => return Ok(ExitCode::FAILURE),
        Err(e) if json => {
            // The tree's shape, so that a program reads one schema.
            let msg = format!("{e:#}");
            eprintln!("xftp {what}: {msg}");
            let bytes = counted().0;
            let secs = start.elapsed().as_secs_f64();
            let s = TreeSummary {
                status: "error",
                files: 0,
                dirs: 0,
                bytes,
                skipped: 0,
                other: 0,
                partials: 0,
                unlisted: 0,
                seconds: secs,
                throughput_bps: 0.0,
                sessions: 0,
                large_files: 0,
                large_bytes: 0,
                large_seconds: 0.0,
                failed: Vec::new(),
                runs,
                error: Some(msg),
            };
            out!("{}", serde_json::to_string(&s).context("formatting JSON")?);
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return finish_runs(Err(e), json, quiet, start, what, runs),
    };
    let secs = r.elapsed.as_secs_f64();
    let s = TreeSummary {
        status: if r.failed.is_empty() { "ok" } else { "error" },
        files: r.files,
        dirs: r.dirs,
        bytes: r.bytes,
        skipped: r.skipped,
        other: r.other,
        partials: r.partials,
        unlisted: r.unlisted,
        seconds: secs,
        throughput_bps: if secs > 0.0 {
            r.bytes as f64 / secs
        } else {
            0.0
        },
        sessions: r.sessions,
        large_files: r.large.files,
        large_bytes: r.large.bytes,
        large_seconds: r.large.elapsed().as_secs_f64(),
        failed: r.failed.clone(),
        runs,
        error: None,
    };
    // Each failure on stderr, with --json too (as a single transfer's
    // error is).
    for (p, why) in &s.failed {
        eprintln!("xftp {what}: {p}: {why}");
    }
    if json {
        out!("{}", serde_json::to_string(&s).context("formatting JSON")?);
    } else {
        // Entries the server did not list are not copied: said even with
        // -q, as a failure is.
        if !quiet || !s.failed.is_empty() || s.unlisted > 0 {
            let count =
                |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            eprintln!(
                "xftp {what}: {} ({} bytes) and {} in {secs:.3} s ({:.1} MB/s, {}){}{}{}{}{}",
                count(s.files as u64, "file", "files"),
                s.bytes,
                count(s.dirs as u64, "directory", "directories"),
                s.throughput_bps / 1e6,
                count(s.sessions as u64, "session", "sessions"),
                if s.skipped > 0 {
                    format!(", {} already complete", s.skipped)
                } else {
                    String::new()
                },
                if s.other > 0 {
                    format!(", {} links or special files left out", s.other)
                } else {
                    String::new()
                },
                if s.partials > 0 {
                    format!(
                        ", {} partials of cut transfers (.NAME.xftp-part) left out",
                        s.partials
                    )
                } else {
                    String::new()
                },
                if s.unlisted > 0 {
                    format!(", {} entries the server did not list (names with a line break, links outside its root: not copied; -v shows the server's reply)", s.unlisted)
                } else {
                    String::new()
                },
                if s.failed.is_empty() {
                    String::new()
                } else {
                    format!(", {} FAILED", s.failed.len())
                },
            );
        }
    }
    Ok(if s.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn tree_options(
    t: &TransferArgs,
    resume: bool,
    progress: Option<std::sync::Arc<xftp_client::Progress>>,
) -> xftp_client::tree::TreeOptions {
    xftp_client::tree::TreeOptions {
        concurrency: t.concurrency.map_or(8, usize::from),
        // With --verify a copy of the same size and time is no proof: each
        // file goes through its own `-c`, which compares checksums and
        // moves only a copy that differs.
        skip_complete: resume && t.verify.is_none(),
        progress,
        ..Default::default()
    }
}

/// [`print_notices`], or with `-q` drop them.
fn show_notices(client: &mut Client, quiet: bool) {
    if quiet {
        client.take_notices();
    } else {
        print_notices(client);
    }
}

/// Show what the client had to tell the user (e.g. a MULT refusal).
pub(crate) fn print_notices(client: &mut Client) {
    for n in client.take_notices() {
        eprintln!("xftp: {n}");
    }
}

/// The password: from the URL, else `--password-file`, else XFTP_PASSWORD.
/// Anonymous logins need none.
fn password_for(url: &FtpUrl, c: &CommonArgs) -> anyhow::Result<Option<String>> {
    if url.password.is_some() {
        return Ok(url.password.clone());
    }
    let Some(user) = &url.user else {
        return Ok(None);
    };
    if let Some(f) = &c.password_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the password file {}", f.display()))?;
        let line = text.lines().next().unwrap_or("").to_owned();
        if line.is_empty() {
            anyhow::bail!(
                "the password file {} is empty (or its first line is): put the password on its first line",
                f.display()
            );
        }
        return Ok(Some(line));
    }
    if let Ok(p) = std::env::var("XFTP_PASSWORD") {
        return Ok(Some(p));
    }
    if super::shell::is_anonymous(user) {
        return Ok(Some(xftp_client::ANONYMOUS_PASSWORD.to_string()));
    }
    anyhow::bail!(
        "no password for user {user:?} — set XFTP_PASSWORD, or use --password-file FILE (or ftp://user:password@host/ in the URL)"
    )
}

/// The fix for a refused login (530 to USER or PASS, or to anything while
/// not logged in).
fn login_hint(e: &ClientError, url: &FtpUrl) -> Option<&'static str> {
    match (e.reply_code(), &url.user) {
        (Some(530), None) => Some("the server refuses anonymous logins; give a user: ftp://user@host/ with XFTP_PASSWORD or --password-file"),
        (Some(530), Some(_)) => Some("check the user name and password (URL, XFTP_PASSWORD or --password-file)"),
        _ => None,
    }
}

/// Attach the likely fix to an error.
pub(crate) fn explain(e: ClientError, op: Op, url: &FtpUrl) -> anyhow::Error {
    let short = short_if_transient(&e);
    mark(explain_noting(e, op, url, true), short)
}

/// [`explain`]; with `nothing_kept`, a failure that removed what arrived
/// says so.
fn explain_noting(e: ClientError, op: Op, url: &FtpUrl, nothing_kept: bool) -> anyhow::Error {
    let nk = if nothing_kept {
        " (nothing was kept)"
    } else {
        ""
    };
    if let ClientError::Reply {
        code: 530 | 521 | 534,
        text,
        ..
    } = &e
    {
        if text.contains("TLS") || text.contains("PROT") {
            return anyhow::anyhow!(
                "{e} — the server requires TLS: use ftpes://{}/ (or --tls)",
                url.authority()
            );
        }
    }
    if let Some(f) = login_hint(&e, url) {
        return anyhow::anyhow!("{e} — {f}");
    }
    let fix: Option<String> = match &e {
        ClientError::Reply { code, .. } => match (code, op) {
            // GridFTP answers a missing file 500, naming the path it
            // tried: relative to its login directory too.
            (550, Op::Get) | (500, Op::Get)
                if *code == 550 || e.to_string().contains("Unable to open file") =>
            {
                Some(if url.path.starts_with('/') {
                    // Absolute already (`//abs/path`): the file is missing
                    // or unreadable there.
                    format!(
                        "check the path and its permissions on the server with `xftp ls {}/`",
                        url.base()
                    )
                } else {
                    format!(
                        "check the path with `xftp ls {}/`; URL paths are relative to the login directory, an absolute server path is written {}//abs/path",
                        url.base(),
                        url.base()
                    )
                })
            }
            (550, Op::Ls) => Some("check the directory path".into()),
            (550 | 553, Op::Put) if e.to_string().contains("Is a directory") => Some(
                "the target is a directory: end the URL with / to upload into it under the local name"
                    .into(),
            ),
            (550 | 553, Op::Put) => Some(
                "check that the remote directory exists and that you may write there (`xftp ls`)"
                    .into(),
            ),
            (452 | 552 | 421, _) => server_state_hint(*code, &e),
            // xftp serve's words for a file written while it was sent.
            (451, _) if e.to_string().contains("changed during the transfer") => Some(format!(
                "the file was written on the server during the transfer{nk}; run it again when it is complete"
            )),
            // xftp serve's words for a file that shrank while it was sent.
            (426, _) if e.to_string().contains("source ended at") => Some(format!(
                "the file shrank on the server during the transfer{nk}; run it again when it is complete"
            )),
            // xftp serve's words when a newer upload of the partial took
            // over (another `put -c` of the same file): no network fault.
            (426, _) if e.to_string().contains("took over") => Some(
                "another upload of the same file took over this one (a second `xftp put -c`?); let that one finish"
                    .into(),
            ),
            // xftp serve's words when its --stall-timeout ended a data
            // connection that moved nothing (the path stalled).
            (426, _) if e.to_string().contains("no data moved for") => Some(format!(
                "the server gave up on a data connection that moved nothing for that long (its --stall-timeout): the path stalled{nk}; run it again{}",
                if matches!(op, Op::Get | Op::Put) { " with -c" } else { "" }
            )),
            (425 | 426, _) => Some(
                "the data connection failed; try --active (or drop it), or check firewalls".into(),
            ),
            _ => None,
        },
        ClientError::NotFtp(_) | ClientError::NoGreeting { .. } => Some(format!(
            "is {} an FTP server's address? check the host and port (ftp://host:PORT/; ftps:// for implicit TLS)",
            url.authority()
        )),
        ClientError::Connect { addr, source } => Some(connect_hint(
            *addr,
            source,
            Some(url.port),
            &format!(
                "is an FTP server running at {}? check the host and port (ftp://host:PORT/)",
                url.authority()
            ),
        )),
        ClientError::Resolve { .. } => Some("check the host name in the URL".into()),
        ClientError::NotThere { .. } => Some(format!(
            "check the path with `xftp ls {}/` (paths are relative to the login directory)",
            url.base()
        )),
        // A connect is bounded by --connect-timeout, the rest by --timeout.
        ClientError::Timeout { what, .. } if what.starts_with("a TCP connection") => Some(
            "the server or network is not answering; raise --connect-timeout, or try --active / passive"
                .into(),
        ),
        // Data connections that carried data and then stood still: not a
        // firewall's doing, and the server may well still answer (a path
        // that stalled, connections dropped on the way).
        ClientError::Timeout { what, .. }
            if what.starts_with("the data connection") && !what.contains("after 0 bytes") =>
        {
            Some(format!(
                "no data moved on the data connections for that long: the path stalled, or something on the way dropped them{nk}; raise --timeout, or run it again{} (-p auto adds a connection when the server answers while the data stands still)",
                if matches!(op, Op::Get | Op::Put) { " with -c" } else { "" }
            ))
        }
        // The server stopped answering mid-transfer (the path or the host
        // went away): no data-connection mode would help.
        ClientError::Timeout { what, .. } if what.contains("during the transfer") => Some(format!(
            "the server stopped answering during the transfer (the path or the host went away){nk}; raise --timeout, or run it again{}",
            if matches!(op, Op::Get | Op::Put) { " with -c" } else { "" }
        )),
        ClientError::Timeout { .. } if e.at_login() => Some(
            "the server greeted, then stopped answering at the login: it may be overloaded, or the path stalled; raise --timeout, or try again later"
                .into(),
        ),
        ClientError::Timeout { .. } => Some(
            "the server or network is not answering; raise --timeout, or try --active / passive"
                .into(),
        ),
        ClientError::Closed => Some("the server hung up; try again later".into()),
        // More bytes than SIZE said: the file grew during the download.
        ClientError::ShortTransfer { expected, got } if got > expected => Some(format!(
            "the file changed on the server during the transfer{nk}; run it again when it is complete"
        )),
        ClientError::ShortTransfer { .. } => {
            Some(format!("the transfer was cut short{nk}; run it again"))
        }
        ClientError::PastEnd { .. } => Some(
            "if the server cannot restart transfers, fetch the whole file: run it without -c (the partial is kept as it was before this run)"
                .into(),
        ),
        // What the server holds differs from what was sent: cut short, or
        // replaced by another upload in the meantime; the remote file is
        // the server's business either way.
        ClientError::LocalFileChanged { .. } => {
            Some("something is writing the local file: send it again once it is complete".into())
        }
        ClientError::LocalFileWritten { .. } => Some(
            "send it again once nothing writes the local file (a file still being written: copy it first)"
                .into(),
        ),
        ClientError::UploadMismatch { .. } => Some(
            "the upload was cut short, or the file was changed on the server meanwhile (by another upload?); check it, or run it again"
                .into(),
        ),
        ClientError::DataIo(_) => Some("the data connection broke; run it again".into()),
        ClientError::ChangedDuring { .. } => Some(
            "run it again once nothing writes or replaces the file on the server"
                .into(),
        ),
        ClientError::SourceChanged { partial, .. } => Some(match op {
            Op::Put => format!(
                "the partial upload {} on the server is of another version: the local file changed since, or another upload of the same name (a second `xftp put -c` of another file) began it; run without -c to send it whole",
                partial.display()
            ),
            _ => xftp_client::remove_partial_fix(partial),
        }),
        ClientError::ChecksumMismatch { .. } => Some(match op {
            Op::Put => "the server's copy differs from the local file and was deleted; run it again (if it repeats, the local file may be changing, or a disk or memory fault corrupts data)".into(),
            _ => "the copy differs from the server's file and was not kept; run it again (if it repeats, the file may be changing on the server, or a disk or memory fault corrupts data)".into(),
        }),
        // The local file system, not the network.
        ClientError::StripeFault(m) if m.starts_with("storage:") => Some(if xftp_stripe::names_out_of_space(m) {
            format!("the local disk is full (or over quota): free space where the file goes, then run it again{nk}")
        } else {
            format!("writing the local file failed{nk}; check the disk and the local path")
        }),
        ClientError::Local { source, .. } if xftp_stripe::names_out_of_space(&source.to_string()) => Some(
            "the local disk is full (or over quota): free space there, then run it again".into(),
        ),
        ClientError::Stripe(_) => Some(format!(
            "a data connection broke mid-transfer{nk}; run it again, perhaps with fewer connections (-p)"
        )),
        // The receiver's rules broken by what arrived: the sender's doing.
        ClientError::StripeFault(_) => Some(match op {
            Op::Put => format!("not a network failure{nk}: if it repeats, report it with the log of -v"),
            _ => format!("the server sent data that breaks the transfer's rules (not a network failure){nk}; if it repeats, report it to the server's maintainers with the log of -v, or use -p 1"),
        }),
        ClientError::Local { .. } if says_its_fix(&e) => None,
        ClientError::Local { .. } => Some("check the local path and its permissions".into()),

        _ => None,
    };
    match fix {
        Some(f) => anyhow::anyhow!("{e} — {f}"),
        // Its text says the cause already (`{:#}` would repeat a source).
        None => anyhow::anyhow!("{e}"),
    }
}

/// The fix for a refusal that says what state the server is in (452/552
/// space or limits, 421 busy or a lockout): the same in the CLI and the
/// shell.
pub(crate) fn server_state_hint(code: u16, e: &ClientError) -> Option<String> {
    Some(match code {
        452 | 552 => {
            "the server will not take that much: out of space, over quota, or over its size limit"
        }
        421 if e.to_string().contains("failed logins") => {
            "this address is locked out after failed logins: wait as the server says, then check the user name and password"
        }
        421 => "the server is busy or shutting down; try again later",
        _ => return None,
    }
    .into())
}

/// Render the outcome and choose the exit status.
fn finish(
    result: anyhow::Result<Summary>,
    json: bool,
    quiet: bool,
    start: Instant,
    what: &str,
) -> anyhow::Result<ExitCode> {
    finish_runs(result, json, quiet, start, what, 1)
}

/// [`finish`] of a transfer that ran `runs` times (`--retries`).
fn finish_runs(
    result: anyhow::Result<Summary>,
    json: bool,
    quiet: bool,
    start: Instant,
    what: &str,
    runs: u32,
) -> anyhow::Result<ExitCode> {
    let (summary, code) = match result {
        Ok(s) => (s, ExitCode::SUCCESS),
        // `main` reports the interrupt (and its JSON object).
        Err(_) if interrupt_token().is_cancelled() => return Ok(ExitCode::FAILURE),
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("xftp {what}: {msg}");
            let mut s = Summary::failed(msg, start.elapsed()).runs(runs);
            fill_counted(&mut s);
            (s, ExitCode::FAILURE)
        }
    };
    if json {
        let line = serde_json::to_string(&summary).context("cannot format the JSON summary")?;
        out!("{line}");
    } else if summary.status == "ok" && what != "ls" && !quiet {
        if summary.bytes == 0 && summary.bytes_already_present > 0 {
            eprintln!(
                "xftp {what}: complete already ({} bytes in place, the same size and time): nothing moved",
                summary.bytes_already_present
            );
        } else {
            eprintln!(
                "xftp {what}: {} bytes in {:.3} s ({:.1} MB/s, {} connection{})",
                summary.bytes,
                summary.seconds,
                summary.throughput_bps / 1e6,
                summary.streams,
                if summary.streams == 1 { "" } else { "s" }
            );
        }
        if summary.bytes > 0 && summary.bytes_already_present > 0 {
            eprintln!(
                "xftp {what}: {} bytes were in place already",
                summary.bytes_already_present
            );
        }
        if let (Some(a), Some(v)) = (&summary.checksum_algorithm, &summary.checksum) {
            eprintln!("xftp {what}: verified, {a} {v} at both ends");
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_destination_has_one_cache_key() {
        let key = |u: &str| cache_key(&FtpUrl::parse(u).unwrap());
        assert_eq!(key("ftp://LocalHost:21/"), key("ftp://localhost/"));
        assert_eq!(key("ftp://[0:0:0:0:0:0:0:1]:2121/"), "[::1]:2121");
        assert_eq!(key("ftp://127.0.0.1:2121/x"), "127.0.0.1:2121");
        assert_ne!(key("ftp://h:21/"), key("ftp://h:2121/"));
    }

    #[test]
    fn an_upload_taken_over_is_not_told_to_try_active() {
        let url = FtpUrl::parse("ftp://h:2121/f").unwrap();
        let e = ClientError::Reply {
            command: "STOR .f.xftp-part".into(),
            code: 426,
            text: "Transfer aborted: a newer upload of this file took over.".into(),
        };
        let m = format!("{:#}", explain(e, Op::Put, &url));
        assert!(
            m.contains("another upload of the same file") && !m.contains("--active"),
            "{m}"
        );
    }

    #[test]
    fn a_server_silent_mid_transfer_is_not_told_to_try_active() {
        let url = FtpUrl::parse("ftp://h:2121/f").unwrap();
        let e = ClientError::Timeout {
            what: "a reply to STAT during the transfer".into(),
            after: Duration::from_secs(8),
        };
        let m = format!("{:#}", explain(e, Op::Get, &url));
        assert!(
            m.contains("stopped answering during the transfer")
                && m.contains("with -c")
                && !m.contains("--active"),
            "{m}"
        );
    }

    #[test]
    fn a_stall_the_server_gave_up_on_is_not_told_to_try_active() {
        let url = FtpUrl::parse("ftp://h:2121/f").unwrap();
        let e = ClientError::Reply {
            command: "RETR f".into(),
            code: 426,
            text: "Connection closed; transfer aborted: no data moved for 120 s".into(),
        };
        let m = format!("{:#}", explain(e, Op::Get, &url));
        assert!(
            m.contains("the path stalled") && !m.contains("--active"),
            "{m}"
        );
    }

    #[test]
    fn a_connect_that_timed_out_names_connect_timeout() {
        let url = FtpUrl::parse("ftp://h:2121/f").unwrap();
        let t = |what: &str| {
            let e = ClientError::Timeout {
                what: what.into(),
                after: Duration::from_secs(15),
            };
            format!("{:#}", explain(e, Op::Get, &url))
        };
        let connect = t("a TCP connection to 198.18.0.2:44857");
        assert!(connect.contains("raise --connect-timeout"), "{connect}");
        let reply = t("the reply to RETR f");
        assert!(reply.contains("raise --timeout,"), "{reply}");
        // Data that moved and then stood still: the path, not the server.
        for what in [
            "the data connections to move (stalled)",
            "the data connection to move (stalled after 90193024 bytes)",
        ] {
            let stalled = t(what);
            assert!(
                stalled.contains("the path stalled") && !stalled.contains("not answering"),
                "{stalled}"
            );
        }
        let never = t("the data connection to move (stalled after 0 bytes)");
        assert!(never.contains("try --active"), "{never}");
    }

    #[test]
    fn parallel_accepts_1_to_64_only() {
        assert_eq!(parse_parallel("1"), Ok(Parallel::Fixed(1)));
        assert_eq!(parse_parallel("64"), Ok(Parallel::Fixed(64)));
        assert_eq!(parse_parallel("auto"), Ok(Parallel::Auto));
        assert_eq!(parse_parallel("AUTO"), Ok(Parallel::Auto));
        assert!(parse_parallel("0").is_err());
        assert!(parse_parallel("65").is_err());
        assert!(parse_parallel("-3").is_err());
    }

    #[test]
    fn bufsize_takes_suffixes_and_auto() {
        assert_eq!(parse_bufsize_arg("auto"), Ok(BufArg(None)));
        assert_eq!(parse_bufsize_arg("65536"), Ok(BufArg(Some(65536))));
        assert_eq!(parse_bufsize_arg("64k"), Ok(BufArg(Some(65536))));
        assert_eq!(parse_bufsize_arg("4M"), Ok(BufArg(Some(4 << 20))));
        assert_eq!(parse_bufsize_arg("1G"), Ok(BufArg(Some(1 << 30))));
        assert!(parse_bufsize_arg("big").is_err());
        // Surely mistyped: under what a socket holds, over what it gets.
        assert!(parse_bufsize_arg("1").unwrap_err().contains("2 KiB"));
        assert!(parse_bufsize_arg("5G").unwrap_err().contains("1 GiB"));
        assert_eq!(parse_bufsize_arg("2k"), Ok(BufArg(Some(2048))));
        assert_eq!(parse_bufsize_arg("4MiB"), Ok(BufArg(Some(4 << 20))));
        assert!(parse_bufsize_arg("0").unwrap_err().contains("auto"));
    }

    #[test]
    fn a_failed_connect_is_explained_by_whose_it_was() {
        let a: std::net::SocketAddr = "127.0.0.1:45000".parse().unwrap();
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(connect_hint(a, &refused, Some(45000), "ctl"), "ctl");
        assert!(connect_hint(a, &refused, Some(21), "ctl").contains("data connection (port 45000)"));
        assert!(connect_hint(a, &emfile, Some(45000), "ctl").contains("ulimit -n"));
        assert_eq!(connect_hint(a, &refused, None, "ctl"), "ctl");
    }

    #[test]
    fn byte_counts_and_rates() {
        assert_eq!(parse_rate("4MiB"), Ok(4 << 20));
        assert_eq!(parse_rate("500k"), Ok(500 << 10));
        let e = parse_rate("fast").unwrap_err();
        assert!(
            e.contains("not a number of bytes") && !e.contains("auto"),
            "{e}"
        );
        assert!(parse_rate("0")
            .unwrap_err()
            .contains("leave the option out"));
        assert_eq!(parse_byte_count("2G"), Ok(2 << 30));
    }

    #[test]
    fn tls_comes_from_the_scheme_or_the_flag() {
        let plain = FtpUrl::parse("ftp://h/f").unwrap();
        assert!(tls_setup(&plain, false, None, false).unwrap().is_none());
        let t = tls_setup(&plain, true, None, false).unwrap().unwrap();
        assert!(!t.implicit);
        let e = tls_setup(&plain, false, None, true).unwrap_err();
        assert!(e.to_string().contains("ftpes://"), "{e}");
        let imp = FtpUrl::parse("ftps://h/f").unwrap();
        let t = tls_setup(&imp, false, None, true).unwrap().unwrap();
        assert!(t.implicit && t.verify.insecure);
        let e = tls_setup(
            &imp,
            false,
            Some(std::path::Path::new("/nonexistent.pem")),
            false,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("--cacert"), "{e:#}");
    }

    #[test]
    fn password_sources_in_order() {
        let c = CommonArgs {
            active: false,
            mprt: false,
            json: false,
            password_file: None,
            connect_timeout: 1.0,
            timeout: 1.0,
            tls: false,
            cacert: None,
            insecure: false,
        };
        let anon = FtpUrl::parse("ftp://h/f").unwrap();
        assert_eq!(password_for(&anon, &c).unwrap(), None);
        let inline = FtpUrl::parse("ftp://u:pw@h/f").unwrap();
        assert_eq!(password_for(&inline, &c).unwrap().as_deref(), Some("pw"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "from-file\nignored\n").unwrap();
        let c = CommonArgs {
            password_file: Some(f),
            ..c
        };
        let named = FtpUrl::parse("ftp://u@h/f").unwrap();
        assert_eq!(
            password_for(&named, &c).unwrap().as_deref(),
            Some("from-file")
        );
    }

    #[test]
    fn summary_json_has_the_documented_fields() {
        let r = TransferReport {
            bytes: 10,
            per_stream_bytes: vec![6, 4],
            elapsed: Duration::from_secs(2),
            timeline: None,
            checksum: Some(xftp_client::Checksum {
                algorithm: xftp_client::Algorithm::Md5,
                value: "900150983cd24fb0d6963f7d28e17f72".into(),
            }),
            already: 0,
            received_twice: 0,
            sent_twice: 0,
        };
        let v: serde_json::Value =
            serde_json::to_value(Summary::ok(&r, Duration::from_secs(3))).unwrap();
        assert_eq!(v["status"], "ok");
        assert_eq!(v["bytes"], 10);
        assert_eq!(v["streams"], 2);
        assert_eq!(v["throughput_bps"], 5.0);
        assert_eq!(v["per_stream_bytes"], serde_json::json!([6, 4]));
        assert_eq!(v["checksum_algorithm"], "MD5");
        assert_eq!(v["checksum"], "900150983cd24fb0d6963f7d28e17f72");
        assert!(
            v.get("bytes_already_present").is_none(),
            "only after a resume"
        );
        assert!(v.get("error").is_none());
        let v = serde_json::to_value(Summary::failed("boom".into(), Duration::ZERO)).unwrap();
        assert_eq!(v["status"], "error");
        assert_eq!(v["error"], "boom");
    }
}
