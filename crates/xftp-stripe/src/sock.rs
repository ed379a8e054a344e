//! What the engine may ask of a data connection beyond reading and
//! writing ([`DataSocket`]): send file pages without a copy, receive into
//! a file without one ([`Pipe`]), and the TCP socket underneath, whose kernel state tells what it has delivered.
//!
//! **sendfile.** A record read into a buffer and written to a socket is
//! copied twice in user space's name (file to buffer, buffer to socket)
//! and, read in the blocking pool, costs two thread wake-ups. `sendfile`
//! hands the kernel the file's pages instead: the socket takes them by
//! reference. It only works where the socket carries the file's bytes as
//! they are: plain TCP, not TLS. The block header goes first with
//! `MSG_MORE`, so header and payload leave in the same segments.
//!
//! **Delivery.** The endgame (`SendConfig::endgame`) asks each socket how
//! many bytes it still holds unacknowledged (`SIOCOUTQ`) and whether it is
//! in a retransmission timeout (`TCP_INFO`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::Pipe;

/// A data connection that may send file pages without copying them
/// through user space. Every method has a default that declines, so a
/// connection type that cannot (TLS, in-memory pipes) implements it empty;
/// wrappers that count or time writes delegate, and count what went out.
pub trait DataSocket {
    /// Whether [`poll_send_file`](Self::poll_send_file) can move bytes on
    /// this connection now (a plain TCP socket).
    fn can_send_file(&self) -> bool {
        false
    }

    /// Write `hdr`, then up to `len` bytes of the file `fd` from `offset`,
    /// as far as the socket takes them; returns how many bytes of the two
    /// together went out (the header's first). `Ok(0)` with the header
    /// written means the file ended before `offset`.
    fn poll_send_file(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _hdr: &[u8],
        _fd: std::os::fd::BorrowedFd<'_>,
        _offset: u64,
        _len: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// The TCP socket under this connection (also under TLS), for asking
    /// the kernel what it has delivered; `None` for anything else.
    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Whether [`poll_splice_in`](Self::poll_splice_in) can take bytes off
    /// this connection now (plain TCP: the bytes on the wire are the
    /// payload's own).
    fn can_splice_in(&self) -> bool {
        false
    }

    /// Move up to `len` received bytes into the empty `pipe`
    /// ([`Pipe::fill_from`]), waiting until there are some; `Ok(0)` at the
    /// end of the stream. Wrappers delegate and count what came in, as a
    /// read.
    fn poll_splice_in(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _pipe: &Pipe,
        _len: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// A handle that tells, from any task, what this connection has
    /// delivered (the endgame's question); `None` turns the endgame off
    /// for it. A plain TCP socket answers with the kernel's counts; a
    /// stream that changes the bytes (TLS) answers itself, and wrappers
    /// pass the inner answer on. `None` is the default on purpose: a
    /// wrapper that forgets to delegate loses the endgame instead of
    /// answering with the socket's counts, which are ciphertext under TLS.
    fn probe(&self) -> Option<Box<dyn Probe>> {
        None
    }
}

/// What a sender may ask of one of its connections from elsewhere.
pub trait Probe: Send + Sync {
    /// Bytes not yet acknowledged, and whether it waits a timeout.
    fn delivery(&self) -> Option<Delivery>;

    /// Make the connection's close a reset: what it still holds is not to
    /// be delivered (the endgame delivered it otherwise).
    fn reset_on_close(&self) {}
}

/// The kernel's answers for a TCP socket, through a duplicate descriptor
/// (which keeps the socket open until the probe is dropped).
struct FdProbe(std::os::fd::OwnedFd);

impl Probe for FdProbe {
    fn delivery(&self) -> Option<Delivery> {
        delivery(std::os::fd::AsFd::as_fd(&self.0))
    }

    fn reset_on_close(&self) {
        reset_on_close(std::os::fd::AsFd::as_fd(&self.0));
    }
}

/// `XFTP_ZEROCOPY=off` in the environment turns `sendfile` and `splice`
/// off, so that a benchmark can measure what they save (bench/loopback.py's
/// "xftp, no sendfile" rows set it on the server, "xftp, no splice" on the
/// client).
#[cfg(target_os = "linux")]
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("XFTP_ZEROCOPY").map_or(true, |v| v != "off"))
}

#[cfg(target_os = "linux")]
impl DataSocket for tokio::net::TcpStream {
    fn can_send_file(&self) -> bool {
        enabled()
    }

