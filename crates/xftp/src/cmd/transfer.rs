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
use xftp_client::{Client, ClientConfig, ClientError, DataMode, FtpUrl, TransferReport};

/// Largest `-p` accepted for now.
const MAX_PARALLEL: u32 = 64;

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
    json: bool,
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
}

/// `xftp get URL [LOCAL]`
#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// ftp://[user[:password]@]host[:port]/path
    url: String,
    /// Local file or existing directory (default: the remote file name in
    /// the current directory).
    local: Option<PathBuf>,
    /// Data connections to ask the server for (1..=64; 1 = plain FTP).
    #[arg(short = 'p', long = "parallel", value_name = "N", default_value = "1", value_parser = parse_parallel)]
    parallel: u32,
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
    /// Data connections to ask the server for (1..=64; 1 = plain FTP).
    #[arg(short = 'p', long = "parallel", value_name = "N", default_value = "1", value_parser = parse_parallel)]
    parallel: u32,
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

fn parse_parallel(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Err(format!(
            "`-p auto` is not available yet; give a number from 1 to {MAX_PARALLEL}"
        ));
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_PARALLEL).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of connections from 1 to {MAX_PARALLEL}"
        )),
    }
}

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
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    listing: Option<String>,
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
            error: None,
            listing: None,
        }
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
            error: Some(msg),
            listing: None,
        }
    }
}

/// Which command failed: the hint depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Put,
    Ls,
}

pub async fn get(a: GetArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let json = a.common.json;
    let result = async {
        let url = FtpUrl::parse(&a.url)?;
        let name = url.file_name().map(str::to_owned).ok_or_else(|| {
            anyhow::anyhow!(
                "{} names a directory, not a file — give the file's path, e.g. ftp://{}/dir/file (list with `xftp ls`)",
                a.url,
                url.authority()
            )
        })?;
        let target = match &a.local {
            None => PathBuf::from(&name),
            Some(p) if p.is_dir() => p.join(&name),
            Some(p) => p.clone(),
        };
        let mut client = session(&url, &a.common, a.parallel).await?;
        let r = client.download(&url.path, &target).await;
        print_notices(&mut client);
        let r = r.map_err(|e| explain(e, Op::Get, &url))?;
        client.quit().await;
        Ok::<_, anyhow::Error>(r)
    }
    .await;
    finish(
        result.map(|r| Summary::ok(&r, start.elapsed())),
        json,
        start,
        "get",
    )
}

pub async fn put(a: PutArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let json = a.common.json;
    let result = async {
        let url = FtpUrl::parse(&a.url)?;
        let mut remote = url.path.clone();
        if url.is_dir_path() {
            let name = a
                .local
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| anyhow::anyhow!("{} has no usable file name", a.local.display()))?;
            remote.push_str(name);
        }
        if !a.local.is_file() {
            anyhow::bail!(
                "{} is not a readable regular file — check the local path",
                a.local.display()
            );
        }
        let mut client = session(&url, &a.common, a.parallel).await?;
        let r = client.upload(&a.local, &remote).await;
        print_notices(&mut client);
        let r = r.map_err(|e| explain(e, Op::Put, &url))?;
        client.quit().await;
        Ok::<_, anyhow::Error>(r)
    }
    .await;
    finish(
        result.map(|r| Summary::ok(&r, start.elapsed())),
        json,
        start,
        "put",
    )
}

pub async fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let json = a.common.json;
    let result = async {
        let url = FtpUrl::parse(&a.url)?;
        let mut client = session(&url, &a.common, 1).await?;
        let t0 = Instant::now();
        let listing = client
            .list(Some(&url.path))
            .await
            .map_err(|e| explain(e, Op::Ls, &url))?;
        let elapsed = t0.elapsed();
        client.quit().await;
        Ok::<_, anyhow::Error>((listing, elapsed))
    }
    .await;
    let summary = result.map(|(listing, elapsed)| {
        let r = TransferReport {
            bytes: listing.len() as u64,
            per_stream_bytes: vec![listing.len() as u64],
            elapsed,
        };
        let mut s = Summary::ok(&r, start.elapsed());
        if json {
            s.listing = Some(String::from_utf8_lossy(&listing).into_owned());
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&listing);
            let _ = out.flush();
        }
        s
    });
    finish(summary, json, start, "ls")
}

/// Connect, log in and negotiate streams; notices go to stderr.
async fn session(url: &FtpUrl, c: &CommonArgs, parallel: u32) -> anyhow::Result<Client> {
    let password = password_for(url, c)?;
    let secs = |s: f64, what: &str| -> anyhow::Result<Duration> {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("--{what} must be a positive number of seconds"))
    };
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
        streams: parallel,
    };
    let mut client = Client::connect(&url.host, url.port, cfg)
        .await
        .map_err(|e| explain(e, Op::Ls, url))?;
    // The login replies are read by the first operation, whose commands
    // travel in the same round trip.
    client
        .login_pipelined(url.user.as_deref(), password.as_deref())
        .await
        .map_err(|e| explain(e, Op::Ls, url))?;
    Ok(client)
}

