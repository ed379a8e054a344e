//! Users: anonymous access and a users file with Argon2id password hashes.
//!
//! File format, one user per line, `#` starts a comment:
//! `name:PHC-hash:rw` or `name:PHC-hash:ro`. PHC strings
//! (`$argon2id$v=19$...`) never contain `:`.

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
    /// The file could not be read or written.
    #[error("users file {path}: {source}")]
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
    #[error("invalid user name {0:?}: use letters, digits, '.', '-', '_' or '@'")]
    BadName(String),
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
}

/// The named users allowed to log in.
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    users: HashMap<String, Entry>,
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
            if parts.len() != 3 {
                return Err(err("expected name:hash:rw or name:hash:ro"));
            }
            if !valid_name(parts[0]) {
                return Err(err("invalid user name"));
            }
            PasswordHash::new(parts[1]).map_err(|_| err("the hash is not a PHC string"))?;
            let access = match parts[2] {
                "rw" => Access::ReadWrite,
                "ro" => Access::ReadOnly,
                _ => return Err(err("access must be rw or ro")),
            };
            users.insert(
                parts[0].to_owned(),
                Entry {
                    hash: parts[1].to_owned(),
                    access,
                },
            );
        }
        Ok(UserDb { users })
    }

    /// Add or replace a user.
    pub fn set(&mut self, name: &str, password: &str, access: Access) -> Result<(), AuthError> {
        if !valid_name(name) {
            return Err(AuthError::BadName(name.to_owned()));
        }
        let hash = hash_password(password)?;
        self.users.insert(name.to_owned(), Entry { hash, access });
        Ok(())
    }

    /// The file text for this database (sorted by name).
    pub fn render(&self) -> String {
        let mut names: Vec<&String> = self.users.keys().collect();
        names.sort();
        let mut out = String::from("# xftp users: name:argon2-hash:rw|ro\n");
        for n in names {
            let e = &self.users[n];
            let acc = match e.access {
                Access::ReadOnly => "ro",
                Access::ReadWrite => "rw",
            };
            out.push_str(&format!("{n}:{}:{acc}\n", e.hash));
        }
        out
    }

    /// Check a password; `Some(access)` when it matches. Slow on purpose
    /// (Argon2): call it off the async executor.
    pub fn verify(&self, name: &str, password: &str) -> Option<Access> {
        // An unknown name costs the same Argon2 work as a wrong password,
        // so the time of the 530 does not tell which names exist.
        static UNKNOWN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let (phc, access) = match self.users.get(name) {
            Some(e) => (e.hash.as_str(), Some(e.access)),
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
        access.filter(|_| ok)
    }

    /// True if `name` is a known user (used to pick the reply to USER).
    pub fn contains(&self, name: &str) -> bool {
        self.users.contains_key(name)
    }
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
    }
}
