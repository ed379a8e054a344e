//! `xftp`: the command-line front end. Each subcommand lives in its own
//! module under `cmd/`; this file only parses arguments and dispatches.

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
    /// Add or replace a user in a users file (password stored hashed).
    Useradd(cmd::serve::UseraddArgs),
    /// Download a file: xftp get ftp://host/path [LOCAL].
    Get(cmd::transfer::GetArgs),
    /// Upload a file: xftp put LOCAL ftp://host/path.
    Put(cmd::transfer::PutArgs),
    /// List a remote directory: xftp ls ftp://host/dir/.
    Ls(cmd::transfer::LsArgs),
    /// Measure a destination (RTT, features, cached history) and show the
    /// number of connections `-p auto` would start with.
    Probe(cmd::probe::ProbeArgs),
    /// Send stdin over N parallel TCP connections.
    Send(cmd::pipe::SendArgs),
    /// Receive a parallel stream and write it to stdout.
    Recv(cmd::pipe::RecvArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
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
    let result = rt.block_on(async move {
        match cli.command {
            Command::Serve(a) => cmd::serve::run(a).await,
            Command::Useradd(a) => cmd::serve::useradd(a),
            Command::Get(a) => cmd::transfer::get(a).await,
            Command::Put(a) => cmd::transfer::put(a).await,
            Command::Ls(a) => cmd::transfer::ls(a).await,
            Command::Probe(a) => cmd::probe::run(a).await,
            Command::Send(a) => cmd::pipe::send(a).await,
            Command::Recv(a) => cmd::pipe::recv(a).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xftp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("XFTP_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