    fn poll_send_file(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hdr: &[u8],
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        use std::os::fd::AsRawFd;
        let sock = self.get_mut();
        loop {
            std::task::ready!(sock.poll_write_ready(cx))?;
            let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
                let s = sock.as_raw_fd();
                let mut sent = 0usize;
                if !hdr.is_empty() {
                    let more = if len > 0 { libc::MSG_MORE } else { 0 };
                    // SAFETY: `hdr` is a valid buffer for the call; `s` is
                    // the open socket of `sock`.
                    let n = unsafe {
                        libc::send(s, hdr.as_ptr().cast(), hdr.len(), more | libc::MSG_NOSIGNAL)
                    };
                    if n < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    sent = n as usize;
                    if sent < hdr.len() || len == 0 {
                        return Ok(sent);
                    }
                }
                let mut off = libc::off_t::try_from(offset)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
                // SAFETY: both descriptors are open for the call and `off`
                // is a valid off_t the kernel updates.
                let n = unsafe { libc::sendfile(s, fd.as_raw_fd(), &mut off, len) };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    // The header went out: report it; the payload's
                    // readiness is waited for on the next call.
                    if sent > 0 && e.kind() == io::ErrorKind::WouldBlock {
                        return Ok(sent);
                    }
                    return Err(e);
                }
                Ok(sent + n as usize)
            });
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }

    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(std::os::fd::AsFd::as_fd(self))
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        let fd = std::os::fd::AsFd::as_fd(self).try_clone_to_owned().ok()?;
        Some(Box::new(FdProbe(fd)))
    }

    fn can_splice_in(&self) -> bool {
        enabled()
    }

    fn poll_splice_in(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &Pipe,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        let sock = self.get_mut();
        loop {
            std::task::ready!(sock.poll_read_ready(cx))?;
            // The pipe is empty (one piece at a time), so WouldBlock can
            // only mean the socket has nothing: readiness is cleared.
            match sock.try_io(tokio::io::Interest::READABLE, || {
                pipe.fill_from(std::os::fd::AsFd::as_fd(&*sock), len)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

impl DataSocket for tokio::io::DuplexStream {}

impl<T> DataSocket for tokio::io::ReadHalf<T> {}

impl<T> DataSocket for tokio::io::WriteHalf<T> {}

impl<T: DataSocket + ?Sized + Unpin> DataSocket for Box<T> {
    fn can_send_file(&self) -> bool {
        (**self).can_send_file()
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        (**self).probe()
    }

    fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        (**self).tcp_socket()
    }

    fn can_splice_in(&self) -> bool {
        (**self).can_splice_in()
    }

    fn poll_splice_in(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &Pipe,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self).poll_splice_in(cx, pipe, len)
    }

    fn poll_send_file(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        hdr: &[u8],
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self).poll_send_file(cx, hdr, fd, offset, len)
    }
}

/// Send `hdr` and `len` bytes of `fd` at `offset` in full. `longest` is
/// raised to the longest single call: `sendfile` reads pages missing from
/// the page cache from the disk, in the calling thread.
pub(crate) async fn send_all<S: DataSocket + Unpin>(
    s: &mut S,
    mut hdr: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
    mut offset: u64,
    mut len: usize,
    longest: &mut std::time::Duration,
) -> io::Result<SentFrom> {
    while !hdr.is_empty() || len > 0 {
        let n = std::future::poll_fn(|cx| {
            let t0 = std::time::Instant::now();
            let r = Pin::new(&mut *s).poll_send_file(cx, hdr, fd, offset, len);
            *longest = (*longest).max(t0.elapsed());
            r
        })
        .await?;
        if hdr.is_empty() && n == 0 {
            // The file is shorter than announced (truncated while sent).
            return Ok(SentFrom::FileEnded(offset));
        }
        let h = n.min(hdr.len());
        hdr = &hdr[h..];
        let d = n - h;
        offset += d as u64;
        len -= d;
    }
    Ok(SentFrom::Complete)
}

/// How [`send_all`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SentFrom {
    /// Every byte went out.
    Complete,
    /// The file ended at this offset, before the record's end.
    FileEnded(u64),
}

/// What a sending connection has delivered ([`Probe::delivery`]): the
/// endgame's [`Observed`](crate::endgame::Observed), under the name the
/// socket side gives it.
pub use crate::endgame::Observed as Delivery;

