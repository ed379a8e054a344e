//! `xftp-netem`: run an emulated WAN link between two network namespaces.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use xftp_netem::units::{parse_duration, parse_probability, parse_queue, parse_rate};
use xftp_netem::{DirectionSpec, Link, LinkSpec, QueueLimit};

/// WAN link emulator: two network namespaces joined by a user-space
/// forwarder with rate, delay, queue, loss, bit errors and a TCP window cap.
#[derive(Parser, Debug)]
#[command(name = "xftp-netem", version, about)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the link and forward until SIGINT/SIGTERM, then print counters.
    Run(Box<RunArgs>),
    /// Delete the namespaces a link of this name left behind.
    Down {
        /// Link name (namespaces NAMEa and NAMEb).
        #[arg(long)]
        name: String,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Link name: namespaces NAMEa (198.18.0.1) and NAMEb (198.18.0.2).
    #[arg(long)]
    name: String,
    /// Bottleneck rate A->B, e.g. 100mbit, 1.544mbit, 1gbit (default: none;
    /// `none`, `unlimited` or 0 say so).
    #[arg(long, value_parser = rate_arg)]
    rate: Option<Rate>,
    /// One-way delay A->B, e.g. 50ms.
    #[arg(long, value_parser = parse_duration, default_value = "0")]
    delay: Duration,
    /// Drop-tail queue A->B: packets (100p) or bytes (64kb).
    #[arg(long, value_parser = parse_queue, default_value = "1000p")]
    queue: QueueLimit,
    /// Random loss probability A->B, e.g. 0.001 or 0.1%.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    loss: f64,
    /// Bit error rate A->B, e.g. 1e-7.
    #[arg(long, value_parser = parse_probability, default_value = "0")]
    ber: f64,
    /// Rate B->A (default: same as --rate).
    #[arg(long, value_parser = rate_arg)]
    rate_back: Option<Rate>,
    /// Delay B->A (default: same as --delay).
    #[arg(long, value_parser = parse_duration)]
    delay_back: Option<Duration>,
    /// Queue B->A (default: same as --queue).
    #[arg(long, value_parser = parse_queue)]
    queue_back: Option<QueueLimit>,
    /// Loss B->A (default: same as --loss).
    #[arg(long, value_parser = parse_probability)]
    loss_back: Option<f64>,
    /// Bit error rate B->A (default: same as --ber).
    #[arg(long, value_parser = parse_probability)]
    ber_back: Option<f64>,
    /// Seed for loss and bit errors (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// Largest TCP window any connection may advertise, in bytes; e.g.
    /// 24576 or 196608. Up to 65535 window scaling is stripped from SYNs;
    /// above, it is kept and the scaled window lowered.
    #[arg(long)]
    max_window: Option<u32>,
    /// MTU of both ends.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// TCP congestion control inside both namespaces (e.g. reno, cubic);
    /// default: the kernel's (bbr here).
    #[arg(long)]
    cc: Option<String>,
    /// Batch window: packets may leave up to this much early, so that one
    /// wake-up serves several (less CPU at high packet rates).
    #[arg(long, value_parser = parse_duration, default_value = "250us")]
    batch: Duration,
    /// Keep the forwarder threads at normal priority (nice -10) instead of
    /// real-time round-robin priority 1.
    #[arg(long)]
    no_realtime: bool,
    /// Fault injection: every DURATION (e.g. 5s), reset one TCP flow (the
    /// next segment from A to B becomes a RST, so the connection dies at
    /// both ends).
    #[arg(long, value_parser = parse_duration)]
    reset_every: Option<Duration>,
    /// Fault injection: AT+LEN (e.g. 5s+60s): from AT after the start, for
    /// LEN, drop every segment of the TCP flows that carried 256 KiB or
    /// more before AT (bulk data connections); smaller flows (control
    /// connections) and flows opened later pass.
    #[arg(long, value_parser = parse_blackhole)]
    blackhole: Option<(Duration, Duration)>,
    /// Print the final counters as JSON.
    #[arg(long)]
    json: bool,
}

/// A parsed rate; `None` inside means unlimited. (A newtype because clap
/// reads `Option<Option<_>>` as a flag with an optional value.)
#[derive(Debug, Clone, Copy)]
struct Rate(Option<u64>);

fn rate_arg(s: &str) -> Result<Rate, xftp_netem::units::ParseError> {
    parse_rate(s).map(Rate)
}

impl RunArgs {
    fn spec(&self) -> LinkSpec {
        let fwd = DirectionSpec {
            rate_bps: self.rate.and_then(|r| r.0),
            delay: self.delay,
            queue: self.queue,
            loss: self.loss,
            ber: self.ber,
        };
        let back = DirectionSpec {
            rate_bps: self.rate_back.map_or(fwd.rate_bps, |r| r.0),
            delay: self.delay_back.unwrap_or(fwd.delay),
            queue: self.queue_back.unwrap_or(fwd.queue),
            loss: self.loss_back.unwrap_or(fwd.loss),
            ber: self.ber_back.unwrap_or(fwd.ber),
        };
        LinkSpec {
            name: self.name.clone(),
            a_to_b: fwd,
            b_to_a: back,
            max_window: self.max_window,
            mtu: self.mtu,
            seed: self.seed,
            congestion_control: self.cc.clone(),
            batch: self.batch,
            realtime: !self.no_realtime,
            reset_every: self.reset_every,
            blackhole: self.blackhole,
        }
    }
}

