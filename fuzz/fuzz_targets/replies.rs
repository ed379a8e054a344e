//! Server replies through the incremental reply parser; what parses must encode and parse back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_proto::reply::fuzz_replies(data));
