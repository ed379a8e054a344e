//! `xftp shell [URL]`: an interactive client in the spirit of ftp(1).
//!
//! Commands come from a terminal (rustyline: line editing, history) or,
//! when stdin is not a terminal, from a script read line by line that
//! stops at the first failing command.
//!
//! Built on the public `xftp_client` API only. A [`Client`] takes its
//! settings when it connects, so a changed `mult`, `bufsize`,
//! `passive`/`active` or `verify` is applied by connecting again before
//! the next data transfer (same server, user and remote directory).
//! Relative remote paths are left to the server, which resolves them
//! against the session's directory; the shell tracks that directory (PWD
//! after each CWD) only to restore it on a new connection.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use xftp_client::xftp_tune::{self, PathRecord, TuneConfig};
use xftp_client::{
    AutoConfig, Client, ClientConfig, ClientError, DataMode, FtpUrl, Progress, TransferReport,
    UrlTls, Verify, ANONYMOUS_PASSWORD,
};

use xftp_proto::facts::Kind;

use super::transfer::{
    bufsize_checked, cache_key, load_cache, parse_bufsize_arg, record_path, server_state_hint,
    BufArg, Parallel,
};

mod input;
mod words;

use input::{Got, Input};

/// Largest `mult`, as `-p` of get and put.
const MAX_MULT: u32 = 64;

/// How long cached path records seed the automatic mode (as get and put).
const CACHE_AGE: Duration = Duration::from_secs(24 * 3600);

/// What a command says when there is no session.
const NOT_CONNECTED: &str = "not connected — open a server first: open ftp://host/";

/// `xftp shell [URL]`
#[derive(clap::Args, Debug)]
pub struct ShellArgs {
    /// Server to open at start: ftp://[user[:password]@]host[:port]/[dir/]
    /// (ftpes:// for TLS, ftps:// for implicit TLS).
    url: Option<String>,
    /// Data connections per transfer at start (the `mult` command): `auto`
    /// (the default) or 1..=64.
    #[arg(short = 'p', long = "parallel", value_name = "N|auto", default_value = "auto", value_parser = parse_mult, allow_negative_numbers = true)]
    parallel: Parallel,
    /// TCP buffer of the data sockets at start (the `bufsize` command):
    /// bytes, with k/M/G, or `auto` (kernel autotuning, the default).
    #[arg(long, value_name = "BYTES", default_value = "auto", value_parser = parse_bufsize_arg, allow_negative_numbers = true)]
    bufsize: BufArg,
    /// Start in active mode (the `active` command).
    #[arg(long)]
    active: bool,
    /// Verify every transfer from the start (the `verify` command);
    /// --verify=ALG for one algorithm.
    #[arg(long, value_name = "ALG", num_args = 0..=1, require_equals = true, default_missing_value = "on", value_parser = parse_verify)]
    verify: Option<Verify>,
    /// Read the password of a named user from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Seconds to wait for a TCP connection to open.
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    connect_timeout: f64,
    /// Seconds to wait for a server reply, or for a stalled data connection.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout: f64,
    /// Trust only the CA certificate(s) in this PEM file (TLS).
    #[arg(long, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Do not verify the server's certificate (TLS).
    #[arg(long)]
    insecure: bool,
}

fn parse_mult(s: &str) -> Result<Parallel, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(Parallel::Auto);
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=MAX_MULT).contains(&n) => Ok(Parallel::Fixed(n)),
        _ => Err(format!(
            "{s:?} is not `auto` or a number of connections from 1 to {MAX_MULT}"
        )),
    }
}

fn parse_verify(s: &str) -> Result<Verify, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "auto" | "yes" => Ok(Verify::Auto),
        "off" | "no" => Ok(Verify::Off),
        _ => xftp_client::Algorithm::parse(s)
            .map(Verify::With)
            .map_err(|e| format!("{e} (or `on`, `off`)")),
    }
}

/// One line of `help`: the names (the first is canonical), the arguments
/// and what the command does.
struct Help {
    names: &'static [&'static str],
    args: &'static str,
    about: &'static str,
}

const COMMANDS: &[Help] = &[
    Help {
        names: &["open"],
        args: "URL | HOST [PORT]",
        about: "connect and log in: ftp://, ftpes:// (TLS), ftps:// (implicit TLS); a path in the URL becomes the remote directory",
    },
    Help {
        names: &["user"],
        args: "NAME [PASSWORD]",
        about: "log in again as NAME (password: as given, else from --password-file, XFTP_PASSWORD or a prompt)",
    },
    Help {
        names: &["close"],
        args: "",
        about: "end the session and stay in the shell",
    },
    Help {
        names: &["cd"],
        args: "DIR",
        about: "change the remote directory",
    },
    Help {
        names: &["lcd"],
        args: "[DIR]",
        about: "change the local directory (default: your home; ~ and ~/ as in a shell)",
    },
    Help {
        names: &["pwd"],
        args: "",
        about: "print the remote directory",
    },
    Help {
        names: &["lpwd"],
        args: "",
        about: "print the local directory",
    },
    Help {
        names: &["ls", "dir"],
        args: "[PATH]",
        about: "list a remote directory (the server's LIST output)",
    },
    Help {
        names: &["get"],
        args: "REMOTE [LOCAL]",
        about: "download a file (LOCAL: a file or an existing directory; default: the remote name here)",
    },
    Help {
        names: &["put"],
        args: "LOCAL [REMOTE]",
        about: "upload a file (REMOTE ending in / or absent: under the local name)",
    },
    Help {
        names: &["reget"],
        args: "REMOTE [LOCAL]",
        about: "download a file resumably (get -c): a partial copy left by an earlier reget is continued, only its missing ranges move; a failed reget keeps what arrived",
    },
    Help {
        names: &["reput"],
        args: "LOCAL [REMOTE]",
        about: "upload a file resumably (put -c, xftp servers): a partial upload the server kept is continued; a failed reput leaves what arrived there for the next",
    },
    Help {
        names: &["mget"],
        args: "[-c] PATTERN...",
        about: "download the remote files matching each pattern (*, ?, [..] in the last path component) into the local directory; -c: each as reget (run again after a cut, only what is missing moves)",
    },
    Help {
        names: &["mput"],
        args: "[-c] PATTERN...",
        about: "upload the local files matching each pattern into the remote directory; -c: each as reput",
    },
    Help {
        names: &["mkdir"],
        args: "DIR",
        about: "make a remote directory",
    },
    Help {
        names: &["rmdir"],
        args: "DIR",
        about: "remove an empty remote directory",
    },
    Help {
        names: &["delete", "rm"],
        args: "FILE",
        about: "delete a remote file",
    },
    Help {
        names: &["rename", "mv"],
        args: "FROM TO",
        about: "rename a remote file or directory",
    },
    Help {
        names: &["binary"],
        args: "",
        about: "TYPE I for listings (the default; transfers are always binary)",
    },
    Help {
        names: &["ascii"],
        args: "",
        about: "TYPE A for listings only: xftp moves files in binary",
    },
    Help {
        names: &["passive"],
        args: "",
        about: "passive data connections, the client connects (EPSV, else PASV); the default",
    },
    Help {
        names: &["active"],
        args: "",
        about: "active data connections, the server connects (EPRT, else PORT)",
    },
    Help {
        names: &["mult"],
        args: "[N|auto]",
        about: "data connections per transfer, 1..=64; `auto` (also without argument) chooses and adapts them",
    },
    Help {
        names: &["bufsize", "win", "sockbuf"],
        args: "[BYTES|auto]",
        about: "TCP buffer of the data sockets at both ends (k, M, G suffixes); `auto` (also without argument): kernel autotuning",
    },
    Help {
        names: &["verify"],
        args: "[on|off|ALG]",
        about: "compare each transferred file with the server's checksum (ALG: sha256, sha512, sha1, md5, crc32c, adler32, crc32); no argument: show",
    },
    Help {
        names: &["status"],
        args: "",
        about: "show the connection and the settings",
    },
    Help {
        names: &["help", "?"],
        args: "[COMMAND]",
        about: "list the commands, or show one",
    },
    Help {
        names: &["quit", "bye", "exit"],
        args: "",
        about: "close the session and leave",
    },
];

fn help_for(name: &str) -> Option<&'static Help> {
    COMMANDS.iter().find(|h| h.names.contains(&name))
}

/// The first paragraphs of `xftp shell --help`.
pub const ABOUT: &str = "\
An interactive FTP client in the spirit of ftp(1), with xftp's multi-stream
transfers.

Opens URL if given, then reads commands. On a terminal the prompt is
`xftp> `, with line editing, completion (Tab) and a history kept in
~/.cache/xftp/shell_history. When stdin is not a terminal it is a script:
one command per line, no prompt; the first command that fails ends the
shell with exit status 1 after `xftp: line N: ...` on stderr. An
anonymous login the server refuses is no failure, as in ftp(1): a `user`
line may follow (the commands that need a login fail without one).

