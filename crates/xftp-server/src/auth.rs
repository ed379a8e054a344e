//! Users: anonymous access and a users file with Argon2id password hashes.
//!
//! File format, one user per line, `#` starts a comment:
//! `name:PHC-hash:rw` or `name:PHC-hash:ro`, optionally followed by
//! `:home`, the user's home directory relative to the served root (the
//! session is confined to it). PHC strings (`$argon2id$v=19$...`) never
//! contain `:`; a home may not either. Files without homes (the older
//! format) load unchanged.

use std::collections::HashMap;
use std::path::Path;

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;

/// Errors reading or writing a users file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The file could not be read or written (the cause is the source:
    /// `{:#}` shows it once).
    #[error("users file {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line that is not `name:hash:rw|ro`.
    #[error("users file {path} line {line}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A user name that cannot be stored (empty, or with `:` or whitespace).
    #[error(
        "invalid user name {0:?}: use ASCII letters and digits, '.', '-', '_' or '@' (at most 64)"
    )]
    BadName(String),
    /// A home directory that is not relative to the served root.
    #[error(
        "invalid home {0:?}: give a directory relative to the served root, without '..' or ':'"
    )]
    BadHome(String),
    /// Hashing failed (should not happen with valid parameters).
    #[error("password hashing failed: {0}")]
    Hash(String),
}

/// What a logged-in user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only: RETR, LIST, SIZE, ...
    ReadOnly,
    /// Read and write: STOR, DELE, MKD, RNFR/RNTO, ...
    ReadWrite,
}

#[derive(Debug, Clone)]
struct Entry {
    hash: String,
    access: Access,
    home: Option<String>,
}

/// What a successful login grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Read-only or read-write.
    pub access: Access,
    /// Home directory relative to the served root, if the user has one.
    pub home: Option<String>,
}

/// A home directory as the users file may hold it: relative, no `..`,
/// no `:` (the field separator), no control characters.
fn valid_home(h: &str) -> bool {
    !h.is_empty()
        && !h.starts_with('/')
        && !h.contains(':')
        && !h.chars().any(char::is_control)
        && h.split('/').all(|c| c != "..")
}

/// The named users allowed to log in. Clones share one table, which
/// [`UserDb::reload`] replaces for all of them (SIGHUP).
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    users: std::sync::Arc<std::sync::RwLock<HashMap<String, Entry>>>,
}

