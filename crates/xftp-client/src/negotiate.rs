//! Pure decisions on reply contents (no I/O), unit-tested on their own.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use xftp_proto::Reply;

/// The number of streams granted by a `200 MULT <granted> ...` reply: the
/// first integer after the word MULT. `None` when the reply has no such
/// number, or grants 0 or more than was requested (a protocol violation:
/// the server would wait for connections we never open).
pub fn mult_granted(reply: &Reply, requested: u32) -> Option<u32> {
    let text = reply.lines.first()?;
    let mut words = text.split_ascii_whitespace();
    words.find(|w| w.eq_ignore_ascii_case("MULT"))?;
    let n: u32 = words.next()?.parse().ok()?;
    (1..=requested).contains(&n).then_some(n)
}

/// What a server's `FEAT` reply lists (RFC 2389), as far as xftp cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// `MULT`: several data connections per transfer (xftp).
    pub mult: bool,
    /// `MODE E`: framed transfers, which can change their connection count
    /// while they run.
    pub mode_e: bool,
    /// `MPRT`: one client port per connection (xftp).
    pub mprt: bool,
    /// `CACHE` (xftp): MODE E data connections are kept after a download
    /// and reused by the next RETR sent without a new PASV/EPSV/PORT.
    pub cache: bool,
    /// `SPAS` or `SPOR` (GridFTP striping): a GridFTP server, which takes
    /// `OPTS RETR Parallelism=n,n,n;` in MODE E.
    pub gridftp: bool,
    /// `MLST` (RFC 3659): MLSD lists a directory with exact facts.
    pub mlst: bool,
    /// The facts the `MLST` line lists, each with whether it is sent now
    /// (`*`); `OPTS MLST` chooses others.
    pub mlst_facts: Vec<(String, bool)>,
    /// `REST STREAM` (RFC 3659): RETR can start at an offset.
    pub rest_stream: bool,
    /// `CKSM` (GridFTP): the algorithms listed.
    pub cksm: Vec<xftp_proto::cksum::Algorithm>,
    /// `HASH` (draft-bryan-ftpext-hash): the algorithms listed.
    pub hash: Vec<xftp_proto::cksum::Algorithm>,
    /// Every feature line, trimmed.
    pub lines: Vec<String>,
}

/// Parse a `211` FEAT reply; anything else (a stock server's 500/502)
/// lists nothing.
pub fn features(reply: &Reply) -> Features {
    let mut f = Features::default();
    if reply.code != 211 {
        return f;
    }
    // The first and last lines are free text ("Extensions supported:", "End").
    let n = reply.lines.len();
    for line in reply.lines.iter().take(n.saturating_sub(1)).skip(1) {
        let t = line.trim();
        let up = t.to_ascii_uppercase();
        let mut words = up.split_ascii_whitespace();
        match (words.next(), words.next()) {
            (Some("MULT"), _) => f.mult = true,
            (Some("MPRT"), _) => f.mprt = true,
            (Some("CACHE"), _) => f.cache = true,
            (Some("MLST"), _) => {
                f.mlst = true;
                let facts = t.split_ascii_whitespace().nth(1).unwrap_or("");
                f.mlst_facts = facts
                    .split(';')
                    .filter(|x| !x.is_empty())
                    .map(|x| match x.strip_suffix('*') {
                        Some(name) => (name.to_owned(), true),
                        None => (x.to_owned(), false),
                    })
                    .collect();
            }
            (Some("REST"), Some("STREAM")) => f.rest_stream = true,
            (Some("SPAS" | "SPOR"), _) => f.gridftp = true,
            (Some("MODE"), Some(m)) if m.split(';').any(|x| x == "E") => f.mode_e = true,
            (Some("CKSM"), rest) => {
                f.cksm = xftp_proto::cksum::parse_cksm_feat(rest.unwrap_or(""));
                // A bare CKSM line: GridFTP servers know MD5 at least.
                if f.cksm.is_empty() {
                    f.cksm.push(xftp_proto::cksum::Algorithm::Md5);
                }
            }
            (Some("HASH"), rest) => {
                f.hash = xftp_proto::cksum::parse_hash_feat(rest.unwrap_or(""));
            }
            _ => {}
        }
        if !t.is_empty() {
            f.lines.push(t.to_owned());
        }
    }
    f
}

/// The size in a `213 <size>` reply.
pub fn size_value(reply: &Reply) -> Option<u64> {
    if reply.code != 213 {
        return None;
    }
    reply.lines.first()?.trim().parse().ok()
}

/// How many entries a listing's final reply says were left out
/// (`xftp serve`: `226 Directory send OK; 2 entries not listed (...)`,
/// docs/protocol.md "Listings"); 0 for any other reply.
pub fn unlisted(reply: &Reply) -> usize {
    reply
        .lines
        .iter()
        .filter_map(|l| {
            let at = l
                .find(" entries not listed")
                .or_else(|| l.find(" entry not listed"))?;
            l[..at].rsplit(' ').next()?.parse::<usize>().ok()
        })
        .sum()
}