Listings, pwd, lpwd, status and help go to stdout; transfer summaries,
notices and errors go to stderr.";

/// The rest of `xftp shell --help`, a manual page: the commands, how
/// settings apply, an example session.
pub fn manual() -> String {
    let mut m = String::from("COMMANDS\n");
    for h in COMMANDS {
        let usage = format!("{} {}", h.names.join(", "), h.args);
        m.push_str(&format!("    {}\n", usage.trim_end()));
        for line in wrap(h.about, 68) {
            m.push_str(&format!("        {line}\n"));
        }
    }
    m.push_str(
        "
    Arguments are split at blanks; quote a name with blanks (\"my file\" or
    'my file'), or escape one character with a backslash. Lines starting with
    # are comments. Relative remote paths are relative to the remote
    directory (cd), local ones to the local directory (lcd).

SETTINGS
    mult, bufsize, passive/active and verify take effect from the next
    transfer or listing: the shell then connects again with the same user and
    remote directory, and says so in one line. ascii and binary apply at once.

PASSWORDS
    For a named user: from the URL (ftp://user:password@host/, visible to
    ps(1); avoid), else the first line of --password-file, else XFTP_PASSWORD,
    else asked for on a terminal. Anonymous logins need none.

INTERRUPTS
    Ctrl-C stops the running command (a download's partial file is removed)
    and returns to the prompt; the next command connects again. Ctrl-C at the
    prompt clears the line; Ctrl-D or quit leaves.

EXIT STATUS
    0 after quit or the end of the input; 1 when a script command failed (or
    the URL given at start could not be opened from a script); 130 or 143
    after SIGINT (scripts) or SIGTERM.

ENVIRONMENT
    XFTP_PASSWORD      password of a named user
    XDG_CACHE_HOME     where xftp/shell_history lives (default ~/.cache)

EXAMPLE
    $ xftp shell ftp://alice@files.example.org/data/
    Password for alice@files.example.org:
    Connected to files.example.org:21 as alice; remote directory /data
    xftp> mult 8
    mult 8: from the next transfer (the shell connects again)
    xftp> get big.iso
    xftp: reconnecting to files.example.org:21 to apply mult
    big.iso: 4294967296 bytes in 36.712 s (117.0 MB/s, 8 connections)
    xftp> lcd /tmp/logs
    Local directory: /tmp/logs
    xftp> cd incoming
    xftp> mput *.log
    a.log: 1234 bytes in 0.004 s (0.3 MB/s, 1 connection)
    b.log: 5678 bytes in 0.005 s (1.1 MB/s, 1 connection)
    mput: 2 files, 6912 bytes
    xftp> quit

    A script from a pipe; it stops at the first failing command:
    $ printf 'cd in\\nput report.csv\\nls\\n' | xftp shell ftp://host/
",
    );
    m
}

/// The settings the next connection is made with.
#[derive(Debug, Clone)]
struct Settings {
    mult: Parallel,
    bufsize: Option<u64>,
    data_mode: DataMode,
    verify: Verify,
    ascii: bool,
    connect_timeout: Duration,
    timeout: Duration,
    password_file: Option<PathBuf>,
    cacert: Option<PathBuf>,
    insecure: bool,
}

/// The server the shell is talking to.
struct Conn {
    /// Host, port and TLS scheme (its user, password and path are not used
    /// after `open`: see the fields below).
    url: FtpUrl,
    user: Option<String>,
    password: Option<String>,
    /// `None` after a lost or abandoned connection: the next command
    /// connects again.
    client: Option<Client>,
    /// The remote directory (from PWD), restored on a new connection.
    cwd: Option<String>,
    /// Where a login lands (PWD right after it): a new connection is
    /// there already. (GridFTP's anonymous user lands in a PWD of
    /// `/nonexistent` that CWD refuses.)
    home: Option<String>,
    /// Settings changed since `client` connected.
    stale: Vec<&'static str>,
    /// Connections used by the last transfer, for `status`.
    last_streams: Option<usize>,
}

/// Whether the loop goes on.
enum Flow {
    Continue,
    Quit,
}

/// What failed, for the hint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Login,
    Get,
    Put,
    /// `reget`, `reput`: what arrived is kept when they fail.
    Reget,
    Reput,
    List,
    Cd,
    Other,
}

struct Shell {
    interactive: bool,
    verbose: u8,
    set: Settings,
    conn: Option<Conn>,
    /// The server of an `open` whose login was refused (or that could
    /// not connect): `user NAME` logs in there, as in ftp(1).
    refused: Option<FtpUrl>,
    input: Input,
    /// Shared by every connection, so one display follows all transfers.
    progress: Arc<Progress>,
    /// Cancelled by Ctrl-C during an upload, which then stops and cleans
    /// up on the server (`ClientConfig::interrupt`); a new one after.
    interrupt: CancellationToken,
    /// The words of the line running, as glob patterns
    /// ([`words::split_patterns`]): what mget and mput match.
    patterns: Vec<String>,
    /// The script line running (0: the URL given on the command line).
    lineno: u64,
}

