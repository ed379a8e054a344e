//! Limits that keep one client address from starving the others: failed
//! logins per address, sessions per address. Time comes in as an argument
//! so the rules are tested without waiting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Entries kept before old ones are pruned (bounds memory under a scan
/// from many addresses).
const PRUNE_AT: usize = 10_000;

/// Failed logins per client address: after `max` failures within
/// `window`, the address waits out the rest of `window` from its last
/// failure before it may log in again.
#[derive(Debug)]
pub struct LoginThrottle {
    max: u32,
    window: Duration,
    map: Mutex<HashMap<IpAddr, Failures>>,
    /// Serializes [`LoginThrottle::attempt`]'s check and count.
    gate: Mutex<()>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    first: Instant,
    last: Instant,
}

impl LoginThrottle {
    /// `max` failures (0: never lock) in `window`.
    pub fn new(max: u32, window: Duration) -> LoginThrottle {
        LoginThrottle {
            max,
            window,
            map: Mutex::new(HashMap::new()),
            gate: Mutex::new(()),
        }
    }

    /// A password about to be checked: refused (the wait) if `ip` is
    /// locked out, else counted as a failure now, before the check, so
    /// that guesses sent at once cannot all be checked before the first
    /// failure is counted. A login that succeeds clears the count
    /// ([`LoginThrottle::succeeded`]).
    pub fn attempt(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let _g = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(wait) = self.locked(ip, now) {
            return Err(wait);
        }
        self.failed(ip, now);
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `ip` must still wait, if it is locked out.
    pub fn locked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        if self.max == 0 {
            return None;
        }
        let f = *self.lock().get(&ip.to_canonical())?;
        let until = f.last + self.window;
        (f.count >= self.max && now < until).then(|| until - now)
    }

    /// Count a failure; returns the wait if `ip` is now locked out.
    pub fn failed(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let ip = ip.to_canonical();
        {
            let mut m = self.lock();
            if m.len() >= PRUNE_AT {
                let w = self.window;
                m.retain(|_, f| now.saturating_duration_since(f.last) < w);
            }
            let f = m.entry(ip).or_insert(Failures {
                count: 0,
                first: now,
                last: now,
            });
            // Failures older than the window are forgotten, and so is a
            // lockout once waited out: one mistyped password after it is
            // one failure, not another lockout.
            let locked = f.count >= self.max.max(1);
            let since = if locked { f.last } else { f.first };
            if now.saturating_duration_since(since) >= self.window {
                *f = Failures {
                    count: 0,
                    first: now,
                    last: now,
                };
            }
            f.count += 1;
            f.last = now;
        }
        self.locked(ip, now)
    }

    /// A successful login clears the address's failures.
    pub fn succeeded(&self, ip: IpAddr) {
        self.lock().remove(&ip.to_canonical());
    }
}

