//! `STOU` on `xftp serve`: a new name each time (the base, then
//! `base.1`, ...), announced in the 150 reply before the data (RFC 1123),
//! never written through an existing name or link, and the file removed
//! when the upload fails.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

mod support;
use support::{serve, Ctl};

/// STOU `arg` with `data` on a passive connection: the 150 and the final
/// reply.
fn stou(c: &mut Ctl, arg: &str, data: &[u8]) -> (String, String) {
    let port = c.epsv_port();
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let first = c.cmd(&format!("STOU{arg}"));
    if !first.starts_with("150") {
        return (first, String::new());
    }
    conn.write_all(data).unwrap();
    drop(conn);
    (first, c.reply())
}

fn announced(r: &str) -> &str {
    r.trim_end()
        .split("FILE: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no `FILE: name` in {r:?}"))
}

#[test]
fn stou_picks_a_free_name_and_announces_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = &dir.path().join("srv");
    std::fs::create_dir_all(root.join("d")).unwrap();
    // An outside file behind a link where the second name would go.
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, b"keep").unwrap();
    std::os::unix::fs::symlink(&secret, root.join("d/x.1")).unwrap();
    // A directory where the third name would go: taken, too.
    std::fs::create_dir(root.join("d/x.2")).unwrap();
    let srv = serve(root, &[]);
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("TYPE I").starts_with("200"));
    let mut names = Vec::new();
    for (i, arg) in [" d/x", " d/x", "", ""].iter().enumerate() {
        let data = vec![b'a' + i as u8; 1000 + i];
        let (first, end) = stou(&mut c, arg, &data);
        assert!(first.starts_with("150 FILE: "), "{first}");
        assert!(end.starts_with("226"), "{end}");
        let name = announced(&first).to_string();
        assert_eq!(announced(&end), name);
        let got = std::fs::read(root.join(name.trim_start_matches('/'))).unwrap();
        assert_eq!(got, data, "{name}");
        names.push(name);
    }
    // x.1 is a link, x.2 a directory: both skipped, the link's target
    // untouched.
    assert_eq!(names, ["/d/x", "/d/x.3", "/stou", "/stou.1"]);
    assert_eq!(std::fs::read(&secret).unwrap(), b"keep");
    // No REST with STOU; nothing is created.
    assert!(c.cmd("REST 10").starts_with("350"));
    let (first, _) = stou(&mut c, " d/r", b"x");
    assert!(first.starts_with("504"), "{first}");
    assert!(!root.join("d/r").exists());
    // Above the root is the root, as for every path (no escape).
    let (first, end) = stou(&mut c, " ../../x", b"x");
    assert!(
        first.starts_with("150 FILE: /x") && end.starts_with("226"),
        "{first}{end}"
    );
    assert_eq!(std::fs::read(root.join("x")).unwrap(), b"x");
    assert!(!dir.path().join("x").exists());
}

#[test]
fn an_aborted_stou_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let srv = serve(root, &[]);
    let mut c = Ctl::login(srv.port);
    assert!(c.cmd("TYPE I").starts_with("200"));
    let port = c.epsv_port();
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let first = c.cmd("STOU part");
    assert!(first.starts_with("150 FILE: /part"), "{first}");
    conn.write_all(&[7u8; 100_000]).unwrap();
    conn.flush().unwrap();
    // The file exists while the data comes (its name is taken)...
    let t0 = std::time::Instant::now();
    while !root.join("part").exists() {
        assert!(
            t0.elapsed().as_secs() < 10,
            "no file under the announced name"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // ... and is gone once the client aborts.
    let r = c.cmd("ABOR");
    let r = if r.starts_with("426") { c.reply() } else { r };
    assert!(r.starts_with("226") || r.starts_with("225"), "{r}");
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    assert!(!root.join("part").exists(), "an aborted STOU left its file");
    assert!(no_temporaries(root));
}

fn no_temporaries(d: &Path) -> bool {
    std::fs::read_dir(d).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .contains("xftp-part")
    })
}
