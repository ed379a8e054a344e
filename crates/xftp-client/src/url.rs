//! `ftp://[user[:password]@]host[:port]/path` URLs (RFC 1738 section 3.2).
//!
//! The path after the host's `/` is taken relative to the login directory,
//! as curl does: `ftp://h/dir/f` sends `RETR dir/f`; an absolute server path
//! is written with a second slash (`ftp://h//srv/f`) or `%2F`.

use crate::error::ClientError;

/// Default FTP control port.
pub const DEFAULT_PORT: u16 = 21;

/// A parsed FTP URL with user, password and path percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FtpUrl {
    /// User name, if the URL names one (anonymous otherwise).
    pub user: Option<String>,
    /// Password, if the URL carries one (better given another way).
    pub password: Option<String>,
    /// Host name or IP address (IPv6 without the brackets).
    pub host: String,
    /// Control port.
    pub port: u16,
    /// Path as sent to the server (empty for the login directory).
    pub path: String,
    /// TLS asked for by the scheme: `ftpes://` explicit (AUTH TLS),
    /// `ftps://` implicit (default port 990).
    pub tls: UrlTls,
}

/// The TLS a URL's scheme asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UrlTls {
    /// `ftp://`: none (unless `--tls`).
    #[default]
    None,
    /// `ftpes://`: AUTH TLS on the usual port.
    Explicit,
    /// `ftps://`: TLS from the first byte, on port 990 by default.
    Implicit,
}

/// The default port of implicit FTPS.
pub const DEFAULT_FTPS_PORT: u16 = 990;

fn usage(msg: impl Into<String>) -> ClientError {
    ClientError::Usage(msg.into())
}

impl FtpUrl {
    /// Parse a URL. Errors say what is wrong and what form is expected.
    pub fn parse(url: &str) -> Result<FtpUrl, ClientError> {
        let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
        let (tls, rest) = if lower.starts_with("ftp://") {
            (UrlTls::None, &url[6..])
        } else if lower.starts_with("ftpes://") {
            (UrlTls::Explicit, &url[8..])
        } else if lower.starts_with("ftps://") {
            (UrlTls::Implicit, &url[7..])
        } else {
            return Err(usage(format!(
                "{url:?} is not an FTP URL (expected ftp://[user[:password]@]host[:port]/path; ftpes:// for TLS, ftps:// for implicit TLS)"
            )));
        };
        let (authority, raw_path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(ui) => {
                let (u, p) = match ui.find(':') {
                    Some(i) => (&ui[..i], Some(&ui[i + 1..])),
                    None => (ui, None),
                };
                let u = percent_decode(u, "user name")?;
                if u.is_empty() {
                    return Err(usage(format!("{url:?}: empty user name before '@'")));
                }
                (
                    Some(u),
                    p.map(|p| percent_decode(p, "password")).transpose()?,
                )
            }
        };
        let (host, port) = split_host_port(hostport, url)?;
        let port = match (port, tls) {
            (None, UrlTls::Implicit) => DEFAULT_FTPS_PORT,
            (None, _) => DEFAULT_PORT,
            (Some(p), _) => p,
        };
        // ";type=i" and similar typecodes are not supported: refuse them rather
        // than asking the server for a file with that name.
        if raw_path.contains(';') && raw_path.to_ascii_lowercase().contains(";type=") {
            return Err(usage(format!(
                "{url:?}: ';type=' suffixes are not supported (transfers are always binary)"
            )));
        }
        // A path is bytes (a server's names need not be UTF-8): kept as
        // such (xftp_proto::name).
        let path = xftp_proto::name::decode(&percent_decode_bytes(raw_path, "path")?);
        for (what, s) in [
            ("user name", user.as_deref()),
            ("password", password.as_deref()),
        ] {
            if s.is_some_and(|s| s.contains(['\r', '\n'])) {
                return Err(usage(format!("{url:?}: the {what} contains CR or LF")));
            }
        }
        if path.contains(['\r', '\n', '\0']) {
            return Err(usage(format!("{url:?}: the path contains CR, LF or NUL")));
        }
        Ok(FtpUrl {
            user,
            password,
            host,
            port,
            path,
            tls,
        })
    }

    /// The last path component (the file name), if the path names one.
    pub fn file_name(&self) -> Option<&str> {
        let name = self.path.rsplit('/').next().unwrap_or("");
        if name.is_empty() || name == "." || name == ".." {
            None
        } else {
            Some(name)
        }
    }

    /// True when the path is empty or ends with `/` (a directory).
    pub fn is_dir_path(&self) -> bool {
        self.path.is_empty() || self.path.ends_with('/')
    }

