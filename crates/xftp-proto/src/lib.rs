//! Sans-IO FTP control protocol for xftp.
//!
//! This crate does **no I/O**: it turns bytes into commands and replies and
//! back, parses and formats the host-port arguments of PORT/EPRT/PASV/EPSV
//! (and the xftp `MPRT` extension), and resolves client paths against a
//! virtual root. The server and the client feed it bytes they read from
//! sockets and write out the bytes it produces.
//!
//! ```text
//!   socket bytes ──► LineReader / ReplyParser ──► Command / Reply
//!   Command / Reply ──► encode() ──► socket bytes
//! ```

pub mod ascii;
pub mod cksum;
pub mod command;
pub mod facts;
pub mod hostport;
pub mod name;
pub mod path;
pub mod reply;

mod error;

pub use command::{parse_bufsize, parse_bytes, BufSize, BytesError, Command, LineReader, MAX_LINE};
pub use error::ProtoError;
pub use reply::{Reply, ReplyParser};
