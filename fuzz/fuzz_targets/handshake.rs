//! The parallel pipe's hello and reply decoders; what decodes must encode back.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_psock::handshake::fuzz_handshake(data));
