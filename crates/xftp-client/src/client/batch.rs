//! Many files over one session without a round trip each: MODE E data
//! connections kept between transfers (the server's `CACHE` feature,
//! GridFTP data channel caching) and RETRs pipelined on the control
//! connection, so the server sends one file after another with no pause.
//!
//! ```text
//!   client: EPSV  RETR a  RETR b  RETR c ...   (a few round trips' worth)
//!   server: 229   150 [a blocks, EOF] 226  150 [b blocks, EOF] 226 ...
//! ```
//!
//! Each file is read up to its EOD on every connection and no further
//! (the next file's blocks follow on the same connections). When anything
//! goes wrong with the data connections, they are dropped, the replies of
//! the RETRs already sent are read (the server, without its connections,
//! refuses them), those files go back in the queue, and the next one sets
//! up new connections.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use xftp_tls::Stream;

use super::{
    chmod_cmd, local_err, local_target, mfmt_cmd, temp_next_to, Client, Done, Fit, TransferReport,
};
use crate::control::{unexpected, Cmd};
use crate::error::{ClientError, Result};

/// Most RETRs outstanding at once (the server reads them only as it gets
/// to them).
const DEPTH: usize = 128;

/// Least bytes of files asked for ahead, before the session has shown a
/// rate.
const AHEAD_MIN: u64 = 1 << 20;

/// Most bytes of files asked for ahead.
const AHEAD_MAX: u64 = 256 << 20;

/// What a file of unknown size counts for in the pipeline.
const UNKNOWN_SIZE: u64 = 64 << 10;

/// Bytes of files to keep asked for: four round trips at the rate the
/// session has shown, so that the server never waits for a RETR, within
/// [`AHEAD_MIN`, `AHEAD_MAX`]. Not more: files asked for belong to this
/// session, and sessions opened after it (each login costs round trips)
/// share only what is still in the queue. With 128 RETRs ahead, the
/// session that listed a tree took 33-39 of 40 files of 2 MB on a 500 ms
/// path before the others had logged in, and moved them on its one
/// connection.
fn ahead_budget(rate: Option<f64>, rtt: Option<std::time::Duration>) -> u64 {
    match (rate, rtt) {
        (Some(r), Some(t)) if r.is_finite() && r > 0.0 => {
            let b = 4.0 * r * t.as_secs_f64();
            (b.min(AHEAD_MAX as f64) as u64).max(AHEAD_MIN)
        }
        _ => AHEAD_MIN,
    }
}

/// Whether one more RETR may go out with `files` outstanding (the one
/// being received counted) holding `bytes`: always two beyond the one
/// being received, more while their bytes stay under the budget. One
/// beyond was not enough: the next RETR goes out when a file's 226
/// arrives, and that reply waits in the same router queue as the data
/// (8 sessions in slow start on a 500 ms path held it 0.75 s), longer
/// than the one file queued took to send.
fn room_ahead(files: usize, bytes: u64, budget: u64) -> bool {
    files < 3 || (files < DEPTH && bytes < budget)
}

/// One file of a batch.
#[derive(Debug, Clone)]
pub struct BatchItem {
    /// The server's path.
    pub remote: String,
    /// Where it goes (renamed into place when complete).
    pub local: PathBuf,
    /// The size the listing gave, checked at the end.
    pub size: Option<u64>,
}

/// A download's failure that is this end's (the local file: a full disk,
/// a refused path), which no server reply explains better and no retry
/// mends: the engine's faults that may not pass (`StripeFault`) are of
/// storage, or of data no server of ours sends.
fn local_fault(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Local { .. } | ClientError::Usage(_) | ClientError::StripeFault(_)
    )
}

impl Client {
    /// Whether [`download_batch`](Self::download_batch) can run on this
    /// session: the server keeps MODE E connections (FEAT `CACHE`), and
    /// nothing asks for a per-file exchange (`--verify`, `-c`).
    pub async fn batch_capable(&mut self) -> Result<bool> {
        if self.cfg.resume || self.cfg.verify != crate::Verify::Off {
            return Ok(false);
        }
        let f = self.features().await?;
        Ok(f.cache && f.mode_e)
    }

