//! `flowgate_testing::fuzzing::gateway_head` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_testing::fuzzing::gateway_head(data));
