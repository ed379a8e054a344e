//! `xftp`: the command-line front end. Each subcommand lives in its own
//! module under `cmd/`; this file only parses arguments and dispatches.

/// `println!` that ignores a closed stdout (`xftp get --json | head -c
/// 10`): the reader left, which is no reason to panic in the middle of a
/// transfer or after it.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` (this shadows it for the whole binary) that ignores a
/// closed stderr (`xftp get ... 2>&1 | head -1`): std's panics there, and
/// a finished transfer then exited with 101 as if it had crashed. Control
/// characters are written escaped (`\u{1b}`): messages carry a server's
/// reply text and names from its listings, and a hostile one could
/// otherwise drive the terminal (retitle it, clear it, hide lines).
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "{}", $crate::printable(&format!($($arg)*)));
    }};
}

/// `s` with its control characters but line feeds and tabs escaped.
fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Multi-stream file transfer for long fat networks.
#[derive(Parser, Debug)]
#[command(name = "xftp", version, about, propagate_version = true)]
struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve a directory over FTP (with the xftp multi-stream extensions).
    Serve(cmd::serve::Args),
    /// Add a user to a users file, or set a new password (access and home kept unless given).
    Useradd(cmd::serve::UseraddArgs),
    /// Download a file: xftp get ftp://host/path [LOCAL].
    #[command(after_help = GET_EXAMPLES)]
    Get(cmd::transfer::GetArgs),
    /// Upload a file: xftp put LOCAL ftp://host/path.
    #[command(after_help = PUT_EXAMPLES)]
    Put(cmd::transfer::PutArgs),
    /// List a remote directory: xftp ls ftp://host/dir/.
    #[command(after_help = LS_EXAMPLES)]
    Ls(cmd::transfer::LsArgs),
    /// Interactive client in the spirit of ftp(1): xftp shell [URL].
    #[command(long_about = cmd::shell::ABOUT, after_long_help = cmd::shell::manual())]
    Shell(cmd::shell::ShellArgs),
    /// Measure a destination (RTT, features, cached history) and show the
    /// number of connections `-p auto` would start with.
    Probe(cmd::probe::ProbeArgs),
    /// Show the path cache (what `-p auto` starts from), or forget it:
    /// --forget HOST:PORT, --clear.
    Cache(cmd::cache::CacheArgs),
    /// Send stdin over N parallel TCP connections.
    Send(cmd::pipe::SendArgs),
    /// Receive a parallel stream and write it to stdout.
    Recv(cmd::pipe::RecvArgs),
}

