//! Validation of the running emulator against real tools: ping for the
//! delay, iperf3 for the rate and for the window cap.
//!
//! Needs root, /dev/net/tun, `ip`, `ping` and `iperf3`. Without them each
//! test prints why and passes, unless XFTP_REQUIRE_PEERS=1 (CI), where it
//! fails. The tests take turns (one lock), so their measurements do not
//! disturb each other.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use xftp_netem::{unique_name, DirectionSpec, Link, LinkSpec, NetemError, QueueLimit};

static TURN: Mutex<()> = Mutex::new(());

/// Whether the environment can run these tests; prints the reason if not
/// and panics instead when XFTP_REQUIRE_PEERS=1.
fn environment_ready(tools: &[&str]) -> bool {
    let mut missing = Vec::new();
    if let Err(e) = Link::preflight() {
        missing.push(e.to_string());
    }
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            missing.push(format!("`{t}` is not installed"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!("skipping link emulator test: {}", missing.join("; "));
    if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
        panic!("{msg} (XFTP_REQUIRE_PEERS=1)");
    }
    eprintln!("{msg}");
    false
}

fn dir(rate_mbit: Option<u64>, delay_ms: u64) -> DirectionSpec {
    DirectionSpec {
        rate_bps: rate_mbit.map(|m| m * 1_000_000),
        delay: Duration::from_millis(delay_ms),
        queue: QueueLimit::Packets(1000),
        ..DirectionSpec::default()
    }
}

/// Kills a child process (ours, by PID) when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a one-shot iperf3 server in side B and waits until it listens.
fn iperf3_server(link: &Link) -> KillOnDrop {
    // A fixed port is safe: the namespace is ours alone.
    let mut child = link
        .command_b("iperf3")
        .args(["-s", "-1", "-p", "5201", "--forceflush"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn iperf3 server");
    let out = child.stdout.take().expect("piped stdout");
    let guard = KillOnDrop(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("listening") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("iperf3 server did not start listening");
    guard
}

/// Runs iperf3 from side A to side B and returns the received rate in
/// bit/s.
fn iperf3(link: &Link, args: &[&str]) -> f64 {
    let _server = iperf3_server(link);
    let out = link
        .command_a("iperf3")
        .args(["-c", "198.18.0.2", "-p", "5201", "-J"])
        .args(args)
        .output()
        .expect("run iperf3 client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "iperf3 failed: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("iperf3 JSON");
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("received rate in iperf3 JSON")
}

/// Per-reply round-trip times in ms from ping's output.
fn ping_times(text: &str) -> Vec<f64> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("time="))
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[test]
fn ping_rtt_is_twice_the_delay() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["ping"]) {
        return;
    }
    // RTTs under 100 ms, where ping prints a decimal.
    for delay_ms in [5u64, 40] {
        let link = Link::start(LinkSpec::symmetric(
            unique_name("ping"),
            dir(Some(100), delay_ms),
        ))
        .expect("start link");
        let out = link
            .command_a("ping")
            .args(["-n", "-c", "20", "-i", "0.02", "198.18.0.2"])
            .output()
            .expect("run ping");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ping failed: {text}");
        let mut times = ping_times(&text);
        assert_eq!(times.len(), 20, "{text}");
        times.sort_by(f64::total_cmp);
        // The lower quartile: replies delayed by other processes hogging
        // the CPU (which only ever adds time) must not decide the test, a
        // shifted emulated delay (which moves every sample) must.
        let median = times[4];
        let want = 2.0 * delay_ms as f64;
        eprintln!("delay {delay_ms} ms: RTT lower quartile {median} ms, all {times:?}");
        assert!(
            (median - want).abs() <= 1.0,
            "RTT {median} ms, want {want} ± 1 ms"
        );
        assert!(
            times[0] >= want - 1.0,
            "an RTT of {} ms is too short",
            times[0]
        );
        let c = link.stop().expect("stop");
        assert_eq!(c.a_to_b.packets, 20);
        assert_eq!(c.b_to_a.packets, 20);
    }
}

#[test]
fn big_window_fills_the_bottleneck() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["iperf3"]) {
        return;
    }
    // 40 Mbit/s, not the hundreds the emulator forwards in release builds
    // (docs/emulator.md): this test binary is a debug build sharing two
    // cores with iperf3 and the rest of the test run, and at 200 Mbit/s it
    // once forwarded only 133. What is checked here is the shaper, so the
    // rate is one the forwarder keeps up with; its speed is the emulator's
    // benchmark. Other load can only slow a run down, never speed it past
    // the rate, so the best of up to three runs is what the shaper can do
    // (one run of many gave 30 of 40, the rest 38-39).
    let rate = 40e6;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let link = Link::start(LinkSpec::symmetric(unique_name("bigw"), dir(Some(40), 10)))
            .expect("start link");
        let got = iperf3(&link, &["-t", "4", "-O", "2"]);
        let c = link.stop().expect("stop");
        eprintln!("big window: {:.1} Mbit/s of 40, counters {c:?}", got / 1e6);
        assert!(
            got <= 1.01 * rate,
            "{:.1} Mbit/s exceeds the emulated rate",
            got / 1e6
        );
        best = best.max(got);
        if best >= 0.85 * rate {
            break;
        }
    }
    assert!(best >= 0.85 * rate, "{:.1} Mbit/s < 85 % of 40", best / 1e6);
}

