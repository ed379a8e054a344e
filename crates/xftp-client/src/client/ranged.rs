//! `-p N` against a server without MULT or GridFTP parallelism (vsftpd,
//! ProFTPD, pyftpdlib, ...): N sessions, each fetching byte ranges of the
//! file with `REST offset` + `RETR` and closing its data connection at
//! the range's end, as lftp's `pget -n` does. The file is cut into N
//! parts up front; a session whose part is done takes half of the largest
//! part still being fetched (the other session stops there), so no
//! session waits on the slowest. Every byte is claimed by exactly one
//! session before it is written, in place.
//!
//! ```text
//!   session i: EPSV  REST a_i  RETR f  <bytes a_i..b_i, then close>  426/226
//! ```

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;

use super::{local_err, Client, Fit, Setup};
use crate::control::{reply_text, unexpected, Cmd};
use crate::error::{ClientError, Result};

/// The smallest range a session fetches: a session costs a login and
/// three round trips per range, worth it only for this much or more.
pub(crate) const RANGE_MIN: u64 = 1 << 20;

/// Most sessions `-p auto` opens against a server without MULT: with no
/// feedback from the server to step down by, and a login per session,
/// about what lftp's `pget` (5) and aria2 (5) use by default.
pub const AUTO_MAX: u32 = 4;

/// How long a session waits for the server's reply to a range it cut
/// short before it resynchronises (at least 8 RTTs).
const CUT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Read buffer of one session.
const CHUNK: usize = 256 * 1024;

/// One session's range: bytes `[next, end)` still to come; `next` moves
/// when bytes are claimed, `end` when another session takes the tail.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    next: u64,
    end: u64,
}

/// The ranges of a download, shared by its sessions.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Ranges no session has taken yet (a failed session's rest too).
    pending: Vec<(u64, u64)>,
    /// Per session, what it is fetching now (empty when idle).
    slots: Vec<Slot>,
    /// Per session, whether it has taken a range yet.
    started: Vec<bool>,
}

impl Plan {
    /// `work` (the ranges to fetch) cut into about `n` parts of equal
    /// bytes, none under [`RANGE_MIN`] unless the work is smaller.
    pub(crate) fn new(work: &[(u64, u64)], n: usize) -> Plan {
        let total: u64 = work.iter().map(|(a, b)| b - a).sum();
        let part = (total / n.max(1) as u64).max(RANGE_MIN);
        let mut pending = Vec::new();
        for &(a, b) in work {
            let mut at = a;
            while at < b {
                // No sliver at the end of a range: it joins the last part.
                let end = if b - at < part + part / 2 {
                    b
                } else {
                    at + part
                };
                pending.push((at, end));
                at = end;
            }
        }
        // Taken from the back: the file's start first.
        pending.reverse();
        Plan {
            pending,
            slots: vec![Slot::default(); n],
            started: vec![false; n],
        }
    }

    /// The next range for session `i`: a pending one, else the upper half
    /// of the largest range another session is still fetching (if at
    /// least [`RANGE_MIN`] would be left to each).
    pub(crate) fn take(&mut self, i: usize) -> Option<(u64, u64)> {
        let r = self.take_range(i);
        self.started[i] |= r.is_some();
        r
    }

    fn take_range(&mut self, i: usize) -> Option<(u64, u64)> {
        if let Some((a, b)) = self.pending.pop() {
            self.slots[i] = Slot { next: a, end: b };
            return Some((a, b));
        }
        let (j, rest) = self
            .slots
            .iter()
            .enumerate()
            .map(|(j, s)| (j, s.end - s.next))
            .max_by_key(|&(_, r)| r)?;
        if rest < 2 * RANGE_MIN {
            return None;
        }
        let mid = self.slots[j].next + rest / 2;
        let end = self.slots[j].end;
        self.slots[j].end = mid;
        self.slots[i] = Slot { next: mid, end };
        Some((mid, end))
    }

