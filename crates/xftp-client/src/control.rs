//! The control connection: send commands, read replies, check codes.
//!
//! Every call is "send this command, expect one of these codes"; anything
//! else becomes [`ClientError::Reply`] with the server's code and text.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use xftp_proto::{Reply, ReplyParser};
use xftp_tls::Stream;

use crate::error::{ClientError, Result};

/// One command to send: verb and optional argument.
#[derive(Debug, Clone)]
pub struct Cmd {
    verb: &'static str,
    arg: Option<String>,
}

/// The longest round trip a path is taken to have: two geostationary hops
/// and slow links take about 1.2 s. Longer is a stall, not the path.
pub const MAX_PATH_RTT: Duration = Duration::from_secs(2);

impl Cmd {
    /// A command without argument.
    pub fn bare(verb: &'static str) -> Cmd {
        Cmd { verb, arg: None }
    }

    /// A command with an argument.
    pub fn with(verb: &'static str, arg: impl Into<String>) -> Cmd {
        Cmd {
            verb,
            arg: Some(arg.into()),
        }
    }

    /// The command for logs and errors; passwords are masked.
    pub fn display(&self) -> String {
        match (&self.arg, self.verb) {
            (Some(_), "PASS") => "PASS ****".to_owned(),
            (Some(a), v) => format!("{v} {a}"),
            (None, v) => v.to_owned(),
        }
    }

    /// The wire form, refusing CR/LF inside the argument (command smuggling).
    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        if self.arg.as_ref().is_some_and(|a| a.contains(['\r', '\n'])) {
            return Err(ClientError::BadArgument {
                verb: self.verb.to_owned(),
            });
        }
        out.extend_from_slice(self.verb.as_bytes());
        if let Some(a) = &self.arg {
            out.push(b' ');
            // A name that is not UTF-8 goes as its own bytes
            // (xftp_proto::name); a 0xFF byte is doubled, as Telnet's
            // IAC (RFC 959, RFC 854), so the server does not read it as
            // the start of a Telnet command.
            for b in xftp_proto::name::encode(a) {
                out.push(b);
                if b == 0xFF {
                    out.push(0xFF);
                }
            }
        }
        out.extend_from_slice(b"\r\n");
        Ok(())
    }
}

/// Build the error for an unexpected reply.
pub fn unexpected(cmd: &Cmd, reply: &Reply) -> ClientError {
    ClientError::Reply {
        command: cmd.display(),
        code: reply.code,
        text: reply_text(reply),
    }
}

