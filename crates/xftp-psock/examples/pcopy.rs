//! pcopy: copy a file over N parallel TCP connections with the blocking API.
//!
//! ```text
//! pcopy recv 127.0.0.1:7000 OUT        # listens, writes what arrives to OUT
//! pcopy send 127.0.0.1:7000 IN [N]     # connects with N connections (default 4)
//! ```
//! Port 0 on `recv` picks a free port; the address is printed on stderr.

use std::io::{self, Read, Write};
use std::net::ToSocketAddrs;

use xftp_psock::blocking::{BlockingListener, BlockingStream};
use xftp_psock::PsockConfig;

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "usage: pcopy recv ADDR OUT | pcopy send ADDR IN [N]",
        )
    };
    let (mode, addr, path) = match &args[..] {
        [_, m, a, p, ..] => (m.as_str(), a.as_str(), p.as_str()),
        _ => return Err(usage()),
    };
    let cfg = PsockConfig::default();
    match mode {
        "recv" => {
            let mut l = BlockingListener::bind(addr, cfg)?;
            eprintln!("listening on {}", l.local_addr());
            let mut s = l.accept()?;
            let mut out = std::fs::File::create(path)?;
            let n = io::copy(&mut s, &mut out)?;
            out.sync_all()?;
            // Tell the sender everything arrived.
            s.shutdown()?;
            eprintln!(
                "received {n} bytes over {} connections",
                s.get_ref().streams()
            );
        }
        "send" => {
            let n: u16 = args
                .get(4)
                .map_or(Ok(4), |v| v.parse())
                .map_err(|_| usage())?;
            let addr = addr.to_socket_addrs()?.next().ok_or_else(usage)?;
            let mut s = BlockingStream::connect(addr, n, &cfg)?;
            let mut f = std::fs::File::open(path)?;
            let sent = io::copy(&mut f, &mut s)?;
            s.flush()?;
            s.shutdown()?;
            // Wait for the receiver's end-of-stream: it closes after writing.
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)?;
            eprintln!("sent {sent} bytes over {n} connections");
        }
        _ => return Err(usage()),
    }
    Ok(())
}
