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
    Server(Box<tokio_rustls::server::TlsStream<Counted>>, Ledger),
    /// TLS, this end the client.
    Client(Box<tokio_rustls::client::TlsStream<Counted>>, Ledger),
}

/// The TCP socket under a TLS stream. It counts every byte the TLS layer
/// hands it, so the position in the socket's byte stream after each write
/// is known exactly ([`Ledger`]), and it takes every byte: what the socket
/// cannot take yet waits here, in order, rather than in rustls's buffer,
/// which would hide how much it holds. A [`Stream`] write first drains
/// what waits and then hands TLS at most [`TLS_WRITE`] bytes, so this
/// holds at most one such write's ciphertext, as rustls's buffer did.
#[derive(Debug)]
pub struct Counted {
    tcp: TcpStream,
    /// Ciphertext handed over and not yet in the socket: `out[at..]`.
    out: Vec<u8>,
    at: usize,
    /// Bytes handed over since the connection opened, the handshake's
    /// included.
    given: u64,
}

impl Counted {
    /// Count what goes into `tcp`.
    pub fn new(tcp: TcpStream) -> Self {
        Counted {
            tcp,
            out: Vec::new(),
            at: 0,
            given: 0,
        }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn waiting(&self) -> bool {
        self.at < self.out.len()
    }

    /// Write what waits into the socket; ready once nothing does.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.waiting() {
            let n =
                std::task::ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.at += n;
        }
        self.out.clear();
        self.at = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    /// Always takes all of `buf`: into the socket as far as it takes it,
    /// the rest after what already waits.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        let mut taken = 0;
        if !this.waiting() {
            match Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs) {
                Poll::Ready(Ok(n)) => taken = n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        let mut total = 0;
        for b in bufs {
            let skip = taken.min(b.len());
            taken -= skip;
            this.out.extend_from_slice(&b[skip..]);
            total += b.len();
        }
        this.given += total as u64;
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

/// Which plaintext bytes written to a TLS stream its peer has
/// acknowledged: the endgame's question ([`xftp_stripe::Probe`]).
///
/// The kernel counts ciphertext, of another length than the plaintext
/// (record headers and tags). So the ledger keeps *marks*, after every
/// write: (plaintext written, the socket's stream position at the end of
/// its ciphertext). [`Counted`] takes every byte TLS produces, so that
/// position is exact, and anything else the TLS layer sent (a key update)
/// is counted where it went. The plaintext of a mark whose position the
/// peer acknowledged (`tcpi_bytes_acked`) is delivered. The kernel's
/// count and ours start apart by what the kernel counts of the handshake
/// (the SYN); the offset is read once, at a write after which nothing
/// waits in [`Counted`], with the socket's queue read first, so it can
/// read high, never low: a mark never claims more than was delivered.
/// Marks are kept only once a probe has been asked for, and cost no
/// system call.
#[derive(Clone, Debug, Default)]
pub struct Ledger(Arc<Mutex<Book>>);

#[derive(Debug, Default)]
struct Book {
    /// What the kernel's count of bytes taken is ahead of [`Counted`]'s.
    offset: Option<u64>,
    /// Plaintext written.
    plain: u64,
    /// Plaintext known delivered.
    delivered: u64,
    /// (plaintext, position in the kernel's count), oldest first.
    marks: VecDeque<(u64, u64)>,
    /// A probe was handed out: keep marks.
    tracking: bool,
    /// The kernel could not tell: no answers.
    blind: bool,
}

/// Marks kept at most; past that every other one goes (coarser, still
/// never more than was delivered).
const MAX_MARKS: usize = 4096;

/// The most plaintext one [`Stream`] write hands TLS: what [`Counted`]
/// may hold is one such write's ciphertext (rustls's own buffer limit).
pub const TLS_WRITE: usize = 64 * 1024;

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `n` plaintext bytes went in, and all their ciphertext is in `c`
    /// (`exact`: rustls holds none).
    fn wrote(&self, c: &Counted, n: usize, exact: bool) {
        let mut b = self.lock();
        b.plain += n as u64;
        if !b.tracking || !exact || b.blind {
            return;
        }
        let offset = match b.offset {
            Some(o) => o,
            // With nothing waiting in `c`, the kernel has taken every
            // byte `c` was given: the difference is the offset.
            None if !c.waiting() => {
                match xftp_stripe::socket_bytes(std::os::fd::AsFd::as_fd(&c.tcp)) {
                    Some(k) => *b.offset.insert(k.taken.saturating_sub(c.given)),
                    None => {
                        b.blind = true;
                        return;
                    }
                }
            }
            None => return,
        };
        let mark = (b.plain, c.given + offset);
        if b.marks.back().is_some_and(|m| m.0 >= mark.0) {
            return;
        }
        b.marks.push_back(mark);
        if b.marks.len() > MAX_MARKS {
            let thinned = b.marks.iter().copied().skip(1).step_by(2).collect();
            b.marks = thinned;
        }
    }
}

/// The endgame's probe of a TLS connection: the kernel's answers for its
/// socket, with the bytes not yet acknowledged counted in plaintext
/// through the [`Ledger`].
struct TlsProbe {
    tcp: Box<dyn xftp_stripe::Probe>,
    ledger: Ledger,
}

impl xftp_stripe::Probe for TlsProbe {
    fn delivery(&self) -> Option<xftp_stripe::Delivery> {
        let mut d = self.tcp.delivery()?;
        // tcpi_bytes_acked: the kernel's count of bytes acknowledged.
        let acked = d.progress?;
        let mut b = self.ledger.lock();
        if b.blind {
            return None;
        }
        while let Some(&(plain, at)) = b.marks.front() {
            if at > acked {
                break;
            }
            b.delivered = plain;
            b.marks.pop_front();
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
            Stream::Server(s, _) => s.get_ref().0.tcp(),
            Stream::Client(s, _) => s.get_ref().0.tcp(),
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
        let (io, conn) = s.get_mut();
        let tcp = &io.tcp;
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
            Stream::Server(s, l) => tls_write(s, l, cx, buf),
            Stream::Client(s, l) => tls_write(s, l, cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s, l) => tls_write_vectored(s, l, cx, bufs),
            Stream::Client(s, l) => tls_write_vectored(s, l, cx, bufs),
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
            Stream::Server(s, _) => Pin::new(s).poll_flush(cx),
            Stream::Client(s, _) => Pin::new(s).poll_flush(cx),
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
    fn counted(&self) -> &Counted;
    fn counted_mut(&mut self) -> &mut Counted;
    /// rustls holds ciphertext not yet handed to [`Counted`].
    fn wants_write(&self) -> bool;
}

/// The same for both rustls stream types (their connection types differ,
/// their methods do not).
macro_rules! tls_side {
    ($($side:ty),*) => {$(
        impl TlsSide for Box<$side> {
            fn counted(&self) -> &Counted {
                self.get_ref().0
            }
            fn counted_mut(&mut self) -> &mut Counted {
                self.get_mut().0
            }
            fn wants_write(&self) -> bool {
                self.get_ref().1.wants_write()
            }
        }
    )*};
}

tls_side!(
    tokio_rustls::server::TlsStream<Counted>,
    tokio_rustls::client::TlsStream<Counted>
);

/// The first slices of `bufs` up to `max` bytes in all.
fn at_most<'b>(bufs: &'b [io::IoSlice<'_>], max: usize) -> Vec<io::IoSlice<'b>> {
    let mut left = max;
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if left == 0 {
            break;
        }
        let k = b.len().min(left);
        out.push(io::IoSlice::new(&b[..k]));
        left -= k;
    }
    out
}

/// A write through TLS of at most [`TLS_WRITE`] bytes of `buf`.
fn tls_write<S: TlsSide>(
    s: &mut S,
    l: &Ledger,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    let buf = &buf[..buf.len().min(TLS_WRITE)];
    ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write(cx, buf))
}

/// A vectored write through TLS of at most [`TLS_WRITE`] bytes of `bufs`.
fn tls_write_vectored<S: TlsSide>(
    s: &mut S,
    l: &Ledger,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let bufs = at_most(bufs, TLS_WRITE);
    ledgered(s, l, cx, |s, cx| Pin::new(s).poll_write_vectored(cx, &bufs))
}

/// A plaintext write through TLS, entered in the ledger: what waits in
/// [`Counted`] goes first, so that it holds at most one write's
/// ciphertext.
fn ledgered<S: TlsSide>(
    s: &mut S,
    l: &Ledger,
    cx: &mut Context<'_>,
    write: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<usize>>,
) -> Poll<io::Result<usize>> {
    std::task::ready!(s.counted_mut().poll_drain(cx))?;
    let n = std::task::ready!(write(s, cx))?;
    l.wrote(s.counted(), n, !s.wants_write());
    Poll::Ready(Ok(n))
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.tcp().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whatever the socket takes at each call, `Counted` takes every byte,
    /// keeps them in order, and counts them all: the reader gets exactly
    /// what was given, in order, once it reads.
    #[tokio::test]
    async fn counted_keeps_order_and_count_when_the_socket_is_full() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_send_buffer_size(8192).unwrap();
        let a = sock.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut b, _) = l.accept().await.unwrap();
        let mut c = Counted::new(a);
        // Slices of varied sizes, several per call, far beyond what the
        // socket and the unread peer hold.
        let mut want = Vec::new();
        let mut seed = 7u32;
        for _ in 0..200 {
            let mut parts = Vec::new();
            for _ in 0..3 {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let len = (seed >> 16) as usize % 9000;
                parts.push(
                    (0..len)
                        .map(|i| (i as u32 ^ seed) as u8)
                        .collect::<Vec<u8>>(),
                );
            }
            let slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
            let n = std::future::poll_fn(|cx| Pin::new(&mut c).poll_write_vectored(cx, &slices))
                .await
                .unwrap();
            assert_eq!(n, parts.iter().map(Vec::len).sum::<usize>(), "all taken");
            parts.iter().for_each(|p| want.extend_from_slice(p));
        }
        assert_eq!(c.given, want.len() as u64);
        assert!(c.waiting(), "the socket could not have taken it all");
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            got
        });
        c.shutdown().await.unwrap();
        assert!(!c.waiting());
        assert!(
            reader.await.unwrap() == want,
            "other bytes or another order"
        );
    }
}
