//! `xftp serve` and `xftp useradd`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;
use xftp_server::{Access, Config, UserDb};

/// Arguments of `xftp serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Directory to serve; clients cannot leave it.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Address to listen on (port 0 picks a free port). IPv6: [::1]:2121.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:2121", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Allow anonymous login (USER anonymous or ftp, any password), read-only.
    #[arg(long)]
    pub anonymous: bool,
    /// Let anonymous users write (implies --anonymous).
    #[arg(long)]
    pub anonymous_write: bool,
    /// Users file made with `xftp useradd`; read again on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub users: Option<PathBuf>,
    /// Most data connections one transfer may use (MULT).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_streams: u32,
    /// Data connections granted to a bare MULT.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub default_streams: u32,
    /// Close control connections idle this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Give up on a data connection that does not arrive within SECS (425).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub data_timeout: u64,
    /// Bytes per block of the multi-stream transfers the server sends.
    #[arg(long, value_name = "BYTES", default_value = "256k", value_parser = parse_record_size)]
    pub record_size: u32,
    /// Abort a transfer whose data connections move nothing for SECS (426).
    #[arg(long, value_name = "SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,
    /// On SIGTERM or SIGINT, wait up to SECS for running transfers, then
    /// end their sessions (a second signal ends them at once).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub shutdown_grace: u64,
    /// Most concurrent sessions.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_sessions: usize,
    /// TLS certificate chain (PEM, leaf first); read again on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert; read again on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// off: no TLS; optional: AUTH TLS offered (the default with a
    /// certificate); required: nothing but AUTH, FEAT, HELP, NOOP, SYST and
    /// QUIT before AUTH TLS, and every data connection under PROT P.
    #[arg(long, value_name = "MODE", value_enum)]
    pub tls: Option<TlsArg>,
    /// Also listen for implicit TLS (ftps://: the handshake first) on ADDR.
    #[arg(long, value_name = "ADDR", requires = "tls_cert", value_parser = parse_listen)]
    pub implicit_listen: Option<SocketAddr>,
    /// Accept TLS data connections that do not resume their control
    /// session's TLS session (clients that never reuse sessions, such as
    /// Python's ftplib). Weaker: see docs/security.md.
    #[arg(long)]
    pub tls_allow_fresh_data: bool,
    /// Most concurrent sessions from one client address.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_sessions_per_ip: usize,
    /// Most data connections (MULT) one client address may hold over all
    /// its sessions.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_ip: u32,
    /// Failed logins from one address within --login-window before the
    /// address must wait out the window (0: never lock out).
    #[arg(long, value_name = "K", default_value_t = 5)]
    pub login_failures: u32,
    /// Seconds over which failed logins count, and the wait after K of them.
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub login_window: u64,
    /// Refuse uploads larger than BYTES (552; suffixes k, M, G).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_upload_size: Option<u64>,
    /// Passive data ports only from this range, e.g. 50000-50100 (for a
    /// firewall); a range with no free port gives 425.
    #[arg(long, value_name = "A-B", value_parser = parse_port_range)]
    pub passive_ports: Option<(u16, u16)>,
    /// The IPv4 address (or host name) PASV replies announce, for a server
    /// behind NAT.
    #[arg(long, value_name = "HOST")]
    pub public_address: Option<String>,
}

/// An address to listen on, IP:PORT; the error says what form it takes.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        let hint = if s.matches(':').count() > 1 && !s.starts_with('[') {
            " (an IPv6 address goes in brackets: [::1]:2121)"
        } else if s.parse::<u16>().is_ok() {
            " (give the address too: 127.0.0.1:PORT, or 0.0.0.0:PORT for every interface)"
        } else {
            " (an IP address and a port, e.g. 127.0.0.1:2121 or [::]:2121; a host name is not taken: give its address)"
        };
        format!("{s:?} is not an IP:PORT address{hint}")
    })
}

fn parse_size(s: &str) -> Result<u64, String> {
    super::transfer::parse_byte_count(s)
}

/// `--record-size`: 4 KiB to 64 MiB, with k/M suffixes as the other sizes.
fn parse_record_size(s: &str) -> Result<u32, String> {
    // Within u32 by the range.
    super::transfer::byte_count_within(s, 4 << 10, 64 << 20, "4k to 64M").map(|n| n as u32)
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?} is not a port range like 50000-50100 (ports 1024-65535)");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let (a, b): (u16, u16) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if a < 1024 || b < a {
        return Err(bad());
    }
    Ok((a, b))
}

/// `--tls` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsArg {
    /// No TLS.
    Off,
    /// TLS offered, clear sessions served too.
    Optional,
    /// TLS on the control connection and every data connection.
    Required,
}

