//! xftp-stripe