/// Run the shell; exits with 0 after `quit` or the end of the input.
pub async fn run(a: ShellArgs, verbose: u8) -> anyhow::Result<ExitCode> {
    let secs = super::transfer::positive_secs;
    let set = Settings {
        mult: a.parallel,
        bufsize: a.bufsize.0,
        data_mode: if a.active {
            DataMode::Active
        } else {
            DataMode::Passive
        },
        verify: a.verify.unwrap_or_default(),
        ascii: false,
        connect_timeout: secs(a.connect_timeout, "connect-timeout")?,
        timeout: secs(a.timeout, "timeout")?,
        password_file: a.password_file,
        cacert: a.cacert,
        insecure: a.insecure,
    };
    let interactive = std::io::stdin().is_terminal();
    let mut sh = Shell {
        interactive,
        verbose,
        set,
        conn: None,
        refused: None,
        input: Input::start(interactive),
        progress: Progress::new(),
        interrupt: CancellationToken::new(),
        patterns: Vec::new(),
        lineno: 0,
    };
    let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    if let Some(url) = a.url {
        let words = vec!["open".to_string(), url];
        match sh.step(&words, &mut term).await {
            Step::Done(Ok(_)) => {}
            Step::Done(Err(e)) => {
                eprintln!("xftp: {e:#}");
                if !interactive {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Step::Signal(code) => return Ok(sh.end_by_signal(code)),
        }
    }
    let mut lineno = 0u64;
    loop {
        let got = tokio::select! {
            g = sh.input.line("xftp> ") => g,
            _ = term.recv() => return Ok(sh.end_by_signal(143)),
            _ = tokio::signal::ctrl_c(), if !interactive => return Ok(sh.end_by_signal(130)),
        };
        let line = match got {
            Got::Line(l) => l,
            // Ctrl-C at the prompt: a fresh line, as in bash.
            Got::Interrupted => continue,
            Got::Eof => break,
            Got::Failed(e) => {
                let at = if interactive {
                    String::new()
                } else {
                    format!("line {}: ", lineno + 1)
                };
                eprintln!("xftp: {at}cannot read a command: {e}");
                sh.close().await;
                return Ok(ExitCode::FAILURE);
            }
        };
        lineno += 1;
        sh.lineno = lineno;
        // Each word also as a glob pattern, for mget and mput.
        sh.patterns = words::split_patterns(&line).unwrap_or_default();
        let words = match words::split(&line) {
            Ok(w) => w,
            Err(e) => {
                if sh.fail(lineno, &anyhow::anyhow!("{e}")) {
                    sh.close().await;
                    return Ok(ExitCode::FAILURE);
                }
                continue;
            }
        };
        if words.is_empty() {
            continue;
        }
        match sh.step(&words, &mut term).await {
            Step::Done(Ok(Flow::Continue)) => {}
            Step::Done(Ok(Flow::Quit)) => break,
            Step::Done(Err(e)) => {
                if sh.fail(lineno, &e) {
                    sh.close().await;
                    return Ok(ExitCode::FAILURE);
                }
            }
            Step::Signal(code) => return Ok(sh.end_by_signal(code)),
        }
    }
    sh.close().await;
    Ok(ExitCode::SUCCESS)
}

/// How a command ended.
enum Step {
    Done(anyhow::Result<Flow>),
    /// A signal ended the shell: its exit status.
    Signal(u8),
}

impl Shell {
    /// Run one command, stopped by Ctrl-C (interactive: back to the
    /// prompt) or a signal that ends the shell.
    async fn step(&mut self, words: &[String], term: &mut tokio::signal::unix::Signal) -> Step {
        let interactive = self.interactive;
        // An upload stopped by a signal first cleans up on the server (a
        // stock server keeps a cut upload under the file's name), as `xftp
        // put` does; a second signal drops it at once.
        let upload = matches!(
            words.first().map(String::as_str),
            Some("put" | "reput" | "mput")
        );
        let token = self.interrupt.clone();
        let signal = {
            let exec = self.execute(words);
            tokio::pin!(exec);
            let signal = tokio::select! {
                r = &mut exec => return Step::Done(r),
                _ = tokio::signal::ctrl_c() => 130,
                _ = term.recv() => 143,
            };
            if upload {
                let nl = if interactive { "\n" } else { "" };
                eprintln!(
                    "{nl}xftp: interrupted; stopping the upload (a second signal stops at once)"
                );
                token.cancel();
                tokio::select! {
                    _ = tokio::time::timeout(GRACEFUL_STOP, &mut exec) => {}
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            signal
        };
        if token.is_cancelled() {
            self.interrupt = CancellationToken::new();
        }
        match signal {
            130 if interactive => {
                // Dropping the command cleaned up after it (a partial
                // download is removed), but the control connection may
                // still owe replies: start a fresh one next time.
                if let Some(c) = self.conn.as_mut() {
                    c.client = None;
                }
                if !upload {
                    eprintln!("\nxftp: interrupted");
                }
                Step::Done(Ok(Flow::Continue))
            }
            code => Step::Signal(code),
        }
    }

    /// Report a failed command; true when the shell must stop (a script).
    fn fail(&self, lineno: u64, e: &anyhow::Error) -> bool {
        if self.interactive {
            eprintln!("xftp: {e:#}");
            false
        } else {
            eprintln!("xftp: line {lineno}: {e:#}");
            true
        }
    }

    fn end_by_signal(&mut self, code: u8) -> ExitCode {
        self.input.restore_terminal();
        let name = if code == 130 { "SIGINT" } else { "SIGTERM" };
        // On a terminal the prompt or a progress bar holds the line.
        let nl = if self.interactive { "\n" } else { "" };
        eprintln!("{nl}xftp: interrupted ({name})");
        // Whatever a command left half done was dropped with it; the
        // session itself need not be ended politely.
        self.conn = None;
        ExitCode::from(code)
    }

    async fn close(&mut self) {
        self.refused = None;
        if let Some(conn) = self.conn.take() {
            if let Some(c) = conn.client {
                c.quit().await;
            }
        }
    }

    async fn execute(&mut self, words: &[String]) -> anyhow::Result<Flow> {
        let (verb, args) = match words.split_first() {
            Some((v, a)) => (v.to_ascii_lowercase(), a),
            None => return Ok(Flow::Continue),
        };
        let Some(h) = help_for(&verb) else {
            anyhow::bail!("unknown command {verb:?} — type `help` for the list of commands");
        };
        let name = h.names[0];
        let words;
        let args = match name {
            "get" | "reget" | "put" | "reput" | "mget" | "mput" | "mkdir" | "rmdir" | "delete"
            | "rename" => {
                words = file_words(name, args)?;
                &words[..]
            }
            _ => args,
        };
        let want = |lo: usize, hi: usize| -> anyhow::Result<()> {
            if args.len() < lo || args.len() > hi {
                anyhow::bail!("usage: {}", format!("{name} {}", h.args).trim_end());
            }
            Ok(())
        };
        match name {
            "open" => {
                want(1, 2)?;
                self.open(&args[0], args.get(1).map(String::as_str)).await?;
            }
            "user" => {
                want(1, 2)?;
                self.user(&args[0], args.get(1).cloned()).await?;
            }
            "close" => {
                want(0, 0)?;
                if self.conn.is_none() {
                    anyhow::bail!("not connected");
                }
                self.close().await;
                eprintln!("Closed.");
            }
            "cd" => {
                want(1, 1)?;
                self.cd(&args[0]).await?;
            }
            "lcd" => {
                want(0, 1)?;
                let home = || {
                    std::env::var_os("HOME")
                        .map(PathBuf::from)
                        .context("HOME is not set — give the directory: lcd DIR")
                };
                // `~` and `~/...` as a shell reads them.
                let dir = match args.first().map(String::as_str) {
                    None | Some("~") => home()?,
                    Some(d) => match d.strip_prefix("~/") {
                        Some(rest) => home()?.join(rest),
                        None => PathBuf::from(d),
                    },
                };
                std::env::set_current_dir(&dir)
                    .with_context(|| format!("cannot change to {}", dir.display()))?;
                eprintln!("Local directory: {}", local_dir()?);
            }
            "pwd" => {
                want(0, 0)?;
                let d = self.pwd().await?;
                out!("{d}");
            }
            "lpwd" => {
                want(0, 0)?;
                out!("{}", local_dir()?);
            }
            "ls" => {
                want(0, 1)?;
                let listing = self.listing(args.first().map(String::as_str)).await?;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&listing);
                let _ = out.flush();
            }
            "get" | "reget" => {
                want(1, 2)?;
                let resume = name == "reget";
                self.get(&args[0], args.get(1).map(PathBuf::from), resume)
                    .await?;
            }
            "put" | "reput" => {
                want(1, 2)?;
                let resume = name == "reput";
                self.put(Path::new(&args[0]), args.get(1).map(String::as_str), resume)
                    .await?;
            }
            "mget" => {
                want(1, usize::MAX)?;
                self.mget(args).await?;
            }
            "mput" => {
                want(1, usize::MAX)?;
                self.mput(args).await?;
            }
            "mkdir" => {
                want(1, 1)?;
                self.simple("MKD", &args[0], &[257, 250]).await?;
            }
            "rmdir" => {
                want(1, 1)?;
                self.simple("RMD", &args[0], &[250]).await?;
            }
            "delete" => {
                want(1, 1)?;
                self.simple("DELE", &args[0], &[250]).await?;
            }
            "rename" => {
                want(2, 2)?;
                let r = self.client(false).await?.rename(&args[0], &args[1]).await;
                r.map_err(|e| self.explain(e, Op::Other))?;
            }
            "binary" => {
                want(0, 0)?;
                self.set.ascii = false;
                eprintln!("Type binary (TYPE I).");
            }
            "ascii" => {
                want(0, 0)?;
                self.set.ascii = true;
                eprintln!("Listings use TYPE A; files still move in binary (TYPE I): xftp transfers exact bytes only.");
            }
            "passive" | "active" => {
                want(0, 0)?;
                let mode = if name == "active" {
                    DataMode::Active
                } else {
                    DataMode::Passive
                };
                if self.set.data_mode != mode {
                    self.set.data_mode = mode;
                    self.changed(name);
                }
                self.say_setting(&format!("{name} mode"));
            }
            "mult" => {
                want(0, 1)?;
                let m = parse_mult(args.first().map_or("auto", String::as_str))
                    .map_err(|e| anyhow::anyhow!("mult: {e}"))?;
                if self.set.mult != m {
                    self.set.mult = m;
                    self.changed("mult");
                }
                self.say_setting(&format!("mult {}", mult_text(m)));
            }
            "bufsize" => {
                want(0, 1)?;
                let b = bufsize_checked(args.first().map_or("auto", String::as_str))
                    .map_err(|e| anyhow::anyhow!("bufsize: {e}"))?;
                if self.set.bufsize != b {
                    self.set.bufsize = b;
                    self.changed("bufsize");
                }
                self.say_setting(&format!("bufsize {}", bufsize_text(b)));
            }
            "verify" => {
                want(0, 1)?;
                match args.first() {
                    None => out!("verify {}", verify_text(self.set.verify)),
                    Some(a) => {
                        let v = parse_verify(a).map_err(|e| anyhow::anyhow!("verify: {e}"))?;
                        if self.set.verify != v {
                            self.set.verify = v;
                            self.changed("verify");
                        }
                        self.say_setting(&format!("verify {}", verify_text(v)));
                    }
                }
            }
            "status" => {
                want(0, 0)?;
                self.status();
            }
            "help" => {
                want(0, 1)?;
                help(args.first().map(String::as_str))?;
            }
            "quit" => {
                want(0, 0)?;
                return Ok(Flow::Quit);
            }
            _ => anyhow::bail!("{name}: not implemented"),
        }
        Ok(Flow::Continue)
    }

    /// Note a changed setting: a live connection is replaced before the
    /// next transfer.
    fn changed(&mut self, what: &'static str) {
        if let Some(c) = self.conn.as_mut().filter(|c| c.client.is_some()) {
            if !c.stale.contains(&what) {
                c.stale.push(what);
            }
        }
    }

    fn say_setting(&self, what: &str) {
        if self.conn.as_ref().is_some_and(|c| !c.stale.is_empty()) {
            eprintln!("{what}: from the next transfer (the shell connects again)");
        } else {
            eprintln!("{what}");
        }
    }

    async fn open(&mut self, target: &str, port: Option<&str>) -> anyhow::Result<()> {
        if let Some(c) = &self.conn {
            anyhow::bail!("already connected to {} — `close` first", c.url.authority());
        }
        // `open host [port]` as in ftp(1); otherwise a URL.
        let text = if target.contains("://") {
            if port.is_some() {
                anyhow::bail!("give the port in the URL: ftp://host:PORT/");
            }
            target.to_string()
        } else {
            // `host:port` (one colon, digits after it) is no IPv6 address.
            if let Some((h, p)) = target.split_once(':') {
                if !p.contains(':') && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    anyhow::bail!(
                        "{target:?}: give the port apart — `open {h} {p}` — or as a URL: `open ftp://{h}:{p}/`"
                    );
                }
            }
            // A bare IPv6 address goes in brackets.
            let host = if target.contains(':') && !target.starts_with('[') {
                format!("[{target}]")
            } else {
                target.to_string()
            };
            match port {
                Some(p) => format!("ftp://{host}:{p}/"),
                None => format!("ftp://{host}/"),
            }
        };
        let url = FtpUrl::parse(&text)?;
        self.open_url(url).await
    }

    async fn open_url(&mut self, url: FtpUrl) -> anyhow::Result<()> {
        self.refused = None;
        // As `get` and `put`: a certificate option says TLS was meant, and
        // a session opened in clear would send the password as it is.
        if (self.set.cacert.is_some() || self.set.insecure) && url.tls == UrlTls::None {
            anyhow::bail!(
                "--cacert and --insecure are for TLS, and this is a clear ftp:// session: open ftpes://{}/ (TLS after connecting) or ftps://HOST:PORT/ (implicit TLS) instead",
                url.authority()
            );
        }
        if self.set.insecure && url.tls != UrlTls::None {
            eprintln!(
                "xftp: warning: --insecure: the server's certificate is not checked; the connection is encrypted, but anyone on the path can pose as the server"
            );
        }
        let password = match (&url.user, &url.password) {
            (Some(u), None) => Some(self.password_for(u, &url).await?),
            _ => url.password.clone(),
        };
        let dialed = dial(
            &self.set,
            &self.progress,
            &self.interrupt,
            &url,
            url.user.as_deref(),
            password.as_deref(),
        )
        .await;
        let mut client = match dialed {
            Ok(c) => c,
            Err(e) => {
                // Kept (without a password) for `user NAME`.
                let anonymous = e.is::<AnonymousRefused>();
                self.refused = Some(FtpUrl {
                    user: None,
                    password: None,
                    ..url
                });
                if anonymous {
                    // As ftp(1): the server is reached, the login is the
                    // next step, and a script's `user` line comes next.
                    let at = match (self.interactive, self.lineno) {
                        (false, n) if n > 0 => format!("line {n}: "),
                        _ => String::new(),
                    };
                    eprintln!("xftp: {at}{e:#}");
                    return Ok(());
                }
                return Err(e);
            }
        };
        let mut cwd = client.pwd().await.ok();
        let mut conn = Conn {
            user: url.user.clone(),
            password,
            client: None,
            cwd: None,
            home: cwd.clone(),
            stale: Vec::new(),
            last_streams: None,
            url,
        };
        let authority = conn.url.authority();
        let tls = client
            .tls_info()
            .map(|i| format!(", {} {}", i.version, i.cipher))
            .unwrap_or_default();
        let path = conn.url.path.clone();
        let cd = if path.is_empty() {
            Ok(())
        } else {
            match change_dir(&mut client, &path).await {
                Ok(d) => {
                    cwd = d;
                    Ok(())
                }
                Err(e) => Err(explain(e, Op::Cd, &authority)),
            }
        };
        conn.cwd = cwd;
        conn.client = Some(client);
        eprintln!(
            "Connected to {authority}{tls} as {}; remote directory {}",
            conn.user.as_deref().unwrap_or("anonymous"),
            conn.cwd.as_deref().unwrap_or("unknown")
        );
        self.conn = Some(conn);
        // Still connected when the directory does not exist.
        cd.map_err(|e| e.context(format!("cd {path}")))
    }

    /// A named user's password: given in the URL, else --password-file,
    /// else XFTP_PASSWORD, else asked for on a terminal.
    async fn password_for(&mut self, user: &str, url: &FtpUrl) -> anyhow::Result<String> {
        if is_anonymous(user) {
            return Ok(ANONYMOUS_PASSWORD.to_string());
        }
        if let Some(f) = &self.set.password_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the password file {}", f.display()))?;
            return Ok(text.lines().next().unwrap_or("").to_owned());
        }
        if let Ok(p) = std::env::var("XFTP_PASSWORD") {
            return Ok(p);
        }
        if !self.interactive {
            anyhow::bail!(
                "no password for user {user:?} — set XFTP_PASSWORD, use --password-file FILE, or give it: user {user} PASSWORD"
            );
        }
        match self
            .input
            .secret(&format!("Password for {user}@{}: ", url.host))
            .await
        {
            Got::Line(p) => Ok(p),
            Got::Interrupted | Got::Eof => anyhow::bail!("no password given"),
            Got::Failed(e) => anyhow::bail!("cannot read the password: {e}"),
        }
    }

    async fn user(&mut self, name: &str, password: Option<String>) -> anyhow::Result<()> {
        let url = match (&self.conn, self.refused.clone()) {
            (Some(c), _) => c.url.clone(),
            // After `open host` was refused (anonymous logins off, say):
            // the login goes to that server, as in ftp(1).
            (None, Some(r)) => {
                let password = match password {
                    Some(p) => p,
                    None => self.password_for(name, &r).await?,
                };
                let url = FtpUrl {
                    user: Some(name.to_string()),
                    password: Some(password),
                    ..r
                };
                return self.open_url(url).await;
            }
            (None, None) => anyhow::bail!(NOT_CONNECTED),
        };
        let password = match password {
            Some(p) => p,
            None => self.password_for(name, &url).await?,
        };
        // The new login is made before the old one ends: a refused one
        // leaves the session as it was.
        let mut client = dial(
            &self.set,
            &self.progress,
            &self.interrupt,
            &url,
            Some(name),
            Some(&password),
        )
        .await?;
        let cwd = client.pwd().await.ok();
        let Some(conn) = self.conn.as_mut() else {
            anyhow::bail!(NOT_CONNECTED);
        };
        if let Some(old) = conn.client.replace(client) {
            old.quit().await;
        }
        conn.user = Some(name.to_string());
        conn.password = Some(password);
        conn.home = cwd.clone();
        conn.cwd = cwd;
        conn.stale.clear();
        eprintln!(
            "Logged in as {name}; remote directory {}",
            conn.cwd.as_deref().unwrap_or("unknown")
        );
        Ok(())
    }

    /// The session's client, connecting again when the last connection was
    /// lost or, before a data transfer (`data`), when settings changed.
    async fn client(&mut self, data: bool) -> anyhow::Result<&mut Client> {
        let Some(conn) = self.conn.as_mut() else {
            anyhow::bail!(NOT_CONNECTED);
        };
        let closed = match conn.client.as_mut() {
            Some(c) => !c.still_open().await,
            None => false,
        };
        let why = if closed {
            // An idle timeout: the user and directory are known, so the
            // command goes on, on a new connection.
            Some("(the server closed the idle connection)".to_string())
        } else if conn.client.is_none() {
            Some("(the last connection was lost or interrupted)".to_string())
        } else if data && !conn.stale.is_empty() {
            Some(format!("to apply {}", conn.stale.join(", ")))
        } else {
            None
        };
        if let Some(why) = why {
            if let Some(old) = conn.client.take() {
                old.quit().await;
            }
            let authority = conn.url.authority();
            eprintln!("xftp: reconnecting to {authority} {why}");
            let mut c = dial(
                &self.set,
                &self.progress,
                &self.interrupt,
                &conn.url,
                conn.user.as_deref(),
                conn.password.as_deref(),
            )
            .await?;
            if let Some(d) = conn.cwd.as_ref().filter(|d| Some(*d) != conn.home.as_ref()) {
                change_dir(&mut c, d)
                    .await
                    .map_err(|e| explain(e, Op::Cd, &authority))
                    .with_context(|| format!("cannot return to {d}"))?;
            }
            conn.stale.clear();
            conn.client = Some(c);
        }
        conn.client
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!(NOT_CONNECTED))
    }

    /// The hint for a failed operation; a connection that may be out of
    /// step is dropped, and the next command connects again.
    fn explain(&mut self, e: ClientError, op: Op) -> anyhow::Error {
        let authority = self
            .conn
            .as_ref()
            .map(|c| c.url.authority())
            .unwrap_or_default();
        if let Some(c) = self.conn.as_mut() {
            // A refusal leaves the session in step, unless the replies a
            // failed exchange still owed did not come (Client::in_step).
            let in_step = c.client.as_ref().is_some_and(|cl| cl.in_step());
            if !keeps_session(&e) || !in_step {
                c.client = None;
            }
        }
        explain(e, op, &authority)
    }

    async fn cd(&mut self, dir: &str) -> anyhow::Result<()> {
        let r = change_dir(self.client(false).await?, dir).await;
        let d = r.map_err(|e| self.explain(e, Op::Cd))?;
        if let Some(c) = self.conn.as_mut() {
            c.cwd = d;
        }
        Ok(())
    }

    async fn pwd(&mut self) -> anyhow::Result<String> {
        let r = self.client(false).await?.pwd().await;
        let d = r.map_err(|e| self.explain(e, Op::Other))?;
        if let Some(c) = self.conn.as_mut() {
            c.cwd = Some(d.clone());
        }
        Ok(d)
    }

    /// MKD, RMD, DELE: one command, one expected reply.
    async fn simple(&mut self, verb: &'static str, arg: &str, codes: &[u16]) -> anyhow::Result<()> {
        let r = self
            .client(false)
            .await?
            .command(verb, Some(arg), codes)
            .await;
        r.map_err(|e| self.explain(e, Op::Other))?;
        Ok(())
    }

    async fn listing(&mut self, path: Option<&str>) -> anyhow::Result<Vec<u8>> {
        let ascii = self.set.ascii;
        let r = list(self.client(true).await?, path, ascii).await;
        if ascii && r.is_err() {
            // The session may be left in TYPE A: a new one starts in TYPE I.
            if let Some(c) = self.conn.as_mut() {
                c.client = None;
            }
        }
        r.map_err(|e| self.explain(e, Op::List))
    }

    /// Download one file (resumably: `reget`); the bytes moved.
    async fn get(
        &mut self,
        remote: &str,
        local: Option<PathBuf>,
        resume: bool,
    ) -> anyhow::Result<u64> {
        if remote.is_empty() {
            anyhow::bail!("an empty name — give the remote file's name (see `ls`)");
        }
        let name = base_name(remote).ok_or_else(|| {
            anyhow::anyhow!(
                "{remote} names a directory, not a file — give a file's name (see `ls`)"
            )
        })?;
        let target = match local {
            None => xftp_proto::name::to_path(name),
            Some(p) if p.is_dir() => p.join(xftp_proto::name::to_path(name)),
            // As `xftp get` says it.
            Some(p) if p.as_os_str().as_encoded_bytes().ends_with(b"/") => anyhow::bail!(
                "{} does not exist as a directory — make it first, or drop the trailing / to name the file",
                p.display()
            ),
            Some(p) => p,
        };
        // The sessions of a ranged download (a server without MULT) log in
        // afresh, in the login directory: a path relative to this shell's
        // directory goes out absolute, as PWD gave it.
        let remote = match self.conn.as_ref().and_then(|c| c.cwd.as_deref()) {
            Some(d) if !remote.starts_with('/') => xftp_client::tree::join(d, remote),
            _ => remote.to_string(),
        };
        let (progress, mode) = (self.progress.clone(), self.display_mode());
        let start = Instant::now();
        let r = {
            let c = self.client(true).await?;
            let display = super::progress::start_next(progress, mode);
            c.set_resume(resume);
            let r = c.download(&remote, &target).await;
            c.set_resume(false);
            display.finish().await;
            r
        };
        self.notices();
        let op = if resume { Op::Reget } else { Op::Get };
        let r = r.map_err(|e| self.explain(e, op))?;
        self.conclude(name, &r, start, false);
        Ok(r.bytes)
    }

    /// Upload one file (resumably: `reput`); the bytes moved.
    async fn put(
        &mut self,
        local: &Path,
        remote: Option<&str>,
        resume: bool,
    ) -> anyhow::Result<u64> {
        if !local.is_file() {
            anyhow::bail!(
                "{} is not a readable regular file — check the local path (`lpwd`)",
                local.display()
            );
        }
        let name = local
            .file_name()
            .map(xftp_proto::name::from_os)
            .ok_or_else(|| anyhow::anyhow!("{} has no usable file name", local.display()))?;
        let remote = match remote {
            None => name.to_string(),
            Some(r) if r.ends_with('/') => format!("{r}{name}"),
            Some(r) => r.to_string(),
        };
        let (progress, mode) = (self.progress.clone(), self.display_mode());
        let start = Instant::now();
        let r = {
            let c = self.client(true).await?;
            let display = super::progress::start_next(progress, mode);
            c.set_resume(resume);
            let r = c.upload(local, &remote).await;
            c.set_resume(false);
            display.finish().await;
            r
        };
        self.notices();
        let op = if resume { Op::Reput } else { Op::Put };
        let r = r.map_err(|e| self.explain(e, op))?;
        self.conclude(&remote, &r, start, true);
        Ok(r.bytes)
    }

    /// `args` as glob patterns: quoted or escaped wildcards match
    /// themselves.
    fn patterns_of(&self, args: &[String]) -> Vec<String> {
        match self.patterns.split_first() {
            Some((_, p)) if p.len() == args.len() => p.to_vec(),
            _ => args.to_vec(),
        }
    }

    async fn mget(&mut self, args: &[String]) -> anyhow::Result<()> {
        let args = self.patterns_of(args);
        let (resume, patterns) = resume_flag("mget", &args)?;
        // Every pattern is expanded first: one that matches nothing fails
        // the command before anything moves.
        let mut files = Vec::new();
        for pat in patterns {
            files.extend(self.remote_glob(pat).await?);
        }
        let mut bytes = 0u64;
        let mut failed = 0usize;
        for remote in &files {
            // One file that fails (unreadable, gone) does not keep the
            // others from coming, as in ftp(1); the command fails at the
            // end.
            match self.get(remote, None, resume).await {
                Ok(b) => bytes += b,
                Err(e) => {
                    eprintln!("xftp: {e:#}");
                    failed += 1;
                }
            }
        }
        summary("mget", files.len(), failed, bytes)
    }

    async fn mput(&mut self, args: &[String]) -> anyhow::Result<()> {
        let args = self.patterns_of(args);
        let (resume, patterns) = resume_flag("mput", &args)?;
        let mut files = Vec::new();
        for pat in patterns {
            let matches = local_glob(pat)?;
            if matches.is_empty() {
                anyhow::bail!("no local file matches {pat:?} — check with `lpwd` and the pattern");
            }
            files.extend(matches);
        }
        let mut bytes = 0u64;
        let mut failed = 0usize;
        for f in &files {
            if self.interrupt.is_cancelled() {
                // Stopped by a signal: no next file.
                anyhow::bail!("interrupted");
            }
            match self.put(f, None, resume).await {
                Ok(b) => bytes += b,
                Err(e) => {
                    eprintln!("xftp: {e:#}");
                    failed += 1;
                }
            }
        }
        summary("mput", files.len(), failed, bytes)
    }

    /// The remote files a pattern names: itself when it has no wildcard,
    /// else the plain files (and links) of its directory whose names match.
    async fn remote_glob(&mut self, pat: &str) -> anyhow::Result<Vec<String>> {
        if !has_wildcard(pat) {
            return Ok(vec![pat.to_string()]);
        }
        let (dir, base) = match pat.rsplit_once('/') {
            Some(("", b)) => (Some("/"), b),
            Some((d, b)) => (Some(d), b),
            None => (None, pat),
        };
        if dir.is_some_and(has_wildcard) {
            anyhow::bail!("{pat:?}: wildcards work in the last path component only");
        }
        let pattern = glob::Pattern::new(base).with_context(|| format!("bad pattern {pat:?}"))?;
        let files = self.remote_files(dir).await?;
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            // As in a shell: `*` does not match hidden files.
            require_literal_leading_dot: true,
        };
        let mut names: Vec<String> = files
            .iter()
            .filter(|n| pattern.matches_with(n, opts))
            .map(|n| match dir {
                Some("/") => format!("/{n}"),
                Some(d) => format!("{d}/{n}"),
                None => n.to_string(),
            })
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            let ls = match dir {
                Some(d) => format!("ls {}", words::quote(d)),
                None => "ls".into(),
            };
            anyhow::bail!("no remote file matches {pat:?} — check with `{ls}`");
        }
        Ok(names)
    }

    /// The names of the plain files (and links) in a remote directory
    /// (`Client::entries`: MLSD where the server has it, else LIST). The
    /// client has no NLST, which could not tell files from directories
    /// anyway.
    async fn remote_files(&mut self, dir: Option<&str>) -> anyhow::Result<Vec<String>> {
        let c = self.client(true).await?;
        let r = c.entries(dir.unwrap_or(".")).await;
        let entries = r.map_err(|e| self.explain(e, Op::List))?;
        Ok(entries
            .into_iter()
            .filter(|e| matches!(e.kind, Kind::File | Kind::Other))
            .map(|e| e.name)
            .collect())
    }

    fn display_mode(&self) -> super::progress::Mode {
        super::progress::Mode::choose(false, false, false, self.verbose)
    }

    fn notices(&mut self) {
        if let Some(c) = self.conn.as_mut().and_then(|c| c.client.as_mut()) {
            super::transfer::print_notices(c);
        }
    }

    /// Print the summary of a transfer, as get and put do, and record an
    /// automatic transfer in the path cache.
    fn conclude(&mut self, what: &str, r: &TransferReport, start: Instant, upload: bool) {
        if r.bytes == 0 && r.already > 0 {
            eprintln!(
                "{what}: complete already ({} bytes in place, the same size and time): nothing moved",
                r.already
            );
            if let Some(c) = &r.checksum {
                eprintln!("{what}: verified, {} {} at both ends", c.algorithm, c.value);
            }
            return;
        }
        let secs = r.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            r.bytes as f64 / secs
        } else {
            0.0
        };
        let n = r.streams();
        eprintln!(
            "{what}: {} bytes in {secs:.3} s ({:.1} MB/s, {n} connection{})",
            r.bytes,
            rate / 1e6,
            if n == 1 { "" } else { "s" }
        );
        // A reget or reput that continued a cut transfer, either way.
        if r.already > 0 {
            eprintln!("{what}: {} bytes were in place already", r.already);
        }
        if let Some(c) = &r.checksum {
            eprintln!("{what}: verified, {} {} at both ends", c.algorithm, c.value);
        }
        tracing::debug!("{what}: {:.3} s in all", start.elapsed().as_secs_f64());
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        conn.last_streams = Some(n);
        // Not for the small files of an mget or mput: their rate and
        // count say little of the path, and each record rewrites the
        // cache file.
        if let Some(t) = r
            .timeline
            .as_ref()
            .filter(|_| r.bytes >= super::transfer::RECORD_MIN_BYTES)
        {
            let rec = PathRecord {
                when: xftp_tune::cache::now_secs(),
                rtt_us: t.rtt_floor_us.unwrap_or(0),
                streams: t.best_streams,
                throughput_bps: rate * 8.0,
                bytes: r.bytes,
                upload: Some(upload),
                started: t.adaptive.then_some(t.start),
            };
            record_path(&cache_key(&conn.url), rec);
        }
    }

    fn status(&self) {
        match &self.conn {
            None => out!("Not connected."),
            Some(c) => {
                let state = match &c.client {
                    Some(cl) => match cl.tls_info() {
                        Some(i) => format!("connected, TLS {} {}", i.version, i.cipher),
                        None => "connected, no TLS".to_string(),
                    },
                    None => "connection closed; the next command connects again".to_string(),
                };
                out!("Server: {} ({state})", c.url.authority());
                out!("User: {}", c.user.as_deref().unwrap_or("anonymous"));
                out!(
                    "Remote directory: {}",
                    c.cwd.as_deref().unwrap_or("unknown")
                );
            }
        }
        out!(
            "Local directory: {}",
            local_dir().unwrap_or_else(|e| format!("unknown ({e})"))
        );
        let mode = match self.set.data_mode {
            DataMode::Passive => "passive",
            DataMode::Active => "active",
            DataMode::Mprt => "active (MPRT)",
        };
        out!("Data connections: {mode}");
        let last = self
            .conn
            .as_ref()
            .and_then(|c| c.last_streams)
            .map(|n| format!(" (last transfer: {n})"))
            .unwrap_or_default();
        out!("Mult: {}{last}", mult_text(self.set.mult));
        let mut buf = bufsize_text(self.set.bufsize);
        if let Some(b) = self
            .conn
            .as_ref()
            .and_then(|c| c.client.as_ref())
            .and_then(|c| c.buffers())
        {
            if let Some(f) = b.in_force {
                buf.push_str(&format!("; in force: {} bytes", f.rcv.min(f.snd)));
            }
            if let Some(r) = b.server_reply {
                buf.push_str(&format!("; server: {r}"));
            }
        }
        out!("Bufsize: {buf}");
        out!("Verify: {}", verify_text(self.set.verify));
        out!(
            "Type: {}",
            if self.set.ascii {
                "ascii for listings (files move in binary)"
            } else {
                "binary"
            }
        );
        if let Some(c) = self.conn.as_ref().filter(|c| !c.stale.is_empty()) {
            out!(
                "Pending: the next transfer connects again to apply {}",
                c.stale.join(", ")
            );
        }
    }
}

