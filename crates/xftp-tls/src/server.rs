//! The server's side: its certificate and, per control session, the
//! acceptors that bind data connections to that session.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::{provider, Ledger, Stream, TlsError};

/// Load a certificate chain and its private key (PEM) and check that they
/// belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let file_err = |what, path: &Path, reason: String| TlsError::File {
        what,
        path: path.to_path_buf(),
        reason,
    };
    // A file that cannot be read says the OS's reason alone ("No such
    // file or directory"), not the PEM reader's "I/O error: ..." wrapping.
    let pem_reason = |e: rustls::pki_types::pem::Error, none: &str| match e {
        rustls::pki_types::pem::Error::Io(e) => e.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => none.to_string(),
        e => format!("not valid PEM: {e}"),
    };
    let no_cert = "no PEM certificate (BEGIN CERTIFICATE) in it";
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err("certificate file", cert, pem_reason(e, no_cert)))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err("certificate file", cert, pem_reason(e, no_cert)))?;
    if certs.is_empty() {
        return Err(file_err("certificate file", cert, no_cert.into()));
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        // A key under a passphrase is no key to a server that cannot ask.
        let encrypted = std::fs::read(key).is_ok_and(|b| {
            let has = |n: &[u8]| b.windows(n.len()).any(|w| w == n);
            has(b"ENCRYPTED PRIVATE KEY") || has(b"Proc-Type: 4,ENCRYPTED")
        });
        let none = if encrypted {
            "the key is encrypted (under a passphrase), which a server cannot type: decrypt it, e.g. `openssl pkey -in KEY -out plain.key`, and keep that file readable by the server alone"
        } else {
            "no PEM private key (BEGIN PRIVATE KEY, RSA or EC) in it"
        };
        file_err("key file", key, pem_reason(e, none))
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| {
            file_err(
                "key file",
                key,
                format!(
                    "{e}: its type or size is not supported (RSA of 2048 to 4096 bits, ECDSA on P-256 or P-384, or Ed25519 are)"
                ),
            )
        })?;
    let ck = CertifiedKey::new(certs.clone(), signing.clone());
    ck.keys_match().map_err(|e| {
        // The key of another certificate of the chain: the chain is in the
        // wrong order (the server's own certificate comes first).
        let at = certs.iter().skip(1).position(|c| {
            CertifiedKey::new(vec![c.clone()], signing.clone())
                .keys_match()
                .is_ok()
        });
        let hint = match at {
            Some(i) => format!(
                " (it belongs to certificate {} of that file: put the server's own certificate first, then the CA's)",
                i + 2
            ),
            None => String::new(),
        };
        TlsError::Config(format!(
            "the key in {} does not belong to the certificate in {}: {e}{hint}",
            key.display(),
            cert.display()
        ))
    })?;
    Ok(ck)
}

/// The certificate in force, replaced by [`ServerTls::reload`]; sessions
/// already running keep their TLS state, new handshakes get the new one.
struct Reloadable(RwLock<Arc<CertifiedKey>>);

impl fmt::Debug for Reloadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reloadable")
    }
}

impl ResolvesServerCert for Reloadable {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock still holds a valid key.
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The server's TLS identity: certificate and key files, reloadable.
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Reloadable>,
    base: Arc<ServerConfig>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl ServerTls {
    /// Load `cert` (PEM chain, leaf first) and `key` (PEM, PKCS#8, PKCS#1
    /// or SEC1).
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let ck = load_certified_key(cert, key)?;
        let current = Arc::new(Reloadable(RwLock::new(Arc::new(ck))));
        let base = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        Ok(ServerTls {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current,
            base: Arc::new(base),
        })
    }

    /// Read the certificate and key files again (SIGHUP). On error the old
    /// ones stay in force.
    pub fn reload(&self) -> Result<(), TlsError> {
        let ck = load_certified_key(&self.cert, &self.key)?;
        *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ck);
        Ok(())
    }

    /// What a client checking the certificate in force would refuse in
    /// its dates at `now` (seconds since 1970): expired, or not valid
    /// yet. Served all the same (the operator may be replacing it), but
    /// said at start and on reload, since every verifying client fails.
    pub fn validity_warning(&self, now: i64) -> Option<String> {
        let ck = self
            .current
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let leaf = ck.cert.first()?;
        let (_, c) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        let v = c.validity();
        let path = self.cert.display();
        if now > v.not_after.timestamp() {
            Some(format!(
                "the certificate in {path} expired on {} (clients that check it refuse it; replace it and send SIGHUP)",
                v.not_after
            ))
        } else if now < v.not_before.timestamp() {
            Some(format!(
                "the certificate in {path} is not valid before {} (clients that check it refuse it until then; is the clock right?)",
                v.not_before
            ))
        } else if !matches!(c.subject_alternative_name(), Ok(Some(_))) {
            // Clients match the host name against subjectAltName alone
            // (RFC 6125; rustls, curl, browsers): a Common Name is not read.
            Some(format!(
                "the certificate in {path} has no subjectAltName, so clients that check it refuse it for every host name (its Common Name is not read): make it with the names clients connect by, e.g. openssl req ... -addext subjectAltName=DNS:ftp.example.org,IP:192.0.2.1"
            ))
        } else {
            None
        }
    }

    /// TLS for one control session: a fresh ticket key and session cache,
    /// so that only this session's tickets can resume on its data
    /// connections. `tickets` is how many tickets the control handshake
    /// hands out: enough for the most data connections a client may open
    /// at once. A data handshake hands out two more where the client reads
    /// (see [`SessionTls::accept_data`]).
    pub fn session(&self, tickets: usize) -> Result<SessionTls, TlsError> {
        let ticketer = rustls::crypto::ring::Ticketer::new()?;
        let cache = ServerSessionMemoryCache::new(1024);
        let mut control = (*self.base).clone();
        control.ticketer = ticketer.clone();
        control.session_storage = cache.clone();
        control.send_tls13_tickets = tickets.max(2);
        let mut data = control.clone();
        data.send_tls13_tickets = 2;
        let mut quiet = control.clone();
        quiet.send_tls13_tickets = 0;
        Ok(SessionTls {
            control: TlsAcceptor::from(Arc::new(control)),
            data: TlsAcceptor::from(Arc::new(data)),
            quiet: TlsAcceptor::from(Arc::new(quiet)),
        })
    }
}

