//! Host-port arguments: PORT and PASV (RFC 959), EPRT and EPSV (RFC 2428),
//! and the xftp `MPRT` list (docs/protocol.md).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use crate::error::ProtoError;

/// Decimal digits only: Rust's integer parsing takes a leading `+`,
/// which no address or port on the wire has.
fn digits(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())
}

fn bad(verb: &'static str, reason: impl Into<String>) -> ProtoError {
    ProtoError::BadArgument {
        verb,
        reason: reason.into(),
    }
}

/// Parse `h1,h2,h3,h4,p1,p2` (the PORT argument and the numbers of a 227 reply).
pub fn parse_port_arg(arg: &str) -> Result<SocketAddrV4, ProtoError> {
    let nums: Vec<&str> = arg.trim().split(',').map(str::trim).collect();
    if nums.len() != 6 {
        return Err(bad("PORT", "expected six comma-separated numbers"));
    }
    let mut b = [0u8; 6];
    for (slot, n) in b.iter_mut().zip(&nums) {
        *slot = n
            .parse::<u8>()
            .ok()
            .filter(|_| digits(n))
            .ok_or_else(|| bad("PORT", format!("{n:?} is not a number from 0 to 255")))?;
    }
    let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    let port = u16::from(b[4]) << 8 | u16::from(b[5]);
    Ok(SocketAddrV4::new(ip, port))
}

/// Format an IPv4 socket address as `h1,h2,h3,h4,p1,p2`.
pub fn format_port_arg(addr: SocketAddrV4) -> String {
    let o = addr.ip().octets();
    let p = addr.port();
    format!(
        "{},{},{},{},{},{}",
        o[0],
        o[1],
        o[2],
        o[3],
        p >> 8,
        p & 0xff
    )
}

/// Parse an EPRT argument `<d>af<d>addr<d>port<d>` (RFC 2428 section 2);
/// af 1 is IPv4, 2 is IPv6. The delimiter is the first character.
pub fn parse_eprt_arg(arg: &str) -> Result<SocketAddr, ProtoError> {
    let arg = arg.trim();
    let delim = arg
        .chars()
        .next()
        .ok_or(ProtoError::MissingArgument("EPRT"))?;
    if !(33..=126).contains(&(delim as u32)) || delim.is_ascii_digit() {
        return Err(bad("EPRT", "delimiter must be a printable non-digit"));
    }
    let parts: Vec<&str> = arg.split(delim).collect();
    // "", af, addr, port, ""
    if parts.len() != 5 || !parts[0].is_empty() || !parts[4].is_empty() {
        return Err(bad("EPRT", "expected <d>af<d>address<d>port<d>"));
    }
    let port: u16 = parts[3]
        .parse()
        .ok()
        .filter(|_| digits(parts[3]))
        .ok_or_else(|| bad("EPRT", format!("bad port {:?}", parts[3])))?;
    let ip: IpAddr = match parts[1] {
        "1" => parts[2]
            .parse::<Ipv4Addr>()
            .map(IpAddr::V4)
            .map_err(|_| bad("EPRT", format!("bad IPv4 address {:?}", parts[2])))?,
        "2" => parts[2]
            .parse::<Ipv6Addr>()
            .map(IpAddr::V6)
            .map_err(|_| bad("EPRT", format!("bad IPv6 address {:?}", parts[2])))?,
        other => {
            return Err(bad(
                "EPRT",
                format!("unsupported network protocol {other:?} (use 1 or 2)"),
            ))
        }
    };
    Ok(SocketAddr::new(ip, port))
}

/// Format a socket address as an EPRT argument with `|` delimiters.
pub fn format_eprt_arg(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("|1|{}|{}|", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("|2|{}|{}|", a.ip(), a.port()),
    }
}

