//! A group of one connection: records go straight between the
//! application's buffers and the socket.
//!
//! Over several connections records arrive out of order and must wait in
//! the reorder buffer, and each connection has a task of its own that
//! writes records from the send buffer: one copy more at each end than a
//! socket, and a task hand-off per record. On one connection neither is
//! needed: a write becomes a block header and the application's own bytes
//! in one vectored write, and a read takes a block's payload straight into
//! the application's buffer. The wire format is the same (MODE E blocks
//! with stream offsets, an `EOF|EOD` block announcing one connection at
//! the end), so either end may use the engine instead.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use xftp_stripe::block::{BlockHeader, Descriptor, HEADER_LEN};
use xftp_stripe::StreamStats;
use xftp_tls::Stream;

/// The stream state of a one-connection group.
pub(crate) struct Direct {
    s: Stream,
    /// Largest block this side sends.
    record: usize,
    /// Largest block the peer may send.
    max_block: u64,
    // Sending.
    /// The header of the block being sent, and how much of it went out
    /// (`HEADER_LEN`: none pending).
    hdr_out: [u8; HEADER_LEN],
    hdr_sent: usize,
    /// Payload bytes the current block still owes.
    block_left: u64,
    /// Stream offset of the next byte written.
    out_pos: u64,
    /// The EOF block is queued or sent: no more writes.
    closing: bool,
    sent: StreamStats,
    // Receiving.
    hdr_in: [u8; HEADER_LEN],
    hdr_have: usize,
    /// Payload bytes of the current block not yet read.
    payload_left: u64,
    /// Stream offset of the next byte read.
    in_pos: u64,
    /// The peer's EOF block arrived: end of stream.
    eof: bool,
    received: StreamStats,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Direct {
    pub(crate) fn new(s: Stream, own_record: u32, peer_record: u32) -> Self {
        Direct {
            s,
            record: own_record.max(1) as usize,
            max_block: u64::from(peer_record.max(1)),
            hdr_out: [0; HEADER_LEN],
            hdr_sent: HEADER_LEN,
            block_left: 0,
            out_pos: 0,
            closing: false,
            sent: StreamStats::default(),
            hdr_in: [0; HEADER_LEN],
            hdr_have: 0,
            payload_left: 0,
            in_pos: 0,
            eof: false,
            received: StreamStats::default(),
        }
    }

    pub(crate) fn sent_stats(&self) -> Vec<StreamStats> {
        vec![self.sent]
    }

    pub(crate) fn received_stats(&self) -> Vec<StreamStats> {
        vec![self.received]
    }

    /// Send what is left of a pending header.
    fn poll_header(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.hdr_sent < HEADER_LEN {
            let n = ready!(Pin::new(&mut self.s).poll_write(cx, &self.hdr_out[self.hdr_sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.hdr_sent += n;
        }
        Poll::Ready(Ok(()))
    }

    fn accepted(&mut self, n: usize) -> usize {
        self.block_left -= n as u64;
        self.out_pos += n as u64;
        self.sent.bytes += n as u64;
        n
    }

    pub(crate) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            ready!(self.poll_header(cx))?;
            if self.block_left > 0 {
                let k = buf
                    .len()
                    .min(usize::try_from(self.block_left).unwrap_or(usize::MAX));
                let n = ready!(Pin::new(&mut self.s).poll_write(cx, &buf[..k]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                return Poll::Ready(Ok(self.accepted(n)));
            }
            // A new block: header and payload in one system call.
            let count = buf.len().min(self.record);
            let hdr = BlockHeader::data(self.out_pos, count as u64).encode();
            let bufs = [io::IoSlice::new(&hdr), io::IoSlice::new(&buf[..count])];
            // Nothing is committed until a byte of the header is out.
            let n = ready!(Pin::new(&mut self.s).poll_write_vectored(cx, &bufs))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.hdr_out = hdr;
            self.hdr_sent = n.min(HEADER_LEN);
            self.block_left = count as u64;
            self.sent.records += 1;
            let payload = n.saturating_sub(HEADER_LEN);
            if payload > 0 {
                return Poll::Ready(Ok(self.accepted(payload)));
            }
            // Only (part of) the header went out: send the rest, then
            // payload, before reporting progress.
        }
    }

    pub(crate) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_header(cx))?;
        Pin::new(&mut self.s).poll_flush(cx)
    }

    pub(crate) fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.closing {
            ready!(self.poll_header(cx))?;
            if self.block_left > 0 {
                // A block was announced whose bytes the application never
                // wrote (a write abandoned halfway): the stream cannot
                // end cleanly.
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "shutdown in the middle of a write",
                )));
            }
            self.hdr_out = BlockHeader::eof(1).encode();
            self.hdr_sent = 0;
            self.closing = true;
        }
        ready!(self.poll_header(cx))?;
        ready!(Pin::new(&mut self.s).poll_flush(cx))?;
        Pin::new(&mut self.s).poll_shutdown(cx)
    }

    pub(crate) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            if self.payload_left > 0 {
                let want = buf
                    .remaining()
                    .min(usize::try_from(self.payload_left).unwrap_or(usize::MAX));
                let mut part = buf.take(want);
                ready!(Pin::new(&mut self.s).poll_read(cx, &mut part))?;
                let n = part.filled().len();
                if n == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside a record",
                    )));
                }
                // SAFETY: `part` filled these `n` bytes of `buf`'s
                // unfilled part.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                self.payload_left -= n as u64;
                self.in_pos += n as u64;
                self.received.bytes += n as u64;
                return Poll::Ready(Ok(()));
            }
            while self.hdr_have < HEADER_LEN {
                let mut rb = ReadBuf::new(&mut self.hdr_in[self.hdr_have..]);
                ready!(Pin::new(&mut self.s).poll_read(cx, &mut rb))?;
                let n = rb.filled().len();
                if n == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed before its end-of-data mark",
                    )));
                }
                self.hdr_have += n;
            }
            self.hdr_have = 0;
            let h = BlockHeader::decode(&self.hdr_in)
                .map_err(|e| invalid(e.to_string()))?
                .ok_or_else(|| invalid("short block header".into()))?;
            let d = h.descriptor;
            if d.contains(Descriptor::EOF) {
                if !d.contains(Descriptor::EOD) || h.offset != 1 {
                    return Poll::Ready(Err(invalid(format!(
                        "end of stream announcing {} connections on a group of one",
                        h.offset
                    ))));
                }
                self.eof = true;
                continue;
            }
            if d.contains(Descriptor::EOD) || d.contains(Descriptor::RESTART_MARKER) {
                return Poll::Ready(Err(invalid(
                    "end-of-data or restart block without end of stream".into(),
                )));
            }
            if h.count > self.max_block {
                return Poll::Ready(Err(invalid(format!(
                    "block of {} bytes exceeds the limit of {}",
                    h.count, self.max_block
                ))));
            }
            if h.count > 0 && h.offset != self.in_pos {
                return Poll::Ready(Err(invalid(format!(
                    "block at offset {} where {} was due",
                    h.offset, self.in_pos
                ))));
            }
            self.payload_left = h.count;
            if h.count > 0 {
                self.received.records += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        let (c, s) = tokio::join!(TcpStream::connect(a), l.accept());
        (c.unwrap(), s.unwrap().0)
    }

    /// `Direct` as an `AsyncRead + AsyncWrite` for the tests.
    struct D(Direct);

    impl AsyncRead for D {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.get_mut().0.poll_read(cx, buf)
        }
    }

    impl AsyncWrite for D {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().0.poll_write(cx, b)
        }
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().0.poll_flush(cx)
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().0.poll_shutdown(cx)
        }
    }

    fn data(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    /// The engine's side of a group of one: its receiver and sender over
    /// the two halves of one connection.
    fn engine(
        s: TcpStream,
        record: u32,
    ) -> (
        xftp_stripe::Sender<tokio::io::WriteHalf<TcpStream>>,
        xftp_stripe::Receiver<tokio::io::ReadHalf<TcpStream>>,
    ) {
        let (r, w) = tokio::io::split(s);
        (
            xftp_stripe::Sender::stream(vec![w], record, 1 << 20),
            xftp_stripe::Receiver::stream(vec![r], record, 4 << 20),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_connection_speaks_the_engines_wire_format_both_ways() {
        let (a, b) = pair().await;
        let record = 64 * 1024;
        let mut d = D(Direct::new(Stream::Plain(a), record, record));
        let (tx, rx) = engine(b, record);
        let out = data(3 * 1024 * 1024 + 77, 3);
        let back = data(2 * 1024 * 1024 + 5, 4);
        let write_direct = async {
            // Writes of many sizes, some larger than a record.
            let mut at = 0;
            let mut k = 1usize;
            while at < out.len() {
                let n = (k * 7919 % 200_000).max(1).min(out.len() - at);
                d.write_all(&out[at..at + n]).await.unwrap();
                at += n;
                k += 1;
            }
            d.shutdown().await.unwrap();
            // Reading goes on after our half-close.
            let mut got = Vec::new();
            d.read_to_end(&mut got).await.unwrap();
            got
        };
        let engine_side = async {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 100_000];
            loop {
                let n = std::future::poll_fn(|cx| {
                    let mut rb = ReadBuf::new(&mut buf);
                    rx.poll_read(cx, &mut rb).map_ok(|()| rb.filled().len())
                })
                .await
                .unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let mut at = 0;
            while at < back.len() {
                let n = std::future::poll_fn(|cx| tx.poll_write(cx, &back[at..]))
                    .await
                    .unwrap();
                at += n;
            }
            std::future::poll_fn(|cx| tx.poll_close(cx)).await.unwrap();
            got
        };
        let (from_engine, to_engine) = tokio::join!(write_direct, engine_side);
        assert!(to_engine == out, "direct -> engine");
        assert!(from_engine == back, "engine -> direct");
        assert_eq!(d.0.sent_stats()[0].bytes, out.len() as u64);
        assert_eq!(d.0.received_stats()[0].bytes, back.len() as u64);
    }

    /// What a hostile or broken peer sends, and the error a reader gets.
    async fn read_from_raw(wire: Vec<u8>, max_block: u32) -> io::Result<Vec<u8>> {
        let (a, mut b) = pair().await;
        let mut d = D(Direct::new(Stream::Plain(a), 1024, max_block));
        let w = tokio::spawn(async move {
            b.write_all(&wire).await.unwrap();
            b.shutdown().await.unwrap();
            // Keep the socket until the reader is done.
            let mut sink = Vec::new();
            let _ = b.read_to_end(&mut sink).await;
        });
        let mut got = Vec::new();
        let r = d.read_to_end(&mut got).await.map(|_| got);
        drop(d);
        let _ = w.await;
        r
    }

    fn block(offset: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = BlockHeader::data(offset, payload.len() as u64)
            .encode()
            .to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[tokio::test]
    async fn a_reader_refuses_what_a_group_of_one_cannot_send() {
        let eof = BlockHeader::eof(1).encode().to_vec();
        // In order, then the end: fine.
        let ok = [block(0, b"abc"), block(3, b"de"), eof.clone()].concat();
        assert_eq!(read_from_raw(ok, 1024).await.unwrap(), b"abcde");
        // A block out of order.
        let gap = [block(0, b"abc"), block(4, b"e"), eof.clone()].concat();
        let e = read_from_raw(gap, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // A block above the announced record size.
        let big = [block(0, &[0u8; 2000]), eof.clone()].concat();
        let e = read_from_raw(big, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // An end announcing more connections than the group has.
        let two = [block(0, b"abc"), BlockHeader::eof(2).encode().to_vec()].concat();
        let e = read_from_raw(two, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // Closed inside a record, and closed without an end: never a
        // short stream that looks complete.
        let mut cut = block(0, b"abcdef");
        cut.truncate(HEADER_LEN + 2);
        let e = read_from_raw(cut, 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        let e = read_from_raw(block(0, b"abc"), 1024).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
