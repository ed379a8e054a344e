//! One connection type for plain TCP and TLS.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
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
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// TLS, this end the client.
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
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
            Stream::Server(s) => s.get_ref().0,
            Stream::Client(s) => s.get_ref().0,
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
            Stream::Server(s) => Some(info_of(s.get_ref().1)),
            Stream::Client(s) => Some(info_of(s.get_ref().1)),
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
        let Stream::Client(s) = self else { return };
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
            Stream::Server(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_read(cx, buf),
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

    /// Under TLS the kernel's queue holds ciphertext, of another length
    /// than the payload written, and part of what was written may still
    /// wait in the TLS layer: what the socket acknowledged does not say
    /// which records were delivered, so no answer is given.
    fn probe(&self) -> Option<Box<dyn xftp_stripe::Probe>> {
        match self {
            Stream::Plain(s) => s.probe(),
            _ => None,
        }
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
            Stream::Server(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Server(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Client(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Server(s) => s.is_write_vectored(),
            Stream::Client(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s).poll_flush(cx),
            Stream::Client(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.absorb_pending();
        match this {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.tcp().as_fd()
    }
}