/// An anonymous login the server refused: `open` has reached a server
/// that wants `user NAME`, which is no failure of `open` (ftp(1)).
#[derive(Debug)]
struct AnonymousRefused(String);

impl std::fmt::Display for AnonymousRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnonymousRefused {}

/// How long an interrupted upload may take to clean up on the server
/// (its reset, the server's reply, a DELE: each bounded already).
const GRACEFUL_STOP: Duration = Duration::from_secs(10);

/// Connect and log in with the shell's settings; the login's replies are
/// read here, so a refusal is reported by the command that asked.
async fn dial(
    set: &Settings,
    progress: &Arc<Progress>,
    interrupt: &CancellationToken,
    url: &FtpUrl,
    user: Option<&str>,
    password: Option<&str>,
) -> anyhow::Result<Client> {
    let authority = url.authority();
    let (streams, auto) = match set.mult {
        Parallel::Fixed(n) => (n, None),
        Parallel::Auto => {
            // Both directions': the shell's count is chosen at login, for
            // whatever transfer comes.
            let cached_best = load_cache().and_then(|c| c.best(&cache_key(url), CACHE_AGE, None));
            let tune = TuneConfig::default();
            (1, Some(AutoConfig { tune, cached_best }))
        }
    };
    let cfg = ClientConfig {
        connect_timeout: set.connect_timeout,
        reply_timeout: set.timeout,
        data_timeout: set.timeout,
        data_mode: set.data_mode,
        streams,
        bufsize: set.bufsize,
        auto,
        static_split: false,
        tls: tls_setup(url, set)?,
        verify: set.verify,
        progress: Some(progress.clone()),
        limit_rate: None,
        resume: false,
        interrupt: Some(interrupt.clone()),
    };
    let mut client = Client::connect(&url.host, url.port, cfg.clone())
        .await
        .map_err(|e| explain(e, Op::Login, &authority))?;
    let password = match (user, password) {
        (Some(u), None) if is_anonymous(u) => Some(ANONYMOUS_PASSWORD),
        (_, p) => p,
    };
    if let Err(e) = client.login(user, password).await {
        let anonymous = match user {
            None => true,
            Some(u) => is_anonymous(u),
        };
        return Err(match (e.reply_code(), anonymous) {
            _ if requires_tls(&e) => explain(e, Op::Login, &authority),
            (Some(530), true) => anyhow::Error::new(AnonymousRefused(format!(
                "{e} — the server refuses anonymous logins: log in with `user NAME`"
            ))),
            (Some(530), false) => {
                anyhow::anyhow!("{e} — check the user name and password (`user NAME`)")
            }
            _ => explain(e, Op::Login, &authority),
        });
    }
    // Notices (a refused MULT, SITE BUFSIZE) wait for the next transfer,
    // which may say more (ranged sessions instead of MULT) in their place.
    // More sessions like this one, for ranged downloads from a server
    // without MULT.
    client.set_sessions(super::transfer::session_factory(
        &url.host,
        url.port,
        user,
        cfg,
        password.map(str::to_owned),
    ));
    Ok(client)
}

