//! Choosing how many parallel TCP connections a transfer should use.
//!
//! Three pieces, after the seed papers:
//!
//! * [`tcpinfo`]: what the kernel knows about a connection (RTT, window,
//!   retransmissions) via `TCP_INFO` — no root and no ICMP needed.
//! * [`cache`]: parameter collection per destination (MFTP): the RTT,
//!   throughput and stream count of earlier transfers, kept in the user's
//!   cache directory with an expiry, and the initial choice of N
//!   ([`initial_streams`], MFTP's `Tp = k·N·W'/D` turned around).
//! * [`controller`]: dynamic multiplicity control during a transfer
//!   (XFTP's α/β rule, improved): samples in, decisions out, no I/O and no
//!   clock of its own, so it is tested on a simulated path.
//! * [`model`]: that simulated path (a simulation aid, not used by
//!   transfers): per-connection congestion control over a drop-tail
//!   bottleneck, and issue 16's random grid of paths to judge `-p auto`
//!   against fixed counts.

pub mod cache;
pub mod controller;
pub mod meter;
pub mod model;
pub mod sockbuf;
pub mod tcpinfo;

pub use cache::{initial_streams, Cache, PathRecord};
pub use controller::{Controller, Decision, Reason, Sample, TuneConfig};
