//! `flowgate_server::fuzzing::json` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_server::fuzzing::json(data));
