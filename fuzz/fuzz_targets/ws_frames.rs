//! `flowgate_testing::fuzzing::ws_frames` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_testing::fuzzing::ws_frames(data));
