//! A running emulated link: two network namespaces, one TUN device in each,
//! and one forwarder thread per direction. [`Link`] is a guard: dropping it
//! stops the threads and deletes the namespaces.

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::forward::{Direction, DirectionCounters, LiveCounters};
use crate::model::{DirectionSpec, LinkModel};
use crate::sys::{self, EventFd, Tun};

/// Address of side A inside its namespace.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Address of side B inside its namespace.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// Prefix length of the link's subnet (198.18.0.0/24) on both sides.
pub const PREFIX_LEN: u8 = 24;
/// Longest link name: the namespace and device names append one letter
/// and Linux interface names hold at most 15 bytes.
pub const MAX_NAME_LEN: usize = 13;

/// Everything that can go wrong starting or stopping a link.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetemError {
    /// The link name cannot be used for namespaces and devices.
    #[error(
        "invalid link name {0:?}: use 1 to 13 characters from [A-Za-z0-9_-], not starting with '-'"
    )]
    InvalidName(String),
    /// A setting is out of range.
    #[error("invalid link setting: {0}")]
    InvalidSpec(String),
    /// Creating TUN devices and namespaces needs root (CAP_NET_ADMIN).
    #[error("the link emulator needs root (CAP_NET_ADMIN) for TUN devices and network namespaces")]
    NotRoot,
    /// `/dev/net/tun` is missing.
    #[error("/dev/net/tun is missing: the kernel has no TUN support here")]
    NoTun,
    /// A namespace of that name exists already (maybe left by a crash).
    #[error("network namespace {ns} already exists; if it is a leftover, remove it with `xftp-netem down --name {name}` (or `ip netns del {ns}`)")]
    NamespaceExists {
        /// The namespace that exists.
        ns: String,
        /// The link name that was asked for.
        name: String,
    },
    /// The `ip` program could not be run.
    #[error("cannot run `ip` (iproute2): {0}")]
    IpMissing(#[source] io::Error),
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {stderr}")]
    Ip {
        /// The arguments given to `ip`.
        args: String,
        /// What `ip` printed on stderr.
        stderr: String,
    },
    /// Creating a TUN device failed.
    #[error("cannot create TUN device {name}: {source}")]
    Tun {
        /// The device name.
        name: String,
        /// The error from the kernel.
        #[source]
        source: io::Error,
    },
    /// A forwarder thread could not start or failed while running.
    #[error("forwarder thread: {0}")]
    Forwarder(#[source] io::Error),
}

/// What to build: a name and the settings of both directions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkSpec {
    /// Link name; namespaces are `{name}a` and `{name}b`.
    pub name: String,
    /// Settings from side A to side B.
    pub a_to_b: DirectionSpec,
    /// Settings from side B to side A.
    pub b_to_a: DirectionSpec,
    /// Largest TCP window any connection may advertise across the link
    /// (up to 65535 window scaling is removed; above, the scaled window is
    /// lowered); `None` leaves TCP alone.
    pub max_window: Option<u32>,
    /// MTU of both TUN devices.
    pub mtu: u32,
    /// Seed for loss and bit errors; `None` picks one at random.
    pub seed: Option<u64>,
    /// TCP congestion control for connections started inside both
    /// namespaces (their `net.ipv4.tcp_congestion_control`), e.g. `reno`
    /// or `cubic`; `None` keeps the kernel default (bbr on this machine).
    pub congestion_control: Option<String>,
    /// Deliveries are batched: a packet may leave up to this much before
    /// its due time (see [`crate::DEFAULT_BATCH`]).
    pub batch: Duration,
    /// Run the forwarder threads at real-time round-robin priority 1 (root
    /// only; falls back to nice -10), so that delivery times hold while
    /// other processes load the CPUs. They never spin, so they cannot
    /// starve the machine beyond the packets they carry.
    pub realtime: bool,
    /// Reset one TCP flow this often (fault injection): after each
    /// period, the next established-flow segment from A to B is turned
    /// into a RST, so that connection dies at both ends.
    pub reset_every: Option<Duration>,
    /// Fault injection: from the first duration after the start, for the
    /// second, drop every segment of the TCP flows that carried 256 KiB
    /// or more (in that direction) before it; other flows, and flows
    /// opened later, pass ([`crate::tcpwin::Blackhole`]).
    pub blackhole: Option<(Duration, Duration)>,
}

