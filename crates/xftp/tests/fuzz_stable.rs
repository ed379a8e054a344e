//! Fuzzing on stable Rust, in every test run: each fuzz entry of the
//! libraries (the same functions the cargo-fuzz targets in fuzz/ call)
//! runs for a bounded time on inputs made from the committed seed corpus
//! (fuzz/seeds/TARGET/) by random mutations, and on random bytes.
//!
//! `XFTP_FUZZ_SECS` sets the time per target (default 2), `XFTP_FUZZ_SEED`
//! the random seed (default: from the clock; printed, so a failing run
//! can be repeated). An input that panics is written to
//! `target/fuzz-findings/TARGET-*.bin` and the test fails naming it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Entry = fn(&[u8]);

fn reassembly(d: &[u8]) {
    let _ = xftp_stripe::reasm::fuzz_reassembly(d);
}

const TARGETS: &[(&str, Entry)] = &[
    ("commands", xftp_proto::command::fuzz_commands),
    ("replies", xftp_proto::reply::fuzz_replies),
    ("hostport", xftp_proto::hostport::fuzz_hostport),
    ("blocks", xftp_stripe::block::fuzz_decode),
    ("reassembly", reassembly),
    ("progress", xftp_client::xftp_tune::meter::fuzz_progress),
    ("handshake", xftp_psock::handshake::fuzz_handshake),
];

/// xorshift64*: small, seeded, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Byte strings the parsers care about, spliced into inputs.
const TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b" ",
    b",",
    b"|",
    b"(",
    b")",
    b"-",
    b"0",
    b"255",
    b"65535",
    b"4294967296",
    b"18446744073709551615",
    b"XPSK",
    b"\xff\xff\xff\xff",
    b"\x00",
    b"\x40",
    b"\x08",
    b"\x48",
    b"::1",
    b"127,0,0,1",
    b"USER ",
    b"MULT ",
    b"227 ",
    b"229 ",
    b"213 ",
    b"550-",
    b"|2|",
];

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], mut v: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(6) {
        match rng.below(9) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
            3 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + 1 + rng.below(16)).min(v.len());
                v.drain(a..b);
            }
            4 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = (a + 1 + rng.below(32)).min(v.len());
                let piece = v[a..b].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, piece);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 => v.truncate(rng.below(v.len() + 1)),
            7 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                let at = rng.below(v.len() + 1);
                v.splice(at..at, t.iter().copied());
            }
            _ if v.len() >= 8 => {
                // An integer field set to an edge value.
                let at = rng.below(v.len() - 7);
                let edge: u64 =
                    [0, 1, u64::MAX, u64::MAX - 1, 1 << 63, u32::MAX as u64][rng.below(6)];
                v[at..at + 8].copy_from_slice(&edge.to_be_bytes());
            }
            _ => {}
        }
        if v.len() > 4096 {
            v.truncate(4096);
        }
    }
    v
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

fn load(target: &str) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(corpus_dir(target))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

thread_local!(static IN_ENTRY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });

/// Panics inside an entry are caught and reported; any other panic is
/// shown as usual.
fn quiet_entry_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let h = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_ENTRY.with(|f| f.get()) {
                h(info)
            }
        }));
    });
}

/// Run one entry for `secs`; returns the runs and, if an input panicked,
/// where it was written.
fn fuzz_one(
    name: &str,
    entry: Entry,
    corpus: &[Vec<u8>],
    secs: f64,
    seed: u64,
    findings: &Path,
) -> (u64, Option<String>) {
    quiet_entry_panics();
    let mut rng = Rng(seed | 1);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut runs = 0u64;
    let mut i = 0usize;
    while Instant::now() < deadline {
        let input = if i < corpus.len() {
            corpus[i].clone()
        } else if rng.below(8) == 0 || corpus.is_empty() {
            (0..rng.below(300)).map(|_| rng.next() as u8).collect()
        } else {
            let base = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, corpus, base)
        };
        i += 1;
        runs += 1;
        IN_ENTRY.with(|f| f.set(true));
        let r = catch_unwind(AssertUnwindSafe(|| entry(&input)));
        IN_ENTRY.with(|f| f.set(false));
        if r.is_err() {
            let _ = std::fs::create_dir_all(findings);
            let path = findings.join(format!("{name}-{seed}-{runs}.bin"));
            let _ = std::fs::write(&path, &input);
            return (
                runs,
                Some(format!(
                    "{name}: panicked on {} (seed {seed}, run {runs})",
                    path.display()
                )),
            );
        }
    }
    (runs, None)
}

#[test]
fn every_fuzz_entry_survives_mutated_and_random_input() {
    let secs: f64 = std::env::var("XFTP_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let seed: u64 = std::env::var("XFTP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("fuzz seed {seed} (XFTP_FUZZ_SEED={seed} repeats this run), {secs} s per target");
    let findings = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-findings");
    let mut failures = Vec::new();
    for (t, (name, entry)) in TARGETS.iter().enumerate() {
        let corpus = load(name);
        assert!(
            !corpus.is_empty(),
            "no seed corpus in {}",
            corpus_dir(name).display()
        );
        let s = seed.wrapping_add((t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (runs, failed) = fuzz_one(name, *entry, &corpus, secs, s, &findings);
        println!("{name}: {runs} runs, {} seed inputs", corpus.len());
        failures.extend(failed);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_runner_finds_a_planted_bug() {
    // Panics on any input holding "XP" followed by a zero byte: reached
    // only by mutating the seed, which holds "XP" alone.
    fn planted(d: &[u8]) {
        assert!(!d.windows(3).any(|w| w == b"XP\0"), "planted");
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, failed) = fuzz_one("planted", planted, &[b"XPSK".to_vec()], 10.0, 7, dir.path());
    let msg = failed.expect("the planted bug is found within 10 s");
    let path = msg
        .split(" on ")
        .nth(1)
        .unwrap()
        .split(" (")
        .next()
        .unwrap();
    let input = std::fs::read(path).unwrap();
    assert!(
        input.windows(3).any(|w| w == b"XP\0"),
        "the finding is saved"
    );
}
