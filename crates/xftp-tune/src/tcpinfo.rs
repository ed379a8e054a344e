//! `TCP_INFO` (Linux): RTT, congestion window, retransmissions of a socket.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// The fields xftp uses from `struct tcp_info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed RTT as the kernel estimates it (sender side).
    pub rtt: Duration,
    /// RTT variance.
    pub rttvar: Duration,
    /// Minimum RTT seen on this connection (0 if unknown).
    pub min_rtt: Duration,
    /// Receiver-side RTT estimate (useful on a connection that only receives).
    pub rcv_rtt: Duration,
    /// Congestion window, in segments.
    pub snd_cwnd: u32,
    /// Sender MSS.
    pub snd_mss: u32,
    /// Segments sent and not yet acknowledged in order.
    pub unacked: u32,
    /// Segments selectively acknowledged, not yet acknowledged in order.
    pub sacked: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Segments sent (0 on kernels without the field).
    pub segs_out: u32,
    /// Segments received (0 on kernels without the field).
    pub segs_in: u32,
    /// Bytes acknowledged by the peer (0 on old kernels).
    pub bytes_acked: u64,
    /// Bytes received (0 on old kernels).
    pub bytes_received: u64,
    /// Data segments the peer has acknowledged or selectively
    /// acknowledged, retransmissions counted once (0 on kernels before
    /// 4.18). Unlike `bytes_acked` it does not jump when a retransmission
    /// fills a hole.
    pub delivered: u32,
    /// Segments received that carried data (0 on kernels before 4.6).
    pub data_segs_in: u32,
    /// Microseconds the connection had data to send (0 on kernels before
    /// 4.9).
    pub busy_us: u64,
    /// Of those, microseconds the receiver's window held it back.
    pub rwnd_limited_us: u64,
}

impl TcpInfo {
    /// Whether, between the reading `prev` and this one of the same
    /// connection, the receiver's window held it back for most of the
    /// time it had data to send. Its RTT then says little about a router
    /// queue: a receiver that reads slowly opens its window a little at a
    /// time and delays its acknowledgements, so a loopback connection
    /// through a proxy that read 4 KiB at a time showed 20 ms of "RTT"
    /// over a 10 µs floor. (More connections do help there: each has a
    /// window of its own.)
    pub fn receiver_limited_since(&self, prev: &TcpInfo) -> bool {
        let busy = self.busy_us.saturating_sub(prev.busy_us);
        let rwnd = self.rwnd_limited_us.saturating_sub(prev.rwnd_limited_us);
        busy > 0 && rwnd.saturating_mul(2) > busy
    }

    /// Bytes the peer has received, in order or not: the bytes it
    /// acknowledged in order plus the segments it acknowledged selectively
    /// (× MSS). Unlike `bytes_acked` alone it does not jump when a
    /// retransmission fills a hole. 0 on kernels without `bytes_acked`.
    pub fn delivered_bytes(&self) -> u64 {
        if self.bytes_acked == 0 {
            return 0;
        }
        self.bytes_acked + u64::from(self.sacked) * u64::from(self.snd_mss)
    }
}

// Offsets into struct tcp_info (include/uapi/linux/tcp.h); stable ABI,
// fields are only ever appended.
const OFF_SND_MSS: usize = 16;
const OFF_UNACKED: usize = 24;
const OFF_SACKED: usize = 28;
const OFF_RTT: usize = 68;
const OFF_RTTVAR: usize = 72;
const OFF_SND_CWND: usize = 80;
const OFF_RCV_RTT: usize = 92;
const OFF_TOTAL_RETRANS: usize = 100;
const OFF_BYTES_ACKED: usize = 120;
const OFF_BYTES_RECEIVED: usize = 128;
const OFF_SEGS_OUT: usize = 136;
const OFF_SEGS_IN: usize = 140;
const OFF_MIN_RTT: usize = 148;
const OFF_DATA_SEGS_IN: usize = 152;
const OFF_BUSY_TIME: usize = 168;
const OFF_RWND_LIMITED: usize = 176;
const OFF_DELIVERED: usize = 192;

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Decode the kernel's `tcp_info` bytes (as many as it returned).
pub fn decode(b: &[u8]) -> TcpInfo {
    let us = |off| Duration::from_micros(u64::from(u32_at(b, off)));
    TcpInfo {
        rtt: us(OFF_RTT),
        rttvar: us(OFF_RTTVAR),
        min_rtt: us(OFF_MIN_RTT),
        rcv_rtt: us(OFF_RCV_RTT),
        snd_cwnd: u32_at(b, OFF_SND_CWND),
        snd_mss: u32_at(b, OFF_SND_MSS),
        unacked: u32_at(b, OFF_UNACKED),
        sacked: u32_at(b, OFF_SACKED),
        total_retrans: u32_at(b, OFF_TOTAL_RETRANS),
        segs_out: u32_at(b, OFF_SEGS_OUT),
        segs_in: u32_at(b, OFF_SEGS_IN),
        bytes_acked: u64_at(b, OFF_BYTES_ACKED),
        bytes_received: u64_at(b, OFF_BYTES_RECEIVED),
        delivered: u32_at(b, OFF_DELIVERED),
        data_segs_in: u32_at(b, OFF_DATA_SEGS_IN),
        busy_us: u64_at(b, OFF_BUSY_TIME),
        rwnd_limited_us: u64_at(b, OFF_RWND_LIMITED),
    }
}

