//! `flowgate_testing::fuzzing::rls_proto` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flowgate_testing::fuzzing::rls_proto(data));
