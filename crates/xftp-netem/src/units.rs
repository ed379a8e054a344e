//! Parsing of the tc-like strings used on the command line: rates
//! (`100mbit`), durations (`50ms`), queue limits (`100p`, `64kb`) and
//! probabilities (`0.001`, `1e-7`).

use std::time::Duration;

use crate::model::QueueLimit;

/// A setting string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {what} {input:?}: {hint}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    hint: &'static str,
}

fn err(what: &'static str, input: &str, hint: &'static str) -> ParseError {
    ParseError {
        what,
        input: input.to_owned(),
        hint,
    }
}

/// Splits `12.5mbit` into (`12.5`, `mbit`).
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| {
            !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+')
        })
        .unwrap_or(s.len());
    // `1e` followed by a unit letter: only treat `e` as exponent when digits follow.
    let (mut num, mut unit) = s.split_at(end);
    while num.ends_with(['e', 'E', '-', '+']) {
        let cut = num.len() - 1;
        num = &s[..cut];
        unit = &s[cut..];
    }
    (num, unit)
}

fn parse_number(what: &'static str, input: &str, num: &str) -> Result<f64, ParseError> {
    let v: f64 = num
        .parse()
        .map_err(|_| err(what, input, "expected a number followed by a unit"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(err(what, input, "must be a finite, non-negative number"));
    }
    Ok(v)
}

/// Parses a rate in bits per second, tc style: `bit`, `kbit`, `mbit`,
/// `gbit`, `tbit` (powers of 1000). `0`, `none` and `unlimited` mean no
/// rate limit (`None`). Byte-per-second units (`mbps`) are refused on
/// purpose: tc reads them as bytes, most people as bits.
pub fn parse_rate(input: &str) -> Result<Option<u64>, ParseError> {
    const WHAT: &str = "rate";
    let s = input.trim().to_ascii_lowercase();
    if s == "none" || s == "unlimited" {
        return Ok(None);
    }
    let (num, unit) = split_number(&s);
    let v = parse_number(WHAT, input, num)?;
    let mult = match unit {
        "" | "bit" => 1.0,
        "k" | "kbit" => 1e3,
        "m" | "mbit" => 1e6,
        "g" | "gbit" => 1e9,
        "t" | "tbit" => 1e12,
        _ if unit.ends_with("bps") || unit.ends_with("b/s") => {
            return Err(err(WHAT, input, "ambiguous unit; write kbit, mbit or gbit"))
        }
        _ => {
            return Err(err(
                WHAT,
                input,
                "unknown unit; use bit, kbit, mbit or gbit",
            ))
        }
    };
    let bps = (v * mult).round();
    if bps == 0.0 {
        return Ok(None);
    }
    if bps > u64::MAX as f64 {
        return Err(err(WHAT, input, "too large"));
    }
    Ok(Some(bps as u64))
}

/// Parses a duration: `50ms`, `250us`, `1.5s`, `100ns`; a bare `0` is zero.
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    const WHAT: &str = "delay";
    let s = input.trim().to_ascii_lowercase();
    let (num, unit) = split_number(&s);
    let v = parse_number(WHAT, input, num)?;
    let secs = match unit {
        "s" | "sec" => v,
        "ms" | "msec" => v / 1e3,
        "us" | "usec" => v / 1e6,
        "ns" | "nsec" => v / 1e9,
        "" if v == 0.0 => 0.0,
        "" => return Err(err(WHAT, input, "missing unit; use s, ms, us or ns")),
        _ => return Err(err(WHAT, input, "unknown unit; use s, ms, us or ns")),
    };
    if secs > 3600.0 {
        return Err(err(WHAT, input, "more than an hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a queue limit: packets (`100p`, `100pkt`) or bytes with tc's
/// binary multiples (`64kb` = 64 KiB, `1mb` = 1 MiB, `1500b`);
/// `unlimited` for no limit.
pub fn parse_queue(input: &str) -> Result<QueueLimit, ParseError> {
    const WHAT: &str = "queue limit";
    let s = input.trim().to_ascii_lowercase();
    if s == "unlimited" || s == "none" {
        return Ok(QueueLimit::Unlimited);
    }
    let (num, unit) = split_number(&s);
    let v = parse_number(WHAT, input, num)?;
    if v.fract() != 0.0 && matches!(unit, "p" | "pkt" | "pkts" | "packets") {
        return Err(err(WHAT, input, "a packet count must be whole"));
    }
    let limit = match unit {
        "p" | "pkt" | "pkts" | "packets" => QueueLimit::Packets(v as u64),
        "b" | "byte" | "bytes" => QueueLimit::Bytes(v as u64),
        "k" | "kb" | "kib" => QueueLimit::Bytes((v * 1024.0) as u64),
        "m" | "mb" | "mib" => QueueLimit::Bytes((v * 1024.0 * 1024.0) as u64),
        _ => {
            return Err(err(
                WHAT,
                input,
                "use a packet count (100p) or a size in bytes (1500b, 64kb, 1mb)",
            ))
        }
    };
    if matches!(limit, QueueLimit::Packets(0) | QueueLimit::Bytes(0)) {
        return Err(err(WHAT, input, "a zero queue would drop every packet"));
    }
    Ok(limit)
}

/// Parses a probability in [0, 1]: `0.001`, `1e-7`, or a percentage `0.1%`.
pub fn parse_probability(input: &str) -> Result<f64, ParseError> {
    const WHAT: &str = "probability";
    let s = input.trim();
    let (num, scale) = match s.strip_suffix('%') {
        Some(n) => (n, 0.01),
        None => (s, 1.0),
    };
    let v = parse_number(WHAT, input, num)? * scale;
    if v > 1.0 {
        return Err(err(WHAT, input, "must be between 0 and 1 (or 0% and 100%)"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_bits_per_second_in_powers_of_1000() {
        assert_eq!(parse_rate("100mbit"), Ok(Some(100_000_000)));
        assert_eq!(parse_rate("1.544Mbit"), Ok(Some(1_544_000)));
        assert_eq!(parse_rate("1gbit"), Ok(Some(1_000_000_000)));
        assert_eq!(parse_rate("64kbit"), Ok(Some(64_000)));
        assert_eq!(parse_rate("9600"), Ok(Some(9600)));
        assert_eq!(parse_rate("0"), Ok(None));
        assert_eq!(parse_rate("unlimited"), Ok(None));
        assert!(parse_rate("10mbps").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1mbit").is_err());
    }

    #[test]
    fn durations_take_tc_units() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("50").is_err());
        assert!(parse_duration("5 fortnights").is_err());
    }

    #[test]
    fn queue_limits_in_packets_or_binary_bytes() {
        assert_eq!(parse_queue("100p"), Ok(QueueLimit::Packets(100)));
        assert_eq!(parse_queue("20pkt"), Ok(QueueLimit::Packets(20)));
        assert_eq!(parse_queue("64kb"), Ok(QueueLimit::Bytes(65536)));
        assert_eq!(parse_queue("1mb"), Ok(QueueLimit::Bytes(1 << 20)));
        assert_eq!(parse_queue("1500b"), Ok(QueueLimit::Bytes(1500)));
        assert_eq!(parse_queue("unlimited"), Ok(QueueLimit::Unlimited));
        assert!(parse_queue("0p").is_err());
        assert!(parse_queue("1.5p").is_err());
        assert!(parse_queue("100").is_err());
    }

    #[test]
    fn probabilities_accept_exponents_and_percent() {
        assert_eq!(parse_probability("0.001"), Ok(0.001));
        assert_eq!(parse_probability("1e-7"), Ok(1e-7));
        assert_eq!(parse_probability("1E-7"), Ok(1e-7));
        assert_eq!(parse_probability("0.5%"), Ok(0.005));
        assert!(parse_probability("1.5").is_err());
        assert!(parse_probability("-0.1").is_err());
    }
}