    /// Session `i` read `n` bytes: the offset they go to and how many of
    /// them are its own (the rest lie past its range's end, which another
    /// session may have taken meanwhile), and whether its range is done.
    pub(crate) fn claim(&mut self, i: usize, n: usize) -> (u64, usize, bool) {
        let s = &mut self.slots[i];
        let at = s.next;
        let own = (n as u64).min(s.end - s.next);
        s.next += own;
        (at, own as usize, s.next == s.end)
    }

    /// Session `i` stops: what it had not claimed goes back to pending.
    pub(crate) fn give_back(&mut self, i: usize) {
        let s = std::mem::take(&mut self.slots[i]);
        if s.next < s.end {
            self.pending.push((s.next, s.end));
        }
    }

    /// Whether session `i` has taken a range yet.
    pub(crate) fn started(&self, i: usize) -> bool {
        self.started.get(i).copied().unwrap_or(false)
    }

    /// Bytes not yet claimed by anyone.
    pub(crate) fn left(&self) -> u64 {
        let p: u64 = self.pending.iter().map(|(a, b)| b - a).sum();
        p + self.slots.iter().map(|s| s.end - s.next).sum::<u64>()
    }
}

type Shared = Arc<Mutex<Plan>>;

fn lock(p: &Shared) -> std::sync::MutexGuard<'_, Plan> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// How one session's share ended.
struct Share {
    /// The session logged in.
    opened: bool,
    bytes: u64,
    /// Why it stopped early (its unclaimed range went back to pending).
    error: Option<ClientError>,
    /// The file's MDTM when the session began, if the server told.
    mdtm: Option<String>,
}

impl Client {
    /// Sessions for ranged downloads (see [`Client::set_sessions`]) when
    /// this download should use them, and how many: with `-p N` (N > 1),
    /// when the server refused MULT; with `-p auto`, when FEAT lists
    /// neither MULT nor GridFTP's parallelism, the count `-p auto` would
    /// start a MULT transfer with on this RTT, at most [`AUTO_MAX`]. In
    /// both cases the server must list REST STREAM.
    /// The reason goes with an automatic choice (into the timeline).
    pub(super) async fn ranged_want(&mut self) -> Result<Option<(u32, Option<String>)>> {
        if self.sessions.is_none() {
            return Ok(None);
        }
        self.settle().await?;
        if self.mode_e {
            // Ranges are read as plain stream-mode bytes.
            return Ok(None);
        }
        let want = match self.cfg.auto.clone() {
            None => match self.mult_refused.filter(|&w| w > 1) {
                Some(w) => (w, None),
                None => return Ok(None),
            },
            Some(auto) => {
                let feat = self.features().await?;
                if feat.mult || feat.gridftp {
                    return Ok(None);
                }
                // The cache is left out: a server without MULT has only
                // ever been measured on the count this rule chose.
                let (n, why) = xftp_tune::initial_streams(
                    self.ctl.rtt(),
                    self.cfg.bufsize,
                    None,
                    AUTO_MAX.min(auto.tune.max_streams.max(1)),
                );
                if n < 2 {
                    return Ok(None);
                }
                (n, Some(format!("ranged sessions (no MULT): {why}")))
            }
        };
        let feat = self.features().await?;
        if !feat.rest_stream {
            tracing::info!("no REST STREAM in FEAT: one connection");
            return Ok(None);
        }
        Ok(Some(want))
    }