    /// Download the files `next` hands out, one after another over kept
    /// data connections with their RETRs pipelined (see the module
    /// notes). `next` is asked only when there is room in the pipeline, so
    /// sessions sharing one queue stay balanced. `done(item, result)` is
    /// called for each item as it ends. Every file keeps the guarantees of
    /// [`download`](Self::download): a temporary beside the target,
    /// renamed into place only after the server's 226 and a matching size.
    /// An error return means the session itself is lost (control
    /// connection); the items `next` gave and `done` did not report are
    /// returned with it, not downloaded.
    pub async fn download_batch(
        &mut self,
        mut next: impl FnMut() -> Option<BatchItem>,
        mut done: impl FnMut(BatchItem, Result<TransferReport>),
    ) -> std::result::Result<(), (ClientError, Vec<BatchItem>)> {
        let mut items: Vec<Option<BatchItem>> = Vec::new();
        let r = self.batch_run(&mut next, &mut items, &mut done).await;
        r.map_err(|e| (e, items.into_iter().flatten().collect()))
    }

    async fn batch_run(
        &mut self,
        next: &mut impl FnMut() -> Option<BatchItem>,
        items: &mut Vec<Option<BatchItem>>,
        done: &mut impl FnMut(BatchItem, Result<TransferReport>),
    ) -> Result<()> {
        // `items[i]` is taken when reported.
        let mut report =
            |items: &mut Vec<Option<BatchItem>>, i: usize, r: Result<TransferReport>| {
                if let Some(it) = items.get_mut(i).and_then(Option::take) {
                    done(it, r);
                }
            };
        // Indices of items to send (requeued ones first), then `next`.
        let mut pull = |items: &mut Vec<Option<BatchItem>>, queue: &mut VecDeque<usize>| {
            queue.pop_front().or_else(|| {
                next().map(|it| {
                    items.push(Some(it));
                    items.len() - 1
                })
            })
        };
        let remote = |items: &Vec<Option<BatchItem>>, i: usize| {
            items[i]
                .as_ref()
                .map(|it| it.remote.clone())
                .unwrap_or_default()
        };
        self.settle().await?;
        let mut queue: VecDeque<usize> = VecDeque::new();
        // RETRs sent and not yet answered, oldest first.
        let mut sent: VecDeque<(usize, Cmd)> = VecDeque::new();
        let mut conns: Option<Vec<Stream>> = None;
        // Files that went back to the queue once: a second time is a failure.
        let mut retried = std::collections::HashSet::new();
        // The session's rate: bytes of files done since the first 150.
        let mut shown: Option<(Instant, u64)> = None;
        let size_of = |items: &Vec<Option<BatchItem>>, i: usize| {
            items[i]
                .as_ref()
                .and_then(|it| it.size)
                .unwrap_or(UNKNOWN_SIZE)
        };
        loop {
            // The first RETR after new data connections: the plan, then
            // the RETR, then its 150 with the connections.
            let mut fresh = None;
            if conns.is_none() {
                debug_assert!(sent.is_empty());
                let Some(i) = pull(items, &mut queue) else {
                    return Ok(());
                };
                let c = Cmd::with("RETR", remote(items, i));
                match self.start_fresh(&c).await {
                    Ok(c_conns) => {
                        conns = Some(c_conns);
                        fresh = Some((i, c));
                    }
                    // Not the file's fault when MODE E was refused: the
                    // batch ends, the file is returned unfinished.
                    Err(e) if session_lost(&e) || !self.mode_e => return Err(e),
                    Err(e) => {
                        report(items, i, Err(e));
                        continue;
                    }
                }
            }
            // Keep the pipeline full, a few round trips deep.
            let rate = shown.and_then(|(t0, b)| {
                let s = t0.elapsed().as_secs_f64();
                (s > 0.0 && b > 0).then(|| b as f64 / s)
            });
            let budget = ahead_budget(rate, self.control_rtt());
            let mut files = sent.len();
            let mut bytes: u64 = sent.iter().map(|(i, _)| size_of(items, *i)).sum();
            if let Some((i, _)) = &fresh {
                files += 1;
                bytes += size_of(items, *i);
            }
            let mut batch = Vec::new();
            while room_ahead(files, bytes, budget) {
                let Some(i) = pull(items, &mut queue) else {
                    break;
                };
                files += 1;
                bytes += size_of(items, i);
                batch.push((i, Cmd::with("RETR", remote(items, i))));
            }
            if !batch.is_empty() {
                let cmds: Vec<&Cmd> = batch.iter().map(|(_, c)| c).collect();
                self.ctl.send(&cmds).await?;
                sent.extend(batch);
            }
            let (i, c, started) = match fresh {
                Some((i, c)) => (i, c, true),
                None => match sent.pop_front() {
                    Some((i, c)) => (i, c, false),
                    None => return Ok(()),
                },
            };
            if !started {
                let r = self.ctl.read_reply().await?;
                if !r.is_preliminary() {
                    // Refused before any data (550 no such file): the
                    // connections carry nothing for it. A 425 says the
                    // server has no connections kept: set up new ones.
                    if r.code == 425 {
                        conns = None;
                        let back = self.drain(&mut sent).await?;
                        requeue(i, back, &mut queue);
                    } else {
                        report(items, i, Err(unexpected(&c, &r)));
                    }
                    continue;
                }
            }
            let Some(cs) = conns.take() else {
                continue;
            };
            let Some(item) = items[i].clone() else {
                continue;
            };
            let begun = Instant::now();
            match self.receive_kept(&c, &item, cs).await {
                Ok((result, back)) => {
                    conns = Some(back);
                    if let Ok(rep) = &result {
                        shown.get_or_insert((begun, 0)).1 += rep.bytes;
                    }
                    report(items, i, result);
                }
                Err(e) if session_lost(&e) => return Err(e),
                Err(e) => {
                    // The data connections are in no known state and
                    // dropped (the server drops its ends too, and refuses
                    // the RETRs already sent). Those go again on new
                    // connections, and this file too, once: a second
                    // failure of its own is the file's.
                    let back = self.drain(&mut sent).await?;
                    // A fault here (a full local disk) would only happen
                    // again: the file fails now, as a single download does.
                    if !local_fault(&e) && retried.insert(i) {
                        requeue(i, back, &mut queue);
                    } else {
                        report(items, i, Err(e));
                        for j in back.into_iter().rev() {
                            queue.push_front(j);
                        }
                    }
                }
            }
        }
    }

