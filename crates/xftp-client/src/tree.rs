//! Directory trees (`-r`): walk, then move many files at once.
//!
//! Small files are limited by round trips, not bandwidth: in plain FTP
//! each costs a data connection and a few replies. So a tree is listed
//! by several sessions at once (`concurrency`), and moves over them: one
//! session with the caller's settings (`-p`) takes the large files,
//! largest first, and the others take the small ones. Against a server
//! that keeps MODE E data connections (FEAT `CACHE`, `xftp serve`), a
//! small-file session sends its RETRs pipelined over one kept connection
//! ([`Client::download_batch`]), so a file costs no round trip at all;
//! elsewhere, one transfer at a time. When the large files are done,
//! their session helps with the small ones. Each file keeps every
//! guarantee of a single transfer (a download is renamed into place only
//! when complete; `--verify` checks each one). Times and permission bits
//! are preserved where the other side allows (MLSD facts and MFMT /
//! SITE CHMOD).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xftp_proto::facts::Kind;

use crate::client::{local_err, BatchItem, Client, Made, UploadItem};
use crate::error::{ClientError, Result};

/// Which kind of session a tree asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// For the large files: the caller's stream settings.
    Large,
    /// For the small files: one plain connection per file.
    Small,
}

/// A boxed future (the connector's result).
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Opens a logged-in session of the given role.
pub type Connect = Arc<dyn Fn(Role) -> BoxFut<Result<Client>> + Send + Sync>;

/// How a tree moves.
#[derive(Debug, Clone)]
pub struct TreeOptions {
    /// Sessions at once (at least 1).
    pub concurrency: usize,
    /// Files at least this large go to the large-file session.
    pub large: u64,
    /// Keep modification times and permission bits.
    pub preserve: bool,
    /// Skip files already complete at the destination (same size and
    /// modification time), as a mirror does; with `-c`.
    pub skip_complete: bool,
    /// A pooled progress ([`crate::Progress::pooled`]) the sessions count
    /// into; the tree sets its total once walked.
    pub progress: Option<Arc<crate::progress::Progress>>,
    /// Move only these files (paths relative to the tree's top, as in
    /// [`TreeReport::failed`]): a second run over what the first left
    /// failed ([`TreeReport::may_pass`]). `None`: every file.
    pub only: Option<Arc<HashSet<String>>>,
}

impl Default for TreeOptions {
    fn default() -> Self {
        TreeOptions {
            concurrency: 8,
            large: 8 << 20,
            preserve: true,
            skip_complete: false,
            progress: None,
            only: None,
        }
    }
}

/// What a tree transfer did.
#[derive(Debug, Clone, Default)]
pub struct TreeReport {
    /// Files moved.
    pub files: usize,
    /// Directories created or found.
    pub dirs: usize,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Files skipped as already complete (`skip_complete`).
    pub skipped: usize,
    /// Entries neither file nor directory (symbolic links, devices):
    /// left out.
    pub other: usize,
    /// Partials and records of cut resumable transfers
    /// (`.NAME.xftp-part`, `.NAME.xftp-part.ranges`): left out.
    pub partials: usize,
    /// Entries the server said it left out of its listings (`xftp serve`:
    /// names with a line break, links leading outside its root or to
    /// nothing): not copied.
    pub unlisted: usize,
    /// Files that failed: (path, why).
    pub failed: Vec<(String, String)>,
    /// The paths among [`TreeReport::failed`] whose failure may pass
    /// when run again ([`ClientError::is_transient`], or no session
    /// could be opened for them), sorted.
    pub may_pass: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
    /// Sessions used.
    pub sessions: usize,
    /// The large files (at least [`TreeOptions::large`]) moved, one at a
    /// time with every stream: how many, their bytes, and from the start
    /// of the first to the end of the last (their rate, set beside a
    /// single file's, shows what the small files around them cost).
    pub large: LargeFiles,
}

/// See [`TreeReport::large`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LargeFiles {
    /// Files moved.
    pub files: usize,
    /// Their payload bytes.
    pub bytes: u64,
    /// When the first started and the last ended.
    pub span: Option<(Instant, Instant)>,
}

impl LargeFiles {
    /// One more large file, moved from `start` to now.
    fn add(&mut self, start: Instant, bytes: u64) {
        let now = Instant::now();
        self.files += 1;
        self.bytes += bytes;
        self.span = Some(match self.span {
            Some((a, b)) => (a.min(start), b.max(now)),
            None => (start, now),
        });
    }

    fn merge(&mut self, o: &LargeFiles) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.span = match (self.span, o.span) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, y) => x.or(y),
        };
    }

    /// From the first start to the last end.
    pub fn elapsed(&self) -> Duration {
        self.span.map_or(Duration::ZERO, |(a, b)| b - a)
    }
}

#[derive(Debug, Clone)]
struct Job {
    /// Path below the tree's root, `/`-separated.
    rel: String,
    /// Bytes (0 where the listing did not say).
    size: u64,
    /// Bytes, as the listing gave them.
    listed: Option<u64>,
    /// Milliseconds since the epoch.
    mtime: Option<i64>,
    mode: Option<u32>,
}

struct Queues {
    large: Mutex<VecDeque<Job>>,
    small: Mutex<VecDeque<Job>>,
    /// Files at least this large are in `large`.
    large_min: u64,
}

