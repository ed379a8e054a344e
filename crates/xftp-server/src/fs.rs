//! The served root on the real file system: mapping virtual paths to real
//! ones without letting symbolic links lead outside, and listing formats.

use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use xftp_proto::path::VPath;

/// Why a path cannot be used. Each maps to one FTP reply (see `code`).
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Nothing by that name (550).
    #[error("No such file or directory")]
    NotFound,
    /// The path resolves outside the root through a symbolic link (550).
    #[error("Permission denied (outside the served root, or the login's home)")]
    Outside,
    /// A symbolic link to nothing where a file would be written through
    /// it (553): where it leads cannot be checked before it exists.
    #[error("Permission denied (symbolic link to nothing)")]
    DanglingLink,
    /// A directory where a file was needed (550).
    #[error("Is a directory")]
    IsDir,
    /// A file where a directory was needed (550).
    #[error("Not a directory")]
    NotDir,
    /// Target exists (550 for MKD).
    #[error("File exists")]
    Exists,
    /// A name of the server's own temporaries of uploads in progress
    /// (553): listings hide them, and a sweep removes those a dead upload
    /// left.
    #[error("Names of the form .NAME.xftp-part-<16 hex digits> are the server's temporaries of uploads in progress; choose another name")]
    Reserved,
    /// A new name with a line break (CR or LF): no listing could show it,
    /// nor a client name it again (550, 553 for STOR).
    #[error("A name with a line break cannot be listed; choose another name")]
    LineBreak,
    /// Any other I/O error (451 or 550 depending on the command).
    #[error("{}", io_text(.0))]
    Io(#[from] std::io::Error),
}

/// Whether the server's user may search (enter) the directory `p`
/// (`access(2)`, `X_OK`).
pub fn can_enter(p: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path, read only.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An OS error in words a client's user can act on, without the errno
/// ("Permission denied", not "Permission denied (os error 13)").
pub fn io_text(e: &std::io::Error) -> String {
    let words = match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => "Permission denied",
        Some(libc::ENOENT) => "No such file or directory",
        Some(libc::ENOTDIR) => "Not a directory (a part of the path is a file)",
        Some(libc::EISDIR) => "Is a directory",
        Some(libc::ENOTEMPTY) => "Directory not empty",
        Some(libc::EEXIST) => "File exists",
        Some(libc::EINVAL) => "Invalid argument",
        Some(libc::ENOSPC) => "No space left on the server's disk",
        Some(libc::EDQUOT) => "Disk quota exceeded",
        Some(libc::EROFS) => "Read-only file system",
        Some(libc::ENAMETOOLONG) => "File name too long",
        Some(libc::ELOOP) => "Too many levels of symbolic links",
        Some(libc::EBUSY) => "Device or resource busy",
        Some(libc::EXDEV) => "Cannot move across file systems",
        _ => {
            let t = e.to_string();
            return match t.find(" (os error") {
                Some(i) => t[..i].to_owned(),
                None => t,
            };
        }
    };
    words.to_owned()
}

impl FsError {
    /// As an `io::Error` (its own where it is one).
    pub fn into_io(self) -> std::io::Error {
        match self {
            FsError::Io(e) => e,
            FsError::NotFound => std::io::ErrorKind::NotFound.into(),
            e => std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
        }
    }

    /// Map an io::Error of a lookup to the matching variant.
    pub fn from_io(e: std::io::Error) -> FsError {
        match e.kind() {
            std::io::ErrorKind::NotFound => FsError::NotFound,
            _ => match e.raw_os_error() {
                Some(libc::ENOTDIR) => FsError::NotDir,
                Some(libc::EISDIR) => FsError::IsDir,
                Some(libc::EEXIST) => FsError::Exists,
                _ => FsError::Io(e),
            },
        }
    }
}

/// The served directory.
#[derive(Debug, Clone)]
pub struct Root {
    real: PathBuf,
}