/// `AT+LEN`, both durations.
fn parse_blackhole(s: &str) -> Result<(Duration, Duration), String> {
    let (at, len) = s
        .split_once('+')
        .ok_or_else(|| format!("{s:?}: expected AT+LEN, e.g. 5s+60s"))?;
    let d = |x: &str| parse_duration(x).map_err(|e| format!("{x:?}: {e}"));
    Ok((d(at)?, d(len)?))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .init();
    let result = match cli.command {
        Cmd::Run(args) => run(*args),
        Cmd::Down { name } => down(&name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xftp-netem: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> Result<()> {
    let mut spec = args.spec();
    // A lossy link's draws replay only with their seed: one drawn here is
    // said (stderr, and the JSON's spec), not lost.
    let random = [&spec.a_to_b, &spec.b_to_a]
        .iter()
        .any(|d| d.loss > 0.0 || d.ber > 0.0);
    if spec.seed.is_none() && random {
        let seed = xftp_netem::random_seed();
        spec.seed = Some(seed);
        eprintln!("xftp-netem: seed {seed} (--seed {seed} replays this link's losses)");
    }
    // Block the stop signals before any thread starts, so every thread
    // inherits the mask and only sigwait below sees them.
    let signals = StopSignals::block().context("cannot block SIGINT/SIGTERM")?;
    let link = Link::start(spec.clone()).context("cannot start the link")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "ready A={}@{} B={}@{}",
            link.addr_a(),
            link.ns_a(),
            link.addr_b(),
            link.ns_b()
        )
        .and_then(|_| out.flush())
        .context("cannot write to stdout")?;
    }
    let sig = signals.wait();
    tracing::info!("signal {sig}: stopping");
    let counters = link.stop().context("forwarder failed")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = serde_json::json!({ "spec": spec, "counters": counters });
        writeln!(out, "{v}")?;
    } else {
        for (label, c) in [("A->B", counters.a_to_b), ("B->A", counters.b_to_a)] {
            writeln!(
                out,
                "{label}: {} packets {} bytes, drops queue {} loss {} ber {}, window rewrites {}, write errors {}, resets {}, blackholed {}",
                c.packets, c.bytes, c.queue_drops, c.loss_drops, c.ber_drops, c.window_rewrites, c.write_errors, c.resets, c.blackholed
            )?;
        }
    }
    Ok(())
}

fn down(name: &str) -> Result<()> {
    let removed = xftp_netem::remove_leftovers(name)?;
    if removed.is_empty() {
        println!("nothing to remove for {name}");
    } else {
        println!("removed {}", removed.join(" "));
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, blocked so they can be waited for.
struct StopSignals {
    set: libc::sigset_t,
}

impl StopSignals {
    fn block() -> std::io::Result<StopSignals> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset before
        // use; pthread_sigmask only reads it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(StopSignals { set })
        }
    }

    fn wait(&self) -> i32 {
        let mut sig: libc::c_int = 0;
        loop {
            // SAFETY: set was initialised in block(); sig is a live int.
            let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
            if rc == 0 {
                return sig;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn spec_of(args: &[&str]) -> LinkSpec {
        let mut argv = vec!["xftp-netem", "run", "--name", "t"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).expect("parses").command {
            Cmd::Run(r) => r.spec(),
            Cmd::Down { .. } => panic!("wrong subcommand"),
        }
    }

    #[test]
    fn back_direction_copies_forward_unless_given() {
        let s = spec_of(&["--rate", "100mbit", "--delay", "50ms", "--loss", "0.01"]);
        assert_eq!(s.a_to_b, s.b_to_a);
        assert_eq!(s.a_to_b.rate_bps, Some(100_000_000));
        assert_eq!(s.a_to_b.delay, Duration::from_millis(50));

        let s = spec_of(&[
            "--rate",
            "100mbit",
            "--rate-back",
            "1mbit",
            "--delay-back",
            "5ms",
        ]);
        assert_eq!(s.b_to_a.rate_bps, Some(1_000_000));
        assert_eq!(s.b_to_a.delay, Duration::from_millis(5));
        assert_eq!(s.a_to_b.delay, Duration::ZERO);
    }

    #[test]
    fn defaults_are_an_unshaped_link() {
        let s = spec_of(&[]);
        assert_eq!(s.a_to_b, DirectionSpec::default());
        assert_eq!(s.mtu, 1500);
        assert_eq!(s.max_window, None);
    }
}
