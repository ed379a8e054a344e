//! Per-connection handshake, sans-IO.
//!
//! The connecting side sends a 32-byte hello on every TCP connection of a
//! group; the listening side answers each with a 12-byte reply. All
//! integers are big-endian.
//!
//! ```text
//! hello:  "XPSK" | min_ver u8 | max_ver u8 | session id [16] | index u16 | count u16 | record_size u32 | reserved u16 (0)
//! reply:  "XPSK" | status u8  | version u8 | reserved u16 (0) | record_size u32
//! ```
//!
//! Version negotiation: the listener picks the highest version both sides
//! support; if there is none it answers [`Status::Version`] with its own
//! highest version in the version field.

/// Protocol magic, first on every connection in both directions.
pub const MAGIC: [u8; 4] = *b"XPSK";
/// Length of a hello.
pub const HELLO_LEN: usize = 32;
/// Length of a reply.
pub const REPLY_LEN: usize = 12;
/// Oldest protocol version this implementation speaks.
pub const MIN_VERSION: u8 = 1;
/// Newest protocol version this implementation speaks. Version 2 frames
/// the data as version 1 does; a group of version 2 tells the
/// application that both ends know version 2's conventions (the pipe's
/// role exchange and receipt, docs/psock.md).
pub const MAX_VERSION: u8 = 2;
/// Most connections in one group.
pub const MAX_STREAMS: u16 = 1024;

/// A random 128-bit group identifier chosen by the connecting side.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// A fresh random id from the operating system.
    pub fn random() -> std::io::Result<Self> {
        use std::io::Read;
        let mut b = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        Ok(Self(b))
    }
}

/// The first message on each connection of a group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Hello {
    /// Oldest version the sender speaks.
    pub min_version: u8,
    /// Newest version the sender speaks.
    pub max_version: u8,
    /// Group identifier.
    pub session: SessionId,
    /// Index of this connection in the group, `< count`.
    pub index: u16,
    /// Number of connections in the group.
    pub count: u16,
    /// Size of the records the connecting side will send.
    pub record_size: u32,
}

/// Why a hello is malformed. The peer is at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// Not our protocol.
    #[error("bad magic")]
    Magic,
    /// Count is 0 or above [`MAX_STREAMS`], or index ≥ count.
    #[error("bad stream index {index} of {count}")]
    Index {
        /// Index sent.
        index: u16,
        /// Count sent.
        count: u16,
    },
    /// min_version > max_version, or a zero record size.
    #[error("inconsistent version range or record size")]
    Fields,
    /// Reserved bits set.
    #[error("reserved field not zero")]
    Reserved,
}

impl Hello {
    /// Encode.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.min_version;
        b[5] = self.max_version;
        b[6..22].copy_from_slice(&self.session.0);
        b[22..24].copy_from_slice(&self.index.to_be_bytes());
        b[24..26].copy_from_slice(&self.count.to_be_bytes());
        b[26..30].copy_from_slice(&self.record_size.to_be_bytes());
        b
    }

    /// Decode; `Ok(None)` if fewer than [`HELLO_LEN`] bytes are given.
    pub fn decode(b: &[u8]) -> Result<Option<Self>, HelloError> {
        let Some(b) = b.get(..HELLO_LEN) else {
            return Ok(None);
        };
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        let mut session = [0u8; 16];
        session.copy_from_slice(&b[6..22]);
        let h = Self {
            min_version: b[4],
            max_version: b[5],
            session: SessionId(session),
            index: u16::from_be_bytes([b[22], b[23]]),
            count: u16::from_be_bytes([b[24], b[25]]),
            record_size: u32::from_be_bytes([b[26], b[27], b[28], b[29]]),
        };
        if b[30..32] != [0, 0] {
            return Err(HelloError::Reserved);
        }
        if h.count == 0 || h.count > MAX_STREAMS || h.index >= h.count {
            return Err(HelloError::Index {
                index: h.index,
                count: h.count,
            });
        }
        if h.min_version > h.max_version || h.record_size == 0 {
            return Err(HelloError::Fields);
        }
        Ok(Some(h))
    }

    /// The version to speak with this peer, if any.
    pub fn negotiate(&self) -> Option<u8> {
        let v = self.max_version.min(MAX_VERSION);
        (v >= self.min_version.max(MIN_VERSION)).then_some(v)
    }
}

/// The listener's verdict on one connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Status {
    /// Accepted into its group.
    Ok,
    /// No common protocol version.
    Version,
    /// The hello was malformed.
    Malformed,
    /// This index of this group is already connected.
    Duplicate,
    /// Count, record size or peer address differ from the group's.
    Mismatch,
    /// Too many incomplete groups.
    Busy,
    /// The group is already complete or has expired.
    Late,
    /// The record size exceeds what this listener buffers.
    TooLarge,
    /// A status code this implementation does not know.
    Unknown(u8),
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ok => f.write_str("accepted"),
            // Also what a peer that only echoes the hello back says.
            Self::Version => f.write_str(
                "no common protocol version (is the peer `xftp recv` or another parallel-sockets listener?)",
            ),
            Self::Malformed => f.write_str("our hello was malformed"),
            Self::Duplicate => f.write_str("this connection of the group is already connected"),
            Self::Mismatch => f.write_str("count, record size or address differ from the group's"),
            Self::Busy => f.write_str("too many groups being set up at the listener"),
            Self::Late => f.write_str("the group is already complete or expired"),
            Self::TooLarge => f.write_str("the record size exceeds what the listener buffers"),
            Self::Unknown(c) => write!(f, "unknown status {c}"),
        }
    }
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Version => 1,
            Self::Malformed => 2,
            Self::Duplicate => 3,
            Self::Mismatch => 4,
            Self::Busy => 5,
            Self::Late => 6,
            Self::TooLarge => 7,
            Self::Unknown(c) => c,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            0 => Self::Ok,
            1 => Self::Version,
            2 => Self::Malformed,
            3 => Self::Duplicate,
            4 => Self::Mismatch,
            5 => Self::Busy,
            6 => Self::Late,
            7 => Self::TooLarge,
            c => Self::Unknown(c),
        }
    }
}

