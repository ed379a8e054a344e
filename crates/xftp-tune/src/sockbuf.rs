//! TCP buffer sizes for data sockets: the client's `--bufsize` and the
//! server's SITE BUFSIZE / SITE WIN / SBUF share this code.
//!
//! Set before `connect`/`listen`: the window scale goes out in the SYN.
//! `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` (CAP_NET_ADMIN) are tried first, so
//! root is not clamped to `net.core.{r,w}mem_max`; plain `SO_RCVBUF`/
//! `SO_SNDBUF` otherwise. Linux doubles the value for its bookkeeping;
//! [`read`] reports what is in force.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The most unsent bytes a sending data socket may hold before it stops
/// taking records (a slow connection holds less: [`notsent_lowat_for`]).
///
/// Without a limit, autotuned send buffers (megabytes each) swallow most
/// of a file as soon as the first connections open: records are then tied
/// to a connection long before it can send them (dynamic assignment
/// degrades to static), and connections added later find no record left
/// to carry.
pub const NOTSENT_LOWAT: u32 = 128 * 1024;

/// The least unsent backlog [`notsent_lowat_for`] leaves a connection.
pub const NOTSENT_LOWAT_MIN: u32 = 16 * 1024;

/// Unsent bytes for a sending connection whose congestion window is
/// `cwnd` segments of `mss` bytes: one window, between
/// [`NOTSENT_LOWAT_MIN`] and [`NOTSENT_LOWAT`].
///
/// A connection that came out of a loss episode with a window of 15
/// segments sends about 200 KB/s on a 100 ms path; with the full
/// [`NOTSENT_LOWAT`] of backlog it kept the last records of a transfer
/// for half a second after every other connection had finished. A window
/// of backlog is what it sends in the next round trip anyway, so a fast
/// connection is never starved, and a slow one takes records at the pace
/// it sends them.
pub fn notsent_lowat_for(cwnd: u32, mss: u32) -> u32 {
    cwnd.saturating_mul(mss)
        .clamp(NOTSENT_LOWAT_MIN, NOTSENT_LOWAT)
}

/// Set `TCP_NOTSENT_LOWAT` on a socket (see [`NOTSENT_LOWAT`]).
pub fn set_notsent_lowat(sock: &impl AsRawFd, bytes: u32) -> std::io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    setopt(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_NOTSENT_LOWAT,
        v,
    )
}

/// Turn on `TCP_THIN_LINEAR_TIMEOUTS` on a sending data socket.
///
/// At the end of a transfer the last records sit on a few connections
/// with fewer than four segments in flight (a *thin* stream, to Linux).
/// A loss there has too few segments after it for fast retransmit, so
/// it waits for the retransmission timeout, and each further timeout
/// doubles the wait: on the 8-packet satellite-x10 link one transfer sat
/// four seconds at zero goodput at its end. With this option the kernel
/// keeps the timeout linear for the first six retransmissions while the
/// stream is thin; a connection with more in flight backs off as usual.
/// Eight interleaved pairs on that link (`bench/ab`): median 3.96 s
/// against 4.43 s at 16 connections, 6.09 s against 6.39 s at 32; single
/// runs vary more than that, so the gain is modest and noisy.
pub fn set_thin_linear_timeouts(sock: &impl AsRawFd) -> std::io::Result<()> {
    setopt(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_THIN_LINEAR_TIMEOUTS,
        1,
    )
}

/// Whether `TCP_THIN_LINEAR_TIMEOUTS` is on for a socket.
pub fn thin_linear_timeouts(sock: &impl AsRawFd) -> std::io::Result<bool> {
    let v = getopt(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_THIN_LINEAR_TIMEOUTS,
    )?;
    Ok(v != 0)
}

/// `TCP_NOTSENT_LOWAT` in force on a socket (0 when never set).
pub fn notsent_lowat(sock: &impl AsRawFd) -> std::io::Result<u32> {
    let v = getopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT)?;
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Buffer sizes the kernel reports for a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    /// SO_RCVBUF as read back.
    pub rcv: u64,
    /// SO_SNDBUF as read back.
    pub snd: u64,
}