/// Parse the xftp `MPRT` argument: one or more EPRT-style specs separated
/// by spaces, e.g. `|1|198.18.0.1|5001| |2|::1|5002|`.
pub fn parse_mprt_arg(arg: &str) -> Result<Vec<SocketAddr>, ProtoError> {
    let specs: Vec<&str> = arg.split_ascii_whitespace().collect();
    if specs.is_empty() {
        return Err(ProtoError::MissingArgument("MPRT"));
    }
    specs
        .into_iter()
        .map(|s| {
            parse_eprt_arg(s).map_err(|e| match e {
                ProtoError::BadArgument { reason, .. } => bad("MPRT", reason),
                other => other,
            })
        })
        .collect()
}

/// Format a list of addresses as an `MPRT` argument.
pub fn format_mprt_arg(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format_eprt_arg(*a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text of a 227 reply for `addr`.
pub fn format_pasv_reply(addr: SocketAddrV4) -> String {
    format!("Entering Passive Mode ({}).", format_port_arg(addr))
}

/// Find the address in a 227 reply text. Servers differ: most put the six
/// numbers in parentheses, some do not (RFC 1123 4.1.2.6 tells clients to
/// scan for the first digit), so scan for the first run of six numbers.
pub fn parse_pasv_reply(text: &str) -> Result<SocketAddrV4, ProtoError> {
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        if bytes[start].is_ascii_digit() {
            let end = bytes[start..]
                .iter()
                .position(|b| !(b.is_ascii_digit() || *b == b','))
                .map_or(bytes.len(), |p| start + p);
            if let Ok(a) = parse_port_arg(&text[start..end]) {
                if a.port() == 0 {
                    return Err(bad("PASV", "port 0 in the reply"));
                }
                return Ok(a);
            }
            start = end;
        } else {
            start += 1;
        }
    }
    Err(bad("PASV", format!("no address in reply {text:?}")))
}

/// The text of a 229 reply for `port`.
pub fn format_epsv_reply(port: u16) -> String {
    format!("Entering Extended Passive Mode (|||{port}|)")
}

/// Find the port in a 229 reply text: `(<d><d><d>port<d>)`.
pub fn parse_epsv_reply(text: &str) -> Result<u16, ProtoError> {
    let open = text
        .find('(')
        .ok_or_else(|| bad("EPSV", format!("no '(' in reply {text:?}")))?;
    let rest = &text[open + 1..];
    let close = rest
        .find(')')
        .ok_or_else(|| bad("EPSV", format!("no ')' in reply {text:?}")))?;
    let inner = &rest[..close];
    let d = inner
        .chars()
        .next()
        .ok_or_else(|| bad("EPSV", "empty parentheses"))?;
    let parts: Vec<&str> = inner.split(d).collect();
    if parts.len() != 5 {
        return Err(bad("EPSV", format!("expected (|||port|), got ({inner})")));
    }
    match parts[3].parse::<u16>() {
        // Port 0 is no port: connecting to it cannot be meant.
        Ok(0) => Err(bad("EPSV", "port 0 in the reply")),
        Ok(p) if digits(parts[3]) => Ok(p),
        _ => Err(bad("EPSV", format!("bad port {:?}", parts[3]))),
    }
}

/// Fuzz entry: every host-port parser on arbitrary text. Must never
/// panic; whatever parses must format and parse back to the same address.
#[doc(hidden)]
pub fn fuzz_hostport(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(a) = parse_port_arg(text) {
        assert_eq!(parse_port_arg(&format_port_arg(a)).ok(), Some(a));
    }
    if let Ok(a) = parse_eprt_arg(text) {
        assert_eq!(parse_eprt_arg(&format_eprt_arg(a)).ok(), Some(a));
    }
    if let Ok(v) = parse_mprt_arg(text) {
        assert_eq!(parse_mprt_arg(&format_mprt_arg(&v)).ok(), Some(v));
    }
    if let Ok(a) = parse_pasv_reply(text) {
        assert_eq!(parse_pasv_reply(&format_pasv_reply(a)).ok(), Some(a));
    }
    if let Ok(p) = parse_epsv_reply(text) {
        assert_eq!(parse_epsv_reply(&format_epsv_reply(p)).ok(), Some(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_roundtrip() {
        let a: SocketAddrV4 = "132.235.1.2:6275".parse().unwrap();
        assert_eq!(format_port_arg(a), "132,235,1,2,24,131");
        assert_eq!(parse_port_arg("132,235,1,2,24,131").unwrap(), a);
    }

    #[test]
    fn port_rejects_out_of_range() {
        assert!(parse_port_arg("256,0,0,1,1,1").is_err());
        assert!(parse_port_arg("1,2,3,4,5").is_err());
        assert!(parse_port_arg("1,2,3,4,5,x").is_err());
        // A sign is no digit (Rust's parse takes a leading `+`).
        assert!(parse_port_arg("127,0,0,1,+4,1").is_err());
        assert!(parse_eprt_arg("|2|::1|+49102|").is_err());
        assert!(parse_epsv_reply("229 Entering Extended Passive Mode (|||+6446|)").is_err());
    }

    #[test]
    fn eprt_rfc2428_examples() {
        assert_eq!(
            parse_eprt_arg("|1|132.235.1.2|6275|").unwrap(),
            "132.235.1.2:6275".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            parse_eprt_arg("|2|1080::8:800:200C:417A|5282|").unwrap(),
            "[1080::8:800:200C:417A]:5282"
                .parse::<SocketAddr>()
                .unwrap()
        );
        assert!(parse_eprt_arg("|3|1.2.3.4|5|").is_err());
        assert!(parse_eprt_arg("|1|::1|5|").is_err());
        assert!(parse_eprt_arg("|1|1.2.3.4|99999|").is_err());
        assert!(parse_eprt_arg("").is_err());
    }

    #[test]
    fn eprt_format_roundtrip() {
        for s in ["[::1]:21", "10.0.0.1:65535"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(parse_eprt_arg(&format_eprt_arg(a)).unwrap(), a);
        }
    }

    #[test]
    fn mprt_list() {
        let addrs: Vec<SocketAddr> = vec![
            "198.18.0.1:5001".parse().unwrap(),
            "[::1]:7".parse().unwrap(),
        ];
        let s = format_mprt_arg(&addrs);
        assert_eq!(s, "|1|198.18.0.1|5001| |2|::1|7|");
        assert_eq!(parse_mprt_arg(&s).unwrap(), addrs);
        assert!(parse_mprt_arg("").is_err());
        assert!(parse_mprt_arg("|1|1.2.3.4|5| junk").is_err());
    }

    #[test]
    fn pasv_reply_variants() {
        let want: SocketAddrV4 = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(
            parse_pasv_reply("Entering Passive Mode (127,0,0,1,19,136).").unwrap(),
            want
        );
        assert_eq!(
            parse_pasv_reply("Entering Passive Mode 127,0,0,1,19,136").unwrap(),
            want
        );
        assert_eq!(parse_pasv_reply(&format_pasv_reply(want)).unwrap(), want);
        assert!(parse_pasv_reply("Entering Passive Mode").is_err());
    }

    #[test]
    fn epsv_reply() {
        assert_eq!(
            parse_epsv_reply("Entering Extended Passive Mode (|||6446|)").unwrap(),
            6446
        );
        assert_eq!(parse_epsv_reply(&format_epsv_reply(1)).unwrap(), 1);
        assert!(parse_epsv_reply("Entering (|||x|)").is_err());
        assert!(parse_epsv_reply("no parens").is_err());
    }

    proptest::proptest! {
        /// The fuzz entry on text near the accepted forms.
        #[test]
        fn fuzz_entry_roundtrips(text in "[(|!,0-9a-f:. ]{0,60}") {
            fuzz_hostport(text.as_bytes());
        }

        #[test]
        fn fuzz_entry_survives_any_bytes(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            fuzz_hostport(&data);
        }
    }

    #[test]
    fn fuzz_entry_checks_what_parses() {
        fuzz_hostport(b"10,0,0,1,4,1");
        fuzz_hostport(b"|2|::1|5002|");
        fuzz_hostport(b"|1|198.18.0.1|5001| |2|::1|5002|");
        fuzz_hostport(b"Entering Passive Mode (127,0,0,1,200,10).");
        fuzz_hostport(b"Entering Extended Passive Mode (!!!6446!)");
    }
}
