//! TLS (RFC 4217) end to end: `xftp serve --tls required` with xftp's own
//! client in every connection form, and with TLS clients nobody here wrote
//! (curl, lftp, Python's ftplib); `xftp get/put --tls` against pyftpdlib's
//! TLS server; a packet capture that must not contain the file; handshakes
//! that fail with a clear message while the server goes on serving; the
//! certificate reloaded on SIGHUP. Certificates are made here.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::{sha256_file, write_prng_file, PYTHON};

struct Pki {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

/// A self-signed certificate for "localhost" (not a CA: WebPKI takes it
/// as a trust anchor and as the server's own).
fn pki() -> Pki {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    Pki { dir, cert, key }
}

/// `xftp serve` with TLS; `implicit` is the implicit-TLS port, if asked.
struct TlsServer {
    child: Child,
    port: u16,
    implicit: Option<u16>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_tls(root: &Path, pki: &Pki, extra: &[&str]) -> TlsServer {
    let implicit = extra.contains(&"--implicit-listen");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["serve", "--root"])
        .arg(root)
        .args(["--listen", "127.0.0.1:0", "--anonymous-write"])
        .arg("--tls-cert")
        .arg(&pki.cert)
        .arg("--tls-key")
        .arg(&pki.key)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn xftp serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut port_of = |what: &str| -> u16 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.starts_with(what), "{line:?}");
        line.rsplit(':').next().unwrap().parse().unwrap()
    };
    let port = port_of("listening on ");
    let implicit = implicit.then(|| port_of("listening for implicit TLS on "));
    TlsServer {
        child,
        port,
        implicit,
    }
}

fn have(prog: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("{prog} is required (XFTP_REQUIRE_PEERS=1) but not installed");
        }
        eprintln!("SKIP: {prog} not installed (apt-get install {prog})");
    }
    found
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn xftp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn xftp_moves_files_over_tls_in_every_connection_form() {
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 3 * 1024 * 1024 + 13, 7);
    let srv = serve_tls(
        root.path(),
        &pki,
        &["--tls", "required", "--implicit-listen", "127.0.0.1:0"],
    );
    let ca = s(&pki.cert);
    let explicit = format!("ftpes://localhost:{}", srv.port);
    let implicit = format!("ftps://localhost:{}", srv.implicit.unwrap());
    let mut i = 0;
    for base in [&explicit, &implicit] {
        for form in [None, Some("--active"), Some("--mprt")] {
            for n in ["1", "4"] {
                i += 1;
                let got = local.path().join(format!("got{i}"));
                let mut args = vec!["get", "--json", "--cacert", ca, "-p", n];
                args.extend(form);
                let url = format!("{base}/src.bin");
                args.extend([url.as_str(), s(&got)]);
                let out = ok(xftp(&args), &format!("get {args:?}"));
                let v = json(&out);
                assert_eq!(v["tls"], true, "{v}");
                assert_eq!(v["tls_version"], "TLSv1.3", "{v}");
                assert!(
                    v["tls_cipher"].as_str().unwrap().starts_with("TLS13_"),
                    "{v}"
                );
                assert_eq!(v["streams"].as_u64().unwrap(), n.parse::<u64>().unwrap());
                assert_eq!(sha256_file(&got), sha256_file(&src), "get {args:?}");

                let up = format!("{base}/up{i}.bin");
                let mut args = vec!["put", "--json", "--cacert", ca, "-p", n];
                args.extend(form);
                args.extend([s(&src), up.as_str()]);
                let out = ok(xftp(&args), &format!("put {args:?}"));
                assert_eq!(json(&out)["tls"], true);
                let stored = root.path().join(format!("up{i}.bin"));
                assert_eq!(sha256_file(&stored), sha256_file(&src), "put {args:?}");
            }
        }
    }
    // The automatic mode grows and sheds connections mid-transfer: each new
    // one shakes hands and resumes the session too.
    let got = local.path().join("auto");
    let url = format!("{explicit}/src.bin");
    let out = ok(
        xftp(&["get", "--json", "--cacert", ca, "-p", "auto", &url, s(&got)]),
        "get -p auto",
    );
    assert_eq!(json(&out)["tls"], true);
    assert_eq!(sha256_file(&got), sha256_file(&src));
    // A listing over TLS.
    let out = ok(xftp(&["ls", "--cacert", ca, &format!("{explicit}/")]), "ls");
    assert!(String::from_utf8_lossy(&out.stdout).contains("src.bin"));
}

