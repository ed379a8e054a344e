//! Data connections: passive listeners, active connects, the bounce rules
//! of RFC 2577, and opening n connections for a multi-stream transfer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How the next transfer gets its data connections.
#[derive(Debug, Default)]
pub enum DataPlan {
    /// Nothing set up yet: a transfer now gets 425.
    #[default]
    None,
    /// PASV/EPSV: the client connects to this listener.
    Passive(TcpListener),
    /// PORT/EPRT: the server connects to this address (n times).
    Active(SocketAddr),
    /// MPRT: one address per connection.
    Multi(Vec<SocketAddr>),
}

/// Why data connections could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// No PORT/PASV before the transfer.
    #[error("Use PORT, EPRT, MPRT, PASV or EPSV first")]
    NoPlan,
    /// The client did not connect (or the server could not) in time.
    #[error("data connection timed out")]
    Timeout,
    /// MPRT address count differs from the granted stream count.
    #[error("MPRT gave {given} addresses but {needed} connections are in use")]
    Count {
        /// Addresses given.
        given: usize,
        /// Connections granted by MULT.
        needed: usize,
    },
    /// A connect or accept failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// RFC 2577: a data address must be the client's own (no FTP bounce) and
/// not a privileged port. Returns the reason for refusal.
pub fn check_active_addr(addr: SocketAddr, peer: IpAddr) -> Result<(), String> {
    if canonical(addr.ip()) != canonical(peer) {
        return Err(format!(
            "Refusing data connection to {} (not the client's address {}).",
            addr.ip(),
            peer
        ));
    }
    if addr.port() < 1024 {
        return Err(format!(
            "Refusing data connection to privileged port {}.",
            addr.port()
        ));
    }
    Ok(())
}

/// Bind a passive listener on the control connection's local address.
/// Accepted sockets inherit the listener's buffer sizes (and so the
/// window scale their SYN-ACK announces).
/// With `ports`, only a port in that range (inclusive) is used, tried from
/// a random place; a range with no free port is an error that names it.
pub fn passive_listener(
    local: IpAddr,
    bufsize: Option<u64>,
    ports: Option<(u16, u16)>,
) -> std::io::Result<TcpListener> {
    let bind = |port: u16| -> std::io::Result<TcpListener> {
        let sock = match local {
            IpAddr::V4(_) => TcpSocket::new_v4()?,
            IpAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(b) = bufsize {
            xftp_tune::sockbuf::apply_capped(&sock, b)?;
        }
        // The server closes data connections first, so their ports sit in
        // TIME-WAIT for a minute: without this a `--passive-ports` range
        // of ten ports refused the eleventh download within that minute.
        // (Another listener on the port still makes the bind fail.)
        sock.set_reuseaddr(true)?;
        sock.bind(SocketAddr::new(local, port))?;
        sock.listen(256)
    };
    let Some((lo, hi)) = ports else {
        return bind(0);
    };
    let span = u32::from(hi.saturating_sub(lo)) + 1;
    let start = rand::random::<u32>() % span;
    for i in 0..span {
        let port = lo + ((start + i) % span) as u16;
        match bind(port) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free passive port in {lo}-{hi}; try again later"),
    ))
}

/// Open `n` data connections according to `plan` within `timeout`.
/// Passive: accept exactly `n` connections from `peer`, closing any from
/// elsewhere; the listener goes on in the returned `Grow` (connections
/// added during the transfer) and is dropped with it, so connects after
/// the transfer are refused by the kernel.
///
/// With `early` (passive and active), return once the first connection
/// is in and the others have had `early` more to arrive: the caller starts
/// with those and takes the rest as they come ([`Live::join_rest`]:
/// passive, it accepts them; active, the connects still under way come
/// back as [`Pending`] and it adopts them). A lost SYN costs its
/// connection a second (Linux's first retransmission timeout), and the
/// transfer need not wait for it.
///
/// [`Live::join_rest`]: crate::live::Live::join_rest
#[allow(clippy::too_many_arguments)]
pub async fn open(
    plan: DataPlan,
    n: usize,
    peer: IpAddr,
    local: IpAddr,
    timeout: Duration,
    bufsize: Option<u64>,
    early: Option<Duration>,
) -> Result<(Vec<TcpStream>, Option<crate::live::Grow>, Option<Pending>), DataError> {
    use crate::live::Grow;
    let fut = async {
        match plan {
            DataPlan::None => Err(DataError::NoPlan),
            DataPlan::Passive(listener) => {
                let mut conns = Vec::with_capacity(n);
                let mut wait = xftp_stripe::EarlyStart::new(early);
                while conns.len() < n {
                    let Some(s) = wait.next(accept_from_peer(&listener, peer)).await else {
                        break;
                    };
                    conns.push(s?);
                    wait.got_one();
                }
                if conns.len() < n {
                    tracing::debug!(
                        late = n - conns.len(),
                        "starting before every data connection is in"
                    );
                }
                Ok((
                    conns,
                    Some(Grow::Passive(std::sync::Arc::new(listener))),
                    None,
                ))
            }
            DataPlan::Active(addr) => match early {
                Some(e) if n > 1 => {
                    let to = vec![addr; n];
                    let (conns, pending) = connect_early(local, to, bufsize, e, timeout).await?;
                    Ok((conns, Some(Grow::Active(addr)), pending))
                }
                _ => {
                    let to = std::iter::repeat(addr).take(n);
                    Ok((
                        connect_all(local, to, bufsize).await?,
                        Some(Grow::Active(addr)),
                        None,
                    ))
                }
            },
            DataPlan::Multi(addrs) => {
                if addrs.len() != n {
                    return Err(DataError::Count {
                        given: addrs.len(),
                        needed: n,
                    });
                }
                match early {
                    Some(e) if n > 1 => {
                        let (conns, pending) =
                            connect_early(local, addrs, bufsize, e, timeout).await?;
                        Ok((conns, None, pending))
                    }
                    _ => Ok((connect_all(local, addrs, bufsize).await?, None, None)),
                }
            }
        }
    };
    let (conns, grow, pending) = tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| DataError::Timeout)??;
    for c in &conns {
        let _ = c.set_nodelay(true);
    }
    Ok((conns, grow, pending))
}