pub(crate) fn is_anonymous(user: &str) -> bool {
    user.eq_ignore_ascii_case("anonymous") || user.eq_ignore_ascii_case("ftp")
}

/// The TLS the URL's scheme asks for (the shell has no `--tls`: ftpes://).
fn tls_setup(url: &FtpUrl, set: &Settings) -> anyhow::Result<Option<xftp_client::TlsSetup>> {
    let implicit = match url.tls {
        UrlTls::Implicit => true,
        UrlTls::Explicit => false,
        UrlTls::None => return Ok(None),
    };
    if let Some(f) = &set.cacert {
        xftp_client::xftp_tls::client::ClientTls::check_cacert(f).context("--cacert")?;
    }
    Ok(Some(xftp_client::TlsSetup {
        implicit,
        server_name: url.host.clone(),
        verify: xftp_client::xftp_tls::client::ClientTlsConfig {
            cacert: set.cacert.clone(),
            insecure: set.insecure,
        },
    }))
}

/// CWD, then PWD for the directory now in force (`None`: the server did
/// not say).
async fn change_dir(c: &mut Client, dir: &str) -> Result<Option<String>, ClientError> {
    c.command("CWD", Some(dir), &[250, 200]).await?;
    Ok(c.pwd().await.ok())
}

/// LIST, under TYPE A when `ascii` is set and TYPE I again after (the
/// client moves files in binary only; it sent TYPE I at login).
async fn list(c: &mut Client, path: Option<&str>, ascii: bool) -> Result<Vec<u8>, ClientError> {
    if ascii {
        c.command("TYPE", Some("A"), &[200]).await?;
    }
    let l = c.list(path).await;
    if ascii {
        c.command("TYPE", Some("I"), &[200]).await?;
    }
    l
}

