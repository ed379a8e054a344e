//! Accepting groups of connections.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use xftp_tls::Stream;

use crate::handshake::{self, Hello, Reply, SessionId, Status};
use crate::{PsockConfig, PsockError, PsockStream};

/// Completed sessions remembered to refuse late connections.
const RECENT: usize = 4096;
/// Complete groups waiting for `accept`.
const BACKLOG: usize = 16;

struct Pending {
    count: u16,
    record_size: u32,
    peer: IpAddr,
    /// `Some(None)`: index claimed, reply being written.
    slots: Vec<Option<Option<Stream>>>,
    /// Distinguishes a group from a later one with the same id.
    generation: u64,
}

#[derive(Default)]
struct Groups {
    pending: HashMap<SessionId, Pending>,
    recent: HashSet<SessionId>,
    recent_order: VecDeque<SessionId>,
    next_generation: u64,
}

impl Groups {
    fn remember(&mut self, id: SessionId) {
        if self.recent.insert(id) {
            self.recent_order.push_back(id);
            if self.recent_order.len() > RECENT {
                if let Some(old) = self.recent_order.pop_front() {
                    self.recent.remove(&old);
                }
            }
        }
    }
}

struct Inner {
    cfg: PsockConfig,
    /// TLS of every connection (one ticket key for the listener).
    tls: Option<xftp_tls::server::SessionTls>,
    groups: Mutex<Groups>,
    ready: mpsc::Sender<PsockStream>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Accepts groups of TCP connections and yields one [`PsockStream`] per
/// complete group.
///
/// Each connection is checked on its own: a malformed, duplicate, late or
/// mismatched connection is refused and closed without touching other
/// connections or groups. A group that is not complete within
/// [`PsockConfig::group_timeout`] is dropped with all its connections.
pub struct PsockListener {
    local: SocketAddr,
    ready: mpsc::Receiver<PsockStream>,
    task: JoinHandle<()>,
    inner: Arc<Inner>,
}

impl PsockListener {
    /// Bind `addr` (port 0 picks a free port) and start accepting.
    pub async fn bind(addr: impl ToSocketAddrs, cfg: PsockConfig) -> std::io::Result<Self> {
        Self::from_listener(TcpListener::bind(addr).await?, cfg)
    }

