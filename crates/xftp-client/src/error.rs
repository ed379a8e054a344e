//! The one error type of the client library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use xftp_proto::ProtoError;

/// Everything that can go wrong in a client operation.
///
/// Each variant says who is at fault: the server (it refused or misbehaved),
/// the network, the local file system, or the caller's input.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The TCP connection to the server could not be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address we tried.
        addr: SocketAddr,
        /// The operating system's reason (refused, unreachable, ...).
        #[source]
        source: std::io::Error,
    },
    /// A host name did not resolve to any address.
    #[error("cannot resolve host {host:?}: {reason}")]
    Resolve {
        /// The host as given.
        host: String,
        /// Why it failed.
        reason: String,
    },
    /// A listing came back empty for a path that is neither a directory
    /// (CWD) nor a file (SIZE) there: vsftpd and others answer LIST of a
    /// missing path with an empty listing and 226.
    #[error("{path}: no such file or directory on the server (its LIST sent nothing, and neither CWD nor SIZE finds the path)")]
    NotThere {
        /// The path as listed.
        path: String,
    },
    /// A directory the server could not read: its `LIST -a` lacked the
    /// directory's own `.` entry where the server lists one for what it
    /// can read, and CWD into it is refused (vsftpd answers 226 for it).
    #[error("{path}: the server cannot read this directory (its listing lacks the directory's own entry, and CWD into it is refused): check its permissions on the server")]
    NotListed {
        /// The path as listed.
        path: String,
    },
    /// The server answered a command with a code we did not expect.
    /// `code` and `text` are the server's own words.
    #[error("{command}: server replied {code} {text}")]
    Reply {
        /// The command as sent (passwords masked).
        command: String,
        /// The server's reply code.
        code: u16,
        /// The server's reply text (lines joined with a space).
        text: String,
    },
    /// An argument contained CR or LF, which would let it smuggle a second
    /// command onto the control connection. Refused before anything is sent.
    #[error("refusing to send {verb}: its argument contains a CR or LF character")]
    BadArgument {
        /// The command whose argument was refused.
        verb: String,
    },
    /// What answered the connection does not greet as an FTP server: no
    /// greeting in time (an FTP server greets as soon as it accepts; an
    /// HTTP server waits silently for a request), or one that is not an
    /// FTP reply (an SSH banner).
    #[error("no FTP server's greeting: {0}")]
    NotFtp(String),
    /// The connection was accepted but no greeting came in time: an FTP
    /// server greets at once, so the server is stalled, or the network
    /// lost the greeting (a flow reset during the handshake).
    #[error("no FTP server's greeting: no complete one within {:.0} s", .after.as_secs_f64())]
    NoGreeting {
        /// How long we waited.
        after: Duration,
    },
    /// The server sent something that is not an FTP reply.
    // Not a `source`: the text already says it, and error chains would
    // print it twice.
    #[error("malformed reply from server: {0}")]
    Protocol(ProtoError),
    /// A reply that parsed but whose content made no sense (e.g. a 229
    /// without a port).
    #[error("{command}: cannot use the server's reply {code} {text}: {reason}")]
    BadReply {
        /// The command that was answered.
        command: String,
        /// The reply code.
        code: u16,
        /// The reply text.
        text: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The server closed the control connection.
    #[error("the server closed the control connection")]
    Closed,
    /// Nothing arrived in time.
    #[error("timed out after {:.1} s waiting for {what}", .after.as_secs_f64())]
    Timeout {
        /// What we were waiting for.
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// Reading or writing the control connection failed.
    #[error("control connection: {}", xftp_tls::io_text(.0))]
    ControlIo(#[source] std::io::Error),
    /// Reading or writing a data connection failed.
    #[error("data connection: {}", xftp_tls::io_text(.0))]
    DataIo(#[source] std::io::Error),
    /// A local file could not be read, created or renamed.
    #[error("{}: {source}", .path.display())]
    Local {
        /// The file concerned.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Fewer (or more) bytes arrived than the server's SIZE announced.
    /// The partial file has been removed.
    #[error("{}: received {got} bytes, the server gave its size as {expected} (SIZE or listing)", if got > expected { "size changed" } else { "short transfer" })]
    ShortTransfer {
        /// Bytes the server said the file has.
        expected: u64,
        /// Bytes that arrived.
        got: u64,
    },
    /// A resumed download in stream mode received bytes past the file's
    /// end: the server ignored REST (sent from 0) or the file grew. What
    /// this run wrote is dropped from the partial's record.
    #[error("the server sent more than the file holds ({size} bytes) when asked to start at byte {from}: it ignored REST, or the file grew; what this run received was dropped")]
    PastEnd {
        /// Bytes the server said the file has.
        size: u64,
        /// Where the run asked the server to start (REST).
        from: u64,
    },
    /// After an upload, the bytes sent or the server's SIZE do not match the
    /// local file's length.
    #[error("upload incomplete: {what} is {got} bytes, the local file has {expected}")]
    UploadMismatch {
        /// Which count disagrees ("bytes sent" or "the server's SIZE").
        what: &'static str,
        /// The local file's length.
        expected: u64,
        /// The count that disagrees.
        got: u64,
    },
    /// The striping engine failed on a multi-stream transfer: a data
    /// connection broke, or the transfer was cut short.
    #[error("multi-stream transfer: {0}")]
    Stripe(String),
    /// The striping engine failed in a way that running again would not
    /// mend: the local file ("storage: ..."), or data from the peer that
    /// broke the protocol (overlapping or differing ranges, a bad block).
    #[error("multi-stream transfer: {0}")]
    StripeFault(String),
    /// TLS could not be set up (a failed handshake, a certificate that
    /// is not trusted, a server without TLS); the text names the cause and
    /// the fix.
    #[error("TLS: {0}")]
    Tls(String),
    /// A download from a server without MULT came from a file that
    /// changed meanwhile: SIZE or MDTM at the end differ from the start.
    /// Byte ranges fetched over several sessions (each sends its own REST
    /// and RETR) may belong to two versions, and so may the one stream of
    /// a file rewritten in place.
    #[error("the file changed on the server during the download ({was}; now {now}): what arrived may mix two versions; nothing was put in place")]
    ChangedDuring {
        /// SIZE and MDTM at the start.
        was: String,
        /// SIZE and MDTM at the end.
        now: String,
    },
    /// `-c`: the source is not the one the partial file came from.
    #[error("the source changed since the partial transfer ({was}; now {now}): resuming would splice two versions")]
    SourceChanged {
        /// The partial file, left as it was.
        partial: PathBuf,
        /// What the partial's record says.
        was: String,
        /// What the server says now.
        now: String,
    },
    /// The local file changed size while a one-connection (stream mode)
    /// upload read it: the data connection was reset, so the server
    /// cannot take what it got for the whole file.
    #[error("the local file changed while it was sent: it had {expected} bytes when the upload began, and {read} were read; {}", if *cleared { "the server holds nothing of this upload" } else { "the server may hold what arrived under the target's name" })]
    LocalFileChanged {
        /// The size when the upload began.
        expected: u64,
        /// Bytes read before the change showed (past `expected`: it grew).
        read: u64,
        /// The server holds nothing of the upload: an xftp server drops a
        /// reset upload; a stock server's copy (STOR wrote it in place) was
        /// deleted.
        cleared: bool,
    },
    /// The local file was written while it was sent (its size or
    /// modification time at the end differs from the start's, though as
    /// many bytes as it had were sent): what the server received is of no
    /// one version.
    #[error("the local file was written while it was sent (its size or modification time changed): the server's copy would be of no one version; {}", if *cleared { "the server holds none of it" } else { "it could not be deleted and may stand under the target's name" })]
    LocalFileWritten {
        /// The server's copy was deleted.
        cleared: bool,
    },
    /// `--verify`: the server's checksum of the file and ours differ. The
    /// downloaded file was not put in place (an upload's was removed).
    #[error("checksum mismatch ({algorithm}): the server has {remote}, the local copy {local}")]
    ChecksumMismatch {
        /// The algorithm used.
        algorithm: xftp_proto::cksum::Algorithm,
        /// The server's value.
        remote: String,
        /// Ours.
        local: String,
    },
    /// The caller asked for something impossible (a bad URL, a path that
    /// names no file, ...).
    #[error("{0}")]
    Usage(String),
    /// The user interrupted the transfer ([`crate::ClientConfig::interrupt`]).
    #[error("interrupted")]
    Interrupted,
    /// An upload with resume (`-c`) to a server that cannot resume one:
    /// it lacks MULT and MODE E (SITE RESUMABLE). Sending the file whole,
    /// without `-c`, works.
    #[error("-c for uploads needs an xftp server (SITE RESUMABLE with MODE E); this one does not list both MULT and MODE E. Run without -c")]
    UploadResumeUnsupported,
}

/// What a [`ClientError::Timeout`] at the login waited for.
pub(crate) const LOGIN_REPLY: &str = "the server's answer to the login";

impl ClientError {
    /// A timeout at the login: the server greeted, then stood still
    /// (overloaded, or the path stalled); nothing was transferred.
    pub fn at_login(&self) -> bool {
        matches!(self, ClientError::Timeout { what, .. } if what == LOGIN_REPLY)
    }

    /// Whether the session this error came from is not worth using again:
    /// its control connection is closed, failed, timed out, or out of step
    /// (a malformed reply, a TLS failure).
    pub(crate) fn session_broken(&self) -> bool {
        matches!(
            self,
            ClientError::Closed
                | ClientError::ControlIo(_)
                | ClientError::Timeout { .. }
                | ClientError::Tls(_)
                | ClientError::Protocol(_)
        )
    }

    /// Whether the same operation may succeed if run again soon: the
    /// network or the server's connections failed (a reset, a timeout, a
    /// closed control connection, a cut transfer), or the server answered
    /// with a transient negative reply (4yz, RFC 959 section 4.2), except
    /// 452 (no space: it does not pass in seconds). A refusal (5yz), a
    /// changed source, a checksum that differs, a TLS certificate that is
    /// not trusted or a local error is not: running again would fail the
    /// same way.
    ///
    /// A refused TCP connection counts as transient: a server restarting
    /// refuses for a moment.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::NoGreeting { .. }
            | ClientError::Closed
            | ClientError::Timeout { .. }
            | ClientError::ControlIo(_)
            | ClientError::DataIo(_)
            | ClientError::Stripe(_) => true,
            ClientError::ShortTransfer { expected, got } => got < expected,
            ClientError::Reply { code, .. } => (400..500).contains(code) && *code != 452,
            _ => false,
        }
    }

    /// A TLS handshake that failed, `what` naming where ("data
    /// connection: ", or nothing for the control connection). Cut by the
    /// network (a reset, a timeout) it is a connection's failure, which may
    /// pass like any other ([`is_transient`](Self::is_transient)); refused
    /// by TLS itself (a certificate, no common version) it is
    /// [`ClientError::Tls`], which will not.
    pub fn tls_handshake(e: std::io::Error, what: &str, data: bool) -> ClientError {
        if xftp_tls::handshake_cut_by_network(&e) {
            let e = std::io::Error::new(e.kind(), format!("{what}TLS handshake: {e}"));
            return if data {
                ClientError::DataIo(e)
            } else {
                ClientError::ControlIo(e)
            };
        }
        ClientError::Tls(format!("{what}{}", xftp_tls::explain_handshake_error(&e)))
    }

    /// Whether the server could not be reached or would not take the
    /// session: a refused or failed TCP connection, no greeting, a 421
    /// (busy, shutting down). Running again at once is likely to meet
    /// the same; a caller that retries waits longer each time (see
    /// [`is_transient`](Self::is_transient)).
    pub fn server_unreachable(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::NoGreeting { .. }
                | ClientError::Reply { code: 421, .. }
        )
    }

    /// The server's reply code, when the error is a refusal by the server.
    pub fn reply_code(&self) -> Option<u16> {
        match self {
            ClientError::Reply { code, .. } | ClientError::BadReply { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<ProtoError> for ClientError {
    fn from(e: ProtoError) -> Self {
        ClientError::Protocol(e)
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::ClientError;
    use std::time::Duration;

    fn reply(code: u16) -> ClientError {
        ClientError::Reply {
            command: "RETR f".into(),
            code,
            text: "no".into(),
        }
    }

    #[test]
    fn what_may_pass_and_what_would_fail_again() {
        for code in [421, 425, 426, 450, 451] {
            assert!(reply(code).is_transient(), "{code}");
        }
        for code in [452, 500, 530, 550, 552, 553] {
            assert!(!reply(code).is_transient(), "{code}");
        }
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(ClientError::DataIo(io()).is_transient());
        assert!(ClientError::ControlIo(io()).is_transient());
        assert!(ClientError::Closed.is_transient());
        assert!(reply(421).server_unreachable());
        assert!(!reply(426).server_unreachable());
        assert!(!ClientError::DataIo(io()).server_unreachable());
        assert!(ClientError::NoGreeting {
            after: Duration::from_secs(20)
        }
        .is_transient());
        assert!(ClientError::ShortTransfer {
            expected: 10,
            got: 4
        }
        .is_transient());
        // A file that grew is not cut: the next run would meet it again.
        assert!(!ClientError::ShortTransfer {
            expected: 4,
            got: 10
        }
        .is_transient());
        assert!(!ClientError::NotFtp("SSH-2.0-OpenSSH".into()).is_transient());
        assert!(!ClientError::Tls("certificate not trusted".into()).is_transient());
        // A handshake the network cut may pass; one TLS refused may not.
        let cut = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(ClientError::tls_handshake(cut, "", false).is_transient());
        let cut = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert!(ClientError::tls_handshake(cut, "data connection: ", true).is_transient());
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = ClientError::tls_handshake(refused, "", false);
        assert!(matches!(e, ClientError::Tls(_)) && !e.is_transient(), "{e}");
        assert!(!ClientError::Usage("bad URL".into()).is_transient());
        assert!(!ClientError::Local {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        }
        .is_transient());
    }
}