impl LinkSpec {
    /// The same settings in both directions, MTU 1500, no window cap.
    pub fn symmetric(name: impl Into<String>, dir: DirectionSpec) -> LinkSpec {
        LinkSpec {
            name: name.into(),
            a_to_b: dir.clone(),
            b_to_a: dir,
            max_window: None,
            mtu: 1500,
            seed: None,
            congestion_control: None,
            batch: crate::DEFAULT_BATCH,
            realtime: true,
            reset_every: None,
            blackhole: None,
        }
    }

    fn validate(&self) -> Result<(), NetemError> {
        validate_name(&self.name)?;
        self.a_to_b.validate().map_err(NetemError::InvalidSpec)?;
        self.b_to_a.validate().map_err(NetemError::InvalidSpec)?;
        if !(576..=65535).contains(&self.mtu) {
            return Err(NetemError::InvalidSpec(format!(
                "mtu {} is not in 576..=65535",
                self.mtu
            )));
        }
        if let Some(cc) = &self.congestion_control {
            if cc.is_empty()
                || cc.len() > 15
                || !cc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(NetemError::InvalidSpec(format!(
                    "congestion control {cc:?} is not a kernel module name"
                )));
            }
        }
        if self.batch > Duration::from_millis(10) {
            return Err(NetemError::InvalidSpec(format!(
                "batch window {:?} is over 10 ms",
                self.batch
            )));
        }
        if self.max_window == Some(0) {
            return Err(NetemError::InvalidSpec(
                "max window 0 would stall TCP".into(),
            ));
        }
        Ok(())
    }
}

/// Counters of both directions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkCounters {
    /// From side A to side B.
    pub a_to_b: DirectionCounters,
    /// From side B to side A.
    pub b_to_a: DirectionCounters,
}

/// A running link. Dropping it tears everything down.
#[derive(Debug)]
pub struct Link {
    name: String,
    ns: [String; 2],
    stop: EventFd,
    stop_flag: Arc<AtomicBool>,
    threads: Vec<JoinHandle<io::Result<()>>>,
    counters: [Arc<LiveCounters>; 2],
    tuns: Vec<Tun>,
    namespaces: NamespaceGuard,
}

impl Link {
    /// Checks what starting a link needs: root, `/dev/net/tun` and `ip`.
    /// Tests call this to decide whether to skip.
    pub fn preflight() -> Result<(), NetemError> {
        if !sys::is_root() {
            return Err(NetemError::NotRoot);
        }
        if !Path::new("/dev/net/tun").exists() {
            return Err(NetemError::NoTun);
        }
        ip(&["-V"])?;
        Ok(())
    }

