//! Imposing a maximum TCP window on every connection crossing the link,
//! without I/O: the window-scale option is replaced by NOPs in SYNs (so no
//! connection can scale its window) and any advertised window above the
//! cap is lowered to it. The TCP checksum is patched incrementally
//! (RFC 1624), so a packet stays valid.
//!
//! This gives programs without a buffer knob (curl, aria2, ...) the small
//! windows of old operating systems; a route's `window` attribute does not
//! hold on current Linux once data flows.

const PROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_WSCALE: u8 = 3;

/// What [`clamp_tcp_window`] changed in one packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowRewrite {
    /// The window-scale option of a SYN was replaced by NOPs.
    pub wscale_removed: bool,
    /// The advertised window was lowered.
    pub window_clamped: bool,
}

impl WindowRewrite {
    /// Whether the packet was modified at all.
    pub fn changed(&self) -> bool {
        self.wscale_removed || self.window_clamped
    }
}

/// Rewrites an IPv4 or IPv6 packet in place so that it advertises at most
/// `max_window` bytes (capped at 65535, the largest unscaled window) and
/// carries no window-scale option. Packets that are not TCP, are
/// fragments past the first, or are malformed, are left alone.
pub fn clamp_tcp_window(packet: &mut [u8], max_window: u32) -> WindowRewrite {
    let Some((start, end)) = tcp_bounds(packet) else {
        return WindowRewrite::default();
    };
    rewrite_tcp(
        &mut packet[start..end],
        max_window.min(u32::from(u16::MAX)) as u16,
    )
}

/// Finds the TCP segment of a packet: `start..end` covering the TCP header
/// and payload, or `None` if it does not hold a whole TCP header.
fn tcp_bounds(packet: &[u8]) -> Option<(usize, usize)> {
    let version = packet.first()? >> 4;
    let (start, end) = match version {
        4 => {
            if packet.len() < 20 {
                return None;
            }
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
            let frag_offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
            if packet[9] != PROTO_TCP || frag_offset != 0 || ihl < 20 {
                return None;
            }
            (ihl, total.min(packet.len()))
        }
        6 => {
            if packet.len() < 40 {
                return None;
            }
            let payload = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
            let end = (40 + payload).min(packet.len());
            let mut next = packet[6];
            let mut at = 40;
            // Skip the extension headers a TCP segment may sit behind;
            // a fragment header (44) means it may not be whole: leave it.
            while matches!(next, 0 | 43 | 60) {
                let hdr = packet.get(at..at + 2)?;
                next = hdr[0];
                at += (usize::from(hdr[1]) + 1) * 8;
            }
            if next != PROTO_TCP {
                return None;
            }
            (at, end)
        }
        _ => return None,
    };
    let tcp = packet.get(start..end)?;
    if tcp.len() < 20 {
        return None;
    }
    let header_len = usize::from(tcp[12] >> 4) * 4;
    if header_len < 20 || header_len > tcp.len() {
        return None;
    }
    Some((start, end))
}

fn rewrite_tcp(tcp: &mut [u8], max_window: u16) -> WindowRewrite {
    let header_len = usize::from(tcp[12] >> 4) * 4;
    // The checksum field is inside the header and unchanged until the end,
    // so it cancels out of the before/after difference.
    let before = ones_complement_sum(&tcp[..header_len], 0);
    let mut done = WindowRewrite::default();

    if tcp[13] & TCP_SYN != 0 {
        let mut i = 20;
        while i < header_len {
            match tcp[i] {
                OPT_END => break,
                OPT_NOP => i += 1,
                kind => {
                    let Some(&len) = tcp.get(i + 1) else { break };
                    let len = usize::from(len);
                    if len < 2 || i + len > header_len {
                        break; // malformed options: touch nothing more
                    }
                    if kind == OPT_WSCALE {
                        tcp[i..i + len].fill(OPT_NOP);
                        done.wscale_removed = true;
                    }
                    i += len;
                }
            }
        }
    }

    let window = u16::from_be_bytes([tcp[14], tcp[15]]);
    if window > max_window {
        tcp[14..16].copy_from_slice(&max_window.to_be_bytes());
        done.window_clamped = true;
    }

    if done.changed() {
        let after = ones_complement_sum(&tcp[..header_len], 0);
        let old = u16::from_be_bytes([tcp[16], tcp[17]]);
        // RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m').
        let sum = fold(u32::from(!old) + u32::from(!before) + u32::from(after));
        tcp[16..18].copy_from_slice(&(!sum).to_be_bytes());
    }
    done
}