const GET_EXAMPLES: &str = "\
Paths in ftp:// URLs are relative to the login directory (RFC 1738, as curl);
an absolute server path takes a second slash: ftp://host//data/run.h5
(globus-url-copy writes ftp://host/data/run.h5 for the same file).

Examples:
  xftp get ftp://data.example.org/pub/run.h5                 # anonymous, -p auto
  xftp get ftp://alice@data.example.org/run.h5 -p 8 --verify # XFTP_PASSWORD, 8 streams, SHA-256 check
  xftp get -c ftp://data.example.org/big.tar                 # resumable: run again after a cut
  xftp get -r ftp://data.example.org/results/ results        # a directory tree
  xftp get ftpes://secure.example.org/f --cacert ca.pem      # TLS, a private CA
  xftp get ftp://h/f --json --json-progress | jq .           # for programs";

const PUT_EXAMPLES: &str = "\
Examples:
  xftp put big.tar ftp://127.0.0.1:2121/incoming/            # to a directory: keeps the name
  xftp put -p 16 --verify big.tar ftp://alice@h/big.tar      # 16 streams, checked end to end
  xftp put -c big.tar ftp://h/big.tar                        # resumable (xftp servers)
  xftp put -r results ftp://h/archive/results/               # a directory tree
  xftp put --limit-rate 20M big.tar ftp://h/                 # at most 20 MiB/s";

const LS_EXAMPLES: &str = "\
Examples:
  xftp ls ftp://data.example.org/pub/
  xftp ls ftpes://alice@secure.example.org/ --json";

fn main() -> ExitCode {
    bound_the_heap();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--json` promises one object on stdout, also when the
            // command line itself is wrong (clap's text goes to stderr).
            let json = std::env::args().any(|a| a == "--json");
            if json && e.use_stderr() {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or("invalid command line");
                let msg = first.strip_prefix("error: ").unwrap_or(first);
                out!("{}", serde_json::json!({ "status": "error", "error": msg }));
            }
            e.exit()
        }
    };
    init_logging(cli.verbose, matches!(cli.command, Command::Serve(_)));
    cmd::transfer::set_verbose(cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xftp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let start = std::time::Instant::now();
    // get, put, ls and probe print one JSON object with --json, also when
    // a signal stops them.
    let json = match &cli.command {
        Command::Get(a) => a.json(),
        Command::Put(a) => a.json(),
        Command::Ls(a) => a.json(),
        Command::Probe(a) => a.json(),
        Command::Cache(a) => a.json(),
        Command::Send(a) => a.ep.json,
        Command::Recv(a) => a.ep.json,
        _ => false,
    };
    // The pipe's summary goes to stderr, with its own fields.
    let pipe = matches!(&cli.command, Command::Send(_) | Command::Recv(_));
    // An upload stopped by a signal first cleans up on the server: a stock
    // server keeps what came of a cut upload under the file's name.
    let graceful = matches!(&cli.command, Command::Put(_));
    let stopped_hint = match &cli.command {
        Command::Get(a) => a.stopped_hint(),
        _ => None,
    };
    let (result, interrupted) = rt.block_on(async move {
        let mut work = match cli.command {
            // The server ends on its own signals (it finishes transfers).
            Command::Serve(a) => return (cmd::serve::run(a).await, false),
            Command::Useradd(a) => return (cmd::serve::useradd(a), false),
            // The shell handles its own signals: Ctrl-C stops the command
            // that runs, not the shell.
            Command::Shell(a) => return (cmd::shell::run(a, cli.verbose).await, false),
            Command::Get(a) => Box::pin(cmd::transfer::get(a)) as Work,
            Command::Put(a) => Box::pin(cmd::transfer::put(a)),
            Command::Ls(a) => Box::pin(cmd::transfer::ls(a)),
            Command::Probe(a) => Box::pin(cmd::probe::run(a)),
            Command::Cache(a) => Box::pin(cmd::cache::run(a)),
            Command::Send(a) => Box::pin(cmd::pipe::send(a)),
            Command::Recv(a) => Box::pin(cmd::pipe::recv(a)),
        };
        // Dropping the command on SIGINT/SIGTERM runs its cleanup: a
        // download's temporary file is removed, data connections are
        // closed (an upload's with a reset, so the server does not take a
        // short stream-mode upload for a whole one). Killed by the signal
        // instead, a multi-gigabyte temporary would stay behind.
        tokio::select! {
            r = &mut work => (r, false),
            (name, code) = interrupted() => {
                if graceful {
                    eprintln!("xftp: interrupted ({name}); stopping the upload (a second signal quits at once)");
                    cmd::transfer::interrupt_token().cancel();
                    // Bounded: the server's reply to the reset upload and
                    // a DELE are each bounded already.
                    tokio::select! {
                        _ = tokio::time::timeout(GRACEFUL_STOP, &mut work) => {}
                        _ = interrupted() => {}
                    }
                }
                match stopped_hint {
                    Some(h) => eprintln!("xftp: interrupted ({name}); {h}"),
                    None if graceful => {}
                    None => eprintln!("xftp: interrupted ({name})"),
                }
                if json && pipe {
                    cmd::pipe::print_interrupted(name, start.elapsed());
                } else if json {
                    cmd::transfer::print_interrupted(name, start.elapsed());
                }
                (Ok(ExitCode::from(code)), true)
            }
        }
    });
    if interrupted {
        // A blocking read of stdin (`xftp send`) cannot be cancelled, and
        // dropping the runtime would wait for it: do not wait.
        rt.shutdown_timeout(std::time::Duration::from_millis(200));
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xftp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// glibc serves a large allocation with its own mapping, returned on
/// free, but after the first such free it raises that threshold to the
/// freed size: from then on Argon2's 19 MiB per password check come from
/// the heap's arenas, one per thread, and stay there. A server with named
/// users grew by 17 MB per login that way (1.6 GB after 96 uploads, never
/// given back). A fixed threshold keeps what is above it mapped and
/// returned; record buffers (256 KiB to 1 MiB) stay below it.
fn bound_the_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called first
    // thing in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}

/// How long an interrupted upload may take to clean up on the server.
const GRACEFUL_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// A running client command.
type Work = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<ExitCode>>>>;

/// Wait for SIGINT or SIGTERM; the signal's name and the shell's exit
/// status for it (128 + number).
async fn interrupted() -> (&'static str, u8) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let sigterm = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => ("SIGINT", 130),
            // No handler could be installed: never report a signal.
            Err(_) => std::future::pending().await,
        },
        _ = sigterm => ("SIGTERM", 143),
    }
}

fn init_logging(verbose: u8, server: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let asked = std::env::var_os("XFTP_LOG").is_some();
    let filter = EnvFilter::try_from_env("XFTP_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // No colour codes in a log file or a pipe.
        .with_ansi(std::io::stderr().is_terminal());
    // A client's warnings, with no log asked for, read as its other
    // messages do ("xftp: warning: ..."), not as a log with timestamps and
    // module paths; the server and -v keep the log's form.
    if server || verbose > 0 || asked {
        fmt.init();
    } else {
        fmt.event_format(Plain).init();
    }
}

/// The form of a client's warnings and errors at the default verbosity.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let word = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            _ => "note",
        };
        write!(w, "xftp: {word}: ")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn kind(args: &[&str]) -> Option<ErrorKind> {
        Cli::try_parse_from(args).err().map(|e| e.kind())
    }

    #[test]
    fn out_of_range_values_get_the_range_error() {
        // A negative number is a value (with the range in the message), not
        // an unknown flag.
        let bad = ErrorKind::ValueValidation;
        assert_eq!(kind(&["xftp", "get", "ftp://h/x", "-p", "-1"]), Some(bad));
        assert_eq!(
            kind(&["xftp", "get", "ftp://h/x", "--bufsize", "-5"]),
            Some(bad)
        );
        assert_eq!(
            kind(&["xftp", "probe", "ftp://h/", "--bufsize", "-5"]),
            Some(bad)
        );
        let serve = ["xftp", "serve", "--root", ".", "--anonymous"];
        assert_eq!(
            kind(&[&serve[..], &["--max-sessions", "0"]].concat()),
            Some(bad)
        );
        assert_eq!(kind(&[&serve[..], &["--max-sessions", "1"]].concat()), None);
        for t in ["--idle-timeout", "--data-timeout", "--stall-timeout"] {
            assert_eq!(kind(&[&serve[..], &[t, "0"]].concat()), Some(bad), "{t}");
            assert_eq!(kind(&[&serve[..], &[t, "1"]].concat()), None, "{t}");
        }
        assert_eq!(kind(&["xftp", "get", "ftp://h/x", "-p", "4"]), None);
        let send = ["xftp", "send", "127.0.0.1:9"];
        assert_eq!(
            kind(&[&send[..], &["--record-size", "1"]].concat()),
            Some(bad)
        );
        assert_eq!(
            kind(&[&send[..], &["--record-size", "4096"]].concat()),
            None
        );
    }
}
