//! A control connection the server never accepted: the handshake's last
//! segment (client to server) is turned into a reset on the way by the
//! link emulator, so the server drops the half-open connection while the
//! client, connected, waits for a greeting that cannot come. The
//! client's TCP keepalive probe, 2 s later, is answered with a reset,
//! and the command fails then, not at its reply timeout.
//!
//! Needs root and /dev/net/tun (namespaces); without them the test says
//! why and passes, unless XFTP_REQUIRE_PEERS=1 (CI), where it fails.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use xftp_netem::{unique_name, DirectionSpec, Link, LinkSpec, QueueLimit};

#[test]
fn a_handshake_cut_on_the_way_fails_at_the_first_keepalive_probe() {
    if !support::netem_ready("keepalive") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut spec = LinkSpec::symmetric(
        unique_name("ka"),
        DirectionSpec {
            delay: Duration::from_millis(2),
            queue: QueueLimit::Packets(1000),
            ..DirectionSpec::default()
        },
    );
    // The first client-to-server segment after 3 s becomes a reset, and
    // the next one not before 3 s after that.
    let period = Duration::from_secs(3);
    spec.reset_every = Some(period);
    let started = Instant::now();
    let link = Link::start(spec).expect("start link");
    let _server = support::serve_in_b(&link, dir.path(), &["--anonymous-write"]);
    // Nothing has crossed from A to B yet: the handshake's last segment
    // is the first to, and it goes after the reset is due.
    std::thread::sleep((period + Duration::from_millis(300)).saturating_sub(started.elapsed()));
    let t0 = Instant::now();
    let out = link
        .command_a(env!("CARGO_BIN_EXE_xftp"))
        .args(["ls", "--timeout", "30", "ftp://198.18.0.2:2121/"])
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run xftp ls");
    let took = t0.elapsed();
    let counters = link.stop().expect("stop the link");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(counters.a_to_b.resets >= 1, "{counters:?}");
    assert!(!out.status.success(), "{err}");
    assert!(
        !err.contains("greeting"),
        "waited for the greeting instead of probing: {err}"
    );
    assert!(
        took < Duration::from_secs(10),
        "failed after {took:?}, not at the first probe: {err}"
    );
}