/// Errors after which the control connection is still in step: the server
/// answered (or nothing was sent). After any other the shell starts a new
/// connection rather than guess what the old one still owes.
fn keeps_session(e: &ClientError) -> bool {
    match e {
        ClientError::Reply { code, .. } => *code != 421,
        ClientError::BadArgument { .. }
        | ClientError::NotThere { .. }
        | ClientError::NotListed { .. }
        | ClientError::Usage(_)
        | ClientError::UploadResumeUnsupported
        | ClientError::ChecksumMismatch { .. } => true,
        _ => false,
    }
}

/// A refusal that says TLS is required.
fn requires_tls(e: &ClientError) -> bool {
    matches!(e, ClientError::Reply { code: 530 | 521 | 534, text, .. }
        if text.contains("TLS") || text.contains("PROT"))
}

/// Attach the likely fix to an error, in terms of shell commands.
fn explain(e: ClientError, op: Op, authority: &str) -> anyhow::Error {
    if requires_tls(&e) {
        return anyhow::anyhow!("{e} — the server requires TLS: open ftpes://{authority}/");
    }
    if let (ClientError::UploadResumeUnsupported, Op::Reput) = (&e, op) {
        return anyhow::anyhow!(
            "reput needs an xftp server (SITE RESUMABLE with MODE E), and this one does not list both MULT and MODE E — use `put`, which sends the file whole"
        );
    }
    // A transfer cut on the way, which running it again may complete.
    let cut = match &e {
        e if e.at_login() => false,
        ClientError::Reply { code, .. } => matches!(code, 421 | 425 | 426),
        ClientError::ShortTransfer { expected, got } => got <= expected,
        ClientError::StripeFault(m) => !m.starts_with("storage:"),
        ClientError::Timeout { .. }
        | ClientError::Closed
        | ClientError::ControlIo(_)
        | ClientError::DataIo(_)
        | ClientError::Stripe(_) => true,
        _ => false,
    };
    let again = match op {
        Op::Get if cut => Some("`reget` keeps what arrives and continues where a cut left off"),
        Op::Put if cut => Some("`reput` (xftp servers) keeps what arrives for the next"),
        Op::Reget if cut => {
            Some("what arrived is kept: `reget` again fetches only what is missing")
        }
        Op::Reput if cut => {
            Some("what arrived is kept on the server: `reput` again sends only what is missing")
        }
        _ => None,
    };
    if let (Some(a), Op::Reget | Op::Reput) = (again, op) {
        return anyhow::anyhow!("{e} — {a}");
    }
    // A resumable download keeps its partial when the local write fails
    // too (a full disk): "nothing was kept" would be wrong.
    if let (ClientError::StripeFault(m), Op::Reget) = (&e, op) {
        if m.starts_with("storage:") {
            return anyhow::anyhow!(
                "{e} — writing the local file failed (a full disk?); its partial download is kept: free space, then `reget` again continues from what its record names"
            );
        }
    }
    let op = match op {
        Op::Reget => Op::Get,
        Op::Reput => Op::Put,
        o => o,
    };
    let fix: Option<String> = match &e {
        ClientError::Reply { code, .. } => match (code, op) {
            (550, Op::Get) => Some("check the name with `ls`".into()),
            (550, Op::List | Op::Cd) => Some("check the directory with `ls` and `pwd`".into()),
            (550 | 553, Op::Put) => Some(
                "check that the remote directory exists and that you may write there (`ls`, `pwd`)"
                    .into(),
            ),
            (550 | 553, _) => Some("check the name with `ls`, and your permissions".into()),
            (530, _) => Some("log in with `user NAME`".into()),
            (452 | 552 | 421, _) => server_state_hint(*code, &e),
            (425 | 426, _) => Some(
                "the data connection failed; try `active` (or `passive`), or check firewalls"
                    .into(),
            ),
            _ => None,
        },
        ClientError::Connect { addr, source } => Some(super::transfer::connect_hint(
            *addr,
            source,
            authority.rsplit(':').next().and_then(|p| p.parse().ok()),
            &format!("is an FTP server running at {authority}? check the host and port"),
        )),
        ClientError::Resolve { .. } => Some("check the host name".into()),
        ClientError::Timeout { .. } if e.at_login() => Some(
            "the server greeted, then stopped answering at the login: it may be overloaded, or the path stalled; try again later (`open`)"
                .into(),
        ),
        ClientError::Timeout { .. } => Some(
            "the server or network is not answering; try again, or switch `active` / `passive`"
                .into(),
        ),
        ClientError::Closed | ClientError::ControlIo(_) => {
            Some("the connection is gone; the next command connects again".into())
        }
        ClientError::ShortTransfer { expected, got } if got > expected => Some(
            "the file changed on the server during the transfer (nothing was kept); try again when it is complete"
                .into(),
        ),
        ClientError::ShortTransfer { .. } => {
            Some("the transfer was cut short (nothing was kept); try again".into())
        }
        ClientError::PastEnd { .. } => Some(
            "if the server cannot restart transfers, fetch the whole file with `get` (the partial is kept as it was before)"
                .into(),
        ),
        ClientError::LocalFileChanged { .. } => {
            Some("something is writing the local file: send it again once it is complete".into())
        }
        ClientError::UploadMismatch { .. } => Some(
            "the upload was cut short, or the file was changed on the server meanwhile; check it, or try again"
                .into(),
        ),
        ClientError::DataIo(_) => Some("the data connection broke; try again".into()),
        ClientError::SourceChanged { partial, .. } => Some(match op {
            Op::Put | Op::Reput => format!(
                "the server's {} is of another version and could not be deleted: send the file with `put`",
                partial.display()
            ),
            _ => format!(
                "remove {} and its .ranges file (or `get` it whole, which removes them) to fetch the new version",
                partial.display()
            ),
        }),
        ClientError::ChangedDuring { .. } => {
            Some("run it again once the file is no longer being replaced".into())
        }
        ClientError::ChecksumMismatch { .. } => Some(match op {
            Op::Put => "the server's copy differs from the local file and was deleted; try again".into(),
            _ => "the copy differs from the server's file and was not kept; try again".into(),
        }),
        ClientError::StripeFault(m) if m.starts_with("storage:") => {
            Some("writing the local file failed (nothing was kept); check the disk and the path".into())
        }
        ClientError::Stripe(_) | ClientError::StripeFault(_) => Some(
            "a data connection broke mid-transfer (nothing was kept); try again, perhaps with a smaller `mult`"
                .into(),
        ),
        ClientError::Local { .. } => Some("check the local path and its permissions".into()),
        _ => None,
    };
    match (fix, again) {
        (Some(f), Some(a)) => anyhow::anyhow!("{e} — {f}; {a}"),
        (Some(f), None) => anyhow::anyhow!("{e} — {f}"),
        (None, Some(a)) => anyhow::anyhow!("{e} — {a}"),
        (None, None) => anyhow::Error::new(e),
    }
}