/// `.NAME.xftp-part-` and 16 hex digits: a temporary of an upload in
/// progress (`transfer::Upload::begin`; not a client's resumable partial,
/// `.NAME.xftp-part`).
pub fn is_upload_temp(name: &[u8]) -> bool {
    const MARK: &[u8] = b".xftp-part-";
    name.len() > 1 + MARK.len() + 16 && name[0] == b'.' && {
        let (head, tag) = name.split_at(name.len() - 16);
        head.ends_with(MARK) && tag.iter().all(u8::is_ascii_hexdigit)
    }
}

impl Root {
    /// Open a root; it must exist and be a directory.
    pub fn new(dir: &Path) -> std::io::Result<Root> {
        let real = std::fs::canonicalize(dir)?;
        if !real.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(Root { real })
    }

    /// The canonical real path of the root.
    pub fn path(&self) -> &Path {
        &self.real
    }

    fn join(&self, v: &VPath) -> PathBuf {
        let mut p = self.real.clone();
        for c in v.components() {
            p.push(OsStr::from_bytes(c));
        }
        p
    }

    fn check_inside(&self, canon: &Path) -> Result<(), FsError> {
        if canon.starts_with(&self.real) {
            Ok(())
        } else {
            Err(FsError::Outside)
        }
    }

    /// The real path of an existing object, with every symbolic link
    /// resolved and checked to stay inside the root.
    pub fn existing(&self, v: &VPath) -> Result<PathBuf, FsError> {
        let canon = std::fs::canonicalize(self.join(v)).map_err(FsError::from_io)?;
        self.check_inside(&canon)?;
        Ok(canon)
    }

    /// The real path for an object that may not exist yet (STOR, MKD,
    /// RNTO): its parent must exist inside the root; the last component is
    /// appended as is (a rename onto it replaces a link, never its target).
    pub fn creatable(&self, v: &VPath) -> Result<PathBuf, FsError> {
        if v.file_name().is_some_and(is_upload_temp) {
            return Err(FsError::Reserved);
        }
        self.named(v)
    }

    /// The real path of `v` (its parent resolved, inside the root), for
    /// [`Root::creatable`] and [`Root::entry`].
    fn named(&self, v: &VPath) -> Result<PathBuf, FsError> {
        let name = v.file_name().ok_or(FsError::Exists)?;
        if name.iter().any(|b| matches!(b, b'\r' | b'\n')) {
            return Err(FsError::LineBreak);
        }
        // Said now rather than when an upload's data has arrived and its
        // temporary is renamed (NAME_MAX on Linux's file systems).
        if name.len() > 255 {
            return Err(FsError::Io(std::io::Error::from_raw_os_error(
                libc::ENAMETOOLONG,
            )));
        }
        let parent = self.existing(&v.parent())?;
        if !parent.is_dir() {
            return Err(FsError::NotDir);
        }
        Ok(parent.join(OsStr::from_bytes(name)))
    }

    /// The real path of a file to write in place (APPE, STOR after REST):
    /// as [`Root::creatable`], but a symbolic link as the last component is
    /// followed, and its target must be inside the root. Writing in place
    /// opens the file, which follows links, unlike STOR's rename onto the
    /// name. A link to nothing is refused: what it would create could be
    /// anywhere.
    pub fn in_place(&self, v: &VPath) -> Result<PathBuf, FsError> {
        let p = self.creatable(v)?;
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => match std::fs::canonicalize(&p) {
                Ok(real) => {
                    self.check_inside(&real)?;
                    Ok(real)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(FsError::DanglingLink),
                Err(e) => Err(FsError::from_io(e)),
            },
            _ => Ok(p),
        }
    }

    /// The real path of an object to delete or rename (the link itself,
    /// not its target, when the last component is a symbolic link).
    pub fn entry(&self, v: &VPath) -> Result<PathBuf, FsError> {
        // A dead upload's temporary may be deleted by name.
        let p = self.named(v)?;
        std::fs::symlink_metadata(&p).map_err(FsError::from_io)?;
        Ok(p)
    }

