//! FTP commands (RFC 959, 2389, 2428, 3659) and the xftp extensions,
//! parsed from control-connection lines.
//!
//! Path arguments stay bytes: file names need not be UTF-8 and must not be
//! mangled on the way to the file system.

use std::net::{SocketAddr, SocketAddrV4};

use crate::error::ProtoError;
use crate::hostport;

/// Longest command line accepted (RFC 959 sets no limit; 4 KiB covers any
/// real path while bounding memory per session).
pub const MAX_LINE: usize = 4096;

/// Representation type (TYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferType {
    /// TYPE A (optionally with format N): line endings become CRLF on the wire.
    Ascii,
    /// TYPE I (or L 8): bytes as they are.
    Image,
}

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// USER name
    User(String),
    /// PASS password (possibly empty)
    Pass(String),
    /// QUIT
    Quit,
    /// NOOP
    Noop,
    /// SYST
    Syst,
    /// STAT [path]
    Stat(Option<Vec<u8>>),
    /// HELP [topic]
    Help(Option<String>),
    /// FEAT
    Feat,
    /// OPTS option
    Opts(String),
    /// TYPE A|I|L 8
    Type(TransferType),
    /// MODE S|E (the code letter, upper-cased)
    Mode(char),
    /// STRU F|R|P (the code letter, upper-cased)
    Stru(char),
    /// PWD / XPWD
    Pwd,
    /// CWD path / XCWD
    Cwd(Vec<u8>),
    /// CDUP / XCUP
    Cdup,
    /// LIST [args]
    List(Option<Vec<u8>>),
    /// NLST [args]
    Nlst(Option<Vec<u8>>),
    /// MLSD [path]
    Mlsd(Option<Vec<u8>>),
    /// MLST [path]
    Mlst(Option<Vec<u8>>),
    /// SIZE path
    Size(Vec<u8>),
    /// MDTM path
    Mdtm(Vec<u8>),
    /// MFMT time path (draft-somers-ftp-mfxx): set a file's modification
    /// time (milliseconds since the epoch, parsed from
    /// `YYYYMMDDHHMMSS[.sss]`).
    Mfmt(i64, Vec<u8>),
    /// RETR path
    Retr(Vec<u8>),
    /// STOR path
    Stor(Vec<u8>),
    /// APPE path
    Appe(Vec<u8>),
    /// STOU [name]: store under a name no file has yet (RFC 959; the
    /// argument, a base for the name, as most servers take it).
    Stou(Option<Vec<u8>>),
    /// REST offset (stream mode restart)
    Rest(u64),
    /// REST a-b,c-d,... (GridFTP extended block mode restart): the
    /// half-open ranges the receiver already has; a RETR after it sends
    /// the rest.
    RestRanges(Vec<(u64, u64)>),
    /// DELE path
    Dele(Vec<u8>),
    /// MKD path / XMKD
    Mkd(Vec<u8>),
    /// RMD path / XRMD
    Rmd(Vec<u8>),
    /// RNFR path
    Rnfr(Vec<u8>),
    /// RNTO path
    Rnto(Vec<u8>),
    /// ABOR
    Abor,
    /// PORT h1,h2,h3,h4,p1,p2
    Port(SocketAddrV4),
    /// PASV
    Pasv,
    /// EPRT |af|addr|port|
    Eprt(SocketAddr),
    /// EPSV [af|ALL]
    Epsv(Option<String>),
    /// xftp: MULT [n] — ask for n parallel data connections.
    Mult(Option<u32>),
    /// xftp: MPRT spec spec ... — one client address per data connection.
    Mprt(Vec<SocketAddr>),
    /// SITE subcommand (text after SITE)
    Site(String),
    /// GridFTP: SBUF size — TCP buffer size for data connections.
    Sbuf(BufSize),
    /// RFC 4217: AUTH mechanism (TLS, TLS-C, SSL, TLS-P), upper-cased.
    Auth(String),
    /// RFC 4217 (RFC 2228): PBSZ size; 0 is the only size TLS uses.
    Pbsz(u64),
    /// RFC 4217 (RFC 2228): PROT level: C (clear), S, E or P (private).
    Prot(char),
    /// RFC 4217: CCC, clear the control channel.
    Ccc,
    /// GridFTP: CKSM algorithm offset length path — a file's checksum.
    Cksm(crate::cksum::CksmArgs),
    /// draft-bryan-ftpext-hash: HASH path — the file's hash in the
    /// algorithm chosen with OPTS HASH.
    Hash(Vec<u8>),
    /// RFC 959: ALLO size [R record-size] — the size of the file the next
    /// STOR sends; `None` when the argument is missing or not a byte count
    /// (ALLO is a hint, so that is no error). xftp's server takes the
    /// endgame's copies on an upload whose size ALLO announced
    /// (docs/protocol.md).
    Allo(Option<u64>),
    /// A verb we do not implement (upper-cased).
    Unknown(String),
}