    /// One file of a batch, after its 150: the blocks up to each
    /// connection's EOD, the 226, the size check and the rename.
    /// `Ok((result, connections))`: the connections are in step for the
    /// next file, whatever became of this one. `Err`: they are not (and
    /// are dropped); the RETR's final reply has been read either way.
    async fn receive_kept(
        &mut self,
        c: &Cmd,
        item: &BatchItem,
        conns: Vec<Stream>,
    ) -> Result<(Result<TransferReport>, Vec<Stream>)> {
        let start = Instant::now();
        let received = async {
            // Resolved before the temporary is made beside it: the rename
            // stays in one directory (a link is written through, a device
            // refused, as for any download).
            let target = local_target(&item.local)?;
            let resolved = target.clone();
            let tmp = tokio::task::spawn_blocking(move || temp_next_to(&target, false))
                .await
                .map_err(|e| local_err(&item.local, std::io::Error::other(e)))??;
            let file = tmp.reopen().map_err(|e| local_err(tmp.path(), e))?;
            let dog = self.watchdog();
            let conns: Vec<_> = conns.into_iter().map(|s| dog.guard(s)).collect();
            // No size for the engine: a file that changed since the
            // listing still arrives whole (the connections stay in step)
            // and is refused below.
            let rx = xftp_stripe::Receiver::file_kept(Arc::new(file), None, conns);
            let (rep, back) = rx
                .finish_kept()
                .await
                .map_err(|e| super::stripe_err(e, self.cfg.data_timeout))?;
            Ok((tmp, rep, back, resolved))
        }
        .await;
        let (tmp, rep, back, resolved) = match received {
            Ok(r) => r,
            Err(e) => {
                // The server's final reply for this RETR, which says why
                // better when it failed on its side (not when the cause
                // is here: its failure then only follows ours).
                let r = self.final_reply().await?;
                let ours = local_fault(&e);
                return Err(if r.is_failure() && !ours {
                    unexpected(c, &r)
                } else {
                    e
                });
            }
        };
        self.expect_complete(c).await?;
        let back: Vec<Stream> = back.into_iter().map(|g| g.into_inner()).collect();
        let n = back.len() as u32;
        let timeline = self.timeline(false, n);
        let done = Done {
            per_stream: rep.streams.iter().map(|s| s.bytes).collect(),
            expected: item.size,
            start,
            timeline,
        };
        let result = self
            .complete_download(&item.remote, done, tmp, &resolved, None)
            .await;
        Ok((result, back))
    }

