//! `xftp probe URL`: what xftp measures about a destination before a
//! transfer, and the number of connections it would start with.
//!
//! Logs in, reads the control connection's RTT from the kernel
//! (`TCP_INFO`), times five `NOOP`s, reads `FEAT`, shows the cached
//! records of earlier transfers and the choice of `initial_streams`, and
//! records the RTT in the cache.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use xftp_client::xftp_tune::{self, PathRecord};
use xftp_client::{FtpUrl, RANGED_AUTO_MAX};

use super::transfer::{
    cache_key, load_cache, parse_bufsize_arg, print_notices, record_path, session, CommonArgs,
};

/// NOOPs timed for the application-level RTT.
const NOOPS: usize = 5;

/// How long cached records are used (as for transfers).
const CACHE_AGE: Duration = Duration::from_secs(24 * 3600);

/// `xftp probe URL`
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// ftp://[user[:password]@]host[:port]/
    url: String,
    /// The per-connection window to assume (as `--bufsize` of get/put);
    /// only explains the choice.
    #[arg(long, value_name = "BYTES", default_value = "auto", value_parser = parse_bufsize_arg, allow_negative_numbers = true)]
    bufsize: super::transfer::BufArg,
    #[command(flatten)]
    common: CommonArgs,
}

/// What the probe found.
#[derive(Debug, Serialize)]
struct Probe {
    /// "ok" (a failed probe prints `{"status":"error","error":...}`).
    status: &'static str,
    destination: String,
    /// Smoothed RTT of the control connection from TCP_INFO, ms.
    rtt_tcp_info_ms: Option<f64>,
    /// Median of the timed NOOP round trips, ms.
    rtt_noop_median_ms: f64,
    /// Every NOOP round trip, ms.
    rtt_noop_ms: Vec<f64>,
    mult: bool,
    mode_e: bool,
    mprt: bool,
    /// A GridFTP server (FEAT lists SPAS or SPOR): MODE E with parallelism
    /// set by `OPTS RETR Parallelism`, no MULT.
    gridftp: bool,
    feat: Vec<String>,
    cache_file: Option<String>,
    cached: Vec<PathRecord>,
    /// (connections, bits per second): the count a download would start
    /// from and its median rate ([`xftp_tune::Cache::best`]).
    cached_best: Option<(u32, f64)>,
    /// The same for an upload (each direction has its own records).
    cached_best_put: Option<(u32, f64)>,
    /// The starting number of connections `get -p auto` would use.
    initial_streams: u32,
    /// ... and `put -p auto`, where MULT applies (else the same).
    initial_streams_put: u32,
    reason: String,
    /// Whether `-p auto` could change the count during a transfer.
    adaptive: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl ProbeArgs {
    /// Whether the report goes out as JSON.
    pub fn json(&self) -> bool {
        self.common.json
    }
}

/// Run the probe: the report on stdout (one JSON object with --json, as
/// get/put/ls print, also when it fails).
pub async fn run(a: ProbeArgs) -> anyhow::Result<ExitCode> {
    let json = a.common.json;
    match measure(a).await {
        Ok(p) if json => {
            out!("{}", serde_json::to_string(&p).context("formatting JSON")?);
            Ok(ExitCode::SUCCESS)
        }
        Ok(p) => {
            render(&p);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("xftp probe: {msg}");
            if json {
                out!("{}", serde_json::json!({ "status": "error", "error": msg }));
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn measure(a: ProbeArgs) -> anyhow::Result<Probe> {
    let url = FtpUrl::parse(&a.url)?;
    let mut client = session(&url, &a.common, None, None, None).await?;
    // The login's refusal in the words `get` gives it (a server that
    // requires TLS: use ftpes://).
    let feat = client.features().await.map_err(|e| {
        super::transfer::explain(e, super::transfer::Op::Ls, &url)
            .context(format!("logging in to {}", url.authority()))
    })?;
    print_notices(&mut client);
    let mut noops = Vec::with_capacity(NOOPS);
    for _ in 0..NOOPS {
        noops.push(client.noop_rtt().await.context("timing NOOP")?);
    }
    let tcp_rtt = client.control_rtt();
    client.quit().await;
    noops.sort();
    let median = noops[noops.len() / 2];
    let key = cache_key(&url);
    let cache = load_cache();
    let cached: Vec<PathRecord> = cache
        .as_ref()
        .map(|c| c.fresh(&key, CACHE_AGE).into_iter().cloned().collect())
        .unwrap_or_default();
    // As `get` and `put` choose: each from its own direction's records.
    let best = cache
        .as_ref()
        .and_then(|c| c.best(&key, CACHE_AGE, Some(false)));
    let best_put = cache
        .as_ref()
        .and_then(|c| c.best(&key, CACHE_AGE, Some(true)));
    let rtt = tcp_rtt.or(Some(median));
    let n_put = if feat.mult || feat.gridftp {
        xftp_tune::initial_streams(rtt, a.bufsize.0, best_put, 32).0
    } else {
        1
    };
    let (n, reason, adaptive) = if feat.mult {
        let (n, why) = xftp_tune::initial_streams(rtt, a.bufsize.0, best, 32);
        (n, why, feat.mode_e)
    } else if feat.gridftp {
        // As `get`/`put` do: the same starting count, asked for with
        // OPTS RETR Parallelism (downloads) or opened by the client
        // (uploads), and kept for the whole transfer.
        let (n, why) = xftp_tune::initial_streams(rtt, a.bufsize.0, best, 32);
        (
            n,
            format!("{why}; a GridFTP server without MULT: MODE E with OPTS RETR Parallelism={n} for downloads, {n} connections from this client for uploads"),
            false,
        )
    } else if feat.rest_stream {
        // As `get -p auto` does (client/ranged.rs): sessions fetching byte
        // ranges, at most RANGED_AUTO_MAX, the cache left out.
        let (n, why) = xftp_tune::initial_streams(rtt, a.bufsize.0, None, RANGED_AUTO_MAX);
        let how = if n > 1 {
            format!("downloads over {n} sessions, each fetching byte ranges (REST)")
        } else {
            "downloads over one connection".to_string()
        };
        (
            n,
            format!(
                "{why}; the server does not list MULT in FEAT: {how}, uploads over one connection"
            ),
            false,
        )
    } else {
        (
            1,
            "the server lists neither MULT nor REST STREAM in FEAT: one plain connection"
                .to_string(),
            false,
        )
    };
    let floor = tcp_rtt.map_or(median, |t| t.min(median));
    record_path(
        &key,
        PathRecord {
            when: xftp_tune::cache::now_secs(),
            rtt_us: floor.as_micros() as u64,
            streams: 0,
            throughput_bps: 0.0,
            bytes: 0,
            upload: None,
            started: None,
        },
    );
    Ok(Probe {
        status: "ok",
        destination: key,
        rtt_tcp_info_ms: tcp_rtt.map(ms),
        rtt_noop_median_ms: ms(median),
        rtt_noop_ms: noops.iter().copied().map(ms).collect(),
        mult: feat.mult,
        mode_e: feat.mode_e || feat.gridftp,
        mprt: feat.mprt,
        gridftp: feat.gridftp,
        feat: feat.lines.clone(),
        cache_file: xftp_tune::Cache::default_path().map(|p| p.display().to_string()),
        cached,
        cached_best: best,
        cached_best_put: best_put,
        initial_streams: n,
        initial_streams_put: n_put,
        reason,
        adaptive,
    })
}

fn render(p: &Probe) {
    out!("destination      {}", p.destination);
    match p.rtt_tcp_info_ms {
        Some(r) => out!("rtt (TCP_INFO)   {r:.3} ms"),
        None => out!("rtt (TCP_INFO)   unknown"),
    }
    out!(
        "rtt (NOOP)       {:.3} ms median of {}",
        p.rtt_noop_median_ms,
        p.rtt_noop_ms.len()
    );
    out!(
        "server features  MULT {}  MODE E {}  MPRT {}  GridFTP {}",
        yes(p.mult),
        yes(p.mode_e),
        yes(p.mprt),
        yes(p.gridftp)
    );
    out!(
        "cache            {} ({} fresh record(s))",
        p.cache_file.as_deref().unwrap_or("none"),
        p.cached.len()
    );
    for r in &p.cached {
        let way = match r.upload {
            Some(true) => "put",
            Some(false) => "get",
            None if r.streams == 0 => "probe",
            None => "-",
        };
        out!(
            "  {way:5}  rtt {:.3} ms  streams {}  {:.1} Mbit/s  {} bytes",
            r.rtt_us as f64 / 1e3,
            r.streams,
            r.throughput_bps / 1e6,
            r.bytes
        );
    }
    if p.initial_streams_put != p.initial_streams {
        out!(
            "put would start with {} connection(s)",
            p.initial_streams_put
        );
    }
    out!(
        "get would start with {} connection(s){}: {}",
        p.initial_streams,
        if p.adaptive {
            ", then adapt"
        } else {
            ", fixed"
        },
        p.reason
    );
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