impl Command {
    /// The upper-case verb as the client sent it, for logs and replies.
    pub fn verb_of(line: &[u8]) -> String {
        let end = line.iter().position(|b| *b == b' ').unwrap_or(line.len());
        String::from_utf8_lossy(&line[..end]).to_ascii_uppercase()
    }

    /// Parse one command line (without the CRLF).
    pub fn parse(line: &[u8]) -> Result<Command, ProtoError> {
        let (verb, arg) = match line.iter().position(|b| *b == b' ') {
            Some(i) => (&line[..i], Some(&line[i + 1..])),
            None => (line, None),
        };
        if verb.is_empty() || verb.len() > 8 || !verb.iter().all(u8::is_ascii_alphabetic) {
            return Err(ProtoError::BadVerb);
        }
        let verb = String::from_utf8_lossy(verb).to_ascii_uppercase();
        // An argument of only spaces counts as none (some clients send "LIST ").
        let arg = arg.filter(|a| !a.iter().all(|b| *b == b' '));
        let text = |name: &'static str| -> Result<String, ProtoError> {
            let a = arg.ok_or(ProtoError::MissingArgument(name))?;
            String::from_utf8(a.to_vec()).map_err(|_| ProtoError::BadArgument {
                verb: name,
                reason: "argument is not UTF-8".into(),
            })
        };
        let path = |name: &'static str| -> Result<Vec<u8>, ProtoError> {
            let a = arg.ok_or(ProtoError::MissingArgument(name))?;
            if a.contains(&0) {
                return Err(ProtoError::BadPath("NUL byte in path"));
            }
            Ok(a.to_vec())
        };
        let opt_path = |name: &'static str| -> Result<Option<Vec<u8>>, ProtoError> {
            match arg {
                None => Ok(None),
                Some(_) => path(name).map(Some),
            }
        };
        Ok(match verb.as_str() {
            "USER" => Command::User(text("USER")?),
            "PASS" => Command::Pass(
                arg.map(|a| String::from_utf8_lossy(a).into_owned())
                    .unwrap_or_default(),
            ),
            "QUIT" => Command::Quit,
            "NOOP" => Command::Noop,
            "SYST" => Command::Syst,
            "STAT" => Command::Stat(opt_path("STAT")?),
            "HELP" => Command::Help(arg.map(|a| String::from_utf8_lossy(a).into_owned())),
            "FEAT" => Command::Feat,
            "OPTS" => Command::Opts(text("OPTS")?),
            "TYPE" => Command::Type(parse_type(&text("TYPE")?)?),
            "MODE" => Command::Mode(one_letter("MODE", &text("MODE")?)?),
            "STRU" => Command::Stru(one_letter("STRU", &text("STRU")?)?),
            "PWD" | "XPWD" => Command::Pwd,
            "CWD" | "XCWD" => Command::Cwd(path("CWD")?),
            "CDUP" | "XCUP" => Command::Cdup,
            "LIST" => Command::List(opt_path("LIST")?),
            "NLST" => Command::Nlst(opt_path("NLST")?),
            "MLSD" => Command::Mlsd(opt_path("MLSD")?),
            "MLST" => Command::Mlst(opt_path("MLST")?),
            "SIZE" => Command::Size(path("SIZE")?),
            "MDTM" => Command::Mdtm(path("MDTM")?),
            "MFMT" => {
                let a = arg.ok_or(ProtoError::MissingArgument("MFMT"))?;
                let bad = |reason: &str| ProtoError::BadArgument {
                    verb: "MFMT",
                    reason: reason.into(),
                };
                let sp = a
                    .iter()
                    .position(|b| *b == b' ')
                    .ok_or_else(|| bad("MFMT YYYYMMDDHHMMSS path"))?;
                let t = crate::facts::parse_time_ms(&String::from_utf8_lossy(&a[..sp]))
                    .ok_or_else(|| bad("the time is not YYYYMMDDHHMMSS[.sss]"))?;
                let p = &a[sp + 1..];
                if p.is_empty() || p.contains(&0) {
                    return Err(bad("missing or bad path"));
                }
                Command::Mfmt(t, p.to_vec())
            }
            "RETR" => Command::Retr(path("RETR")?),
            "STOR" => Command::Stor(path("STOR")?),
            "APPE" => Command::Appe(path("APPE")?),
            "STOU" => Command::Stou(opt_path("STOU")?),
            "REST" if arg.is_some_and(|a| a.contains(&b'-') || a.contains(&b',')) => {
                Command::RestRanges(parse_ranges(&text("REST")?)?)
            }
            "REST" => {
                let t = text("REST")?;
                Command::Rest(t.trim().parse().map_err(|_| ProtoError::BadArgument {
                    verb: "REST",
                    reason: format!("{t:?} is not a byte offset"),
                })?)
            }
            "DELE" => Command::Dele(path("DELE")?),
            "MKD" | "XMKD" => Command::Mkd(path("MKD")?),
            "RMD" | "XRMD" => Command::Rmd(path("RMD")?),
            "RNFR" => Command::Rnfr(path("RNFR")?),
            "RNTO" => Command::Rnto(path("RNTO")?),
            "ABOR" => Command::Abor,
            "PORT" => Command::Port(hostport::parse_port_arg(&text("PORT")?)?),
            "PASV" => Command::Pasv,
            "EPRT" => Command::Eprt(hostport::parse_eprt_arg(&text("EPRT")?)?),
            "EPSV" => Command::Epsv(arg.map(|a| String::from_utf8_lossy(a).trim().to_owned())),
            "MULT" => Command::Mult(match arg {
                None => None,
                Some(a) => {
                    let t = String::from_utf8_lossy(a);
                    let n: u32 = t.trim().parse().map_err(|_| ProtoError::BadArgument {
                        verb: "MULT",
                        reason: format!("{t:?} is not a connection count"),
                    })?;
                    if n == 0 {
                        return Err(ProtoError::BadArgument {
                            verb: "MULT",
                            reason: "the connection count must be at least 1".into(),
                        });
                    }
                    Some(n)
                }
            }),
            "MPRT" => Command::Mprt(hostport::parse_mprt_arg(&text("MPRT")?)?),
            "SITE" => Command::Site(text("SITE")?),
            "SBUF" => Command::Sbuf(parse_bufsize("SBUF", &text("SBUF")?)?),
            "AUTH" => Command::Auth(text("AUTH")?.trim().to_ascii_uppercase()),
            "PBSZ" => {
                let t = text("PBSZ")?;
                Command::Pbsz(t.trim().parse().map_err(|_| ProtoError::BadArgument {
                    verb: "PBSZ",
                    reason: format!("{t:?} is not a buffer size (TLS uses PBSZ 0)"),
                })?)
            }
            "PROT" => Command::Prot(one_letter("PROT", &text("PROT")?)?),
            "CCC" => Command::Ccc,
            "CKSM" => Command::Cksm(crate::cksum::parse_cksm_arg(
                arg.ok_or(ProtoError::MissingArgument("CKSM"))?,
            )?),
            "HASH" => Command::Hash(path("HASH")?),
            "ALLO" => Command::Allo(arg.and_then(|a| {
                std::str::from_utf8(a)
                    .ok()?
                    .split_ascii_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })),
            _ => Command::Unknown(verb),
        })
    }
}