/// Set an integer socket option.
pub(crate) fn setopt(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: fd is a live socket borrowed for the call; the pointer and
    // length describe one c_int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Read an integer socket option (negative values read as 0).
fn getopt(fd: RawFd, level: libc::c_int, opt: libc::c_int) -> std::io::Result<u64> {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above; val and len are valid for writes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(val.max(0) as u64)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Apply `bytes` to both buffers of `sock` (FORCE first, plain on failure).
pub fn apply(sock: &impl AsRawFd, bytes: u64) -> std::io::Result<InForce> {
    let fd = sock.as_raw_fd();
    let v = bytes.min(i32::MAX as u64 / 2) as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setopt(fd, libc::SOL_SOCKET, force, v).is_err() {
            setopt(fd, libc::SOL_SOCKET, plain, v)?;
        }
    }
    read(sock)
}

/// Apply `bytes` to both buffers of `sock` with the plain options only:
/// the kernel holds them to `net.core.rmem_max`/`wmem_max`. For sizes a
/// peer asks for (`SITE BUFSIZE` on a server): run as root, FORCE let an
/// anonymous client pin 512 MiB of the host's TCP memory per connection
/// past the limits the operator set.
pub fn apply_capped(sock: &impl AsRawFd, bytes: u64) -> std::io::Result<InForce> {
    let fd = sock.as_raw_fd();
    let v = bytes.min(i32::MAX as u64 / 2) as libc::c_int;
    setopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)?;
    setopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)?;
    read(sock)
}

/// What [`apply_capped`] would give a data socket for `bytes`, measured on
/// a probe socket.
pub fn probe_capped(bytes: Option<u64>) -> std::io::Result<InForce> {
    let s = TcpSocket::new_v4()?;
    match bytes {
        Some(b) => apply_capped(&s, b),
        None => read(&s),
    }
}

/// What the kernel reports for `sock`.
pub fn read(sock: &impl AsRawFd) -> std::io::Result<InForce> {
    let fd = sock.as_raw_fd();
    Ok(InForce {
        rcv: getopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?,
        snd: getopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?,
    })
}

fn socket_for(addr: &SocketAddr, bufsize: Option<u64>) -> std::io::Result<TcpSocket> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(b) = bufsize {
        apply(&s, b)?;
    }
    Ok(s)
}

/// Connect to `addr` with the buffers set first. `Err(None)` is a timeout.
pub async fn connect(
    addr: SocketAddr,
    bufsize: Option<u64>,
    limit: Duration,
) -> Result<TcpStream, Option<std::io::Error>> {
    let s = socket_for(&addr, bufsize).map_err(Some)?;
    match tokio::time::timeout(limit, s.connect(addr)).await {
        Ok(r) => r.map_err(Some),
        Err(_) => Err(None),
    }
}

/// What a data socket would get for `bytes`, measured on a probe socket.
pub fn probe(bytes: Option<u64>) -> std::io::Result<InForce> {
    let s = TcpSocket::new_v4()?;
    match bytes {
        Some(b) => apply(&s, b),
        None => read(&s),
    }
}

/// Listen on `addr` with the buffers set first (accepted sockets inherit them).
pub fn listen(addr: SocketAddr, bufsize: Option<u64>) -> std::io::Result<TcpListener> {
    let s = socket_for(&addr, bufsize)?;
    s.bind(addr)?;
    s.listen(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notsent_lowat_is_set() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        set_notsent_lowat(&c, NOTSENT_LOWAT).unwrap();
        assert_eq!(notsent_lowat(&c).unwrap(), NOTSENT_LOWAT);
    }

    #[test]
    fn the_backlog_is_one_window_within_bounds() {
        assert_eq!(notsent_lowat_for(10, 1448), NOTSENT_LOWAT_MIN);
        assert_eq!(notsent_lowat_for(18, 1448), 18 * 1448);
        assert_eq!(notsent_lowat_for(600, 1448), NOTSENT_LOWAT);
        assert_eq!(notsent_lowat_for(u32::MAX, u32::MAX), NOTSENT_LOWAT);
        assert_eq!(notsent_lowat_for(0, 0), NOTSENT_LOWAT_MIN);
    }

    #[tokio::test]
    async fn buffers_apply_before_connect_and_read_back() {
        let l = listen("127.0.0.1:0".parse().unwrap(), Some(200_000)).unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect(addr, Some(200_000), Duration::from_secs(5))
            .await
            .unwrap();
        let (s, _) = l.accept().await.unwrap();
        for sock in [read(&c).unwrap(), read(&s).unwrap()] {
            // Linux doubles the request; the FORCE variant is not clamped.
            assert!(sock.rcv >= 200_000 && sock.snd >= 200_000, "{sock:?}");
        }
    }
}