/// Of [`unlisted`], how many the server says it could not read (`xftp
/// serve`: `..., 2 the server could not read (...)`): entries a copy of
/// the tree lacks not by the server's rule (a name with a line break, a
/// link leading outside its root) but by a fault there, which fails it.
pub fn unreadable(reply: &Reply) -> usize {
    reply
        .lines
        .iter()
        .filter_map(|l| {
            let at = l.find(" the server could not read")?;
            l[..at].rsplit([' ', '(']).next()?.parse::<usize>().ok()
        })
        .sum()
}

/// Where to connect for a 227 reply. Servers behind NAT often announce a
/// private or unusable address; like most clients we then connect to the
/// control connection's peer with the announced port. We do so whenever the
/// announced address differs from the control peer, which also keeps a
/// hostile server from pointing our data connection at a third host.
pub fn pasv_target(announced: SocketAddrV4, control_peer: IpAddr) -> SocketAddr {
    SocketAddr::new(control_peer, announced.port())
}

/// True when a PASV announcement differed from the control peer (logged).
pub fn pasv_rewritten(announced: SocketAddrV4, control_peer: IpAddr) -> bool {
    IpAddr::V4(*announced.ip()) != control_peer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_reply_says_how_many_entries_it_left_out() {
        let r = |t: &str| Reply::new(226, t);
        assert_eq!(unlisted(&r("Directory send OK.")), 0);
        assert_eq!(
            unlisted(&r(
                "Directory send OK; 1 entry not listed (1 with a line break in the name)."
            )),
            1
        );
        assert_eq!(
            unlisted(&r("Directory send OK; 12 entries not listed (10 with a line break in the name, 2 symbolic link(s) leading outside the root or to nothing).")),
            12
        );
        assert_eq!(unlisted(&r("Transfer complete; entries not listed.")), 0);
        let both = r("Directory send OK; 3 entries not listed (1 with a line break in the name, 2 the server could not read (no permission, a path too long, or an I/O error)).");
        assert_eq!((unlisted(&both), unreadable(&both)), (3, 2));
        let alone = r("Directory send OK; 1 entry not listed (1 the server could not read (no permission, a path too long, or an I/O error)).");
        assert_eq!((unlisted(&alone), unreadable(&alone)), (1, 1));
    }

    fn r(code: u16, t: &str) -> Reply {
        Reply::new(code, t)
    }

    #[test]
    fn mult_reply_parsing() {
        assert_eq!(
            mult_granted(&r(200, "MULT 4 connections granted"), 8),
            Some(4)
        );
        assert_eq!(mult_granted(&r(200, "MULT 8"), 8), Some(8));
        assert_eq!(mult_granted(&r(200, "ok MULT 2 of 16"), 16), Some(2));
        assert_eq!(mult_granted(&r(200, "MULT 9"), 8), None, "more than asked");
        assert_eq!(mult_granted(&r(200, "MULT 0"), 8), None);
        assert_eq!(mult_granted(&r(200, "MULT x"), 8), None);
        assert_eq!(mult_granted(&r(200, "4 granted"), 8), None);
    }

    /// A 211 FEAT reply with these lines.
    fn feat(lines: &[&str]) -> Reply {
        Reply::multi(211, lines.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn feat_parsing() {
        let ours = feat(&[
            "Extensions supported:",
            " EPSV",
            " MULT",
            " MODE E",
            " SIZE",
            "End",
        ]);
        let f = features(&ours);
        assert!(f.mult && f.mode_e && !f.mprt, "{f:?}");
        assert_eq!(f.lines, ["EPSV", "MULT", "MODE E", "SIZE"]);
        // A stock server: no MULT, no MODE E; a refusal lists nothing.
        let stock = feat(&["Features:", " EPSV", " MODE Z", "End"]);
        assert!(!features(&stock).mult && !features(&stock).mode_e);
        assert!(!features(&ours).gridftp && !features(&stock).gridftp);
        // globus-gridftp-server's FEAT (abridged).
        let gridftp = feat(&[
            "Extensions supported",
            " MLST Type*;Size*;Modify*;",
            " SPAS",
            " SPOR",
            " PASV AllowDelayed;",
            "End.",
        ]);
        let g = features(&gridftp);
        assert!(g.gridftp && !g.mult, "{g:?}");
        assert_eq!(
            features(&r(500, "FEAT not understood")),
            Features::default()
        );
    }

    #[test]
    fn size_reply_parsing() {
        assert_eq!(size_value(&r(213, "1048583")), Some(1_048_583));
        assert_eq!(size_value(&r(213, "18446744073709551615")), Some(u64::MAX));
        assert_eq!(size_value(&r(550, "1")), None);
        assert_eq!(size_value(&r(213, "big")), None);
    }

    #[test]
    fn pasv_uses_control_peer() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let a: SocketAddrV4 = "10.0.0.5:4000".parse().unwrap();
        assert_eq!(pasv_target(a, peer), "127.0.0.1:4000".parse().unwrap());
        assert!(pasv_rewritten(a, peer));
        let same: SocketAddrV4 = "127.0.0.1:4001".parse().unwrap();
        assert!(!pasv_rewritten(same, peer));
    }
}
