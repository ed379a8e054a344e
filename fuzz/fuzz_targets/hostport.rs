//! PORT, EPRT, MPRT, 227 and 229 texts; what parses must format and parse back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_proto::hostport::fuzz_hostport(data));