/// Most ranges one REST may carry (a line holds 4 KiB anyway).
pub const MAX_REST_RANGES: usize = 256;

/// Parse `a-b,c-d,...`: half-open byte ranges, each non-empty.
pub fn parse_ranges(t: &str) -> Result<Vec<(u64, u64)>, ProtoError> {
    let bad = |reason: String| ProtoError::BadArgument {
        verb: "REST",
        reason,
    };
    let mut out = Vec::new();
    for part in t.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').ok_or_else(|| {
            bad(format!(
                "{part:?} is not a byte offset or a range START-END"
            ))
        })?;
        let (a, b): (u64, u64) = match (a.trim().parse(), b.trim().parse()) {
            (Ok(a), Ok(b)) if a < b => (a, b),
            _ => {
                return Err(bad(format!(
                    "{part:?} is not a byte offset or a range START-END with START < END"
                )))
            }
        };
        out.push((a, b));
        if out.len() > MAX_REST_RANGES {
            return Err(bad(format!("more than {MAX_REST_RANGES} ranges")));
        }
    }
    if out.is_empty() {
        return Err(bad("no ranges".into()));
    }
    Ok(out)
}

/// The ranges of `have` a `REST` line can carry: the largest, at most
/// [`MAX_REST_RANGES`] and no more than fit in [`MAX_LINE`] with the
/// verb, in offset order. Above 1 GB each range takes 20 bytes or more,
/// so a partial of a few hundred holes needs fewer than 256; what is
/// left out is sent again.
pub fn ranges_for_rest(have: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = have.into_iter().filter(|(a, b)| a < b).collect();
    v.sort_by_key(|&(a, b)| (std::cmp::Reverse(b - a), a));
    let budget = MAX_LINE - "REST \r\n".len() - 1;
    let mut used = 0;
    let mut out = Vec::new();
    for (a, b) in v {
        // "a-b" and a comma before every range but the first.
        let len = format!("{a}-{b}").len() + usize::from(!out.is_empty());
        if out.len() == MAX_REST_RANGES || used + len > budget {
            break;
        }
        used += len;
        out.push((a, b));
    }
    out.sort_unstable();
    out
}

