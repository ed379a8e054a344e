//! FTP replies (RFC 959 section 4.2): formatting and incremental parsing.

use crate::error::ProtoError;

/// Longest reply line we accept from a server.
pub const MAX_REPLY_LINE: usize = 8192;
/// Most lines in one multi-line reply (a hostile server could send forever).
pub const MAX_REPLY_LINES: usize = 10_000;

/// One complete FTP reply: a three-digit code and one or more text lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The three-digit reply code (100..=599 for well-formed replies).
    pub code: u16,
    /// Text lines without the code prefix and without CRLF. Never empty.
    pub lines: Vec<String>,
}

impl Reply {
    /// A single-line reply. Newlines inside `text` start further lines.
    pub fn new(code: u16, text: impl Into<String>) -> Self {
        let text = text.into();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let lines = if lines.is_empty() {
            vec![String::new()]
        } else {
            lines
        };
        Reply { code, lines }
    }

    /// A multi-line reply from separate lines.
    pub fn multi(code: u16, lines: Vec<String>) -> Self {
        let lines = if lines.is_empty() {
            vec![String::new()]
        } else {
            lines
        };
        Reply { code, lines }
    }

    /// The first digit: 1 preliminary, 2 completion, 3 intermediate,
    /// 4 transient failure, 5 permanent failure.
    pub fn class(&self) -> u16 {
        self.code / 100
    }

    /// 1xx: more replies follow for this command.
    pub fn is_preliminary(&self) -> bool {
        self.class() == 1
    }

    /// 2xx.
    pub fn is_success(&self) -> bool {
        self.class() == 2
    }

    /// 3xx: the server waits for a further command (PASS, RNTO, ...).
    pub fn is_intermediate(&self) -> bool {
        self.class() == 3
    }

    /// 4xx or 5xx.
    pub fn is_failure(&self) -> bool {
        self.class() >= 4
    }

    /// All text lines joined with `\n`.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }

    /// Wire form. Multi-line replies use `ddd-` on the first line, a leading
    /// space on inner lines (so an inner line can never look like the end
    /// line), and `ddd ` on the last. CR and LF inside text are removed so a
    /// file name can never inject a reply line. A name's bytes that are not
    /// UTF-8, carried as escapes ([`crate::name`]), go out as the bytes
    /// they were, and a 0xFF is doubled (Telnet's IAC, RFC 2640 section
    /// 3.1), as [`ReplyParser`] reads it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let n = self.lines.len();
        for (i, line) in self.lines.iter().enumerate() {
            let clean: String = line.chars().filter(|c| *c != '\r' && *c != '\n').collect();
            let head = if n == 1 || i + 1 == n {
                format!("{:03} ", self.code)
            } else if i == 0 {
                format!("{:03}-", self.code)
            } else {
                " ".to_owned()
            };
            out.extend_from_slice(head.as_bytes());
            for b in crate::name::encode(&clean) {
                out.push(b);
                if b == 0xff {
                    out.push(0xff);
                }
            }
            out.extend_from_slice(b"\r\n");
        }
        out
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code, self.text())
    }
}

/// Incremental reply parser: feed bytes as they arrive, take replies out.
///
/// ```
/// use xftp_proto::ReplyParser;
/// let mut p = ReplyParser::new();
/// p.feed(b"220-Welcome\r\n to xftp\r\n220 ready\r\n");
/// let r = p.next_reply().unwrap().unwrap();
/// assert_eq!(r.code, 220);
/// assert_eq!(r.lines.len(), 3);
/// ```
#[derive(Debug, Default)]
pub struct ReplyParser {
    buf: Vec<u8>,
    pending: Option<Reply>,
}

impl ReplyParser {
    /// An empty parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add bytes read from the control connection.
    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes fed but not yet consumed as part of a reply.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete reply, `Ok(None)` if more bytes are needed.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, ProtoError> {
        loop {
            let Some(pos) = self.buf.iter().position(|&b| b == b'\n') else {
                if self.buf.len() > MAX_REPLY_LINE {
                    return Err(ProtoError::LineTooLong {
                        limit: MAX_REPLY_LINE,
                    });
                }
                return Ok(None);
            };
            if pos > MAX_REPLY_LINE {
                return Err(ProtoError::LineTooLong {
                    limit: MAX_REPLY_LINE,
                });
            }
            let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            // Telnet's doubled IAC is one 0xFF byte (RFC 854); a byte that
            // is not UTF-8 is kept as its escape (crate::name), so that a
            // path in a reply (PWD's 257) goes back as the same bytes.
            let mut unescaped = Vec::with_capacity(line.len());
            let mut i = 0;
            while i < line.len() {
                unescaped.push(line[i]);
                i += if line[i] == 0xFF && line.get(i + 1) == Some(&0xFF) {
                    2
                } else {
                    1
                };
            }
            let line = crate::name::decode(&unescaped);
            // Each invalid byte becomes a private-use character, three
            // bytes: the limit holds for the text as kept, so that it
            // encodes within it.
            if line.len() > MAX_REPLY_LINE {
                return Err(ProtoError::LineTooLong {
                    limit: MAX_REPLY_LINE,
                });
            }
            if let Some(reply) = self.take_line(line)? {
                return Ok(Some(reply));
            }
        }
    }

