//! Imposing a maximum TCP window on every connection crossing the link,
//! without I/O. Caps up to 65535 bytes are stateless: the window-scale
//! option is replaced by NOPs in SYNs (so no connection can scale its
//! window) and any advertised window above the cap is lowered to it.
//! Larger caps need window scaling, so [`WindowClamp`] keeps it, learns
//! each connection's shift from its SYN and lowers the scaled window. The
//! TCP checksum is patched incrementally (RFC 1624), so a packet stays
//! valid.
//!
//! This gives programs without a buffer knob (curl, aria2, ...) the small
//! windows of old operating systems; a route's `window` attribute does not
//! hold on current Linux once data flows.

const PROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_WSCALE: u8 = 3;
const TCP_RST: u8 = 0x04;
/// Connections remembered per direction before the table is reset (a
/// connection that outlives a reset is no longer capped).
const MAX_FLOWS: usize = 1 << 16;

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
        true,
        max_window.min(u32::from(u16::MAX)) as u16,
    )
    .0
}

/// One direction's window cap, for any size. Up to 65535 bytes it is
/// [`clamp_tcp_window`]; above, window scaling stays on and each
/// connection's shift (announced in the SYN of the side whose window the
/// packets of this direction carry) is remembered, so the advertised
/// window can be lowered to `max_window >> shift`. A connection whose SYN
/// was not seen counts as unscaled (at most 65535 bytes, never more than
/// the cap).
#[derive(Debug)]
pub struct WindowClamp {
    max_window: u32,
    shifts: std::collections::HashMap<FlowKey, u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    src: [u8; 16],
    dst: [u8; 16],
    ports: [u8; 4],
}

impl WindowClamp {
    /// A cap of `max_window` bytes per connection.
    pub fn new(max_window: u32) -> Self {
        WindowClamp {
            max_window,
            shifts: std::collections::HashMap::new(),
        }
    }

    /// Rewrites one packet of this direction in place.
    pub fn apply(&mut self, packet: &mut [u8]) -> WindowRewrite {
        if self.max_window <= u32::from(u16::MAX) {
            return clamp_tcp_window(packet, self.max_window);
        }
        let Some((start, end)) = tcp_bounds(packet) else {
            return WindowRewrite::default();
        };
        let Some(key) = flow_key(packet, start) else {
            return WindowRewrite::default();
        };
        let flags = packet[start + 13];
        if flags & TCP_SYN != 0 {
            // The window of a SYN is never scaled: nothing to lower
            // unless it exceeds the cap, which 16 bits cannot.
            let (_, shift) = rewrite_tcp(&mut packet[start..end], false, u16::MAX);
            if self.shifts.len() >= MAX_FLOWS {
                self.shifts.clear();
            }
            // RFC 7323: a shift above 14 is used as 14.
            self.shifts.insert(key, shift.unwrap_or(0).min(14));
            return WindowRewrite::default();
        }
        let shift = if flags & TCP_RST != 0 {
            self.shifts.remove(&key).unwrap_or(0)
        } else {
            self.shifts.get(&key).copied().unwrap_or(0)
        };
        let limit = (self.max_window >> shift).min(u32::from(u16::MAX)) as u16;
        rewrite_tcp(&mut packet[start..end], false, limit).0
    }
}

