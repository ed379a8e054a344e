//! One connection type for plain TCP and TLS.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A control or data connection: plain TCP, or TLS as either side.
///
/// Reads and writes go through TLS when it is on; [`Stream::tcp`] and
/// `AsRawFd` reach the TCP socket beneath, for socket options and
/// `TCP_INFO` (never for reading or writing payload).
#[derive(Debug)]
pub enum Stream {
    /// No TLS.
    Plain(TcpStream),
    /// TLS, this end the server.
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>, Ledger),
    /// TLS, this end the client.
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>, Ledger),
}

/// Which plaintext bytes written to a TLS stream its peer has
/// acknowledged: the endgame's question ([`xftp_stripe::Probe`]).
///
/// The kernel counts ciphertext, of another length than the plaintext
/// (record headers and tags), and part of what was written may still wait
/// in rustls's buffer. So the ledger keeps *marks*, after every write:
/// (plaintext written, ciphertext the socket has taken, plus what rustls
/// may still hold). After a write that left rustls nothing to send the
/// pair is exact; otherwise rustls holds at most its buffer limit
/// (64 KiB, set on the stream) and the overhead of the records in it, and the mark
/// counts that much more. The plaintext of a mark whose ciphertext the
/// peer acknowledged is delivered. Anything else the TLS layer sent in
/// between (a key update, an alert) only makes a mark's ciphertext
/// larger, so a mark never claims more than was delivered. Marks are kept
/// only once a probe has been asked for.
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<Book>>);

#[derive(Debug, Default)]
struct Book {
    /// Ciphertext the socket had taken before the first plaintext byte
    /// (the handshake, session tickets).
    base: Option<u64>,
    /// Plaintext written.
    plain: u64,
    /// Plaintext known delivered.
    delivered: u64,
    /// (plaintext, ciphertext since `base`), oldest first.
    marks: VecDeque<(u64, u64)>,
    /// A probe was handed out: keep marks.
    tracking: bool,
    /// The kernel could not tell: no answers.
    blind: bool,
}

/// Marks kept at most; past that every other one goes (coarser, still
/// never more than was delivered).
const MAX_MARKS: usize = 4096;

/// The TLS layer's send buffer limit, set on every stream that keeps a
/// ledger (rustls's default).
const TLS_BUFFER: usize = 64 * 1024;

/// What rustls may hold beyond its limit: it limits the plaintext it
/// takes, and each record of it grows by at most 29 bytes (TLS 1.2
/// AES-GCM: header, explicit nonce, tag), at most five records of 16 KiB
/// for one write that fills the buffer; rounded up.
const TLS_BUFFER_SLACK: u64 = 1024;

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before plaintext goes in: the ciphertext already taken is the base.
    fn start(&self, tcp: &TcpStream) {
        let mut b = self.lock();
        if b.base.is_none() && !b.blind {
            match xftp_stripe::socket_bytes(std::os::fd::AsFd::as_fd(tcp)) {
                Some(k) => b.base = Some(k.taken),
                None => b.blind = true,
            }
        }
    }

    /// `n` plaintext bytes went in; `flushed`: rustls holds no ciphertext.
    fn wrote(&self, tcp: &TcpStream, n: usize, flushed: bool) {
        let mut b = self.lock();
        b.plain += n as u64;
        let held = if flushed {
            0
        } else {
            TLS_BUFFER as u64 + TLS_BUFFER_SLACK
        };
        b.mark(tcp, held);
    }

    /// Everything written is in the kernel (a flush completed).
    fn flushed(&self, tcp: &TcpStream) {
        self.lock().mark(tcp, 0);
    }
}

impl Book {
    /// A mark for the plaintext so far: the ciphertext the socket has
    /// taken and `held`, at most what rustls still holds.
    fn mark(&mut self, tcp: &TcpStream, held: u64) {
        let (true, Some(base)) = (self.tracking, self.base) else {
            return;
        };
        let Some(k) = xftp_stripe::socket_bytes(std::os::fd::AsFd::as_fd(tcp)) else {
            self.blind = true;
            return;
        };
        let ct = (k.taken + held).saturating_sub(base);
        // A mark for more plaintext at no more ciphertext makes the
        // earlier ones useless (an exact mark after bounded ones).
        while self.marks.back().is_some_and(|m| m.1 >= ct) {
            self.marks.pop_back();
        }
        if self.marks.back().is_some_and(|m| m.0 >= self.plain) {
            return;
        }
        self.marks.push_back((self.plain, ct));
        if self.marks.len() > MAX_MARKS {
            let thinned = self.marks.iter().copied().skip(1).step_by(2).collect();
            self.marks = thinned;
        }
    }
}

