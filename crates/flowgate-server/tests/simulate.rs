//! `flowgate simulate`, run as the built binary: the boundary scenario's figures, the SVG
//! parsed by a real XML parser, byte-identical output for the same input, CSV errors that
//! name the line, and a configuration file's rules simulated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

fn simulate(args: &[&str]) -> Output {
    let out = Command::new(FLOWGATE)
        .arg("simulate")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "flowgate simulate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(args: &[&str]) -> Value {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    serde_json::from_slice(&simulate(&all).stdout).unwrap()
}

fn run<'a>(case: &'a Value, label: &str) -> &'a Value {
    case["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no run {label} in {case}"))
}

#[test]
fn the_boundary_spike_passes_a_fixed_window_within_two_seconds_but_not_a_sliding_log() {
    let out = json(&["--scenario", "boundary", "--bucket", "1s"]);
    let case = &out["cases"][0];
    assert_eq!(case["quota"]["limit"], 100);
    assert_eq!(case["offered"], 200);
    let fixed = run(case, "fixed_window");
    assert_eq!(fixed["admitted"], 200);
    assert_eq!(fixed["max_in_window"], 200);
    // All 200 admissions fall in the buckets of 12:00:59 and 12:01:01: within 2 s.
    let admitted: Vec<u64> = fixed["series"]["admitted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let busy: Vec<usize> = (0..admitted.len()).filter(|&i| admitted[i] > 0).collect();
    assert_eq!(busy, [59, 61], "{admitted:?}");
    assert_eq!(admitted[59] + admitted[61], 200);

    let log = run(case, "sliding_log");
    assert!(log["max_in_window"].as_u64().unwrap() <= 100, "{log}");
    assert_eq!(log["admitted"], 100);
    assert_eq!(log["first_denial_ms"], 61_000.0);
    // The shaper delays instead of denying, and reports its waits.
    let shaper = run(case, "shaper");
    assert_eq!(shaper["denied"], 0);
    assert!(shaper["wait_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(run(case, "gcra")["wait_ms"].is_null());
}

#[test]
fn the_svg_is_svg_with_a_panel_and_both_series_per_limiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chart.svg");
    let table = simulate(&["--scenario", "boundary", "--svg", path.to_str().unwrap()]);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the chart is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    assert!(root.attribute("width").unwrap().parse::<u32>().unwrap() > 0);

    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect();
    let limiters = [
        "gcra",
        "leaky_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "shaper",
    ];
    // One panel per limiter, captioned with the same figures as the table.
    let stdout = String::from_utf8(table.stdout).unwrap();
    for limiter in limiters {
        let caption = texts
            .iter()
            .find(|t| t.starts_with(&format!("{limiter}: admitted ")))
            .unwrap_or_else(|| panic!("no panel for {limiter}: {texts:?}"));
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{limiter} ")))
            .unwrap();
        let admitted = row.split_whitespace().nth(1).unwrap();
        assert!(
            caption.contains(&format!("admitted {admitted},")),
            "{caption} / {row}"
        );
    }
    // Each panel has both series in its legend...
    let count = |label: &str| texts.iter().filter(|t| *t == label).count();
    assert_eq!(count("admitted"), limiters.len());
    assert_eq!(count("denied"), limiters.len());
    // ...and bars of both colours: admitted (green) in every panel, denied (red) where any
    // request was denied (all but the fixed window and the shaper).
    let fills = |colour: &str| {
        doc.descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("fill") == Some(colour))
            .count()
    };
    assert!(
        fills("#2E8B57") >= limiters.len() * 2,
        "{}",
        fills("#2E8B57")
    );
    assert!(fills("#D64545") >= 4, "{}", fills("#D64545"));
}

#[test]
fn the_same_input_gives_byte_identical_table_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let mut csv = String::from("timestamp_ms,key,cost\n");
    for i in 0..3000u64 {
        csv.push_str(&format!(
            "{},k{},{}\n",
            1_000 + i * 37 % 20_000,
            i % 7,
            1 + i % 3
        ));
    }
    std::fs::write(&trace, csv).unwrap();
    for args in [
        vec!["--scenario", "bursty", "--seed", "4"],
        vec![
            "--scenario",
            "flash-crowd",
            "--deployments",
            "in-process,hybrid,fallback-local",
        ],
        vec![
            "--trace",
            trace.to_str().unwrap(),
            "--limit",
            "50",
            "--period",
            "10s",
        ],
    ] {
        let outputs: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..2)
            .map(|i| {
                let svg = dir.path().join(format!("{i}.svg"));
                let mut with_svg = args.clone();
                with_svg.extend(["--svg", svg.to_str().unwrap()]);
                let table = simulate(&with_svg).stdout;
                with_svg.extend(["--format", "json"]);
                let json = simulate(&with_svg).stdout;
                (table, json, std::fs::read(&svg).unwrap())
            })
            .collect();
        assert!(!outputs[0].0.is_empty() && !outputs[0].2.is_empty());
        assert!(
            outputs[0] == outputs[1],
            "{args:?} differs between two runs"
        );
    }
}