/// Whether `name` (and `home`) can be stored in a users file: checked by
/// [`UserDb::set_with_home`], and by a caller before it asks for a
/// password that would then be refused.
pub fn check_entry(name: &str, home: Option<&str>) -> Result<(), AuthError> {
    if !valid_name(name) {
        return Err(AuthError::BadName(name.to_owned()));
    }
    if let Some(h) = home.filter(|h| !valid_home(h)) {
        return Err(AuthError::BadHome(h.to_owned()));
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
}

/// Hash a password with Argon2id and a random salt (PHC string).
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

impl UserDb {
    /// Load a users file.
    pub fn load(path: &Path) -> Result<UserDb, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse the text of a users file (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<UserDb, AuthError> {
        let mut users = HashMap::new();
        let mut lines = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |reason: &str| AuthError::Format {
                path: origin.to_owned(),
                line: i + 1,
                reason: reason.to_owned(),
            };
            let parts: Vec<&str> = line.split(':').collect();
            if parts.len() != 3 && parts.len() != 4 {
                return Err(err(
                    "expected name:hash:rw or name:hash:ro, then :home optionally",
                ));
            }
            let home =
                match parts.get(3) {
                    None => None,
                    Some(h) if valid_home(h) => Some(h.trim_end_matches('/').to_string()),
                    Some(_) => return Err(err(
                        "the home must be a directory relative to the served root (not empty, not absolute, without '..')",
                    )),
                };
            if !valid_name(parts[0]) {
                return Err(err("invalid user name"));
            }
            // Taken for the anonymous login before the file is looked at:
            // such a line could never log in, and a file of them alone
            // would start a server no one can use.
            if matches!(parts[0].to_ascii_lowercase().as_str(), "anonymous" | "ftp") {
                return Err(err(&format!(
                    "{:?} is the anonymous login, never looked up here: remove the line (anonymous access is `xftp serve --anonymous`)",
                    parts[0]
                )));
            }
            PasswordHash::new(parts[1]).map_err(|_| err("the hash is not a PHC string"))?;
            let access = match parts[2] {
                "rw" => Access::ReadWrite,
                "ro" => Access::ReadOnly,
                _ => return Err(err("access must be rw or ro")),
            };
            // Which of two lines would count is no choice to make
            // silently (an access taken away on one, given on the other).
            if let Some(first) = lines.insert(parts[0].to_owned(), i + 1) {
                return Err(err(&format!(
                    "user {} is defined on line {first} already",
                    parts[0]
                )));
            }
            users.insert(
                parts[0].to_owned(),
                Entry {
                    hash: parts[1].to_owned(),
                    access,
                    home,
                },
            );
        }
        Ok(UserDb {
            users: std::sync::Arc::new(std::sync::RwLock::new(users)),
        })
    }

    /// Read the users file at `path` again and put what it says in place
    /// of this table (every clone's); on an error the table stays as it
    /// was. Sessions logged in keep what their login granted. Returns
    /// the number of users.
    pub fn reload(&self, path: &Path) -> Result<usize, AuthError> {
        let fresh = Self::load(path)?;
        let table = std::mem::take(&mut *write(&fresh.users));
        let n = table.len();
        *write(&self.users) = table;
        Ok(n)
    }

    /// Add or replace a user.
    pub fn set(&mut self, name: &str, password: &str, access: Access) -> Result<(), AuthError> {
        self.set_with_home(name, password, access, None)
    }

    /// Add or replace a user confined to `home` (relative to the served
    /// root).
    pub fn set_with_home(
        &mut self,
        name: &str,
        password: &str,
        access: Access,
        home: Option<&str>,
    ) -> Result<(), AuthError> {
        check_entry(name, home)?;
        let hash = hash_password(password)?;
        let home = home.map(|h| h.trim_end_matches('/').to_owned());
        write(&self.users).insert(name.to_owned(), Entry { hash, access, home });
        Ok(())
    }

    /// The file text for this database (sorted by name).
    pub fn render(&self) -> String {
        let users = read(&self.users);
        let mut names: Vec<&String> = users.keys().collect();
        names.sort();
        let mut out = String::from("# xftp users: name:argon2-hash:rw|ro[:home]\n");
        for n in names {
            let e = &users[n];
            let acc = match e.access {
                Access::ReadOnly => "ro",
                Access::ReadWrite => "rw",
            };
            match &e.home {
                Some(h) => out.push_str(&format!("{n}:{}:{acc}:{h}\n", e.hash)),
                None => out.push_str(&format!("{n}:{}:{acc}\n", e.hash)),
            }
        }
        out
    }

    /// Check a password; `Some(access)` when it matches. Slow on purpose
    /// (Argon2): call it off the async executor.
    pub fn verify(&self, name: &str, password: &str) -> Option<Access> {
        self.login(name, password).map(|g| g.access)
    }

    /// Check a password; what the login grants when it matches. Slow on
    /// purpose (Argon2): call it off the async executor.
    pub fn login(&self, name: &str, password: &str) -> Option<Grant> {
        // An unknown name costs the same Argon2 work as a wrong password,
        // so the time of the 530 does not tell which names exist.
        static UNKNOWN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        // Copied out: the table is not held during the check.
        let entry = read(&self.users).get(name).cloned();
        let (phc, grant) = match &entry {
            Some(e) => (
                e.hash.as_str(),
                Some(Grant {
                    access: e.access,
                    home: e.home.clone(),
                }),
            ),
            None => (
                UNKNOWN
                    .get_or_init(|| hash_password("no such user").unwrap_or_default())
                    .as_str(),
                None,
            ),
        };
        let hash = PasswordHash::new(phc).ok()?;
        let ok = Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok();
        grant.filter(|_| ok)
    }

    /// What `name` is granted now (access and home), if the user exists:
    /// an update that changes only the password keeps them.
    pub fn grant_of(&self, name: &str) -> Option<Grant> {
        read(&self.users).get(name).map(|e| Grant {
            access: e.access,
            home: e.home.clone(),
        })
    }

    /// True if `name` is a known user (used to pick the reply to USER).
    pub fn contains(&self, name: &str) -> bool {
        read(&self.users).contains_key(name)
    }
}

type Table = std::sync::RwLock<HashMap<String, Entry>>;

fn read(t: &Table) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
    // A panic while holding it leaves a whole table (each write is one
    // insert or one swap).
    t.read().unwrap_or_else(|p| p.into_inner())
}

