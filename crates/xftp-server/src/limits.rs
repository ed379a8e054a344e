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
///
/// Failures are kept per login name: a successful login clears its own
/// name's, not those of other names from the address (one account's
/// login must not reset the count of guesses at another's). Passwords
/// being checked count against the limit while they are checked, so that
/// guesses sent at once cannot all be checked before the first failure
/// is counted; an attempt past the limit *waits* for one to settle rather
/// than being refused, so that correct logins sent at once (a tree's
/// sessions) are never taken for guesses.
#[derive(Debug)]
pub struct LoginThrottle {
    max: u32,
    window: Duration,
    map: Mutex<HashMap<IpAddr, Failures>>,
    /// An attempt settled: waiting ones look again.
    settled: tokio::sync::Notify,
}

#[derive(Debug, Clone)]
struct Failures {
    /// Failures per login name.
    names: HashMap<String, u32>,
    /// Passwords being checked now.
    pending: u32,
    first: Instant,
    last: Instant,
}

impl Failures {
    fn new(now: Instant) -> Failures {
        Failures {
            names: HashMap::new(),
            pending: 0,
            first: now,
            last: now,
        }
    }

    fn count(&self) -> u32 {
        self.names.values().sum()
    }
}

/// A password being checked ([`LoginThrottle::attempt`]): settled with
/// [`Pending::failed`] or [`Pending::succeeded`]; dropped unsettled (the
/// session ended during the check), it counts as a failure.
#[derive(Debug)]
pub struct Pending<'a> {
    t: &'a LoginThrottle,
    ip: IpAddr,
    name: String,
    done: bool,
}

impl Pending<'_> {
    /// The password was wrong; returns the wait if the address is now
    /// locked out.
    pub fn failed(mut self, now: Instant) -> Option<Duration> {
        self.done = true;
        self.t.settle(self.ip, &self.name, now, false);
        self.t.locked(self.ip, now)
    }

    /// The password was right: this name's failures are cleared.
    pub fn succeeded(mut self) {
        self.done = true;
        self.t.settle(self.ip, &self.name, Instant::now(), true);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.t.settle(self.ip, &self.name, Instant::now(), false);
        }
    }
}