/// Connects of an active transfer still under way when it started (see
/// [`open`]'s `early`); each ends within the data timeout.
pub type Pending = tokio::task::JoinSet<std::io::Result<TcpStream>>;

/// [`connect_all`] to every address of `to` (active mode: one address
/// `n` times; MPRT: one each), returning once the first is open and the
/// others have had `early` more; the rest are [`Pending`]. A refusal
/// before the start fails the transfer, as there.
async fn connect_early(
    local: IpAddr,
    to: Vec<SocketAddr>,
    bufsize: Option<u64>,
    early: Duration,
    timeout: Duration,
) -> std::io::Result<(Vec<TcpStream>, Option<Pending>)> {
    let n = to.len();
    let mut set = Pending::new();
    for to in to {
        set.spawn(async move {
            tokio::time::timeout(timeout, connect_from(local, to, bufsize))
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "data connection timed out",
                    ))
                })
        });
    }
    let mut conns = Vec::with_capacity(n);
    let mut wait = xftp_stripe::EarlyStart::new(Some(early));
    while let Some(Some(r)) = wait.next(set.join_next()).await {
        conns.push(r.map_err(std::io::Error::other)??);
        wait.got_one();
    }
    if !set.is_empty() {
        tracing::debug!(
            late = set.len(),
            "starting before every data connection is open"
        );
    }
    Ok((conns, (!set.is_empty()).then_some(set)))
}

/// The next connection on `l` from `peer` (the control connection's
/// client); any from elsewhere is closed (RFC 2577: no data connection
/// from a third party).
pub(crate) async fn accept_from_peer(l: &TcpListener, peer: IpAddr) -> std::io::Result<TcpStream> {
    loop {
        let (s, from) = l.accept().await?;
        if canonical(from.ip()) == canonical(peer) {
            return Ok(s);
        }
        tracing::warn!(%from, "data connection from a foreign address refused");
    }
}

/// Connect to every address of `to` at once, so that N connections take
/// one round trip, not N (16 connections over a 500 ms path: 0.5 s, not
/// 8); in `to`'s order. The first failure fails them all (and ends the
/// other attempts).
async fn connect_all(
    local: IpAddr,
    to: impl IntoIterator<Item = SocketAddr>,
    bufsize: Option<u64>,
) -> std::io::Result<Vec<TcpStream>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, a) in to.into_iter().enumerate() {
        set.spawn(async move { (i, connect_from(local, a, bufsize).await) });
    }
    let mut conns: Vec<Option<TcpStream>> =
        std::iter::repeat_with(|| None).take(set.len()).collect();
    while let Some(r) = set.join_next().await {
        let (i, c) = r.map_err(std::io::Error::other)?;
        conns[i] = Some(c?);
    }
    Ok(conns.into_iter().flatten().collect())
}

/// Connect to `to` from the control connection's local address, so the
/// data connection leaves through the same interface as the control one.
pub(crate) async fn connect_from(
    local: IpAddr,
    to: SocketAddr,
    bufsize: Option<u64>,
) -> std::io::Result<TcpStream> {
    let sock = match to {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(b) = bufsize {
        xftp_tune::sockbuf::apply_capped(&sock, b)?;
    }
    if local.is_ipv4() == to.is_ipv4() {
        sock.bind(SocketAddr::new(local, 0))?;
    }
    sock.connect(to).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connect_all_keeps_the_order_and_fails_on_any_refusal() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let mut ls = Vec::new();
        for _ in 0..3 {
            ls.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        let to = [addrs[2], addrs[0], addrs[1], addrs[0]];
        let conns = connect_all(local, to, None).await.unwrap();
        let peers: Vec<SocketAddr> = conns.iter().map(|c| c.peer_addr().unwrap()).collect();
        assert_eq!(peers, to);
        // A port no one listens on: the whole set fails.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert!(connect_all(local, [addrs[0], closed, addrs[1]], None)
            .await
            .is_err());
    }

    #[test]
    fn bounce_rules() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(check_active_addr("127.0.0.1:5000".parse().unwrap(), peer).is_ok());
        assert!(check_active_addr("127.0.0.2:5000".parse().unwrap(), peer).is_err());
        assert!(check_active_addr("127.0.0.1:25".parse().unwrap(), peer).is_err());
        // An IPv4-mapped peer address matches its IPv4 form.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(check_active_addr("127.0.0.1:5000".parse().unwrap(), mapped).is_ok());
    }
}
