//! The xftp striping engine: one file or byte stream over N connections.
//!
//! Three seams: **transport** (any `AsyncRead`/`AsyncWrite` connection:
//! TCP today, TLS later), **framing** (GridFTP MODE E blocks, [`block`]),
//! **storage** (positional [`ReadAt`]/[`WriteAt`] for files, an in-memory
//! reorder buffer for ordered streams).
//!
//! The protocol logic is sans-IO: [`block`] (header codec), [`ranges`]
//! (received byte ranges), [`sched`] (which record a connection sends next)
//! and [`reasm`] (the receiver's completion rule) do no I/O and are tested
//! without sockets. [`Sender`] and [`Receiver`] are thin tokio drivers over
//! them: one task per connection, each pulling its next record only when
//! its previous write finished (dynamic assignment).
//!
//! ```text
//!   ReadAt / stream buffer --> Scheduler --> conn task 0 --> [hdr|data][hdr|data]..[EOD]
//!                                       \--> conn task 1 --> [hdr|data]..........[EOF|EOD n]
//!   conn task i --> Reassembly (ranges, EOD/EOF count) --> WriteAt at offset / reorder buffer
//! ```
//!
//! Connections can be added to a running transfer and retired from it
//! ([`Sender::add_connection`], [`Sender::retire`],
//! [`Receiver::add_connection`]): the EOF block carries the number of EODs
//! the receiver must see, so it knows when the last connection has ended.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), xftp_stripe::StripeError> {
//! use std::sync::Arc;
//! use xftp_stripe::{recv_file, send_file, MemFile, SendConfig};
//! let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
//! let src = Arc::new(MemFile::from(data.clone()));
//! let dst = Arc::new(MemFile::default());
//! let (mut tx, mut rx) = (Vec::new(), Vec::new());
//! for _ in 0..3 {
//!     let (a, b) = tokio::io::duplex(64 * 1024);
//!     tx.push(a);
//!     rx.push(b);
//! }
//! let cfg = SendConfig { record_size: 8192, ..SendConfig::default() };
//! let (sent, got) = tokio::join!(
//!     send_file(src, data.len() as u64, tx, &cfg),
//!     recv_file(dst.clone(), rx, Some(data.len() as u64)),
//! );
//! assert_eq!(sent?.bytes, got?.bytes);
//! assert_eq!(dst.to_vec(), data);
//! # Ok(()) }
//! ```

pub mod block;
mod driver;
mod early;
pub mod endgame;
mod io;
mod pipe;
pub mod ranges;
pub mod reasm;
mod recv;
pub mod sched;
mod send;
mod sock;

pub use early::EarlyStart;
pub use io::{
    names_out_of_space, open_regular, read_regular, remove_stale_temps, write_atomic,
    write_atomic_mode, write_atomic_with, FileStamp, MemFile, ReadAt, RecordedFile, WriteAt,
};
pub use pipe::Pipe;
pub use recv::{recv_file, Receiver, RecvControl};
pub use sched::Schedule;
pub use send::{send_file, SendConfig, SendControl, Sender, SourceCheck};
pub use sock::{socket_bytes, DataSocket, Delivery, Probe, SocketBytes};

/// A task aborted when this handle is dropped (a spawned task otherwise
/// runs on, detached).
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Default record size: 256 KiB. See docs/framing.md for the reasoning.
pub const DEFAULT_RECORD_SIZE: u32 = 256 * 1024;

/// The smallest record an xftp sender cuts a file into (a small file gets
/// records this small so that every connection has some; below it,
/// headers and wake-ups start to cost).
pub const MIN_RECORD_SIZE: u32 = 16 * 1024;

/// Record size for sending `len` bytes over `n` connections: the
/// configured size, but small enough that every connection gets about two
/// records (a 1 MB file over 16 connections would otherwise use only 4 of
/// them, and a 2 MiB file over 8 would give each connection one record,
/// nothing left to balance, and a whole quarter MiB for the endgame to
/// copy when one sits in a timeout), and never under [`MIN_RECORD_SIZE`].
/// At least [`GROWTH_ROOM`] connections are assumed: a count chosen as
/// the transfer goes (`-p auto`) may rise, and connections added help only
/// while records are left to hand out. Used by both ends' senders.
pub fn record_size_for(len: u64, n: usize, configured: u32) -> u32 {
    let min = u64::from(MIN_RECORD_SIZE);
    let per = len / (2 * n.max(GROWTH_ROOM) as u64);
    per.clamp(min, u64::from(configured).max(min)) as u32
}

