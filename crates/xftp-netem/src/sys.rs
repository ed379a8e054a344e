//! Thin, safe wrappers over the few Linux calls the forwarder needs: TUN
//! devices, an eventfd to stop the threads, ppoll with a nanosecond
//! timeout, and the timer slack of the calling thread.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags.
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TUN device (IFF_TUN | IFF_NO_PI, non-blocking). The device
/// disappears when this is dropped.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
}

impl Tun {
    /// Creates TUN device `name` in the caller's network namespace.
    pub fn create(name: &str) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad interface name",
            ));
        }
        let path = CString::new("/dev/net/tun").map_err(io::Error::other)?;
        // SAFETY: path is a valid NUL-terminated string.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReqFlags {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: req is a properly sized ifreq that outlives the call.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tun { fd })
    }

    /// The raw descriptor, for the forwarder threads.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Reads one packet; `Ok(None)` when nothing is waiting.
pub fn read_packet(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes of writes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Writes one packet.
pub fn write_packet(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes of reads.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A non-blocking eventfd used to wake and stop the forwarder threads.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates a new eventfd with counter 0.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall, no pointers.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    /// Makes the eventfd readable (for good: nobody drains it).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A failure can only mean
        // the counter is already huge, i.e. already signalled.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The raw descriptor, for poll.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// What [`wait_readable`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// The data descriptor is readable (or in error: the next read tells).
    pub data: bool,
    /// The stop eventfd was signalled.
    pub stop: bool,
}

/// Sleeps until `data` (if given) or `stop` is readable, or `timeout`
/// passes (`None`: no timeout).
pub fn wait_readable(
    data: Option<RawFd>,
    stop: RawFd,
    timeout: Option<Duration>,
) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            // poll skips negative descriptors.
            fd: data.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: fds and ts live across the call; a null sigmask keeps ours.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, ts_ptr, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Ready {
                data: false,
                stop: false,
            });
        }
        return Err(e);
    }
    let hit = libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
    Ok(Ready {
        data: fds[0].revents & hit != 0,
        stop: fds[1].revents & hit != 0,
    })
}

/// Lowers the calling thread's timer slack so that timed wake-ups are not
/// deferred by the default 50 µs.
pub fn set_timer_slack(slack: Duration) {
    let ns = slack.as_nanos().clamp(1, u128::from(u32::MAX)) as libc::c_ulong;
    // SAFETY: prctl with integer arguments only. Failure only costs
    // precision, so the result is ignored.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
}

/// Raises the calling thread's scheduling priority so that its timed
/// wake-ups are not queued behind CPU-bound work (compilers, other tests):
/// real-time round-robin at a low priority when `realtime`, else nice -10.
/// Best effort: without the privilege nothing changes.
pub fn raise_thread_priority(realtime: bool) {
    // SAFETY: plain syscalls on the calling thread; param outlives the call.
    unsafe {
        if realtime {
            let param = libc::sched_param { sched_priority: 1 };
            if libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_RR, &param) == 0 {
                return;
            }
        }
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, -10);
    }
}

/// Whether the process runs as root (needed for TUN and namespaces).
pub fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}