    /// Accept on an already bound listener.
    pub fn from_listener(l: TcpListener, cfg: PsockConfig) -> std::io::Result<Self> {
        let local = l.local_addr()?;
        let (tx, rx) = mpsc::channel(BACKLOG);
        let tls = match &cfg.tls {
            Some(crate::PsockTls::Server(t)) => Some(t.session(2).map_err(std::io::Error::other)?),
            // A client's TLS config on the listening side: accepting in
            // clear would betray who asked for TLS.
            Some(crate::PsockTls::Client(_)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a client TLS config is for the connecting side; listen with a server certificate (PsockTls::Server)",
                ))
            }
            None => None,
        };
        let inner = Arc::new(Inner {
            tls,
            cfg,
            groups: Mutex::new(Groups::default()),
            ready: tx,
        });
        let task = tokio::spawn(accept_loop(l, inner.clone()));
        Ok(Self {
            local,
            ready: rx,
            task,
            inner,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next complete group.
    pub async fn accept(&mut self) -> Result<PsockStream, PsockError> {
        self.ready.recv().await.ok_or(PsockError::Closed)
    }

    /// Number of incomplete groups held right now.
    pub fn pending_groups(&self) -> usize {
        self.inner.lock().pending.len()
    }
}

impl Drop for PsockListener {
    fn drop(&mut self) {
        self.task.abort();
        self.inner.lock().pending.clear();
    }
}

async fn accept_loop(l: TcpListener, inner: Arc<Inner>) {
    // Failures in a row: said once with what to do, not 20 times a second.
    let mut failing = 0u64;
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                if failing > 0 {
                    tracing::warn!("accepting again, after {failing} failures");
                    failing = 0;
                }
                let inner = inner.clone();
                tokio::spawn(async move {
                    let t = inner.cfg.handshake_timeout;
                    match tokio::time::timeout(t, handshake(s, peer, &inner)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection refused"),
                        Err(_) => tracing::debug!(%peer, "handshake timed out"),
                    }
                });
            }
            Err(e) => {
                // Out of descriptors and the like: keep serving others.
                if failing == 0 {
                    // EMFILE (24 on Linux): no io::ErrorKind of its own.
                    let fix = if e.raw_os_error() == Some(24) {
                        " (out of file descriptors: raise `ulimit -n`, or connect with fewer connections, -p)"
                    } else {
                        ""
                    };
                    tracing::warn!(error = %e, "accept failed{fix}; the group waiting for these connections will time out");
                }
                failing += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn refuse(mut s: Stream, status: Status) -> Result<(), PsockError> {
    let r = Reply {
        status,
        version: handshake::MAX_VERSION,
        record_size: 0,
    };
    let _ = s.write_all(&r.encode()).await;
    let _ = s.flush().await;
    Err(PsockError::Rejected { index: 0, status })
}

async fn handshake(tcp: TcpStream, peer: SocketAddr, inner: &Arc<Inner>) -> Result<(), PsockError> {
    let cfg = &inner.cfg;
    let mut s = match &inner.tls {
        None => Stream::Plain(tcp),
        Some(t) => t
            .accept_data(
                tcp,
                cfg.handshake_timeout,
                xftp_tls::server::Proof::None,
                false,
            )
            .await
            .map_err(|e| PsockError::Tls(e.to_string()))?,
    };
    let mut b = [0u8; handshake::HELLO_LEN];
    s.read_exact(&mut b)
        .await
        .map_err(PsockError::io("reading hello"))?;
    let hello = match Hello::decode(&b) {
        Ok(Some(h)) => h,
        Err(handshake::HelloError::Magic) => {
            // Not our protocol at all: just close.
            return Err(PsockError::Protocol(handshake::HelloError::Magic));
        }
        _ => return refuse(s, Status::Malformed).await,
    };
    let Some(version) = hello.negotiate() else {
        return refuse(s, Status::Version).await;
    };
    if hello.record_size > cfg.max_peer_record() {
        return refuse(s, Status::TooLarge).await;
    }
    let _ = s.tcp().set_nodelay(true);
    crate::keepalive(s.tcp());
    // Claim the slot (no await while the lock is held).
    let claim = claim(inner, &hello, peer.ip());
    let generation = match claim {
        Ok(g) => g,
        Err(status) => return refuse(s, status).await,
    };
    let own = reply_record(cfg, &hello);
    let reply = Reply {
        status: Status::Ok,
        version,
        record_size: own,
    };
    if let Err(e) = async {
        s.write_all(&reply.encode()).await?;
        s.flush().await
    }
    .await
    {
        // The client is gone: its group can never complete.
        inner.lock().pending.remove(&hello.session);
        return Err(PsockError::Io {
            context: "sending reply",
            source: e,
        });
    }
    let complete = {
        let mut g = inner.lock();
        let Some(p) = g
            .pending
            .get_mut(&hello.session)
            .filter(|p| p.generation == generation)
        else {
            // Expired while we were replying.
            return Err(PsockError::Timeout);
        };
        p.slots[hello.index as usize] = Some(Some(s));
        if p.slots.iter().all(|x| matches!(x, Some(Some(_)))) {
            let p = g.pending.remove(&hello.session);
            g.remember(hello.session);
            p
        } else {
            None
        }
    };
    if let Some(p) = complete {
        let conns: Vec<Stream> = p.slots.into_iter().flatten().flatten().collect();
        let stream =
            PsockStream::from_group(conns, hello.session, cfg, own, p.record_size, version);
        if inner.ready.send(stream).await.is_err() {
            return Err(PsockError::Closed);
        }
    }
    Ok(())
}

/// The record size the listener sends with. Chosen automatically, it is
/// no larger than the connector's own records: the connector sized those
/// for its reorder buffer, whose size the listener does not know.
fn reply_record(cfg: &PsockConfig, hello: &Hello) -> u32 {
    let own = cfg.send_record(hello.count);
    match cfg.record_size {
        Some(_) => own,
        // Never 0: `Hello::decode` refuses a zero record size.
        None => own.min(hello.record_size),
    }
}

/// Reserve `hello.index` in its group; the group's generation, or why not.
fn claim(inner: &Arc<Inner>, hello: &Hello, peer: IpAddr) -> Result<u64, Status> {
    let cfg = &inner.cfg;
    let mut g = inner.lock();
    if g.recent.contains(&hello.session) {
        return Err(Status::Late);
    }
    let new_group = !g.pending.contains_key(&hello.session);
    if new_group && g.pending.len() >= cfg.max_pending_groups {
        return Err(Status::Busy);
    }
    let generation = g.next_generation;
    let p = g.pending.entry(hello.session).or_insert_with(|| Pending {
        count: hello.count,
        record_size: hello.record_size,
        peer,
        slots: (0..hello.count).map(|_| None).collect(),
        generation,
    });
    let gen = p.generation;
    let status = if p.count != hello.count || p.record_size != hello.record_size || p.peer != peer {
        Status::Mismatch
    } else if p.slots[hello.index as usize].is_some() {
        Status::Duplicate
    } else {
        p.slots[hello.index as usize] = Some(None);
        Status::Ok
    };
    if new_group {
        g.next_generation += 1;
        spawn_expiry(inner.clone(), hello.session, gen);
    }
    if status == Status::Ok {
        Ok(gen)
    } else {
        Err(status)
    }
}

fn spawn_expiry(inner: Arc<Inner>, id: SessionId, generation: u64) {
    let t = inner.cfg.group_timeout;
    tokio::spawn(async move {
        tokio::time::sleep(t).await;
        let mut g = inner.lock();
        if g.pending
            .get(&id)
            .is_some_and(|p| p.generation == generation)
        {
            // Dropping the group closes its connections.
            g.pending.remove(&id);
            g.remember(id);
            tracing::debug!("incomplete group expired");
        }
    });
}
