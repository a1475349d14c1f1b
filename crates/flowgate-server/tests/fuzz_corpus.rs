//! Every committed fuzzing input (`fuzz/corpus/<target>/` and the crashes kept in
//! `fuzz/regressions/<target>/`) through the fuzz targets' entry points, on stable: what the
//! fuzzers found stays found.

use std::path::{Path, PathBuf};

use flowgate_testing::fuzzing;

/// A fuzz target's entry point.
type Entry = fn(&[u8]);

/// The targets and their entry points (the names of `fuzz/fuzz_targets/*.rs`).
const TARGETS: &[(&str, Entry)] = &[
    ("config", fuzzing::config),
    ("rls_proto", fuzzing::rls_proto),
    ("json", fuzzing::json),
    ("client_ip", fuzzing::client_ip),
    ("jwt", fuzzing::jwt),
    ("ws_message", fuzzing::ws_message),
    ("gateway_head", fuzzing::gateway_head),
    ("ws_frames", fuzzing::ws_frames),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_and_regression_input_runs_clean() {
    let mut total = 0;
    for (target, run) in TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(target));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{target} is empty or missing: the target's corpus must be committed"
        );
        let regressions = files(&fuzz_dir().join("regressions").join(target));
        for file in corpus.iter().chain(&regressions) {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} panicked", file.display());
            total += 1;
        }
    }
    eprintln!(
        "fuzz corpus: {total} inputs through {} targets",
        TARGETS.len()
    );
}