/// Arguments of `xftp useradd`.
#[derive(clap::Args, Debug)]
pub struct UseraddArgs {
    /// Users file to create or update.
    #[arg(long, value_name = "FILE")]
    pub users: PathBuf,
    /// User name.
    pub name: String,
    /// Read-only user (a new user is read-write; an existing one keeps
    /// what it had unless this or --read-write is given).
    #[arg(long, conflicts_with = "read_write")]
    pub read_only: bool,
    /// Read-write user: makes an existing read-only user read-write.
    #[arg(long)]
    pub read_write: bool,
    /// Read the password from this file (first line) instead of standard input.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// The user's home directory, relative to the served root: the user's
    /// sessions are confined to it (an existing user keeps its home unless
    /// this or --no-home is given).
    #[arg(long, value_name = "DIR", conflicts_with = "no_home")]
    pub home: Option<String>,
    /// No home directory: an existing user's sessions see the whole root.
    #[arg(long)]
    pub no_home: bool,
}

pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let mut config = Config::new(&a.root).with_context(|| {
        format!(
            "cannot serve {}: it must be an existing directory",
            a.root.display()
        )
    })?;
    // A root the server's user cannot list (a root-owned 0700 directory
    // under `setpriv`) took logins and failed every command after them.
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(a.root.as_os_str().as_bytes())
            .context("--root holds a NUL byte")?;
        // SAFETY: a NUL-terminated path, read only.
        if unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::X_OK) } != 0 {
            bail!(
                "cannot serve {}: the server's user (uid {}) may not list it ({}); give it read and search permission, or run as its owner",
                a.root.display(),
                // SAFETY: geteuid has no preconditions.
                unsafe { libc::geteuid() },
                std::io::Error::last_os_error()
            );
        }
    }
    config.anonymous = a.anonymous || a.anonymous_write;
    config.anonymous_write = a.anonymous_write;
    if let Some(u) = &a.users {
        config.users =
            UserDb::load(u).context("loading --users (create it with `xftp useradd`)")?;
    }
    if !config.anonymous && a.users.is_none() {
        bail!(
            "nobody could log in: pass --anonymous (read-only), --anonymous-write, or --users FILE"
        );
    }
    config.max_streams = a.max_streams;
    if a.default_streams > a.max_streams {
        eprintln!(
            "xftp serve: warning: --default-streams {} is above --max-streams {}: a bare MULT gets {}",
            a.default_streams, a.max_streams, a.max_streams
        );
    }
    config.default_streams = a.default_streams.min(a.max_streams);
    // Seconds as a wait, at most a century (an Instant plus u64::MAX
    // seconds overflows: every session's task panicked).
    let wait = |secs: u64| Duration::from_secs(secs).min(super::transfer::LONGEST_WAIT);
    config.idle_timeout = wait(a.idle_timeout.max(1));
    config.data_timeout = wait(a.data_timeout.max(1));
    config.shutdown_grace = wait(a.shutdown_grace);
    config.max_sessions = a.max_sessions;
    config.record_size = a.record_size;
    config.stall_timeout = wait(a.stall_timeout.max(1));
    let server_tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(Arc::new(
            xftp_tls::server::ServerTls::load(c, k).context("loading --tls-cert/--tls-key")?,
        )),
        _ => None,
    };
    if let Some(w) = server_tls
        .as_ref()
        .and_then(|t| t.validity_warning(unix_now()))
    {
        tracing::warn!("{w}");
    }
    config.tls_mode = match (a.tls, server_tls.is_some()) {
        (Some(TlsArg::Off), _) => xftp_server::TlsMode::Off,
        (Some(TlsArg::Optional), true) | (None, true) => xftp_server::TlsMode::Optional,
        (Some(TlsArg::Required), true) => xftp_server::TlsMode::Required,
        (None, false) => xftp_server::TlsMode::Off,
        (Some(_), false) => {
            bail!("--tls optional/required needs a certificate: add --tls-cert FILE --tls-key FILE")
        }
    };
    if a.implicit_listen.is_some() && config.tls_mode == xftp_server::TlsMode::Off {
        bail!("--implicit-listen needs TLS on: drop --tls off");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        tracing::warn!(
            "running as root: the modes of the files under --root do not hold for the \
             logins (root reads and writes every file); run as an unprivileged user \
             (setpriv --reuid=USER --regid=GROUP --init-groups xftp serve ..., docs/security.md)"
        );
    }
    config.tls = server_tls.clone();
    config.max_sessions_per_ip = a.max_sessions_per_ip;
    config.max_streams_per_ip = a.max_streams_per_ip;
    config.login_max_failures = a.login_failures;
    config.login_window = wait(a.login_window);
    config.max_upload_size = a.max_upload_size;
    config.passive_ports = a.passive_ports;
    config.public_address = match &a.public_address {
        None => None,
        Some(h) => Some(
            tokio::net::lookup_host((h.as_str(), 0))
                .await
                .ok()
                .and_then(|mut it| {
                    it.find_map(|s| match s.ip() {
                        std::net::IpAddr::V4(v4) => Some(v4),
                        _ => None,
                    })
                })
                .with_context(|| {
                    format!("--public-address {h}: not an IPv4 address or a name with one (PASV carries IPv4 only)")
                })?,
        ),
    };
    config.tls_require_reuse = !a.tls_allow_fresh_data;
    if a.implicit_listen
        .is_some_and(|i| i == a.listen && i.port() != 0)
    {
        bail!(
            "--implicit-listen and --listen are both {}: implicit TLS needs a port of its own (usually 990, with 21 for --listen)",
            a.listen
        );
    }
    let implicit = match a.implicit_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for implicit TLS (in use? try 127.0.0.1:0)")
        })?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (in use? try --listen 127.0.0.1:0)",
                a.listen
            )
        })?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        if let Some(l) = &implicit {
            writeln!(out, "listening for implicit TLS on {}", l.local_addr()?)?;
        }
        out.flush()?;
    }
    // SIGHUP: read the certificate and key again; sessions go on. Taken
    // without TLS too, where it changes nothing: its default action would
    // end the server and every transfer at once (a renewal hook that
    // signals every server, a closed terminal).
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    // And the users file: a password changed or access taken away with
    // `xftp useradd` counts from the next login.
    let users = a.users.clone().map(|p| (p, config.users.clone()));
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Some((path, db)) = &users {
                match db.reload(path) {
                    // Said at any verbosity, as the listening lines are:
                    // the answer to an operator's signal.
                    Ok(n) => eprintln!(
                        "xftp serve: users file {} reloaded: {n} users",
                        path.display()
                    ),
                    Err(e) => tracing::error!(
                        "users file {} not reloaded (the users as they were stay): {:#}",
                        path.display(),
                        anyhow::Error::from(e)
                    ),
                }
            }
            match &server_tls {
                Some(tls) => match tls.reload() {
                    Ok(()) => {
                        eprintln!("xftp serve: TLS certificate reloaded");
                        if let Some(w) = tls.validity_warning(unix_now()) {
                            tracing::warn!("{w}");
                        }
                    }
                    Err(e) => {
                        tracing::error!("TLS certificate not reloaded (the old one stays): {e}")
                    }
                },
                None if users.is_none() => {
                    eprintln!("xftp serve: SIGHUP: no TLS certificate or users file to reload; serving on")
                }
                None => {}
            }
        }
    });
    tracing::info!(root = %config.root.path().display(), %addr, "serving");
    let shutdown = CancellationToken::new();
    let now = CancellationToken::new();
    let (stop, stop_now) = (shutdown.clone(), now.clone());
    let grace = config.shutdown_grace;
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        for first in [true, false] {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
            }
            if first {
                tracing::info!(
                    "stopping: no new sessions; running transfers have {} s (a second signal ends them now)",
                    grace.as_secs()
                );
                stop.cancel();
            } else {
                stop_now.cancel();
            }
        }
    });
    xftp_server::serve_all(listener, implicit, Arc::new(config), shutdown, now).await?;
    Ok(ExitCode::SUCCESS)
}

