//! Where the shell's commands come from: a line editor on a terminal, or
//! stdin read line by line. Reading blocks, so it runs on a thread of its
//! own, asked for one line at a time: nothing reads the terminal while a
//! command runs (its progress bar, a password prompt).

use std::borrow::Cow;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::mpsc;

use nix::sys::termios::{tcgetattr, tcsetattr, SetArg, Termios};
use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::Hinter;
use rustyline::history::FileHistory;
use rustyline::validate::Validator;
use rustyline::{ColorMode, Config, Context, Editor};
use tokio::sync::oneshot;

use super::words;

/// Entries kept in the history file.
const HISTORY_SIZE: usize = 1000;

/// One line of input, or why there is none.
pub enum Got {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of the script.
    Eof,
    Failed(String),
}

struct Ask {
    prompt: String,
    /// A password: not echoed, not kept in the history.
    secret: bool,
    reply: oneshot::Sender<Got>,
}

/// The reading thread.
pub struct Input {
    asks: Option<mpsc::Sender<Ask>>,
    /// The terminal's mode before the editor changed it, put back when a
    /// signal ends the shell while the editor holds the terminal raw.
    saved: Option<Termios>,
}

impl Input {
    /// Start reading: with the line editor when `interactive`.
    pub fn start(interactive: bool) -> Input {
        let (tx, rx) = mpsc::channel::<Ask>();
        let saved = if interactive {
            tcgetattr(std::io::stdin()).ok()
        } else {
            None
        };
        let spawned = std::thread::Builder::new()
            .name("xftp-input".into())
            .spawn(move || {
                if interactive {
                    terminal(rx)
                } else {
                    plain(rx, false)
                }
            });
        match spawned {
            Ok(_) => Input {
                asks: Some(tx),
                saved,
            },
            Err(e) => {
                tracing::warn!("cannot start the input thread: {e}");
                Input { asks: None, saved }
            }
        }
    }

    /// The next command line.
    pub async fn line(&mut self, prompt: &str) -> Got {
        self.ask(prompt, false).await
    }

    /// A password, not echoed (terminals only).
    pub async fn secret(&mut self, prompt: &str) -> Got {
        self.ask(prompt, true).await
    }

    async fn ask(&mut self, prompt: &str, secret: bool) -> Got {
        let Some(tx) = &self.asks else {
            return Got::Failed("no input thread".into());
        };
        let (reply, rx) = oneshot::channel();
        let ask = Ask {
            prompt: prompt.to_string(),
            secret,
            reply,
        };
        if tx.send(ask).is_err() {
            return Got::Eof;
        }
        rx.await.unwrap_or(Got::Eof)
    }

    /// Put the terminal back as it was: the editor may hold it raw, with
    /// bracketed paste on.
    pub fn restore_terminal(&self) {
        if let Some(t) = &self.saved {
            let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, t);
            let mut out = std::io::stdout();
            if out.is_terminal() {
                let _ = out.write_all(b"\x1b[?2004l");
                let _ = out.flush();
            }
        }
    }
}

/// Lines from stdin as they are (scripts), with a prompt on stdout when the
/// line editor could not start on a terminal.
fn plain(asks: mpsc::Receiver<Ask>, prompt: bool) {
    let stdin = std::io::stdin();
    let mut lock = stdin.lock();
    while let Ok(ask) = asks.recv() {
        if ask.secret && !prompt {
            let _ = ask.reply.send(Got::Failed("no terminal to ask on".into()));
            continue;
        }
        if prompt {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(ask.prompt.as_bytes());
            let _ = out.flush();
        }
        let mut buf = Vec::new();
        let got = match lock.read_until(b'\n', &mut buf) {
            Ok(0) => Got::Eof,
            Ok(_) => match String::from_utf8(buf) {
                Ok(mut s) => {
                    while s.ends_with(['\n', '\r']) {
                        s.pop();
                    }
                    Got::Line(s)
                }
                Err(_) => Got::Failed("the line is not valid UTF-8".into()),
            },
            Err(e) => Got::Failed(e.to_string()),
        };
        if ask.reply.send(got).is_err() {
            break;
        }
    }
}