impl Queues {
    fn new(mut jobs: Vec<Job>, large: u64) -> Queues {
        // Largest first: the long transfers start early and the short
        // ones fill in around them.
        jobs.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.rel.cmp(&b.rel)));
        let (l, s): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.size >= large);
        Queues {
            large: Mutex::new(l.into()),
            small: Mutex::new(s.into()),
            large_min: large,
        }
    }

    fn pop(&self, role: Role) -> Option<Job> {
        let take =
            |q: &Mutex<VecDeque<Job>>| q.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        match role {
            Role::Large => take(&self.large).or_else(|| take(&self.small)),
            Role::Small => take(&self.small),
        }
    }

    /// A job taken but not done (its session broke): first again.
    fn put_back(&self, job: Job) {
        let q = if job.size >= self.large_min {
            &self.large
        } else {
            &self.small
        };
        q.lock().unwrap_or_else(|p| p.into_inner()).push_front(job);
    }

    fn len(&self) -> usize {
        self.large.lock().unwrap_or_else(|p| p.into_inner()).len()
            + self.small.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn large_count(&self) -> usize {
        self.large.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn has_large(&self) -> bool {
        !self
            .large
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// The local path of `rel` (a name as listings give it, possibly holding
/// bytes that are not UTF-8: xftp_proto::name) under `local`.
fn local_path(local: &Path, rel: &str) -> PathBuf {
    local.join(xftp_proto::name::to_path(rel))
}

/// A remote path: `rel` under the directory `base` (`rel` alone where
/// `base` is empty or `.`).
pub fn join(base: &str, rel: &str) -> String {
    if base.is_empty() || base == "." {
        rel.to_owned()
    } else if base.ends_with('/') {
        format!("{base}{rel}")
    } else {
        format!("{base}/{rel}")
    }
}

/// A local file's time in milliseconds since the epoch, the unit of a
/// tree's times (the MLSx `modify` fact's, [`xftp_proto::facts::Entry`]).
fn mtime_ms(md: &std::fs::Metadata) -> Option<i64> {
    md.modified().ok().map(xftp_proto::facts::epoch_ms)
}

/// Download the tree under `remote` (a directory) into `local` (created).
pub async fn get_tree(
    connect: Connect,
    remote: &str,
    local: &Path,
    opt: &TreeOptions,
) -> Result<TreeReport> {
    let start = Instant::now();
    let mut first = connect(Role::Small).await?;
    // With --verify, a server without checksums is refused once, before
    // any directory is made or file moved.
    first.check_verify().await?;
    let mut report = TreeReport::default();
    let made = !local.exists();
    if local.exists() && !local.is_dir() {
        return Err(ClientError::Usage(format!(
            "{} is a file: a tree is downloaded into a directory; give a directory (new or existing)",
            local.display()
        )));
    }
    std::fs::create_dir_all(local).map_err(|e| local_err(local, e))?;
    // A run over some files only lists their directories.
    let walked = match walk(
        first,
        &connect,
        remote,
        local,
        opt.concurrency,
        opt.only.as_deref(),
    )
    .await
    {
        Ok(w) => w,
        Err(e) => {
            // A remote that is a file or is missing: no empty directory
            // left behind for it (one that holds what was listed stays).
            if made {
                let _ = std::fs::remove_dir(local);
            }
            return Err(e);
        }
    };
    let dir_facts = walked.dir_facts;
    let top = local.to_owned();
    report.dirs = walked.dirs;
    report.other = walked.other;
    report.partials = walked.partials;
    report.unlisted = walked.unlisted;
    report.failed = walked.refused;
    let (sessions, jobs) = (walked.sessions, only(opt, walked.jobs, &mut report));
    announce(opt, &jobs);
    let q = Arc::new(Queues::new(jobs, opt.large));
    let remote = remote.to_owned();
    let local = local.to_owned();
    let run = move |c: Client, role: Role, q: Arc<Queues>, connect: Connect, opt: TreeOptions| {
        let (remote, local) = (remote.clone(), local.clone());
        async move {
            let mut w = Worker::new(c, role, connect);
            // The large files one at a time with every stream; then the
            // small ones pipelined over kept connections where the server
            // keeps them; what is left (a server without CACHE), one by one.
            let mut role_now = role;
            loop {
                if role_now == Role::Large && !q.has_large() {
                    role_now = Role::Small;
                }
                if role_now == Role::Small {
                    get_batched(&mut w, &q, &remote, &local, &opt).await;
                }
                let Some(job) = q.pop(role_now) else {
                    break;
                };
                let target = local_path(&local, &job.rel);
                if opt.skip_complete && complete_locally(&target, &job) {
                    w.rep.skipped += 1;
                    continue;
                }
                let src = join(&remote, &job.rel);
                w.reopen().await;
                let Some(c) = w.client.as_mut() else {
                    w.no_session(job.rel);
                    continue;
                };
                let started = Instant::now();
                c.expect_listed_size(job.listed);
                match c.download(&src, &target).await {
                    Ok(r) => {
                        w.rep.files += 1;
                        w.rep.bytes += r.bytes;
                        if job.size >= opt.large {
                            w.rep.large.add(started, r.bytes);
                        }
                        if opt.preserve {
                            keep_facts(&target, &job);
                        }
                    }
                    Err(e) => w.failed(job.rel, e),
                }
            }
            w.end().await
        }
    };
    let reports = spread(sessions, connect, q, opt, run).await;
    report.merge(reports);
    if opt.preserve {
        keep_dir_facts(&top, dir_facts);
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The remote directories' times and permission bits on the local ones,
/// once their files are in (a file put in a directory changes its time).
/// The owner keeps full rights to each, so that a later `-c` run can
/// still add to it (a remote 555 comes back 755).
fn keep_dir_facts(local: &Path, mut facts: Vec<(String, Option<i64>, Option<u32>)>) {
    use std::os::unix::fs::PermissionsExt;
    // The deepest first; none of this changes a parent's time.
    facts.sort_by_key(|(rel, ..)| std::cmp::Reverse(rel.matches('/').count()));
    for (rel, mtime, mode) in facts {
        let p = local_path(local, &rel);
        if let Some(m) = mode {
            let m = (m & 0o777) | 0o700;
            if let Err(e) = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)) {
                tracing::warn!("{}: cannot set the permissions: {e}", p.display());
            }
        }
        if let Some(t) = mtime {
            let r = std::fs::File::open(&p)
                .and_then(|f| f.set_modified(xftp_proto::facts::system_time_ms(t)));
            if let Err(e) = r {
                tracing::warn!("{}: cannot set the modification time: {e}", p.display());
            }
        }
    }
}

/// What walking a remote tree found.
struct Walked {
    /// The sessions that listed it, logged in, for the transfers.
    sessions: Vec<Client>,
    jobs: Vec<Job>,
    dirs: usize,
    other: usize,
    partials: usize,
    unlisted: usize,
    /// Each directory's time and mode, as listed: set once its files are in.
    dir_facts: Vec<(String, Option<i64>, Option<u32>)>,
    /// Subdirectories not listed, with why.
    refused: Vec<(String, String)>,
}

/// List the tree under `remote` (MLSD gives sizes, times, modes; LIST
/// where the server has no MLSD) and
/// create its directories under `local`. A listing costs round trips, so
/// directories are listed by up to `concurrency` sessions at once:
/// `first`, and more opened when the root has subdirectories. With
/// `only` (a run over some files), only the directories that hold them,
/// and those above, are listed.
async fn walk(
    mut first: Client,
    connect: &Connect,
    remote: &str,
    local: &Path,
    concurrency: usize,
    only: Option<&HashSet<String>>,
) -> Result<Walked> {
    use tokio::sync::Notify;
    struct Shared {
        st: Mutex<WalkState>,
        more: Notify,
        /// Only these directories are listed (a run over some files
        /// only: their directories and those above them).
        needed: Option<HashSet<String>>,
        /// A `LIST -a` listing showed a directory's own `.`: the server
        /// lists it for what it can read ([`Client::entries_dotted`]).
        dots: std::sync::atomic::AtomicBool,
        /// The local target's `unique` as `xftp serve` writes it (device
        /// and inode): a remote directory with that fact is the target
        /// itself, on a disk the server serves, which would copy itself
        /// level after level until paths grow too long.
        own: Option<String>,
    }
    #[derive(Default)]
    struct WalkState {
        dirs: VecDeque<String>,
        /// Listings running now.
        busy: usize,
        jobs: Vec<Job>,
        ndirs: usize,
        other: usize,
        partials: usize,
        unlisted: usize,
        failed: Option<ClientError>,
        /// Subdirectories the server refused to list or could not read,
        /// with why: failures of the tree, the rest of it is copied.
        refused: Vec<(String, String)>,
        /// The `unique` facts of the directories taken (where the server
        /// gives them), by path: a directory whose fact one above it has
        /// is a link back up the tree.
        uniques: std::collections::HashMap<String, String>,
        dir_facts: Vec<(String, Option<i64>, Option<u32>)>,
    }
    fn lock(sh: &Shared) -> std::sync::MutexGuard<'_, WalkState> {
        sh.st.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// List `d` and record what it holds.
    async fn list_one(
        c: &mut Client,
        sh: &Shared,
        remote: &str,
        local: &Path,
        d: &str,
    ) -> Result<()> {
        // Counted for this listing only (a shell session may have listed
        // before).
        c.take_unlisted();
        let (entries, dot, unreadable) = c.entries_dotted(&join(remote, d)).await?;
        use std::sync::atomic::Ordering::Relaxed;
        match dot {
            Some(true) => sh.dots.store(true, Relaxed),
            // The top, from a server that lists `.` where it can read (else
            // it is the first listing: nothing learnt yet): CWD tells.
            Some(false) if d.is_empty() && entries.len() <= 1 => {
                let top = join(remote, d);
                if !c.is_dir(&top).await? {
                    return Err(ClientError::NotListed { path: top });
                }
            }
            Some(false) if !d.is_empty() && sh.dots.load(Relaxed) => {
                lock(sh).refused.push((
                    format!("{d}/"),
                    "the server could not read this directory (its listing lacks the \
                     directory's own entry): nothing in it was copied; check its \
                     permissions on the server"
                        .into(),
                ));
                return Ok(());
            }
            _ => {}
        }
        let mut st = lock(sh);
        st.unlisted += c.take_unlisted();
        let faults = c.take_unreadable();
        if faults > 0 {
            st.refused.push((
                format!("{d}/"),
                format!(
                    "the server could not read {faults} of its entries (no permission, a path \
                     too long, or an I/O error): not copied; check their permissions on the \
                     server (-v shows its reply)"
                ),
            ));
        }
        if let Some(first) = unreadable.first() {
            st.refused.push((
                format!("{d}/"),
                format!(
                    "{} line(s) of its listing name nothing this client can take (a name of \
                     blanks only, or one with `/` or `..` that would leave the directory), \
                     e.g. {first:?}: not copied",
                    unreadable.len()
                ),
            ));
        }
        let mut seen = HashSet::new();
        for e in entries {
            // A name listed twice (a broken or hostile server) would be
            // fetched twice into one target at once: once.
            if !seen.insert(e.name.clone()) {
                tracing::warn!(
                    "{}: listed twice in {:?}; taken once",
                    e.name,
                    join(remote, d)
                );
                continue;
            }
            let rel = if d.is_empty() {
                e.name.clone()
            } else {
                format!("{d}/{}", e.name)
            };
            match e.kind {
                Kind::Dir if e.unique.is_some() && e.unique == sh.own => {
                    st.refused.push((
                        format!("{rel}/"),
                        format!(
                            "this is the download's own target, {} (the server serves the disk it is on): left out, as the tree would copy itself into itself; download into a directory outside what the server serves",
                            local.display()
                        ),
                    ));
                    continue;
                }
                Kind::Dir => {
                    if let Some(u) = &e.unique {
                        // A server that lists a link to a directory as the
                        // directory (pyftpdlib): `x -> .` would copy the
                        // tree into itself until the path is too long.
                        // `d` and every directory above it, the top ("")
                        // last.
                        let mut up = Some(d);
                        let mut looped = false;
                        while let (Some(p), false) = (up, looped) {
                            looped = st.uniques.get(p) == Some(u);
                            up = (!p.is_empty()).then(|| p.rsplit_once('/').map_or("", |(a, _)| a));
                        }
                        if looped {
                            tracing::warn!(
                                "{rel}: a link to a directory above it; left out (the tree would loop)"
                            );
                            st.other += 1;
                            continue;
                        }
                        st.uniques.insert(rel.clone(), u.clone());
                    }
                    let p = local_path(local, &rel);
                    if let Err(err) = std::fs::create_dir_all(&p) {
                        // A local file where the tree has a directory (or
                        // a directory we may not write): that subtree
                        // fails, the rest is copied.
                        let in_the_way = err.kind() == std::io::ErrorKind::AlreadyExists
                            || err.raw_os_error() == Some(libc::ENOTDIR);
                        let why = if in_the_way {
                            format!(
                                "a local file is in the way: {} (or a directory above it) is not a directory; move it away, or download into another directory",
                                p.display()
                            )
                        } else {
                            local_err(&p, err).to_string()
                        };
                        st.refused.push((rel, why));
                        continue;
                    }
                    st.ndirs += 1;
                    st.dir_facts.push((rel.clone(), e.modify_ms, e.mode));
                    if sh.needed.as_ref().map_or(true, |n| n.contains(&rel)) {
                        st.dirs.push_back(rel);
                    }
                }
                Kind::File if is_resume_file(&e.name) => {
                    tracing::info!("{rel}: a resumable transfer's partial or record; left out");
                    st.partials += 1;
                }
                Kind::File => st.jobs.push(Job {
                    rel,
                    size: e.size.unwrap_or(0),
                    listed: e.size,
                    mtime: e.modify_ms,
                    mode: e.mode,
                }),
                _ => st.other += 1,
            }
        }
        Ok(())
    }
    async fn lister(
        mut c: Client,
        sh: Arc<Shared>,
        remote: String,
        local: std::path::PathBuf,
    ) -> Client {
        loop {
            let notified = sh.more.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let d = {
                let mut st = lock(&sh);
                if st.failed.is_some() {
                    return c;
                }
                match st.dirs.pop_front() {
                    Some(d) => {
                        st.busy += 1;
                        Some(d)
                    }
                    None if st.busy == 0 => return c,
                    None => None,
                }
            };
            let Some(d) = d else {
                notified.await;
                continue;
            };
            let r = list_one(&mut c, &sh, &remote, &local, &d).await;
            let mut st = lock(&sh);
            st.busy -= 1;
            match r {
                // A subdirectory refused (550, permission denied): the
                // rest of the tree is still copied, and the run fails.
                Err(e @ ClientError::Reply { code, .. }) if (500..600).contains(&code) => {
                    st.refused.push((format!("{d}/"), e.to_string()));
                }
                Err(e) => {
                    st.failed.get_or_insert(e);
                }
                Ok(()) => {}
            }
            drop(st);
            sh.more.notify_waiters();
        }
    }
    let needed = only.map(|files| {
        let mut dirs = HashSet::new();
        for f in files {
            let mut d = f.as_str();
            while let Some((parent, _)) = d.rsplit_once('/') {
                dirs.insert(parent.to_owned());
                d = parent;
            }
        }
        dirs
    });
    // Only where the server runs on this host (an address of ours: one a
    // socket can be bound to): another host's device and inode numbers
    // could match by chance.
    let ip = first.peer().ip();
    let here = ip.is_loopback() || std::net::TcpListener::bind((ip, 0)).is_ok();
    let own = std::fs::metadata(local).ok().filter(|_| here).map(|m| {
        use std::os::unix::fs::MetadataExt;
        format!("{:x}g{:x}", m.dev(), m.ino())
    });
    let sh = Arc::new(Shared {
        st: Mutex::new(WalkState::default()),
        more: Notify::new(),
        needed,
        dots: Default::default(),
        own,
    });
    // The top's own `unique`, so that a link back to it is told at once
    // (else its first step is copied once more), and its time and mode,
    // which the local top takes as the directories below take theirs.
    // Best effort: a server without MLST gives none.
    if let Ok(Some(e)) = first.mlst(remote).await {
        if let Some(u) = e.unique {
            if sh.own.as_ref() == Some(&u) {
                return Err(ClientError::Usage(format!(
                    "{} is the very directory {remote} names (the server serves the disk it is on): there is nothing to copy; download into another directory",
                    local.display()
                )));
            }
            lock(&sh).uniques.insert(String::new(), u);
        }
        if e.kind == Kind::Dir {
            lock(&sh)
                .dir_facts
                .push((String::new(), e.modify_ms, e.mode));
        }
    }
    list_one(&mut first, &sh, remote, local, "").await?;
    let subdirs = lock(&sh).dirs.len();
    let mut set = tokio::task::JoinSet::new();
    let spawn = |set: &mut tokio::task::JoinSet<Client>, c: Client| {
        set.spawn(lister(c, sh.clone(), remote.to_owned(), local.to_owned()));
    };
    spawn(&mut set, first);
    // More listers while the root's subdirectories wait; each session
    // opened here moves files afterwards.
    let extra = concurrency.max(1).saturating_sub(1).min(subdirs);
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..extra {
        let c = connect.clone();
        opening.spawn(async move { c(Role::Small).await });
    }
    let mut refused = Vec::new();
    while let Some(r) = opening.join_next().await {
        match r {
            Ok(Ok(c)) => spawn(&mut set, c),
            Ok(Err(e)) => refused.push(e.to_string()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    warn_fewer(&refused);
    let mut sessions = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(c) = r {
            sessions.push(c);
        }
    }
    let mut st = std::mem::take(&mut *lock(&sh));
    if let Some(e) = st.failed.take() {
        for c in sessions {
            c.quit().await;
        }
        return Err(e);
    }
    if sessions.is_empty() {
        return Err(ClientError::Closed);
    }
    Ok(Walked {
        sessions,
        jobs: st.jobs,
        dirs: st.ndirs,
        other: st.other,
        partials: st.partials,
        unlisted: st.unlisted,
        dir_facts: st.dir_facts,
        refused: st.refused,
    })
}

/// The files a batch has out, and what became of them. Shared by the
/// batch's two callbacks; Mutexes only because the future must be Send
/// (they are never contended).
struct Books<K> {
    out: Mutex<std::collections::HashMap<K, Job>>,
    rep: Mutex<TreeReport>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K: std::hash::Hash + Eq> Books<K> {
    fn new() -> Self {
        Books {
            out: Mutex::new(std::collections::HashMap::new()),
            rep: Mutex::new(TreeReport::default()),
        }
    }

    /// `job` goes out as the batch item known by `key`.
    fn lend(&self, key: K, job: Job) {
        lock(&self.out).insert(key, job);
    }

    /// The item `key` ended with `r`; `kept` runs for a success.
    fn settle(&self, key: &K, r: Result<crate::TransferReport>, kept: impl FnOnce(&Job)) {
        let Some(job) = lock(&self.out).remove(key) else {
            return;
        };
        let mut rep = lock(&self.rep);
        match r {
            Ok(t) => {
                rep.files += 1;
                rep.bytes += t.bytes;
                kept(&job);
            }
            Err(e) => rep.fail(job.rel, &e),
        }
    }

    /// The batch is over: its counts go to `w`. `Ok`: the queue is empty.
    /// `Err`: the session broke; the files it had not finished (`left`,
    /// known by `key`) go back to the queue for a new session.
    fn close<T>(
        self,
        w: &mut Worker,
        q: &Queues,
        r: std::result::Result<(), (ClientError, Vec<T>)>,
        key: impl Fn(&T) -> K,
    ) -> bool {
        w.rep.merge(vec![self
            .rep
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())]);
        match r {
            Ok(()) => true,
            Err((e, left)) => {
                tracing::warn!("a session broke ({e}); reopening");
                let mut out = self.out.into_inner().unwrap_or_else(|p| p.into_inner());
                for it in left {
                    if let Some(job) = out.remove(&key(&it)) {
                        q.put_back(job);
                    }
                }
                w.client = None;
                false
            }
        }
    }
}

/// Download small files over `w`'s session pipelined
/// ([`Client::download_batch`]) until the queue is empty, reopening the
/// session if it breaks; returns at once when the server cannot (no
/// `CACHE`) or the options need a per-file exchange.
async fn get_batched(w: &mut Worker, q: &Queues, remote: &str, local: &Path, opt: &TreeOptions) {
    while let Some(c) = w.batch_session().await {
        let books = Books::new();
        let next = || loop {
            let job = q.pop(Role::Small)?;
            let target = local_path(local, &job.rel);
            if opt.skip_complete && complete_locally(&target, &job) {
                lock(&books.rep).skipped += 1;
                continue;
            }
            let item = BatchItem {
                remote: join(remote, &job.rel),
                local: target.clone(),
                size: job.listed,
            };
            books.lend(target, job);
            return Some(item);
        };
        let done = |item: BatchItem, r: Result<crate::TransferReport>| {
            books.settle(&item.local, r, |job| {
                if opt.preserve {
                    keep_facts(&item.local, job);
                }
            });
        };
        let r = c.download_batch(next, done).await;
        if books.close(w, q, r, |it: &BatchItem| it.local.clone()) {
            return;
        }
    }
}

/// Upload small files over `w`'s session pipelined
/// ([`Client::upload_batch`]), as [`get_batched`] downloads them.
async fn put_batched(w: &mut Worker, q: &Queues, remote: &str, local: &Path, opt: &TreeOptions) {
    while let Some(c) = w.batch_session().await {
        let books = Books::new();
        let stop = c.interrupt();
        let next = || {
            if stop.as_ref().is_some_and(|s| s.is_cancelled()) {
                return None;
            }
            let job = q.pop(Role::Small)?;
            let item = UploadItem {
                local: local_path(local, &job.rel),
                remote: join(remote, &job.rel),
                mtime: job.mtime.filter(|_| opt.preserve),
                mode: job.mode.filter(|_| opt.preserve),
            };
            books.lend(item.remote.clone(), job);
            Some(item)
        };
        let done = |item: UploadItem, r: Result<crate::TransferReport>| {
            books.settle(&item.remote, r, |_| {});
        };
        let r = c.upload_batch(next, done).await;
        if books.close(w, q, r, |it: &UploadItem| it.remote.clone()) {
            return;
        }
    }
}

/// `.NAME.xftp-part` or `.NAME.xftp-part.ranges`: a cut resumable
/// transfer's data or its record (of `-c`, or `xftp serve`'s SITE
/// RESUMABLE), not a file of the tree. Copied, it would land where the
/// copy's own `-c` keeps `NAME`'s partial and record, and be removed
/// when `NAME` completes.
fn is_resume_file(name: &str) -> bool {
    // `.` + a NAME of one byte at least + the suffix.
    let named = |suffix: &str| name.len() > suffix.len() + 1 && name.ends_with(suffix);
    name.starts_with('.') && (named(".xftp-part") || named(".xftp-part.ranges"))
}

/// Upload the tree under `local` (a directory) to `remote` (created).
pub async fn put_tree(
    connect: Connect,
    local: &Path,
    remote: &str,
    opt: &TreeOptions,
) -> Result<TreeReport> {
    let start = Instant::now();
    let mut report = TreeReport::default();
    let mut dirs = Vec::new();
    // Each directory's time and mode, the top's first: set on the server
    // once its files are in (each file written changes its directory's
    // time), deepest first.
    let mut dir_facts = Vec::new();
    let mut jobs = Vec::new();
    let mut pending = VecDeque::from([String::new()]);
    if let Ok(md) = std::fs::metadata(local) {
        use std::os::unix::fs::PermissionsExt;
        dir_facts.push((
            String::new(),
            mtime_ms(&md),
            Some(md.permissions().mode() & 0o777),
        ));
    }
    while let Some(d) = pending.pop_front() {
        let p = if d.is_empty() {
            local.to_owned()
        } else {
            local_path(local, &d)
        };
        let read = std::fs::read_dir(&p).and_then(|r| r.collect::<std::io::Result<Vec<_>>>());
        let mut names = match read {
            Ok(names) => names,
            Err(e) if d.is_empty() => return Err(local_err(&p, e)),
            // One subdirectory this user cannot read does not stop the
            // rest of the tree; it is named in the report's failures.
            Err(e) => {
                report
                    .failed
                    .push((format!("{d}/"), format!("cannot read it here: {e}")));
                continue;
            }
        };
        names.sort_by_key(|e| e.file_name());
        for e in names {
            // Not UTF-8: kept as its bytes (xftp_proto::name).
            let name = xftp_proto::name::from_os(&e.file_name());
            let rel = if d.is_empty() {
                name
            } else {
                format!("{d}/{name}")
            };
            // No FTP command can carry a line break: one file's name must
            // not break the session that would send it (and every next
            // one), nor the report's lines.
            if rel.contains(['\r', '\n']) {
                report.failed.push((
                    rel.replace('\r', "\\r").replace('\n', "\\n"),
                    "its name holds a line break (CR or LF), which no FTP command can carry — rename it".into(),
                ));
                continue;
            }
            // Not followed: a link may point anywhere (a loop, outside).
            let md = match std::fs::symlink_metadata(e.path()) {
                Ok(md) => md,
                Err(err) => {
                    report
                        .failed
                        .push((rel, format!("cannot read it here: {err}")));
                    continue;
                }
            };
            if md.is_dir() {
                use std::os::unix::fs::PermissionsExt;
                dir_facts.push((
                    rel.clone(),
                    mtime_ms(&md),
                    Some(md.permissions().mode() & 0o777),
                ));
                dirs.push(rel.clone());
                pending.push_back(rel);
            } else if md.is_file() && is_resume_file(rel.rsplit('/').next().unwrap_or(&rel)) {
                tracing::info!("{rel}: a resumable transfer's partial or record; left out");
                report.partials += 1;
            } else if md.is_file() {
                use std::os::unix::fs::PermissionsExt;
                jobs.push(Job {
                    rel,
                    size: md.len(),
                    listed: Some(md.len()),
                    mtime: mtime_ms(&md),
                    mode: Some(md.permissions().mode() & 0o777),
                });
            } else {
                report.other += 1;
            }
        }
    }
    let mut first = connect(Role::Small).await?;
    first.check_verify().await?;
    // Parents before children (breadth-first order above); a directory
    // that exists already is refused and that is fine.
    // The login directory itself (an empty path) is there already.
    let top = remote.trim_end_matches('/').to_owned();
    let mut mkd: Vec<String> = Some(top.clone())
        .filter(|t| !t.is_empty())
        .into_iter()
        .collect();
    mkd.extend(dirs.iter().map(|d| join(remote, d)));
    let made = first.mkd_all(&mkd).await?;
    let (top_new, subdirs) = if top.is_empty() {
        (false, &made[..])
    } else {
        if let Made::Refused(code, text) = &made[0] {
            // Nowhere to put anything.
            return Err(ClientError::Reply {
                command: format!("MKD {top}"),
                code: *code,
                text: format!("{text} (and no such directory)"),
            });
        }
        (made[0] == Made::New, &made[1..])
    };
    // Directories made just now hold nothing: only those there before are
    // listed for what is complete in them.
    let mut existed = HashSet::new();
    if !top_new {
        existed.insert(String::new());
    }
    for (d, m) in dirs.iter().zip(subdirs) {
        match m {
            Made::New => report.dirs += 1,
            Made::There => {
                report.dirs += 1;
                existed.insert(d.clone());
            }
            Made::Refused(code, text) => report.failed.push((
                format!("{d}/"),
                format!("MKD refused: {code} {text} (and no such directory)"),
            )),
        }
    }
    let jobs = only(opt, jobs, &mut report);
    let mut ready = vec![first];
    let jobs = if opt.skip_complete {
        // Only the directories that hold files to send, in the order
        // walked (parents first).
        let holding: HashSet<&str> = jobs.iter().map(|j| parent(&j.rel)).collect();
        let here = if top.is_empty() { "." } else { top.as_str() };
        let listed: Vec<(String, String)> = std::iter::once(String::new())
            .chain(dirs.iter().cloned())
            .filter(|d| existed.contains(d) && holding.contains(d.as_str()))
            .map(|d| {
                let path = if d.is_empty() {
                    here.to_owned()
                } else {
                    join(remote, &d)
                };
                (d, path)
            })
            .collect();
        let (there, sessions) = remote_files(ready, &connect, listed, opt.concurrency).await?;
        ready = sessions;
        let before = jobs.len();
        let jobs: Vec<Job> = jobs
            .into_iter()
            .filter(|j| {
                // The server's time to its own precision (milliseconds
                // from an xftp server, which took them by MFMT).
                let same = there.get(&j.rel).is_some_and(|&(size, mtime)| {
                    size == j.size
                        && matches!((j.mtime, mtime), (Some(l), Some(r)) if xftp_proto::facts::same_time(l, r))
                });
                !same
            })
            .collect();
        report.skipped += before - jobs.len();
        jobs
    } else {
        jobs
    };
    announce(opt, &jobs);
    let dir_facts: Vec<_> = dir_facts
        .into_iter()
        .rev()
        // The owner keeps full rights, as on a download (a 555 here
        // would refuse the next `put -r -c` into it there).
        .map(|(rel, t, m)| (join(remote, &rel), t, m.map(|m| m | 0o700)))
        // The login directory itself (an upload "into /" of a server
        // whose root it is) is the server's.
        .filter(|(path, _, _)| !path.is_empty())
        .collect();
    let q = Arc::new(Queues::new(jobs, opt.large));
    let remote = remote.to_owned();
    let local = local.to_owned();
    let run = move |c: Client, role: Role, q: Arc<Queues>, connect: Connect, opt: TreeOptions| {
        let (remote, local) = (remote.clone(), local.clone());
        async move {
            let mut w = Worker::new(c, role, connect);
            let (mut mfmt, mut chmod) = (opt.preserve, opt.preserve);
            // As for downloads: large files one at a time, then the small
            // ones pipelined where the server keeps connections.
            let mut role_now = role;
            loop {
                if role_now == Role::Large && !q.has_large() {
                    role_now = Role::Small;
                }
                if role_now == Role::Small {
                    put_batched(&mut w, &q, &remote, &local, &opt).await;
                }
                if w.interrupted() {
                    break;
                }
                let Some(job) = q.pop(role_now) else {
                    break;
                };
                let dst = join(&remote, &job.rel);
                w.reopen().await;
                let Some(c) = w.client.as_mut() else {
                    w.no_session(job.rel);
                    continue;
                };
                let started = Instant::now();
                match c.upload(&local_path(&local, &job.rel), &dst).await {
                    Ok(r) => {
                        w.rep.files += 1;
                        w.rep.bytes += r.bytes;
                        if job.size >= opt.large {
                            w.rep.large.add(started, r.bytes);
                        }
                        // A server that refuses once is not asked again.
                        if let (true, Some(t)) = (mfmt, job.mtime) {
                            mfmt = c.mfmt(&dst, t).await.unwrap_or(false);
                        }
                        if let (true, Some(m)) = (chmod, job.mode) {
                            chmod = c.chmod(&dst, m).await.unwrap_or(false);
                        }
                    }
                    Err(e) => w.failed(job.rel, e),
                }
            }
            w.end().await
        }
    };
    let reports = spread(ready, connect.clone(), q, opt, run).await;
    report.merge(reports);
    // The directories' times and modes last, deepest first, pipelined:
    // best effort, as for the files (a server without MFMT keeps its own).
    if opt.preserve && !dir_facts.is_empty() {
        match connect(Role::Small).await {
            Ok(mut c) => {
                if let Err(e) = c.set_facts_all(&dir_facts).await {
                    tracing::warn!("directory times and modes not set: {e}");
                }
                c.quit().await;
            }
            Err(e) => tracing::warn!("directory times and modes not set: {e}"),
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Large-file sessions for `large` files among `total` sessions: half of
/// them, at most 4 (each stripes over up to `max_streams` connections),
/// at least one, never more than there are large files. One at a time
/// left the link idle through each file's setup and slow start: on a
/// 500 ms, 100 Mbit/s emulated path 10 files of 16 MiB took 59 s, 38 s
/// two at a time, 31 s four at a time (docs/benchmarks.md).
fn large_sessions(large: usize, total: usize) -> usize {
    if large == 0 {
        return 0;
    }
    (total / 2).clamp(1, 4).min(large)
}

/// Open `k` sessions for `role` at once (each costs a login); one that
/// fails is a warning, and the others take its files.
async fn open_sessions(connect: &Connect, role: Role, k: usize) -> Vec<Client> {
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..k {
        let c = connect.clone();
        opening.spawn(async move { c(role).await });
    }
    let (mut out, mut refused) = (Vec::new(), Vec::new());
    while let Some(r) = opening.join_next().await {
        match r {
            Ok(Ok(c)) => out.push(c),
            Ok(Err(e)) => refused.push(e.to_string()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    warn_fewer(&refused);
    out
}

/// One warning for the sessions that could not be opened (a server's
/// per-address limit refuses them all alike), not one each.
fn warn_fewer(refused: &[String]) {
    match refused {
        [] => {}
        [e] => tracing::warn!("one session fewer: {e}"),
        [e, ..] if refused.iter().all(|r| r == e) => {
            tracing::warn!("{} sessions fewer: {e}", refused.len())
        }
        [e, ..] => tracing::warn!(
            "{} sessions fewer: {e} (and {} other errors)",
            refused.len(),
            refused.len() - 1
        ),
    }
}

/// Run the workers: the large-file sessions if there are large files
/// ([`large_sessions`]), `first` as a small-file session, and small-file
/// sessions up to `concurrency`.
async fn spread<F, Fut>(
    ready: Vec<Client>,
    connect: Connect,
    q: Arc<Queues>,
    opt: &TreeOptions,
    run: F,
) -> Vec<TreeReport>
where
    F: Fn(Client, Role, Arc<Queues>, Connect, TreeOptions) -> Fut,
    Fut: Future<Output = TreeReport> + Send + 'static,
{
    // No more sessions than files.
    let total = opt.concurrency.min(q.len()).max(1);
    let mut set = tokio::task::JoinSet::new();
    let mut sessions = 0;
    // Several large files at a time where there are several.
    let striped = large_sessions(q.large_count(), total);
    for c in open_sessions(&connect, Role::Large, striped).await {
        set.spawn(run(c, Role::Large, q.clone(), connect.clone(), opt.clone()));
        sessions += 1;
    }
    let large_taken = sessions > 0;
    for (i, c) in ready.into_iter().enumerate() {
        if i > 0 && sessions >= total {
            // More sessions than files left: not needed.
            c.quit().await;
            continue;
        }
        let role = if i == 0 && !large_taken {
            Role::Large
        } else {
            Role::Small
        };
        set.spawn(run(c, role, q.clone(), connect.clone(), opt.clone()));
        sessions += 1;
    }
    // More small-file sessions.
    for c in open_sessions(&connect, Role::Small, total.saturating_sub(sessions)).await {
        set.spawn(run(c, Role::Small, q.clone(), connect.clone(), opt.clone()));
        sessions += 1;
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(rep) = r {
            out.push(rep);
        }
    }
    if let Some(first) = out.first_mut() {
        first.sessions = sessions;
    }
    out
}

struct Worker {
    client: Option<Client>,
    role: Role,
    connect: Connect,
    rep: TreeReport,
    /// Why the last reopening failed, and whether that may pass.
    reopen_failed: Option<(String, bool)>,
    /// The user's interrupt: no file is begun after it.
    stop: Option<tokio_util::sync::CancellationToken>,
}

impl Worker {
    fn new(c: Client, role: Role, connect: Connect) -> Worker {
        Worker {
            stop: c.interrupt(),
            client: Some(c),
            role,
            connect,
            rep: TreeReport::default(),
            reopen_failed: None,
        }
    }

    /// The session, reopened if it broke, when it can move a batch
    /// (the server keeps connections and nothing needs a per-file
    /// exchange); `None` otherwise.
    fn interrupted(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| s.is_cancelled())
    }

    async fn batch_session(&mut self) -> Option<&mut Client> {
        self.reopen().await;
        let c = self.client.as_mut()?;
        if c.batch_capable().await.unwrap_or(false) {
            Some(c)
        } else {
            None
        }
    }

    /// Open the session again if the last one broke.
    async fn reopen(&mut self) {
        if self.client.is_none() {
            match (self.connect)(self.role).await {
                Ok(c) => {
                    self.client = Some(c);
                    self.reopen_failed = None;
                }
                Err(e) => {
                    // Once per worker: each file it cannot move says why
                    // in the tree's report anyway.
                    if self.reopen_failed.is_none() {
                        tracing::warn!("cannot reopen a session: {e}");
                    } else {
                        tracing::debug!("cannot reopen a session: {e}");
                    }
                    self.reopen_failed = Some((e.to_string(), e.is_transient()));
                }
            }
        }
    }

    /// `rel` could not be moved: no session could be opened for it (a
    /// failure that may pass, unless the reason would not: a TLS
    /// certificate, a refused login).
    fn no_session(&mut self, rel: String) {
        let (why, transient) = match &self.reopen_failed {
            Some((why, t)) => (format!("no session could be opened: {why}"), *t),
            None => ("no session could be opened".to_owned(), true),
        };
        if transient {
            self.rep.may_pass.push(rel.clone());
        }
        self.rep.failed.push((rel, why));
    }

    fn failed(&mut self, rel: String, e: ClientError) {
        if e.session_broken() || self.client.as_ref().is_some_and(|c| !c.in_step()) {
            self.client = None;
        }
        self.rep.fail(rel, &e);
    }

    async fn end(mut self) -> TreeReport {
        if let Some(c) = self.client.take() {
            c.quit().await;
        }
        self.rep
    }
}

impl TreeReport {
    /// `rel` failed with `e`.
    fn fail(&mut self, rel: String, e: &ClientError) {
        if e.is_transient() {
            self.may_pass.push(rel.clone());
        }
        let why = match e {
            // A download's partial of another version: every later -c run
            // fails the same way until it goes, so say how.
            ClientError::SourceChanged { partial, .. } if partial.exists() => {
                format!("{e} — {}", crate::resume::remove_partial_fix(partial))
            }
            e => e.to_string(),
        };
        self.failed.push((rel, why));
    }

    /// Add `later`, a run over the files this one left failed and that
    /// may pass ([`TreeOptions::only`]): those failures are replaced by
    /// what `later` says of them, and the counts add up. What `later`
    /// reports of anything else (a directory refused again) was said
    /// already. A retried file gone from the source by then fails, as
    /// `later` says.
    pub fn then(&mut self, later: TreeReport) {
        let retried: HashSet<String> = std::mem::take(&mut self.may_pass).into_iter().collect();
        self.failed.retain(|(p, _)| !retried.contains(p));
        self.failed.extend(
            later
                .failed
                .into_iter()
                .filter(|(p, _)| retried.contains(p)),
        );
        self.may_pass = later
            .may_pass
            .into_iter()
            .filter(|p| retried.contains(p))
            .collect();
        self.files += later.files;
        self.bytes += later.bytes;
        self.skipped += later.skipped;
        self.failed.sort();
        self.sessions = self.sessions.max(later.sessions);
        self.large.merge(&later.large);
    }

    fn merge(&mut self, parts: Vec<TreeReport>) {
        for p in parts {
            self.files += p.files;
            self.bytes += p.bytes;
            self.skipped += p.skipped;
            self.other += p.other;
            self.partials += p.partials;
            self.unlisted += p.unlisted;
            self.failed.extend(p.failed);
            self.may_pass.extend(p.may_pass);
            self.sessions = self.sessions.max(p.sessions);
            self.large.merge(&p.large);
        }
        self.failed.sort();
        self.may_pass.sort();
    }
}

/// The directory `rel` (relative to a tree's top, `/`-separated) is in:
/// `""` for the top.
fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The files the server holds in `listed` (each a directory relative to
/// the tree's top, and its path on the server), by their paths relative
/// to the top: size and modification time, for an upload that skips the
/// files complete there (`skip_complete`). A directory that cannot be
/// listed (refused, not there) holds nothing complete.
///
/// A listing costs round trips (a data connection, then the reply), so
/// the directories are listed by up to `concurrency` sessions at once:
/// `sessions`, and more opened while there is more than one directory to
/// list. A session that breaks leaves its directory to the others.
/// Returns the sessions still open, for the transfers.
async fn remote_files(
    sessions: Vec<Client>,
    connect: &Connect,
    listed: Vec<(String, String)>,
    concurrency: usize,
) -> Result<(
    std::collections::HashMap<String, (u64, Option<i64>)>,
    Vec<Client>,
)> {
    type Found = Vec<(String, (u64, Option<i64>))>;
    async fn lister(
        mut c: Client,
        todo: Arc<Mutex<VecDeque<(String, String)>>>,
    ) -> (Option<Client>, Found, Option<ClientError>) {
        let mut found = Vec::new();
        loop {
            let Some((d, path)) = lock(&todo).pop_front() else {
                return (Some(c), found, None);
            };
            let entries = match c.entries(&path).await {
                Ok(e) => e,
                Err(e) if e.reply_code().is_some_and(|code| code >= 400) => {
                    tracing::debug!("{path}: not listed ({e}): nothing in it is skipped");
                    continue;
                }
                Err(e) => {
                    // The session is gone; another lists this one.
                    lock(&todo).push_front((d, path));
                    return (None, found, Some(e));
                }
            };
            for e in entries {
                if let (Kind::File, Some(size)) = (e.kind, e.size) {
                    let rel = if d.is_empty() {
                        e.name
                    } else {
                        format!("{d}/{}", e.name)
                    };
                    found.push((rel, (size, e.modify_ms)));
                }
            }
        }
    }
    let extra = concurrency
        .saturating_sub(sessions.len())
        .min(listed.len().saturating_sub(1));
    let todo = Arc::new(Mutex::new(VecDeque::from(listed)));
    let mut set = tokio::task::JoinSet::new();
    for c in sessions {
        set.spawn(lister(c, todo.clone()));
    }
    // (The sessions above list while these log in.)
    for c in open_sessions(connect, Role::Small, extra).await {
        set.spawn(lister(c, todo.clone()));
    }
    let mut out = std::collections::HashMap::new();
    let mut broke = None;
    loop {
        let mut open = Vec::new();
        while let Some(r) = set.join_next().await {
            let Ok((c, found, err)) = r else {
                continue;
            };
            out.extend(found);
            open.extend(c);
            if let Some(e) = err {
                tracing::warn!("a session broke while listing ({e})");
                broke = Some(e);
            }
        }
        let left = !lock(&todo).is_empty();
        if !left && !open.is_empty() {
            return Ok((out, open));
        }
        if open.is_empty() {
            // Every session broke (or none opened at all).
            return Err(broke.unwrap_or(ClientError::Closed));
        }
        // A session broke after the others had finished: they list what
        // it left.
        for c in open {
            set.spawn(lister(c, todo.clone()));
        }
    }
}

/// The files `opt` asks for ([`TreeOptions::only`]); one asked for that
/// the source no longer holds fails in `report` (it is not moved, and it
/// must not leave the report as if it had been).
fn only(opt: &TreeOptions, mut jobs: Vec<Job>, report: &mut TreeReport) -> Vec<Job> {
    if let Some(keep) = &opt.only {
        jobs.retain(|j| keep.contains(&j.rel));
        let found: HashSet<&str> = jobs.iter().map(|j| j.rel.as_str()).collect();
        let mut gone: Vec<&String> = keep
            .iter()
            .filter(|r| !found.contains(r.as_str()))
            .collect();
        gone.sort();
        for rel in gone {
            report.failed.push((
                rel.clone(),
                "gone from the source since the last run: not moved".into(),
            ));
        }
    }
    jobs
}

/// The tree's size, for the progress display.
fn announce(opt: &TreeOptions, jobs: &[Job]) {
    if let Some(p) = &opt.progress {
        let total: u64 = jobs.iter().map(|j| j.size).sum();
        p.set_total(&format!("{} files", jobs.len()), Some(total));
    }
}

fn complete_locally(target: &Path, job: &Job) -> bool {
    match std::fs::metadata(target) {
        Ok(md) => {
            md.is_file()
                && md.len() == job.size
                && matches!((mtime_ms(&md), job.mtime), (Some(l), Some(r)) if xftp_proto::facts::same_time(l, r))
        }
        Err(_) => false,
    }
}

/// The remote file's time and permission bits on the local copy.
fn keep_facts(target: &Path, job: &Job) {
    if let Some(t) = job.mtime {
        let r = std::fs::File::options()
            .write(true)
            .open(target)
            .and_then(|f| f.set_modified(xftp_proto::facts::system_time_ms(t)));
        if let Err(e) = r {
            tracing::warn!(
                "{}: cannot set the modification time: {e}",
                target.display()
            );
        }
    }
    if let Some(m) = job.mode {
        use std::os::unix::fs::PermissionsExt;
        // Permission bits only, and never more than the owner can read.
        let m = (m & 0o777) | 0o400;
        if let Err(e) = std::fs::set_permissions(target, std::fs::Permissions::from_mode(m)) {
            tracing::warn!("{}: cannot set the permissions: {e}", target.display());
        }
    }
}

#[cfg(test)]
mod then_tests {
    use super::{only, Job, TreeOptions, TreeReport};
    use std::sync::Arc;

    #[test]
    fn a_later_run_replaces_only_the_failures_it_retried() {
        let mut first = TreeReport {
            files: 3,
            bytes: 300,
            failed: vec![
                ("a".into(), "data connection: reset".into()),
                ("b".into(), "RETR: server replied 550 no".into()),
                ("c".into(), "timed out".into()),
            ],
            may_pass: vec!["a".into(), "c".into()],
            ..Default::default()
        };
        let later = TreeReport {
            files: 1,
            bytes: 50,
            failed: vec![
                ("c".into(), "timed out again".into()),
                // Said by the first run already.
                ("d/".into(), "MKD refused".into()),
            ],
            may_pass: vec!["c".into()],
            ..Default::default()
        };
        first.then(later);
        assert_eq!((first.files, first.bytes), (4, 350));
        assert_eq!(
            first.failed,
            vec![
                ("b".to_string(), "RETR: server replied 550 no".to_string()),
                ("c".to_string(), "timed out again".to_string()),
            ]
        );
        assert_eq!(first.may_pass, vec!["c".to_string()]);
    }

    #[test]
    fn a_retried_file_gone_from_the_source_fails() {
        let job = |rel: &str| Job {
            rel: rel.into(),
            size: 1,
            listed: Some(1),
            mtime: None,
            mode: None,
        };
        let opt = TreeOptions {
            only: Some(Arc::new(
                ["a", "gone"].iter().map(|s| s.to_string()).collect(),
            )),
            ..TreeOptions::default()
        };
        let mut later = TreeReport::default();
        let jobs = only(&opt, vec![job("a"), job("b")], &mut later);
        assert_eq!(
            jobs.iter().map(|j| j.rel.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(later.failed.len(), 1);
        assert_eq!(later.failed[0].0, "gone");
        assert!(later.may_pass.is_empty());
        // And it stays failed in the tree's report.
        let mut first = TreeReport {
            failed: vec![
                ("a".into(), "reset".into()),
                ("gone".into(), "reset".into()),
            ],
            may_pass: vec!["a".into(), "gone".into()],
            ..Default::default()
        };
        first.then(later);
        assert_eq!(first.failed.len(), 1);
        assert!(
            first.failed[0].1.contains("gone from the source"),
            "{:?}",
            first.failed
        );
    }
}

#[cfg(test)]
mod large_session_tests {
    use super::large_sessions;

    #[test]
    fn large_files_move_several_at_a_time_within_the_concurrency() {
        assert_eq!(large_sessions(0, 8), 0);
        assert_eq!(large_sessions(1, 8), 1);
        assert_eq!(large_sessions(10, 8), 4);
        assert_eq!(large_sessions(3, 8), 3);
        assert_eq!(large_sessions(10, 16), 4);
        assert_eq!(large_sessions(10, 3), 1);
        assert_eq!(large_sessions(10, 1), 1);
    }
}