fn help(cmd: Option<&str>) -> anyhow::Result<()> {
    match cmd {
        None => {
            out!("Commands (help COMMAND for one):");
            for h in COMMANDS {
                let usage = format!("{} {}", h.names.join(", "), h.args);
                out!("  {usage:<34} {}", first_clause(h.about));
            }
        }
        Some(c) => {
            let h = help_for(&c.to_ascii_lowercase())
                .ok_or_else(|| anyhow::anyhow!("no command {c:?} — type `help` for the list"))?;
            out!("{} {}", h.names[0], h.args);
            if h.names.len() > 1 {
                out!("  (also: {})", h.names[1..].join(", "));
            }
            out!("  {}", h.about);
        }
    }
    Ok(())
}

/// Words of `s` in lines of at most `width` characters.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for w in s.split_whitespace() {
        if !cur.is_empty() && cur.len() + 1 + w.len() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// The part of a description before its first colon or parenthesis, for
/// the one-line list.
fn first_clause(s: &str) -> &str {
    let end = s.find([':', '(', ';']).unwrap_or(s.len());
    s[..end].trim_end().trim_end_matches(',')
}

fn mult_text(m: Parallel) -> String {
    match m {
        Parallel::Auto => "auto (chosen and adapted while transfers run)".into(),
        Parallel::Fixed(n) => n.to_string(),
    }
}

