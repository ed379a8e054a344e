//! Receiving without a copy through user space: `splice(2)`.
//!
//! A plain read takes a socket's bytes into a user buffer (one copy) and a
//! write puts them into the page cache (another). `splice` moves the
//! socket's buffers into a pipe by reference instead, and from the pipe
//! into the file the kernel copies once: the receive copy is gone. On this
//! project's VM it took a one-connection loopback download into tmpfs
//! from 12.2 to 18.9 Gbit/s, at a tenth less CPU (docs/datapath.md). The pipe is a connection's own and is always empty
//! between pieces: a piece goes in from the socket, then all of it out to
//! the file, under the writer's turn.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Largest piece a pipe is asked to hold (`F_SETPIPE_SZ`); an unprivileged
/// process may ask for up to `/proc/sys/fs/pipe-max-size` (1 MiB by
/// default), and a user's pipes together are capped (pipe-user-pages-soft).
const WANT_CAPACITY: usize = 256 * 1024;

/// A pipe that carries one piece at a time from a socket to a file.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// A new pipe, enlarged to 256 KiB where the kernel allows (otherwise
    /// its default size, 64 KiB). `Unsupported` where there is no `splice`.
    pub fn new() -> io::Result<Pipe> {
        Self::with_capacity(WANT_CAPACITY)
    }

    /// [`new`](Self::new), asking for `want` bytes (a stream-mode download
    /// takes 1 MiB pieces).
    pub fn with_capacity(want: usize) -> io::Result<Pipe> {
        #[cfg(target_os = "linux")]
        {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: `fds` has room for the two descriptors pipe2 writes.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: both descriptors were just opened and are ours alone.
            let (read, write) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // SAFETY: fcntl on an open descriptor; the size is an int.
            let set = unsafe {
                libc::fcntl(
                    write.as_raw_fd(),
                    libc::F_SETPIPE_SZ,
                    libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX),
                )
            };
            let capacity = if set > 0 {
                set as usize
            } else {
                // Over the user's limit of pipe pages: keep the default.
                // SAFETY: fcntl on an open descriptor.
                let got = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
                if got <= 0 {
                    return Err(io::Error::last_os_error());
                }
                got as usize
            };
            Ok(Pipe {
                read,
                write,
                capacity,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = want;
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// The most one piece may be.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Move up to `len` bytes (at most [`capacity`](Self::capacity)) that
    /// the socket `sock` holds into the empty pipe, without waiting:
    /// `WouldBlock` when the socket has nothing, `Ok(0)` at its end.
    pub fn fill_from(&self, sock: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        #[cfg(target_os = "linux")]
        {
            let len = len.min(self.capacity);
            // SAFETY: both descriptors are open for the call; no offsets
            // (a socket and a pipe have none).
            let n = unsafe {
                libc::splice(
                    sock.as_raw_fd(),
                    std::ptr::null_mut(),
                    self.write.as_raw_fd(),
                    std::ptr::null_mut(),
                    len,
                    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(n as usize)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (sock, len);
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// Write the `len` bytes the pipe holds into the file `fd` at `offset`
    /// (at its position when `None`), all of them. A file that cannot take
    /// them from a pipe (opened for appending, a filesystem without
    /// `splice`) gets them through a buffer instead.
    pub fn drain_to(&self, fd: BorrowedFd<'_>, offset: Option<u64>, len: usize) -> io::Result<()> {
        let mut left = len;
        let mut off = match offset {
            Some(o) => Some(
                libc::loff_t::try_from(o)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?,
            ),
            None => None,
        };
        while left > 0 {
            #[cfg(target_os = "linux")]
            // SAFETY: both descriptors are open; `off`, when given, is a
            // valid loff_t the kernel reads and advances.
            let n = unsafe {
                libc::splice(
                    self.read.as_raw_fd(),
                    std::ptr::null_mut(),
                    fd.as_raw_fd(),
                    off.as_mut()
                        .map_or(std::ptr::null_mut(), |o| o as *mut libc::loff_t),
                    left,
                    libc::SPLICE_F_MOVE,
                )
            };
            #[cfg(not(target_os = "linux"))]
            let n: isize = -1;
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if left == len && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
                    return self.copy_to(fd, off.map(|o| o as u64), left);
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the pipe ran dry before the piece was written",
                ));
            }
            left -= n as usize;
        }
        Ok(())
    }

    /// [`drain_to`](Self::drain_to) through a buffer.
    fn copy_to(&self, fd: BorrowedFd<'_>, offset: Option<u64>, len: usize) -> io::Result<()> {
        let mut buf = vec![0u8; len];
        self.read_exact(&mut buf)?;
        let file = std::mem::ManuallyDrop::new(
            // SAFETY: a borrowed descriptor wrapped without taking it over:
            // ManuallyDrop never closes it.
            unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) },
        );
        match offset {
            Some(o) => std::os::unix::fs::FileExt::write_all_at(&*file, &buf, o),
            None => io::Write::write_all(&mut &*file, &buf),
        }
    }

    /// Read exactly `buf.len()` bytes out of the pipe (which holds them).
    pub fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut f = std::fs::File::from(self.read.try_clone()?);
        io::Read::read_exact(&mut f, buf)
    }

    /// The pipe's writing end (tests).
    #[cfg(test)]
    fn write_end(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.write)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    #[test]
    fn a_piece_goes_from_the_socket_to_its_offset() {
        let p = Pipe::new().expect("pipe");
        assert!(p.capacity() >= 64 * 1024);
        let (mut a, b) = socket_pair();
        b.set_nonblocking(true).expect("nonblocking");
        assert_eq!(
            p.fill_from(b.as_fd(), 100).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock),
            "nothing sent yet"
        );
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        a.write_all(&data).expect("sent");
        let mut got = 0;
        let mut f = tempfile::tempfile().expect("file");
        while got < data.len() {
            match p.fill_from(b.as_fd(), data.len() - got) {
                Ok(n) => {
                    p.drain_to(f.as_fd(), Some(10 + got as u64), n)
                        .expect("drained");
                    got += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("splice: {e}"),
            }
        }
        drop(a);
        loop {
            match p.fill_from(b.as_fd(), 10) {
                Ok(n) => {
                    assert_eq!(n, 0, "the end of the stream");
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("splice: {e}"),
            }
        }
        let mut back = Vec::new();
        f.read_to_end(&mut back).expect("read");
        assert_eq!(&back[..10], &[0u8; 10], "a hole before the offset");
        assert_eq!(&back[10..], &data[..]);
    }

    #[test]
    fn a_file_opened_for_appending_gets_the_bytes_through_a_buffer() {
        let p = Pipe::new().expect("pipe");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"head:").expect("written");
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("opened");
        let mut w = std::fs::File::from(p.write_end().try_clone_to_owned().expect("dup"));
        w.write_all(b"tail").expect("into the pipe");
        p.drain_to(f.as_fd(), None, 4).expect("appended");
        assert_eq!(std::fs::read(&path).expect("read"), b"head:tail");
    }

    #[test]
    fn a_recorded_file_records_what_came_through_the_pipe() {
        use crate::WriteAt;
        let p = Pipe::new().expect("pipe");
        let f = tempfile::tempfile().expect("file");
        let rec = crate::RecordedFile::new(f, crate::ranges::RangeSet::new());
        let mut w = std::fs::File::from(p.write_end().try_clone_to_owned().expect("dup"));
        w.write_all(b"xyz").expect("into the pipe");
        rec.write_from_pipe(&p, 3, 100).expect("written");
        assert_eq!(rec.ranges().iter().collect::<Vec<_>>(), vec![(100, 103)]);
    }

    #[test]
    fn without_an_offset_the_file_position_moves() {
        let p = Pipe::new().expect("pipe");
        let mut f = tempfile::tempfile().expect("file");
        f.write_all(b"ab").expect("written");
        let mut w = std::fs::File::from(p.write_end().try_clone_to_owned().expect("dup"));
        w.write_all(b"cd").expect("into the pipe");
        p.drain_to(f.as_fd(), None, 2).expect("drained");
        w.write_all(b"ef").expect("into the pipe");
        p.drain_to(f.as_fd(), None, 2).expect("drained");
        f.rewind().expect("rewound");
        let mut back = String::new();
        f.read_to_string(&mut back).expect("read");
        assert_eq!(back, "abcdef");
    }
}