    /// Fetch `work` (ranges of `remote`, whose size is `size`) into `dst`
    /// over this session and up to `n - 1` more (`want` from
    /// [`Client::ranged_want`]); bytes per session. `first`: a data
    /// connection this session has set up already, for its first range.
    /// `mdtm_known`: the file's MDTM when the download began, if known (a
    /// resumed one's), for the check at the end.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fetch_ranges(
        &mut self,
        remote: &str,
        dst: Arc<dyn xftp_stripe::WriteAt>,
        work: &[(u64, u64)],
        size: u64,
        (n, why): (u32, Option<String>),
        first: Option<Setup>,
        mdtm_known: Option<String>,
    ) -> Result<Vec<u64>> {
        if let Some(why) = why {
            self.start = Some((n, why, false));
        }
        let total: u64 = work.iter().map(|(a, b)| b - a).sum();
        let n = (n as u64).min(total.div_ceil(RANGE_MIN)).max(1) as usize;
        // The file's time as each session first sees it (`mdtm_known`: a
        // resumed download's, from its start), checked against the end
        // (below). This session asks nothing before its first range: a
        // command between a passive reply and its RETR made ProFTPD under
        // TLS end the session when the range was cut; the other sessions
        // ask before their first data connection.
        let mut seen: Vec<String> = mdtm_known.into_iter().collect();
        let plan: Shared = Arc::new(Mutex::new(Plan::new(work, n)));
        let factory = self.sessions.clone();
        let mut set = tokio::task::JoinSet::new();
        let mut handles = Vec::new();
        if let Some(f) = factory.filter(|_| n > 1) {
            for i in 1..n {
                let (f, plan, dst, remote) =
                    (f.clone(), plan.clone(), dst.clone(), remote.to_owned());
                let h = set.spawn(async move {
                    let mut c = match (f.0)().await {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::info!("ranged download: session {i} not opened: {e}");
                            return Share {
                                opened: false,
                                bytes: 0,
                                error: Some(e),
                                mdtm: None,
                            };
                        }
                    };
                    let mdtm = c.mdtm(&remote).await.ok().flatten();
                    let mut share = c.fetch_share(&remote, &dst, &plan, i, size, None).await;
                    share.mdtm = mdtm;
                    c.quit().await;
                    share
                });
                handles.push((i, h));
            }
        }
        let mine = self.fetch_share(remote, &dst, &plan, 0, size, first).await;
        let mut per = vec![mine.bytes];
        let main_error = mine.error;
        let mut first_error = None;
        let (mut opened, mut refusal, mut dropped) = (1, None, 0);
        loop {
            // Once every byte is claimed (and so written), a session still
            // logging in has nothing left to take: it is not waited for (a
            // server can take most of a second to greet, longer than a
            // small file's whole transfer).
            {
                let p = lock(&plan);
                if p.left() == 0 {
                    for (i, h) in &handles {
                        if !p.started(*i) {
                            h.abort();
                        }
                    }
                }
            }
            let Some(r) = set.join_next().await else {
                break;
            };
            if r.as_ref().is_err_and(|e| e.is_cancelled()) {
                dropped += 1;
                continue;
            }
            let share = r.unwrap_or_else(|e| Share {
                opened: false,
                bytes: 0,
                error: Some(ClientError::Stripe(format!("session task: {e}"))),
                mdtm: None,
            });
            per.push(share.bytes);
            seen.extend(share.mdtm.clone());
            if share.opened {
                opened += 1;
            } else if refusal.is_none() {
                refusal = share.error.as_ref().map(ToString::to_string);
            }
            if first_error.is_none() {
                first_error = share.error;
            }
        }
        self.notices
            .retain(|m| !m.starts_with("server does not support MULT"));
        // Sessions dropped while logging in fetched nothing: said so.
        let unused = match dropped {
            0 => String::new(),
            1 => "; 1 of them not needed (every byte claimed before it logged in)".to_owned(),
            d => format!("; {d} of them not needed (every byte claimed before they logged in)"),
        };
        self.notices.push(match refusal {
            None => format!(
                "server does not support MULT: {n} sessions, each fetching byte ranges (REST){unused}"
            ),
            Some(why) => format!(
                "server does not support MULT: {opened} of {n} sessions opened, each fetching byte ranges (REST); the others: {why}{unused}"
            ),
        });
        // What failed sessions left: this session fetches it, if it can.
        let mut main_error = main_error;
        if lock(&plan).left() > 0
            && !self.out_of_step
            && main_error.as_ref().map_or(true, |e| !e.session_broken())
        {
            let again = self.fetch_share(remote, &dst, &plan, 0, size, None).await;
            per[0] += again.bytes;
            main_error = again.error.or(main_error);
        }
        let left = lock(&plan).left();
        if left > 0 {
            return Err(main_error
                .or(first_error)
                .unwrap_or(ClientError::ShortTransfer {
                    expected: total,
                    got: total - left,
                }));
        }
        // Each session sent its own REST and RETR at its own time: a file
        // replaced meanwhile (written anew, renamed over) gave some
        // ranges of each version. Its size, or a time other than the
        // sessions saw, tells at the end. Asked on this session, or where
        // the server ended it (ProFTPD does, under TLS, when a range is
        // cut), on a new one.
        if per.iter().filter(|&&b| b > 0).count() > 1 {
            let ask_mdtm = !seen.is_empty();
            let now = match self.identity(remote, ask_mdtm).await {
                Err(e) if e.session_broken() => match &self.sessions {
                    Some(f) => {
                        let mut c = (f.0)().await?;
                        let r = c.identity(remote, ask_mdtm).await;
                        c.quit().await;
                        r
                    }
                    None => Err(e),
                },
                r => r,
            }?;
            let (size_now, mdtm_now) = now;
            let time_moved = mdtm_now
                .as_ref()
                .is_some_and(|m| seen.iter().any(|s| s != m));
            if size_now.is_some_and(|s| s != size) || time_moved {
                let show = |s: Option<u64>, m: Option<&String>| {
                    format!(
                        "{} bytes, modified {}",
                        s.map_or("?".into(), |s| s.to_string()),
                        m.map_or("?", |m| m.as_str())
                    )
                };
                return Err(ClientError::ChangedDuring {
                    was: show(
                        Some(size),
                        seen.iter()
                            .find(|s| Some(*s) != mdtm_now.as_ref())
                            .or(seen.first()),
                    ),
                    now: show(size_now, mdtm_now.as_ref()),
                });
            }
        }
        tracing::info!("ranged download: bytes per session {per:?}");
        per.retain(|&b| b > 0);
        Ok(per)
    }

    /// SIZE (and MDTM, with `mdtm`) of `remote` now.
    async fn identity(
        &mut self,
        remote: &str,
        mdtm: bool,
    ) -> Result<(Option<u64>, Option<String>)> {
        let size = self.size(remote).await?;
        let m = match mdtm {
            true => self.mdtm(remote).await?,
            false => None,
        };
        Ok((size, m))
    }

    /// Session `i`'s part: ranges from `plan` until none is left (the
    /// first over `setup`, if given).
    async fn fetch_share(
        &mut self,
        remote: &str,
        dst: &Arc<dyn xftp_stripe::WriteAt>,
        plan: &Shared,
        i: usize,
        size: u64,
        mut setup: Option<Setup>,
    ) -> Share {
        let mut bytes = 0;
        loop {
            let Some((a, b)) = lock(plan).take(i) else {
                return Share {
                    opened: true,
                    bytes,
                    error: None,
                    mdtm: None,
                };
            };
            // Bytes written count even when the session fails after them:
            // they were claimed, and no other session fetches them again.
            let r = self
                .fetch_range(remote, dst, plan, i, (a, b), size, setup.take(), &mut bytes)
                .await;
            match r {
                Ok(()) => {}
                Err(e) => {
                    lock(plan).give_back(i);
                    tracing::debug!("ranged download: session {i} at {a}-{b}: {e}");
                    return Share {
                        opened: true,
                        bytes,
                        error: Some(e),
                        mdtm: None,
                    };
                }
            }
            lock(plan).give_back(i);
        }
    }

    /// `REST a` + `RETR remote`, bytes written from `a` until session
    /// `i`'s range ends (it may shrink meanwhile); then the data
    /// connection is closed and the server's reply to the cut read.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_range(
        &mut self,
        remote: &str,
        dst: &Arc<dyn xftp_stripe::WriteAt>,
        plan: &Shared,
        i: usize,
        (a, b): (u64, u64),
        size: u64,
        setup: Option<Setup>,
        got: &mut u64,
    ) -> Result<()> {
        let setup = match setup {
            Some(s) => s,
            None => self.prepare_data(true, None, Fit::Session).await?.1,
        };
        let c_rest = Cmd::with("REST", a.to_string());
        self.send(&[&c_rest]).await?;
        self.ctl.expect(&c_rest, &[350]).await?;
        let c_retr = Cmd::with("RETR", remote);
        self.ctl.send(&[&c_retr]).await?;
        let (mut conns, _) = self.start_transfer(&c_retr, setup).await?;
        let conn = conns
            .pop()
            .ok_or_else(|| ClientError::Stripe("no data connection".into()))?;
        let mut conn = self.watchdog().guard(conn);
        let mut buf = vec![0u8; CHUNK];
        let before = *got;
        let read = async {
            loop {
                let n = conn.read(&mut buf).await.map_err(ClientError::DataIo)?;
                if n == 0 {
                    return Ok(false);
                }
                let (at, own, done) = lock(plan).claim(i, n);
                if at + (n as u64) > size {
                    // Past the size SIZE gave: the file grew since.
                    return Err(ClientError::ShortTransfer {
                        expected: size,
                        got: at + n as u64,
                    });
                }
                dst.write_at(&buf[..own], at)
                    .map_err(|e| local_err(std::path::Path::new("(download)"), e))?;
                *got += own as u64;
                // The file's last range is read to the server's end, so
                // that a file longer than SIZE said is seen.
                if done && at + (own as u64) < size {
                    return Ok(true);
                }
            }
        };
        let cut = match read.await {
            Ok(cut) => cut,
            Err(e) => {
                // The RETR's final reply is still to come: read past it
                // (and ABOR's), so that the session's next command gets
                // its own reply, here or wherever the session goes on.
                drop(conn);
                if let Err(r) = self.resync().await {
                    // Not answering (a server stopped, a path cut): this
                    // session takes no other range.
                    tracing::debug!("ranged download: session {i} not resynchronised: {r}");
                    self.out_of_step = true;
                }
                return Err(e);
            }
        };
        let reached = a + (*got - before);
        drop(conn);
        if !cut {
            // The server ended the file: it must be where SIZE said.
            self.expect_complete(&c_retr).await?;
            if reached < b.min(size) {
                return Err(ClientError::ShortTransfer {
                    expected: size,
                    got: reached,
                });
            }
            return Ok(());
        }
        // Cut short on purpose: the server says so (426, 451) or, when
        // the rest had already gone into the socket buffers, 226. It does
        // so within a round trip or two of the close (its next write
        // fails); Pure-FTPd instead sends one more 1xx line and no final
        // reply. Either of those (a second 1xx, or silence) leaves the
        // session's replies out of step: resynchronised before its next
        // range.
        let rtt = self.ctl.rtt().unwrap_or_default();
        let wait = CUT_WAIT.max(rtt * 8);
        let r = match self.ctl.read_reply_within(wait).await {
            Ok(r) => Some(r),
            Err(ClientError::Timeout { .. }) => None,
            Err(e) => return Err(e),
        };
        match r {
            Some(r) if !r.is_preliminary() => {
                tracing::debug!(
                    "ranged download: range {a}-{reached} done, server: {} {}",
                    r.code,
                    reply_text(&r)
                );
                if r.code == 421 {
                    return Err(unexpected(&c_retr, &r));
                }
                Ok(())
            }
            other => {
                tracing::debug!(
                    "ranged download: range {a}-{reached} done, server: {}; resynchronising",
                    other.map_or("no reply".to_string(), |r| format!(
                        "{} {}",
                        r.code,
                        reply_text(&r)
                    ))
                );
                self.resync().await
            }
        }
    }

    /// Bring the control connection back in step after a transfer whose
    /// final reply may or may not still come: `ABOR` (which ends the
    /// transfer where the server still holds it as running) and `PWD`,
    /// then every reply up to PWD's 257, the one code neither a transfer
    /// nor ABOR answers with.
    async fn resync(&mut self) -> Result<()> {
        let (abor, pwd) = (Cmd::bare("ABOR"), Cmd::bare("PWD"));
        self.ctl.send(&[&abor, &pwd]).await?;
        // A server that answers does so within round trips; one that
        // does not (stopped, its path cut) is not waited for a whole
        // --timeout more after the data already stalled that long.
        let grace = (std::time::Duration::from_secs(2) + self.ctl.rtt().unwrap_or_default() * 4)
            .min(self.cfg.reply_timeout);
        let until = tokio::time::Instant::now() + grace;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let r = self.ctl.read_reply_within(left).await?;
            match r.code {
                257 => return Ok(()),
                421 => return Err(unexpected(&abor, &r)),
                _ => tracing::debug!("resync: {} {}", r.code, reply_text(&r)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive a plan with sessions reading in turns of `step` bytes, some
    /// failing; every byte must be claimed exactly once.
    #[allow(clippy::needless_range_loop)]
    fn run(work: &[(u64, u64)], n: usize, step: usize, fail: &[usize]) -> Vec<(u64, u64)> {
        let mut p = Plan::new(work, n);
        let mut got: Vec<(u64, u64)> = Vec::new();
        let mut active: Vec<bool> = (0..n).map(|i| p.take(i).is_some()).collect();
        let mut turn = 0usize;
        while active.iter().any(|&a| a) {
            for i in 0..n {
                if !active[i] {
                    continue;
                }
                turn += 1;
                if fail.contains(&i) && turn > 3 * n {
                    p.give_back(i);
                    active[i] = false;
                    continue;
                }
                let (at, own, done) = p.claim(i, step);
                if own > 0 {
                    got.push((at, at + own as u64));
                }
                if done {
                    p.give_back(i);
                    active[i] = p.take(i).is_some();
                }
            }
            // A session that failed leaves work: a healthy one takes it.
            if !active.iter().any(|&a| a) && p.left() > 0 {
                let i = (0..n).find(|i| !fail.contains(i)).unwrap();
                active[i] = p.take(i).is_some();
            }
        }
        assert_eq!(p.left(), 0);
        got.sort();
        got
    }

    fn covers_exactly(got: &[(u64, u64)], work: &[(u64, u64)]) {
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in got {
            match merged.last_mut() {
                Some(l) if l.1 == a => l.1 = b,
                Some(l) => assert!(l.1 < a, "overlap at {a}"),
                None => {}
            }
            if merged.last().map_or(true, |l| l.1 != b) {
                merged.push((a, b));
            }
        }
        assert_eq!(merged, work);
    }

    #[test]
    fn every_byte_once_with_steals_and_failures() {
        let m = RANGE_MIN;
        for (work, n, step, fail) in [
            (vec![(0, 10 * m + 7)], 4, 100_000, vec![]),
            (vec![(0, 10 * m + 7)], 4, 100_000, vec![1, 2]),
            (vec![(0, 3 * m), (5 * m, 9 * m + 1)], 3, 65_536, vec![0]),
            (vec![(0, m / 2)], 8, 4096, vec![]),
            (vec![(0, 40 * m)], 16, 1 << 20, vec![3, 5, 7]),
        ] {
            let got = run(&work, n, step, &fail);
            covers_exactly(&got, &work);
        }
    }

    #[test]
    fn a_done_session_takes_half_of_the_largest_rest() {
        let m = RANGE_MIN;
        let mut p = Plan::new(&[(0, 8 * m)], 2);
        assert!(!p.started(0));
        assert_eq!(p.take(0), Some((0, 4 * m)));
        assert!(p.started(0) && !p.started(1));
        assert_eq!(p.take(1), Some((4 * m, 8 * m)));
        // Session 1 finishes; session 0 has read 1 MiB of its 4.
        p.claim(0, m as usize);
        assert_eq!(p.claim(1, 4 * m as usize), (4 * m, 4 * m as usize, true));
        p.give_back(1);
        assert_eq!(p.take(1), Some((m + 3 * m / 2, 4 * m)));
        // Session 0 now stops where session 1 took over.
        let (at, own, done) = p.claim(0, 2 * m as usize);
        assert_eq!((at, own as u64, done), (m, 3 * m / 2, true));
        // Too little left to split.
        p.give_back(0);
        p.claim(1, m as usize);
        assert_eq!(p.take(0), None);
        // A session that never got a range has not started (it is not
        // waited for once everything is claimed).
        let mut q = Plan::new(&[(0, m)], 3);
        assert_eq!(q.take(0), Some((0, m)));
        q.claim(0, m as usize);
        assert_eq!((q.take(2), q.started(2), q.left()), (None, false, 0));
    }
}
