//! Virtual paths: what a client names, resolved against its working
//! directory inside a served root, without touching the file system.
//!
//! The virtual namespace has `/` as the served root; `..` at the root
//! stays at the root, so no sequence of components can climb out. The
//! server still checks symbolic links on the real file system (a link
//! inside the root may point outside it); that part needs I/O and lives
//! in the server.

use crate::error::ProtoError;

/// An absolute, normalised virtual path: a list of non-empty components,
/// none of which is `.` or `..` or contains `/` or NUL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct VPath {
    parts: Vec<Vec<u8>>,
}

impl VPath {
    /// The root, `/`.
    pub fn root() -> Self {
        Self::default()
    }

    /// The components, outermost first.
    pub fn components(&self) -> &[Vec<u8>] {
        &self.parts
    }

    /// True for `/`.
    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The last component, if any.
    pub fn file_name(&self) -> Option<&[u8]> {
        self.parts.last().map(Vec::as_slice)
    }

    /// The parent directory (the root is its own parent).
    pub fn parent(&self) -> VPath {
        let mut p = self.clone();
        p.parts.pop();
        p
    }

    /// A child path.
    pub fn join(&self, name: &[u8]) -> Result<VPath, ProtoError> {
        self.resolve(name)
    }

    /// Resolve a client-supplied path against `self` (the working directory).
    /// Absolute arguments start from the root. Backslashes are ordinary
    /// bytes (a file may be called `a\b` on Unix).
    pub fn resolve(&self, arg: &[u8]) -> Result<VPath, ProtoError> {
        if arg.contains(&0) {
            return Err(ProtoError::BadPath("NUL byte in path"));
        }
        let mut parts = if arg.first() == Some(&b'/') {
            Vec::new()
        } else {
            self.parts.clone()
        };
        for comp in arg.split(|b| *b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => {
                    parts.pop();
                }
                c => parts.push(c.to_vec()),
            }
        }
        Ok(VPath { parts })
    }

    /// The wire form, `/a/b` (bytes; not necessarily UTF-8).
    pub fn to_bytes(&self) -> Vec<u8> {
        if self.parts.is_empty() {
            return b"/".to_vec();
        }
        let mut out = Vec::new();
        for p in &self.parts {
            out.push(b'/');
            out.extend_from_slice(p);
        }
        out
    }

    /// The wire form as text for replies: a byte that is not UTF-8 is
    /// carried as its private-use escape ([`crate::name`]), which
    /// [`crate::Reply::encode`] turns back into the byte. A lossy form
    /// (U+FFFD) sent `257 "/l\u{FFFD}d"` for `/l\xe9d`, and a client
    /// building paths from it reached another directory.
    pub fn display(&self) -> String {
        crate::name::decode(&self.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cwd: &str, arg: &str) -> String {
        VPath::root()
            .resolve(cwd.as_bytes())
            .unwrap()
            .resolve(arg.as_bytes())
            .unwrap()
            .display()
    }

    #[test]
    fn relative_and_absolute() {
        assert_eq!(r("/", "a/b"), "/a/b");
        assert_eq!(r("/x", "a"), "/x/a");
        assert_eq!(r("/x", "/a"), "/a");
        assert_eq!(r("/x/y", ".."), "/x");
        assert_eq!(r("/x", "./a//b/."), "/x/a/b");
    }

    #[test]
    fn dotdot_cannot_escape() {
        assert_eq!(r("/", ".."), "/");
        assert_eq!(r("/", "../../../etc/passwd"), "/etc/passwd");
        assert_eq!(r("/a", "../../.."), "/");
        assert_eq!(r("/a", "b/../../../c"), "/c");
    }

    #[test]
    fn nul_rejected() {
        assert!(VPath::root().resolve(b"a\0b").is_err());
    }

    proptest::proptest! {
        #[test]
        fn resolved_paths_are_normal(cwd in "[a-z./]{0,20}", arg in "[a-z./]{0,30}") {
            let p = VPath::root().resolve(cwd.as_bytes()).unwrap().resolve(arg.as_bytes()).unwrap();
            for c in p.components() {
                proptest::prop_assert!(!c.is_empty() && c != b"." && c != b".." && !c.contains(&b'/'));
            }
        }
    }
}
