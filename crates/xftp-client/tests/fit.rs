//! A transfer asks an xftp server for no more data connections than it
//! has records (`MULT` before its RETR or STOR), and the next transfer of
//! the session goes back to the session's count: passive and active,
//! downloads and uploads, and a grant that cannot come back whole because
//! another session took the connections meanwhile.

use xftp_client::{Client, ClientConfig, DataMode};

mod common;
use common::{pattern, server, server_with};

/// The smallest record either end cuts (xftp_stripe::MIN_RECORD_SIZE).
const MIN_RECORD: usize = 16 * 1024;

async fn session(port: u16, streams: u32, mode: DataMode) -> Client {
    let cfg = ClientConfig {
        streams,
        data_mode: mode,
        ..ClientConfig::default()
    };
    let mut c = Client::connect("127.0.0.1", port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_uses_one_connection_per_record_and_the_next_file_all() {
    let srv = server().await;
    let out = tempfile::tempdir().unwrap();
    // Sizes and the connections each download may use with 8 granted.
    let files: [(usize, usize); 6] = [
        (40_000, 3),
        (0, 1),
        (3_000_000, 8),
        (MIN_RECORD, 1),
        (MIN_RECORD + 1, 2),
        (3_000_000, 8),
    ];
    for (i, (len, _)) in files.iter().enumerate() {
        std::fs::write(
            srv.dir.path().join(format!("f{i}")),
            pattern(*len, i as u8 + 7),
        )
        .unwrap();
    }
    for mode in [DataMode::Passive, DataMode::Active] {
        let mut c = session(srv.port, 8, mode).await;
        assert_eq!(c.streams(), 8);
        for (i, &(len, conns)) in files.iter().enumerate() {
            let dst = out.path().join(format!("{mode:?}-{i}"));
            let r = c.download(&format!("f{i}"), &dst).await.unwrap();
            assert_eq!(r.bytes, len as u64, "{mode:?} f{i}");
            assert_eq!(
                r.per_stream_bytes.len(),
                conns,
                "{mode:?} f{i} ({len} bytes): {:?}",
                r.per_stream_bytes
            );
            assert_eq!(
                std::fs::read(&dst).unwrap(),
                pattern(len, i as u8 + 7),
                "{mode:?} f{i}"
            );
            assert_eq!(c.streams(), 8, "the session's count stays");
        }
        // Uploads: records of 16 KiB at least, as downloads.
        for (i, (len, conns)) in [(MIN_RECORD, 1), (3 * MIN_RECORD + 1, 4), (4_000_000, 8)]
            .into_iter()
            .enumerate()
        {
            let src = out.path().join(format!("up-{mode:?}-{i}"));
            let data = pattern(len, 40 + i as u8);
            std::fs::write(&src, &data).unwrap();
            let name = format!("u-{mode:?}-{i}");
            let r = c.upload(&src, &name).await.unwrap();
            assert_eq!(
                r.per_stream_bytes.len(),
                conns,
                "{mode:?} put of {len} bytes"
            );
            assert_eq!(std::fs::read(srv.dir.path().join(&name)).unwrap(), data);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_given_back_and_taken_by_another_session_are_not_assumed() {
    // Ten connections per address: a session holding 8 that gives 5 back
    // for a small file finds only 3 when another session has taken 7.
    let srv = server_with(|c| c.max_streams_per_ip = 10).await;
    let out = tempfile::tempdir().unwrap();
    std::fs::write(srv.dir.path().join("small"), pattern(40_000, 1)).unwrap();
    std::fs::write(srv.dir.path().join("big"), pattern(3_000_000, 2)).unwrap();
    let mut a = session(srv.port, 8, DataMode::Passive).await;
    let r = a.download("small", &out.path().join("a1")).await.unwrap();
    assert_eq!(r.per_stream_bytes.len(), 3);
    let mut b = session(srv.port, 8, DataMode::Passive).await;
    assert_eq!(b.streams(), 7, "10 per address, 3 held by the other");
    let r = a.download("big", &out.path().join("a2")).await.unwrap();
    assert_eq!(r.per_stream_bytes.len(), 3, "{:?}", r.per_stream_bytes);
    assert_eq!(
        std::fs::read(out.path().join("a2")).unwrap(),
        pattern(3_000_000, 2)
    );
    assert_eq!(a.streams(), 3, "what the server grants now");
    let r = b.download("big", &out.path().join("b1")).await.unwrap();
    assert_eq!(r.per_stream_bytes.len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumable_transfer_of_a_small_file_stays_framed() {
    // `-c` needs records (ranges) on the wire; without MODE E that takes
    // two connections, so a small file is not fitted down to one.
    let srv = server().await;
    let out = tempfile::tempdir().unwrap();
    std::fs::write(srv.dir.path().join("small"), pattern(1000, 3)).unwrap();
    let src = out.path().join("src");
    // One record's worth.
    std::fs::write(&src, pattern(10_000, 4)).unwrap();
    let cfg = ClientConfig {
        streams: 8,
        resume: true,
        ..ClientConfig::default()
    };
    let mut c = Client::connect("127.0.0.1", srv.port, cfg).await.unwrap();
    c.login(None, None).await.unwrap();
    let r = c.upload(&src, "up").await.unwrap();
    assert_eq!(r.per_stream_bytes.len(), 2, "{:?}", r.per_stream_bytes);
    assert_eq!(
        std::fs::read(srv.dir.path().join("up")).unwrap(),
        pattern(10_000, 4)
    );
    let dst = out.path().join("small");
    let r = c.download("small", &dst).await.unwrap();
    assert_eq!(r.per_stream_bytes.len(), 2, "{:?}", r.per_stream_bytes);
    assert_eq!(std::fs::read(&dst).unwrap(), pattern(1000, 3));
}
