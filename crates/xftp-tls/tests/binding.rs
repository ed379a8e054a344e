//! Data connections are bound to their control session: a handshake that
//! resumes the control connection's session is taken, any other is not.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use xftp_tls::client::{ClientTls, ClientTlsConfig};
use xftp_tls::server::{DataTlsError, Proof, ServerTls};

const T: Duration = Duration::from_secs(10);

struct Pki {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(names: &[&str]) -> Pki {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let c = rcgen::generate_simple_self_signed(names).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    Pki {
        _dir: dir,
        cert,
        key,
    }
}

async fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

/// A certificate for localhost, a client that trusts it, one control
/// session's TLS handing out `tickets`, and a listener for the pairs.
async fn setup(tickets: usize) -> (Pki, ClientTls, xftp_tls::server::SessionTls, TcpListener) {
    let p = pki(&["localhost"]);
    let server = ServerTls::load(&p.cert, &p.key).unwrap();
    let cfg = ClientTlsConfig {
        cacert: Some(p.cert.clone()),
        insecure: false,
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sess = server.session(tickets).unwrap();
    let client = ClientTls::new(&cfg, "localhost").unwrap();
    (p, client, sess, l)
}

/// A control connection: handshake, then one exchange so the client reads
/// the session tickets that follow the handshake.
async fn control(
    client: &ClientTls,
    server: &xftp_tls::server::SessionTls,
    l: &TcpListener,
) -> (xftp_tls::Stream, xftp_tls::Stream) {
    let (a, b) = pair(l).await;
    let (c, s) = tokio::join!(client.connect(a, T), server.accept_control(b, T));
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    s.write_all(b"200 hi\r\n").await.unwrap();
    let mut buf = [0u8; 8];
    c.read_exact(&mut buf).await.unwrap();
    (c, s)
}

#[tokio::test]
async fn data_connections_must_resume_their_control_session() {
    let p = pki(&["localhost"]);
    let server = ServerTls::load(&p.cert, &p.key).unwrap();
    let cfg = ClientTlsConfig {
        cacert: Some(p.cert.clone()),
        insecure: false,
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();

    let sess = server.session(8).unwrap();
    let client = ClientTls::new(&cfg, "localhost").unwrap();
    let (ctl, _sctl) = control(&client, &sess, &l).await;
    let info = ctl.tls_info().unwrap();
    assert_eq!(info.version, "TLSv1.3");
    assert!(!info.resumed);
    assert!(client.tickets() >= 8, "tickets: {}", client.tickets());

    // Eight data connections at once, all resumed and accepted.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (a, b) = pair(&l).await;
        let (client, sess) = (client.clone(), sess.clone());
        tasks.push(tokio::spawn(async move {
            let (c, s) = tokio::join!(
                client.connect(a, T),
                sess.accept_data(b, T, Proof::Resume, true)
            );
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            assert!(c.tls_info().unwrap().resumed);
            s.write_all(b"payload").await.unwrap();
            s.shutdown().await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"payload");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // Another client session (its own control connection to this server,
    // but another control session) cannot attach a data connection here.
    let other_sess = server.session(8).unwrap();
    let intruder = ClientTls::new(&cfg, "localhost").unwrap();
    let _ = control(&intruder, &other_sess, &l).await;
    let (a, b) = pair(&l).await;
    let (_c, s) = tokio::join!(
        intruder.connect(a, T),
        sess.accept_data(b, T, Proof::Resume, false)
    );
    assert!(matches!(s, Err(DataTlsError::NotResumed)), "{s:?}");

    // Nor can a client with no session at all.
    let fresh = ClientTls::new(&cfg, "localhost").unwrap();
    let (a, b) = pair(&l).await;
    let (_c, s) = tokio::join!(
        fresh.connect(a, T),
        sess.accept_data(b, T, Proof::Resume, false)
    );
    assert!(matches!(s, Err(DataTlsError::NotResumed)), "{s:?}");
}

#[tokio::test]
async fn an_untrusted_certificate_is_explained() {
    let p = pki(&["localhost"]);
    let server = ServerTls::load(&p.cert, &p.key).unwrap();
    let sess = server.session(2).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = pki(&["localhost"]);
    let client = ClientTls::new(
        &ClientTlsConfig {
            cacert: Some(other.cert.clone()),
            insecure: false,
        },
        "localhost",
    )
    .unwrap();
    let (a, b) = pair(&l).await;
    let (c, _s) = tokio::join!(client.connect(a, T), sess.accept_control(b, T));
    let e = c.unwrap_err();
    let why = xftp_tls::explain_handshake_error(&e);
    assert!(why.contains("--cacert"), "{why}");

    // The wrong name.
    let client = ClientTls::new(
        &ClientTlsConfig {
            cacert: Some(p.cert.clone()),
            insecure: false,
        },
        "127.0.0.1",
    )
    .unwrap();
    let (a, b) = pair(&l).await;
    let (c, _s) = tokio::join!(client.connect(a, T), sess.accept_control(b, T));
    let why = xftp_tls::explain_handshake_error(&c.unwrap_err());
    assert!(why.contains("not valid for this host name"), "{why}");

    // --insecure connects anyway.
    let client = ClientTls::new(
        &ClientTlsConfig {
            cacert: None,
            insecure: true,
        },
        "127.0.0.1",
    )
    .unwrap();
    let (a, b) = pair(&l).await;
    let (c, s) = tokio::join!(client.connect(a, T), sess.accept_control(b, T));
    assert!(c.is_ok() && s.is_ok());
}

#[tokio::test]
async fn plain_text_on_a_tls_connection_is_explained() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = ClientTls::new(
        &ClientTlsConfig {
            cacert: None,
            insecure: true,
        },
        "127.0.0.1",
    )
    .unwrap();
    let (a, mut b) = pair(&l).await;
    b.write_all(b"220 plain FTP server ready\r\n")
        .await
        .unwrap();
    let e = client.connect(a, T).await.unwrap_err();
    let why = xftp_tls::explain_handshake_error(&e);
    assert!(why.contains("does not speak TLS"), "{why}");
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let a = pki(&["localhost"]);
    let b = pki(&["localhost"]);
    let e = ServerTls::load(&a.cert, &b.key).unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
    let e = ServerTls::load(&a.key, &a.key).unwrap_err();
    assert!(e.to_string().contains("certificate file"), "{e}");
    // A missing file or one with no key: the reason alone, once.
    let gone = a.key.with_extension("gone");
    let e = ServerTls::load(&a.cert, &gone).unwrap_err().to_string();
    assert!(
        e.starts_with("key file") && e.contains("No such file"),
        "{e}"
    );
    assert!(!e.contains("I/O error"), "{e}");
    let e = ServerTls::load(&a.cert, &a.cert).unwrap_err().to_string();
    assert!(e.contains("no PEM private key"), "{e}");
    let e = ServerTls::load(&gone, &a.key).unwrap_err().to_string();
    assert!(
        e.starts_with("certificate file") && e.contains("No such file"),
        "{e}"
    );
}

#[test]
fn reload_takes_new_files_and_keeps_old_ones_on_error() {
    let a = pki(&["localhost"]);
    let server = ServerTls::load(&a.cert, &a.key).unwrap();
    let b = pki(&["localhost"]);
    std::fs::copy(&b.cert, &a.cert).unwrap();
    std::fs::copy(&b.key, &a.key).unwrap();
    server.reload().unwrap();
    std::fs::write(&a.key, "garbage").unwrap();
    assert!(server.reload().is_err());
}

#[tokio::test]
async fn a_data_connection_may_prove_itself_with_the_binding_token() {
    let p = pki(&["localhost"]);
    let server = ServerTls::load(&p.cert, &p.key).unwrap();
    let cfg = ClientTlsConfig {
        cacert: Some(p.cert.clone()),
        insecure: false,
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sess = server.session(2).unwrap();
    let mut client = ClientTls::new(&cfg, "localhost").unwrap();
    let (ctl, sctl) = control(&client, &sess, &l).await;
    let (ct, st) = (
        xftp_tls::binding_token(&ctl).unwrap(),
        xftp_tls::binding_token(&sctl).unwrap(),
    );
    assert_eq!(ct, st, "both ends export the same token");
    client.bind(ct);
    // Many more data connections than tickets: the token suffices.
    for _ in 0..6 {
        let (a, b) = pair(&l).await;
        let (c, s) = tokio::join!(
            client.connect_data(a, T),
            sess.accept_data(b, T, Proof::Token(st), false)
        );
        assert!(c.is_ok() && s.is_ok(), "{s:?}");
    }
    // Another session's token is refused, as is none at all.
    let other = server.session(2).unwrap();
    let mut intruder = ClientTls::new(&cfg, "localhost").unwrap();
    let (ictl, _) = control(&intruder, &other, &l).await;
    intruder.bind(xftp_tls::binding_token(&ictl).unwrap());
    let (a, b) = pair(&l).await;
    let (_c, s) = tokio::join!(
        intruder.connect_data(a, T),
        sess.accept_data(b, T, Proof::Token(st), false)
    );
    assert!(matches!(s, Err(DataTlsError::BadToken)), "{s:?}");
    let silent = ClientTls::new(&cfg, "localhost").unwrap();
    let (a, b) = pair(&l).await;
    let ((), s) = tokio::join!(
        async {
            let s = silent.connect_data(a, T).await;
            // Say nothing, then close.
            drop(s);
        },
        sess.accept_data(b, Duration::from_secs(2), Proof::Token(st), false)
    );
    assert!(matches!(s, Err(DataTlsError::BadToken)), "{s:?}");
}

/// A self-signed certificate for localhost valid from `from` to `to`
/// (years).
fn pki_dated(from: i32, to: i32) -> Pki {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(to, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let c = params.self_signed(&key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert, c.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    Pki {
        _dir: dir,
        cert,
        key: key_path,
    }
}

#[tokio::test]
async fn a_pinned_certificate_is_trusted_only_within_its_dates() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    for (from, to, want) in [
        (2019, 2021, Some("has expired")),
        (2090, 2091, Some("not valid yet")),
        (2020, 2090, None),
    ] {
        let p = pki_dated(from, to);
        let server = ServerTls::load(&p.cert, &p.key).unwrap();
        let sess = server.session(1).unwrap();
        let client = ClientTls::new(
            &ClientTlsConfig {
                cacert: Some(p.cert.clone()),
                insecure: false,
            },
            "localhost",
        )
        .unwrap();
        let (a, b) = pair(&l).await;
        let (c, _s) = tokio::join!(client.connect(a, T), sess.accept_control(b, T));
        match want {
            Some(w) => {
                let why = xftp_tls::explain_handshake_error(&c.unwrap_err());
                assert!(why.contains(w), "{from}-{to}: {why}");
            }
            None => assert!(c.is_ok(), "{from}-{to}: {:?}", c.err()),
        }
    }
}

#[test]
fn a_certificate_out_of_its_dates_is_said_when_loaded() {
    // 2030-01-01 as seconds since 1970.
    let now = 1_893_456_000;
    let old = pki_dated(2000, 2020);
    let w = ServerTls::load(&old.cert, &old.key)
        .unwrap()
        .validity_warning(now)
        .expect("an expired certificate is said");
    assert!(w.contains("expired on") && w.contains("SIGHUP"), "{w}");
    let early = pki_dated(2040, 2050);
    let w = ServerTls::load(&early.cert, &early.key)
        .unwrap()
        .validity_warning(now)
        .expect("a certificate not valid yet is said");
    assert!(w.contains("not valid before"), "{w}");
    let fine = pki_dated(2020, 2040);
    let tls = ServerTls::load(&fine.cert, &fine.key).unwrap();
    assert_eq!(tls.validity_warning(now), None);
    // A Common Name alone names no host a client would accept.
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    let key = rcgen::KeyPair::generate().unwrap();
    let c = params.self_signed(&key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key_path) = (dir.path().join("cn.pem"), dir.path().join("cn.key"));
    std::fs::write(&cert, c.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let w = ServerTls::load(&cert, &key_path)
        .unwrap()
        .validity_warning(unix_now())
        .expect("a certificate without subjectAltName is said");
    assert!(w.contains("no subjectAltName"), "{w}");
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn a_peer_gone_without_close_notify_is_said_plainly() {
    let (_p, client, sess, l) = setup(2).await;
    let (mut ctl, sctl) = control(&client, &sess, &l).await;
    // The server's process dies: its TCP connection closes, no TLS alert.
    let tcp: &tokio::net::TcpStream = sctl.tcp();
    // SAFETY: shutdown(2) on a descriptor the stream owns and keeps open.
    let r = unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(tcp), libc::SHUT_RDWR) };
    assert_eq!(r, 0);
    let mut buf = [0u8; 8];
    let e = ctl.read(&mut buf).await.unwrap_err();
    assert!(xftp_tls::is_unclean_close(&e), "{e}");
    assert_eq!(xftp_tls::io_text(&e), xftp_tls::UNCLEAN_CLOSE);
    let plain = xftp_tls::plain_io_error(e);
    assert!(!plain.to_string().contains("docs.rs"), "{plain}");
    drop(sctl);
}

#[test]
fn key_files_a_server_cannot_use_say_why() {
    let dir = tempfile::tempdir().unwrap();
    // A CA and a leaf it signed.
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = dir.path().join("leaf.key");
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    // The chain leaf first loads; CA first names the order.
    let good = dir.path().join("good.pem");
    std::fs::write(&good, format!("{}{}", leaf.pem(), ca.pem())).unwrap();
    ServerTls::load(&good, &key).expect("leaf first");
    let reversed = dir.path().join("reversed.pem");
    std::fs::write(&reversed, format!("{}{}", ca.pem(), leaf.pem())).unwrap();
    let e = ServerTls::load(&reversed, &key).unwrap_err().to_string();
    assert!(
        e.contains("certificate 2 of that file") && e.contains("first"),
        "{e}"
    );
    // A key under a passphrase.
    let locked = dir.path().join("locked.key");
    std::fs::write(
        &locked,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = ServerTls::load(&good, &locked).unwrap_err().to_string();
    assert!(e.contains("encrypted") && e.contains("openssl pkey"), "{e}");
}