#[test]
fn required_tls_refuses_clear_text_with_reasons() {
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("f"), b"secret").unwrap();
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    // USER before AUTH TLS: 530, and nothing of the login goes through.
    let mut c = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("220"), "{line}");
    c.write_all(b"USER anonymous\r\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("530") && line.contains("AUTH TLS"),
        "{line}"
    );
    c.write_all(b"FEAT\r\n").unwrap();
    let mut feat = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        feat.push_str(&line);
        if line.starts_with("211 ") {
            break;
        }
    }
    assert!(feat.contains("AUTH TLS") && feat.contains("PROT"), "{feat}");
    // xftp's client on ftp:// is told what to use, and writes nothing.
    let local = tempfile::tempdir().unwrap();
    let target = local.path().join("f");
    let out = xftp(&[
        "get",
        &format!("ftp://127.0.0.1:{}/f", srv.port),
        target.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ftpes://"), "{err}");
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
    // So is `xftp probe`.
    let out = xftp(&["probe", &format!("ftp://127.0.0.1:{}/", srv.port)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("use ftpes://"),
        "{err}"
    );
    // PROT C under TLS is refused (534), and a transfer before PROT P gets
    // 521 (Python's ftplib: AUTH TLS, login, no prot_p()).
    if !have("python3") {
        return;
    }
    let script = r#"
import ftplib, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
f = ftplib.FTP_TLS(context=ctx)
f.connect("localhost", int(sys.argv[1]))
f.login()
for cmd in ("PBSZ 0", "PROT C"):
    try:
        print(f.sendcmd(cmd))
    except ftplib.error_perm as e:
        print(e)
try:
    f.retrbinary("RETR f", lambda b: None)
    print("TRANSFERRED")
except ftplib.error_perm as e:
    print(e)
"#;
    let out = ok(
        Command::new(PYTHON)
            .args(["-c", script, &srv.port.to_string(), s(&pki.cert)])
            .output()
            .unwrap(),
        "ftplib PROT C",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("534"), "{text}");
    assert!(text.contains("521"), "{text}");
    assert!(!text.contains("TRANSFERRED"), "{text}");
}

/// curl 7.87 and 7.88 (Debian 12 ships 7.88.1) never start the TLS
/// handshake on an active-mode data connection (curl issue #10666,
/// fixed in 8.0): with any server, the transfer hangs.
fn curl_active_tls_works() -> bool {
    let out = Command::new("curl").arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    let ver = v.split_whitespace().nth(1).unwrap_or("");
    !(ver.starts_with("7.87.") || ver.starts_with("7.88."))
}

#[test]
fn curl_ssl_reqd_gets_puts_and_lists() {
    if !have("curl") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 2 * 1024 * 1024 + 1, 3);
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    let base = format!("ftp://localhost:{}", srv.port);
    let mut modes = vec![("passive", vec![])];
    if curl_active_tls_works() {
        modes.push(("active", vec!["-P", "-"]));
    } else {
        eprintln!("SKIP curl active mode over TLS: this curl never starts TLS on active data connections (curl issue #10666, 7.87-7.88)");
    }
    for (mode, extra) in modes {
        let got = local.path().join(format!("got-{mode}"));
        let mut c = Command::new("curl");
        c.args(["-sS", "--ssl-reqd", "--cacert", s(&pki.cert), "-o", s(&got)])
            .args(&extra)
            .arg(format!("{base}/src.bin"));
        ok(c.output().unwrap(), &format!("curl get {mode}"));
        assert_eq!(sha256_file(&got), sha256_file(&src), "curl get {mode}");
        let mut c = Command::new("curl");
        c.args(["-sS", "--ssl-reqd", "--cacert", s(&pki.cert), "-T", s(&src)])
            .args(&extra)
            .arg(format!("{base}/up-{mode}.bin"));
        ok(c.output().unwrap(), &format!("curl put {mode}"));
        let stored = root.path().join(format!("up-{mode}.bin"));
        assert_eq!(sha256_file(&stored), sha256_file(&src), "curl put {mode}");
        let mut c = Command::new("curl");
        c.args(["-sS", "--ssl-reqd", "--cacert", s(&pki.cert)])
            .args(&extra)
            .arg(format!("{base}/"));
        let out = ok(c.output().unwrap(), &format!("curl list {mode}"));
        assert!(String::from_utf8_lossy(&out.stdout).contains("src.bin"));
    }
    // Without --ssl-reqd curl logs in in clear: refused.
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", &format!("{base}/src.bin")])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn lftp_with_ssl_force_and_protected_data() {
    if !have("lftp") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 1024 * 1024 + 7, 5);
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    for passive in ["on", "off"] {
        let got = local.path().join(format!("got-{passive}"));
        let script = format!(
            "set ssl:ca-file {ca}; set ftp:ssl-force true; set ftp:ssl-protect-data true; \
             set ftp:ssl-allow-anonymous true; \
             set ftp:passive-mode {passive}; set net:max-retries 1; set net:timeout 20; \
             open -p {port} localhost; get src.bin -o {got}; put {src} -o up-{passive}.bin; ls",
            ca = s(&pki.cert),
            port = srv.port,
            got = s(&got),
            src = s(&src),
        );
        let out = ok(
            Command::new("lftp").args(["-c", &script]).output().unwrap(),
            &format!("lftp passive-mode {passive}"),
        );
        assert_eq!(sha256_file(&got), sha256_file(&src), "lftp get {passive}");
        let stored = root.path().join(format!("up-{passive}.bin"));
        assert_eq!(
            sha256_file(&stored),
            sha256_file(&src),
            "lftp put {passive}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("src.bin"));
    }
}

/// ftplib's FTP_TLS does not reuse the control session on data
/// connections; the usual subclass (as for vsftpd's require_ssl_reuse)
/// passes it on.
const FTPLIB: &str = r#"
import ftplib, io, ssl, sys
port, ca, reuse, active = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
class Reuse(ftplib.FTP_TLS):
    def ntransfercmd(self, cmd, rest=None):
        conn, size = ftplib.FTP.ntransfercmd(self, cmd, rest)
        if self._prot_p:
            conn = self.context.wrap_socket(conn, server_hostname=self.host, session=self.sock.session)
        return conn, size
cls = Reuse if reuse else ftplib.FTP_TLS
f = cls(context=ssl.create_default_context(cafile=ca), timeout=20)
f.connect("localhost", port)
f.login()
f.prot_p()
f.set_pasv(not active)
buf = io.BytesIO()
try:
    f.retrbinary("RETR src.bin", buf.write)
except ftplib.all_errors as e:
    print("REFUSED", e)
    sys.exit(0)
sys.stdout.write("GOT %d\n" % len(buf.getvalue()))
f.storbinary("STOR py.bin", io.BytesIO(buf.getvalue()))
print("STORED")
f.quit()
"#;

fn ftplib(port: u16, ca: &Path, reuse: bool, active: bool) -> String {
    ftplib_in(PYTHON, port, ca, reuse, active)
}

fn ftplib_in(python: &str, port: u16, ca: &Path, reuse: bool, active: bool) -> String {
    let out = Command::new(python)
        .args(["-c", FTPLIB, &port.to_string(), s(ca)])
        .arg(if reuse { "1" } else { "0" })
        .arg(if active { "1" } else { "0" })
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A stranger from the client's own address (another process, a user
/// behind the same NAT) connects to the passive port before the client
/// does, then closes, sends garbage or stays silent. The stranger is
/// dropped and the client's own connection carries the file; the
/// stranger's failed handshake used to fail the transfer (522, or after
/// 30 s for a silent one).
#[test]
fn a_stranger_on_the_passive_port_does_not_fail_the_transfer() {
    if !have("python3") {
        return;
    }
    const SCRIPT: &str = r#"
import ftplib, io, socket, ssl, sys
port, ca, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
keep = []
class Stranger(ftplib.FTP_TLS):
    def makepasv(self):
        host, p = ftplib.FTP_TLS.makepasv(self)
        s = socket.create_connection((host, p))
        if mode == "close":
            s.close()
        else:
            if mode == "garbage":
                s.sendall(b"not a TLS hello" * 8)
            keep.append(s)
        return host, p
    def ntransfercmd(self, cmd, rest=None):
        conn, size = ftplib.FTP.ntransfercmd(self, cmd, rest)
        conn = self.context.wrap_socket(conn, server_hostname=self.host, session=self.sock.session)
        return conn, size
f = Stranger(context=ssl.create_default_context(cafile=ca), timeout=20)
f.connect("localhost", port)
f.login()
f.prot_p()
buf = io.BytesIO()
f.retrbinary("RETR src.bin", buf.write)
print("GOT %d" % len(buf.getvalue()))
f.quit()
"#;
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    write_prng_file(&root.path().join("src.bin"), 300_001, 11);
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    for mode in ["close", "garbage", "silent"] {
        let t0 = std::time::Instant::now();
        let out = Command::new(PYTHON)
            .args(["-c", SCRIPT, &srv.port.to_string(), s(&pki.cert), mode])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("GOT 300001"),
            "{mode}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(15), "{mode}");
    }
}

#[test]
fn python_ftplib_prot_p_with_and_without_session_reuse() {
    if !have("python3") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 700_001, 9);
    let strict = serve_tls(root.path(), &pki, &["--tls", "required"]);
    for active in [false, true] {
        let text = ftplib(strict.port, &pki.cert, true, active);
        assert!(
            text.contains("GOT 700001") && text.contains("STORED"),
            "{text}"
        );
        assert_eq!(sha256_file(&root.path().join("py.bin")), sha256_file(&src));
    }
    // Stock FTP_TLS shakes hands afresh on the data connection: it cannot
    // prove it belongs to the session, and is refused (522).
    let text = ftplib(strict.port, &pki.cert, false, false);
    assert!(text.contains("REFUSED") && text.contains("522"), "{text}");
    // A server told to accept fresh handshakes serves it.
    let lax = serve_tls(
        root.path(),
        &pki,
        &["--tls", "required", "--tls-allow-fresh-data"],
    );
    // Its upload ends without an error: ftplib unwraps the data
    // connection after STOR and waits for the server's close_notify
    // (Python 3.11.7's ssl raised SSLEOFError without it, 3.11.2's did
    // not: both, where the one on PATH is another).
    let mut pythons = vec![PYTHON];
    if have("python3") {
        pythons.push("python3");
    }
    for py in pythons {
        std::fs::remove_file(root.path().join("py.bin")).unwrap();
        let text = ftplib_in(py, lax.port, &pki.cert, false, false);
        assert!(
            text.contains("GOT 700001") && text.contains("STORED"),
            "{py}: {text}"
        );
        assert_eq!(sha256_file(&root.path().join("py.bin")), sha256_file(&src));
    }
    // xftp's own client binds its data connections with a token (OPTS TLS
    // BIND): the lax server reads it too, not as the upload's first bytes.
    for n in ["1", "4"] {
        let up = format!("ftpes://localhost:{}/lax{n}.bin", lax.port);
        ok(
            xftp(&["put", "--cacert", s(&pki.cert), "-p", n, s(&src), &up]),
            "put to a lax server",
        );
        assert_eq!(
            sha256_file(&root.path().join(format!("lax{n}.bin"))),
            sha256_file(&src),
            "-p {n}"
        );
    }
}

#[test]
fn xftp_client_against_pyftpdlib_tls() {
    if !support::have_pyftpdlib("xftp_client_against_pyftpdlib_tls") {
        return;
    }
    let has_openssl = Command::new(PYTHON)
        .args(["-c", "import OpenSSL"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_openssl {
        if std::env::var("XFTP_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!(
                "python3-openssl is required (XFTP_REQUIRE_PEERS=1) for pyftpdlib's TLS handler"
            );
        }
        eprintln!("SKIP: python3-openssl missing (pyftpdlib's TLS handler needs it)");
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 1_500_000, 11);
    let script = r#"
import logging, sys
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import TLS_FTPHandler
from pyftpdlib.servers import FTPServer
logging.basicConfig(level=logging.INFO)
# RETR and STOR answered a moment late: pyftpdlib drops a data connection
# whose TLS ClientHello comes before it has read the command, so a client
# that does not wait for the 150 fails here every time, not now and then.
class Slow(TLS_FTPHandler):
    def ftp_RETR(self, file):
        self.ioloop.call_later(0.3, TLS_FTPHandler.ftp_RETR, self, file)
    def ftp_STOR(self, file, mode="w"):
        self.ioloop.call_later(0.3, TLS_FTPHandler.ftp_STOR, self, file, mode)
a = DummyAuthorizer()
a.add_anonymous(sys.argv[1], perm="elradfmw")
h = Slow
h.certfile, h.keyfile, h.authorizer = sys.argv[2], sys.argv[3], a
h.tls_control_required = True
h.tls_data_required = True
FTPServer(("127.0.0.1", 0), h).serve_forever()
"#;
    let mut cmd = Command::new(PYTHON);
    cmd.args(["-c", script, s(root.path()), s(&pki.cert), s(&pki.key)]);
    let py = support::spawn_logging_server(cmd);
    let url = format!("ftp://localhost:{}", py.port);
    let got = local.path().join("got");
    let out = ok(
        xftp(&[
            "get",
            "--tls",
            "--json",
            "--cacert",
            s(&pki.cert),
            "-p",
            "1",
            &format!("{url}/src.bin"),
            s(&got),
        ]),
        "get from pyftpdlib",
    );
    assert_eq!(json(&out)["tls"], true);
    assert_eq!(sha256_file(&got), sha256_file(&src));
    ok(
        xftp(&[
            "put",
            "--tls",
            "--cacert",
            s(&pki.cert),
            "-p",
            "1",
            s(&src),
            &format!("{url}/up.bin"),
        ]),
        "put to pyftpdlib",
    );
    assert_eq!(sha256_file(&root.path().join("up.bin")), sha256_file(&src));
    // ftp:// without --tls against a server that requires TLS: refused, and
    // the message says how.
    let out = xftp(&[
        "get",
        &format!("{url}/src.bin"),
        s(&local.path().join("no")),
    ]);
    assert!(!out.status.success());
    assert!(!local.path().join("no").exists());
}

/// Capture loopback traffic of `f` with tcpdump (root only).
fn capture(dir: &Path, f: impl FnOnce()) -> Option<Vec<u8>> {
    let pcap = dir.join("cap.pcap");
    let mut dump = Command::new("tcpdump")
        .args(["-i", "lo", "-U", "-s", "0", "-w", s(&pcap), "tcp"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    // tcpdump says "listening on lo" once it captures.
    let mut err = BufReader::new(dump.stderr.take()?);
    let mut line = String::new();
    let _ = err.read_line(&mut line);
    f();
    std::thread::sleep(Duration::from_millis(500));
    // SIGTERM flushes the file.
    let _ = Command::new("kill").arg(dump.id().to_string()).status();
    let _ = dump.wait();
    let mut bytes = Vec::new();
    std::fs::File::open(&pcap)
        .ok()?
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_capture_of_a_tls_transfer_holds_none_of_the_file() {
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root_user || !have("tcpdump") {
        eprintln!("SKIP: capturing loopback traffic needs root and tcpdump");
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    const MARKER: &[u8] = b"XFTP-PLAINTEXT-MARKER-4217";
    let mut body = Vec::new();
    while body.len() < 2 << 20 {
        body.extend_from_slice(MARKER);
        body.extend_from_slice(format!(" line {}\n", body.len()).as_bytes());
    }
    std::fs::write(root.path().join("marked.txt"), &body).unwrap();
    let srv = serve_tls(root.path(), &pki, &["--tls", "optional"]);
    let ca = s(&pki.cert);
    let tls_url = format!("ftpes://localhost:{}/marked.txt", srv.port);
    let up_url = format!("ftpes://localhost:{}/up.txt", srv.port);
    let got = local.path().join("got.txt");
    let cap = capture(local.path(), || {
        ok(
            xftp(&["get", "--cacert", ca, "-p", "4", &tls_url, s(&got)]),
            "tls get",
        );
        ok(
            xftp(&["put", "--cacert", ca, "-p", "4", s(&got), &up_url]),
            "tls put",
        );
    })
    .expect("tcpdump capture");
    assert_eq!(std::fs::read(&got).unwrap(), body);
    assert!(
        cap.len() > body.len(),
        "the capture saw the transfer ({} bytes)",
        cap.len()
    );
    assert!(
        !contains(&cap, MARKER),
        "plaintext of the file in a TLS capture"
    );
    // The same capture of a clear transfer does show it: the test can fail.
    let clear_url = format!("ftp://localhost:{}/marked.txt", srv.port);
    let cap = capture(local.path(), || {
        ok(xftp(&["get", "-p", "4", &clear_url, s(&got)]), "clear get");
    })
    .expect("tcpdump capture");
    assert!(
        contains(&cap, MARKER),
        "a clear transfer's capture shows the marker"
    );
}

#[test]
fn failed_handshakes_are_explained_and_the_server_goes_on() {
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("f"), b"content").unwrap();
    let srv = serve_tls(
        root.path(),
        &pki,
        &["--tls", "optional", "--implicit-listen", "127.0.0.1:0"],
    );
    let plain = support::serve(root.path(), &[]);
    let ca = s(&pki.cert);
    let got = local.path().join("g");
    let err_of = |out: Output| -> String {
        assert!(!out.status.success());
        assert!(!got.exists(), "nothing left under the final name");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Not trusted: no --cacert.
    let e = err_of(xftp(&[
        "get",
        &format!("ftpes://localhost:{}/f", srv.port),
        s(&got),
    ]));
    assert!(e.contains("--cacert"), "{e}");
    // The wrong name.
    let e = err_of(xftp(&[
        "get",
        "--cacert",
        ca,
        &format!("ftpes://127.0.0.1:{}/f", srv.port),
        s(&got),
    ]));
    assert!(e.contains("not valid for this host name"), "{e}");
    // TLS to a plain server: explicit (AUTH refused) and implicit.
    let e = err_of(xftp(&[
        "get",
        "--cacert",
        ca,
        &format!("ftpes://localhost:{}/f", plain.port),
        s(&got),
    ]));
    assert!(e.contains("AUTH TLS"), "{e}");
    let e = err_of(xftp(&[
        "get",
        "--cacert",
        ca,
        &format!("ftps://localhost:{}/f", plain.port),
        s(&got),
    ]));
    assert!(e.contains("does not speak TLS"), "{e}");
    // Clear text to the implicit-TLS port: that connection ends, quietly.
    let mut c = TcpStream::connect(("127.0.0.1", srv.implicit.unwrap())).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"USER anonymous\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = c.read(&mut buf).unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).contains("230"));
    // The server still serves, both ports.
    for url in [
        format!("ftpes://localhost:{}/f", srv.port),
        format!("ftps://localhost:{}/f", srv.implicit.unwrap()),
    ] {
        ok(xftp(&["get", "--cacert", ca, &url, s(&got)]), &url);
        assert_eq!(std::fs::read(&got).unwrap(), b"content");
        std::fs::remove_file(&got).unwrap();
    }
}

#[test]
fn sighup_reloads_the_certificate_without_dropping_sessions() {
    if !have("python3") {
        return;
    }
    let a = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = root.path().join("src.bin");
    write_prng_file(&src, 300_000, 1);
    // The server reads the files from a directory of their own.
    let live = pki();
    std::fs::copy(&a.cert, &live.cert).unwrap();
    std::fs::copy(&a.key, &live.key).unwrap();
    let srv = serve_tls(root.path(), &live, &["--tls", "required"]);
    // A session that stays open across the reload (ftplib, reading
    // commands from stdin).
    let script = r#"
import ftplib, io, ssl, sys
port, ca = int(sys.argv[1]), sys.argv[2]
class Reuse(ftplib.FTP_TLS):
    def ntransfercmd(self, cmd, rest=None):
        conn, size = ftplib.FTP.ntransfercmd(self, cmd, rest)
        conn = self.context.wrap_socket(conn, server_hostname=self.host, session=self.sock.session)
        return conn, size
f = Reuse(context=ssl.create_default_context(cafile=ca), timeout=20)
f.connect("localhost", port); f.login(); f.prot_p()
print("READY", flush=True)
sys.stdin.readline()
buf = io.BytesIO(); f.retrbinary("RETR src.bin", buf.write)
print("GOT", len(buf.getvalue()), flush=True)
f.quit()
"#;
    let mut py = Command::new(PYTHON)
        .args(["-c", script, &srv.port.to_string(), s(&a.cert)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY");
    // New certificate, then SIGHUP.
    let b = pki();
    std::fs::copy(&b.cert, &live.cert).unwrap();
    std::fs::copy(&b.key, &live.key).unwrap();
    ok(
        Command::new("kill")
            .args(["-HUP", &srv.child.id().to_string()])
            .output()
            .unwrap(),
        "kill -HUP",
    );
    let url = format!("ftpes://localhost:{}/src.bin", srv.port);
    let got = local.path().join("got");
    let mut reloaded = false;
    for _ in 0..50 {
        if xftp(&["get", "--cacert", s(&b.cert), &url, s(&got)])
            .status
            .success()
        {
            reloaded = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(reloaded, "new sessions get the new certificate");
    assert!(!xftp(&["get", "--cacert", s(&a.cert), &url, s(&got)])
        .status
        .success());
    // The old session goes on.
    py.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "GOT 300000");
    assert!(py.wait().unwrap().success());
    drop(a.dir);
}

/// Many TLS uploads at once, from curl (one stream) and from xftp (eight):
/// a client that closes an upload connection with unread bytes in it
/// (session tickets it never reads) makes its kernel reset the
/// connection, which can cut off the end of the upload: none may fail.
#[test]
fn concurrent_tls_uploads_all_complete() {
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src.bin");
    write_prng_file(&src, 2 * 1024 * 1024 + 3, 21);
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    let ca = pki.cert.clone();
    let port = srv.port;
    let mut jobs = Vec::new();
    for i in 0..8 {
        let (ca, src) = (ca.clone(), src.clone());
        jobs.push(std::thread::spawn(move || {
            let curl = have("curl").then(|| {
                Command::new("curl")
                    .args(["-sS", "--ssl-reqd", "--cacert", s(&ca), "-T", s(&src)])
                    .arg(format!("ftp://localhost:{port}/curl-{i}.bin"))
                    .output()
                    .unwrap()
            });
            let x = xftp(&[
                "put",
                "--cacert",
                s(&ca),
                "-p",
                "8",
                s(&src),
                &format!("ftpes://localhost:{port}/xftp-{i}.bin"),
            ]);
            (curl, x)
        }));
    }
    for j in jobs {
        let (curl, x) = j.join().unwrap();
        if let Some(c) = curl {
            ok(c, "curl upload");
        }
        ok(x, "xftp upload");
    }
    let want = sha256_file(&src);
    for e in std::fs::read_dir(root.path()).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(sha256_file(&p), want, "{}", p.display());
    }
}

/// MULT 2 under TLS: one data connection shakes hands and carries the
/// file (MODE E blocks), the other closes before its handshake.
const ONE_OF_TWO: &str = r#"
import ftplib, socket, ssl, struct, sys
port, ca = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
f = ftplib.FTP_TLS(context=ctx, timeout=20)
f.connect("localhost", port)
f.login()
f.prot_p()
f.voidcmd("TYPE I")
print(f.sendcmd("MULT 2"))
host, p = f.makepasv()
good = socket.create_connection(("127.0.0.1", p))
bad = socket.create_connection(("127.0.0.1", p))
f.putcmd("STOR two.bin")
print(f.getresp())
bad.close()
good = ctx.wrap_socket(good, server_hostname="localhost", session=f.sock.session)
data = bytes(range(256)) * 400
good.sendall(struct.pack(">BQQ", 0, len(data), 0) + data + struct.pack(">BQQ", 0x48, 0, 1))
try:
    print(f.voidresp())
except ftplib.all_errors as e:
    print("FAILED", e)
good.close()
f.quit()
"#;

#[test]
fn a_data_connection_that_fails_its_handshake_leaves_the_others_the_transfer() {
    if !have("python3") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    let out = Command::new(PYTHON)
        .args(["-c", ONE_OF_TWO, &srv.port.to_string(), s(&pki.cert)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("226"), "{text}");
    let want: Vec<u8> = (0..400).flat_map(|_| 0..=255u8).collect();
    assert!(std::fs::read(root.path().join("two.bin")).unwrap() == want);
}

/// MULT 2 under TLS, a download: one data connection shakes hands at
/// once, the other only after 3 s. Prints when the first block came on
/// the first, and the bytes of both.
const SLOW_HANDSHAKE: &str = r#"
import ftplib, socket, ssl, struct, sys, time
port, ca = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
f = ftplib.FTP_TLS(context=ctx, timeout=20)
f.connect("localhost", port)
f.login()
f.prot_p()
f.voidcmd("TYPE I")
f.voidcmd("MODE E")
print(f.sendcmd("MULT 2"))
host, p = f.makepasv()
good = socket.create_connection(("127.0.0.1", p))
slow = socket.create_connection(("127.0.0.1", p))
f.putcmd("RETR big.bin")
print(f.getresp())
t0 = time.monotonic()
good = ctx.wrap_socket(good, server_hostname="localhost", session=f.sock.session)
def exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("closed inside a block")
        b += c
    return b
out, first, eods = {}, None, None
def blocks(s):
    global first, eods
    while True:
        flags, count, off = struct.unpack(">BQQ", exact(s, 17))
        if count:
            out[off] = exact(s, count)
            if first is None:
                first = time.monotonic() - t0
        if flags & 0x40:
            eods = off
        if flags & 0x08:
            return
blocks(good)
time.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
try:
    slow = ctx.wrap_socket(slow, server_hostname="localhost", session=f.sock.session)
    if eods is None or eods > 1:
        blocks(slow)
except (OSError, EOFError) as e:
    print("slow connection:", e)
print(f.voidresp())
print("FIRST", first)
data = b"".join(out[k] for k in sorted(out))
print("BYTES", len(data), data == bytes(range(256)) * 4096)
f.quit()
"#;

#[test]
fn a_download_does_not_wait_for_a_slow_tls_handshake() {
    if !have("python3") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let want: Vec<u8> = (0..4096).flat_map(|_| 0..=255u8).collect();
    std::fs::write(root.path().join("big.bin"), &want).unwrap();
    let srv = serve_tls(root.path(), &pki, &["--tls", "required"]);
    let out = Command::new(PYTHON)
        .args(["-c", SLOW_HANDSHAKE, &srv.port.to_string(), s(&pki.cert)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("226"), "{text}");
    assert!(text.contains("BYTES 1048576 True"), "{text}");
    // The first block comes once the first handshake is done and the
    // other has had its 250 ms, not after the slow one's 3 s.
    let first: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("FIRST "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no first block: {text}"));
    assert!(first < 2.0, "first block after {first:.2} s: {text}");
}

/// RFC 2228 3: after AUTH the user logs in again. A login made in clear
/// before AUTH TLS does not carry over into the TLS session.
#[test]
fn a_login_in_clear_does_not_survive_auth_tls() {
    if !have("python3") {
        return;
    }
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let srv = serve_tls(root.path(), &pki, &["--tls", "optional", "--anonymous"]);
    let script = r#"
import ftplib, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
f = ftplib.FTP_TLS(context=ctx)
f.connect("localhost", int(sys.argv[1]))
ftplib.FTP.login(f)          # in clear
print(f.auth())              # 234, then the handshake
try:
    print(f.sendcmd("PWD"))
except ftplib.error_perm as e:
    print(e)
print(f.login())             # again, under TLS
print(f.sendcmd("PWD"))
"#;
    let out = ok(
        Command::new(PYTHON)
            .args(["-c", script, &srv.port.to_string(), s(&pki.cert)])
            .output()
            .unwrap(),
        "ftplib login then AUTH TLS",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() == 4, "{text}");
    assert!(lines[0].starts_with("234"), "{text}");
    assert!(lines[1].starts_with("530"), "{text}");
    assert!(lines[2].starts_with("230"), "{text}");
    assert!(lines[3].starts_with("257"), "{text}");
}

#[test]
fn a_refusal_on_the_implicit_port_says_why() {
    // The implicit-TLS client reads nothing before its handshake: a
    // session over the per-address limit is told so after it, as on the
    // explicit port, rather than closed bare.
    use std::io::Read;
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.txt"), b"a").unwrap();
    let srv = serve_tls(
        root.path(),
        &pki,
        &[
            "--implicit-listen",
            "127.0.0.1:0",
            "--max-sessions-per-ip",
            "1",
        ],
    );
    let mut held = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    let mut greeting = [0u8; 3];
    held.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting, b"220");
    let local = tempfile::tempdir().unwrap();
    let url = format!("ftps://localhost:{}/a.txt", srv.implicit.unwrap());
    let out = xftp(&[
        "get",
        "--cacert",
        s(&pki.cert),
        &url,
        s(&local.path().join("a.txt")),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Too many sessions from your address"), "{err}");
    drop(held);
}

#[test]
fn one_address_for_both_listeners_is_named() {
    let pki = pki();
    let root = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_xftp"))
        .args(["serve", "--anonymous", "--root"])
        .arg(root.path())
        .args(["--listen", &addr, "--implicit-listen", &addr])
        .args(["--tls-cert", s(&pki.cert), "--tls-key", s(&pki.key)])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("a port of its own"), "{err}");
}
