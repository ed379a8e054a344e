//! `xftp cache`: what the path cache holds (the records `-p auto` starts
//! from, docs/tuning.md), and forgetting them.

use std::process::ExitCode;
use std::time::Duration;

use xftp_client::xftp_tune::Cache;
use xftp_client::FtpUrl;

use super::transfer::cache_key;

/// How long cached records are used (as for transfers).
const CACHE_AGE: Duration = Duration::from_secs(24 * 3600);

/// `xftp cache [--forget DEST | --clear]`
#[derive(clap::Args, Debug)]
pub struct CacheArgs {
    /// Forget one destination's records: HOST:PORT as listed (or an
    /// ftp:// URL of it), e.g. after the path to it changed.
    #[arg(long, value_name = "HOST:PORT")]
    forget: Option<String>,
    /// Forget every record.
    #[arg(long, conflicts_with = "forget")]
    clear: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl CacheArgs {
    /// Whether the output is JSON.
    pub fn json(&self) -> bool {
        self.json
    }
}

pub async fn run(a: CacheArgs) -> anyhow::Result<ExitCode> {
    let Some(path) = Cache::default_path() else {
        anyhow::bail!(
            "no path cache: neither XDG_CACHE_HOME nor HOME names an absolute directory — set one of them"
        );
    };
    if a.clear || a.forget.is_some() {
        let dest = match a.forget.as_deref() {
            Some(d) if d.contains("://") => Some(cache_key(&FtpUrl::parse(d)?)),
            Some(d) => Some(d.to_owned()),
            None => None,
        };
        let mut found = true;
        if path.exists() {
            Cache::update_at(&path, |c| match &dest {
                Some(d) => found = c.forget(d),
                None => c.clear(),
            })?;
        } else {
            found = dest.is_none();
        }
        if let (false, Some(d)) = (found, &dest) {
            anyhow::bail!(
                "{d}: no records in {} (`xftp cache` lists the destinations)",
                path.display()
            );
        }
        if a.json {
            out!(
                "{}",
                serde_json::json!({ "status": "ok", "cache_file": path, "forgot": dest.as_deref().unwrap_or("*") })
            );
        } else {
            match &dest {
                Some(d) => out!("forgot {d}"),
                None => out!("cleared {}", path.display()),
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let cache = Cache::load(&path);
    if a.json {
        let dests: serde_json::Map<String, serde_json::Value> = cache
            .destinations()
            .map(|(d, recs)| {
                let best = |up| cache.best(d, CACHE_AGE, Some(up));
                (
                    d.to_owned(),
                    serde_json::json!({
                        "records": recs,
                        "best_get": best(false),
                        "best_put": best(true),
                    }),
                )
            })
            .collect();
        out!(
            "{}",
            serde_json::json!({ "status": "ok", "cache_file": path, "destinations": dests })
        );
        return Ok(ExitCode::SUCCESS);
    }
    out!("cache file {}", path.display());
    let mut any = false;
    for (d, recs) in cache.destinations() {
        any = true;
        let best = |up| {
            cache
                .best(d, CACHE_AGE, Some(up))
                .map_or("-".to_string(), |(n, bps)| {
                    format!("{n} ({:.1} Mbit/s)", bps / 1e6)
                })
        };
        out!(
            "{d}: {} record(s); -p auto starts get at {}, put at {}",
            recs.len(),
            best(false),
            best(true)
        );
    }
    if !any {
        out!("(empty)");
    }
    Ok(ExitCode::SUCCESS)
}