/// One window-limited stream gets 0.6-1.3 x W/RTT (`model`, bit/s).
fn near_model(one: f64, model: f64) {
    assert!(
        (0.6 * model..=1.3 * model).contains(&one),
        "1 stream: {:.2} Mbit/s, model {:.2}",
        one / 1e6,
        model / 1e6
    );
}

#[test]
fn max_window_limits_each_stream_to_window_over_rtt() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["iperf3"]) {
        return;
    }
    let window = 65536u32;
    let mut spec = LinkSpec::symmetric(unique_name("maxw"), dir(Some(100), 50));
    spec.max_window = Some(window);
    let link = Link::start(spec).expect("start link");
    // Unscaled, the largest window a header can carry is 65535 bytes.
    let model = 65535.0 * 8.0 / 0.100;
    let one = iperf3(&link, &["-t", "4", "-O", "1"]);
    let eight = iperf3(&link, &["-t", "4", "-O", "1", "-P", "8"]);
    let c = link.stop().expect("stop");
    eprintln!(
        "window {window}: 1 stream {:.2} Mbit/s, 8 streams {:.2} Mbit/s, model {:.2} per stream; {c:?}",
        one / 1e6,
        eight / 1e6,
        model / 1e6
    );
    near_model(one, model);
    assert!(eight >= 5.0 * one, "8 streams {eight} vs 1 stream {one}");
    assert!(c.a_to_b.window_rewrites > 0, "no SYN was rewritten");
}

/// Above 64 KiB the cap keeps window scaling and lowers the scaled window:
/// one stream gets about W/RTT, well above the unscaled limit and well
/// below the link.
#[test]
fn max_window_above_64k_keeps_scaling() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["iperf3"]) {
        return;
    }
    let window = 192 * 1024u32;
    let mut spec = LinkSpec::symmetric(unique_name("maxw"), dir(Some(100), 50));
    spec.max_window = Some(window);
    let link = Link::start(spec).expect("start link");
    let model = f64::from(window) * 8.0 / 0.100;
    let one = iperf3(&link, &["-t", "4", "-O", "1"]);
    let c = link.stop().expect("stop");
    eprintln!(
        "window {window}: 1 stream {:.2} Mbit/s, model {:.2}; {c:?}",
        one / 1e6,
        model / 1e6
    );
    near_model(one, model);
    assert!(c.b_to_a.window_rewrites > 0, "no window was lowered");
}

#[test]
fn loss_drops_about_the_asked_fraction() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["ping"]) {
        return;
    }
    let mut spec = LinkSpec::symmetric(unique_name("loss"), dir(None, 0));
    spec.a_to_b.loss = 0.2;
    spec.seed = Some(7);
    let link = Link::start(spec).expect("start link");
    let out = link
        .command_a("ping")
        .args([
            "-n",
            "-q",
            "-c",
            "300",
            "-i",
            "0.002",
            "-W",
            "1",
            "198.18.0.2",
        ])
        .output()
        .expect("run ping");
    let c = link.stop().expect("stop");
    // ping exits non-zero when replies are missing; that is the point.
    assert!(!out.stdout.is_empty());
    let sent = c.a_to_b.packets + c.a_to_b.loss_drops;
    assert_eq!(sent, 300);
    // Binomial(300, 0.2): mean 60, sd ~6.9; 4 sd either side.
    assert!((32..=88).contains(&c.a_to_b.loss_drops), "{c:?}");
    assert_eq!(c.b_to_a.loss_drops, 0);
    assert_eq!(c.b_to_a.packets, c.a_to_b.packets);
}