    /// `scheme://[user@]host:port`, without the password or the path:
    /// the start of a URL for another command on the same server (as a
    /// hint in an error), so that it keeps the TLS and the login.
    pub fn base(&self) -> String {
        let scheme = match self.tls {
            UrlTls::None => "ftp",
            UrlTls::Explicit => "ftpes",
            UrlTls::Implicit => "ftps",
        };
        let user = self.user.as_deref().map_or_else(String::new, |u| {
            let mut out = String::new();
            for b in u.bytes() {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    out.push(char::from(b));
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            out + "@"
        });
        format!("{scheme}://{user}{}", self.authority())
    }

    /// `host:port` for display, with brackets around IPv6 literals.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn split_host_port(hp: &str, url: &str) -> Result<(String, Option<u16>), ClientError> {
    let (host, port) = if let Some(rest) = hp.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| usage(format!("{url:?}: '[' without ']' around an IPv6 address")))?;
        let host = &rest[..end];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(usage(format!("{url:?}: {host:?} is not an IPv6 address")));
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(usage(format!("{url:?}: unexpected text after ']'"))),
        };
        (host, port)
    } else {
        match hp.rfind(':') {
            Some(i) => (&hp[..i], Some(&hp[i + 1..])),
            None => (hp, None),
        }
    };
    if host.is_empty() {
        return Err(usage(format!("{url:?}: no host")));
    }
    if host.contains(':') && !hp.starts_with('[') {
        return Err(usage(format!(
            "{url:?}: write IPv6 addresses in brackets, e.g. ftp://[::1]:2121/"
        )));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(usage(format!(
                    "{url:?}: port {p:?} is not a number from 1 to 65535"
                )))
            }
        },
    };
    Ok((host.to_owned(), port))
}

/// Decode `%XX` escapes; the result must be UTF-8.
fn percent_decode(s: &str, what: &str) -> Result<String, ClientError> {
    String::from_utf8(percent_decode_bytes(s, what)?).map_err(|_| {
        usage(format!(
            "the {what} of the URL is not UTF-8 after %-decoding"
        ))
    })
}

/// Decode `%XX` escapes into bytes.
fn percent_decode_bytes(s: &str, what: &str) -> Result<Vec<u8>, ClientError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| usage(format!("bad %-escape in the {what} of the URL")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_url() {
        let u = FtpUrl::parse("ftpes://h/x").unwrap();
        assert_eq!((u.tls, u.port), (UrlTls::Explicit, 21));
        let u = FtpUrl::parse("FTPS://h/x").unwrap();
        assert_eq!((u.tls, u.port), (UrlTls::Implicit, 990));
        let u = FtpUrl::parse("ftps://h:2990/x").unwrap();
        assert_eq!((u.tls, u.port), (UrlTls::Implicit, 2990));
        assert!(FtpUrl::parse("sftp://h/x").is_err());
        let u = FtpUrl::parse("ftp://al%40ice:p%3Aw@example.org:2121/dir/a%20b.bin").unwrap();
        assert_eq!(u.user.as_deref(), Some("al@ice"));
        assert_eq!(u.password.as_deref(), Some("p:w"));
        assert_eq!(u.host, "example.org");
        assert_eq!(u.port, 2121);
        assert_eq!(u.path, "dir/a b.bin");
        assert_eq!(u.file_name(), Some("a b.bin"));
    }

    #[test]
    fn defaults_and_anonymous() {
        let u = FtpUrl::parse("ftp://127.0.0.1").unwrap();
        assert_eq!(u.user, None);
        assert_eq!(u.port, 21);
        assert_eq!(u.path, "");
        assert!(u.is_dir_path());
        assert_eq!(u.file_name(), None);
    }

    #[test]
    fn ipv6_literal() {
        let u = FtpUrl::parse("ftp://[::1]:2121/f").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 2121);
        assert_eq!(u.authority(), "[::1]:2121");
        assert_eq!(u.base(), "ftp://[::1]:2121");
        let u = FtpUrl::parse("ftpes://a%40b:pw@h:2121/f").unwrap();
        assert_eq!(
            u.base(),
            "ftpes://a%40b@h:2121",
            "no password, the user kept"
        );
        assert_eq!(FtpUrl::parse("ftps://h/f").unwrap().base(), "ftps://h:990");
        let u = FtpUrl::parse("ftp://[::1]/f").unwrap();
        assert_eq!(u.port, 21);
        assert!(FtpUrl::parse("ftp://::1/f").is_err());
        assert!(FtpUrl::parse("ftp://[::1/f").is_err());
        assert!(FtpUrl::parse("ftp://[nothex]/f").is_err());
    }

    #[test]
    fn absolute_path_with_double_slash() {
        let u = FtpUrl::parse("ftp://h//srv/f").unwrap();
        assert_eq!(u.path, "/srv/f");
        let u = FtpUrl::parse("ftp://h/%2Fsrv/f").unwrap();
        assert_eq!(u.path, "/srv/f");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "http://h/f",
            "ftp://h:0/f",
            "ftp://h:99999/f",
            "ftp://h:x/f",
            "ftp:///f",
            "ftp://h/a%0D%0ADELE%20x",
            "ftp://u%0A@h/f",
            "ftp://h/%zz",
            "ftp://u%ff@h/f",
            "ftp://@h/f",
            "ftp://h/f;type=a",
        ] {
            assert!(FtpUrl::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn a_path_that_is_not_utf8_is_kept_as_its_bytes() {
        let u = FtpUrl::parse("ftp://h/d/caf%E9").unwrap();
        assert_eq!(xftp_proto::name::encode(&u.path), b"d/caf\xe9");
    }

    #[test]
    fn password_may_contain_at_sign_escaped_or_not() {
        // The last '@' separates userinfo from the host.
        let u = FtpUrl::parse("ftp://u:p@ss@h/f").unwrap();
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.host, "h");
    }
}
