//! The receiver's completion rule against a naive model, under any order
//! of headers, closed streams and stored payloads.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    xftp_stripe::reasm::fuzz_reassembly(data);
});
