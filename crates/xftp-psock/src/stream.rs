//! The logical stream over a group of connections.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::{lookup_host, TcpStream, ToSocketAddrs};
use tokio::task::JoinSet;
use xftp_stripe::{Receiver, Sender, StreamStats};
use xftp_tls::Stream;

use crate::direct::Direct;
use crate::handshake::{self, Hello, Reply, SessionId, Status};
use crate::{PsockConfig, PsockError, PsockTls};

/// One ordered, reliable, bidirectional byte stream over N TCP
/// connections.
///
/// * Writes are batched into records and sent on whichever connection can
///   take them; `flush` hands partial records out too.
/// * `shutdown` ends this direction gracefully: every byte written is
///   delivered, then the peer reads end-of-stream. Reading continues to
///   work until the peer shuts down its side.
/// * A reset or premature close of any connection is an error on reads
///   and writes; dropping the stream closes every connection, so the peer
///   gets an error, never a silently truncated stream.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use xftp_psock::{PsockConfig, PsockListener, PsockStream};
/// let cfg = PsockConfig::default();
/// let mut l = PsockListener::bind("127.0.0.1:0", cfg.clone()).await?;
/// let addr = l.local_addr();
/// let (a, b) = tokio::join!(PsockStream::connect(addr, 2, &cfg), l.accept());
/// let (mut a, mut b) = (a?, b?);
/// assert_eq!(b.streams(), 2);
/// a.write_all(b"ping").await?;
/// a.flush().await?;
/// let mut buf = [0u8; 4];
/// b.read_exact(&mut buf).await?;
/// assert_eq!(&buf, b"ping");
/// # Ok(()) }
/// ```
pub struct PsockStream {
    path: Path,
    session: SessionId,
    n: usize,
    version: u8,
}

/// How bytes move: through the striping engine over several connections,
/// or straight between the application and the one socket of a group of
/// one ([`Direct`]).
enum Path {
    Engine {
        tx: Sender<WriteHalf<Stream>>,
        rx: Receiver<ReadHalf<Stream>>,
    },
    Direct(Box<Direct>),
}

impl PsockStream {
    /// Open a group of `n` connections to `addr` and wait until the
    /// listener has accepted every one of them.
    pub async fn connect(
        addr: impl ToSocketAddrs,
        n: u16,
        cfg: &PsockConfig,
    ) -> Result<Self, PsockError> {
        if n == 0 || n > handshake::MAX_STREAMS {
            return Err(PsockError::Invalid("number of connections"));
        }
        // Resolve once so every connection goes to the same address.
        let addr = lookup_host(addr)
            .await
            .map_err(PsockError::io("resolving the address"))?
            .next()
            .ok_or(PsockError::Invalid("address resolves to nothing"))?;
        let session = SessionId::random().map_err(PsockError::io("reading /dev/urandom"))?;
        let own = cfg.send_record(n);
        let mut set = JoinSet::new();
        for index in 0..n {
            let hello = Hello {
                min_version: handshake::MIN_VERSION,
                max_version: handshake::MAX_VERSION,
                session,
                index,
                count: n,
                record_size: own,
            };
            let timeout = cfg.handshake_timeout;
            let tls = match &cfg.tls {
                Some(PsockTls::Client(t)) => Some(t.clone()),
                // A listener's certificate on the connecting side: going
                // on in clear would betray who asked for TLS.
                Some(PsockTls::Server(_)) => {
                    return Err(PsockError::Tls(
                        "a server certificate is for the listening side; connect with a client TLS config (PsockTls::Client)".into(),
                    ))
                }
                None => None,
            };
            set.spawn(async move {
                let r = tokio::time::timeout(timeout, open_one(addr, hello, tls)).await;
                (index, r.unwrap_or(Err(PsockError::Timeout)))
            });
        }
        let mut conns: Vec<Option<Stream>> = (0..n).map(|_| None).collect();
        let mut peer_record = None;
        let mut version = handshake::MAX_VERSION;
        while let Some(j) = set.join_next().await {
            let (index, r) = j.map_err(|e| PsockError::Io {
                context: "connection task",
                source: io::Error::other(e),
            })?;
            // Dropping `set` on error aborts and closes the others; the
            // listener then drops the incomplete group.
            let (s, reply) = r.map_err(|e| match e {
                PsockError::Timeout => PsockError::GroupTimeout {
                    ready: conns.iter().flatten().count() as u16,
                    count: n,
                },
                e => e,
            })?;
            if reply.record_size > cfg.max_peer_record() {
                return Err(PsockError::Invalid(
                    "peer record size exceeds our reorder cap",
                ));
            }
            if *peer_record.get_or_insert(reply.record_size) != reply.record_size {
                return Err(PsockError::Invalid(
                    "peer changed record size within a group",
                ));
            }
            version = version.min(reply.version);
            conns[index as usize] = Some(s);
        }
        let conns: Vec<Stream> = conns.into_iter().flatten().collect();
        Ok(Self::from_group(
            conns,
            session,
            cfg,
            own,
            peer_record.unwrap_or(own),
            version,
        ))
    }