/// The 16-bit one's complement sum of `data` (odd length padded with a
/// zero byte), added to `initial`.
fn ones_complement_sum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    fold(sum)
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Whether the TCP checksum of an IPv4 or IPv6 packet is valid (`None` if
/// it is not a TCP packet). Used by tests here and by the link tests.
#[doc(hidden)]
pub fn tcp_checksum_ok(packet: &[u8]) -> Option<bool> {
    let (start, end) = tcp_bounds(packet)?;
    let p = pseudo_header_sum(packet, end - start)?;
    Some(ones_complement_sum(&packet[start..end], u32::from(p)) == 0xffff)
}

/// Sets the TCP checksum of an IPv4 or IPv6 packet from scratch.
#[doc(hidden)]
pub fn set_tcp_checksum(packet: &mut [u8]) -> Option<()> {
    let (start, end) = tcp_bounds(packet)?;
    let p = pseudo_header_sum(packet, end - start)?;
    packet[start + 16..start + 18].fill(0);
    let s = ones_complement_sum(&packet[start..end], u32::from(p));
    packet[start + 16..start + 18].copy_from_slice(&(!s).to_be_bytes());
    Some(())
}

fn pseudo_header_sum(packet: &[u8], tcp_len: usize) -> Option<u16> {
    let mut sum = u32::from(PROTO_TCP) + tcp_len as u32;
    match packet.first()? >> 4 {
        4 => sum += u32::from(ones_complement_sum(packet.get(12..20)?, 0)),
        6 => sum += u32::from(ones_complement_sum(packet.get(8..40)?, 0)),
        _ => return None,
    }
    Some(fold(sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TCP header with options MSS(1460), SACK-permitted, timestamps and
    /// window scale 7 (a typical Linux SYN), window 64240, and a payload.
    fn tcp_syn(window: u16, payload: &[u8]) -> Vec<u8> {
        let mut t = vec![
            0x9c, 0x40, 0x14, 0x51, // ports 40000 -> 5201
            0, 0, 0, 1, // seq
            0, 0, 0, 0, // ack
            0xa0, TCP_SYN, // data offset 10 words, SYN
            0, 0, // window (set below)
            0, 0, 0, 0, // checksum, urgent
            2, 4, 0x05, 0xb4, // MSS 1460
            4, 2, // SACK permitted
            8, 10, 0, 0, 0, 1, 0, 0, 0, 0, // timestamps
            1, // NOP
            3, 3, 7, // window scale 7
        ];
        t[14..16].copy_from_slice(&window.to_be_bytes());
        t.extend_from_slice(payload);
        t
    }

    fn ipv4(tcp: &[u8]) -> Vec<u8> {
        let total = (20 + tcp.len()) as u16;
        let mut p = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, PROTO_TCP, 0, 0];
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        p.extend_from_slice(tcp);
        set_tcp_checksum(&mut p).expect("tcp");
        p
    }

    fn ipv6(tcp: &[u8], hop_by_hop: bool) -> Vec<u8> {
        let mut ext = Vec::new();
        let first_next = if hop_by_hop {
            // Hop-by-hop header of 8 bytes: next = TCP, len 0, PadN.
            ext.extend_from_slice(&[PROTO_TCP, 0, 1, 4, 0, 0, 0, 0]);
            0
        } else {
            PROTO_TCP
        };
        let payload = (ext.len() + tcp.len()) as u16;
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&payload.to_be_bytes());
        p.extend_from_slice(&[first_next, 64]);
        p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p.extend_from_slice(&ext);
        p.extend_from_slice(tcp);
        set_tcp_checksum(&mut p).expect("tcp");
        p
    }

    fn options(packet: &[u8], tcp_start: usize) -> &[u8] {
        &packet[tcp_start + 20..tcp_start + 40]
    }

    #[test]
    fn syn_loses_its_window_scale_and_keeps_a_valid_checksum_v4() {
        let mut p = ipv4(&tcp_syn(64240, b""));
        assert_eq!(tcp_checksum_ok(&p), Some(true));
        let r = clamp_tcp_window(&mut p, 65536);
        assert_eq!(
            r,
            WindowRewrite {
                wscale_removed: true,
                window_clamped: false
            }
        );
        // Only the three option bytes changed, to NOPs; MSS etc. intact.
        assert_eq!(&options(&p, 20)[..4], &[2, 4, 0x05, 0xb4]);
        assert_eq!(&options(&p, 20)[17..20], &[1, 1, 1]);
        assert_eq!(tcp_checksum_ok(&p), Some(true));
    }

    #[test]
    fn large_window_is_clamped_with_a_valid_checksum_v4() {
        let mut t = tcp_syn(65535, b"some payload, odd length");
        t[13] = 0x10; // plain ACK: options untouched even if they look like wscale
        let mut p = ipv4(&t);
        let r = clamp_tcp_window(&mut p, 24 * 1024);
        assert_eq!(
            r,
            WindowRewrite {
                wscale_removed: false,
                window_clamped: true
            }
        );
        assert_eq!(u16::from_be_bytes([p[34], p[35]]), 24576);
        assert_eq!(&options(&p, 20)[17..20], &[3, 3, 7]);
        assert_eq!(tcp_checksum_ok(&p), Some(true));
    }

    #[test]
    fn small_window_is_left_alone() {
        let mut t = tcp_syn(1000, b"x");
        t[13] = 0x10;
        let mut p = ipv4(&t);
        let before = p.clone();
        assert!(!clamp_tcp_window(&mut p, 65536).changed());
        assert_eq!(p, before);
    }

    #[test]
    fn ipv6_with_and_without_extension_headers() {
        for hbh in [false, true] {
            let mut p = ipv6(&tcp_syn(65535, b"abc"), hbh);
            let start = if hbh { 48 } else { 40 };
            assert_eq!(tcp_checksum_ok(&p), Some(true));
            let r = clamp_tcp_window(&mut p, 4096);
            assert!(r.wscale_removed && r.window_clamped, "{r:?}");
            assert_eq!(u16::from_be_bytes([p[start + 14], p[start + 15]]), 4096);
            assert_eq!(&options(&p, start)[17..20], &[1, 1, 1]);
            assert_eq!(tcp_checksum_ok(&p), Some(true));
        }
    }

    #[test]
    fn checksum_patch_matches_a_full_recompute_for_many_windows() {
        for w in [0u16, 1, 0x00ff, 0xff00, 0x8000, 0xfffe, 0xffff] {
            for cap in [0u32, 1, 1000, 0x8001, 65535] {
                let mut t = tcp_syn(w, &[0xff; 13]);
                t[13] = 0x12; // SYN-ACK
                let mut p = ipv4(&t);
                clamp_tcp_window(&mut p, cap);
                let mut fresh = p.clone();
                set_tcp_checksum(&mut fresh).expect("tcp");
                assert_eq!(&p[36..38], &fresh[36..38], "w={w} cap={cap}");
            }
        }
    }

    #[test]
    fn non_tcp_fragments_and_garbage_are_ignored() {
        let mut udp = ipv4(&tcp_syn(65535, b""));
        udp[9] = 17;
        let before = udp.clone();
        assert!(!clamp_tcp_window(&mut udp, 1).changed());
        assert_eq!(udp, before);

        let mut frag = ipv4(&tcp_syn(65535, b""));
        frag[7] = 8; // fragment offset 64 bytes
        assert!(!clamp_tcp_window(&mut frag, 1).changed());

        let mut v6frag = ipv6(&tcp_syn(65535, b""), false);
        v6frag[6] = 44;
        assert!(!clamp_tcp_window(&mut v6frag, 1).changed());

        for len in 0..60 {
            let mut short = ipv4(&tcp_syn(65535, b""))[..len].to_vec();
            clamp_tcp_window(&mut short, 1); // must not panic
        }
        let mut bad_doff = ipv4(&tcp_syn(65535, b""));
        bad_doff[32] = 0xf0; // 60-byte header in a 40-byte segment
        assert!(!clamp_tcp_window(&mut bad_doff, 1).changed());
    }

    #[test]
    fn malformed_options_stop_the_scan_without_panicking() {
        let mut t = tcp_syn(100, b"");
        t[20] = 2;
        t[21] = 0; // option length 0 is invalid
        let mut p = ipv4(&t);
        assert!(!clamp_tcp_window(&mut p, 65535).changed());
        let mut t = tcp_syn(100, b"");
        t[36] = 3;
        t[37] = 9; // runs past the header
        let mut p = ipv4(&t);
        assert!(!clamp_tcp_window(&mut p, 65535).changed());
    }
}