impl LoginThrottle {
    /// `max` failures (0: never lock) in `window`.
    pub fn new(max: u32, window: Duration) -> LoginThrottle {
        LoginThrottle {
            max,
            window,
            map: Mutex::new(HashMap::new()),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// A password for `name` about to be checked: refused (the wait) if
    /// `ip` is locked out; waits while the failures and the checks in
    /// flight already reach the limit.
    pub async fn attempt(&self, ip: IpAddr, name: &str) -> Result<Pending<'_>, Duration> {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if let Some(p) = self.try_attempt(ip, name, Instant::now())? {
                return Ok(p);
            }
            settled.await;
        }
    }

    /// [`LoginThrottle::attempt`] without waiting: `Ok(None)` where it
    /// would wait.
    pub fn try_attempt(
        &self,
        ip: IpAddr,
        name: &str,
        now: Instant,
    ) -> Result<Option<Pending<'_>>, Duration> {
        let ip = ip.to_canonical();
        let mut m = self.lock();
        if m.len() >= PRUNE_AT {
            let w = self.window;
            m.retain(|_, f| f.pending > 0 || now.saturating_duration_since(f.last) < w);
        }
        let f = m.entry(ip).or_insert_with(|| Failures::new(now));
        self.forget_old(f, now);
        if self.max > 0 {
            let until = f.last + self.window;
            if f.count() >= self.max && now < until {
                return Err(until - now);
            }
            if f.pending > 0 && f.count() + f.pending >= self.max {
                return Ok(None);
            }
        }
        f.pending += 1;
        Ok(Some(Pending {
            t: self,
            ip,
            name: name.to_owned(),
            done: false,
        }))
    }

    /// Failures older than the window are forgotten, and so is a lockout
    /// once waited out: one mistyped password after it is one failure,
    /// not another lockout.
    fn forget_old(&self, f: &mut Failures, now: Instant) {
        let locked = f.count() >= self.max.max(1);
        let since = if locked { f.last } else { f.first };
        if now.saturating_duration_since(since) >= self.window {
            f.names.clear();
            f.first = now;
            f.last = now;
        }
    }

    fn settle(&self, ip: IpAddr, name: &str, now: Instant, ok: bool) {
        {
            let mut m = self.lock();
            if let Some(f) = m.get_mut(&ip) {
                f.pending = f.pending.saturating_sub(1);
                if ok {
                    f.names.remove(name);
                } else {
                    self.forget_old(f, now);
                    if f.names.is_empty() {
                        f.first = now;
                    }
                    *f.names.entry(name.to_owned()).or_insert(0) += 1;
                    f.last = now;
                }
                if f.names.is_empty() && f.pending == 0 {
                    m.remove(&ip);
                }
            }
        }
        self.settled.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `ip` must still wait, if it is locked out.
    pub fn locked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        if self.max == 0 {
            return None;
        }
        let m = self.lock();
        let f = m.get(&ip.to_canonical())?;
        let until = f.last + self.window;
        (f.count() >= self.max && now < until).then(|| until - now)
    }

    /// Count a failure for `name` at once (no check in flight); returns
    /// the wait if `ip` is now locked out.
    #[cfg(test)]
    pub fn failed(&self, ip: IpAddr, name: &str, now: Instant) -> Option<Duration> {
        let ip = ip.to_canonical();
        {
            let mut m = self.lock();
            let f = m.entry(ip).or_insert_with(|| Failures::new(now));
            f.pending += 1;
        }
        self.settle(ip, name, now, false);
        self.locked(ip, now)
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

/// Descriptors one data connection costs: its socket, and the duplicate
/// the endgame's probe keeps (a closing connection's meter takes one more
/// for a moment).
const FDS_PER_CONNECTION: u64 = 3;

/// Descriptors kept free for everything else a transfer opens (the file,
/// a pipe for splice, the passive listener, the next session).
const FDS_SPARE: u64 = 16;

/// How many data connections the process's open-file limit
/// (`RLIMIT_NOFILE`) leaves room for now, if it can tell. Granting more
/// made a transfer fail with EMFILE half-way (or, before the endgame took
/// connections it cannot observe, wait 120 s on them).
pub fn connection_room() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let soft: u64 = lim.rlim_cur;
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(soft.saturating_sub(open).saturating_sub(FDS_SPARE) / FDS_PER_CONNECTION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_locked_after_k_failures_and_waits_out_the_window() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(t.failed(a, "u", t0), None);
        assert_eq!(t.failed(a, "u", t0 + Duration::from_secs(1)), None);
        let w = t.failed(a, "u", t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(w, Duration::from_secs(60));
        // Another address is not affected.
        assert_eq!(t.locked(b, t0 + Duration::from_secs(3)), None);
        assert!(t.locked(a, t0 + Duration::from_secs(61)).is_some());
        assert_eq!(t.locked(a, t0 + Duration::from_secs(62)), None);
        // A lockout waited out is forgotten: the next failure is one of
        // three again, not a new lockout.
        assert_eq!(t.failed(a, "u", t0 + Duration::from_secs(63)), None);
        assert_eq!(t.failed(a, "u", t0 + Duration::from_secs(64)), None);
        assert!(t.failed(a, "u", t0 + Duration::from_secs(65)).is_some());
        // An IPv4-mapped IPv6 address is the same client.
        t.failed(b, "u", t0);
        t.failed(b, "u", t0);
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert!(t.failed(mapped, "u", t0).is_some());
        // Failures spread wider than the window never lock.
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        for i in 0..10 {
            assert_eq!(
                t.failed(c, "u", t0 + Duration::from_secs(40 * i)),
                None,
                "{i}"
            );
        }
    }

    #[test]
    fn guesses_sent_at_once_are_counted_before_they_are_checked() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let now = Instant::now();
        // Three in flight at once, none checked yet: the fourth waits
        // (it is not refused: they may all be right).
        let p: Vec<_> = (0..3)
            .map(|_| t.try_attempt(ip, "u", now).unwrap().unwrap())
            .collect();
        assert!(t.try_attempt(ip, "u", now).unwrap().is_none());
        // All three wrong: locked.
        for x in p {
            x.failed(now);
        }
        assert!(t.try_attempt(ip, "u", now).is_err());
    }

    #[test]
    fn correct_logins_sent_at_once_are_never_locked_out() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.10".parse().unwrap();
        let now = Instant::now();
        let mut held: Vec<_> = (0..3)
            .map(|_| t.try_attempt(ip, "alice", now).unwrap().unwrap())
            .collect();
        // The fourth waits, then goes once one is found right.
        assert!(t.try_attempt(ip, "alice", now).unwrap().is_none());
        held.pop().unwrap().succeeded();
        let p = t.try_attempt(ip, "alice", now).unwrap().unwrap();
        p.succeeded();
        for x in held {
            x.succeeded();
        }
        assert_eq!(t.locked(ip, now), None);
    }

    #[test]
    fn one_accounts_login_does_not_clear_guesses_at_another() {
        let t = LoginThrottle::new(3, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.11".parse().unwrap();
        let now = Instant::now();
        t.failed(ip, "alice", now);
        t.failed(ip, "alice", now);
        // bob (the guesser's own account) logs in: alice's two stay.
        t.try_attempt(ip, "bob", now).unwrap().unwrap().succeeded();
        assert!(t.failed(ip, "alice", now).is_some());
        // A name's own success clears its own failures.
        let u: IpAddr = "192.0.2.12".parse().unwrap();
        t.failed(u, "carol", now);
        t.failed(u, "carol", now);
        t.try_attempt(u, "carol", now).unwrap().unwrap().succeeded();
        assert_eq!(t.failed(u, "carol", now), None);
        // A check dropped unsettled (the session gone) counts as failed.
        let v: IpAddr = "192.0.2.13".parse().unwrap();
        for _ in 0..3 {
            drop(t.try_attempt(v, "dave", now).unwrap().unwrap());
        }
        assert!(t.locked(v, now).is_some());
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