pub fn useradd(a: UseraddArgs) -> anyhow::Result<ExitCode> {
    // The server treats these names as anonymous logins before it looks
    // at the users file: such an entry could never log in.
    if ["anonymous", "ftp"].contains(&a.name.to_ascii_lowercase().as_str()) {
        bail!(
            "{:?} is the anonymous login, never looked up in the users file; choose another name (anonymous access is `xftp serve --anonymous`)",
            a.name
        );
    }
    // Before the password is asked for: a name it would be refused with.
    xftp_server::check_entry(&a.name, a.home.as_deref())?;
    let password = match &a.password_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading password file {}", f.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .to_owned(),
        None => {
            eprintln!("password for {} (one line on standard input):", a.name);
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the password")?;
            line.trim_end_matches(['\r', '\n']).to_owned()
        }
    };
    if password.is_empty() {
        bail!("empty password: give one on standard input or with --password-file");
    }
    // `PASS password` must fit in one command line, or no login could
    // ever send it.
    let most = xftp_proto::command::MAX_LINE - "PASS \r\n".len() - 1;
    if password.len() > most {
        bail!(
            "the password has {} bytes; a login can send at most {most} (one FTP command line): choose a shorter one",
            password.len()
        );
    }
    // The file a link names is the one the server reads: write that one,
    // not a new file in the link's place.
    let users = match std::fs::canonicalize(&a.users) {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => a.users.clone(),
        Err(e) => return Err(e).with_context(|| format!("resolving {}", a.users.display())),
    };
    // One change at a time: two runs at once each loaded the file, and the
    // second to write dropped the first's user (or password reset).
    let _lock = lock_users_file(&users)?;
    let existing = match std::fs::metadata(&users) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", users.display())),
    };
    let mut db = if existing.is_some() {
        UserDb::load(&users)?
    } else {
        UserDb::default()
    };
    // A password reset must not widen what a user may do: an existing
    // user keeps its access and home unless they are given anew.
    let old = db.grant_of(&a.name);
    let access = match (a.read_only, a.read_write, &old) {
        (true, _, _) => Access::ReadOnly,
        (_, true, _) => Access::ReadWrite,
        (_, _, Some(g)) => g.access,
        _ => Access::ReadWrite,
    };
    let home = match (&a.home, a.no_home, &old) {
        (Some(h), _, _) => Some(h.clone()),
        (_, true, _) => None,
        (_, _, Some(g)) => g.home.clone(),
        _ => None,
    };
    db.set_with_home(&a.name, &password, access, home.as_deref())?;
    // Readable by the owner alone from its creation (the hashes never sit
    // in a file others may read). An existing file keeps its owner, group
    // and mode: a server running as a service account reads it through
    // them, and a file owned by root, mode 0600, would be a change it can
    // never load.
    // Owner and mode are set on the temporary, before it takes the name:
    // a server reloading in between never meets a file it cannot read.
    xftp_stripe::write_atomic_with(&users, db.render().as_bytes(), 0o600, |f| {
        if let Some(m) = &existing {
            keep_owner_and_mode(f, &users, m);
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", users.display()))?;
    let what = format!(
        "{}, {}",
        match access {
            Access::ReadOnly => "read-only",
            Access::ReadWrite => "read-write",
        },
        home.as_deref()
            .map_or_else(|| "the whole root".to_owned(), |h| format!("home {h}"))
    );
    match old {
        Some(_) => eprintln!(
            "user {} updated in {} ({what}; --read-only/--read-write and --home/--no-home change these)",
            a.name,
            a.users.display()
        ),
        None => eprintln!("user {} saved in {} ({what})", a.name, a.users.display()),
    }
    eprintln!(
        "a running `xftp serve --users {}` takes it at its next SIGHUP (kill -HUP PID); sessions logged in keep what they had",
        a.users.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// An exclusive lock on `USERS.lock` beside the users file, held while
/// the returned file lives (waits for another `useradd`).
fn lock_users_file(users: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = users.as_os_str().to_owned();
    name.push(".lock");
    let lock = std::path::PathBuf::from(name);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock)
        .with_context(|| format!("opening the lock file {}", lock.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("locking {}", lock.display()));
        }
    }
    Ok(f)
}

/// Give the rewritten users file the owner, group and mode of the one it
/// replaced; what cannot be kept is said (the server may not read it).
fn keep_owner_and_mode(f: &std::fs::File, users: &std::path::Path, was: &std::fs::Metadata) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = was.mode() & 0o7777;
    if let Err(e) = std::os::unix::fs::fchown(f, Some(was.uid()), Some(was.gid())) {
        eprintln!(
            "xftp useradd: warning: {} could not keep its owner {}:{} ({e}); a server running as that user may not read it: chown it back",
            users.display(),
            was.uid(),
            was.gid()
        );
    }
    if let Err(e) = f.set_permissions(std::fs::Permissions::from_mode(mode)) {
        eprintln!(
            "xftp useradd: warning: {} could not keep its mode {mode:o} ({e}): chmod it back",
            users.display()
        );
    }
}

/// Seconds since 1970 now (0 before it: a clock that wrong warns anyway).
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_and_their_hints() {
        assert_eq!(
            parse_listen("[::1]:2121"),
            Ok("[::1]:2121".parse().unwrap())
        );
        assert!(parse_listen("::1:2121").unwrap_err().contains("brackets"));
        assert!(parse_listen("2121").unwrap_err().contains("127.0.0.1:PORT"));
        assert!(parse_listen("localhost:21")
            .unwrap_err()
            .contains("host name"));
        assert_eq!(parse_record_size("4M"), Ok(4 << 20));
        assert!(parse_record_size("1k").unwrap_err().contains("4k to 64M"));
    }
}