/// See [`record_size_for`].
const GROWTH_ROOM: usize = 8;

/// How many connections a transfer of `bytes` can keep busy when its
/// records are at least `record` bytes (the last one shorter): one per
/// record, and one for an empty file. A connection beyond that is sent
/// nothing and only costs its handshakes.
pub fn useful_connections(bytes: u64, record: u32) -> u32 {
    let per = u64::from(record.max(1));
    u32::try_from(bytes.div_ceil(per).max(1)).unwrap_or(u32::MAX)
}

/// Payload bytes and records carried by one data connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Payload bytes (headers not counted). A receiver that takes
    /// duplicates counts only the bytes a connection stored first; a
    /// sender counts what it sent, copies included.
    pub bytes: u64,
    /// Data blocks.
    pub records: u64,
}

/// Result of a finished transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferReport {
    /// Payload bytes this transfer moved (a resumed receive does not
    /// count what was already in place; a receive that took duplicates
    /// counts each byte once).
    pub bytes: u64,
    /// The endgame's copies: payload bytes received again (a receiver),
    /// or sent again (a sender).
    pub duplicate_bytes: u64,
    /// Per data connection, in the order connections were added.
    pub streams: Vec<StreamStats>,
}

/// Why a striped transfer failed. `Clone` so that every party waiting on a
/// transfer can be handed the same cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StripeError {
    /// I/O failed on data connection `conn` (`None`: local storage).
    #[error("{}: {message}", match .conn { Some(c) => format!("data connection {c}"), None => "storage".to_string() })]
    Io {
        /// Connection index, or `None` for the local file.
        conn: Option<usize>,
        /// The OS error kind.
        kind: std::io::ErrorKind,
        /// The error text.
        message: String,
    },
    /// The peer sent a malformed block header.
    #[error("data connection {conn}: {source}")]
    Block {
        /// Connection index.
        conn: usize,
        /// What was wrong.
        source: block::BlockError,
    },
    /// The peer sent bytes already received (duplicate or overlap).
    #[error("received range [{start}, {end}) overlaps data already received")]
    Overlap {
        /// Start of the offending range.
        start: u64,
        /// End of the offending range.
        end: u64,
    },
    /// A second copy of a byte range (the endgame sends stuck records
    /// again) differs from the first: the sender is broken or hostile.
    #[error("bytes [{start}, {end}) arrived twice and the copies differ")]
    DuplicateDiffers {
        /// Start of the range.
        start: u64,
        /// End of the range.
        end: u64,
    },
    /// The peer sent a block after the EOD of that connection.
    #[error("data connection {conn}: block after end of data")]
    DataAfterEod {
        /// Connection index.
        conn: usize,
    },
    /// A data connection closed before sending its EOD: data may be lost.
    #[error("data connection {conn} closed before its end-of-data mark")]
    ClosedBeforeEod {
        /// Connection index.
        conn: usize,
    },
    /// The peer sent two EOF blocks.
    #[error("second EOF block")]
    DuplicateEof,
    /// The EOF block announced more connections than the receiver takes.
    #[error(
        "the sender announced {announced} data connections (EOF block); at most {max} are accepted"
    )]
    TooManyConnections {
        /// The EOF block's count.
        announced: u64,
        /// The receiver's limit.
        max: u64,
    },
    /// The EOF block announced another count than a fixed group's (a
    /// parallel-sockets stream's) connections.
    #[error("the sender announced {announced} data connections (EOF block) on a group of {group}")]
    WrongGroup {
        /// The EOF block's count.
        announced: u64,
        /// The group's connections.
        group: u64,
    },
    /// The source file changed while it was sent
    /// ([`SendConfig::source_check`](crate::SendConfig::source_check)):
    /// its last record was held back.
    #[error("the source file changed while it was sent")]
    SourceChanged,
    /// More EODs arrived than the EOF block announced.
    #[error("{seen} end-of-data marks, EOF announced {expected}")]
    TooManyEods {
        /// Announced count.
        expected: u64,
        /// Seen so far.
        seen: u64,
    },
    /// No EOF block arrived before every connection ended.
    #[error("transfer ended without an EOF block")]
    MissingEof,
    /// Fewer EODs arrived than the EOF block announced.
    #[error("{seen} of {expected} end-of-data marks received")]
    MissingEods {
        /// Announced count.
        expected: u64,
        /// Seen.
        seen: u64,
    },
    /// The received data has a hole.
    #[error("bytes missing at offset {at} (of {total})")]
    Hole {
        /// First missing byte.
        at: u64,
        /// Largest end received.
        total: u64,
    },
    /// The received size differs from the announced one.
    #[error("received {got} bytes, expected {expected}")]
    SizeMismatch {
        /// Announced size.
        expected: u64,
        /// Received size.
        got: u64,
    },
    /// A block reaches past the size announced for a receiver that takes
    /// copies (the endgame's): more bytes than the file has.
    #[error("a block ends at byte {end}, past the announced size of {size}")]
    PastSize {
        /// End of the block.
        end: u64,
        /// Announced size.
        size: u64,
    },
    /// A block is larger than this receiver accepts.
    #[error("block of {count} bytes exceeds the limit of {max}")]
    BlockTooLarge {
        /// Block size.
        count: u64,
        /// Limit.
        max: u64,
    },
    /// The local source returned fewer bytes than its announced length.
    #[error("source ended at {at}, {len} bytes were announced")]
    SourceShort {
        /// Offset where reading returned nothing.
        at: u64,
        /// Announced length.
        len: u64,
    },
    /// A feature of MODE E this engine does not implement.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// No such connection index.
    #[error("no data connection {0}")]
    BadIndex(usize),
    /// The transfer is finishing or finished; no connection can be added.
    #[error("transfer already finishing")]
    Finished,
    /// Static scheduling cannot change its connection set.
    #[error("static scheduling cannot add connections")]
    StaticAdd,
    /// No connection is left and none can be added any more.
    #[error("no data connection left to finish the transfer")]
    NoConnections,
    /// Another part of the transfer failed first, or it was cancelled.
    #[error("transfer aborted: {0}")]
    Aborted(String),
}