    /// Creates the namespaces and devices and starts forwarding. Refuses
    /// if either namespace exists already.
    pub fn start(spec: LinkSpec) -> Result<Link, NetemError> {
        spec.validate()?;
        Self::preflight()?;
        let ns = [format!("{}a", spec.name), format!("{}b", spec.name)];
        for n in &ns {
            if namespace_exists(n) {
                return Err(NetemError::NamespaceExists {
                    ns: n.clone(),
                    name: spec.name.clone(),
                });
            }
        }
        let mut namespaces = NamespaceGuard(Vec::new());
        let mut tuns = Vec::new();
        for (n, addr) in ns.iter().zip([ADDR_A, ADDR_B]) {
            ip(&["netns", "add", n])?;
            namespaces.0.push(n.clone());
            // The device is created here and moved; its descriptor stays
            // valid in the namespace it now lives in.
            let tun = Tun::create(n).map_err(|source| NetemError::Tun {
                name: n.clone(),
                source,
            })?;
            ip(&["link", "set", "dev", n, "netns", n])?;
            ip(&["-n", n, "link", "set", "dev", "lo", "up"])?;
            // No IPv6 link-local address: keeps router solicitations and
            // MLD reports off an otherwise idle link.
            ip(&["-n", n, "link", "set", "dev", n, "addrgenmode", "none"])?;
            let cidr = format!("{addr}/{PREFIX_LEN}");
            ip(&["-n", n, "addr", "add", &cidr, "dev", n])?;
            let mtu = spec.mtu.to_string();
            // A long device ring absorbs bursts while a forwarder thread is busy
            // writing; the emulated queue is the model's, not this one.
            ip(&[
                "-n",
                n,
                "link",
                "set",
                "dev",
                n,
                "mtu",
                &mtu,
                "txqueuelen",
                "10000",
                "up",
            ])?;
            if let Some(cc) = &spec.congestion_control {
                let setting = format!("net.ipv4.tcp_congestion_control={cc}");
                if run("ip", &["netns", "exec", n, "sysctl", "-q", "-w", &setting]).is_err() {
                    // A namespace may only default to what the host lists in
                    // tcp_allowed_congestion_control (e.g. reno bbr); a
                    // route's congctl attribute is not limited that way.
                    let net = format!("{}/{PREFIX_LEN}", network_of(addr, PREFIX_LEN));
                    let src = addr.to_string();
                    ip(&[
                        "-n", n, "route", "replace", &net, "dev", n, "src", &src, "congctl", cc,
                    ])?;
                }
            }
            tuns.push(tun);
        }

        let seed = spec.seed.unwrap_or_else(random_seed);
        let stop = EventFd::new().map_err(NetemError::Forwarder)?;
        let stop_flag = Arc::new(AtomicBool::new(false));
        let counters = [
            Arc::new(LiveCounters::default()),
            Arc::new(LiveCounters::default()),
        ];
        let epoch = Instant::now();
        let buf_size = spec.mtu as usize + 256;
        let mut link = Link {
            name: spec.name.clone(),
            ns,
            stop,
            stop_flag,
            threads: Vec::new(),
            counters,
            tuns,
            namespaces,
        };
        let dirs = [
            (0, 1, spec.a_to_b.clone(), seed, "a>b"),
            (
                1,
                0,
                spec.b_to_a.clone(),
                seed ^ 0x5bd1_e995_3c6e_f372,
                "b>a",
            ),
        ];
        for (i, (from, to, dir, seed, label)) in dirs.into_iter().enumerate() {
            let d = Direction {
                input: link.tuns[from].raw(),
                output: link.tuns[to].raw(),
                stop: link.stop.raw(),
                stop_flag: link.stop_flag.clone(),
                model: LinkModel::new(dir, seed),
                window: spec.max_window.map(crate::tcpwin::WindowClamp::new),
                buf_size,
                realtime: spec.realtime,
                batch: spec.batch,
                counters: link.counters[i].clone(),
                epoch,
                // A to B only: a reset there ends the flow both ways.
                reset_every: spec.reset_every.filter(|_| i == 0),
                next_reset: 0,
                blackhole: spec.blackhole.map(|(from, len)| {
                    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                    crate::tcpwin::Blackhole::new(ns(from), ns(len))
                }),
            };
            let handle = std::thread::Builder::new()
                .name(format!("netem {}{label}", spec.name))
                .spawn(move || d.run())
                .map_err(NetemError::Forwarder)?;
            link.threads.push(handle);
        }
        tracing::info!(name = %link.name, seed, "link up");
        Ok(link)
    }

    /// The link name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Namespace of side A (address [`ADDR_A`]).
    pub fn ns_a(&self) -> &str {
        &self.ns[0]
    }

    /// Namespace of side B (address [`ADDR_B`]).
    pub fn ns_b(&self) -> &str {
        &self.ns[1]
    }

    /// Address of side A.
    pub fn addr_a(&self) -> Ipv4Addr {
        ADDR_A
    }

    /// Address of side B.
    pub fn addr_b(&self) -> Ipv4Addr {
        ADDR_B
    }

    /// A command that runs `program` inside side A's namespace.
    pub fn command_a(&self, program: &str) -> Command {
        netns_command(self.ns_a(), program)
    }

