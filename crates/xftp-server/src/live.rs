//! A framed (MODE E) transfer while it runs: its connections can be
//! metered (STAT), added (MULT n raised: the client opens more passive
//! connections, or the server connects more in active mode) and retired
//! (MULT n lowered while the server sends).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use xftp_tls::Stream;

use crate::secure::DataTls;
use tokio::task::JoinSet;
use xftp_stripe::{RecvControl, SendControl};
use xftp_tune::meter::{MeterSet, Metered};

/// A data connection of a framed transfer.
pub type Conn = Metered<Stream>;

/// Where more connections come from.
#[derive(Debug)]
pub enum Grow {
    /// Passive: the client connects to this listener again.
    Passive(Arc<TcpListener>),
    /// Active: the server connects to this address again.
    Active(SocketAddr),
}

/// The handle to the running engine.
pub enum Ctl {
    /// The server sends (RETR).
    Send(SendControl<Conn>),
    /// The server receives (STOR).
    Recv(RecvControl<Conn>),
}

/// The data connections a transfer started without (see
/// [`Live::join_rest`]).
#[derive(Default)]
pub struct Joining {
    /// Active connects still under way.
    pub connects: Option<crate::data::Pending>,
    /// TLS handshakes still under way.
    pub handshakes: Option<crate::secure::Handshakes>,
    /// Connections whose TLS handshake failed: they will not join.
    pub failed: usize,
}

/// A running framed transfer.
pub struct Live {
    /// Meters of every connection.
    pub meters: MeterSet,
    ctl: Ctl,
    grow: Option<Grow>,
    /// Connection indices in the engine still in use, oldest first.
    active: Arc<std::sync::Mutex<Vec<usize>>>,
    granted: u32,
    max: u32,
    peer: IpAddr,
    local: IpAddr,
    bufsize: Option<u64>,
    timeout: Duration,
    tls: Option<DataTls>,
    tasks: JoinSet<()>,
}

