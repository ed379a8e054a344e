//! TYPE A line-ending conversion (RFC 959 3.1.1.1): the wire carries CRLF,
//! the local file system uses LF. Both converters keep state across buffer
//! boundaries, so a CR at the end of one read and LF at the start of the
//! next are handled.

/// Local → wire: every LF not already preceded by CR becomes CRLF.
#[derive(Debug, Default, Clone)]
pub struct ToWire {
    last_was_cr: bool,
}

impl ToWire {
    /// A fresh converter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Convert `input`, appending to `out`.
    pub fn convert(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len() + input.len() / 16);
        for &b in input {
            if b == b'\n' && !self.last_was_cr {
                out.push(b'\r');
            }
            out.push(b);
            self.last_was_cr = b == b'\r';
        }
    }

    /// How many bytes `input` becomes on the wire (for SIZE in TYPE A).
    pub fn wire_len(&mut self, input: &[u8]) -> u64 {
        let mut n = 0u64;
        for &b in input {
            if b == b'\n' && !self.last_was_cr {
                n += 1;
            }
            n += 1;
            self.last_was_cr = b == b'\r';
        }
        n
    }
}

/// Wire → local: CRLF becomes LF; a CR not followed by LF is kept.
#[derive(Debug, Default, Clone)]
pub struct FromWire {
    pending_cr: bool,
}

impl FromWire {
    /// A fresh converter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Convert `input`, appending to `out`.
    pub fn convert(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len());
        for &b in input {
            if self.pending_cr {
                self.pending_cr = false;
                if b != b'\n' {
                    out.push(b'\r');
                }
            }
            if b == b'\r' {
                self.pending_cr = true;
            } else {
                out.push(b);
            }
        }
    }

    /// Call at end of data: a trailing lone CR is data.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.pending_cr) {
            out.push(b'\r');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_wire_chunks(chunks: &[&[u8]]) -> Vec<u8> {
        let mut c = ToWire::new();
        let mut out = Vec::new();
        for ch in chunks {
            c.convert(ch, &mut out);
        }
        out
    }

    fn from_wire_chunks(chunks: &[&[u8]]) -> Vec<u8> {
        let mut c = FromWire::new();
        let mut out = Vec::new();
        for ch in chunks {
            c.convert(ch, &mut out);
        }
        c.finish(&mut out);
        out
    }

    #[test]
    fn lf_to_crlf() {
        assert_eq!(to_wire_chunks(&[b"a\nb\n"]), b"a\r\nb\r\n");
        assert_eq!(to_wire_chunks(&[b"a\r\nb"]), b"a\r\nb");
        assert_eq!(to_wire_chunks(&[b"a\r", b"\nb"]), b"a\r\nb");
        assert_eq!(ToWire::new().wire_len(b"a\nb\n"), 6);
    }

    #[test]
    fn crlf_to_lf_across_chunks() {
        assert_eq!(from_wire_chunks(&[b"a\r\nb\r\n"]), b"a\nb\n");
        assert_eq!(from_wire_chunks(&[b"a\r", b"\nb"]), b"a\nb");
        assert_eq!(from_wire_chunks(&[b"a\rb"]), b"a\rb");
        assert_eq!(from_wire_chunks(&[b"a\r"]), b"a\r");
    }

    proptest::proptest! {
        #[test]
        fn roundtrip_unix_text(text in "[a-z\n]{0,200}", split in 0usize..200) {
            let wire = to_wire_chunks(&[text.as_bytes()]);
            let s = split.min(wire.len());
            let back = from_wire_chunks(&[&wire[..s], &wire[s..]]);
            proptest::prop_assert_eq!(back, text.as_bytes().to_vec());
        }
    }
}
