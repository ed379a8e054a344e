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

/// [`format_time`] of `t` with its milliseconds (`YYYYMMDDHHMMSS.sss`,
/// RFC 3659's `time-val`) where they are not zero: MDTM's answer and the
/// MLSx `modify` fact, so that a file rewritten within the same second
/// reads as changed to a client that resumes or mirrors it.
pub fn format_time_ms(t: std::time::SystemTime) -> String {
    format_time_of_ms(epoch_ms(t))
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

/// Milliseconds since the epoch for `YYYYMMDDHHMMSS[.sss]`: the
/// fraction's first three digits count (RFC 3659's `time-val`); a
/// fraction that is not digits is refused.
pub fn parse_time_ms(t: &str) -> Option<i64> {
    let t = t.trim();
    let secs = parse_time(t)?;
    let ms = match t.split_once('.') {
        None => 0,
        Some((_, f)) => {
            if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let mut d = f.bytes().take(3).map(|b| i64::from(b - b'0'));
            let mut ms = 0;
            for scale in [100, 10, 1] {
                ms += d.next().unwrap_or(0) * scale;
            }
            ms
        }
    };
    Some(secs * 1000 + ms)
}

/// `YYYYMMDDHHMMSS` for milliseconds since the epoch, with `.sss` where
/// they are not a whole second.
pub fn format_time_of_ms(ms: i64) -> String {
    let (secs, frac) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    match frac {
        0 => format_time(secs),
        f => format!("{}.{f:03}", format_time(secs)),
    }
}

/// Milliseconds since the Unix epoch, rounded down (negative before it);
/// from seconds and the fraction, so that times past 2262 (where
/// nanoseconds overflow 64 bits, and ext4 goes on to 2446) stay exact.
pub fn epoch_ms(t: std::time::SystemTime) -> i64 {
    let ms = |d: std::time::Duration| {
        i64::try_from(d.as_secs())
            .unwrap_or(i64::MAX / 1000)
            .min(i64::MAX / 1000)
            * 1000
            + i64::from(d.subsec_millis())
    };
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => ms(d),
        // Before the epoch: rounded down, toward the past.
        Err(e) => {
            let d = e.duration();
            let whole = ms(d);
            if d.subsec_nanos() % 1_000_000 == 0 {
                -whole
            } else {
                -whole - 1
            }
        }
    }
}

/// The instant `ms` milliseconds after the Unix epoch.
pub fn system_time_ms(ms: i64) -> std::time::SystemTime {
    let d = std::time::Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        std::time::UNIX_EPOCH + d
    } else {
        std::time::UNIX_EPOCH - d
    }
}

/// Whether a local file's time (`local_ms`) is the remote time
/// `remote_ms`, to the precision the remote side gave: to the millisecond
/// where it has a fraction (`xftp serve`), to the second where it has
/// none (a stock server, or a time set whole). A copy stamped from the
/// remote time matches it either way; a file rewritten within the same
/// second does not, where the server tells milliseconds.
pub fn same_time(local_ms: i64, remote_ms: i64) -> bool {
    if remote_ms.rem_euclid(1000) == 0 {
        local_ms.div_euclid(1000) == remote_ms.div_euclid(1000)
    } else {
        local_ms == remote_ms
    }
}

/// Whole seconds since the Unix epoch (negative before it).
pub fn epoch_secs(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// Nanoseconds since the Unix epoch (negative before it; saturating far
/// from it): a local file's time as `SITE RESUMABLE` records it.
pub fn epoch_nanos(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
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
    /// `modify` fact, milliseconds since the epoch (a whole second where
    /// the fact has no fraction).
    pub modify_ms: Option<i64>,
    /// `UNIX.mode` fact (permission bits only).
    pub mode: Option<u32>,
    /// `unique` fact: the same for two names of one directory (a link
    /// to it), so a walk can tell a loop.
    pub unique: Option<String>,
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
    let (_, name) = line.split_once(' ')?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    parse_facts(line)
}

/// The facts of an MLST reply's entry line (` fact=value;...; /path`,
/// the leading space included or not), whatever path it names: MLST
/// gives the facts of the path asked for, which may hold `/` or be `.`.
pub fn parse_mlst(line: &str) -> Option<Entry> {
    let line = line.trim_start_matches(' ').trim_end_matches(['\r', '\n']);
    line.split_once(' ')
        .filter(|(facts, name)| facts.contains('=') && !name.is_empty())?;
    parse_facts(line)
}

fn parse_facts(line: &str) -> Option<Entry> {
    let (facts, name) = line.split_once(' ')?;
    let mut e = Entry {
        name: name.to_owned(),
        kind: Kind::Other,
        size: None,
        modify_ms: None,
        mode: None,
        unique: None,
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
            "modify" => e.modify_ms = parse_time_ms(v),
            // pyftpdlib writes Python's `0o755`.
            "unix.mode" => {
                let v = v.strip_prefix("0o").or(v.strip_prefix("0O")).unwrap_or(v);
                e.mode = u32::from_str_radix(v, 8).ok().map(|m| m & 0o7777)
            }
            "unique" if !v.is_empty() => e.unique = Some(v.to_ascii_lowercase()),
            _ => {}
        }
    }
    Some(e)
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];