/// Why a TLS data connection was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataTlsError {
    /// The handshake failed or took too long.
    #[error("TLS handshake on the data connection failed: {0}")]
    Handshake(std::io::Error),
    /// The handshake did not resume this control session's TLS session:
    /// the peer cannot prove it belongs to the session.
    #[error("TLS data connection did not resume the control connection's TLS session (session reuse is required; see docs/security.md)")]
    NotResumed,
    /// The data connection's first bytes were not the session's binding
    /// token.
    #[error("TLS data connection did not send the session's binding token")]
    BadToken,
}

/// How a data connection proves that it belongs to its control session.
#[derive(Clone, Copy, Debug)]
pub enum Proof {
    /// It need not (`--tls-allow-fresh-data`).
    None,
    /// Its handshake resumes the session (what stock clients do).
    Resume,
    /// It sends this token first (`OPTS TLS BIND`, see
    /// [`crate::binding_token`]).
    Token([u8; crate::TOKEN_LEN]),
}

/// One control session's TLS acceptors (see [`ServerTls::session`]).
#[derive(Clone)]
pub struct SessionTls {
    control: TlsAcceptor,
    /// Data connections that hand out session tickets.
    data: TlsAcceptor,
    /// Data connections that hand out none.
    quiet: TlsAcceptor,
}

impl fmt::Debug for SessionTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionTls")
    }
}

impl SessionTls {
    /// The handshake on the control connection (after `AUTH TLS`, or at
    /// once on the implicit-TLS port).
    pub async fn accept_control(
        &self,
        tcp: TcpStream,
        limit: Duration,
    ) -> Result<Stream, std::io::Error> {
        let s = tokio::time::timeout(limit, self.control.accept(crate::Counted::new(tcp)))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
            })??;
        Ok(Stream::Server(Box::new(s), Ledger::default()))
    }

    /// The handshake on a data connection (the FTP server is the TLS
    /// server whichever end connected, RFC 4217 section 9). With
    /// `require_reuse` it must resume this session. With `tickets` it
    /// hands the client two new session tickets: only where the client
    /// reads the connection, because a client that closes a socket with
    /// unread bytes in it (tickets on an upload it never reads) makes its
    /// kernel reset the connection, which can cut off the upload's end.
    pub async fn accept_data(
        &self,
        tcp: TcpStream,
        limit: Duration,
        proof: Proof,
        tickets: bool,
    ) -> Result<Stream, DataTlsError> {
        let acceptor = if tickets { &self.data } else { &self.quiet };
        let s = tokio::time::timeout(limit, acceptor.accept(crate::Counted::new(tcp)))
            .await
            .map_err(|_| {
                DataTlsError::Handshake(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                ))
            })?
            .map_err(DataTlsError::Handshake)?;
        let resumed = s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        // Dropped before a byte of payload: the peer is told nothing beyond
        // the closed connection.
        match proof {
            Proof::None => {}
            Proof::Resume if resumed => {}
            Proof::Resume => return Err(DataTlsError::NotResumed),
            Proof::Token(want) => {
                use tokio::io::AsyncReadExt;
                let mut got = [0u8; crate::TOKEN_LEN];
                let mut s = s;
                let read = tokio::time::timeout(limit, s.read_exact(&mut got)).await;
                // Compared in constant time.
                let diff = got
                    .iter()
                    .zip(want.iter())
                    .fold(0u8, |d, (a, b)| d | (a ^ b));
                if !matches!(read, Ok(Ok(_))) || diff != 0 {
                    return Err(DataTlsError::BadToken);
                }
                return Ok(Stream::Server(Box::new(s), Ledger::default()));
            }
        }
        Ok(Stream::Server(Box::new(s), Ledger::default()))
    }
}
