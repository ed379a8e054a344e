//! The forwarding loop of one direction: read packets from one TUN device,
//! ask the [`LinkModel`] when they arrive, and write them to the other TUN
//! device when they are due.
//!
//! Cost matters more than anything here. A kernel timer per packet is
//! expensive on these VMs, so the loop reads everything waiting, delivers
//! every packet due within [`EARLY`], and only when there is nothing to
//! read sleeps in ppoll until the next packet is due. Packet buffers are
//! recycled, so steady state allocates nothing.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{DropReason, LinkModel, Verdict};
use crate::sys;
use crate::tcpwin;

/// Packets due within this margin are delivered now, in one batch, rather
/// than after another sleep.
pub const EARLY: Duration = Duration::from_micros(100);

/// Packets read before the loop looks at what is due, so a flood of input
/// cannot hold back delivery.
const READ_BATCH: usize = 64;

/// Counters of one direction, as a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirectionCounters {
    /// Packets written to the far side.
    pub packets: u64,
    /// Bytes (IP packets) written to the far side.
    pub bytes: u64,
    /// Packets dropped because the queue was full.
    pub queue_drops: u64,
    /// Packets dropped by random loss.
    pub loss_drops: u64,
    /// Packets dropped by bit errors.
    pub ber_drops: u64,
    /// Packets whose TCP window or options were rewritten.
    pub window_rewrites: u64,
    /// Packets the far side's TUN device refused.
    pub write_errors: u64,
}

/// Live counters, updated by the forwarder thread.
#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    packets: AtomicU64,
    bytes: AtomicU64,
    queue_drops: AtomicU64,
    loss_drops: AtomicU64,
    ber_drops: AtomicU64,
    window_rewrites: AtomicU64,
    write_errors: AtomicU64,
}

impl LiveCounters {
    pub(crate) fn snapshot(&self) -> DirectionCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirectionCounters {
            packets: get(&self.packets),
            bytes: get(&self.bytes),
            queue_drops: get(&self.queue_drops),
            loss_drops: get(&self.loss_drops),
            ber_drops: get(&self.ber_drops),
            window_rewrites: get(&self.window_rewrites),
            write_errors: get(&self.write_errors),
        }
    }
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// Everything one direction's thread needs.
pub(crate) struct Direction {
    pub input: RawFd,
    pub output: RawFd,
    pub stop: RawFd,
    /// Set together with the eventfd, seen even when input never pauses.
    pub stop_flag: Arc<AtomicBool>,
    pub model: LinkModel,
    pub max_window: Option<u32>,
    pub buf_size: usize,
    /// Run at real-time priority (see [`crate::LinkSpec::realtime`]).
    pub realtime: bool,
    pub counters: Arc<LiveCounters>,
    pub epoch: Instant,
}

struct Pending {
    at: u64,
    len: usize,
    buf: Box<[u8]>,
}

impl Direction {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs until the stop eventfd is signalled or a descriptor fails.
    pub(crate) fn run(mut self) -> std::io::Result<()> {
        sys::set_timer_slack(Duration::from_micros(1));
        sys::raise_thread_priority(self.realtime);
        let early = EARLY.as_nanos() as u64;
        let mut queue: VecDeque<Pending> = VecDeque::with_capacity(1024);
        let mut free: Vec<Box<[u8]>> = Vec::new();
        let mut buf = vec![0u8; self.buf_size].into_boxed_slice();
        while !self.stop_flag.load(Ordering::Relaxed) {
            // Read what is waiting, up to a batch.
            let mut drained = false;
            for _ in 0..READ_BATCH {
                let Some(len) = sys::read_packet(self.input, &mut buf)? else {
                    drained = true;
                    break;
                };
                if len == 0 {
                    continue;
                }
                match self.model.offer(len, self.now()) {
                    Verdict::Deliver { at } => {
                        if let Some(w) = self.max_window {
                            if tcpwin::clamp_tcp_window(&mut buf[..len], w).changed() {
                                bump(&self.counters.window_rewrites, 1);
                            }
                        }
                        let next = free
                            .pop()
                            .unwrap_or_else(|| vec![0u8; self.buf_size].into_boxed_slice());
                        queue.push_back(Pending {
                            at,
                            len,
                            buf: std::mem::replace(&mut buf, next),
                        });
                    }
                    Verdict::Drop(DropReason::Queue) => bump(&self.counters.queue_drops, 1),
                    Verdict::Drop(DropReason::Loss) => bump(&self.counters.loss_drops, 1),
                    Verdict::Drop(DropReason::BitError) => bump(&self.counters.ber_drops, 1),
                }
            }

            // Deliver everything due within the early margin.
            let now = self.now();
            let (mut packets, mut bytes) = (0, 0);
            while queue.front().is_some_and(|p| p.at <= now + early) {
                let Some(p) = queue.pop_front() else { break };
                match sys::write_packet(self.output, &p.buf[..p.len]) {
                    Ok(()) => {
                        packets += 1;
                        bytes += p.len as u64;
                    }
                    Err(e) => {
                        tracing::debug!("write to TUN failed: {e}");
                        bump(&self.counters.write_errors, 1);
                    }
                }
                free.push(p.buf);
            }
            if packets > 0 {
                bump(&self.counters.packets, packets);
                bump(&self.counters.bytes, bytes);
            }

            if !drained {
                continue; // more input may be waiting: no sleep
            }
            // Nothing to read: sleep until input, stop, or shortly before
            // the next packet is due. This is the only timer.
            let timeout = match queue.front() {
                Some(p) => {
                    // Wake half the margin before the head is due; all that
                    // is due within the margin then leaves in one batch
                    // (waking at `at - early` would sleep a few µs per
                    // packet once the link is busy).
                    let wake = p.at.saturating_sub(early / 2);
                    let now = self.now();
                    if wake <= now {
                        continue;
                    }
                    Some(Duration::from_nanos(wake - now))
                }
                None => None,
            };
            let ready = sys::wait_readable(Some(self.input), self.stop, timeout)?;
            if ready.stop {
                break;
            }
        }
        Ok(())
    }
}
