//! Property test: random record sizes, connection counts, write sizes and
//! per-connection pipe capacities (hence delivery interleavings) always
//! reassemble the exact byte stream, within the reorder cap.

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xftp_stripe::{Receiver, Sender};

struct Out {
    data: Vec<u8>,
    peak: u64,
    cap: u64,
}

async fn run(
    data: Vec<u8>,
    rs: u32,
    pipes: Vec<usize>,
    writes: Vec<usize>,
    cap: usize,
    reads: usize,
) -> Out {
    let (tx, rx): (Vec<_>, Vec<_>) = pipes.iter().map(|&c| tokio::io::duplex(c)).unzip();
    let mut s = StreamW(Sender::stream(tx, rs, 3 * rs as usize));
    let mut r = StreamR(Receiver::stream(rx, rs, cap));
    let writer = async {
        let mut at = 0;
        let mut i = 0;
        while at < data.len() {
            let n = writes[i % writes.len()].min(data.len() - at);
            s.write_all(&data[at..at + n]).await.unwrap();
            if i % 3 == 0 {
                s.flush().await.unwrap();
            }
            at += n;
            i += 1;
        }
        s.shutdown().await.unwrap();
    };
    let reader = async {
        let mut out = Vec::new();
        let mut buf = vec![0u8; reads];
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    };
    let ((), out) = tokio::join!(writer, reader);
    let (peak, cap) = r.0.reorder_usage();
    Out {
        data: out,
        peak,
        cap,
    }
}

// Thin AsyncRead/AsyncWrite adapters over the engine's poll functions.
struct StreamW<S>(Sender<S>);
struct StreamR<S>(Receiver<S>);

impl<S: tokio::io::AsyncWrite + xftp_stripe::DataSocket + Unpin + Send + 'static>
    tokio::io::AsyncWrite for StreamW<S>
{
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        b: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.0.poll_write(cx, b)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.poll_close(cx)
    }
}

impl<S: tokio::io::AsyncRead + xftp_stripe::DataSocket + Unpin + Send + 'static>
    tokio::io::AsyncRead for StreamR<S>
{
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        b: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0.poll_read(cx, b)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_streams_reassemble_exactly(
        len in 0usize..200_000,
        rs in 1u32..20_000,
        pipes in prop::collection::vec(1usize..50_000, 1..9),
        writes in prop::collection::vec(1usize..70_000, 1..8),
        cap_records in 2usize..8,
        reads in 1usize..100_000,
    ) {
        let data: Vec<u8> = (0..len).map(|i| (i ^ (i >> 9)) as u8).collect();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let cap = cap_records * rs as usize;
        let out = rt.block_on(run(data.clone(), rs, pipes, writes, cap, reads));
        prop_assert!(out.data == data);
        prop_assert!(out.peak <= out.cap);
    }
}