/// Sessions open per client address.
#[derive(Debug, Default)]
pub struct PerAddress {
    map: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a place for `ip` if it holds fewer than `max`; the place is
    /// given back when the guard is dropped.
    pub fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressGuard> {
        let ip = ip.to_canonical();
        let mut m = self.lock();
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressGuard {
            set: self.clone(),
            ip,
        })
    }

    /// Places taken by `ip`.
    #[cfg(test)]
    pub fn count(&self, ip: IpAddr) -> usize {
        self.lock().get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

/// One session's place (see [`PerAddress::enter`]).
#[derive(Debug)]
pub struct AddressGuard {
    set: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressGuard {
    fn drop(&mut self) {
        let mut m = self.set.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Data connections granted (MULT) per client address, summed over its
/// sessions.
#[derive(Debug, Default)]
pub struct StreamBudget {
    map: Mutex<HashMap<IpAddr, u32>>,
}

impl StreamBudget {
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, u32>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A session's claim, holding nothing yet.
    pub fn claim(self: &Arc<Self>, ip: IpAddr) -> StreamClaim {
        StreamClaim {
            budget: self.clone(),
            ip: ip.to_canonical(),
            held: 0,
        }
    }
}

/// What one session holds of its address's budget; given back on drop.
#[derive(Debug)]
pub struct StreamClaim {
    budget: Arc<StreamBudget>,
    ip: IpAddr,
    held: u32,
}

impl StreamClaim {
    /// Ask for `want` connections when the address may hold `max` in
    /// all; returns the grant (at least 1: one connection is always
    /// allowed).
    pub fn set(&mut self, want: u32, max: u32) -> u32 {
        let mut m = self.budget.lock();
        let total = m.entry(self.ip).or_insert(0);
        let others = total.saturating_sub(self.held);
        let grant = want.min(max.saturating_sub(others)).max(1);
        *total = others + grant;
        self.held = grant;
        grant
    }
}

impl Drop for StreamClaim {
    fn drop(&mut self) {
        let mut m = self.budget.lock();
        if let Some(t) = m.get_mut(&self.ip) {
            *t = t.saturating_sub(self.held);
            if *t == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_locked_after_k_failures_and_waits_out_the_window() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(t.failed(a, t0), None);
        assert_eq!(t.failed(a, t0 + Duration::from_secs(1)), None);
        let w = t.failed(a, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(w, Duration::from_secs(60));
        // Another address is not affected.
        assert_eq!(t.locked(b, t0 + Duration::from_secs(3)), None);
        assert!(t.locked(a, t0 + Duration::from_secs(61)).is_some());
        assert_eq!(t.locked(a, t0 + Duration::from_secs(62)), None);
        // A lockout waited out is forgotten: the next failure is one of
        // three again, not a new lockout.
        assert_eq!(t.failed(a, t0 + Duration::from_secs(63)), None);
        assert_eq!(t.failed(a, t0 + Duration::from_secs(64)), None);
        assert!(t.failed(a, t0 + Duration::from_secs(65)).is_some());
        // An IPv4-mapped IPv6 address is the same client.
        t.failed(b, t0);
        t.failed(b, t0);
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert!(t.failed(mapped, t0).is_some());
        // Failures spread wider than the window never lock.
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        for i in 0..10 {
            assert_eq!(t.failed(c, t0 + Duration::from_secs(40 * i)), None, "{i}");
        }
        // A success clears.
        t.succeeded(a);
        assert_eq!(t.locked(a, t0 + Duration::from_secs(3)), None);
    }

    #[test]
    fn stream_grants_share_the_address_budget() {
        let b = Arc::new(StreamBudget::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut s1 = b.claim(a);
        let mut s2 = b.claim(a);
        assert_eq!(s1.set(8, 12), 8);
        assert_eq!(s2.set(8, 12), 4);
        // Lowering and raising one's own grant counts only the others.
        assert_eq!(s1.set(2, 12), 2);
        assert_eq!(s2.set(16, 12), 10);
        let mut other = b.claim("10.0.0.2".parse().unwrap());
        assert_eq!(other.set(12, 12), 12);
        drop(s2);
        assert_eq!(s1.set(64, 12), 12);
        // Always at least one.
        let mut s3 = b.claim(a);
        assert_eq!(s3.set(4, 12), 1);
    }

    #[test]
    fn guesses_sent_at_once_are_counted_before_they_are_checked() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let now = Instant::now();
        // Three in flight at once, none checked yet: the fourth waits.
        for _ in 0..3 {
            assert!(t.attempt(ip, now).is_ok());
        }
        assert!(t.attempt(ip, now).is_err());
        // One of the three was right: the count is cleared.
        t.succeeded(ip);
        assert!(t.attempt(ip, now).is_ok());
    }

    #[test]
    fn places_per_address_are_given_back() {
        let p = Arc::new(PerAddress::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let g1 = p.enter(a, 2).unwrap();
        let g2 = p.enter(a, 2).unwrap();
        assert!(p.enter(a, 2).is_none());
        assert!(p.enter("10.0.0.9".parse().unwrap(), 2).is_some());
        drop(g1);
        assert_eq!(p.count(a), 1);
        let _g3 = p.enter(a, 2).unwrap();
        drop(g2);
        assert_eq!(p.count(a), 1);
    }
}