    /// Whether what `fd` refers to is inside the root, by the path the
    /// kernel has for it now. The paths above were checked before use;
    /// between the check and the use a directory on the way can be
    /// renamed, or swapped for a link leading out (by another session's
    /// RNTO of a link, or a local user). What was opened is what is
    /// used, so checking it after opening closes that window.
    pub fn check_fd(&self, fd: BorrowedFd<'_>) -> Result<(), FsError> {
        let p = std::fs::read_link(proc_path(fd)).map_err(FsError::from_io)?;
        self.check_inside(&p)
    }

    /// Open the plain file `p` (a path checked by the methods above) for
    /// reading, through its pinned directory, and check what was opened
    /// ([`Root::open_in`]).
    pub fn open_read(&self, p: &Path) -> std::io::Result<std::fs::File> {
        self.open_in(p, std::fs::OpenOptions::new().read(true), 0)
    }

    /// [`open_plain`] of `p` through its directory pinned inside the root
    /// ([`Root::pin_parent`]), and what was opened checked inside the root
    /// too ([`Root::check_fd`]: a link as the last component, if `flags`
    /// lets it be followed).
    pub fn open_in(
        &self,
        p: &Path,
        opts: &mut std::fs::OpenOptions,
        flags: i32,
    ) -> std::io::Result<std::fs::File> {
        let (dir, name) = self.pin_parent(p).map_err(FsError::into_io)?;
        let f = open_plain(&proc_path(dir.as_fd()).join(name), opts, flags)?;
        self.check_fd(f.as_fd()).map_err(FsError::into_io)?;
        Ok(f)
    }

    /// `p` ([`Root::existing`]) opened as a handle (`O_PATH`) and checked
    /// inside the root ([`Root::check_fd`]): changed through
    /// [`proc_path`], the object is the one checked.
    pub fn pin(&self, p: &Path) -> Result<OwnedFd, FsError> {
        let fd = open_handle(p, 0)?;
        self.check_fd(fd.as_fd())?;
        Ok(fd)
    }

    /// The metadata of `p` ([`Root::existing`]) read through a pinned
    /// handle ([`Root::pin`]): SIZE, MDTM, MLST and listings describe the
    /// object checked, not whatever a swapped directory on the way leads
    /// to since.
    pub fn stat(&self, p: &Path) -> Result<Metadata, FsError> {
        let fd = self.pin(p)?;
        std::fs::metadata(proc_path(fd.as_fd())).map_err(FsError::from_io)
    }

    /// The directory holding `p` ([`Root::creatable`], [`Root::entry`])
    /// opened as a handle and checked inside the root, and `p`'s last
    /// component: made, removed or renamed relative to that handle
    /// ([`mkdir_at`], [`unlink_at`], [`rename_at`]), it stays inside
    /// whatever is renamed in the tree meanwhile.
    pub fn pin_parent<'a>(&self, p: &'a Path) -> Result<(OwnedFd, &'a OsStr), FsError> {
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            return Err(FsError::Outside);
        };
        let fd = open_handle(dir, libc::O_DIRECTORY)?;
        self.check_fd(fd.as_fd())?;
        Ok((fd, name))
    }
}

/// `/proc/self/fd/N` for `fd`: a path that reaches the object `fd` was
/// opened on, whatever happened to its names since.
pub fn proc_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn c_path(p: &[u8]) -> Result<std::ffi::CString, FsError> {
    std::ffi::CString::new(p).map_err(|_| {
        FsError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a NUL byte in the path",
        ))
    })
}