/// Format ranges for `REST`, the inverse of [`parse_ranges`].
pub fn format_ranges(r: &[(u64, u64)]) -> String {
    r.iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A TCP buffer size request: bytes, or back to kernel autotuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufSize {
    /// Let the kernel autotune (the default).
    Auto,
    /// SO_SNDBUF/SO_RCVBUF of this many bytes on every data socket.
    Bytes(u64),
}

/// Parse a buffer size as people type it: `65536`, `64k`, `64K`, `4M`,
/// `4MiB`, `1g`, or `auto`/`off`/`default`/`0` for kernel autotuning.
pub fn parse_bufsize(verb: &'static str, arg: &str) -> Result<BufSize, ProtoError> {
    let t = arg.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "auto" | "off" | "default" | "0"
    ) {
        return Ok(BufSize::Auto);
    }
    match parse_bytes(t) {
        Ok(n) => Ok(BufSize::Bytes(n)),
        Err(BytesError::NotANumber) => Err(ProtoError::BadArgument {
            verb,
            reason: format!("{t:?} is not a buffer size (bytes, or with k/M/G, or auto)"),
        }),
        Err(BytesError::TooLarge) => Err(ProtoError::BadArgument {
            verb,
            reason: format!("{t:?} is too large"),
        }),
    }
}