    /// The next reply that is not preliminary.
    async fn final_reply(&mut self) -> Result<xftp_proto::Reply> {
        loop {
            let r = self.ctl.read_reply().await?;
            if !r.is_preliminary() {
                return Ok(r);
            }
        }
    }

    /// The data connections are gone: read the final reply of every RETR
    /// already sent (the server refuses them, or sent a file nobody
    /// read); those files, in order.
    async fn drain(&mut self, sent: &mut VecDeque<(usize, Cmd)>) -> Result<Vec<usize>> {
        let mut back = Vec::new();
        while let Some((i, c)) = sent.pop_front() {
            let r = self.final_reply().await?;
            tracing::debug!(
                "{} after the data connections went: {}",
                c.display(),
                r.code
            );
            back.push(i);
        }
        Ok(back)
    }
}

/// Put `first`, then `back`, at the front of the queue, in that order.
/// Files refused only because the connections went are not charged a
/// retry: each round ends at least one file (done, or its own retry used),
/// so this terminates.
fn requeue(first: usize, back: Vec<usize>, queue: &mut VecDeque<usize>) {
    for j in back.into_iter().rev() {
        queue.push_front(j);
    }
    queue.push_front(first);
}

/// Errors after which the control connection cannot go on.
fn session_lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Closed | ClientError::ControlIo(_) | ClientError::Timeout { .. }
    )
}

/// One file of an upload batch.
#[derive(Debug, Clone)]
pub struct UploadItem {
    /// The local file.
    pub local: PathBuf,
    /// Where it goes on the server.
    pub remote: String,
    /// A modification time to set after the upload (MFMT), if any, in
    /// milliseconds since the epoch.
    pub mtime: Option<i64>,
    /// Permission bits to set after the upload (SITE CHMOD), if any.
    pub mode: Option<u32>,
}

/// The commands that follow one upload's data, sent in one write with the
/// next STOR: their replies come after the upload's 226.
struct After {
    size: Cmd,
    mfmt: Option<Cmd>,
    chmod: Option<Cmd>,
}

impl Client {
    /// Upload the files `next` hands out over kept MODE E data
    /// connections (FEAT `CACHE`). Each file's STOR goes out with the
    /// previous file's follow-up commands (SIZE, MFMT, SITE CHMOD) right
    /// after that file's data, so a file costs one round trip (its STOR's
    /// 150, which must come before its data: a refused STOR must not have
    /// its data taken for the next one) instead of five. `done(item,
    /// result)` for each; a file is complete on the server under its name
    /// only after the server's 226 and a SIZE that matches. MFMT and SITE
    /// CHMOD are best effort (a server that refuses one is not asked
    /// again). An error return means the session is lost; the items not
    /// reported are returned with it.
    pub async fn upload_batch(
        &mut self,
        mut next: impl FnMut() -> Option<UploadItem>,
        mut done: impl FnMut(UploadItem, Result<TransferReport>),
    ) -> std::result::Result<(), (ClientError, Vec<UploadItem>)> {
        // The file being sent, and the next one once its STOR is written.
        let mut held: [Option<UploadItem>; 2] = [None, None];
        let r = self.upload_run(&mut next, &mut done, &mut held).await;
        r.map_err(|e| (e, held.into_iter().flatten().collect()))
    }