fn flow_key(packet: &[u8], tcp_start: usize) -> Option<FlowKey> {
    let mut key = FlowKey {
        src: [0; 16],
        dst: [0; 16],
        ports: [0; 4],
    };
    match packet.first()? >> 4 {
        4 => {
            key.src[..4].copy_from_slice(packet.get(12..16)?);
            key.dst[..4].copy_from_slice(packet.get(16..20)?);
        }
        6 => {
            key.src.copy_from_slice(packet.get(8..24)?);
            key.dst.copy_from_slice(packet.get(24..40)?);
        }
        _ => return None,
    }
    key.ports
        .copy_from_slice(packet.get(tcp_start..tcp_start + 4)?);
    Some(key)
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

/// Turns a TCP segment of an established flow into a reset of that flow:
/// flags RST|ACK with the segment's own sequence number (the one its
/// receiver expects next when the flow is in order), no payload, lengths
/// and checksums fixed. Returns the new packet length, or `None` (packet
/// left unchanged) for anything but a non-SYN, non-RST TCP segment.
pub fn make_rst(packet: &mut [u8]) -> Option<usize> {
    let (start, _) = tcp_bounds(packet)?;
    let flags = packet[start + 13];
    if flags & (TCP_SYN | TCP_RST) != 0 {
        return None;
    }
    let header_len = usize::from(packet[start + 12] >> 4) * 4;
    let new_len = start + header_len;
    packet[start + 13] = TCP_RST | TCP_ACK;
    match packet[0] >> 4 {
        4 => {
            let total = u16::try_from(new_len).ok()?;
            packet[2..4].copy_from_slice(&total.to_be_bytes());
            packet[10..12].copy_from_slice(&[0, 0]);
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let sum = fold(u32::from(ones_complement_sum(&packet[..ihl], 0)));
            packet[10..12].copy_from_slice(&(!sum).to_be_bytes());
        }
        _ => {
            let payload = u16::try_from(new_len - 40).ok()?;
            packet[4..6].copy_from_slice(&payload.to_be_bytes());
        }
    }
    set_tcp_checksum(&mut packet[..new_len])?;
    Some(new_len)
}

const TCP_ACK: u8 = 0x10;

/// Lowers the window field to `max_window`, and in a SYN replaces the
/// window-scale option by NOPs when `strip_wscale`; returns what changed
/// and the shift the SYN announced, if any.
fn rewrite_tcp(tcp: &mut [u8], strip_wscale: bool, max_window: u16) -> (WindowRewrite, Option<u8>) {
    let header_len = usize::from(tcp[12] >> 4) * 4;
    // The checksum field is inside the header and unchanged until the end,
    // so it cancels out of the before/after difference.
    let before = ones_complement_sum(&tcp[..header_len], 0);
    let mut done = WindowRewrite::default();
    let mut shift = None;

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
                        if len == 3 {
                            shift = Some(tcp[i + 2]);
                        }
                        if strip_wscale {
                            tcp[i..i + len].fill(OPT_NOP);
                            done.wscale_removed = true;
                        }
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
    (done, shift)
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

/// Payload bytes a flow must have carried (in one direction) before a
/// [`Blackhole`] starts for it to be blackholed: bulk data connections,
/// not control connections.
pub const BLACKHOLE_BULK: u64 = 256 * 1024;

/// Fault injection without I/O: from `from` on, for `len`, every segment
/// of a TCP flow that carried [`BLACKHOLE_BULK`] payload bytes or more
/// (in this direction) before `from` is dropped. Flows with less (control
/// connections) and flows opened later pass: the path works, the bulk
/// connections it had are dead, as behind a middlebox that lost their
/// state, or as connections a long stall left in retransmission backoff.
#[derive(Debug, Clone)]
pub struct Blackhole {
    from: u64,
    until: u64,
    carried: std::collections::HashMap<FlowKey, u64>,
}

impl Blackhole {
    /// A blackhole from `from` nanoseconds after the link's start, for
    /// `len` nanoseconds.
    pub fn new(from: u64, len: u64) -> Blackhole {
        Blackhole {
            from,
            until: from.saturating_add(len),
            carried: std::collections::HashMap::new(),
        }
    }

    /// Whether `packet`, seen `now` nanoseconds after the link's start,
    /// is to be dropped.
    pub fn drops(&mut self, packet: &[u8], now: u64) -> bool {
        if now >= self.until {
            return false;
        }
        let Some((key, payload)) = segment(packet) else {
            return false;
        };
        if now < self.from {
            if self.carried.len() < MAX_FLOWS || self.carried.contains_key(&key) {
                *self.carried.entry(key).or_default() += payload;
            }
            return false;
        }
        self.carried.get(&key).is_some_and(|&n| n >= BLACKHOLE_BULK)
    }
}

/// A TCP segment's flow, and its payload length.
fn segment(packet: &[u8]) -> Option<(FlowKey, u64)> {
    let (start, end) = tcp_bounds(packet)?;
    let key = flow_key(packet, start)?;
    let header_len = usize::from(packet[start + 12] >> 4) * 4;
    Some((key, end.saturating_sub(start + header_len) as u64))
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
    fn a_segment_becomes_a_valid_reset() {
        let mut tcp = tcp_syn(1000, b"payload bytes");
        tcp[13] = TCP_ACK; // an established flow's segment
        let mut p = ipv4(&tcp);
        set_tcp_checksum(&mut p).unwrap();
        let n = make_rst(&mut p).unwrap();
        let p = &p[..n];
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), n);
        assert_eq!(p[20 + 13], TCP_RST | TCP_ACK);
        assert_eq!(tcp_checksum_ok(p), Some(true));
        // The IPv4 header checksum sums to 0xffff.
        assert_eq!(fold(u32::from(ones_complement_sum(&p[..20], 0))), 0xffff);
        // Sequence number kept.
        assert_eq!(&p[24..28], &tcp[4..8]);
        // SYNs and resets are left alone.
        let mut syn = ipv4(&tcp_syn(1000, b""));
        assert_eq!(make_rst(&mut syn), None);
        let mut v6 = ipv6(&tcp, false);
        let n = make_rst(&mut v6).unwrap();
        assert_eq!(tcp_checksum_ok(&v6[..n]), Some(true));
    }

    #[test]
    fn a_blackhole_drops_the_bulk_flows_it_saw_and_nothing_else() {
        let mut bulk = tcp_syn(1000, &[7u8; 1000]);
        bulk[13] = TCP_ACK;
        let bulk = ipv4(&bulk);
        // Another flow (ports 40001 -> 5201) with little payload.
        let mut ctl = tcp_syn(1000, b"RETR f");
        ctl[13] = TCP_ACK;
        ctl[1] = 0x41;
        let ctl = ipv4(&ctl);
        let mut b = Blackhole::new(1_000, 500);
        for t in 0..300 {
            assert!(!b.drops(&bulk, t));
            assert!(!b.drops(&ctl, t));
        }
        assert!(b.drops(&bulk, 1_000));
        assert!(b.drops(&bulk, 1_499));
        assert!(!b.drops(&ctl, 1_200), "a flow with little payload passes");
        // A flow first seen during the blackhole passes.
        let mut new = tcp_syn(1000, &[7u8; 1000]);
        new[13] = TCP_ACK;
        new[1] = 0x42;
        let new = ipv4(&new);
        for t in 1_000..1_400 {
            assert!(!b.drops(&new, t));
        }
        // And after it, everything passes again.
        assert!(!b.drops(&bulk, 1_500));
        // Not TCP, or too short: passes.
        assert!(!b.drops(&[0x45, 0, 0], 1_200));
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

    fn window_of(p: &[u8]) -> u16 {
        u16::from_be_bytes([p[34], p[35]])
    }

    #[test]
    fn caps_above_64k_keep_scaling_and_lower_the_scaled_window() {
        let mut clamp = WindowClamp::new(192 * 1024);
        // The SYN keeps its window-scale option (shift 7) untouched.
        let mut syn = ipv4(&tcp_syn(64240, b""));
        let before = syn.clone();
        assert!(!clamp.apply(&mut syn).changed());
        assert_eq!(syn, before);
        // Later segments of that connection: 65535 << 7 is lowered to
        // 192 KiB >> 7 = 1536 units, with a valid checksum.
        let mut t = tcp_syn(65535, b"data");
        t[13] = 0x10;
        let mut p = ipv4(&t);
        assert!(clamp.apply(&mut p).window_clamped);
        assert_eq!(window_of(&p), 1536);
        assert_eq!(tcp_checksum_ok(&p), Some(true));
        // A window already below the cap is left alone.
        let mut t = tcp_syn(1000, b"");
        t[13] = 0x10;
        let mut p = ipv4(&t);
        assert!(!clamp.apply(&mut p).changed());
        // Another connection (other port) whose SYN was not seen counts as
        // unscaled: 65535 is under the cap.
        let mut t = tcp_syn(65535, b"");
        t[13] = 0x10;
        t[0] = 0x9d;
        let mut p = ipv4(&t);
        assert!(!clamp.apply(&mut p).changed());
    }

    #[test]
    fn caps_up_to_64k_behave_like_the_stateless_clamp() {
        let mut clamp = WindowClamp::new(24 * 1024);
        let mut a = ipv4(&tcp_syn(64240, b""));
        let mut b = a.clone();
        assert_eq!(clamp.apply(&mut a), clamp_tcp_window(&mut b, 24 * 1024));
        assert_eq!(a, b);
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