/// `open(p, O_PATH | extra)`: a handle on the object, nothing read.
fn open_handle(p: &Path, extra: i32) -> Result<OwnedFd, FsError> {
    let c = c_path(p.as_os_str().as_bytes())?;
    // SAFETY: `c` is a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | extra) };
    if fd < 0 {
        return Err(FsError::from_io(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn os_result(r: libc::c_int) -> Result<(), FsError> {
    if r < 0 {
        Err(FsError::from_io(std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// `mkdirat(dir, name, 0777)` (less the umask).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(), FsError> {
    let c = c_path(name.as_bytes())?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    os_result(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o777) })
}

/// `unlinkat(dir, name)`: a file (or link), or with `is_dir` an empty
/// directory. A directory named as a file is [`FsError::IsDir`].
pub fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr, is_dir: bool) -> Result<(), FsError> {
    let c = c_path(name.as_bytes())?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: a valid descriptor and a NUL-terminated name.
    os_result(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) })
}

/// `renameat(from_dir, from, to_dir, to)`.
pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &OsStr,
    to_dir: BorrowedFd<'_>,
    to: &OsStr,
) -> Result<(), FsError> {
    let (a, b) = (c_path(from.as_bytes())?, c_path(to.as_bytes())?);
    // SAFETY: valid descriptors and NUL-terminated names.
    os_result(unsafe {
        libc::renameat(
            from_dir.as_raw_fd(),
            a.as_ptr(),
            to_dir.as_raw_fd(),
            b.as_ptr(),
        )
    })
}

/// Open `p` only if it is a regular file (`opts` and `flags` say how),
/// without blocking ([`xftp_stripe::open_regular`]): a FIFO in the served
/// tree would otherwise hold the thread that opens it until its other end
/// comes, and a few such opens stall every session.
pub fn open_plain(
    p: &Path,
    opts: &mut std::fs::OpenOptions,
    flags: i32,
) -> std::io::Result<std::fs::File> {
    xftp_stripe::open_regular(p, opts, flags)?
        .ok_or_else(|| std::io::Error::other("not a plain file"))
}

/// Seconds since the epoch of a metadata's mtime, negative before 1970
/// (0 if unknown).
pub fn mtime_secs(md: &Metadata) -> i64 {
    md.modified().map_or(0, xftp_proto::facts::epoch_secs)
}

/// `YYYYMMDDHHMMSS` in UTC (RFC 3659) of whole seconds.
pub fn mdtm_string(secs: i64) -> String {
    xftp_proto::facts::format_time(secs)
}

fn ls_date(secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d) = xftp_proto::facts::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let month = MONTHS[(mo as usize).saturating_sub(1).min(11)];
    // ls shows the time for files from the last six months, else the year.
    if (now - secs).abs() < 182 * 86_400 {
        format!("{month} {d:>2} {:02}:{:02}", s / 3600, s % 3600 / 60)
    } else {
        format!("{month} {d:>2}  {y}")
    }
}

fn mode_string(md: &Metadata) -> String {
    use std::os::unix::fs::FileTypeExt;
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        'd'
    } else if ft.is_symlink() {
        'l'
    } else if ft.is_fifo() {
        'p'
    } else if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else if ft.is_socket() {
        's'
    } else {
        '-'
    };
    let mode = md.permissions().mode();
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// One `ls -l` style line (LIST), without CRLF. Name bytes are kept as is.
/// `link_to`: the entry is a symbolic link to a directory, `md` that
/// directory's, listed as `l... name -> target` (the target's path in the
/// root).
pub fn list_line(name: &[u8], md: &Metadata, link_to: Option<&[u8]>) -> Vec<u8> {
    let mut mode = mode_string(md);
    if link_to.is_some() {
        mode.replace_range(0..1, "l");
    }
    let mut line = format!(
        "{} {:>3} {:<8} {:<8} {:>12} {} ",
        mode,
        md.nlink(),
        md.uid(),
        md.gid(),
        md.len(),
        ls_date(mtime_secs(md))
    )
    .into_bytes();
    line.extend_from_slice(name);
    if let Some(t) = link_to {
        line.extend_from_slice(b" -> ");
        line.extend_from_slice(t);
    }
    line
}