    fn take_line(&mut self, line: String) -> Result<Option<Reply>, ProtoError> {
        let code = leading_code(&line);
        match self.pending.as_mut() {
            None => {
                let code = code.ok_or_else(|| ProtoError::BadReply(line.clone()))?;
                let sep = line.as_bytes().get(3).copied();
                let text = line.get(4..).unwrap_or("").to_owned();
                if sep == Some(b'-') {
                    self.pending = Some(Reply {
                        code,
                        lines: vec![text],
                    });
                    Ok(None)
                } else {
                    Ok(Some(Reply {
                        code,
                        lines: vec![text],
                    }))
                }
            }
            Some(pending) => {
                // The end line is the same code followed by a space (or
                // nothing); anything else is an inner line (RFC 959 4.2).
                let is_end = code == Some(pending.code)
                    && matches!(line.as_bytes().get(3), None | Some(b' '));
                if is_end {
                    pending.lines.push(line.get(4..).unwrap_or("").to_owned());
                    Ok(self.pending.take())
                } else {
                    if pending.lines.len() >= MAX_REPLY_LINES {
                        return Err(ProtoError::BadReply("too many lines in one reply".into()));
                    }
                    pending.lines.push(line);
                    Ok(None)
                }
            }
        }
    }
}

/// Fuzz entry: parse arbitrary bytes as replies, fed in two pieces (split
/// at the first byte's value) to exercise the incremental path. Must never
/// panic; a reply parsed and encoded again must parse back to the same
/// code and number of lines.
#[doc(hidden)]
pub fn fuzz_replies(data: &[u8]) {
    let cut = data.first().map_or(0, |&b| usize::from(b).min(data.len()));
    let mut p = ReplyParser::new();
    p.feed(&data[..cut]);
    let mut replies = Vec::new();
    while let Ok(Some(r)) = p.next_reply() {
        replies.push(r);
    }
    p.feed(&data[cut..]);
    while let Ok(Some(r)) = p.next_reply() {
        replies.push(r);
    }
    for r in replies {
        let mut again = ReplyParser::new();
        again.feed(&r.encode());
        match again.next_reply() {
            Ok(Some(back)) => {
                assert_eq!(
                    (back.code, back.lines.len()),
                    (r.code, r.lines.len()),
                    "{r:?}"
                );
            }
            other => panic!("{r:?} encoded does not parse back: {other:?}"),
        }
    }
}

