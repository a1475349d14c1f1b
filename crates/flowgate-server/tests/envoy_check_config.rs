//! `flowgate check-config` on envoyproxy/ratelimit's configurations.
//!
//! * Committed: every YAML example of envoyproxy/ratelimit's README (main, f2fb157, "Examples"
//!   1 to 11; the README is Apache-2.0), plus files shaped like its `test/config` ones for the
//!   fields added since (`metadata`, `quota_mode`), each must pass `check-config`.
//! * With `FLOWGATE_ENVOY_RATELIMIT_DIR` set to a checkout of envoyproxy/ratelimit, every
//!   `test/config/*.yaml` and `examples/ratelimit/config/*.yaml` file is checked: those the
//!   reference loads must pass, those its own tests expect to fail must fail. Without the
//!   variable that test says so on stderr and checks nothing. The reference's files are not
//!   part of this repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

/// The README's examples, by name.
const README_EXAMPLES: &[(&str, &str)] = &[
    (
        "example1_mongo_cps",
        r#"domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
"#,
    ),
    (
        "example2_messaging",
        r#"domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#,
    ),
    (
        "example3_edge_proxy_per_ip",
        r#"domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#,
    ),
    (
        "example4_flat",
        r#"domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
"#,
    ),
    (
        "example4_nested",
        r#"domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
"#,
    ),
    (
        "example5_internal",
        r#"domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#,
    ),
    (
        "example6_shadow",
        r#"domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"#,
    ),
    (
        "example7_replaces",
        r#"domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#,
    ),
    (
        "example8_detailed",
        r#"domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#,
    ),
    (
        "example9_trailing",
        r#"domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#,
    ),
    (
        "example9_middle",
        r#"domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#,
    ),
    (
        "example9_multiple",
        r#"domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
"#,
    ),
    (
        "example10_value_to_metric",
        r#"domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
"#,
    ),
    (
        "example10_wildcard",
        r#"domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              unit: minute
              requests_per_unit: 100
"#,
    ),
    (
        "example11_share_threshold",
        r#"domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
"#,
    ),
    (
        "example11_metrics",
        r#"domain: example11_metrics
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
"#,
    ),
];

/// Shaped like the reference's `test/config/metadata.yaml` and its quota-mode tests.
const NEW_FIELDS: &str = r#"domain: new-fields
descriptors:
  - key: key1
    metadata:
      key: value
      nested: {a: 1, list: [x, 2.5, false, ~]}
    rate_limit:
      unit: second
      requests_per_unit: 5
  - key: key2
    quota_mode: true
    shadow_mode: false
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key3
    value: "a*b*c"
    share_threshold: true
    detailed_metric: true
    descriptors:
      - key: sub
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 3}
"#;

fn check_config(files: &[PathBuf]) -> Output {
    Command::new(FLOWGATE)
        .arg("check-config")
        .args(files)
        .output()
        .unwrap()
}

#[test]
fn the_readmes_examples_pass_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut examples: Vec<(&str, &str)> = README_EXAMPLES.to_vec();
    examples.push(("new_fields", NEW_FIELDS));
    for (name, yaml) in examples {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let out = check_config(&[path]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn share_threshold_needs_a_wildcard_as_in_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let out = check_config(std::slice::from_ref(&path));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:5:22: `share_threshold`: only for a wildcard value",
            path.display()
        )),
        "{stderr}"
    );
}

/// The reference's files its own tests expect to be refused (`test/config/config_test.go`),
/// alone; `duplicate_domain.yaml` and `merge_domain_key2.yaml` are refused only together with
/// `basic_config.yaml` / `merge_domain_key1.yaml` (a domain in two files).
const REFUSED: &[&str] = &[
    "bad_limit_unit.yaml",
    "bad_yaml.yaml",
    "duplicate_key.yaml",
    "empty_domain.yaml",
    "empty_key.yaml",
    "misspelled_key.yaml",
    "misspelled_key2.yaml",
    "non_map_list.yaml",
    "non_string_key.yaml",
    "replaces_empty.yaml",
    "replaces_self.yaml",
    "unlimited_with_unit.yaml",
];

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_references_own_configurations() {
    let Some(root) = std::env::var_os("FLOWGATE_ENVOY_RATELIMIT_DIR") else {
        eprintln!(
            "SKIPPED the_references_own_configurations: set FLOWGATE_ENVOY_RATELIMIT_DIR to a \
             checkout of envoyproxy/ratelimit to check its test/config and examples files"
        );
        return;
    };
    let root = PathBuf::from(root);
    let tests = yaml_files(&root.join("test/config"));
    let examples = yaml_files(&root.join("examples/ratelimit/config"));
    assert!(
        !tests.is_empty(),
        "no test/config/*.yaml under {}",
        root.display()
    );
    let mut checked = 0;
    for file in tests.iter().chain(&examples) {
        let name = file.file_name().unwrap().to_str().unwrap();
        let out = check_config(std::slice::from_ref(file));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if REFUSED.contains(&name) {
            assert_eq!(
                out.status.code(),
                Some(1),
                "{name} must be refused: {out:?}"
            );
            assert!(
                stderr
                    .lines()
                    .all(|l| l.starts_with(&*file.display().to_string())),
                "{name}: every error names the file: {stderr}"
            );
        } else {
            assert!(out.status.success(), "{name}: {stderr}");
        }
        checked += 1;
    }
    // A domain in two files is refused (no MERGE_DOMAIN_CONFIG).
    for (a, b) in [
        ("basic_config.yaml", "duplicate_domain.yaml"),
        ("merge_domain_key1.yaml", "merge_domain_key2.yaml"),
    ] {
        let dir = root.join("test/config");
        let out = check_config(&[dir.join(a), dir.join(b)]);
        assert_eq!(out.status.code(), Some(1), "{a} + {b}");
    }
    eprintln!("checked {checked} files of {}", root.display());
}