/// Blank-separated fields of a line with their byte ranges.
fn fields(line: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (c == ' ' || c == '\t', start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, line.len()));
    }
    out
}

/// A name a server gave that can be used as a local file name: not empty,
/// not `.` or `..`, no `/` (nothing that leaves the directory).
pub fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// Parse one line of a LIST reply, for servers without MLSD (vsftpd):
/// the `ls -l` form most servers send (`drwxr-xr-x 2 ftp ftp 4096 Jan 5
/// 12:00 name`, with or without the group, with ACL marks) or the DOS
/// form of IIS (`01-02-24 10:00AM <DIR>|SIZE name`). `None` for `total`
/// lines, anything unreadable and names that could leave the directory
/// ([`safe_name`]). A symbolic link is [`Kind::Other`], named without its
/// `-> target`. The time is left out: a LIST time has minutes at best,
/// no year for recent files and no time zone, so a copy stamped with it
/// would claim a time the file never had. The permission bits are exact
/// (setuid, setgid and sticky are not taken).
pub fn parse_list_line(line: &str) -> Option<Entry> {
    let line = line.trim_end_matches(['\r', '\n']);
    let f = fields(line);
    let tok = |i: usize| f.get(i).map(|&(a, b)| &line[a..b]);
    let first = tok(0)?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mut e = Entry {
        name: String::new(),
        kind: Kind::Other,
        size: None,
        modify_ms: None,
        mode: None,
        unique: None,
    };
    if first.len() >= 8
        && first.as_bytes()[2] == b'-'
        && first.as_bytes()[..2].iter().all(u8::is_ascii_digit)
    {
        // DOS: 01-02-24  10:00AM  <DIR>|SIZE  name
        let what = tok(2)?;
        if what.eq_ignore_ascii_case("<DIR>") {
            e.kind = Kind::Dir;
        } else if digits(what) {
            e.kind = Kind::File;
            e.size = what.parse().ok();
        } else {
            return None;
        }
        e.name = line[f.get(3)?.0..].trim_end().to_owned();
    } else {
        let perms = first.as_bytes();
        if perms.len() < 10 || !perms[1..10].iter().all(|b| b"rwxsStTlL-".contains(b)) {
            return None;
        }
        e.kind = match perms[0] {
            b'-' => Kind::File,
            b'd' => Kind::Dir,
            _ => Kind::Other,
        };
        let mut mode = 0;
        for (i, &b) in perms[1..10].iter().enumerate() {
            // r w x per class; s and t mean x as well.
            let on = match i % 3 {
                0 => b == b'r',
                1 => b == b'w',
                _ => matches!(b, b'x' | b's' | b't'),
            };
            if on {
                mode |= 0o400 >> i;
            }
        }
        e.mode = Some(mode);
        // The date (month, day, time or year) ends the fixed fields, whose
        // number differs between servers (no group, ACL marks, ...).
        let date = (3..f.len().saturating_sub(3)).find(|&i| {
            let (m, d, t) = (tok(i), tok(i + 1), tok(i + 2));
            m.is_some_and(|m| MONTHS.contains(&m.to_ascii_lowercase().as_str()))
                && d.is_some_and(|d| d.len() <= 2 && digits(d))
                && t.is_some_and(|t| t.contains(':') || (t.len() == 4 && digits(t)))
        })?;
        if e.kind == Kind::File {
            e.size = tok(date - 1)
                .filter(|t| digits(t))
                .and_then(|t| t.parse().ok());
        }
        // The name begins one space after the time or year, blanks of
        // its own included ("  lead" is not "lead").
        let after = f.get(date + 2)?.1;
        let name = line
            .get(after + 1..)
            .filter(|n| n.chars().any(|c| c != ' ' && c != '\t'))?;
        e.name = if perms[0] == b'l' {
            name.split(" -> ").next().unwrap_or(name)
        } else {
            name
        }
        .to_owned();
    }
    safe_name(&e.name).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_on_the_wire() {
        assert_eq!(parse_time_ms("20231114221320"), Some(1_700_000_000_000));
        assert_eq!(parse_time_ms("20231114221320.1"), Some(1_700_000_000_100));
        assert_eq!(
            parse_time_ms("20231114221320.123456"),
            Some(1_700_000_000_123)
        );
        assert_eq!(parse_time_ms("20231114221320."), None);
        assert_eq!(parse_time_ms("20231114221320.1a"), None);
        for ms in [0, 1_700_000_000_000, 1_700_000_000_007, -1, -1001, -999] {
            assert_eq!(parse_time_ms(&format_time_of_ms(ms)), Some(ms), "{ms}");
            assert_eq!(epoch_ms(system_time_ms(ms)), ms);
            assert_eq!(format_time_ms(system_time_ms(ms)), format_time_of_ms(ms));
        }
        // Past 2262 (ext4 holds times to 2446): exact, not saturated.
        use std::time::Duration;
        let far = std::time::UNIX_EPOCH + Duration::from_secs(15_032_385_535);
        assert_eq!(epoch_ms(far), 15_032_385_535_000);
        assert_eq!(format_time_ms(far), "24460510223855");
        // Before the epoch, rounded toward the past.
        let before = std::time::UNIX_EPOCH - Duration::from_micros(1500);
        assert_eq!(epoch_ms(before), -2);
        // To the remote side's precision.
        assert!(same_time(1_700_000_000_596, 1_700_000_000_000));
        assert!(!same_time(1_700_000_001_000, 1_700_000_000_000));
        assert!(same_time(1_700_000_000_596, 1_700_000_000_596));
        assert!(!same_time(1_700_000_000_000, 1_700_000_000_596));
        assert!(!same_time(1_700_000_000_900, 1_700_000_000_596));
    }

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
            assert_eq!(epoch_secs(system_time_ms(secs * 1000)), secs);
        }
    }

    #[test]
    fn milliseconds_where_there_are_some() {
        use std::time::Duration;
        let at = |secs: i64, ms: u64| system_time_ms(secs * 1000) + Duration::from_millis(ms);
        assert_eq!(format_time_ms(at(1_700_000_000, 0)), "20231114221320");
        assert_eq!(format_time_ms(at(1_700_000_000, 7)), "20231114221320.007");
        assert_eq!(format_time_ms(at(1_700_000_000, 900)), "20231114221320.900");
        assert_eq!(format_time_ms(at(-1, 250)), "19691231235959.250");
        // Read back, the fraction is dropped.
        assert_eq!(parse_time("20231114221320.900"), Some(1_700_000_000));
    }

    #[test]
    fn list_lines() {
        let e = |l: &str| parse_list_line(l).map(|e| (e.name, e.kind, e.size, e.mode));
        assert_eq!(
            e("-rw-r--r--   1 1000     1000             5 Jan  5 12:00 a b.txt"),
            Some(("a b.txt".into(), Kind::File, Some(5), Some(0o644)))
        );
        assert_eq!(
            e("-rwsr-x--T 1 ftp ftp 1048576 Dec 31  2023 old.bin\r"),
            Some(("old.bin".into(), Kind::File, Some(1_048_576), Some(0o750)))
        );
        // No group; an ACL mark after the bits.
        assert_eq!(
            e("-rw-r--r--+ 1 owner 12 Mar 10 09:15 ng.dat"),
            Some(("ng.dat".into(), Kind::File, Some(12), Some(0o644)))
        );
        assert_eq!(
            e("lrwxrwxrwx 1 0 0 7 Feb  1 10:00 latest -> v1.2.tar"),
            Some(("latest".into(), Kind::Other, None, Some(0o777)))
        );
        assert_eq!(
            e("drwxr-xr-x    3 104      107          4096 Nov 27 03:45 tree"),
            Some(("tree".into(), Kind::Dir, None, Some(0o755)))
        );
        // Only spaces and tabs separate fields: a vertical tab is a name.
        assert_eq!(
            e("-rw-r--r-- 1 0 0 3 Nov 29 09:00 \u{b}").map(|x| x.0),
            Some("\u{b}".to_string())
        );
        // A name's own leading blanks are kept (vsftpd lists them so).
        assert_eq!(
            e("-rw-r--r--    1 0        0               3 Nov 29 09:00   lead"),
            Some(("  lead".into(), Kind::File, Some(3), Some(0o644)))
        );
        assert_eq!(
            e("-rw-r--r--    1 0        0               3 Nov 29  2024  lead"),
            Some((" lead".into(), Kind::File, Some(3), Some(0o644)))
        );
        assert_eq!(
            e("01-02-24  10:00AM       <DIR>          dos dir"),
            Some(("dos dir".into(), Kind::Dir, None, None))
        );
        assert_eq!(
            e("01-02-24  10:00AM                 1234 dos file.txt"),
            Some(("dos file.txt".into(), Kind::File, Some(1234), None))
        );
        for bad in [
            "total 12",
            "",
            "-rw-r--r-- 1 0 0 1 Jan  5 12:00 ../../etc/passwd",
            "-rw-r--r-- 1 0 0 1 Jan  5 12:00 ..",
            "drwxr-xr-x 1 0 0 1 Jan  5 12:00 .",
            "-rw-r--r-- 1 0 0 1 Jan  5 12:00",
            "hello world this is not a listing line at all",
        ] {
            assert_eq!(e(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn list_lines_never_panic(s in "\\PC{0,120}") {
            let _ = parse_list_line(&s);
        }

        #[test]
        fn list_lines_round_trip(
            name in "[^/ \\t\\r\\n][^/\\r\\n]{0,30}",
            size in 0u64..1u64 << 50,
            mode in 0u32..0o1000,
            dir in proptest::bool::ANY,
        ) {
            proptest::prop_assume!(name != "." && name != ".." && !name.contains(" -> "));
            let bits: String = (0..9)
                .map(|i| if mode & (0o400 >> i) != 0 { ["r", "w", "x"][i % 3] } else { "-" })
                .collect();
            let kind = if dir { 'd' } else { '-' };
            let line = format!("{kind}{bits}   1 ftp      ftp {size:>12} Nov 27 03:45 {name}");
            let e = parse_list_line(&line).unwrap();
            proptest::prop_assert_eq!(&e.name, &name);
            proptest::prop_assert_eq!(e.mode, Some(mode));
            proptest::prop_assert_eq!(e.size, (!dir).then_some(size));
        }
    }

    #[test]
    fn mlsd_lines() {
        let e = parse_mlsx("type=file;size=10;modify=20231114221320;perm=r;UNIX.mode=0644; a b;c")
            .unwrap();
        assert_eq!(e.name, "a b;c");
        assert_eq!(e.kind, Kind::File);
        assert_eq!(
            (e.size, e.modify_ms, e.mode),
            (Some(10), Some(1_700_000_000_000), Some(0o644))
        );
        assert_eq!(e.unique, None);
        let p = parse_mlsx("modify=20261130025100;size=2;type=file;unix.mode=0o755; run").unwrap();
        assert_eq!(p.mode, Some(0o755));
        let d = parse_mlsx("Type=dir;Modify=20231114221320;Unique=803G1A; sub\r\n").unwrap();
        assert_eq!(d.kind, Kind::Dir);
        assert_eq!(d.unique.as_deref(), Some("803g1a"));
        let l = parse_mlsx("type=OS.unix=symlink;unique=803g1a; link").unwrap();
        assert_eq!(l.kind, Kind::Other);
        assert_eq!(parse_mlsx("type=cdir; .").map(|e| e.kind), None);
        assert_eq!(
            parse_mlsx("type=pdir; up").unwrap().kind,
            Kind::SelfOrParent
        );
        assert!(parse_mlsx("garbage").is_none());
        // MLST's entry names the path asked for, `/` and all.
        let top = parse_mlst(" type=dir;unique=803G1B; /pub/tree").unwrap();
        assert_eq!(
            (top.kind, top.unique.as_deref()),
            (Kind::Dir, Some("803g1b"))
        );
        assert_eq!(
            parse_mlst("type=cdir;unique=1g2; .").unwrap().kind,
            Kind::SelfOrParent
        );
        assert!(parse_mlst("Listing /pub/tree").is_none());
        assert!(parse_mlsx("type=file; ../../etc/passwd").is_none());
    }
}
