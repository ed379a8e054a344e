//! The shell's text handling: command lines into words, file names out of
//! LIST lines, the directory out of a PWD reply, passwords out of the
//! history.

/// Split a command line into words. Blanks separate words; '...' quotes
/// literally; "..." quotes with `\"` and `\\` escaped; outside quotes a
/// backslash takes the next character as it is. A line whose first
/// non-blank character is `#` is a comment: no words.
pub fn split(line: &str) -> Result<Vec<String>, String> {
    if line.trim_start().starts_with('#') {
        return Ok(Vec::new());
    }
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some('"') if c == '\\' => match chars.next() {
                Some(n @ ('"' | '\\')) => cur.push(n),
                Some(n) => {
                    cur.push('\\');
                    cur.push(n);
                }
                None => break,
            },
            Some(_) => cur.push(c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    in_word = true;
                }
                '\\' => match chars.next() {
                    Some(n) => {
                        cur.push(n);
                        in_word = true;
                    }
                    None => return Err("the line ends in a backslash".into()),
                },
                c if c.is_whitespace() => {
                    if in_word {
                        words.push(std::mem::take(&mut cur));
                        in_word = false;
                    }
                }
                c => {
                    cur.push(c);
                    in_word = true;
                }
            },
        }
    }
    if let Some(q) = quote {
        return Err(format!("unclosed {q} quote"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// A word quoted so that [`split`] gives it back.
pub fn quote(w: &str) -> String {
    if !w.is_empty() && !w.contains(|c: char| c.is_whitespace() || "'\"\\#".contains(c)) {
        return w.to_string();
    }
    let mut q = String::from("\"");
    for c in w.chars() {
        if c == '"' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
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

/// The name of a plain file (or symbolic link) in one LIST line, in the
/// `ls -l` form most servers send or the DOS form of IIS; `None` for
/// directories, `total` lines and anything unreadable. The name is the
/// server's, so it is refused when it could leave the directory.
pub fn list_file_name(line: &str) -> Option<&str> {
    let line = line.trim_end_matches(['\r', '\n']);
    let f = fields(line);
    let tok = |i: usize| f.get(i).map(|&(a, b)| &line[a..b]);
    let first = tok(0)?;
    let name = if first.len() >= 8
        && first.as_bytes()[2] == b'-'
        && first.as_bytes()[..2].iter().all(u8::is_ascii_digit)
    {
        // DOS: 01-02-24  10:00AM  <DIR>|SIZE  name
        if tok(2)? == "<DIR>" || !tok(2)?.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        line[f.get(3)?.0..].trim_end()
    } else {
        let kind = first.as_bytes()[0];
        if first.len() < 10 || !matches!(kind, b'-' | b'l') {
            return None;
        }
        // The date (month, day, time or year) ends the fixed fields, whose
        // number differs between servers (no group, ACL marks, ...).
        let date = (3..f.len().saturating_sub(3)).find(|&i| {
            let (m, d, t) = (tok(i), tok(i + 1), tok(i + 2));
            m.is_some_and(|m| MONTHS.contains(&m.to_ascii_lowercase().as_str()))
                && d.is_some_and(|d| d.len() <= 2 && d.bytes().all(|b| b.is_ascii_digit()))
                && t.is_some_and(|t| t.contains(':') || t.len() == 4)
        })?;
        let name = &line[f.get(date + 3)?.0..];
        if kind == b'l' {
            name.split(" -> ").next().unwrap_or(name)
        } else {
            name
        }
    };
    safe_name(name).then_some(name)
}

/// A name the server gave that can be used as a local file name: not
/// empty, not `.` or `..`, no `/` (nothing that leaves the directory).
pub fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// The directory in a 257 reply: `"/a ""quoted"" dir" is current` (RFC 959
/// doubles a quote inside the name).
pub fn quoted_path(text: &str) -> Option<String> {
    let start = text.find('"')?;
    let mut out = String::new();
    let mut chars = text[start + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        if c == '"' {
            if chars.peek() == Some(&'"') {
                chars.next();
                out.push('"');
            } else {
                return Some(out);
            }
        } else {
            out.push(c);
        }
    }
    None
}

/// What goes into the history for a line: passwords are left out (`user
/// NAME PASSWORD` keeps the name, a URL loses its `:password`); blank lines
/// are not kept.
pub fn history_entry(line: &str) -> Option<String> {
    if line.trim().is_empty() {
        return None;
    }
    let Ok(words) = split(line) else {
        return Some(line.to_string());
    };
    let verb = words.first().map(|w| w.to_ascii_lowercase());
    match (verb.as_deref(), words.get(1)) {
        (Some("user"), Some(name)) if words.len() > 2 => {
            Some(format!("{} {}", words[0], quote(name)))
        }
        (Some("open"), Some(url)) => match strip_password(url) {
            Some(clean) => {
                let mut e = format!("{} {}", words[0], quote(&clean));
                for w in &words[2..] {
                    e.push(' ');
                    e.push_str(&quote(w));
                }
                Some(e)
            }
            None => Some(line.to_string()),
        },
        _ => Some(line.to_string()),
    }
}

/// `scheme://user:pw@host/...` without `:pw`; `None` when there is none.
fn strip_password(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let auth_end = rest.find('/').unwrap_or(rest.len());
    let at = rest[..auth_end].rfind('@')?;
    let colon = rest[..at].find(':')?;
    Some(format!("{scheme}://{}{}", &rest[..colon], &rest[at..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(line: &str) -> Vec<String> {
        split(line).unwrap()
    }

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(w("get  a.bin   b.bin "), ["get", "a.bin", "b.bin"]);
        assert_eq!(w("put \"my file\" 'x y'"), ["put", "my file", "x y"]);
        assert_eq!(w(r#"get "a \"q\" \\ b""#), ["get", r#"a "q" \ b"#]);
        assert_eq!(w(r"get a\ b"), ["get", "a b"]);
        assert_eq!(w("get ''"), ["get", ""]);
        assert_eq!(w("  # comment"), Vec::<String>::new());
        assert_eq!(w(""), Vec::<String>::new());
        assert!(split("get 'open").is_err());
        assert!(split("get x\\").is_err());
        for s in [
            "plain",
            "two words",
            "it's",
            "a\"b",
            "back\\slash",
            "#x",
            "",
        ] {
            assert_eq!(w(&format!("cmd {}", quote(s))), ["cmd", s], "{s:?}");
        }
    }

    #[test]
    fn names_from_list_lines() {
        let xftp = "-rw-r--r--   1 1000     1000             5 Jan  5 12:00 a b.txt";
        assert_eq!(list_file_name(xftp), Some("a b.txt"));
        let year = "-rw-r--r-- 1 ftp ftp 1048576 Dec 31  2023 old.bin\r";
        assert_eq!(list_file_name(year), Some("old.bin"));
        let nogroup = "-rw-r--r-- 1 owner 12 Mar 10 09:15 ng.dat";
        assert_eq!(list_file_name(nogroup), Some("ng.dat"));
        let link = "lrwxrwxrwx 1 0 0 7 Feb  1 10:00 latest -> v1.2.tar";
        assert_eq!(list_file_name(link), Some("latest"));
        let dir = "drwxr-xr-x   2 1000     1000          4096 Jan  5 12:00 sub";
        assert_eq!(list_file_name(dir), None);
        assert_eq!(list_file_name("total 12"), None);
        assert_eq!(list_file_name(""), None);
        assert_eq!(
            list_file_name("01-02-24  10:00AM       <DIR>          dosdir"),
            None
        );
        assert_eq!(
            list_file_name("01-02-24  10:00AM                 1234 dos file.txt"),
            Some("dos file.txt")
        );
        // A server cannot make mget write outside the local directory.
        let evil = "-rw-r--r-- 1 0 0 1 Jan  5 12:00 ../../etc/passwd";
        assert_eq!(list_file_name(evil), None);
        let dots = "-rw-r--r-- 1 0 0 1 Jan  5 12:00 ..";
        assert_eq!(list_file_name(dots), None);
    }

    #[test]
    fn pwd_replies() {
        assert_eq!(
            quoted_path("\"/home/a\" is the current directory.").as_deref(),
            Some("/home/a")
        );
        assert_eq!(
            quoted_path("\"/a \"\"q\"\" b\" is current").as_deref(),
            Some("/a \"q\" b")
        );
        assert_eq!(quoted_path("no quotes"), None);
        assert_eq!(quoted_path("\"unterminated"), None);
    }

    #[test]
    fn history_keeps_no_passwords() {
        assert_eq!(
            history_entry("user bob s3cret").as_deref(),
            Some("user bob")
        );
        assert_eq!(history_entry("user bob").as_deref(), Some("user bob"));
        assert_eq!(
            history_entry("open ftp://bob:pw@host:21/dir/").as_deref(),
            Some("open ftp://bob@host:21/dir/")
        );
        assert_eq!(
            history_entry("open ftp://host/a:b@c").as_deref(),
            Some("open ftp://host/a:b@c")
        );
        assert_eq!(history_entry("get x").as_deref(), Some("get x"));
        assert_eq!(history_entry("   "), None);
    }
}