/// Show what the client had to tell the user (e.g. a MULT refusal).
fn print_notices(client: &mut Client) {
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
        return Ok(Some(line));
    }
    if let Ok(p) = std::env::var("XFTP_PASSWORD") {
        return Ok(Some(p));
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
fn explain(e: ClientError, op: Op, url: &FtpUrl) -> anyhow::Error {
    if let Some(f) = login_hint(&e, url) {
        return anyhow::anyhow!("{e} — {f}");
    }
    let fix: Option<String> = match &e {
        ClientError::Reply { code, .. } => match (code, op) {
            (550, Op::Get) => Some(format!(
                "check the path with `xftp ls ftp://{}/`",
                url.authority()
            )),
            (550, Op::Ls) => Some("check the directory path".into()),
            (550 | 553, Op::Put) => Some(
                "check that the remote directory exists and that you may write there (`xftp ls`)"
                    .into(),
            ),
            (452 | 552, _) => Some("the server is out of space or over quota".into()),
            (421, _) => Some("the server is busy or shutting down; try again later".into()),
            (425 | 426, _) => Some(
                "the data connection failed; try --active (or drop it), or check firewalls".into(),
            ),
            _ => None,
        },
        ClientError::Connect { .. } => Some(format!(
            "is an FTP server running at {}? check the host and port (ftp://host:PORT/)",
            url.authority()
        )),
        ClientError::Resolve { .. } => Some("check the host name in the URL".into()),
        ClientError::Timeout { .. } => Some(
            "the server or network is not answering; raise --timeout, or try --active / passive"
                .into(),
        ),
        ClientError::Closed => Some("the server hung up; try again later".into()),
        ClientError::ShortTransfer { .. } | ClientError::UploadMismatch { .. } => {
            Some("the transfer was cut short (nothing was kept); run it again".into())
        }
        ClientError::DataIo(_) => Some("the data connection broke; run it again".into()),
        ClientError::Stripe(_) => Some(
            "a data connection broke mid-transfer (nothing was kept); run it again, perhaps with fewer connections (-p)"
                .into(),
        ),
        ClientError::Local { .. } => Some("check the local path and its permissions".into()),
        _ => None,
    };
    match fix {
        Some(f) => anyhow::anyhow!("{e} — {f}"),
        None => anyhow::Error::new(e),
    }
}

/// Render the outcome and choose the exit status.
fn finish(
    result: anyhow::Result<Summary>,
    json: bool,
    start: Instant,
    what: &str,
) -> anyhow::Result<ExitCode> {
    let (summary, code) = match result {
        Ok(s) => (s, ExitCode::SUCCESS),
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("xftp {what}: {msg}");
            (Summary::failed(msg, start.elapsed()), ExitCode::FAILURE)
        }
    };
    if json {
        let line = serde_json::to_string(&summary).context("cannot format the JSON summary")?;
        println!("{line}");
    } else if summary.status == "ok" && what != "ls" {
        eprintln!(
            "xftp {what}: {} bytes in {:.3} s ({:.1} MB/s, {} connection{})",
            summary.bytes,
            summary.seconds,
            summary.throughput_bps / 1e6,
            summary.streams,
            if summary.streams == 1 { "" } else { "s" }
        );
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_accepts_1_to_64_only() {
        assert_eq!(parse_parallel("1"), Ok(1));
        assert_eq!(parse_parallel("64"), Ok(64));
        assert!(parse_parallel("0").is_err());
        assert!(parse_parallel("65").is_err());
        assert!(parse_parallel("-3").is_err());
        let auto = parse_parallel("auto").unwrap_err();
        assert!(auto.contains("not available yet"), "{auto}");
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
        };
        let v: serde_json::Value =
            serde_json::to_value(Summary::ok(&r, Duration::from_secs(3))).unwrap();
        assert_eq!(v["status"], "ok");
        assert_eq!(v["bytes"], 10);
        assert_eq!(v["streams"], 2);
        assert_eq!(v["throughput_bps"], 5.0);
        assert_eq!(v["per_stream_bytes"], serde_json::json!([6, 4]));
        assert!(v.get("error").is_none());
        let v = serde_json::to_value(Summary::failed("boom".into(), Duration::ZERO)).unwrap();
        assert_eq!(v["status"], "error");
        assert_eq!(v["error"], "boom");
    }
}