    async fn upload_run(
        &mut self,
        next: &mut impl FnMut() -> Option<UploadItem>,
        done: &mut impl FnMut(UploadItem, Result<TransferReport>),
        held: &mut [Option<UploadItem>; 2],
    ) -> Result<()> {
        let [cur, up] = held;
        self.settle().await?;
        let (mut mfmt_ok, mut chmod_ok) = (true, true);
        let fraction = self.mfmt_fraction().await?;
        let mut conns: Option<Vec<Stream>> = None;
        // The STOR of `cur`, already sent over kept connections.
        let mut sent: Option<Cmd> = None;
        // Whether `cur` has had its one retry on new connections.
        let mut retried = false;
        // `cur`'s file, opened before its STOR is sent.
        let mut src: Option<(std::fs::File, u64)> = None;
        loop {
            if cur.is_none() {
                *cur = next();
                retried = false;
            }
            let Some(item) = cur.clone() else {
                return Ok(());
            };
            let start = Instant::now();
            let (file, len) = match src.take().map_or_else(|| open_source(&item.local), Ok) {
                Ok(o) => o,
                Err(e) => {
                    if sent.take().is_some() {
                        // Its STOR went out and the server waits for the
                        // data on the kept connections: close them (with
                        // no EOD the upload fails there, nothing is kept)
                        // and read how it ended.
                        conns = None;
                        self.final_reply().await?;
                    }
                    cur.take();
                    done(item, Err(e));
                    continue;
                }
            };
            // The STOR and its 150 (with new connections if none are kept).
            let c = match sent.take() {
                Some(c) => {
                    let r = self.ctl.read_reply().await?;
                    if r.code == 425 && !retried {
                        // Nothing kept on the server's side: again, with
                        // new connections.
                        conns = None;
                        retried = true;
                        continue;
                    }
                    if !r.is_preliminary() {
                        cur.take();
                        done(item, Err(unexpected(&c, &r)));
                        continue;
                    }
                    c
                }
                None => {
                    conns = None;
                    let c = Cmd::with("STOR", &item.remote);
                    match self.start_fresh(&c).await {
                        Ok(cs) => conns = Some(cs),
                        Err(e) if session_lost(&e) || !self.mode_e => return Err(e),
                        Err(e) => {
                            cur.take();
                            done(item, Err(e));
                            continue;
                        }
                    }
                    c
                }
            };
            let Some(cs) = conns.take() else {
                continue;
            };
            let dog = self.watchdog();
            // As a single upload (`Client::send_striped`): the backlog
            // bounded, a small file cut so that every connection gets
            // records.
            let meters = xftp_tune::meter::MeterSet::new();
            let n = cs.len();
            let cs: Vec<_> = cs
                .into_iter()
                .map(|s| super::adaptive::sending(&meters, &dog, s))
                .collect();
            let cfg = xftp_stripe::SendConfig {
                record_size: xftp_stripe::record_size_for(len, n, xftp_stripe::DEFAULT_RECORD_SIZE),
                keep_open: true,
                ..xftp_stripe::SendConfig::default()
            };
            let tx = xftp_stripe::Sender::file(Arc::new(file), len, cs, &cfg);
            let (rep, back) = match tx.finish_kept().await {
                Ok(r) => r,
                Err(e) => {
                    let e = super::stripe_err(e, self.cfg.data_timeout);
                    let r = self.final_reply().await?;
                    // Once more on new connections; a second failure is
                    // the file's.
                    if !retried {
                        retried = true;
                        continue;
                    }
                    cur.take();
                    done(
                        item,
                        Err(if r.is_failure() {
                            unexpected(&c, &r)
                        } else {
                            e
                        }),
                    );
                    continue;
                }
            };
            conns = Some(
                back.into_iter()
                    .map(|g| g.into_inner().into_inner())
                    .collect(),
            );
            // The follow-ups of this file and the next file's STOR, in one
            // write: the server reads them after this upload's 226.
            let after = After {
                size: Cmd::with("SIZE", &item.remote),
                mfmt: item
                    .mtime
                    .filter(|_| mfmt_ok)
                    .map(|t| mfmt_cmd(&item.remote, t, fraction)),
                chmod: item
                    .mode
                    .filter(|_| chmod_ok)
                    .map(|m| chmod_cmd(&item.remote, m)),
            };
            // The next file, opened now: a STOR goes out only for a file
            // whose data can follow.
            *up = loop {
                let Some(u) = next() else { break None };
                match open_source(&u.local) {
                    Ok(o) => {
                        src = Some(o);
                        break Some(u);
                    }
                    Err(e) => done(u, Err(e)),
                }
            };
            let stor = up.as_ref().map(|u| Cmd::with("STOR", &u.remote));
            let mut cmds = vec![&after.size];
            cmds.extend(after.mfmt.as_ref());
            cmds.extend(after.chmod.as_ref());
            cmds.extend(stor.as_ref());
            self.ctl.send(&cmds).await?;
            let complete = self.expect_complete(&c).await;
            let size_reply = self.ctl.read_reply().await?;
            if after.mfmt.is_some() {
                mfmt_ok = self.ctl.read_reply().await?.code == 213;
            }
            if after.chmod.is_some() {
                chmod_ok = self.ctl.read_reply().await?.code == 200;
            }
            let result = complete.and_then(|()| {
                let sent: u64 = rep.streams.iter().map(|s| s.bytes).sum();
                match super::negotiate::size_value(&size_reply) {
                    Some(got) if got != len => Err(ClientError::UploadMismatch {
                        what: "the server's SIZE",
                        expected: len,
                        got,
                    }),
                    _ if sent != len => Err(ClientError::UploadMismatch {
                        what: "bytes sent",
                        expected: len,
                        got: sent,
                    }),
                    _ => Ok(TransferReport {
                        bytes: sent,
                        per_stream_bytes: rep.streams.iter().map(|s| s.bytes).collect(),
                        elapsed: start.elapsed(),
                        timeline: None,
                        checksum: None,
                        already: 0,
                        received_twice: 0,
                        sent_twice: 0,
                    }),
                }
            });
            if result.is_err() {
                // The server drops its connections after a failed upload.
                conns = None;
            }
            cur.take();
            done(item, result);
            *cur = up.take();
            retried = false;
            sent = stor;
        }
    }
}

