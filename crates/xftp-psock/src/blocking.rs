//! Blocking `std::io::Read`/`Write` wrappers for programs without an async
//! runtime. Each wrapper owns a small tokio runtime that keeps the
//! connections moving between calls.
//!
//! ```
//! use std::io::{Read, Write};
//! use xftp_psock::blocking::{BlockingListener, BlockingStream};
//! use xftp_psock::PsockConfig;
//!
//! let mut l = BlockingListener::bind("127.0.0.1:0", PsockConfig::default())?;
//! let addr = l.local_addr();
//! let t = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
//!     let mut s = l.accept()?;
//!     let mut v = Vec::new();
//!     s.read_to_end(&mut v)?;
//!     Ok(v)
//! });
//! let mut c = BlockingStream::connect(addr, 3, &PsockConfig::default())?;
//! c.write_all(b"blocking hello")?;
//! c.shutdown()?;
//! assert_eq!(t.join().unwrap()?, b"blocking hello");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

use crate::{PsockConfig, PsockListener, PsockStream};

fn runtime() -> io::Result<Arc<Runtime>> {
    Ok(Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("psock")
            .enable_all()
            .build()?,
    ))
}

/// A [`PsockStream`] with blocking `Read`/`Write`.
pub struct BlockingStream {
    // Field order: the stream must go before its runtime.
    inner: PsockStream,
    rt: Arc<Runtime>,
}

impl BlockingStream {
    /// Open a group of `n` connections to `addr`.
    pub fn connect(addr: SocketAddr, n: u16, cfg: &PsockConfig) -> io::Result<Self> {
        let rt = runtime()?;
        let inner = rt.block_on(PsockStream::connect(addr, n, cfg))?;
        Ok(Self { inner, rt })
    }

    /// End the sending direction: every byte written is delivered, then the
    /// peer reads end-of-stream.
    pub fn shutdown(&mut self) -> io::Result<()> {
        self.rt.block_on(self.inner.shutdown())
    }

    /// The async stream inside.
    pub fn get_ref(&self) -> &PsockStream {
        &self.inner
    }
}

impl io::Read for BlockingStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.rt.block_on(self.inner.read(buf))
    }
}

impl io::Write for BlockingStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.rt.block_on(self.inner.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.rt.block_on(self.inner.flush())
    }
}

/// A [`PsockListener`] with a blocking `accept`.
pub struct BlockingListener {
    inner: PsockListener,
    rt: Arc<Runtime>,
}

impl BlockingListener {
    /// Bind `addr` (port 0 picks a free port).
    pub fn bind(addr: &str, cfg: PsockConfig) -> io::Result<Self> {
        let rt = runtime()?;
        let inner = rt.block_on(PsockListener::bind(addr, cfg))?;
        Ok(Self { inner, rt })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// Wait for the next complete group.
    pub fn accept(&mut self) -> io::Result<BlockingStream> {
        let inner = self.rt.block_on(self.inner.accept())?;
        Ok(BlockingStream {
            inner,
            rt: self.rt.clone(),
        })
    }
}
