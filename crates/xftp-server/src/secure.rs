//! TLS on data connections (PROT P): every data connection of a session
//! shakes hands before it carries a byte, and must resume the session's
//! TLS session unless the server was told otherwise.

use std::time::Duration;

use tokio::net::TcpStream;
use xftp_tls::server::{DataTlsError, Proof, SessionTls};
use xftp_tls::Stream;

/// The data-connection side of one session's TLS.
#[derive(Clone, Debug)]
pub(crate) struct DataTls {
    pub tls: SessionTls,
    pub proof: Proof,
    pub timeout: Duration,
    /// Hand out session tickets (where the client reads the connection).
    pub tickets: bool,
}

impl DataTls {
    /// The handshake on one connection.
    pub async fn wrap(&self, tcp: TcpStream) -> Result<Stream, DataTlsError> {
        let peer = tcp.peer_addr().ok();
        let r = self
            .tls
            .accept_data(tcp, self.timeout, self.proof, self.tickets)
            .await;
        if let Err(e) = &r {
            tracing::warn!(?peer, "data connection refused: {e}");
        }
        r
    }
}

/// Wrap one connection: TLS under `tls`, plain without.
pub(crate) async fn secure_one(
    tls: Option<&DataTls>,
    tcp: TcpStream,
) -> Result<Stream, DataTlsError> {
    match tls {
        Some(t) => t.wrap(tcp).await,
        None => Ok(Stream::Plain(tcp)),
    }
}

/// Wrap every connection: TLS handshakes all at once under `tls`, plain
/// connections as they are without it. Order is kept. Connections whose
/// handshake fails are left out; it is an error only if every one fails.
pub(crate) async fn secure_all(
    tls: Option<&DataTls>,
    conns: Vec<TcpStream>,
) -> Result<Vec<Stream>, DataTlsError> {
    let Some(tls) = tls else {
        return Ok(conns.into_iter().map(Stream::Plain).collect());
    };
    let mut set = tokio::task::JoinSet::new();
    let n = conns.len();
    for (i, c) in conns.into_iter().enumerate() {
        let tls = tls.clone();
        set.spawn(async move { (i, tls.wrap(c).await) });
    }
    let mut out: Vec<Option<Stream>> = (0..n).map(|_| None).collect();
    let mut failed = None;
    while let Some(r) = set.join_next().await {
        let (i, s) = r.map_err(|e| DataTlsError::Handshake(std::io::Error::other(e)))?;
        match s {
            Ok(s) => out[i] = Some(s),
            // One of several that fails its handshake carried nothing:
            // the transfer goes on without it, as without a connection
            // that never came. A client that started on the connections
            // whose handshakes were done drops a slow one when its
            // transfer is over (a small upload), and that must not fail
            // what the others carried.
            Err(e) => failed = Some(e),
        }
    }
    let secured: Vec<Stream> = out.into_iter().flatten().collect();
    match failed {
        Some(e) if secured.is_empty() => Err(e),
        Some(e) => {
            tracing::info!(
                left = n - secured.len(),
                "going on without data connections whose TLS handshake failed: {e}"
            );
            Ok(secured)
        }
        None => Ok(secured),
    }
}