fn write(t: &Table) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
    t.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_render_parse_verify() {
        let mut db = UserDb::default();
        db.set("alice", "s3cret", Access::ReadWrite).unwrap();
        db.set("bob", "pw", Access::ReadOnly).unwrap();
        let text = db.render();
        assert!(!text.contains("s3cret"));
        let back = UserDb::parse(&text, "t").unwrap();
        assert_eq!(back.verify("alice", "s3cret"), Some(Access::ReadWrite));
        assert_eq!(back.verify("alice", "wrong"), None);
        assert_eq!(back.verify("bob", "pw"), Some(Access::ReadOnly));
        assert_eq!(back.verify("carol", "pw"), None);
        // The stand-in hash an unknown name is checked against lets no
        // one in, not even with its own password.
        assert_eq!(back.verify("carol", "no such user"), None);
    }

    #[test]
    fn homes_are_kept_and_old_files_still_load() {
        let mut db = UserDb::default();
        db.set_with_home("alice", "pw", Access::ReadWrite, Some("users/alice/"))
            .unwrap();
        db.set("bob", "pw", Access::ReadOnly).unwrap();
        let text = db.render();
        let back = UserDb::parse(&text, "t").unwrap();
        let g = back.login("alice", "pw").unwrap();
        assert_eq!(g.home.as_deref(), Some("users/alice"));
        assert_eq!(back.login("bob", "pw").unwrap().home, None);
        // A file of the older three-field form.
        let old: String = text.lines().filter(|l| l.starts_with("bob:")).collect();
        assert!(UserDb::parse(&old, "old").unwrap().contains("bob"));
        for bad in ["/abs", "a/../..", "x:y", ""] {
            assert!(
                db.set_with_home("c", "pw", Access::ReadOnly, Some(bad))
                    .is_err(),
                "{bad}"
            );
        }
        let hash = text.lines().find(|l| l.starts_with("bob:")).unwrap();
        assert!(UserDb::parse(&format!("{hash}:../up"), "t").is_err());
    }

    #[test]
    fn bad_lines_are_reported() {
        assert!(matches!(
            UserDb::parse("alice:nohash:rw\n", "f"),
            Err(AuthError::Format { line: 1, .. })
        ));
        assert!(matches!(
            UserDb::parse("# c\nalice\n", "f"),
            Err(AuthError::Format { line: 2, .. })
        ));
        let mut db = UserDb::default();
        assert!(db.set("a:b", "x", Access::ReadOnly).is_err());
        // The anonymous names are never looked up: said, not ignored.
        for name in ["anonymous", "FTP"] {
            match UserDb::parse(&format!("# c\n{name}:x:rw\n"), "f") {
                Err(AuthError::Format {
                    line: 2, reason, ..
                }) => {
                    assert!(reason.contains("anonymous login"), "{reason}")
                }
                other => panic!("{name}: {:?}", other.map(|_| ())),
            }
        }
    }
}
