//! File facts on the wire: RFC 3659 times (`YYYYMMDDHHMMSS`, UTC) and
//! MLSD/MLST entries (`type=file;size=10;modify=...; name`).

/// `YYYYMMDDHHMMSS` in UTC for seconds since the Unix epoch (MDTM, MFMT,
/// the MLSx `modify` fact).
pub fn format_time(secs: i64) -> String {
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}{mo:02}{d:02}{:02}{:02}{:02}",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

/// Seconds since the epoch for `YYYYMMDDHHMMSS` (a fraction `.sss` is
/// dropped); `None` unless every field is in range.
pub fn parse_time(t: &str) -> Option<i64> {
    let t = t.trim();
    let whole = t.split('.').next()?;
    if whole.len() != 14 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |a: usize, b: usize| whole[a..b].parse::<i64>().ok();
    let (y, mo, d, h, mi, s) = (
        n(0, 4)?,
        n(4, 6)?,
        n(6, 8)?,
        n(8, 10)?,
        n(10, 12)?,
        n(12, 14)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    // Day 31 of a 30-day month would roll over: refuse it.
    if civil_from_days(days) != (y, mo as u32, d as u32) {
        return None;
    }
    Some(days * 86_400 + h * 3600 + mi * 60 + s.min(59))
}

/// The instant `secs` seconds after the Unix epoch (before it if negative).
pub fn system_time(secs: i64) -> std::time::SystemTime {
    let d = std::time::Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        std::time::UNIX_EPOCH + d
    } else {
        std::time::UNIX_EPOCH - d
    }
}

/// Whole seconds since the Unix epoch (negative before it).
pub fn epoch_secs(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// (year, month 1-12, day 1-31) for days since 1970-01-01
/// (H. Hinnant's civil_from_days).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 (H. Hinnant's days_from_civil).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What an MLSD line says of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name (no path), as bytes are decoded lossily.
    pub name: String,
    /// `type` fact.
    pub kind: Kind,
    /// `size` fact.
    pub size: Option<u64>,
    /// `modify` fact, seconds since the epoch.
    pub modify: Option<i64>,
    /// `UNIX.mode` fact (permission bits only).
    pub mode: Option<u32>,
}

/// The `type` fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `file`
    File,
    /// `dir`
    Dir,
    /// `cdir` / `pdir`: the listed directory and its parent.
    SelfOrParent,
    /// Anything else (`OS.unix=symlink`, ...).
    Other,
}

/// Parse one MLSD line (`fact=value;...; name`); `None` for a line that
/// is not one.
pub fn parse_mlsx(line: &str) -> Option<Entry> {
    let line = line.trim_end_matches(['\r', '\n']);
    let (facts, name) = line.split_once(' ')?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let mut e = Entry {
        name: name.to_owned(),
        kind: Kind::Other,
        size: None,
        modify: None,
        mode: None,
    };
    for fact in facts.split(';').filter(|f| !f.is_empty()) {
        let Some((k, v)) = fact.split_once('=') else {
            continue;
        };
        match k.to_ascii_lowercase().as_str() {
            "type" => {
                e.kind = match v.to_ascii_lowercase().as_str() {
                    "file" => Kind::File,
                    "dir" => Kind::Dir,
                    "cdir" | "pdir" => Kind::SelfOrParent,
                    _ => Kind::Other,
                }
            }
            "size" => e.size = v.parse().ok(),
            "modify" => e.modify = parse_time(v),
            "unix.mode" => e.mode = u32::from_str_radix(v, 8).ok().map(|m| m & 0o7777),
            _ => {}
        }
    }
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for secs in [0i64, 951_782_400, 1_700_000_000, 4_102_444_799, 86_399] {
            assert_eq!(parse_time(&format_time(secs)), Some(secs), "{secs}");
        }
        assert_eq!(format_time(1_700_000_000), "20231114221320");
        assert_eq!(parse_time("20231114221320.123"), Some(1_700_000_000));
        for bad in [
            "2023111422132",
            "20231314221320",
            "20230231000000",
            "2023111422132x",
            "",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn epoch_seconds_both_ways() {
        for secs in [0i64, 1_700_000_000, -86_400] {
            assert_eq!(epoch_secs(system_time(secs)), secs);
        }
    }

    #[test]
    fn mlsd_lines() {
        let e = parse_mlsx("type=file;size=10;modify=20231114221320;perm=r;UNIX.mode=0644; a b;c")
            .unwrap();
        assert_eq!(e.name, "a b;c");
        assert_eq!(e.kind, Kind::File);
        assert_eq!(
            (e.size, e.modify, e.mode),
            (Some(10), Some(1_700_000_000), Some(0o644))
        );
        let d = parse_mlsx("Type=dir;Modify=20231114221320; sub\r\n").unwrap();
        assert_eq!(d.kind, Kind::Dir);
        assert_eq!(parse_mlsx("type=cdir; .").map(|e| e.kind), None);
        assert_eq!(
            parse_mlsx("type=pdir; up").unwrap().kind,
            Kind::SelfOrParent
        );
        assert!(parse_mlsx("garbage").is_none());
        assert!(parse_mlsx("type=file; ../../etc/passwd").is_none());
    }
}
