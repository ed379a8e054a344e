//! xftp-server
