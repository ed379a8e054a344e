//! The shell's text handling: command lines into words, passwords out
//! of the history.

/// Split a command line into words. Blanks separate words; '...' quotes
/// literally; "..." quotes with `\"` and `\\` escaped; outside quotes a
/// backslash takes the next character as it is. A line whose first
/// non-blank character is `#` is a comment: no words.
pub fn split(line: &str) -> Result<Vec<String>, String> {
    split_with(line, false)
}

/// [`split`], each word as a glob pattern: a `*`, `?` or `[` that was
/// quoted or escaped matches itself (`[*]`, `[?]`, `[[]`), as in a shell
/// (`mget 's*.txt'` is the one file of that name, not every `s...txt`).
pub fn split_patterns(line: &str) -> Result<Vec<String>, String> {
    split_with(line, true)
}

fn split_with(line: &str, glob: bool) -> Result<Vec<String>, String> {
    // A character taken literally (quoted or escaped).
    let literal = |cur: &mut String, c: char| match c {
        '*' | '?' | '[' if glob => {
            cur.push('[');
            cur.push(c);
            cur.push(']');
        }
        c => cur.push(c),
    };
    if line.trim_start().starts_with('#') {
        return Ok(Vec::new());
    }
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    // An unquoted `[` just opened a bracket: a `^` next negates it, as in
    // bash (the glob crate's `!`).
    let mut opened = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some('"') if c == '\\' => match chars.next() {
                Some(n @ ('"' | '\\')) => cur.push(n),
                Some(n) => {
                    cur.push('\\');
                    literal(&mut cur, n);
                }
                None => break,
            },
            Some(_) => literal(&mut cur, c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    in_word = true;
                }
                '\\' => match chars.next() {
                    Some(n) => {
                        literal(&mut cur, n);
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
                '^' if glob && opened => {
                    cur.push('!');
                    in_word = true;
                }
                c => {
                    cur.push(c);
                    in_word = true;
                }
            },
        }
        opened = glob && quote.is_none() && c == '[' && !opened && !cur.ends_with("[[]");
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
    fn quoted_or_escaped_wildcards_match_themselves() {
        let p = |line: &str| split_patterns(line).unwrap();
        assert_eq!(p("mget s*.txt"), ["mget", "s*.txt"]);
        assert_eq!(
            p(r"mget s\*.txt 'q?' \[b].txt"),
            ["mget", "s[*].txt", "q[?]", "[[]b].txt"]
        );
        assert_eq!(p(r#"mget "a*" a*"#), ["mget", "a[*]", "a*"]);
        for (pat, name) in [
            ("s[*].txt", "s*.txt"),
            ("q[?]", "q?"),
            ("[[]b].txt", "[b].txt"),
        ] {
            let g = glob::Pattern::new(pat).unwrap();
            assert!(g.matches(name), "{pat} {name}");
        }
        assert!(!glob::Pattern::new("s[*].txt").unwrap().matches("sxyz.txt"));
        assert!(!glob::Pattern::new("[[]b].txt").unwrap().matches("b.txt"));
    }

    #[test]
    fn a_caret_negates_a_bracket_as_in_bash() {
        let p = |line: &str| split_patterns(line).unwrap();
        assert_eq!(p("mget a[^1].log"), ["mget", "a[!1].log"]);
        assert_eq!(p("mget a[!1].log"), ["mget", "a[!1].log"]);
        // Not where `^` is a member, quoted, or outside a bracket.
        assert_eq!(p("mget a[1^].log ^x"), ["mget", "a[1^].log", "^x"]);
        assert_eq!(p(r"mget a[\^1]"), ["mget", "a[^1]"]);
        assert_eq!(p("get a[^1]"), ["get", "a[!1]"]);
        assert_eq!(split("get a[^1]").unwrap(), ["get", "a[^1]"]);
        let g = glob::Pattern::new("a[!1].log").unwrap();
        assert!(g.matches("a2.log") && !g.matches("a1.log"));
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