/// What the kernel has taken from the application on a TCP socket, and
/// how much of it the peer acknowledged ([`socket_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketBytes {
    /// Bytes written to the socket since it opened (acknowledged or still
    /// queued); never less than the truth, possibly more by what was
    /// acknowledged while it was read.
    pub taken: u64,
    /// Of those, bytes the peer acknowledged in order (`tcpi_bytes_acked`;
    /// after a FIN, one more).
    pub acked: u64,
}

/// [`SocketBytes`] of the TCP socket `fd`; `None` where the kernel cannot
/// tell (not Linux, or a kernel without `tcpi_bytes_acked`, 4.2).
pub fn socket_bytes(fd: std::os::fd::BorrowedFd<'_>) -> Option<SocketBytes> {
    #[cfg(target_os = "linux")]
    {
        let (outq, info, len) = outq_then_info(fd)?;
        if len < 128 {
            return None;
        }
        // u64 tcpi_bytes_acked at byte 120 (include/uapi/linux/tcp.h).
        let mut b = [0u8; 8];
        b.copy_from_slice(&info[120..128]);
        let acked = u64::from_ne_bytes(b);
        Some(SocketBytes {
            taken: acked + outq,
            acked,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        None
    }
}

/// The bytes still in the socket's send queue (`SIOCOUTQ`), then its
/// `struct tcp_info` and the length the kernel filled. In that order: an
/// ACK between the two calls makes queued + acknowledged read high, never
/// low (low, a TLS ledger mark would claim ciphertext the peer has not
/// acknowledged).
#[cfg(target_os = "linux")]
fn outq_then_info(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u64, [u8; 152], usize)> {
    use std::os::fd::AsRawFd;
    let mut outq: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int to the pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut outq) } != 0 {
        return None;
    }
    let mut info = [0u8; 152];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: a writable buffer of `len` bytes and its length.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    Some((u64::try_from(outq).ok()?, info, len as usize))
}

/// Ask the kernel about the TCP socket `fd`; `None` where it cannot tell.
fn delivery(fd: std::os::fd::BorrowedFd<'_>) -> Option<Delivery> {
    #[cfg(target_os = "linux")]
    {
        let (outq, info, len) = outq_then_info(fd)?;
        if len < 12 {
            return None;
        }
        // struct tcp_info: u8 state, ca_state, retransmits, probes,
        // backoff, ...; u32 rto at byte 8 (include/uapi/linux/tcp.h).
        const TCP_CA_LOSS: u8 = 4;
        // tcpi_state: TCP_CLOSE after a reset (include/net/tcp_states.h).
        const TCP_CLOSE: u8 = 7;
        let rto = u32::from_ne_bytes([info[8], info[9], info[10], info[11]]);
        // u32 total_retrans at byte 100.
        let retrans = info
            .get(100..104)
            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        // u64 tcpi_bytes_acked at byte 120 (kernels since 4.2).
        let progress = info
            .get(120..128)
            .filter(|_| len >= 128)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes);
        // u32 tcpi_min_rtt (µs) at byte 148 (kernels since 4.6).
        let min_rtt = info
            .get(148..152)
            .filter(|_| len >= 152)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .filter(|&us| us > 0)
            .map(|us| std::time::Duration::from_micros(u64::from(us)));
        // u32 tcpi_last_ack_recv (ms) at byte 56.
        let since_ack = info
            .get(56..60)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
            .map(|ms| std::time::Duration::from_millis(u64::from(ms)));
        // u32 tcpi_unacked (segments in flight) at byte 24: none while
        // bytes wait means a closed receive window, as a timeout would
        // have segments in flight to retransmit.
        let unacked = info
            .get(24..28)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes);
        Some(Delivery {
            outq,
            held: outq > 0 && unacked == Some(0),
            timed_out: info[1] == TCP_CA_LOSS || info[4] > 0,
            rto: std::time::Duration::from_micros(u64::from(rto)),
            min_rtt,
            since_ack,
            lossy: retrans > 0 || info[1] == TCP_CA_LOSS,
            progress,
            closed: info[0] == TCP_CLOSE,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        None
    }
}

/// Make the socket's close a reset (`SO_LINGER` 0): what it still holds
/// is not to be delivered.
fn reset_on_close(fd: std::os::fd::BorrowedFd<'_>) {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid linger struct and its size, on an open socket.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!("SO_LINGER: {}", io::Error::last_os_error());
        }
    }
}