#[test]
fn names_are_exclusive_and_torn_down() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&[]) {
        return;
    }
    let name = unique_name("excl");
    let link = Link::start(LinkSpec::symmetric(name.clone(), dir(None, 0))).expect("start");
    let ns_a = link.ns_a().to_owned();
    assert!(std::path::Path::new("/run/netns").join(&ns_a).exists());
    match Link::start(LinkSpec::symmetric(name.clone(), dir(None, 0))) {
        Err(NetemError::NamespaceExists { ns, .. }) => assert_eq!(ns, ns_a),
        other => panic!("second link with the same name: {other:?}"),
    }
    drop(link);
    assert!(!std::path::Path::new("/run/netns").join(&ns_a).exists());
    assert_eq!(
        xftp_netem::remove_leftovers(&name).expect("down"),
        Vec::<String>::new()
    );
}

/// Voluntary context switches of this process's threads whose name
/// starts with `prefix` (Linux truncates thread names to 15 bytes).
fn thread_switches(prefix: &str) -> (usize, u64) {
    let mut threads = 0;
    let mut switches = 0;
    let tasks = std::fs::read_dir("/proc/self/task").expect("read /proc/self/task");
    for task in tasks.map_while(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !prefix.starts_with(comm.trim()) && !comm.trim().starts_with(prefix) {
            continue;
        }
        threads += 1;
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (threads, switches)
}

#[test]
fn idle_link_does_not_wake_up() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&[]) {
        return;
    }
    let link = Link::start(LinkSpec::symmetric(unique_name("idle"), dir(Some(100), 50)))
        .expect("start link");
    let prefix = format!("netem {}", link.name());
    std::thread::sleep(Duration::from_millis(200));
    let (threads, before) = thread_switches(&prefix);
    assert_eq!(threads, 2, "forwarder threads named {prefix:?}");
    std::thread::sleep(Duration::from_secs(1));
    let (_, after) = thread_switches(&prefix);
    link.stop().expect("stop");
    // A timer or busy loop would show hundreds of wake-ups per second.
    assert!(
        after - before <= 2,
        "{} wake-ups in 1 s of idleness",
        after - before
    );
}

#[test]
fn congestion_control_is_set_inside_both_namespaces() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&[]) {
        return;
    }
    let mut spec = LinkSpec::symmetric(unique_name("cc"), dir(None, 0));
    spec.congestion_control = Some("reno".into());
    let link = Link::start(spec).expect("start link");
    for mut cmd in [link.command_a("cat"), link.command_b("cat")] {
        let out = cmd
            .arg("/proc/sys/net/ipv4/tcp_congestion_control")
            .output()
            .expect("cat");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "reno");
    }
    link.stop().expect("stop");
}

#[test]
fn reset_every_kills_a_flow_at_both_ends() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    if !environment_ready(&["iperf3"]) {
        return;
    }
    let mut spec = LinkSpec::symmetric(unique_name("rst"), dir(Some(100), 2));
    spec.reset_every = Some(Duration::from_millis(700));
    let link = Link::start(spec).expect("start link");
    let _server = iperf3_server(&link);
    let out = link
        .command_a("iperf3")
        .args(["-c", "198.18.0.2", "-p", "5201", "-t", "4", "-J"])
        .output()
        .expect("run iperf3 client");
    let c = link.stop().expect("stop");
    assert!(c.a_to_b.resets >= 1, "{c:?}");
    assert_eq!(c.b_to_a.resets, 0);
    // The connection died: iperf3 reports an error instead of 4 s of data.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() || text.contains("\"error\""),
        "iperf3 ran through the resets: {text}"
    );
}
