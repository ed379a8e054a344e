//! TCP buffer sizes for the client's data sockets (`--bufsize`); the code
//! lives in `xftp_tune::sockbuf`, shared with the server.

pub use xftp_tune::sockbuf::*;
