//! xftp-proto
