//! `flowgate_testing::fuzzing::client_ip` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_testing::fuzzing::client_ip(data));