impl Live {
    /// Track a transfer that started with `n` connections (indices 0..n).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        meters: MeterSet,
        ctl: Ctl,
        grow: Option<Grow>,
        n: u32,
        max: u32,
        peer: IpAddr,
        local: IpAddr,
        bufsize: Option<u64>,
        timeout: Duration,
        tls: Option<DataTls>,
    ) -> Live {
        Live {
            meters,
            ctl,
            grow,
            active: Arc::new(std::sync::Mutex::new((0..n as usize).collect())),
            granted: n,
            max,
            peer,
            local,
            bufsize,
            timeout,
            tls,
            tasks: JoinSet::new(),
        }
    }

    /// MODE E without MULT (GridFTP): the sending client opens as many
    /// passive connections as it likes and announces the count in its EOF
    /// block, so keep accepting (from the client's address, up to the
    /// server's maximum) while the upload runs.
    pub fn accept_any(&mut self) {
        let (Some(Grow::Passive(l)), Ctl::Recv(_)) = (&self.grow, &self.ctl) else {
            return;
        };
        let (l, adder) = (l.clone(), self.adder());
        let (peer, room) = (self.peer, self.max.saturating_sub(self.granted) as usize);
        self.tasks.spawn(async move {
            let mut added = 0;
            while added < room {
                let Ok(s) = crate::data::accept_from_peer(&l, peer).await else {
                    return;
                };
                match adder.add(s).await {
                    Added::Yes => added += 1,
                    Added::NotSecured => continue,
                    Added::Over => break,
                }
            }
            // Past the maximum: reset at once. Left in the listen queue, a
            // connection the sender writes on fills its buffers and blocks
            // it there, and the EOF block that would say how many it used
            // (and fail the upload) may be behind it: globus-url-copy -p 16
            // to a server taking 6 waited out the stall timeout.
            let mut refused = 0u32;
            while let Ok(s) = crate::data::accept_from_peer(&l, peer).await {
                let _ = socket2::SockRef::from(&s).set_linger(Some(std::time::Duration::ZERO));
                drop(s);
                refused += 1;
                tracing::info!(refused, "a data connection past the maximum, reset");
            }
        });
    }

    /// Apply `MULT n` during the transfer; returns the reply (code, text).
    pub fn set_streams(&mut self, n: u32) -> (u16, String) {
        let want = n.clamp(1, self.max.max(1));
        if want > self.granted {
            if self.grow.is_none() {
                return (
                    504,
                    "This transfer cannot add connections (MPRT data connections are fixed)."
                        .into(),
                );
            }
            self.spawn_adds(want - self.granted);
        } else if want < self.granted {
            if let Ctl::Send(c) = &self.ctl {
                // The server sends: retire the connections that wait in a
                // timeout, then the newest; each sends its EOD after its
                // current record.
                let fewer = (self.granted - want) as usize;
                let waiting = c.waiting();
                let victims: Vec<usize> = match self.active.lock() {
                    Ok(mut a) => {
                        a.sort_by_key(|i| waiting.contains(i));
                        let keep = a.len().saturating_sub(fewer).max(1);
                        a.split_off(keep)
                    }
                    Err(_) => Vec::new(),
                };
                for v in victims {
                    if let Err(e) = c.retire(v) {
                        tracing::info!("retire {v}: {e}");
                    }
                }
            }
            // The server receives: the client retires its own connections.
        }
        self.granted = want;
        (
            200,
            format!("MULT {want} granted (server maximum {}).", self.max),
        )
    }

    /// The connections a transfer started without (`data::open`'s
    /// `early`, `secure_early`'s): the TLS handshakes still under way, the
    /// active connects still under way, or else those the client is
    /// still opening. `more` counts them all (granted less started).
    pub fn join_rest(&mut self, joining: Joining, more: usize) {
        let mut more = more.saturating_sub(joining.failed);
        if let Some(h) = joining.handshakes {
            more = more.saturating_sub(h.len());
            self.adopt_secured(h);
        }
        match joining.connects {
            Some(p) => self.adopt(p),
            None => self.join_late(more as u32),
        }
    }

    /// Connections whose TLS handshake was still under way at the start:
    /// each joins when it is secured.
    fn adopt_secured(&mut self, mut handshakes: crate::secure::Handshakes) {
        self.granted += handshakes.len() as u32;
        let adder = self.adder();
        self.tasks.spawn(async move {
            while let Some(r) = handshakes.join_next().await {
                match r {
                    Ok((_, Ok(conn))) => {
                        adder.add_secured(conn);
                    }
                    // `DataTls::wrap` has said why.
                    Ok((_, Err(_))) => {}
                    Err(e) => tracing::warn!("a data connection's TLS handshake failed: {e}"),
                }
            }
        });
    }

    /// `more` connections the client was granted and is still opening
    /// (the transfer started without them, `data::open`'s `early`): they
    /// join as they arrive.
    fn join_late(&mut self, more: u32) {
        if more > 0 {
            self.spawn_adds(more);
            self.granted += more;
        }
    }

    /// The connects of an active transfer that started without them
    /// (`data::open`'s `early`): each joins when it is open.
    fn adopt(&mut self, mut pending: crate::data::Pending) {
        self.granted += pending.len() as u32;
        let adder = self.adder();
        self.tasks.spawn(async move {
            while let Some(r) = pending.join_next().await {
                match r.map_err(std::io::Error::other).and_then(|c| c) {
                    Ok(conn) => {
                        adder.add(conn).await;
                    }
                    Err(e) => tracing::warn!("a late data connection failed: {e}"),
                }
            }
        });
    }

    fn adder(&self) -> Adder {
        Adder {
            ctl: match &self.ctl {
                Ctl::Send(c) => Ctl::Send(c.clone()),
                Ctl::Recv(c) => Ctl::Recv(c.clone()),
            },
            meters: self.meters.clone(),
            active: self.active.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Accept (passive) or open (active) `more` connections and add them
    /// to the running transfer as they come.
    fn spawn_adds(&mut self, more: u32) {
        let Some(grow) = &self.grow else {
            return;
        };
        for _ in 0..more {
            let adder = self.adder();
            let (peer, local, bufsize, timeout) =
                (self.peer, self.local, self.bufsize, self.timeout);
            let source = match grow {
                Grow::Passive(l) => Grow::Passive(l.clone()),
                Grow::Active(a) => Grow::Active(*a),
            };
            self.tasks.spawn(async move {
                let conn = tokio::time::timeout(timeout, async {
                    match source {
                        Grow::Passive(l) => crate::data::accept_from_peer(&l, peer).await,
                        Grow::Active(a) => crate::data::connect_from(local, a, bufsize).await,
                    }
                })
                .await;
                let Ok(Ok(conn)) = conn else {
                    tracing::warn!("an added data connection did not arrive");
                    return;
                };
                adder.add(conn).await;
            });
        }
    }
}

/// What adds a connection to the running transfer (TLS, meters, the
/// engine, the list of active connections).
struct Adder {
    ctl: Ctl,
    meters: MeterSet,
    active: Arc<std::sync::Mutex<Vec<usize>>>,
    tls: Option<DataTls>,
}

/// What became of a connection given to [`Adder::add`].
enum Added {
    Yes,
    /// Its TLS handshake failed; the transfer goes on without it.
    NotSecured,
    /// The transfer is over and takes no more.
    Over,
}

impl Adder {
    async fn add(&self, conn: tokio::net::TcpStream) -> Added {
        let _ = conn.set_nodelay(true);
        let Ok(conn) = crate::secure::secure_one(self.tls.as_ref(), conn).await else {
            return Added::NotSecured;
        };
        self.add_secured(conn)
    }

    /// Add a connection whose TLS (if any) is in place.
    fn add_secured(&self, conn: Stream) -> Added {
        let conn = self.meters.wrap(conn).bound_backlog();
        let idx = match &self.ctl {
            Ctl::Send(c) => c.add_connection(conn),
            Ctl::Recv(c) => c.add_connection(conn),
        };
        match idx {
            Ok(i) => {
                if let Ok(mut a) = self.active.lock() {
                    a.push(i);
                }
                Added::Yes
            }
            Err(e) => {
                tracing::info!("connection not added: {e}");
                Added::Over
            }
        }
    }
}
