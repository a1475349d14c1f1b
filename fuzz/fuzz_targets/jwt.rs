//! `flowgate_server::fuzzing::jwt` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_server::fuzzing::jwt(data));
