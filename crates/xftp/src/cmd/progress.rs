//! The progress display of get and put: a bar on a terminal, JSON lines
//! for programs (`--json-progress`), nothing otherwise.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{DecimalBytes, HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use xftp_client::{Progress, Snapshot};

/// What to show.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mode {
    /// A bar on stderr.
    pub bar: bool,
    /// Per-connection rates beside the bar (`-v`).
    pub per_stream: bool,
    /// One JSON object per second on stdout.
    pub json: bool,
}

impl Mode {
    /// The bar when stderr is a terminal and neither `--quiet` nor
    /// `--json` was given; JSON lines when asked for.
    pub fn choose(quiet: bool, json: bool, json_progress: bool, verbose: u8) -> Mode {
        Mode {
            bar: !quiet && !json && !json_progress && std::io::stderr().is_terminal(),
            per_stream: verbose > 0,
            json: json_progress,
        }
    }

    fn any(self) -> bool {
        self.bar || self.json
    }
}

/// A running display; [`Display::finish`] stops it.
pub struct Display {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// One `--json-progress` line.
#[derive(Serialize)]
struct Line<'a> {
    r#type: &'static str,
    path: &'a str,
    bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    seconds: f64,
    /// Over the last second.
    rate_bps: f64,
    streams: usize,
    per_stream_bytes: &'a [u64],
}

/// Start showing `p` (no task at all when `mode` shows nothing).
pub fn start(p: Option<Arc<Progress>>, mode: Mode) -> Display {
    start_after(p, mode, 0)
}

/// Start showing `p` from its next transfer on: the counters of the
/// transfers `p` has already seen (a session that moves several files
/// shares one) are not drawn while the next one is being set up.
pub fn start_next(p: Arc<Progress>, mode: Mode) -> Display {
    let seen = p.snapshot().serial;
    start_after(Some(p), mode, seen)
}

fn start_after(p: Option<Arc<Progress>>, mode: Mode, seen: u64) -> Display {
    let task = p
        .filter(|_| mode.any())
        .map(|p| (p, oneshot::channel::<()>()));
    match task {
        None => Display {
            stop: None,
            task: None,
        },
        Some((p, (tx, rx))) => Display {
            stop: Some(tx),
            task: Some(tokio::spawn(run(p, mode, seen, rx))),
        },
    }
}

impl Display {
    /// Stop and clear the bar (the summary follows it).
    pub async fn finish(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

async fn run(p: Arc<Progress>, mode: Mode, seen: u64, mut stop: oneshot::Receiver<()>) {
    // Made when the first transfer begins: nothing is drawn while the
    // session logs in.
    let mut bar: Option<ProgressBar> = None;
    let mut serial = 0;
    let mut last_json = Instant::now();
    let mut prev_json: Option<Snapshot> = None;
    // (at, per-stream bytes) a second ago, for the per-stream rates.
    let mut window: Vec<(Instant, Vec<u64>)> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut stop => true,
        };
        let s = p.snapshot();
        if s.serial <= seen {
            if stopping {
                break;
            }
            continue;
        }
        if mode.bar && bar.is_none() {
            bar = Some(
                ProgressBar::with_draw_target(s.total, ProgressDrawTarget::stderr_with_hz(10))
                    .with_style(style(s.total)),
            );
        }
        if let Some(b) = &bar {
            if s.serial != serial {
                b.set_style(style(s.total));
                b.set_length(s.total.unwrap_or(0));
                b.reset();
                serial = s.serial;
                window.clear();
            }
            let now = Instant::now();
            window.push((now, s.per_stream.clone()));
            window.retain(|(t, _)| now.duration_since(*t) <= Duration::from_millis(1100));
            b.set_position(s.total.map_or(s.bytes, |t| s.bytes.min(t)));
            b.set_message(message(&s, mode.per_stream, &window));
        }
        if mode.json && (last_json.elapsed() >= Duration::from_secs(1) || stopping) {
            let since = prev_json
                .as_ref()
                .filter(|q| q.serial == s.serial)
                .map(|q| (q.bytes, q.elapsed));
            let rate = match since {
                Some((b, t)) if s.elapsed > t => {
                    (s.bytes.saturating_sub(b)) as f64 / (s.elapsed - t).as_secs_f64()
                }
                _ if s.elapsed > Duration::ZERO => s.bytes as f64 / s.elapsed.as_secs_f64(),
                _ => 0.0,
            };
            let line = Line {
                r#type: "progress",
                path: &s.label,
                bytes: s.bytes,
                total: s.total,
                seconds: s.elapsed.as_secs_f64(),
                rate_bps: rate,
                streams: s.active,
                per_stream_bytes: &s.per_stream,
            };
            if let Ok(text) = serde_json::to_string(&line) {
                out!("{text}");
            }
            last_json = Instant::now();
            prev_json = Some(s);
        }
        if stopping {
            break;
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

fn style(total: Option<u64>) -> ProgressStyle {
    let t = match total {
        Some(_) => "{decimal_bytes}/{decimal_total_bytes} [{bar:30}] {percent:>3}% {msg}",
        None => "{spinner} {decimal_bytes} {msg}",
    };
    ProgressStyle::with_template(t)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// "12.3 MB/s, ETA 0:42, 4 streams" (decimal units, as the summary line),
/// with `-v` each stream's rate; rates
/// over the last second (indicatif's own estimate starts from the bar's
/// creation, before the first byte, and overshoots).
fn message(s: &Snapshot, per_stream: bool, window: &[(Instant, Vec<u64>)]) -> String {
    let mut m = String::new();
    let span = match (window.first(), window.last()) {
        (Some((t0, a)), Some((t1, b))) if t1 > t0 => Some((t1.duration_since(*t0), a, b)),
        _ => None,
    };
    if let Some((dt, first, last)) = span {
        let dt = dt.as_secs_f64();
        let moved = |a: &[u64], b: &[u64]| -> u64 {
            b.iter()
                .enumerate()
                .map(|(i, x)| x.saturating_sub(a.get(i).copied().unwrap_or(0)))
                .sum()
        };
        let rate = moved(first, last) as f64 / dt;
        m.push_str(&format!("{}/s", DecimalBytes(rate as u64)));
        if let Some(total) = s.total {
            if rate > 0.0 {
                let left = total.saturating_sub(s.bytes) as f64 / rate;
                m.push_str(&format!(
                    ", ETA {}",
                    HumanDuration(Duration::from_secs_f64(left.ceil()))
                ));
            }
        }
        m.push_str(", ");
        if per_stream {
            let rates: Vec<String> = last
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let a = first.get(i).copied().unwrap_or(0);
                    format!("{:.1}", b.saturating_sub(a) as f64 / dt / 1e6)
                })
                .collect();
            m.push_str(&format!(
                "{} stream{} [MB/s: {}]",
                s.active,
                if s.active == 1 { "" } else { "s" },
                rates.join(" ")
            ));
            return m;
        }
    }
    m.push_str(&format!(
        "{} stream{}",
        s.active,
        if s.active == 1 { "" } else { "s" }
    ));
    m
}