/// Whether the server's user has `bit` (4 read, 2 write, 1 search) on
/// what `md` describes, by its mode: root has all, but search on a file
/// only where some x bit is set (as the kernel has it).
fn may(md: &Metadata, bit: u32) -> bool {
    use std::sync::OnceLock;
    static ME: OnceLock<(u32, Vec<u32>)> = OnceLock::new();
    let (uid, gids) = ME.get_or_init(|| {
        // SAFETY: geteuid, getegid and getgroups have no preconditions;
        // getgroups writes at most `n` entries into a buffer of `n`.
        unsafe {
            let mut gids = vec![libc::getegid()];
            let n = libc::getgroups(0, std::ptr::null_mut());
            if n > 0 {
                let mut more = vec![0 as libc::gid_t; n as usize];
                let got = libc::getgroups(n, more.as_mut_ptr());
                more.truncate(got.max(0) as usize);
                gids.extend(more);
            }
            (libc::geteuid(), gids)
        }
    });
    let mode = md.mode();
    if *uid == 0 {
        return bit != 1 || md.is_dir() || mode & 0o111 != 0;
    }
    let shift = if md.uid() == *uid {
        6
    } else if gids.contains(&md.gid()) {
        3
    } else {
        0
    };
    (mode >> shift) & bit != 0
}

/// RFC 3659 facts for MLSD/MLST, without the name: `type=file;size=..;...; `.
/// The facts MLST and MLSD give, in order (RFC 3659 7.5; `OPTS MLST`
/// selects among them).
pub const MLST_FACTS: [&str; 6] = ["type", "size", "modify", "perm", "UNIX.mode", "unique"];

/// A selection of [`MLST_FACTS`], one bit each in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FactSet(u8);

impl FactSet {
    /// Every fact: the default.
    pub const ALL: FactSet = FactSet((1 << MLST_FACTS.len()) - 1);

    /// The facts `OPTS MLST` names (`type;size;`, any case); names not
    /// offered are ignored, as RFC 3659 7.9 has it.
    pub fn parse(list: &str) -> FactSet {
        let mut bits = 0;
        for name in list.split(';').map(str::trim) {
            if let Some(i) = MLST_FACTS.iter().position(|f| f.eq_ignore_ascii_case(name)) {
                bits |= 1 << i;
            }
        }
        FactSet(bits)
    }

    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }

    /// `type;size;` for OPTS's reply; FEAT's list with `*` on these.
    pub fn names(self) -> String {
        MLST_FACTS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.has(*i))
            .map(|(_, f)| format!("{f};"))
            .collect()
    }

    /// FEAT's `MLST` line: every fact, the selected ones marked `*`.
    pub fn feat(self) -> String {
        let facts: String = MLST_FACTS
            .iter()
            .enumerate()
            .map(|(i, f)| format!("{f}{};", if self.has(i) { "*" } else { "" }))
            .collect();
        format!("MLST {facts}")
    }

    /// `facts` ([`mlsx_facts`]) cut to this selection.
    pub fn select(self, facts: String) -> String {
        if self == FactSet::ALL {
            return facts;
        }
        let mut out: String = facts
            .trim_end()
            .split(';')
            .filter(|f| {
                let name = f.split('=').next().unwrap_or("");
                MLST_FACTS
                    .iter()
                    .position(|k| k.eq_ignore_ascii_case(name))
                    .is_some_and(|i| self.has(i))
            })
            .map(|f| format!("{f};"))
            .collect();
        out.push(' ');
        out
    }
}

