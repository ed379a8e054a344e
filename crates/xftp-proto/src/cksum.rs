//! File checksums: the algorithms of GridFTP's `CKSM` and of `HASH`
//! (draft-bryan-ftpext-hash), their names on the wire, and one digest
//! type over all of them.
//!
//! `CKSM` names are GridFTP's (`MD5`, `ADLER32`, `SHA256`, ...; case
//! ignored); `HASH` names are the draft's IANA-style ones (`SHA-256`,
//! `MD5`, ...). Values are lower-case hex, as globus-gridftp-server
//! prints them (Adler-32 and the CRCs as 8 hex digits, big-endian).

use std::fmt;
use std::io::{self, Read};

use crate::error::ProtoError;

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// MD5 (RFC 1321): what most GridFTP sites record.
    Md5,
    /// Adler-32 (RFC 1950): what WLCG storage records.
    Adler32,
    /// CRC-32 (IEEE 802.3, as zlib and `cksum -a crc32b`).
    Crc32,
    /// CRC-32C (Castagnoli, RFC 3720), with hardware support on x86 and ARM.
    Crc32c,
    /// SHA-1.
    Sha1,
    /// SHA-256: the default of `--verify`.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl Algorithm {
    /// Every algorithm, strongest first (the order `--verify` prefers).
    pub const ALL: [Algorithm; 7] = [
        Algorithm::Sha256,
        Algorithm::Sha512,
        Algorithm::Sha1,
        Algorithm::Md5,
        Algorithm::Crc32c,
        Algorithm::Adler32,
        Algorithm::Crc32,
    ];

    /// The `CKSM` name (GridFTP).
    pub fn cksm_name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "MD5",
            Algorithm::Adler32 => "ADLER32",
            Algorithm::Crc32 => "CRC32",
            Algorithm::Crc32c => "CRC32C",
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
            Algorithm::Sha512 => "SHA512",
        }
    }

    /// The `HASH` name (draft-bryan-ftpext-hash), `None` where the draft
    /// names none.
    pub fn hash_name(self) -> Option<&'static str> {
        match self {
            Algorithm::Md5 => Some("MD5"),
            Algorithm::Crc32 => Some("CRC32"),
            Algorithm::Sha1 => Some("SHA-1"),
            Algorithm::Sha256 => Some("SHA-256"),
            Algorithm::Sha512 => Some("SHA-512"),
            Algorithm::Adler32 | Algorithm::Crc32c => None,
        }
    }

    /// Parse a name in either spelling (`SHA256`, `sha-256`, `Adler32`).
    pub fn parse(name: &str) -> Result<Algorithm, ProtoError> {
        let squashed: String = name
            .trim()
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_uppercase();
        Algorithm::ALL
            .into_iter()
            .find(|a| a.cksm_name() == squashed)
            .ok_or_else(|| ProtoError::BadArgument {
                verb: "CKSM",
                reason: format!(
                    "unknown checksum algorithm {:?} (known: {})",
                    name.trim(),
                    Algorithm::ALL.map(Algorithm::cksm_name).join(", ")
                ),
            })
    }

    /// Hex digits of a value.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Md5 => 32,
            Algorithm::Adler32 | Algorithm::Crc32 | Algorithm::Crc32c => 8,
            Algorithm::Sha1 => 40,
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cksm_name())
    }
}

/// A running checksum.
#[derive(Clone)]
pub struct Digest(State);

#[derive(Clone)]
enum State {
    Md5(md5::Md5),
    Adler32(adler2::Adler32),
    Crc32(crc32fast::Hasher),
    Crc32c(u32),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Digest").field(&self.algorithm()).finish()
    }
}

impl Digest {
    /// An empty digest.
    pub fn new(alg: Algorithm) -> Digest {
        use sha2::Digest as _;
        Digest(match alg {
            Algorithm::Md5 => State::Md5(md5::Md5::new()),
            Algorithm::Adler32 => State::Adler32(adler2::Adler32::new()),
            Algorithm::Crc32 => State::Crc32(crc32fast::Hasher::new()),
            Algorithm::Crc32c => State::Crc32c(0),
            Algorithm::Sha1 => State::Sha1(sha1::Sha1::new()),
            Algorithm::Sha256 => State::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => State::Sha512(sha2::Sha512::new()),
        })
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self.0 {
            State::Md5(_) => Algorithm::Md5,
            State::Adler32(_) => Algorithm::Adler32,
            State::Crc32(_) => Algorithm::Crc32,
            State::Crc32c(_) => Algorithm::Crc32c,
            State::Sha1(_) => Algorithm::Sha1,
            State::Sha256(_) => Algorithm::Sha256,
            State::Sha512(_) => Algorithm::Sha512,
        }
    }