/// Why [`parse_bytes`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BytesError {
    /// Not digits with an optional suffix.
    NotANumber,
    /// Past `u64`.
    TooLarge,
}

/// A count of bytes as people type it: digits, then optionally `k`, `M` or
/// `G` (any case; powers of 1024, as curl's `--limit-rate` and `dd`'s
/// `bs=` take them), optionally followed by `iB` or `B` (`4MiB`, `4MB`).
pub fn parse_bytes(arg: &str) -> Result<u64, BytesError> {
    let lower = arg.trim().to_ascii_lowercase();
    let unit = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, mult) = match unit.as_bytes().last() {
        Some(b'k') => (&unit[..unit.len() - 1], 1u64 << 10),
        Some(b'm') => (&unit[..unit.len() - 1], 1u64 << 20),
        Some(b'g') => (&unit[..unit.len() - 1], 1u64 << 30),
        // `iB` alone is no unit.
        _ if unit.len() + 2 == lower.len() => return Err(BytesError::NotANumber),
        _ => (unit, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BytesError::NotANumber);
    }
    let n: u64 = digits.parse().map_err(|_| BytesError::TooLarge)?;
    n.checked_mul(mult).ok_or(BytesError::TooLarge)
}

fn parse_type(arg: &str) -> Result<TransferType, ProtoError> {
    let up = arg.trim().to_ascii_uppercase();
    let words: Vec<&str> = up.split_ascii_whitespace().collect();
    match words.as_slice() {
        ["A"] | ["A", "N"] => Ok(TransferType::Ascii),
        ["I"] | ["L", "8"] => Ok(TransferType::Image),
        _ => Err(ProtoError::BadArgument {
            verb: "TYPE",
            reason: format!("unsupported type {arg:?} (use A or I)"),
        }),
    }
}

fn one_letter(verb: &'static str, arg: &str) -> Result<char, ProtoError> {
    let t = arg.trim();
    let mut chars = t.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_alphabetic() => Ok(c.to_ascii_uppercase()),
        _ => Err(ProtoError::BadArgument {
            verb,
            reason: format!("expected one letter, got {t:?}"),
        }),
    }
}

/// Splits the control stream into command lines, sans-IO.
///
/// Handles CRLF and bare LF, strips Telnet IAC sequences (clients send
/// `IAC IP IAC DM` before ABOR, RFC 959 section 4.1.3), keeps a 0xFF that
/// starts no Telnet command (a name's byte its client did not double,
/// RFC 2640 section 3.1), and bounds the line
/// length: an over-long line yields one `LineTooLong` error and is then
/// skipped up to its end, so the session stays usable.
#[derive(Debug, Default)]
pub struct LineReader {
    buf: Vec<u8>,
    discarding: bool,
    iac: IacState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum IacState {
    #[default]
    Data,
    Iac,
    Option,
}

impl LineReader {
    /// An empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes; complete lines (and errors) are pushed to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Result<Vec<u8>, ProtoError>>) {
        for &b in data {
            match self.iac {
                IacState::Iac => {
                    self.iac = match b {
                        0xff => {
                            self.push(0xff, out);
                            IacState::Data
                        }
                        // WILL WONT DO DONT carry one option byte.
                        0xfb..=0xfe => IacState::Option,
                        // A Telnet command (IP and DM before ABOR, NOP...).
                        0xf0..=0xfa => IacState::Data,
                        // No command: a 0xFF in a name that the client did
                        // not double (curl, ftplib with Latin-1 names).
                        // Dropping it with the next byte made `DELE ÿes.txt`
                        // delete `s.txt`.
                        _ => {
                            self.push(0xff, out);
                            self.push(b, out);
                            IacState::Data
                        }
                    };
                    continue;
                }
                IacState::Option => {
                    self.iac = IacState::Data;
                    continue;
                }
                IacState::Data => {}
            }
            if b == 0xff {
                self.iac = IacState::Iac;
                continue;
            }
            self.push(b, out);
        }
    }

