//! MODE E block headers over a byte stream; a valid header must encode back to its bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_stripe::block::fuzz_decode(data));