    /// Build the stream from an ordered, complete group.
    pub(crate) fn from_group(
        conns: Vec<Stream>,
        session: SessionId,
        cfg: &PsockConfig,
        own_record: u32,
        peer_record: u32,
        version: u8,
    ) -> Self {
        let n = conns.len();
        let path = match <[Stream; 1]>::try_from(conns) {
            Ok([c]) => Path::Direct(Box::new(Direct::new(c, own_record, peer_record))),
            Err(conns) => {
                let (r, w): (Vec<_>, Vec<_>) = conns.into_iter().map(tokio::io::split).unzip();
                Path::Engine {
                    tx: Sender::stream(w, own_record, cfg.send_buffer),
                    rx: Receiver::stream(r, peer_record, cfg.reorder_cap),
                }
            }
        };
        Self {
            path,
            session,
            n,
            version,
        }
    }

    /// Number of TCP connections in the group.
    pub fn streams(&self) -> usize {
        self.n
    }

    /// The protocol version the group speaks (the highest both ends
    /// know: 1 with an older peer).
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The group's session id.
    pub fn session_id(&self) -> SessionId {
        self.session
    }

    /// Payload bytes sent so far, per connection.
    pub fn sent_stats(&self) -> Vec<StreamStats> {
        match &self.path {
            Path::Engine { tx, .. } => tx.stats(),
            Path::Direct(d) => d.sent_stats(),
        }
    }

    /// Payload bytes received so far, per connection.
    pub fn received_stats(&self) -> Vec<StreamStats> {
        match &self.path {
            Path::Engine { rx, .. } => rx.stats(),
            Path::Direct(d) => d.received_stats(),
        }
    }

    /// The most bytes the reorder buffer ever held, and its cap (0, 0 on
    /// one connection, where records go straight to the application).
    pub fn reorder_usage(&self) -> (u64, u64) {
        match &self.path {
            Path::Engine { rx, .. } => rx.reorder_usage(),
            Path::Direct(_) => (0, 0),
        }
    }
}

async fn open_one(
    addr: std::net::SocketAddr,
    hello: Hello,
    tls: Option<xftp_tls::client::ClientTls>,
) -> Result<(Stream, Reply), PsockError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(PsockError::io("connecting"))?;
    // Records are flushed as whole writes; small flushed writes should
    // not wait for Nagle.
    tcp.set_nodelay(true)
        .map_err(PsockError::io("TCP_NODELAY"))?;
    crate::keepalive(&tcp);
    let mut s = match tls {
        None => Stream::Plain(tcp),
        // The handshake's own timeout is the caller's (handshake_timeout).
        Some(t) => t
            .connect(tcp, std::time::Duration::from_secs(3600))
            .await
            .map_err(|e| PsockError::Tls(xftp_tls::explain_handshake_error(&e)))?,
    };
    s.write_all(&hello.encode())
        .await
        .map_err(PsockError::io("sending hello"))?;
    s.flush().await.map_err(PsockError::io("sending hello"))?;
    let mut b = [0u8; handshake::REPLY_LEN];
    let plain = !s.is_tls();
    s.read_exact(&mut b).await.map_err(|e| {
        if plain && e.kind() == io::ErrorKind::UnexpectedEof {
            PsockError::Tls(
                "the listener closed the connection without a reply: it may want TLS (add --tls, --cacert FILE or --insecure)".into(),
            )
        } else {
            PsockError::io("reading the listener's reply")(e)
        }
    })?;
    // An FTP server greets first ("220 ..."): said as such.
    if b[..3].iter().all(u8::is_ascii_digit) && matches!(b[3], b' ' | b'-') {
        return Err(PsockError::Foreign(
            "it greeted like an FTP server: `xftp send`/`recv` talk to each other (for an FTP server, use `xftp get`/`put`)",
        ));
    }
    let reply = Reply::decode(&b)?.ok_or(PsockError::Timeout)?;
    if reply.status != Status::Ok {
        return Err(PsockError::Rejected {
            index: hello.index,
            status: reply.status,
        });
    }
    if reply.version < handshake::MIN_VERSION || reply.version > hello.max_version {
        return Err(PsockError::Invalid(
            "listener chose a version we do not speak",
        ));
    }
    Ok((s, reply))
}

impl AsyncRead for PsockStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().path {
            Path::Engine { rx, .. } => rx.poll_read(cx, buf),
            Path::Direct(d) => d.poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PsockStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().path {
            Path::Engine { tx, .. } => tx.poll_write(cx, buf),
            Path::Direct(d) => d.poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().path {
            Path::Engine { tx, .. } => tx.poll_flush(cx),
            Path::Direct(d) => d.poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().path {
            Path::Engine { tx, .. } => tx.poll_close(cx),
            Path::Direct(d) => d.poll_shutdown(cx),
        }
    }
}

impl std::fmt::Debug for PsockStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsockStream")
            .field("session", &self.session)
            .field("streams", &self.n)
            .finish()
    }
}
