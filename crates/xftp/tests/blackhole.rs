//! Data connections that stop for good while the path works: the link
//! emulator blackholes every bulk flow it carried before a moment (as a
//! middlebox that lost their state would, or as a long stall that left
//! them in a retransmission timeout of a minute), while the control
//! connection and connections opened later pass. The download must end
//! complete: `-p auto` adds a connection, either because goodput fell
//! (the epoch the blackhole cuts in two; what happens here) or, where
//! the data stood still for whole epochs, by rule 12's rescue once the
//! server answers again (tested without timing in xftp-tune,
//! `data_that_stays_stalled_after_the_peer_answers_again_...`). The
//! endgame then sends what the dead connections held on the new ones.
//!
//! Needs root and /dev/net/tun (namespaces); without them the test says
//! why and passes, unless XFTP_REQUIRE_PEERS=1 (CI), where it fails.

mod support;

use std::process::Stdio;
use std::time::Duration;

use xftp_netem::{unique_name, DirectionSpec, Link, LinkSpec, QueueLimit};

#[test]
fn a_download_whose_connections_all_die_mid_transfer_completes_on_new_ones() {
    if !support::netem_ready("blackhole") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let data: Vec<u8> = (0..48u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("f"), &data).unwrap();
    let mut spec = LinkSpec::symmetric(
        unique_name("rs"),
        DirectionSpec {
            rate_bps: Some(100_000_000),
            delay: Duration::from_millis(10),
            queue: QueueLimit::Packets(1000),
            ..DirectionSpec::default()
        },
    );
    // The download starts about 0.5 s after the link, and its 48 MiB
    // take 12 s at 4 MiB/s (`--limit-rate`, which keeps the count from
    // growing while the link has room): at 8 s each connection has
    // carried far more than 256 KiB.
    let at = Duration::from_secs(8);
    spec.blackhole = Some((at, Duration::from_secs(600)));
    let link = Link::start(spec).expect("start link");
    let _server = support::serve_in_b(&link, &root, &["--anonymous"]);
    let get = |name: &str| {
        link.command_a(env!("CARGO_BIN_EXE_xftp"))
            .args([
                "get",
                "-v",
                "-p",
                "auto",
                "--limit-rate",
                "4M",
                "--timeout",
                "20",
            ])
            .arg(format!("ftp://198.18.0.2:2121/{name}"))
            .arg(dir.path().join(name))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .stdin(Stdio::null())
            .output()
            .expect("run xftp get")
    };
    let out = get("f");
    let counters = link.stop().expect("stop the link");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(counters.b_to_a.blackholed > 0, "{counters:?}\n{err}");
    assert!(
        std::fs::read(dir.path().join("f")).unwrap() == data,
        "the copy differs"
    );
}