/// Whether `[offset, offset + len)` of the file `fd` is in the page cache,
/// judged by its first and last byte (read-ahead fills whole windows):
/// `preadv2` with `RWF_NOWAIT` reads only what needs no disk. `None`
/// where the kernel or the filesystem cannot tell.
pub(crate) fn cached(fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: u64) -> Option<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Some(true);
        }
        let probe = |at: u64| -> Option<bool> {
            let mut byte = 0u8;
            let iov = libc::iovec {
                iov_base: (&mut byte as *mut u8).cast(),
                iov_len: 1,
            };
            let at = libc::off_t::try_from(at).ok()?;
            // SAFETY: one valid iovec of one byte, on an open descriptor.
            let n = unsafe { libc::preadv2(fd.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
            if n >= 0 {
                return Some(true);
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN) => Some(false),
                _ => None,
            }
        };
        Some(probe(offset)? && probe(offset + len - 1)?)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, offset, len);
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, AsRawFd};

    /// A wrapper that passes everything on but the probe.
    struct Forgetful(tokio::net::TcpStream);

    impl DataSocket for Forgetful {
        fn tcp_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            self.0.tcp_socket()
        }
    }

    /// The endgame trusts a probe to count the bytes the stripe engine
    /// wrote. A wrapper that does not pass `probe()` on must give none,
    /// not one of the socket under it (whose counts may be of other bytes,
    /// as under TLS); a TCP socket, and a box of one, give theirs.
    #[tokio::test]
    async fn only_a_tcp_socket_or_a_delegating_wrapper_gives_a_probe() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a listener");
        let addr = l.local_addr().expect("its address");
        let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let a = a.expect("connected");
        let _b = b.expect("accepted");
        assert!(a.probe().is_some(), "a TCP socket answers");
        let boxed: Box<dyn DataSocket + Send + Unpin> = Box::new(a);
        assert!(boxed.probe().is_some(), "a box passes it on");
        let a = tokio::net::TcpStream::connect(addr).await.expect("again");
        let w = Forgetful(a);
        assert!(w.tcp_socket().is_some(), "the socket is reachable");
        assert!(w.probe().is_none(), "but no probe is made of it");
    }

    #[test]
    fn the_page_cache_is_asked_before_a_read() {
        let mut f = tempfile::tempfile().expect("a temporary file");
        f.write_all(&vec![7u8; 1 << 20]).expect("written");
        assert_eq!(cached(f.as_fd(), 0, 1 << 20), Some(true), "just written");
        f.sync_all().expect("synced");
        // SAFETY: an open descriptor; advice only.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid statfs buffer and descriptor.
        unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
        let in_memory_fs = st.f_type == libc::TMPFS_MAGIC;
        // DONTNEED is advice: under load the kernel may keep some pages
        // (a CI run once kept them). The answer is checked against what
        // mincore says of the first and last page, asked first (a miss
        // read with RWF_NOWAIT may start read-ahead).
        for _ in 0..20 {
            if !resident(&f, 1 << 20) || in_memory_fs {
                break;
            }
            // SAFETY: as above.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // The pages can still be in flux right after the advice (a CI run
        // once had mincore say "gone" and the read find them): ask both
        // again until they agree; a `cached` that is wrong stays wrong.
        let (mut want, mut got) = (None, None);
        for _ in 0..20 {
            want = Some(resident(&f, 1 << 20));
            got = cached(f.as_fd(), 0, 1 << 20);
            if got == want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if !in_memory_fs && want == Some(true) {
            eprintln!("the kernel kept the pages after DONTNEED: the miss is not checked");
        }
        assert_eq!(got, want, "after DONTNEED");
        assert_eq!(cached(f.as_fd(), 5, 0), Some(true), "nothing to read");
    }

    /// Whether the first and last page of `[0, len)` of `f` are in the
    /// page cache, by mincore on a mapping.
    fn resident(f: &std::fs::File, len: usize) -> bool {
        // SAFETY: a shared read-only mapping of an open file, unmapped
        // below; mincore writes one byte per page into `vec`.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "mmap");
            let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).unwrap_or(4096);
            let pages = len.div_ceil(page);
            let mut vec = vec![0u8; pages];
            let r = libc::mincore(p, len, vec.as_mut_ptr());
            libc::munmap(p, len);
            assert_eq!(r, 0, "mincore");
            vec[0] & 1 == 1 && vec[pages - 1] & 1 == 1
        }
    }
}