    fn push(&mut self, b: u8, out: &mut Vec<Result<Vec<u8>, ProtoError>>) {
        if b == b'\n' {
            if self.discarding {
                self.discarding = false;
            } else {
                let mut line = std::mem::take(&mut self.buf);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                out.push(Ok(line));
            }
            self.buf.clear();
            return;
        }
        if self.discarding {
            return;
        }
        if self.buf.len() >= MAX_LINE {
            self.buf.clear();
            self.discarding = true;
            out.push(Err(ProtoError::LineTooLong { limit: MAX_LINE }));
            return;
        }
        self.buf.push(b);
    }
}

/// Fuzz entry point: feed arbitrary bytes through the line reader and the
/// command parser. Must never panic.
#[doc(hidden)]
pub fn fuzz_commands(data: &[u8]) {
    let mut r = LineReader::new();
    let mut out = Vec::new();
    r.feed(data, &mut out);
    for line in out.into_iter().flatten() {
        let _ = Command::parse(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(data: &[u8]) -> Vec<Result<Vec<u8>, ProtoError>> {
        let mut r = LineReader::new();
        let mut out = Vec::new();
        r.feed(data, &mut out);
        out
    }

    #[test]
    fn allo_takes_a_size_and_is_lenient_about_the_rest() {
        let p = |l: &[u8]| Command::parse(l).unwrap();
        assert_eq!(p(b"ALLO 1048576"), Command::Allo(Some(1 << 20)));
        assert_eq!(p(b"allo 10 R 512"), Command::Allo(Some(10)));
        assert_eq!(p(b"ALLO"), Command::Allo(None));
        assert_eq!(p(b"ALLO lots"), Command::Allo(None));
        assert_eq!(p(b"ALLO -1"), Command::Allo(None));
    }

    #[test]
    fn parses_common_commands() {
        assert_eq!(
            Command::parse(b"USER anonymous").unwrap(),
            Command::User("anonymous".into())
        );
        assert_eq!(
            Command::parse(b"pass").unwrap(),
            Command::Pass(String::new())
        );
        assert_eq!(
            Command::parse(b"type i").unwrap(),
            Command::Type(TransferType::Image)
        );
        assert_eq!(
            Command::parse(b"TYPE A N").unwrap(),
            Command::Type(TransferType::Ascii)
        );
        assert_eq!(
            Command::parse(b"TYPE L 8").unwrap(),
            Command::Type(TransferType::Image)
        );
        assert_eq!(
            Command::parse(b"RETR a b.txt").unwrap(),
            Command::Retr(b"a b.txt".to_vec())
        );
        assert_eq!(Command::parse(b"REST 100").unwrap(), Command::Rest(100));
        assert_eq!(
            Command::parse(b"MFMT 20231114221320 a b").unwrap(),
            Command::Mfmt(1_700_000_000_000, b"a b".to_vec())
        );
        assert_eq!(
            Command::parse(b"MFMT 20231114221320.5 a").unwrap(),
            Command::Mfmt(1_700_000_000_500, b"a".to_vec())
        );
        assert!(Command::parse(b"MFMT 20231114221320.x a").is_err());
        assert!(Command::parse(b"MFMT 2023 a").is_err());
        assert!(Command::parse(b"MFMT 20231114221320").is_err());
        assert_eq!(Command::parse(b"LIST ").unwrap(), Command::List(None));
        assert_eq!(Command::parse(b"MULT").unwrap(), Command::Mult(None));
        assert_eq!(
            Command::parse(b"auth tls").unwrap(),
            Command::Auth("TLS".into())
        );
        assert_eq!(Command::parse(b"PBSZ 0").unwrap(), Command::Pbsz(0));
        assert!(Command::parse(b"PBSZ x").is_err());
        assert_eq!(Command::parse(b"PROT p").unwrap(), Command::Prot('P'));
        assert!(Command::parse(b"PROT PP").is_err());
        assert_eq!(Command::parse(b"CCC").unwrap(), Command::Ccc);
        assert_eq!(
            Command::parse(b"REST 0-100,200-300").unwrap(),
            Command::RestRanges(vec![(0, 100), (200, 300)])
        );
        assert_eq!(Command::parse(b"REST 100").unwrap(), Command::Rest(100));
        for bad in [
            &b"REST 5-5"[..],
            b"REST 9-3",
            b"REST -4",
            b"REST 1-x",
            b"REST ,",
        ] {
            assert!(
                Command::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(format_ranges(&[(0, 1), (5, 9)]), "0-1,5-9");
        // A partial of many holes above 1 GB: the largest ranges that fit
        // a command line, which the server's reader takes and parses.
        let have: Vec<(u64, u64)> = (0..600u64)
            .map(|i| {
                (
                    5_000_000_000 + i * 1_000_000,
                    5_000_000_000 + i * 1_000_000 + 1000 + i,
                )
            })
            .collect();
        let told = ranges_for_rest(have.iter().copied());
        assert!(told.len() > 100 && told.len() < 256, "{}", told.len());
        assert!(told.windows(2).all(|w| w[0].0 < w[1].0));
        // The largest were taken.
        assert!(told.contains(&have[599]) && !told.contains(&have[0]));
        let line = format!("REST {}\r\n", format_ranges(&told));
        assert!(line.len() <= MAX_LINE, "{}", line.len());
        let mut r = LineReader::new();
        let mut lines = Vec::new();
        r.feed(line.as_bytes(), &mut lines);
        let parsed = Command::parse(lines.pop().unwrap().unwrap().as_slice()).unwrap();
        assert_eq!(parsed, Command::RestRanges(told.clone()));
        // Few small ranges: all of them, at most MAX_REST_RANGES.
        let small: Vec<(u64, u64)> = (0..300u64).map(|i| (i * 10, i * 10 + 5)).collect();
        assert_eq!(
            ranges_for_rest(small.iter().copied()).len(),
            MAX_REST_RANGES
        );
        assert_eq!(ranges_for_rest(small[..3].iter().copied()), small[..3]);
        assert_eq!(Command::parse(b"MULT 8").unwrap(), Command::Mult(Some(8)));
        assert_eq!(Command::parse(b"XPWD").unwrap(), Command::Pwd);
        assert_eq!(
            Command::parse(b"PORT 127,0,0,1,4,1").unwrap(),
            Command::Port("127.0.0.1:1025".parse().unwrap())
        );
        assert_eq!(
            Command::parse(b"FOO bar").unwrap(),
            Command::Unknown("FOO".into())
        );
    }

    #[test]
    fn buffer_sizes() {
        assert_eq!(parse_bufsize("X", "65536"), Ok(BufSize::Bytes(65536)));
        assert_eq!(parse_bufsize("X", "64k"), Ok(BufSize::Bytes(65536)));
        assert_eq!(parse_bufsize("X", "4M"), Ok(BufSize::Bytes(4 << 20)));
        assert_eq!(parse_bufsize("X", "auto"), Ok(BufSize::Auto));
        assert_eq!(parse_bufsize("X", "OFF"), Ok(BufSize::Auto));
        assert!(parse_bufsize("X", "lots").is_err());
        assert!(parse_bufsize("X", "99999999999999999999g").is_err());
        assert_eq!(
            Command::parse(b"SBUF 1M").unwrap(),
            Command::Sbuf(BufSize::Bytes(1 << 20))
        );
    }

    #[test]
    fn non_utf8_paths_survive() {
        assert_eq!(
            Command::parse(b"STOR caf\xe9").unwrap(),
            Command::Stor(b"caf\xe9".to_vec())
        );
    }

    #[test]
    fn argument_errors() {
        assert_eq!(
            Command::parse(b"RETR"),
            Err(ProtoError::MissingArgument("RETR"))
        );
        assert!(matches!(
            Command::parse(b"REST -1"),
            Err(ProtoError::BadArgument { .. })
        ));
        assert!(matches!(
            Command::parse(b"TYPE E"),
            Err(ProtoError::BadArgument { .. })
        ));
        assert!(matches!(
            Command::parse(b"MULT 0"),
            Err(ProtoError::BadArgument { .. })
        ));
        assert!(matches!(
            Command::parse(b"PORT 1,2,3"),
            Err(ProtoError::BadArgument { .. })
        ));
        assert_eq!(
            Command::parse(b"RETR a\0b"),
            Err(ProtoError::BadPath("NUL byte in path"))
        );
        assert_eq!(Command::parse(b""), Err(ProtoError::BadVerb));
        assert_eq!(Command::parse(b"12 x"), Err(ProtoError::BadVerb));
    }

    #[test]
    fn line_reader_crlf_lf_and_partial() {
        let mut r = LineReader::new();
        let mut out = Vec::new();
        r.feed(b"NOOP\r\nSY", &mut out);
        r.feed(b"ST\nQUIT\r", &mut out);
        assert_eq!(out.len(), 2);
        r.feed(b"\n", &mut out);
        let got: Vec<Vec<u8>> = out.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            vec![b"NOOP".to_vec(), b"SYST".to_vec(), b"QUIT".to_vec()]
        );
    }

    #[test]
    fn byte_counts_take_k_m_g_with_or_without_ib() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("4MiB"), Ok(4 << 20));
        assert_eq!(parse_bytes("4mb"), Ok(4 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("100B"), Ok(100));
        for bad in ["", "k", "4iB", "-1", "1.5M", "4 M", "4T", "iB", "+5"] {
            assert_eq!(parse_bytes(bad), Err(BytesError::NotANumber), "{bad:?}");
        }
        assert_eq!(
            parse_bytes("99999999999999999999"),
            Err(BytesError::TooLarge)
        );
        assert_eq!(parse_bytes("17179869184G"), Err(BytesError::TooLarge));
        assert_eq!(
            parse_bufsize("SITE BUFSIZE", "4MiB"),
            Ok(BufSize::Bytes(4 << 20))
        );
    }

    #[test]
    fn line_reader_strips_telnet_ip_dm() {
        // What ftplib's abort() and curl send before ABOR.
        let out = lines(b"\xff\xf4\xff\xf2ABOR\r\n");
        assert_eq!(out, vec![Ok(b"ABOR".to_vec())]);
        let out = lines(b"\xff\xfd\x01NOOP\r\n");
        assert_eq!(out, vec![Ok(b"NOOP".to_vec())]);
    }

    /// A 0xFF the client did not double (curl, ftplib with Latin-1 names)
    /// and no Telnet command after it is part of the name: `ÿes.txt` is not
    /// `s.txt`. Doubled, it is one 0xFF.
    #[test]
    fn line_reader_keeps_a_bare_ff_in_a_name() {
        let out = lines(b"DELE \xffes.txt\r\nDELE \xff\xffes.txt\r\nSIZE a\xff\r\n");
        assert_eq!(
            out,
            vec![
                Ok(b"DELE \xffes.txt".to_vec()),
                Ok(b"DELE \xffes.txt".to_vec()),
                Ok(b"SIZE a\xff".to_vec()),
            ]
        );
    }

    #[test]
    fn over_long_line_reported_once_then_skipped() {
        let mut data = vec![b'A'; MAX_LINE * 3];
        data.extend_from_slice(b"\r\nNOOP\r\n");
        let out = lines(&data);
        assert_eq!(out.len(), 2);
        assert!(matches!(out[0], Err(ProtoError::LineTooLong { .. })));
        assert_eq!(out[1], Ok(b"NOOP".to_vec()));
    }

    #[test]
    fn fuzz_entry_runs() {
        fuzz_commands(b"USER a\r\nPORT 999,1\r\n\xff\xffMULT x\r\nEPRT |9|x|y|\r\n");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..2000)) {
            fuzz_commands(&data);
        }
    }
}