/// The endgame's probe of a TLS connection: the kernel's answers for its
/// socket, with the bytes not yet acknowledged counted in plaintext
/// through the [`Ledger`].
struct TlsProbe {
    tcp: Box<dyn xftp_stripe::Probe>,
    fd: std::os::fd::OwnedFd,
    ledger: Ledger,
}

impl xftp_stripe::Probe for TlsProbe {
    fn delivery(&self) -> Option<xftp_stripe::Delivery> {
        let mut d = self.tcp.delivery()?;
        let k = xftp_stripe::socket_bytes(std::os::fd::AsFd::as_fd(&self.fd))?;
        let mut b = self.ledger.lock();
        if b.blind {
            return None;
        }
        if let Some(base) = b.base {
            let acked = k.acked.saturating_sub(base);
            while let Some(&(plain, ct)) = b.marks.front() {
                if ct > acked {
                    break;
                }
                b.delivered = plain;
                b.marks.pop_front();
            }
        }
        d.outq = b.plain - b.delivered;
        Some(d)
    }

    fn reset_on_close(&self) {
        self.tcp.reset_on_close();
    }
}

/// What a TLS connection negotiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    /// "TLSv1.3" or "TLSv1.2".
    pub version: String,
    /// The cipher suite, e.g. "TLS13_AES_256_GCM_SHA384".
    pub cipher: String,
    /// The handshake resumed an earlier session.
    pub resumed: bool,
}

fn info_of(c: &rustls::CommonState) -> TlsInfo {
    let version = match c.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
        Some(v) => format!("{v:?}"),
        None => "unknown".to_string(),
    };
    let cipher = c
        .negotiated_cipher_suite()
        .map(|s| format!("{:?}", s.suite()))
        .unwrap_or_else(|| "unknown".to_string());
    TlsInfo {
        version,
        cipher,
        resumed: c.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
    }
}

