//! A WAN link emulator for one machine: two network namespaces joined by
//! TUN devices and a user-space forwarder that emulates, per direction, a
//! bottleneck rate, a one-way delay, a drop-tail queue, random loss and
//! bit errors, and can impose a maximum TCP window on every connection
//! crossing it. It needs no kernel netem.
//!
//! ```text
//!  namespace {name}a                                  namespace {name}b
//!  198.18.0.1 ── TUN {name}a ═╗                ╔═ TUN {name}b ── 198.18.0.2
//!                             ║   forwarder    ║
//!                             ╚═> a>b model ═══╝   (one thread per direction)
//!                             ╔══ b>a model <══╗
//! ```
//!
//! The pieces:
//! - [`model`]: the link model without I/O (packet length and time in, a
//!   drop reason or an arrival time out), tested on a virtual clock;
//! - [`tcpwin`]: the TCP window rewrite, a pure function over a packet;
//! - [`Link`]: the running emulator, a guard that tears the namespaces
//!   down when dropped.
//!
//! ```no_run
//! use std::time::Duration;
//! use xftp_netem::{DirectionSpec, Link, LinkSpec, QueueLimit};
//!
//! let dir = DirectionSpec {
//!     rate_bps: Some(100_000_000),
//!     delay: Duration::from_millis(50),
//!     queue: QueueLimit::Packets(1000),
//!     ..DirectionSpec::default()
//! };
//! let mut spec = LinkSpec::symmetric(xftp_netem::unique_name("demo"), dir);
//! spec.max_window = Some(65536);
//! let link = Link::start(spec)?;
//! let status = link.command_a("ping").args(["-c", "1", "198.18.0.2"]).status()?;
//! assert!(status.success());
//! println!("{:?}", link.stop()?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod forward;
mod link;
pub mod model;
mod sys;
pub mod tcpwin;
pub mod units;

pub use forward::{DirectionCounters, DEFAULT_BATCH};
pub use link::{
    random_seed, remove_leftovers, unique_name, Link, LinkCounters, LinkSpec, NetemError, ADDR_A,
    ADDR_B, MAX_NAME_LEN, PREFIX_LEN,
};
pub use model::{DirectionSpec, QueueLimit};
