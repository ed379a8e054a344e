//! TCP buffer sizes for data sockets (SITE BUFSIZE / SITE WIN / SBUF).
//!
//! A buffer must be set before `connect`/`listen`, because the window-scale
//! option is fixed in the SYN. Setting it turns off the kernel's receive
//! autotuning for that socket. Linux doubles the value for bookkeeping and
//! clamps it to `net.core.{r,w}mem_max` unless the process may use the
//! `*BUFFORCE` options (CAP_NET_ADMIN), which are tried first.

use std::os::fd::{AsRawFd, RawFd};

/// The sizes the kernel reports as in force on a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    /// SO_RCVBUF as read back.
    pub rcv: u64,
    /// SO_SNDBUF as read back.
    pub snd: u64,
}

fn setopt(fd: RawFd, opt: libc::c_int, val: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fd is a valid socket owned by the caller for the duration of
    // the call; the value pointer and length describe one c_int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
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

fn getopt(fd: RawFd, opt: libc::c_int) -> std::io::Result<u64> {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above; val and len are valid for writes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
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

/// Apply `bytes` to both buffers of `sock` (FORCE first, plain on EPERM).
pub fn apply(sock: &impl AsRawFd, bytes: u64) -> std::io::Result<InForce> {
    let fd = sock.as_raw_fd();
    let v = bytes.min(i32::MAX as u64 / 2) as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setopt(fd, force, v).is_err() {
            setopt(fd, plain, v)?;
        }
    }
    read(sock)
}

/// What the kernel reports for `sock`.
pub fn read(sock: &impl AsRawFd) -> std::io::Result<InForce> {
    let fd = sock.as_raw_fd();
    Ok(InForce {
        rcv: getopt(fd, libc::SO_RCVBUF)?,
        snd: getopt(fd, libc::SO_SNDBUF)?,
    })
}

/// What a data socket would get for `bytes`, measured on a probe socket.
pub fn probe(bytes: Option<u64>) -> std::io::Result<InForce> {
    let s = tokio::net::TcpSocket::new_v4()?;
    match bytes {
        Some(b) => apply(&s, b),
        None => read(&s),
    }
}