impl StripeError {
    /// Whether running the transfer again may succeed: a data connection
    /// failed, or the transfer was cut short (the network). Not a local
    /// storage error, data that broke the protocol or a misuse: those
    /// would fail the same way again.
    pub fn may_pass(&self) -> bool {
        match self {
            Self::Io { conn, .. } => conn.is_some(),
            Self::ClosedBeforeEod { .. }
            | Self::MissingEof
            | Self::MissingEods { .. }
            | Self::Hole { .. }
            | Self::NoConnections => true,
            Self::SizeMismatch { expected, got } => got < expected,
            Self::Aborted(m) => !m.starts_with("storage"),
            _ => false,
        }
    }

    pub(crate) fn io(conn: Option<usize>, e: &std::io::Error) -> Self {
        Self::Io {
            conn,
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    /// As an `std::io::Error`, for `AsyncRead`/`AsyncWrite` adapters.
    pub fn to_io(&self) -> std::io::Error {
        let kind = match self {
            Self::Io { kind, .. } => *kind,
            Self::ClosedBeforeEod { .. } | Self::MissingEods { .. } | Self::MissingEof => {
                std::io::ErrorKind::UnexpectedEof
            }
            Self::Aborted(_) => std::io::ErrorKind::ConnectionAborted,
            _ => std::io::ErrorKind::InvalidData,
        };
        std::io::Error::new(kind, self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_size_shrinks_for_small_files() {
        assert_eq!(record_size_for(1 << 30, 4, 256 * 1024), 256 * 1024);
        // Room for a count that grows to 8 connections.
        assert_eq!(record_size_for(2 << 20, 4, 256 * 1024), 128 * 1024);
        assert_eq!(record_size_for(2 << 20, 1, 256 * 1024), 128 * 1024);
        assert_eq!(record_size_for(1_000_000, 16, 256 * 1024), 31_250);
        assert_eq!(record_size_for(1000, 16, 256 * 1024), 16 * 1024);
        assert_eq!(record_size_for(0, 0, 4096), 16 * 1024);
    }

    #[test]
    fn one_connection_per_record_and_one_for_nothing() {
        let r = MIN_RECORD_SIZE;
        let r64 = u64::from(r);
        assert_eq!(useful_connections(0, r), 1);
        assert_eq!(useful_connections(1, r), 1);
        assert_eq!(useful_connections(r64, r), 1);
        assert_eq!(useful_connections(r64 + 1, r), 2);
        assert_eq!(useful_connections(40_000, r), 3);
        assert_eq!(useful_connections(1 << 40, r), 1 << 26);
        assert_eq!(useful_connections(u64::MAX, 1), u32::MAX);
        assert_eq!(
            useful_connections(5, 0),
            5,
            "a zero record counts as one byte"
        );
    }
}
