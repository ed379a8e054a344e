//! TLS for xftp (RFC 4217, "Securing FTP with TLS"), on rustls.
//!
//! Three pieces:
//!
//! * [`Stream`]: one connection type for plain TCP and TLS (either side),
//!   so the control session, the striping engine and the meters that read
//!   `TCP_INFO` from the socket all work the same over both.
//! * [`server`]: the server's certificate (PEM files, reloadable while
//!   sessions run) and, per control session, the acceptors that bind that
//!   session's data connections to it.
//! * [`client`]: verification against the system's roots, a given CA file
//!   or (only when asked) none, and the session store that lets every data
//!   connection resume the control connection's TLS session.
//!
//! # Binding data connections to their session
//!
//! FTP's data connections arrive on separate TCP connections; with N of
//! them per transfer an attacker who races a client to a passive port (or
//! answers an active connect) has N chances. The server therefore accepts
//! a TLS data connection only if its handshake *resumes* a TLS session of
//! the same control session, which vsftpd calls `require_ssl_reuse`. Each
//! control session gets its own ticket key ([`server::SessionTls`]), so a
//! resumption can only succeed with a ticket issued inside that session:
//! proof that the data connection's peer holds that session's resumption
//! secret. Stock clients (curl, lftp) resume the control session by
//! default; xftp's client keeps a pool of the session's tickets
//! ([`client::ClientTls`]).

pub mod client;
pub mod server;
mod stream;

pub use stream::{Counted, Ledger, Stream, TlsInfo, TLS_WRITE};

/// Length of a data-connection binding token.
pub const TOKEN_LEN: usize = 32;

/// RFC 5705 exporter label of the binding token.
const TOKEN_LABEL: &[u8] = b"EXPORTER-xftp-data-connection-binding";

/// The control connection's binding token: keying material exported from
/// its TLS session (RFC 5705), the same at both ends and known to no one
/// else. A client that negotiated `OPTS TLS BIND` sends it first on each
/// data connection, inside that connection's TLS, to prove the connection
/// belongs to the session (docs/security.md). `None` without TLS.
pub fn binding_token(control: &Stream) -> Option<[u8; TOKEN_LEN]> {
    let out = [0u8; TOKEN_LEN];
    match control {
        Stream::Plain(_) => None,
        Stream::Server(s, _) => s
            .get_ref()
            .1
            .export_keying_material(out, TOKEN_LABEL, None)
            .ok(),
        Stream::Client(s, _) => s
            .get_ref()
            .1
            .export_keying_material(out, TOKEN_LABEL, None)
            .ok(),
    }
}

use std::path::PathBuf;

/// Errors setting up TLS (certificates, keys, configuration).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file could not be read or parsed.
    #[error("{what} {path}: {reason}")]
    File {
        /// "certificate file", "key file" or "CA file".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The key does not belong to the certificate, or rustls refused the
    /// configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// No trusted root certificates could be loaded.
    #[error("no trusted CA certificates found on this system: give one with --cacert FILE")]
    NoRoots,
    /// A host name that cannot be a TLS server name.
    #[error("{0:?} is not a valid TLS server name")]
    BadName(String),
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Config(e.to_string())
    }
}

fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether a failed handshake was cut by the network (a reset, a close,
/// a timeout) rather than refused by TLS itself (a certificate, no common
/// version, not TLS at all): the first may pass when tried again, as on a
/// plain connection; the second will not.
pub fn handshake_cut_by_network(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    let from_tls = e
        .get_ref()
        .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some());
    !from_tls
        && matches!(
            e.kind(),
            K::ConnectionReset
                | K::ConnectionAborted
                | K::BrokenPipe
                | K::UnexpectedEof
                | K::TimedOut
        )
}

/// What a reader says of a peer that closed its TCP connection without
/// TLS's close_notify, in place of rustls's text (which points to its own
/// manual): the peer stopped, crashed or was cut off.
pub const UNCLEAN_CLOSE: &str =
    "closed without TLS's close_notify: the peer stopped, crashed or was cut off";

/// Whether `e` is rustls's report of a close without close_notify.
pub fn is_unclean_close(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::UnexpectedEof && e.to_string().contains("close_notify")
}

/// `e`'s text, with [`UNCLEAN_CLOSE`] for a close without close_notify.
pub fn io_text(e: &std::io::Error) -> String {
    if is_unclean_close(e) {
        UNCLEAN_CLOSE.to_string()
    } else {
        e.to_string()
    }
}

/// `e`, or for a close without close_notify the same kind with
/// [`UNCLEAN_CLOSE`] as its text.
pub fn plain_io_error(e: std::io::Error) -> std::io::Error {
    if is_unclean_close(&e) {
        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, UNCLEAN_CLOSE)
    } else {
        e
    }
}

/// A handshake error as a sentence that names the cause and, where there is
/// one, the fix. `role` is what the local end was doing ("TLS handshake on
/// the control connection", ...).
pub fn explain_handshake_error(e: &std::io::Error) -> String {
    use rustls::{CertificateError, Error as E};
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned();
    match inner {
        Some(E::InvalidCertificate(c)) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                "the server's certificate is not signed by a trusted CA (give the CA with --cacert FILE, or --insecure to skip verification)".into()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "the server's certificate is not valid for this host name (connect by a name its subjectAltName lists; a certificate with a Common Name and no subjectAltName is valid for none; or --insecure to skip verification)".into()
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the server's certificate has expired (renew it on the server, or --insecure to skip verification)".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check the clocks)".into()
            }
            CertificateError::Other(o) if format!("{o:?}").contains("CaUsedAsEndEntity") => {
                "the server's certificate is a CA certificate (self-signed with openssl req -x509?) and no --cacert file holds it: give that very certificate with --cacert FILE to trust it, or use a leaf certificate signed by a CA".into()
            }
            other => format!("the server's certificate was refused: {other:?}"),
        },
        Some(E::InvalidMessage(_)) | Some(E::InappropriateMessage { .. }) => {
            "the peer does not speak TLS here: it answered in plain text (a server that accepted AUTH TLS without starting it, or plain FTP on the port given for implicit TLS: use ftp:// or ftpes:// for a server without implicit TLS)".into()
        }
        Some(E::AlertReceived(a)) => format!("the peer refused the TLS handshake ({a:?})"),
        Some(E::PeerIncompatible(p)) => format!("no TLS version or cipher suite in common ({p:?})"),
        Some(other) => other.to_string(),
        None => match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the peer closed the connection during the TLS handshake (it may not speak TLS on this port, or it refused us)".into()
            }
            std::io::ErrorKind::ConnectionReset => {
                "the peer reset the connection during the TLS handshake (it may not speak TLS on this port: is it listening with TLS?)".into()
            }
            _ => e.to_string(),
        },
    }
}