impl Stream {
    /// The TCP socket beneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Server(s, _) => s.get_ref().0,
            Stream::Client(s, _) => s.get_ref().0,
        }
    }

    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Stream::Plain(_))
    }

    /// What TLS negotiated, `None` for plain TCP.
    pub fn tls_info(&self) -> Option<TlsInfo> {
        match self {
            Stream::Plain(_) => None,
            Stream::Server(s, _) => Some(info_of(s.get_ref().1)),
            Stream::Client(s, _) => Some(info_of(s.get_ref().1)),
        }
    }

    /// The plain TCP stream, if TLS is off.
    pub fn into_plain(self) -> Result<TcpStream, Stream> {
        match self {
            Stream::Plain(s) => Ok(s),
            other => Err(other),
        }
    }

    /// Hand TLS records that have already arrived to rustls without
    /// blocking. A client that only writes on a connection (an upload)
    /// never reads the session tickets the server sends after the
    /// handshake; doing this before closing keeps them for the next data
    /// connections (see [`crate::client::ClientTls`]).
    fn absorb_pending(&mut self) {
        let Stream::Client(s, _) = self else { return };
        let (tcp, conn) = s.get_mut();
        let mut buf = [0u8; 4096];
        for _ in 0..16 {
            match tcp.try_read(&mut buf) {
                Ok(n @ 1..) => {
                    let mut rd = &buf[..n];
                    while !rd.is_empty() {
                        if conn.read_tls(&mut rd).is_err() {
                            return;
                        }
                        if conn.process_new_packets().is_err() {
                            return;
                        }
                    }
                }
                _ => return,
            }
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Stream::Plain(s)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s, _) => Pin::new(s).poll_read(cx, buf),
            Stream::Client(s, _) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

/// Plain connections send file pages straight from the page cache; TLS
/// must encrypt them in user space first.
impl xftp_stripe::DataSocket for Stream {
    fn can_send_file(&self) -> bool {
        matches!(self, Stream::Plain(_))
    }

    fn poll_send_file(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hdr: &[u8],
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_send_file(cx, hdr, fd, offset, len),
            _ => Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
        }
    }

    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self.tcp()))
    }

    /// Under TLS the kernel's queue holds ciphertext: the [`Ledger`] turns
    /// it into plaintext.
    fn probe(&self) -> Option<Box<dyn xftp_stripe::Probe>> {
        let ledger = match self {
            Stream::Plain(s) => return s.probe(),
            Stream::Server(_, l) | Stream::Client(_, l) => l,
        };
        let tcp = self.tcp();
        let probe = TlsProbe {
            tcp: tcp.probe()?,
            fd: std::os::fd::AsFd::as_fd(tcp).try_clone_to_owned().ok()?,
            ledger: ledger.clone(),
        };
        let mut b = ledger.lock();
        if b.blind {
            return None;
        }
        b.tracking = true;
        drop(b);
        Some(Box::new(probe))
    }

    fn can_splice_in(&self) -> bool {
        match self {
            Stream::Plain(s) => s.can_splice_in(),
            _ => false,
        }
    }

    fn poll_splice_in(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &xftp_stripe::Pipe,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_splice_in(cx, pipe, len),
            _ => Poll::Ready(Err(io::ErrorKind::Unsupported.into())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s, l) => ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write(cx, buf)),
            Stream::Client(s, l) => ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write(cx, buf)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s, l) => {
                ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write_vectored(cx, bufs))
            }
            Stream::Client(s, l) => {
                ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write_vectored(cx, bufs))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Server(s, _) => s.is_write_vectored(),
            Stream::Client(s, _) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s, l) => {
                std::task::ready!(Pin::new(&mut **s).poll_flush(cx))?;
                l.flushed(s.get_ref().0);
                Poll::Ready(Ok(()))
            }
            Stream::Client(s, l) => {
                std::task::ready!(Pin::new(&mut **s).poll_flush(cx))?;
                l.flushed(s.get_ref().0);
                Poll::Ready(Ok(()))
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.absorb_pending();
        match this {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s, _) => Pin::new(s).poll_shutdown(cx),
            Stream::Client(s, _) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A TLS stream of either side, as [`ledgered`] needs it.
trait TlsSide: AsyncWrite + Unpin {
    fn tcp(&self) -> &TcpStream;
    /// Hold at most `bytes` of ciphertext not yet written.
    fn limit_buffer(&mut self, bytes: usize);
    /// rustls holds ciphertext not yet written to the socket.
    fn wants_write(&self) -> bool;
}

/// The same for both rustls stream types (their connection types differ,
/// their methods do not).
macro_rules! tls_side {
    ($($side:ty),*) => {$(
        impl TlsSide for Box<$side> {
            fn tcp(&self) -> &TcpStream {
                self.get_ref().0
            }
            fn limit_buffer(&mut self, bytes: usize) {
                self.get_mut().1.set_buffer_limit(Some(bytes));
            }
            fn wants_write(&self) -> bool {
                self.get_ref().1.wants_write()
            }
        }
    )*};
}

tls_side!(
    tokio_rustls::server::TlsStream<TcpStream>,
    tokio_rustls::client::TlsStream<TcpStream>
);

/// A plaintext write through TLS, entered in the ledger. The first one
/// waits until the handshake's last ciphertext is in the kernel (a
/// flush), so that the ledger's base is exact.
fn ledgered<S: TlsSide>(
    s: &mut S,
    l: &Ledger,
    cx: &mut Context<'_>,
    write: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<usize>>,
) -> Poll<io::Result<usize>> {
    let unstarted = {
        let b = l.lock();
        b.base.is_none() && !b.blind
    };
    if unstarted {
        std::task::ready!(Pin::new(&mut *s).poll_flush(cx))?;
        s.limit_buffer(TLS_BUFFER);
        l.start(s.tcp());
    }
    let n = std::task::ready!(write(s, cx))?;
    l.wrote(s.tcp(), n, !s.wants_write());
    Poll::Ready(Ok(n))
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.tcp().as_fd()
    }
}