/// The listener's answer to a hello.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reply {
    /// Verdict.
    pub status: Status,
    /// Chosen version (on `Version`: the listener's newest).
    pub version: u8,
    /// Size of the records the listening side will send.
    pub record_size: u32,
}

impl Reply {
    /// Encode.
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.status.code();
        b[5] = self.version;
        b[8..12].copy_from_slice(&self.record_size.to_be_bytes());
        b
    }

    /// Decode; `Ok(None)` if fewer than [`REPLY_LEN`] bytes are given.
    pub fn decode(b: &[u8]) -> Result<Option<Self>, HelloError> {
        let Some(b) = b.get(..REPLY_LEN) else {
            return Ok(None);
        };
        if b[0..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        Ok(Some(Self {
            status: Status::from_code(b[4]),
            version: b[5],
            record_size: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        }))
    }
}

/// Fuzz entry: neither decoder panics on any bytes; a hello that decodes
/// encodes back to the same 32 bytes (decoding checked every field), and
/// a reply that decodes survives encode and decode unchanged.
#[doc(hidden)]
pub fn fuzz_handshake(data: &[u8]) {
    if let Ok(Some(h)) = Hello::decode(data) {
        assert_eq!(&h.encode()[..], &data[..HELLO_LEN], "hello round trip");
        let _ = h.negotiate();
    }
    if let Ok(Some(r)) = Reply::decode(data) {
        let again = Reply::decode(&r.encode());
        assert!(
            matches!(again, Ok(Some(x)) if x == r),
            "reply round trip: {r:?} -> {again:?}"
        );
        let _ = r.status.to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_entry_runs() {
        let h = Hello {
            min_version: 1,
            max_version: 1,
            session: SessionId([7; 16]),
            index: 1,
            count: 4,
            record_size: 1 << 17,
        };
        fuzz_handshake(&h.encode());
        fuzz_handshake(b"XPSK\x00\x01\x00\x00\x00\x02\x00\x00");
        fuzz_handshake(b"XPS");
        fuzz_handshake(&[0xff; 40]);
    }

    #[test]
    fn statuses_read_as_words() {
        // A peer that echoes our hello back reads as Version: the message
        // names the likely cause.
        assert!(Status::Version.to_string().contains("xftp recv"));
        assert_eq!(Status::Unknown(9).to_string(), "unknown status 9");
        for c in 0..=7 {
            assert!(!Status::from_code(c).to_string().contains("unknown"), "{c}");
        }
    }

    fn hello() -> Hello {
        Hello {
            min_version: 1,
            max_version: 3,
            session: SessionId([7; 16]),
            index: 2,
            count: 3,
            record_size: 65536,
        }
    }

    #[test]
    fn roundtrip() {
        let h = hello();
        assert_eq!(Hello::decode(&h.encode()), Ok(Some(h)));
        assert_eq!(Hello::decode(&h.encode()[..31]), Ok(None));
        let r = Reply {
            status: Status::Duplicate,
            version: 1,
            record_size: 9,
        };
        assert_eq!(Reply::decode(&r.encode()), Ok(Some(r)));
    }

    #[test]
    fn negotiation_picks_highest_common() {
        // The peer speaks 1 to 3: our newest.
        assert_eq!(hello().negotiate(), Some(MAX_VERSION));
        // An older peer: its newest.
        let mut h = hello();
        h.max_version = 1;
        assert_eq!(h.negotiate(), Some(1));
        let mut h = hello();
        h.min_version = MAX_VERSION + 1;
        assert_eq!(h.negotiate(), None);
    }

    #[test]
    fn malformed_hellos() {
        let mut b = hello().encode();
        b[0] = b'Y';
        assert_eq!(Hello::decode(&b), Err(HelloError::Magic));
        let mut h = hello();
        h.index = 3;
        assert!(matches!(
            Hello::decode(&h.encode()),
            Err(HelloError::Index { .. })
        ));
        h.index = 0;
        h.count = 0;
        assert!(matches!(
            Hello::decode(&h.encode()),
            Err(HelloError::Index { .. })
        ));
        let mut b = hello().encode();
        b[31] = 1;
        assert_eq!(Hello::decode(&b), Err(HelloError::Reserved));
        let mut h = hello();
        h.record_size = 0;
        assert_eq!(Hello::decode(&h.encode()), Err(HelloError::Fields));
    }
}