/// The line editor: history in the cache directory, completion of command
/// names and of local paths after put, mput and lcd.
fn terminal(asks: mpsc::Receiver<Ask>) {
    let config = Config::builder()
        .auto_add_history(false)
        .max_history_size(HISTORY_SIZE)
        .map(|b| b.color_mode(ColorMode::Forced).build());
    let editor = config
        .and_then(Editor::<Helper, FileHistory>::with_config)
        .map_err(|e| e.to_string());
    let mut ed = match editor {
        Ok(e) => e,
        Err(e) => {
            eprintln!("xftp: no line editing ({e}); reading plain lines");
            return plain(asks, true);
        }
    };
    ed.set_helper(Some(Helper::default()));
    let path = history_path();
    if let Some(p) = &path {
        // A missing or unreadable history is an empty one.
        let _ = ed.load_history(p);
    }
    while let Ok(ask) = asks.recv() {
        if let Some(h) = ed.helper_mut() {
            h.masking = ask.secret;
        }
        let r = ed.readline(&ask.prompt);
        if let Some(h) = ed.helper_mut() {
            h.masking = false;
        }
        let got = match r {
            Ok(line) => {
                if !ask.secret {
                    remember(&mut ed, path.as_ref(), &line);
                }
                Got::Line(line)
            }
            Err(ReadlineError::Interrupted) => Got::Interrupted,
            Err(ReadlineError::Eof) => Got::Eof,
            Err(e) => Got::Failed(e.to_string()),
        };
        if ask.reply.send(got).is_err() {
            break;
        }
    }
}

/// Add a line to the history and save it at once, so a shell that is
/// killed keeps it too. Failing to save is not worth a message.
fn remember(ed: &mut Editor<Helper, FileHistory>, path: Option<&PathBuf>, line: &str) {
    let Some(entry) = words::history_entry(line) else {
        return;
    };
    if !matches!(ed.add_history_entry(entry), Ok(true)) {
        return;
    }
    if let Some(p) = path {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = ed.save_history(p) {
            tracing::debug!("cannot save the history to {}: {e}", p.display());
        }
    }
}

/// `$XDG_CACHE_HOME/xftp/shell_history`, else `~/.cache/xftp/shell_history`
/// (beside the path cache of get and put).
fn history_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("xftp").join("shell_history"))
}

#[derive(Default)]
struct Helper {
    /// Reading a password: show blanks.
    masking: bool,
    files: FilenameCompleter,
}

impl Completer for Helper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        if self.masking {
            return Ok((pos, Vec::new()));
        }
        let head = line.get(..pos).unwrap_or(line);
        match head.find(char::is_whitespace) {
            None => {
                let names = super::COMMANDS
                    .iter()
                    .flat_map(|h| h.names.iter())
                    .filter(|n| n.starts_with(head))
                    .map(|n| Pair {
                        display: n.to_string(),
                        replacement: format!("{n} "),
                    })
                    .collect();
                Ok((0, names))
            }
            Some(i) => match head[..i].to_ascii_lowercase().as_str() {
                "put" | "reput" | "mput" | "lcd" => self.files.complete(line, pos, ctx),
                _ => Ok((pos, Vec::new())),
            },
        }
    }
}

impl Hinter for Helper {
    type Hint = String;
}

impl Validator for Helper {}

impl Highlighter for Helper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        if self.masking {
            // Blanks, not nothing: the editor places the cursor by the
            // width of the line.
            Cow::Owned(" ".repeat(line.chars().count()))
        } else {
            Cow::Borrowed(line)
        }
    }

    fn highlight_char(&self, _line: &str, _pos: usize, kind: CmdKind) -> bool {
        self.masking && kind != CmdKind::MoveCursor
    }
}

impl rustyline::Helper for Helper {}
