//! The `gateway` section's configuration errors: file, line, column and field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use flowgate_server::config::{Policy, Source};

fn config_errors(yaml: &str) -> Vec<String> {
    let source = Source {
        path: PathBuf::from("gw.yaml"),
        text: yaml.to_owned(),
    };
    Policy::from_sources(vec![source])
        .unwrap_err()
        .0
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn gateway_section_errors_name_file_line_column_and_field() {
    let errors = config_errors(
        "domain: d\ngateway:\n  listen: nowhere\n  trusted_proxies: [10.0.0.0/8, ten]\n  ipv6_prefix: 129\n  upstream_timeout: soon\n  descriptors:\n    - [{key: header}]\n    - [{key: cookie}]\n    - [{key: path, header: x}]\n    - [{key: jwt_claim, claim: sub}]\n",
    );
    assert_eq!(
        errors,
        [
            "gw.yaml:3:11: `gateway.listen`: `nowhere` is not an address; write HOST:PORT, e.g. `127.0.0.1:8080` or `localhost:8080`",
            "gw.yaml:4:33: `gateway.trusted_proxies`: `ten` is not a network or address; write e.g. `10.0.0.0/8` or `192.0.2.1`",
            "gw.yaml:5:16: `gateway.ipv6_prefix`: must be between 0 and 128",
            "gw.yaml:6:21: `gateway.upstream_timeout`: `soon` is not a duration (expected number at 0); write e.g. `30s`, `500ms`, `1h30m`",
            "gw.yaml:8:8: `gateway.descriptors.header`: is required with `key: header`",
            "gw.yaml:9:14: `gateway.descriptors.key`: unknown source `cookie`; expected one of remote_address, header, path, method, host, jwt_claim, generic_key",
            "gw.yaml:10:28: `gateway.descriptors.header`: does not apply to `key: path`",
            "gw.yaml:11:14: `gateway.descriptors.key`: `jwt_claim` needs a `gateway.jwt` block saying how tokens are verified",
        ]
    );
    let unknown =
        config_errors("domain: d\ngateway:\n  descriptors: [[{key: path}]]\n  listn: x\n");
    assert!(
        unknown[0].starts_with("gw.yaml:4:3: `gateway`: unknown field `listn`"),
        "{unknown:?}"
    );
    let missing = config_errors("domain: d\ngateway:\n  listen: 127.0.0.1:1\n");
    assert_eq!(
        missing,
        [
            "gw.yaml:3:3: `gateway.descriptors`: is required: the request descriptors to check, e.g. `[[{key: remote_address}]]`"
        ]
    );
    let env = config_errors(
        "domain: d\ngateway:\n  jwt: {hs256_secret_env: FLOWGATE_TEST_UNSET_VARIABLE}\n  descriptors: [[{key: jwt_claim, claim: plan}]]\n",
    );
    assert_eq!(
        env,
        [
            "gw.yaml:3:27: `gateway.jwt.hs256_secret_env`: the environment variable `FLOWGATE_TEST_UNSET_VARIABLE` is not set"
        ]
    );
}

#[test]
fn usage_json_is_a_json_pointer() {
    let errors = config_errors(
        "domain: d\ngateway:\n  usage_json: usage.total_tokens\n  descriptors: [[{key: path}]]\n",
    );
    assert_eq!(
        errors,
        [
            "gw.yaml:3:15: `gateway.usage_json`: `usage.total_tokens` is not a JSON pointer (RFC 6901) to a field; write e.g. `/usage/total_tokens`"
        ]
    );
    let source = Source {
        path: PathBuf::from("gw.yaml"),
        text: "domain: d\ngateway:\n  usage_json: /usage/total_tokens\n  descriptors: [[{key: path}]]\n".to_owned(),
    };
    let policy = Policy::from_sources(vec![source]).unwrap();
    assert_eq!(
        policy.gateway.unwrap().usage_json.as_deref(),
        Some("/usage/total_tokens")
    );
}

#[test]
fn only_one_file_may_have_a_gateway_section() {
    let file = |name: &str, domain: &str| Source {
        path: PathBuf::from(name),
        text: format!("domain: {domain}\ngateway:\n  descriptors: [[{{key: path}}]]\n"),
    };
    let errors = Policy::from_sources(vec![file("a.yaml", "a"), file("b.yaml", "b")]).unwrap_err();
    assert_eq!(
        errors.to_string(),
        "b.yaml:3:3: `gateway`: only one configuration file may have a `gateway` section; a.yaml has one too"
    );
}
