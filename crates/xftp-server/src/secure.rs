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

/// After the last handshake failed with no other under way, how long to
/// wait for another connection from the client's address: its own comes
/// within a round trip of the stranger's that took the slot first.
const AFTER_A_FAILED_HANDSHAKE: Duration = Duration::from_secs(2);

/// One passive data connection under TLS: the first connection from the
/// client's address whose handshake succeeds, `first` (accepted already)
/// or one accepted from `listener` while it shakes hands, within `limit`.
/// A stranger from that address (another process, a user behind the same
/// NAT) that connected first took the transfer's one slot, and its
/// failed or silent handshake failed the transfer (522, or after 30 s).
/// Its connection is closed; the error is the last handshake's.
pub(crate) async fn first_secured(
    tls: &DataTls,
    listener: &tokio::net::TcpListener,
    peer: std::net::IpAddr,
    first: TcpStream,
    limit: Duration,
) -> Result<Stream, DataTlsError> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut hs = tokio::task::JoinSet::new();
    let t = tls.clone();
    hs.spawn(async move { t.wrap(first).await });
    let mut last = None;
    let mut give_up = deadline;
    loop {
        tokio::select! {
            r = hs.join_next(), if !hs.is_empty() => {
                match r {
                    Some(Ok(Ok(s))) => return Ok(s),
                    Some(Ok(Err(e))) => last = Some(e),
                    Some(Err(e)) => last = Some(DataTlsError::Handshake(std::io::Error::other(e))),
                    None => {}
                }
                if hs.is_empty() {
                    give_up = deadline.min(tokio::time::Instant::now() + AFTER_A_FAILED_HANDSHAKE);
                }
            }
            c = crate::data::accept_from_peer(listener, peer) => match c {
                Ok(c) => {
                    let t = tls.clone();
                    hs.spawn(async move { t.wrap(c).await });
                    give_up = deadline;
                }
                // Out of descriptors, say: no busy loop.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            () = tokio::time::sleep_until(give_up) => {
                return Err(last.unwrap_or_else(|| {
                    DataTlsError::Handshake(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no data connection finished its handshake in time",
                    ))
                }));
            }
        }
    }
}

/// TLS handshakes of data connections still under way when their
/// transfer started (see [`secure_early`]); the transfer adopts each as it
/// is done ([`Live::join_rest`](crate::live::Live::join_rest)).
pub(crate) type Handshakes = tokio::task::JoinSet<(usize, Result<Stream, DataTlsError>)>;

/// What [`secure_early`] returns.
pub(crate) struct Secured {
    /// The connections secured before the start, in the order given.
    pub conns: Vec<Stream>,
    /// The handshakes still under way.
    pub handshakes: Option<Handshakes>,
    /// Connections whose handshake failed (left out).
    pub failed: usize,
}

/// Wrap every connection: TLS handshakes all at once under `tls`, plain
/// connections as they are without it. Connections whose handshake fails
/// are left out; it is an error only if every one fails.
///
/// With `early`, return once the first handshake is done and the others
/// have had `early` more; the rest go on as [`Handshakes`]. One handshake
/// that loses a segment waits a retransmission timeout (a second at the
/// start of a connection), and the transfer need not wait with it.
pub(crate) async fn secure_early(
    tls: Option<&DataTls>,
    conns: Vec<TcpStream>,
    early: Option<Duration>,
) -> Result<Secured, DataTlsError> {
    let Some(tls) = tls else {
        return Ok(Secured {
            conns: conns.into_iter().map(Stream::Plain).collect(),
            handshakes: None,
            failed: 0,
        });
    };
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in conns.into_iter().enumerate() {
        let tls = tls.clone();
        set.spawn(async move { (i, tls.wrap(c).await) });
    }
    let mut out: Vec<(usize, Stream)> = Vec::new();
    let (mut failed, mut last_error) = (0, None);
    let mut wait = xftp_stripe::EarlyStart::new(early);
    while let Some(Some(r)) = wait.next(set.join_next()).await {
        let (i, s) = r.map_err(|e| DataTlsError::Handshake(std::io::Error::other(e)))?;
        match s {
            Ok(s) => {
                out.push((i, s));
                wait.got_one();
            }
            // One of several that fails its handshake carried nothing:
            // the transfer goes on without it, as without a connection
            // that never came. A client that started on the connections
            // whose handshakes were done drops a slow one when its
            // transfer is over (a small upload), and that must not fail
            // what the others carried.
            Err(e) => {
                failed += 1;
                last_error = Some(e);
            }
        }
    }
    out.sort_by_key(|(i, _)| *i);
    let conns: Vec<Stream> = out.into_iter().map(|(_, s)| s).collect();
    if let Some(e) = last_error {
        if conns.is_empty() {
            return Err(e);
        }
        tracing::info!(
            left = failed,
            "going on without data connections whose TLS handshake failed: {e}"
        );
    }
    if !set.is_empty() {
        tracing::debug!(
            late = set.len(),
            "starting before every data connection's TLS handshake is done"
        );
    }
    Ok(Secured {
        conns,
        handshakes: (!set.is_empty()).then_some(set),
        failed,
    })
}