fn bufsize_text(b: Option<u64>) -> String {
    match b {
        None => "auto (kernel autotuning)".into(),
        Some(n) => format!("{n} bytes"),
    }
}

fn verify_text(v: Verify) -> String {
    match v {
        Verify::Off => "off".into(),
        Verify::Auto => "on (the strongest checksum the server offers)".into(),
        Verify::With(a) => format!("on ({a})"),
    }
}

fn local_dir() -> anyhow::Result<String> {
    let d = std::env::current_dir().context("cannot read the local directory")?;
    Ok(d.display().to_string())
}

/// The last component of a remote path, `None` for a directory-like one.
fn base_name(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next().unwrap_or("");
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}

/// mget's or mput's last word: the count, and an error if any failed.
fn summary(cmd: &str, files: usize, failed: usize, bytes: u64) -> anyhow::Result<()> {
    if failed > 0 {
        anyhow::bail!("{cmd}: {failed} of {files} files failed ({bytes} bytes moved)");
    }
    if files > 1 {
        eprintln!("{cmd}: {files} files, {bytes} bytes");
    }
    Ok(())
}

/// The file words of a command: an option it does not take (`get -r`)
/// is refused rather than sent as a file name (`RETR -r`), and `--` ends
/// the options: a word after it that begins with `-` is a file, `./-x`.
/// `mget`/`mput` take a leading `-c` ([`resume_flag`]).
fn file_words(cmd: &str, args: &[String]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(args.len());
    let mut options = true;
    for (i, a) in args.iter().enumerate() {
        if options && a == "--" {
            options = false;
            continue;
        }
        if a.len() > 1 && a.starts_with('-') {
            if !options {
                out.push(format!("./{a}"));
                continue;
            }
            if !(i == 0 && a == "-c" && matches!(cmd, "mget" | "mput")) {
                anyhow::bail!(
                    "{cmd}: {a} is not an option of the shell's {cmd} (`help {cmd}` shows what it takes; a tree is `xftp get -r`/`xftp put -r`); a file named {a} is ./{a}, or put -- before it"
                );
            }
        }
        out.push(a.clone());
    }
    Ok(out)
}

/// `mget`/`mput`'s leading `-c` (resumable, as `reget`/`reput`) and the
/// patterns after it. A file named `-c` is `./-c`.
fn resume_flag<'a>(cmd: &str, args: &'a [String]) -> anyhow::Result<(bool, &'a [String])> {
    match args.split_first() {
        Some((flag, rest)) if flag == "-c" => {
            if rest.is_empty() {
                anyhow::bail!("{cmd} -c needs a pattern — e.g. `{cmd} -c *.bin`");
            }
            Ok((true, rest))
        }
        _ => Ok((false, args)),
    }
}

fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The regular files a local pattern matches, in order. Names are matched
/// in their escaped form ([`xftp_proto::name`]), as remote ones are: the
/// glob crate's own walk panicked on a name that is not UTF-8.
fn local_glob(pat: &str) -> anyhow::Result<Vec<PathBuf>> {
    if !has_wildcard(pat) {
        return Ok(vec![PathBuf::from(pat)]);
    }
    // As a shell: `*` does not match a leading dot (`mput *` in a home
    // directory must not send .netrc), nor `/`.
    let opts = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let start = if pat.starts_with('/') { "/" } else { "" };
    let mut paths = vec![PathBuf::from(start)];
    for part in pat.split('/').filter(|c| !c.is_empty()) {
        if !has_wildcard(part) {
            for p in &mut paths {
                p.push(xftp_proto::name::to_path(part));
            }
            continue;
        }
        let pattern = glob::Pattern::new(part).with_context(|| format!("bad pattern {pat:?}"))?;
        let mut next = Vec::new();
        for p in &paths {
            let dir = if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p.as_path()
            };
            // As a shell: a directory that cannot be read matches nothing.
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut names: Vec<std::ffi::OsString> = entries
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for n in names {
                if pattern.matches_with(&xftp_proto::name::from_os(&n), opts) {
                    next.push(p.join(n));
                }
            }
        }
        paths = next;
    }
    paths.retain(|p| p.is_file());
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_a_command_does_not_take_are_refused_not_sent_as_names() {
        let w = |cmd: &str, a: &[&str]| {
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            file_words(cmd, &a).map_err(|e| e.to_string())
        };
        assert!(w("get", &["-r", "tree"])
            .unwrap_err()
            .contains("-r is not an option"));
        assert!(w("get", &["-c", "f"]).unwrap_err().contains("./-c"));
        assert_eq!(w("mget", &["-c", "*.bin"]).unwrap(), ["-c", "*.bin"]);
        assert_eq!(w("mget", &["--", "-c"]).unwrap(), ["./-c"]);
        assert_eq!(w("get", &["--", "-x", "y"]).unwrap(), ["./-x", "y"]);
        assert_eq!(w("put", &["-", "x"]).unwrap(), ["-", "x"]);
    }

    #[test]
    fn command_names_are_unique_and_aliases_resolve() {
        let mut seen = std::collections::HashSet::new();
        for h in COMMANDS {
            for n in h.names {
                assert!(seen.insert(*n), "{n} twice");
            }
        }
        assert!(help_for("win").is_some_and(|h| h.names[0] == "bufsize"));
        assert!(help_for("bye").is_some_and(|h| h.names[0] == "quit"));
        // lftp's names for them.
        assert!(help_for("rm").is_some_and(|h| h.names[0] == "delete"));
        assert!(help_for("mv").is_some_and(|h| h.names[0] == "rename"));
        assert!(help_for("nlst").is_none());
    }

    #[test]
    fn mult_and_verify_arguments() {
        assert_eq!(parse_mult("auto"), Ok(Parallel::Auto));
        assert_eq!(parse_mult("4"), Ok(Parallel::Fixed(4)));
        assert!(parse_mult("0").is_err() && parse_mult("65").is_err());
        assert_eq!(parse_verify("on"), Ok(Verify::Auto));
        assert_eq!(parse_verify("OFF"), Ok(Verify::Off));
        assert_eq!(
            parse_verify("sha256"),
            Ok(Verify::With(xftp_client::Algorithm::Sha256))
        );
        assert!(parse_verify("maybe").is_err());
    }

    #[test]
    fn names_and_patterns() {
        assert_eq!(base_name("dir/f.bin"), Some("f.bin"));
        assert_eq!(base_name("f"), Some("f"));
        assert_eq!(base_name("dir/"), None);
        assert_eq!(base_name(".."), None);
        assert!(has_wildcard("*.bin") && has_wildcard("a?") && has_wildcard("[ab]"));
        assert!(!has_wildcard("plain.txt"));
        assert_eq!(
            first_clause("connect and log in: ftp://"),
            "connect and log in"
        );
    }

    #[test]
    fn only_server_answers_keep_the_session() {
        let refused = ClientError::Reply {
            command: "RETR x".into(),
            code: 550,
            text: "no".into(),
        };
        assert!(keeps_session(&refused));
        let closing = ClientError::Reply {
            command: "RETR x".into(),
            code: 421,
            text: "bye".into(),
        };
        assert!(!keeps_session(&closing));
        assert!(!keeps_session(&ClientError::Closed));
    }

    #[test]
    fn a_cut_transfer_points_to_reget_and_reput() {
        let cut = || ClientError::ShortTransfer {
            expected: 10,
            got: 4,
        };
        let get = explain(cut(), Op::Get, "h").to_string();
        assert!(
            get.contains("nothing was kept") && get.contains("`reget`"),
            "{get}"
        );
        let reget = explain(cut(), Op::Reget, "h").to_string();
        assert!(!reget.contains("nothing was kept"), "{reget}");
        assert!(reget.contains("what arrived is kept"), "{reget}");
        let reput = explain(cut(), Op::Reput, "h").to_string();
        assert!(reput.contains("`reput` again"), "{reput}");
        // Not for what running again cannot mend.
        let refused = ClientError::Reply {
            command: "RETR f".into(),
            code: 550,
            text: "no such file".into(),
        };
        let r = explain(refused, Op::Reget, "h").to_string();
        assert!(r.contains("check the name") && !r.contains("reget"), "{r}");
        let stock = ClientError::UploadResumeUnsupported;
        let r = explain(stock, Op::Reput, "h").to_string();
        assert!(r.contains("use `put`"), "{r}");
    }
}
