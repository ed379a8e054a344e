//! xftp-netem
