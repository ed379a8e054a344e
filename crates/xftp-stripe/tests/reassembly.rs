//! Sans-IO property test: scheduler -> block framing -> random delivery
//! interleaving -> reassembly reproduces the data exactly.

use proptest::prelude::*;
use xftp_stripe::block::{BlockHeader, HEADER_LEN};
use xftp_stripe::reasm::Reassembly;
use xftp_stripe::sched::{Next, Scheduler};

/// Encode `data` as per-connection block streams, the scheduler picking
/// connections in the order given by `picks`.
fn encode(data: &[u8], rs: u32, n: usize, picks: &[usize], static_: bool) -> Vec<Vec<u8>> {
    let len = data.len() as u64;
    let mut s = if static_ {
        Scheduler::fixed(rs, len, n)
    } else {
        let mut s = Scheduler::dynamic(rs, len);
        for _ in 0..n {
            s.add_conn().unwrap();
        }
        s
    };
    let mut out = vec![Vec::new(); n];
    let mut done = vec![false; n];
    let mut i = 0;
    let mut ended = 0;
    while ended < n {
        let mut c = (picks[i % picks.len()] + i / picks.len()) % n;
        i += 1;
        if done[c] {
            // Finished connections take no turn; the next open one does.
            c = done.iter().position(|d| !d).unwrap_or(c);
        }
        match s.next(c) {
            Next::Record { offset, len } => {
                out[c].extend_from_slice(&BlockHeader::data(offset, len).encode());
                out[c].extend_from_slice(&data[offset as usize..(offset + len) as usize]);
            }
            Next::Done => {
                done[c] = true;
                ended += 1;
                let h = if ended == n {
                    BlockHeader::eof(n as u64)
                } else {
                    BlockHeader::eod()
                };
                out[c].extend_from_slice(&h.encode());
            }
            Next::Wait => unreachable!(),
        }
    }
    out
}

/// Per-connection incremental parser feeding a shared Reassembly.
struct Conn {
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    at: usize,
    payload: Option<(u64, u64)>,
}

fn deliver(
    streams: &[Vec<u8>],
    chunks: &[(usize, usize)],
) -> Result<(Reassembly, Vec<u8>), String> {
    let n = streams.len();
    let mut r = Reassembly::new();
    for _ in 0..n {
        r.add_conn();
    }
    let mut pos = vec![0usize; n];
    let mut conns: Vec<Conn> = (0..n)
        .map(|_| Conn {
            buf: Vec::new(),
            at: 0,
            payload: None,
        })
        .collect();
    let mut out = Vec::new();
    let mut k = 0;
    while pos.iter().zip(streams).any(|(p, s)| *p < s.len()) {
        let (pick, size) = chunks[k % chunks.len()];
        k += 1;
        let mut c = (pick + k) % n;
        if pos[c] >= streams[c].len() {
            // Drained connections take no turn; the next unfinished one does.
            c = (0..n).find(|&i| pos[i] < streams[i].len()).unwrap_or(c);
        }
        let s = &streams[c];
        let take = size.min(s.len() - pos[c]);
        let cn = &mut conns[c];
        cn.buf.drain(..cn.at);
        cn.at = 0;
        cn.buf.extend_from_slice(&s[pos[c]..pos[c] + take]);
        pos[c] += take;
        loop {
            let cn = &mut conns[c];
            if let Some((off, left)) = cn.payload {
                let m = (left as usize).min(cn.buf.len() - cn.at);
                if m == 0 {
                    break;
                }
                let end = off as usize + m;
                if out.len() < end {
                    out.resize(end, 0);
                }
                out[off as usize..end].copy_from_slice(&cn.buf[cn.at..cn.at + m]);
                cn.at += m;
                cn.payload = (left > m as u64).then(|| (off + m as u64, left - m as u64));
                if cn.payload.is_none() {
                    r.on_payload_done();
                }
                continue;
            }
            match BlockHeader::decode(&cn.buf[cn.at..]).map_err(|e| e.to_string())? {
                None => break,
                Some(h) => {
                    cn.at += HEADER_LEN;
                    let acc = r.on_header(c, &h).map_err(|e| e.to_string())?;
                    cn.payload = acc.data;
                }
            }
        }
    }
    for c in 0..n {
        r.on_closed(c).map_err(|e| e.to_string())?;
    }
    Ok((r, out))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_interleavings_reassemble_exactly(
        len in 0usize..40_000,
        rs in 16u32..3000,
        n in 1usize..12,
        static_ in any::<bool>(),
        picks in prop::collection::vec(0usize..64, 1..40),
        chunks in prop::collection::vec((0usize..64, 1usize..5000), 1..40),
    ) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let streams = encode(&data, rs, n, &picks, static_);
        let (r, out) = deliver(&streams, &chunks).unwrap();
        prop_assert!(r.is_done());
        prop_assert_eq!(r.finish(Some(len as u64)), Ok(len as u64));
        prop_assert!(out == data);
    }

    #[test]
    fn truncated_connection_is_never_success(
        len in 1usize..20_000,
        rs in 16u32..3000,
        n in 1usize..8,
        victim in 0usize..8,
        cut in 0usize..100,
        chunks in prop::collection::vec((0usize..64, 1usize..5000), 1..20),
    ) {
        let data = vec![1u8; len];
        let mut streams = encode(&data, rs, n, &[0, 1, 2, 3, 4, 5, 6, 7], false);
        let v = victim % n;
        let keep = streams[v].len() * cut / 100;
        streams[v].truncate(keep);
        match deliver(&streams, &chunks) {
            Err(_) => {}
            Ok((r, _)) => {
                prop_assert!(!r.is_done());
                prop_assert!(r.finish(Some(len as u64)).is_err());
            }
        }
    }
}
