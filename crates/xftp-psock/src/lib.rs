//! xftp-psock