    /// Feed bytes.
    pub fn update(&mut self, data: &[u8]) {
        use sha2::Digest as _;
        match &mut self.0 {
            State::Md5(h) => h.update(data),
            State::Adler32(h) => h.write_slice(data),
            State::Crc32(h) => h.update(data),
            State::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            State::Sha1(h) => h.update(data),
            State::Sha256(h) => h.update(data),
            State::Sha512(h) => h.update(data),
        }
    }

    /// The value, lower-case hex.
    pub fn finish_hex(self) -> String {
        use sha2::Digest as _;
        fn hex(b: &[u8]) -> String {
            b.iter().map(|x| format!("{x:02x}")).collect()
        }
        match self.0 {
            State::Md5(h) => hex(&h.finalize()),
            State::Adler32(h) => format!("{:08x}", h.checksum()),
            State::Crc32(h) => format!("{:08x}", h.finalize()),
            State::Crc32c(c) => format!("{c:08x}"),
            State::Sha1(h) => hex(&h.finalize()),
            State::Sha256(h) => hex(&h.finalize()),
            State::Sha512(h) => hex(&h.finalize()),
        }
    }
}

/// Buffer of [`digest_reader`]: large reads keep the hash, not the
/// system calls, the cost.
const READ_BUF: usize = 1 << 20;

/// The checksum of everything `r` yields, and the byte count.
pub fn digest_reader<R: Read>(alg: Algorithm, mut r: R) -> io::Result<(String, u64)> {
    let mut d = Digest::new(alg);
    let mut buf = vec![0u8; READ_BUF];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                d.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((d.finish_hex(), n))
}

/// The checksum of `len` bytes (`None`: to the end) of a file from
/// `offset`. An offset past the end is an error (`InvalidInput`); a
/// length past the end stops at the end, as GridFTP does.
pub fn digest_file(
    alg: Algorithm,
    file: &std::fs::File,
    offset: u64,
    len: Option<u64>,
) -> io::Result<(String, u64)> {
    use std::io::{Seek, SeekFrom};
    let size = file.metadata()?.len();
    if offset > size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset {offset} is past the end of the file ({size} bytes)"),
        ));
    }
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    let take = len.unwrap_or(u64::MAX).min(size - offset);
    digest_reader(alg, f.take(take))
}

/// Arguments of `CKSM algorithm offset length path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CksmArgs {
    /// The algorithm as named (checked by the server, which answers 504
    /// for one it does not know).
    pub algorithm: String,
    /// First byte.
    pub offset: u64,
    /// Bytes to cover; `None` (`-1` on the wire): to the end.
    pub length: Option<u64>,
    /// The file.
    pub path: Vec<u8>,
}

/// Parse the argument of `CKSM` (`MD5 0 -1 /path with spaces`).
pub fn parse_cksm_arg(arg: &[u8]) -> Result<CksmArgs, ProtoError> {
    let bad = |reason: String| ProtoError::BadArgument {
        verb: "CKSM",
        reason,
    };
    let mut parts = arg.splitn(4, |b| *b == b' ');
    let mut word = |what: &str| {
        parts
            .next()
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .ok_or_else(|| {
                bad(format!(
                    "missing {what} (CKSM algorithm offset length path)"
                ))
            })
    };
    let algorithm = word("algorithm")?;
    let off = word("offset")?;
    let len = word("length")?;
    let offset = off
        .parse()
        .map_err(|_| bad(format!("{off:?} is not a byte offset")))?;
    let length = match len.as_str() {
        "-1" => None,
        t => Some(
            t.parse()
                .map_err(|_| bad(format!("{t:?} is not a length (or -1 for the rest)")))?,
        ),
    };
    let path = parts
        .next()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| bad("missing path (CKSM algorithm offset length path)".into()))?;
    if path.contains(&0) {
        return Err(ProtoError::BadPath("NUL byte in path"));
    }
    Ok(CksmArgs {
        algorithm,
        offset,
        length,
        path: path.to_vec(),
    })
}

/// The algorithms of a FEAT `CKSM` line (` CKSM MD5:10;ADLER32:10;...`,
/// globus-gridftp-server's form, or a plain list `MD5,SHA256`); names we
/// do not know are skipped.
pub fn parse_cksm_feat(rest: &str) -> Vec<Algorithm> {
    rest.split([';', ',', ' '])
        .filter_map(|w| {
            let name = w.split(':').next().unwrap_or("");
            Algorithm::parse(name).ok()
        })
        .collect()
}