#[test]
fn csv_errors_name_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.csv");
    std::fs::write(&trace, "timestamp_ms,key,cost\n1000,a,1\n\n1500,b,two\n").unwrap();
    let out = Command::new(FLOWGATE)
        .args(["simulate", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: line 4: cost `two` is not a whole number of units",
            trace.display()
        )),
        "{stderr}"
    );
    // A cost no limiter can grant names its line too.
    std::fs::write(&trace, "1000,a,1\n2000,a,500\n").unwrap();
    let out = Command::new(FLOWGATE)
        .args(["simulate", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 2: a cost of 500 can never be granted by gcra: its capacity is 100"),
        "{stderr}"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_configuration_files_rules_are_simulated_with_their_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: sliding_log}\n  - key: path\n    value: /login\n    rate_limit:\n      name: logins\n      requests_per_unit: 5\n      period: 90s\n      algorithm: gcra\n      burst: 10\n  - key: health\n    rate_limit: {unlimited: true}\n",
    );
    let out = json(&["--config", &config, "--scenario", "boundary"]);
    let cases = out["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2, "{out}");
    let (ip, login) = (&cases[0], &cases[1]);
    assert_eq!(ip["rule"]["path"], "remote_address");
    assert_eq!(ip["rule"]["algorithm"], "sliding_log");
    assert_eq!(ip["quota"]["limit"], 60);
    assert_eq!(ip["quota"]["period_ms"], 60_000.0);
    // The boundary scenario is scaled to each rule: a limit's worth on each side.
    assert_eq!(ip["offered"], 120);
    assert_eq!(run(ip, "sliding_log")["configured"], true);
    assert_eq!(run(ip, "sliding_log")["max_in_window"], 60);
    assert_eq!(run(ip, "fixed_window")["max_in_window"], 120);
    assert_eq!(run(ip, "gcra")["configured"], false);

    assert_eq!(login["rule"]["name"], "logins");
    assert_eq!(login["quota"]["limit"], 5);
    assert_eq!(login["quota"]["burst"], 10);
    assert_eq!(login["quota"]["period_ms"], 90_000.0);
    assert_eq!(run(login, "gcra")["configured"], true);
    // The window algorithms have no separate burst.
    assert_eq!(run(login, "sliding_log")["quota"]["burst"], 5);
    assert_eq!(run(login, "sliding_log")["max_in_window"], 5);
    assert_eq!(
        out["notes"],
        serde_json::json!(["edge: health: unlimited, nothing to simulate"])
    );

    // The table marks the configured algorithm; a broken file is rejected with its line.
    let table = String::from_utf8(simulate(&["--config", &config]).stdout).unwrap();
    assert!(table.contains("edge: path_/login (logins)"), "{table}");
    assert!(
        table.lines().any(|l| l.trim_start().starts_with("gcra *")),
        "{table}"
    );
    let broken = write(
        dir.path(),
        "broken.yaml",
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let out = Command::new(FLOWGATE)
        .args(["simulate", "--config", &broken])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{broken}:4:")), "{stderr}");
}

/// The charts and tables that docs/choosing.md quotes are what `docs/img/regenerate.sh`'s
/// commands give now: a change to a limiter that moves a figure fails here until the script is
/// rerun (and the prose checked).
#[test]
fn the_documented_charts_and_tables_are_up_to_date() {
    let img = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img");
    let script = std::fs::read_to_string(img.join("regenerate.sh")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for line in script.lines() {
        let Some(rest) = line.strip_prefix("sim ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let name = words.next().unwrap();
        let svg = dir.path().join(format!("{name}.svg"));
        let mut args: Vec<&str> = vec!["--quiet"];
        args.extend(words);
        args.extend(["--svg", svg.to_str().unwrap()]);
        let out = simulate(&args);
        let stale = "is stale: run docs/img/regenerate.sh";
        assert!(
            out.stdout == std::fs::read(img.join(format!("{name}.txt"))).unwrap(),
            "docs/img/{name}.txt {stale}"
        );
        assert!(
            std::fs::read(&svg).unwrap() == std::fs::read(img.join(format!("{name}.svg"))).unwrap(),
            "docs/img/{name}.svg {stale}"
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} `sim` lines in regenerate.sh");
}