    /// A command that runs `program` inside side B's namespace.
    pub fn command_b(&self, program: &str) -> Command {
        netns_command(self.ns_b(), program)
    }

    /// The counters so far.
    pub fn counters(&self) -> LinkCounters {
        LinkCounters {
            a_to_b: self.counters[0].snapshot(),
            b_to_a: self.counters[1].snapshot(),
        }
    }

    /// Stops forwarding, deletes the namespaces and returns the final
    /// counters; an error if a forwarder thread had failed.
    pub fn stop(mut self) -> Result<LinkCounters, NetemError> {
        let failure = self.shutdown();
        let counters = self.counters();
        match failure {
            Some(e) => Err(e),
            None => Ok(counters),
        }
    }

    /// Stops the threads, closes the devices and deletes the namespaces.
    /// Safe to call twice.
    fn shutdown(&mut self) -> Option<NetemError> {
        self.stop_flag.store(true, Ordering::Relaxed);
        self.stop.signal();
        let mut failure = None;
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(name = %self.name, "forwarder failed: {e}");
                    failure = Some(NetemError::Forwarder(e));
                }
                Err(_) => {
                    failure = Some(NetemError::Forwarder(io::Error::other(
                        "forwarder panicked",
                    )));
                }
            }
        }
        self.tuns.clear();
        self.namespaces.delete_all();
        failure
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Deletes the namespaces created for the namespaces it holds, on drop.
#[derive(Debug)]
struct NamespaceGuard(Vec<String>);

impl NamespaceGuard {
    fn delete_all(&mut self) {
        for n in self.0.drain(..) {
            if let Err(e) = ip(&["netns", "del", &n]) {
                tracing::warn!("cannot delete namespace {n}: {e}");
            }
        }
    }
}

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        self.delete_all();
    }
}

/// Removes the namespaces a link named `name` would use, if they exist
/// (leftovers of a killed process). Returns the ones removed.
pub fn remove_leftovers(name: &str) -> Result<Vec<String>, NetemError> {
    validate_name(name)?;
    let mut removed = Vec::new();
    for n in [format!("{name}a"), format!("{name}b")] {
        if namespace_exists(&n) {
            ip(&["netns", "del", &n])?;
            removed.push(n);
        }
    }
    Ok(removed)
}

/// A link name no other link of this process has used, starting with up
/// to four characters of `tag`; handy for tests that run in parallel.
pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let tag: String = tag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(4)
        .collect();
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 1000;
    let pid = std::process::id() % 0x100_0000;
    format!("{tag}{pid:x}{n}")
}

fn validate_name(name: &str) -> Result<(), NetemError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(NetemError::InvalidName(name.to_owned()))
    }
}

fn namespace_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

fn netns_command(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

fn ip(args: &[&str]) -> Result<(), NetemError> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<(), NetemError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(NetemError::IpMissing)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetemError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// A seed for the loss and bit-error draws when none is given.
pub fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is valid for 8 bytes of writes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ u64::from(std::process::id()).rotate_left(32)
    }
}

/// The network address of `addr` with a `/len` prefix.
fn network_of(addr: std::net::Ipv4Addr, len: u8) -> std::net::Ipv4Addr {
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    std::net::Ipv4Addr::from(u32::from(addr) & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_interface_names() {
        assert!(validate_name("xt1").is_ok());
        assert!(validate_name("abcdefghijklm").is_ok());
        assert!(validate_name("abcdefghijklmn").is_err());
        assert!(validate_name("").is_err());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("a b").is_err());
    }

    #[test]
    fn unique_names_are_valid_and_distinct() {
        let a = unique_name("netemtest");
        let b = unique_name("netemtest");
        assert_ne!(a, b);
        assert!(validate_name(&a).is_ok(), "{a}");
    }

    #[test]
    fn spec_validation() {
        let mut s = LinkSpec::symmetric("ok", DirectionSpec::default());
        assert!(s.validate().is_ok());
        s.mtu = 100;
        assert!(s.validate().is_err());
        s.mtu = 1500;
        s.max_window = Some(0);
        assert!(s.validate().is_err());
    }
}