/// Reply lines joined by spaces, trimmed.
pub fn reply_text(reply: &Reply) -> String {
    reply
        .lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The control connection of one session.
#[derive(Debug)]
pub struct Control {
    io: Stream,
    parser: ReplyParser,
    buf: Vec<u8>,
    reply_timeout: Duration,
    peer: SocketAddr,
    local: SocketAddr,
    /// Commands sent whose replies no caller waits for
    /// ([`send_unawaited`](Control::send_unawaited)), oldest first.
    owed: std::collections::VecDeque<Cmd>,
    /// Final replies the server still owes: one per command sent, and
    /// the greeting; each final reply read takes one off.
    unanswered: usize,
}

/// What the replies of an exchange that failed part-way are owed to.
const FAILED_EXCHANGE: &str = "(a command of a failed exchange)";

impl Control {
    /// Wrap a connected stream.
    pub fn new(stream: impl Into<Stream>, reply_timeout: Duration) -> Result<Control> {
        let io = stream.into();
        let peer = io.tcp().peer_addr().map_err(ClientError::ControlIo)?;
        let local = io.tcp().local_addr().map_err(ClientError::ControlIo)?;
        // Commands are small and often pipelined; do not let Nagle hold them.
        let _ = io.tcp().set_nodelay(true);
        Ok(Control {
            io,
            parser: ReplyParser::new(),
            buf: vec![0; 4096],
            reply_timeout,
            peer,
            local,
            owed: Default::default(),
            unanswered: 1,
        })
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The control connection's RTT (`TCP_INFO`): the smallest the
    /// kernel saw where it has one, else its smoothed RTT; `None` when
    /// unknown, or longer than any path on Earth ([`MAX_PATH_RTT`]): a
    /// handshake that a stalled path held for seconds is the only sample
    /// of a login whose commands went in one flight. (A start read 13 s
    /// on an 80 ms path, began at 16 connections and quadrupled them.)
    pub fn rtt(&self) -> Option<Duration> {
        let tcp: &TcpStream = self.io.tcp();
        xftp_tune::tcpinfo::read(tcp)
            .ok()
            .map(|i| match i.min_rtt {
                m if m.is_zero() => i.rtt,
                m => m.min(i.rtt),
            })
            .filter(|r| !r.is_zero() && *r <= MAX_PATH_RTT)
    }

    /// The control connection's binding token (see
    /// [`xftp_tls::binding_token`]), under TLS.
    pub fn binding_token(&self) -> Option<[u8; xftp_tls::TOKEN_LEN]> {
        xftp_tls::binding_token(&self.io)
    }

    /// TLS negotiated on the control connection, if any.
    pub fn tls_info(&self) -> Option<xftp_tls::TlsInfo> {
        self.io.tls_info()
    }

    /// AUTH TLS was accepted: the TLS handshake (over the connection as
    /// it is; nothing may be left unread, as nothing follows a 234).
    pub async fn start_tls(self, tls: &xftp_tls::client::ClientTls) -> Result<Control> {
        let Control {
            io,
            parser,
            buf,
            reply_timeout,
            peer,
            local,
            owed,
            unanswered,
        } = self;
        let tcp = io
            .into_plain()
            .map_err(|_| ClientError::Tls("TLS is already on".into()))?;
        let io = tls
            .connect(tcp, reply_timeout)
            .await
            .map_err(|e| ClientError::tls_handshake(e, "", false))?;
        Ok(Control {
            io,
            parser,
            buf,
            reply_timeout,
            peer,
            local,
            owed,
            unanswered,
        })
    }

    /// Our end of the control connection.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Send several commands in one write (pipelining); every argument is
    /// checked before anything is sent.
    pub async fn send(&mut self, cmds: &[&Cmd]) -> Result<()> {
        let mut out = Vec::new();
        for c in cmds {
            c.encode(&mut out)?;
            tracing::debug!(">>> {}", c.display());
        }
        self.unanswered += cmds.len();
        let io = &mut self.io;
        let write = async move {
            io.write_all(&out).await?;
            // TLS keeps what the socket did not take: commands go now.
            io.flush().await
        };
        match tokio::time::timeout(self.reply_timeout, write).await {
            Ok(r) => r.map_err(ClientError::ControlIo),
            Err(_) => Err(ClientError::Timeout {
                what: "the control connection to accept a command".into(),
                after: self.reply_timeout,
            }),
        }
    }

    /// Send `cmd` now, in a write of its own, and let its reply be read
    /// with the next one (no round trip of its own). For a command whose
    /// failure changes nothing but speed: a refusal is logged, not
    /// returned.
    pub async fn send_unawaited(&mut self, cmd: &Cmd) -> Result<()> {
        self.send(&[cmd]).await?;
        self.owed.push_back(cmd.clone());
        Ok(())
    }

    /// Read the next reply (any code).
    pub async fn read_reply(&mut self) -> Result<Reply> {
        self.read_reply_within(self.reply_timeout).await
    }

    /// How long [`read_reply`](Control::read_reply) waits.
    pub fn reply_timeout(&self) -> Duration {
        self.reply_timeout
    }

    /// Read the next reply, waiting at most `limit`; the replies owed to
    /// [`send_unawaited`](Control::send_unawaited) commands are read first.
    pub async fn read_reply_within(&mut self, limit: Duration) -> Result<Reply> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(r) = self.parser.next_reply()? {
                if let Some(r) = self.take(r) {
                    return Ok(r);
                }
                continue;
            }
            let n = match tokio::time::timeout_at(deadline, self.io.read(&mut self.buf)).await {
                Ok(r) => r.map_err(ClientError::ControlIo)?,
                Err(_) => {
                    return Err(ClientError::Timeout {
                        what: "a reply from the server".into(),
                        after: limit,
                    })
                }
            };
            if n == 0 {
                return Err(ClientError::Closed);
            }
            self.parser.feed(&self.buf[..n]);
        }
    }

    /// A reply just parsed: counted, and skipped (`None`) when it belongs
    /// to a command whose reply no caller waits for.
    fn take(&mut self, r: Reply) -> Option<Reply> {
        tracing::debug!("<<< {} {}", r.code, reply_text(&r));
        if !r.is_preliminary() {
            self.unanswered = self.unanswered.saturating_sub(1);
        }
        if r.is_preliminary() && !self.owed.is_empty() {
            return None;
        }
        if let Some(c) = self.owed.pop_front() {
            // A command sent without waiting that failed is worth a
            // warning; the rest of an exchange that failed already is
            // not: its error says it once (six logins of a `-p 4` to a
            // server that requires TLS printed six 530s).
            if !r.is_success() && c.verb == FAILED_EXCHANGE {
                tracing::debug!("{}: {} {}", c.verb, r.code, reply_text(&r));
            } else if !r.is_success() {
                tracing::warn!("{}: {} {}", c.display(), r.code, reply_text(&r));
            }
            return None;
        }
        Some(r)
    }

    /// Final replies the server still owes for the commands sent so far.
    pub fn unanswered(&self) -> usize {
        self.unanswered
    }

    /// After an exchange that failed part-way (a data connection reset
    /// after the 150, a local write error): the replies it left unread
    /// are skipped, waiting at most `grace` for them, so that the next
    /// reply read belongs to the next command. `false`: they did not all
    /// come in time (they are still skipped if they come later).
    pub async fn skip_unanswered(&mut self, grace: Duration) -> bool {
        let left = self.unanswered.saturating_sub(self.owed.len());
        for _ in 0..left {
            self.owed.push_back(Cmd::bare(FAILED_EXCHANGE));
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.owed.is_empty() {
            match self.parser.next_reply() {
                Ok(Some(r)) => {
                    // Nothing waits for these: every one is skipped.
                    let _ = self.take(r);
                    continue;
                }
                Ok(None) => {}
                Err(_) => return false,
            }
            match tokio::time::timeout_at(deadline, self.io.read(&mut self.buf)).await {
                Ok(Ok(n)) if n > 0 => self.parser.feed(&self.buf[..n]),
                _ => return false,
            }
        }
        true
    }

    /// Read the reply to `cmd` (already sent) and check its code.
    pub async fn expect(&mut self, cmd: &Cmd, codes: &[u16]) -> Result<Reply> {
        let r = self.read_reply().await?;
        if codes.contains(&r.code) {
            Ok(r)
        } else {
            Err(unexpected(cmd, &r))
        }
    }

    /// Close our write side politely.
    pub async fn shutdown(&mut self) {
        let _ = self.io.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crlf_in_argument_is_refused() {
        let mut out = Vec::new();
        let c = Cmd::with("RETR", "a\r\nDELE b");
        assert!(matches!(
            c.encode(&mut out),
            Err(ClientError::BadArgument { .. })
        ));
        let c = Cmd::with("RETR", "a\nb");
        assert!(c.encode(&mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn encodes_with_crlf() {
        let mut out = Vec::new();
        Cmd::with("RETR", "a b").encode(&mut out).unwrap();
        Cmd::bare("PASV").encode(&mut out).unwrap();
        assert_eq!(out, b"RETR a b\r\nPASV\r\n");
    }

    #[test]
    fn password_is_masked() {
        assert_eq!(Cmd::with("PASS", "secret").display(), "PASS ****");
    }
}
