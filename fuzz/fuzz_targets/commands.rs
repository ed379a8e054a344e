//! Control-connection lines through the line reader and the command parser.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xftp_proto::command::fuzz_commands(data));
