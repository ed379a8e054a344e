//! Positional storage traits.

use std::io;
use std::sync::Mutex;

/// Read at an absolute offset without moving any shared cursor, so that
/// many connection tasks can read one file concurrently. Blocking: the
/// engine calls it from `spawn_blocking`.
pub trait ReadAt: Send + Sync + 'static {
    /// Read up to `buf.len()` bytes at `offset`; `Ok(0)` means end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

/// Write at an absolute offset (records arrive in any order). Blocking:
/// the engine calls it from `spawn_blocking`.
pub trait WriteAt: Send + Sync + 'static {
    /// Write all of `buf` at `offset`, extending the file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

impl WriteAt for std::fs::File {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }
}

/// An in-memory file (tests, examples, small buffers).
#[derive(Debug, Default)]
pub struct MemFile(Mutex<Vec<u8>>);

impl MemFile {
    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic while holding this lock leaves plain bytes behind: usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl From<Vec<u8>> for MemFile {
    fn from(v: Vec<u8>) -> Self {
        Self(Mutex::new(v))
    }
}

impl ReadAt for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let v = self.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
        let n = buf.len().min(v.len() - start);
        buf[..n].copy_from_slice(&v[start..start + n]);
        Ok(n)
    }
}

impl WriteAt for MemFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut v = self.lock();
        let start = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let end = start
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        if v.len() < end {
            v.resize(end, 0);
        }
        v[start..end].copy_from_slice(buf);
        Ok(())
    }
}