/// Read `TCP_INFO` of a connected TCP socket.
#[cfg(target_os = "linux")]
pub fn read(sock: &impl AsRawFd) -> std::io::Result<TcpInfo> {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the fd is a live socket borrowed for the call; buf and len
    // describe a writable buffer of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(decode(&buf[..(len as usize).min(buf.len())]))
}

/// `TCP_INFO` is Linux-only; elsewhere this reports `Unsupported`.
#[cfg(not(target_os = "linux"))]
pub fn read(_sock: &impl AsRawFd) -> std::io::Result<TcpInfo> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "TCP_INFO needs Linux",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_short_buffer_is_zero_not_panic() {
        assert_eq!(decode(&[]), TcpInfo::default());
        assert_eq!(decode(&[1, 2, 3]), TcpInfo::default());
    }

    /// In order plus selectively acknowledged: `tcpi_unacked` (just before
    /// `tcpi_sacked`) and `tcpi_lost` (just after) hold other counts, so
    /// reading a neighbour shows.
    #[test]
    fn delivered_bytes_adds_the_sacked_segments() {
        let mut b = vec![0u8; 232];
        b[16..20].copy_from_slice(&1448u32.to_ne_bytes()); // snd_mss
        b[24..28].copy_from_slice(&40u32.to_ne_bytes()); // unacked
        b[28..32].copy_from_slice(&3u32.to_ne_bytes()); // sacked
        b[32..36].copy_from_slice(&5u32.to_ne_bytes()); // lost
        b[120..128].copy_from_slice(&1_000_000u64.to_ne_bytes()); // bytes_acked
        let i = decode(&b);
        assert_eq!(i.delivered_bytes(), 1_000_000 + 3 * 1448);
        assert_eq!(i.unacked, 40);
        assert_eq!(TcpInfo::default().delivered_bytes(), 0);
    }

    /// A connected loopback pair: (client, server side).
    #[cfg(target_os = "linux")]
    fn loopback_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn loopback_connection_has_an_rtt() {
        use std::io::{Read, Write};
        let (mut c, mut s) = loopback_pair();
        for _ in 0..10 {
            c.write_all(&[0u8; 1000]).unwrap();
            let mut b = [0u8; 1000];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b[..1]).unwrap();
            c.read_exact(&mut b[..1]).unwrap();
        }
        let i = read(&c).unwrap();
        assert!(
            i.rtt > Duration::ZERO && i.rtt < Duration::from_millis(100),
            "{i:?}"
        );
        assert!(i.snd_mss > 0 && i.snd_cwnd > 0, "{i:?}");
        assert!(i.bytes_acked >= 10_000, "{i:?}");
        assert!(i.segs_out >= 10, "{i:?}");
        assert!(i.delivered >= 10, "{i:?}");
        assert!(
            i.min_rtt > Duration::ZERO && i.min_rtt <= i.rtt + i.rttvar,
            "{i:?}"
        );
    }

    /// A socket that only sends has received no data segments: the field
    /// after `min_rtt` (`data_segs_in`) is 0 there, so reading the wrong
    /// one shows.
    #[cfg(target_os = "linux")]
    #[test]
    fn min_rtt_of_a_sending_socket() {
        use std::io::{Read, Write};
        let (mut c, mut s) = loopback_pair();
        c.write_all(&[7u8; 5000]).unwrap();
        let mut b = [0u8; 5000];
        s.read_exact(&mut b).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let i = loop {
            let i = read(&c).unwrap();
            if i.bytes_acked >= 5000 || std::time::Instant::now() > deadline {
                break i;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(i.bytes_acked >= 5000, "{i:?}");
        assert!(i.min_rtt > Duration::ZERO, "{i:?}");
    }

    /// A sender whose peer does not read fills the peer's window: the
    /// kernel counts that time as receiver-limited.
    #[test]
    fn a_receiver_that_does_not_read_holds_the_sender_back() {
        use std::io::Write;
        let (mut c, s) = loopback_pair();
        s.set_nonblocking(true).unwrap();
        let before = read(&c).unwrap();
        c.set_nonblocking(true).unwrap();
        let chunk = vec![1u8; 1 << 16];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // Fill the peer's receive buffer and our send buffer.
        while std::time::Instant::now() < deadline {
            match c.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let after = read(&c).unwrap();
        assert!(after.busy_us > before.busy_us, "{after:?}");
        assert!(
            after.receiver_limited_since(&before),
            "{before:?} {after:?}"
        );
        // Nothing happened since: not limited between two equal readings.
        assert!(!after.receiver_limited_since(&after));
        drop(s);
    }
}
