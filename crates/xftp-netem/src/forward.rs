//! The forwarding loop of one direction: read packets from one TUN device,
//! ask the [`LinkModel`] when they arrive, and write them to the other TUN
//! device when they are due.
//!
//! Cost matters more than anything here: a wake-up costs tens of µs of CPU
//! on these VMs, far more than forwarding a packet. So the loop reads
//! everything waiting, delivers every packet due within the batch window,
//! and only when there is nothing to read sleeps in ppoll until the head
//! of the queue is due. While that is near, it does not even wake for
//! input: packets collect in the TUN ring and are read in one go, stamped
//! with the time the loop stopped watching (so the bottleneck loses no
//! idle time). Packet buffers are recycled; steady state allocates
//! nothing.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{DropReason, LinkModel, Verdict};
use crate::sys;
use crate::tcpwin;

/// Default batch window: when the loop wakes for the packet at the head of
/// the queue it also delivers every packet due within this window. Each
/// wake-up costs tens of µs of CPU on a VM, so this trades timing
/// precision (packets leave up to this much early) for CPU.
pub const DEFAULT_BATCH: Duration = Duration::from_micros(250);

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
    /// TCP flows reset on purpose (`reset_every`).
    pub resets: u64,
    /// Packets dropped by the blackhole (`blackhole`).
    pub blackholed: u64,
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
    resets: AtomicU64,
    blackholed: AtomicU64,
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
            resets: get(&self.resets),
            blackholed: get(&self.blackholed),
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
    pub window: Option<tcpwin::WindowClamp>,
    pub buf_size: usize,
    /// Batch window (see [`DEFAULT_BATCH`]).
    pub batch: Duration,
    /// Run at real-time priority (see [`crate::LinkSpec::realtime`]).
    pub realtime: bool,
    pub counters: Arc<LiveCounters>,
    pub epoch: Instant,
    /// Reset a flow this often ([`crate::LinkSpec::reset_every`]).
    pub reset_every: Option<Duration>,
    /// When the next reset is due (nanoseconds after `epoch`).
    pub next_reset: u64,
    /// Bulk flows to drop for a while ([`crate::LinkSpec::blackhole`]).
    pub blackhole: Option<tcpwin::Blackhole>,
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
        let batch = u64::try_from(self.batch.as_nanos()).unwrap_or(u64::MAX);
        let mut queue: VecDeque<Pending> = VecDeque::with_capacity(1024);
        let mut free: Vec<Box<[u8]>> = Vec::new();
        let mut buf = vec![0u8; self.buf_size].into_boxed_slice();
        // Set while input is left unwatched: packets read after such a
        // sleep arrived at some point during it.
        let mut held_since: Option<u64> = None;
        let reset_period = self
            .reset_every
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
        if let Some(p) = reset_period {
            self.next_reset = self.now().saturating_add(p);
        }
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
                // A packet that waited in the device ring during a hold is
                // stamped with the start of the hold, so the bottleneck does
                // not lose the idle time it had then.
                let stamp = held_since.unwrap_or_else(|| self.now());
                let mut len = len;
                if let Some(p) = reset_period.filter(|_| stamp >= self.next_reset) {
                    if let Some(n) = tcpwin::make_rst(&mut buf[..len]) {
                        len = n;
                        self.next_reset = stamp.saturating_add(p);
                        bump(&self.counters.resets, 1);
                    }
                }
                if let Some(b) = self.blackhole.as_mut() {
                    if b.drops(&buf[..len], stamp) {
                        bump(&self.counters.blackholed, 1);
                        continue;
                    }
                }
                match self.model.offer(len, stamp) {
                    Verdict::Deliver { at } => {
                        if let Some(w) = self.window.as_mut() {
                            if w.apply(&mut buf[..len]).changed() {
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

            held_since = None;

            // Deliver everything due within the batch window.
            let now = self.now();
            let (mut packets, mut bytes) = (0, 0);
            while queue.front().is_some_and(|p| p.at <= now + batch) {
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
            // Nothing to read: sleep until input, stop, or the head of the
            // queue is due. This is the only timer, and it fires at most
            // once per batch window: everything due within the window
            // has just left.
            let (timeout, watch_input) = match queue.front() {
                Some(p) => {
                    let now = self.now();
                    if p.at <= now {
                        continue;
                    }
                    let sleep = p.at - now;
                    // A wake-up this close comes anyway: let input collect
                    // in the device ring until then instead of waking for
                    // every packet.
                    (Some(Duration::from_nanos(sleep)), sleep > 2 * batch)
                }
                None => (None, true),
            };
            if !watch_input {
                held_since = Some(self.now());
            }
            let input = watch_input.then_some(self.input);
            let ready = sys::wait_readable(input, self.stop, timeout)?;
            if ready.stop {
                break;
            }
        }
        Ok(())
    }
}
