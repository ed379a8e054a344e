//! The client's side: server verification and session resumption on every
//! data connection.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionStore, Resumption, Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, NamedGroup, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{provider, Ledger, Stream, TlsError};

/// How the client checks the server.
#[derive(Clone, Debug, Default)]
pub struct ClientTlsConfig {
    /// Trust only the CA certificates in this PEM file (instead of the
    /// system's roots).
    pub cacert: Option<PathBuf>,
    /// Do not verify the server's certificate at all.
    pub insecure: bool,
}

/// TLS for one control session of the client: the control connection's
/// handshake and every data connection's, which resume its session.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    name: ServerName<'static>,
    store: Arc<TicketPool>,
    /// The binding token sent first on each data connection, once the
    /// server accepted `OPTS TLS BIND`.
    token: Option<[u8; crate::TOKEN_LEN]>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("name", &self.name)
            .finish()
    }
}

/// The certificates in a `--cacert` file.
fn ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::File {
        what: "CA file",
        path: path.to_path_buf(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificate (BEGIN CERTIFICATE) in it".into()));
    }
    Ok(certs)
}

fn roots(cfg: &ClientTlsConfig) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    if let Some(path) = &cfg.cacert {
        let err = |reason: String| TlsError::File {
            what: "CA file",
            path: path.clone(),
            reason,
        };
        for c in ca_file(path)? {
            roots.add(c).map_err(|e| err(e.to_string()))?;
        }
    } else {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!("system CA certificates: {e}");
        }
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(TlsError::NoRoots);
        }
    }
    Ok(roots)
}

impl ClientTls {
    /// Set up TLS to `host` (a name or an IP address, as in the URL).
    pub fn new(cfg: &ClientTlsConfig, host: &str) -> Result<ClientTls, TlsError> {
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|_| TlsError::BadName(host.to_string()))?
            .to_owned();
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let mut config = if cfg.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
                .with_no_client_auth()
        } else {
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(cfg)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
            let pinned = match &cfg.cacert {
                Some(p) => ca_file(p)?,
                None => Vec::new(),
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier { webpki, pinned }))
                .with_no_client_auth()
        };
        let store = Arc::new(TicketPool::default());
        config.resumption = Resumption::store(store.clone());
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            name,
            store,
            token: None,
        })
    }

    /// Check that a CA file given with `--cacert` can be used, before any
    /// connection is made.
    pub fn check_cacert(path: &Path) -> Result<(), TlsError> {
        roots(&ClientTlsConfig {
            cacert: Some(path.to_path_buf()),
            insecure: false,
        })
        .map(|_| ())
    }

    /// The handshake on a control or data connection. Data connections
    /// resume the control connection's session with one of its tickets.
    pub async fn connect(&self, tcp: TcpStream, limit: Duration) -> std::io::Result<Stream> {
        let s = tokio::time::timeout(
            limit,
            self.connector
                .connect(self.name.clone(), crate::Counted::new(tcp)),
        )
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
        })??;
        Ok(Stream::Client(Box::new(s), Ledger::default()))
    }

    /// Send `token` first on every data connection from now on (the
    /// server accepted `OPTS TLS BIND`).
    pub fn bind(&mut self, token: [u8; crate::TOKEN_LEN]) {
        self.token = Some(token);
    }

    /// The handshake on a data connection, then the binding token if
    /// there is one. Without a token the server takes the connection only
    /// if it resumed the control connection's session (with one of the
    /// tickets in hand).
    pub async fn connect_data(&self, tcp: TcpStream, limit: Duration) -> std::io::Result<Stream> {
        use tokio::io::AsyncWriteExt;
        let mut s = self.connect(tcp, limit).await?;
        if let Some(t) = &self.token {
            s.write_all(t).await?;
            s.flush().await?;
        }
        Ok(s)
    }

    /// Session tickets in hand (each data connection uses one and is given
    /// two back).
    pub fn tickets(&self) -> usize {
        self.store.len()
    }
}

/// The session store of one control session. Unlike rustls' default cache
/// (8 tickets a server) it keeps as many tickets as the server hands out,
/// up to a bound: a transfer opens all its data connections at once, and
/// each needs a ticket of its own (TLS 1.3 tickets are used once).
#[derive(Default)]
struct TicketPool {
    inner: Mutex<PoolInner>,
}

#[derive(Default)]
struct PoolInner {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: VecDeque<Tls13ClientSessionValue>,
}

/// More than any server's stream limit; bounds memory (a ticket is a few
/// hundred bytes).
const MAX_TICKETS: usize = 1024;

impl fmt::Debug for TicketPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TicketPool({})", self.len())
    }
}

impl TicketPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn len(&self) -> usize {
        let g = self.lock();
        g.tls13.len() + usize::from(g.tls12.is_some())
    }
}

impl ClientSessionStore for TicketPool {
    fn set_kx_hint(&self, _: ServerName<'static>, group: NamedGroup) {
        self.lock().kx_hint = Some(group);
    }

    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        self.lock().kx_hint
    }

    fn set_tls12_session(&self, _: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.lock().tls12 = Some(value);
    }

    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.lock().tls12.clone()
    }

    fn remove_tls12_session(&self, _: &ServerName<'static>) {
        self.lock().tls12 = None;
    }

    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        let mut g = self.lock();
        if g.tls13.len() >= MAX_TICKETS {
            g.tls13.pop_front();
        }
        g.tls13.push_back(value);
    }

    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        // Newest first: the oldest are the likeliest to have expired.
        self.lock().tls13.pop_back()
    }
}

/// The usual verification (a chain to a trusted root, the name, the
/// dates), and one more way to trust a server: its certificate is itself
/// in the `--cacert` file. A self-signed server certificate made with
/// `openssl req -x509` is marked as a CA, which WebPKI refuses to accept
/// as a server's own; given as `--cacert` it is pinned, as curl accepts it
/// (its name is still checked).
#[derive(Debug)]
struct Verifier {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let r = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        if r.is_err()
            && self
                .pinned
                .iter()
                .any(|p| p.as_ref() == end_entity.as_ref())
        {
            let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, server_name)?;
            // Pinned is trusted as it is, not beyond its dates (as curl).
            check_dates(end_entity, now)?;
            return Ok(ServerCertVerified::assertion());
        }
        r
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// A certificate's validity period against `now`.
fn check_dates(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    use rustls::CertificateError;
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let v = c.validity();
    let t = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    if t < v.not_before.timestamp() {
        return Err(rustls::Error::InvalidCertificate(
            CertificateError::NotValidYet,
        ));
    }
    if t > v.not_after.timestamp() {
        return Err(rustls::Error::InvalidCertificate(CertificateError::Expired));
    }
    Ok(())
}

/// `--insecure`: any certificate is accepted, but the handshake's
/// signatures are still checked (the connection is encrypted, not
/// authenticated).
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