impl Client {
    /// `c` (RETR or STOR) on new data connections: the data plan, `c`,
    /// its 150 and the connections. The session's first one sends `MODE
    /// E` (kept connections are MODE E's) in the same write as the data
    /// plan: a round trip fewer.
    async fn start_fresh(&mut self, c: &Cmd) -> Result<Vec<Stream>> {
        let mode = (!self.mode_e).then(|| Cmd::with("MODE", "E"));
        let (reply, setup) = self
            .prepare_data(false, mode.as_ref(), Fit::Session)
            .await?;
        if let (Some(m), Some(r)) = (&mode, &reply) {
            if r.code != 200 {
                return Err(unexpected(m, r));
            }
            self.mode_e = true;
        }
        self.ctl.send(&[c]).await?;
        Ok(self.start_transfer(c, setup).await?.0)
    }
}

/// The local file of an upload and its length: a regular file only.
fn open_source(path: &std::path::Path) -> Result<(std::fs::File, u64)> {
    let file = std::fs::File::open(path).map_err(|e| local_err(path, e))?;
    let md = file.metadata().map_err(|e| local_err(path, e))?;
    if !md.is_file() {
        return Err(ClientError::Usage(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok((file, md.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_pipeline_holds_a_few_round_trips_of_the_sessions_rate() {
        // Nothing shown yet: the floor.
        assert_eq!(
            ahead_budget(None, Some(Duration::from_millis(500))),
            AHEAD_MIN
        );
        assert_eq!(ahead_budget(Some(1e6), None), AHEAD_MIN);
        // 12.5 MB/s over 500 ms: four round trips are 25 MB.
        let b = ahead_budget(Some(12.5e6), Some(Duration::from_millis(500)));
        assert_eq!(b, 25_000_000);
        // A slow or short path stays at the floor; a fast long one at the cap.
        assert_eq!(
            ahead_budget(Some(1e5), Some(Duration::from_millis(10))),
            AHEAD_MIN
        );
        assert_eq!(
            ahead_budget(Some(1e10), Some(Duration::from_secs(1))),
            AHEAD_MAX
        );
        assert_eq!(
            ahead_budget(Some(f64::NAN), Some(Duration::from_secs(1))),
            AHEAD_MIN
        );
    }

    #[test]
    fn two_files_always_go_ahead_and_more_only_within_the_budget() {
        // A large file alone is over any budget, yet two more are asked for.
        assert!(room_ahead(0, 0, AHEAD_MIN));
        assert!(room_ahead(2, 1 << 30, AHEAD_MIN));
        assert!(!room_ahead(3, 1 << 30, AHEAD_MIN));
        // Small files: up to the budget, and never past DEPTH.
        assert!(room_ahead(10, AHEAD_MIN - 1, AHEAD_MIN));
        assert!(!room_ahead(10, AHEAD_MIN, AHEAD_MIN));
        assert!(!room_ahead(DEPTH, 0, AHEAD_MIN));
        // 2 MB files under the 1 MiB floor: three outstanding, not 128.
        let mut files = 0;
        let mut bytes = 0;
        while room_ahead(files, bytes, AHEAD_MIN) {
            files += 1;
            bytes += 2_000_000;
        }
        assert_eq!(files, 3);
    }
}
