//! xftp-client
