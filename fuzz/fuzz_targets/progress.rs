//! The server's STAT progress line; what parses must format and parse back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_tune::meter::fuzz_progress(data));