/// The algorithms of a FEAT `HASH` line (` HASH SHA-1;SHA-256*;MD5`).
pub fn parse_hash_feat(rest: &str) -> Vec<Algorithm> {
    rest.split(';')
        .filter_map(|w| Algorithm::parse(w.trim().trim_end_matches('*')).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(alg: Algorithm, data: &[u8]) -> String {
        let mut d = Digest::new(alg);
        d.update(data);
        d.finish_hex()
    }

    #[test]
    fn known_values() {
        // Test vectors: RFC 1321, FIPS 180, zlib's adler32/crc32, RFC 3720 B.4.
        let abc = b"abc";
        assert_eq!(of(Algorithm::Md5, abc), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            of(Algorithm::Sha1, abc),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            of(Algorithm::Sha256, abc),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(of(Algorithm::Sha512, abc).starts_with("ddaf35a193617aba"));
        assert_eq!(of(Algorithm::Adler32, b"Wikipedia"), "11e60398");
        assert_eq!(of(Algorithm::Crc32, b"123456789"), "cbf43926");
        assert_eq!(of(Algorithm::Crc32c, b"123456789"), "e3069283");
        assert_eq!(of(Algorithm::Crc32c, &[0u8; 32]), "8a9136aa");
        assert_eq!(of(Algorithm::Adler32, b""), "00000001");
        for a in Algorithm::ALL {
            assert_eq!(of(a, b"").len(), a.hex_len(), "{a}");
        }
    }

    #[test]
    fn pieces_give_the_same_value_as_the_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for a in Algorithm::ALL {
            let mut d = Digest::new(a);
            for c in data.chunks(977) {
                d.update(c);
            }
            assert_eq!(d.finish_hex(), of(a, &data), "{a}");
        }
    }

    #[test]
    fn names_in_both_spellings() {
        assert_eq!(Algorithm::parse("sha-256").unwrap(), Algorithm::Sha256);
        assert_eq!(Algorithm::parse("SHA256").unwrap(), Algorithm::Sha256);
        assert_eq!(Algorithm::parse("adler32").unwrap(), Algorithm::Adler32);
        assert_eq!(Algorithm::parse("CRC32C").unwrap(), Algorithm::Crc32c);
        let e = Algorithm::parse("whirlpool").unwrap_err().to_string();
        assert!(e.contains("whirlpool") && e.contains("SHA256"), "{e}");
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.cksm_name()).unwrap(), a);
            if let Some(h) = a.hash_name() {
                assert_eq!(Algorithm::parse(h).unwrap(), a);
            }
        }
    }

    #[test]
    fn cksm_arguments() {
        let a = parse_cksm_arg(b"MD5 0 -1 /dir/a file").unwrap();
        assert_eq!(a.algorithm, "MD5");
        assert_eq!((a.offset, a.length), (0, None));
        assert_eq!(a.path, b"/dir/a file");
        let a = parse_cksm_arg(b"sha256 100 4096 f").unwrap();
        assert_eq!((a.offset, a.length), (100, Some(4096)));
        for bad in [
            &b"MD5"[..],
            b"MD5 0",
            b"MD5 0 -1",
            b"MD5 x -1 f",
            b"MD5 0 -2 f",
            b"MD5 0 -1 a\0b",
        ] {
            assert!(
                parse_cksm_arg(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn feat_lines() {
        assert_eq!(
            parse_cksm_feat("MD5:10;ADLER32:10;SHA1:10;SHA256:11;SHA512:12;"),
            vec![
                Algorithm::Md5,
                Algorithm::Adler32,
                Algorithm::Sha1,
                Algorithm::Sha256,
                Algorithm::Sha512
            ]
        );
        assert_eq!(
            parse_hash_feat("SHA-1;SHA-256*;MD5;TIGER"),
            vec![Algorithm::Sha1, Algorithm::Sha256, Algorithm::Md5]
        );
    }

    #[test]
    fn file_ranges() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        f.write_all(&data).unwrap();
        let (h, n) = digest_file(Algorithm::Md5, &f, 100, Some(1000)).unwrap();
        assert_eq!((h, n), (of(Algorithm::Md5, &data[100..1100]), 1000));
        let (h, n) = digest_file(Algorithm::Md5, &f, 4000, None).unwrap();
        assert_eq!((h, n), (of(Algorithm::Md5, &data[4000..]), 1000));
        let (_, n) = digest_file(Algorithm::Md5, &f, 0, Some(1 << 40)).unwrap();
        assert_eq!(n, 5000);
        let (h, n) = digest_file(Algorithm::Md5, &f, 5000, None).unwrap();
        assert_eq!((h, n), (of(Algorithm::Md5, b""), 0));
        let e = digest_file(Algorithm::Md5, &f, 5001, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