pub fn mlsx_facts(md: &Metadata, writable: bool, kind_override: Option<&str>) -> String {
    // RFC 3659 7.5.1: what is neither a file nor a directory is an
    // OS.name=type fact, not a file a client would try to fetch.
    let special = {
        use std::os::unix::fs::FileTypeExt;
        let ft = md.file_type();
        if ft.is_fifo() {
            Some("OS.unix=fifo")
        } else if ft.is_char_device() {
            Some("OS.unix=chr")
        } else if ft.is_block_device() {
            Some("OS.unix=blk")
        } else if ft.is_socket() {
            Some("OS.unix=socket")
        } else {
            None
        }
    };
    let kind = kind_override.unwrap_or(if md.is_dir() {
        "dir"
    } else {
        special.unwrap_or("file")
    });
    let perm = match (md.is_dir(), writable) {
        _ if special.is_some() && kind_override.is_none() => {
            if writable {
                "df"
            } else {
                ""
            }
        }
        (true, true) => "elcdmfp",
        (true, false) => "el",
        (false, true) => "radfw",
        (false, false) => "r",
    };
    // What the file's own mode lets the server's user do, too: a file of
    // mode 000 is not `r` (RETR fails), a directory without x not `e`.
    let perm: String = perm
        .chars()
        .filter(|c| match c {
            'r' | 'l' => may(md, 4),
            'a' | 'w' => may(md, 2),
            'c' | 'm' | 'p' => may(md, 2) && may(md, 1),
            'e' => may(md, 1),
            _ => true,
        })
        .collect();
    // `unique` (RFC 3659 7.5.2): one value for every name of an object,
    // so that a client walking a tree sees a loop through a link.
    format!(
        "type={kind};size={};modify={};perm={perm};UNIX.mode=0{:o};unique={:x}g{:x}; ",
        md.len(),
        // With milliseconds, as MDTM: a client mirroring or resuming a
        // tree tells a file rewritten within the same second.
        md.modified()
            .map_or_else(|_| mdtm_string(0), xftp_proto::facts::format_time_ms),
        md.permissions().mode() & 0o7777,
        md.dev(),
        md.ino()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(mdtm_string(0), "19700101000000");
        assert_eq!(mdtm_string(951_782_400), "20000229000000");
        assert_eq!(mdtm_string(1_700_000_000), "20231114221320");
    }

    #[test]
    fn writing_in_place_follows_links_only_inside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::fs::write(dir.path().join("file"), b"f").unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap()
        };
        link(&outside.path().join("secret"), "out");
        link(&outside.path().join("new"), "dangling-out");
        link(Path::new("missing"), "dangling-in");
        link(Path::new("file"), "in");
        let root = Root::new(dir.path()).unwrap();
        let v = |s: &str| VPath::root().join(s.as_bytes()).unwrap();
        assert!(matches!(root.in_place(&v("out")), Err(FsError::Outside)));
        assert!(matches!(
            root.in_place(&v("dangling-out")),
            Err(FsError::DanglingLink)
        ));
        assert!(matches!(
            root.in_place(&v("dangling-in")),
            Err(FsError::DanglingLink)
        ));
        let real = root.path().join("file");
        assert_eq!(root.in_place(&v("in")).unwrap(), real);
        assert_eq!(root.in_place(&v("file")).unwrap(), real);
        assert_eq!(root.in_place(&v("new")).unwrap(), root.path().join("new"));
    }

    #[test]
    fn symlink_outside_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("pw")).unwrap();
        std::fs::write(dir.path().join("ok"), b"y").unwrap();
        let root = Root::new(dir.path()).unwrap();
        let v = |s: &str| VPath::root().resolve(s.as_bytes()).unwrap();
        assert!(matches!(
            root.existing(&v("/link/secret")),
            Err(FsError::Outside)
        ));
        assert!(matches!(root.existing(&v("/pw")), Err(FsError::Outside)));
        assert!(matches!(
            root.creatable(&v("/link/new")),
            Err(FsError::Outside)
        ));
        assert!(root.existing(&v("/ok")).is_ok());
        assert!(matches!(
            root.existing(&v("/missing")),
            Err(FsError::NotFound)
        ));
        // Deleting the link itself is fine: it removes the link, not the target.
        assert!(root.entry(&v("/pw")).is_ok());
    }

    /// A directory swapped for a link leading out between the check of a
    /// path and its use (another session renaming a link over it, a local
    /// user): what is opened, made, removed or renamed is checked where
    /// it is, not where the name led at the check.
    #[test]
    fn mlsx_perm_says_what_a_login_may_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let perm = |p: &Path, w: bool| {
            let facts = mlsx_facts(&std::fs::metadata(p).unwrap(), w, None);
            let at = facts.find("perm=").unwrap() + 5;
            facts[at..].split(';').next().unwrap().to_string()
        };
        // RFC 3659 7.5.5: `d` on a directory: RMD may remove it.
        assert_eq!(perm(dir.path(), true), "elcdmfp");
        assert_eq!(perm(dir.path(), false), "el");
        assert_eq!(perm(&dir.path().join("f"), true), "radfw");
        assert_eq!(perm(&dir.path().join("f"), false), "r");
        // The file's own mode counts for the server's user (not for root,
        // which reads and writes whatever the mode).
        use std::os::unix::fs::PermissionsExt;
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(dir.path().join("f"), std::fs::Permissions::from_mode(0o000))
            .unwrap();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let f = perm(&dir.path().join("f"), true);
        assert_eq!(f, if root { "radfw" } else { "df" });
        assert_eq!(perm(&sub, true), if root { "elcdmfp" } else { "ldf" });
    }

    #[test]
    fn times_before_1970_are_told_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("old");
        std::fs::write(&f, b"x").unwrap();
        // 1969-12-31 23:59:59, where the file system keeps it.
        let t = UNIX_EPOCH - std::time::Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(t)
            .unwrap();
        let md = std::fs::metadata(&f).unwrap();
        if md.modified().unwrap() != t {
            eprintln!("SKIP: this file system does not keep times before 1970");
            return;
        }
        assert_eq!(mtime_secs(&md), -1);
        assert_eq!(mdtm_string(mtime_secs(&md)), "19691231235959");
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_check_is_not_followed() {
        use std::os::fd::AsFd;
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("s.txt"), b"outside").unwrap();
        std::fs::create_dir(outside.path().join("sub")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sw")).unwrap();
        std::fs::write(dir.path().join("sw/s.txt"), b"inside").unwrap();
        std::fs::create_dir(dir.path().join("sw/sub")).unwrap();
        let root = Root::new(dir.path()).unwrap();
        let v = |s: &str| VPath::root().resolve(s.as_bytes()).unwrap();
        // Checked while `sw` is a directory inside.
        let file = root.existing(&v("/sw/s.txt")).unwrap();
        let new = root.creatable(&v("/sw/new")).unwrap();
        let sub = root.entry(&v("/sw/sub")).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"inside");
        // Then swapped.
        std::fs::rename(dir.path().join("sw"), dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("sw")).unwrap();
        let refused = |r: Result<(), FsError>| matches!(r, Err(FsError::Outside));
        assert!(root.open_read(&file).is_err(), "read through the link");
        assert!(refused(root.pin(&file).map(drop)));
        // SIZE, MDTM, MLST and listings read metadata the same way.
        assert!(refused(root.stat(&file).map(drop)));
        let listed = root.existing(&v("/")).unwrap().join("sw");
        assert!(refused(root.stat(&listed).map(drop)));
        assert!(refused(
            root.pin_parent(&new)
                .and_then(|(d, n)| mkdir_at(d.as_fd(), n))
        ));
        assert!(refused(root.pin_parent(&sub).and_then(|(d, n)| unlink_at(
            d.as_fd(),
            n,
            true
        ))));
        let up =
            crate::transfer::Upload::begin(&root, &new, crate::transfer::UploadKind::Replace, 0);
        assert!(up.is_err(), "an upload through the link");
        // Nothing outside was touched.
        assert!(!outside.path().join("new").exists());
        assert!(outside.path().join("sub").is_dir());
        let names: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temporary left outside");
        // Put back, the same paths work.
        std::fs::remove_file(dir.path().join("sw")).unwrap();
        std::fs::rename(dir.path().join("real"), dir.path().join("sw")).unwrap();
        assert_eq!(
            std::io::read_to_string(root.open_read(&file).unwrap()).unwrap(),
            "inside"
        );
        assert_eq!(root.stat(&file).unwrap().len(), 6);
        let (d, n) = root.pin_parent(&new).unwrap();
        mkdir_at(d.as_fd(), n).unwrap();
        assert!(dir.path().join("sw/new").is_dir());
    }
}