fn leading_code(line: &str) -> Option<u16> {
    let b = line.as_bytes();
    if b.len() < 3 || !b[..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    if b.len() > 3 && b[3] != b' ' && b[3] != b'-' {
        return None;
    }
    line[..3].parse().ok()
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

#[cfg(test)]
mod tests {
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
    use super::*;

    fn parse_all(data: &[u8]) -> Vec<Reply> {
        let mut p = ReplyParser::new();
        p.feed(data);
        let mut out = Vec::new();
        while let Some(r) = p.next_reply().unwrap() {
            out.push(r);
        }
        out
    }

    #[test]
    fn single_line() {
        let r = parse_all(b"200 Command okay.\r\n");
        assert_eq!(r, vec![Reply::new(200, "Command okay.")]);
    }

    #[test]
    fn bare_lf_accepted() {
        let r = parse_all(b"230 ok\n");
        assert_eq!(r[0].code, 230);
    }

    #[test]
    fn multi_line_with_inner_code_lines() {
        // RFC 959: inner lines may start with digits; only "ddd " ends.
        let r = parse_all(b"211-Features:\r\n MDTM\r\n211-not the end\r\n123 other\r\n211 End\r\n");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].lines.len(), 5);
        assert_eq!(r[0].lines[4], "End");
    }

    #[test]
    fn partial_input_needs_more() {
        let mut p = ReplyParser::new();
        p.feed(b"220 hel");
        assert_eq!(p.next_reply().unwrap(), None);
        p.feed(b"lo\r\n");
        assert_eq!(p.next_reply().unwrap().unwrap().text(), "hello");
    }

    #[test]
    fn garbage_is_an_error() {
        let mut p = ReplyParser::new();
        p.feed(b"hello\r\n");
        assert!(matches!(p.next_reply(), Err(ProtoError::BadReply(_))));
    }

    #[test]
    fn over_long_line_is_an_error() {
        let mut p = ReplyParser::new();
        p.feed(&vec![b'2'; MAX_REPLY_LINE + 10]);
        assert!(matches!(
            p.next_reply(),
            Err(ProtoError::LineTooLong { .. })
        ));
    }

    #[test]
    fn a_doubled_iac_is_one_byte_and_other_bytes_are_kept() {
        let back = parse_all(b"257 \"/x\xff\xffy/caf\xe9\" is the current directory\r\n");
        let text = &back[0].lines[0];
        assert_eq!(
            crate::name::encode(text),
            b"\"/x\xffy/caf\xe9\" is the current directory"
        );
    }

    /// A path that is not UTF-8 leaves the server as its bytes (0xFF
    /// doubled) and comes back to the same text.
    #[test]
    fn a_name_that_is_not_utf8_goes_out_as_its_bytes() {
        let text = format!(
            "\"{}\" is the current directory",
            crate::name::decode(b"/l\xe9d/\xff")
        );
        let wire = Reply::new(257, text.clone()).encode();
        assert_eq!(
            wire,
            b"257 \"/l\xe9d/\xff\xff\" is the current directory\r\n"
        );
        assert_eq!(parse_all(&wire)[0].lines[0], text);
    }

    #[test]
    fn invalid_utf8_cannot_stretch_a_line_past_the_limit() {
        // 3000 invalid bytes: 3004 on the wire, 9004 once each byte is
        // a three-byte character (found by cargo-fuzz: such a reply did
        // not encode back). Not 0xFF: doubled, that is Telnet's IAC.
        let mut line = b"100 ".to_vec();
        line.extend(std::iter::repeat(0xfeu8).take(3000));
        line.extend_from_slice(b"\r\n");
        let mut p = ReplyParser::new();
        p.feed(&line);
        assert!(matches!(
            p.next_reply(),
            Err(ProtoError::LineTooLong { .. })
        ));
        // Within the limit once decoded: kept, and it encodes back.
        let mut ok = b"100 ".to_vec();
        ok.extend(std::iter::repeat(0xfeu8).take(2000));
        ok.extend_from_slice(b"\r\n");
        let back = parse_all(&ok);
        let again = parse_all(&back[0].encode());
        assert_eq!(again[0].lines, back[0].lines);
    }

    #[test]
    fn encode_roundtrip_multi() {
        let r = Reply::multi(211, vec!["Features:".into(), "MULT".into(), "End".into()]);
        let wire = r.encode();
        assert_eq!(wire, b"211-Features:\r\n MULT\r\n211 End\r\n");
        let back = parse_all(&wire);
        assert_eq!(back[0].code, 211);
        assert_eq!(back[0].lines[1], " MULT");
    }

    #[test]
    fn encode_strips_newlines() {
        let r = Reply {
            code: 550,
            lines: vec!["bad\r\n200 injected".into()],
        };
        assert_eq!(r.encode(), b"550 bad200 injected\r\n");
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let mut p = ReplyParser::new();
            p.feed(&data);
            while let Ok(Some(_)) = p.next_reply() {}
        }

        /// The fuzz entry on reply-shaped text (codes, `-` continuations,
        /// inner lines), where random bytes would rarely parse at all.
        #[test]
        fn fuzz_entry_roundtrips(cut in 0u8..255, lines in proptest::collection::vec("([1-5][0-9][0-9][ -]?)?[ -~\r]{0,12}", 0..12)) {
            let mut data = vec![cut];
            for l in lines {
                data.extend_from_slice(l.as_bytes());
                data.extend_from_slice(b"\r\n");
            }
            fuzz_replies(&data);
        }

        #[test]
        fn single_line_roundtrip(code in 100u16..600, text in "[ -~]{0,80}") {
            let r = Reply::new(code, text.clone());
            let back = parse_all(&r.encode());
            proptest::prop_assert_eq!(back.len(), 1);
            proptest::prop_assert_eq!(back[0].code, code);
            proptest::prop_assert_eq!(back[0].text(), text.trim_end_matches(['\r','\n']).to_owned());
        }
    }
}
