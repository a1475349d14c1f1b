//! The commands the README's tour, docs/service.md's API, in-flight, admin and usage examples and
//! docs/llm-token-budgets.md show, run as shown against the built binary, and what they print compared with what the document shows.
//!
//! How a documented block runs:
//! * Every command runs with `bash -c` from the repository's root (the tour says so), with the
//!   test binary's directory first on `PATH`, so `flowgate` is the binary under test.
//! * A command ending in `&` starts a server. `flowgate serve` gets `FLOWGATE_HTTP`,
//!   `FLOWGATE_GRPC` (and `FLOWGATE_GATEWAY`, `FLOWGATE_WEBSOCKET` when it has a gateway or a
//!   `websocket` section) set to `127.0.0.1:0` — its flags read them, so the command stays as
//!   shown — and the addresses it bound are read from its log. `python3 -m http.server PORT`
//!   runs with port 0 and says which port it got. `cargo run -p example-ws-chat` is that
//!   example's server, run in process on a listener bound to port 0 (a test cannot run cargo).
//!   The upstreams start first: the serve command names them.
//! * A test cannot count on 8080 being free: in every later command the documented addresses
//!   (`localhost:8080`, `127.0.0.1:8081`, `localhost:8000`, `127.0.0.1:8001`, the upstream's
//!   `127.0.0.1:3000`, and the chat's `127.0.0.1:3001` in a copy of `docs/tour/chat.yaml`) are
//!   replaced by the bound ones, and `/tmp/site` by a directory of the test's own. Nothing else
//!   in a command changes.
//! * The `#` lines under a command are its output: each must match a line it prints, in
//!   order (lines in between are not documented), `…` standing for any text and a run of
//!   spaces for any whitespace. A ```json block right after a ```sh block is what the block's
//!   last command prints: the same JSON, except that `"...": "..."` stands for any other
//!   fields and `…` in a string for any text. Every command must exit 0.
//! * `export NAME=VALUE` sets `NAME` for the commands and servers after it, as in a shell.
//!
//! curl and python3 must be on `PATH`; without them the test says so loudly and passes,
//! unless `FLOWGATE_REQUIRE_DOC_TOOLS=1` (CI), which makes it fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_testing::binary::Serving;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

/// The repository's root, where the tour's commands run.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One documented command and the output lines documented under it.
#[derive(Debug)]
struct Step {
    /// The command, continuation lines joined as the shell joins them.
    command: String,
    /// The `# ` lines that follow it.
    output: Vec<String>,
    /// The ```json block that follows its block, when it is the block's last command.
    json: Option<String>,
}

impl Step {
    /// A server to start (`&` at the end) rather than a command to run.
    fn background(&self) -> Option<&str> {
        self.command.trim_end().strip_suffix('&').map(str::trim_end)
    }
}

/// The ```sh blocks of `text` between the headings `from` and `to`, as steps.
fn steps(text: &str, from: &str, to: &str) -> Vec<Step> {
    let start = text.find(from).unwrap_or_else(|| panic!("no {from:?}"));
    let end = start
        + text[start..]
            .find(to)
            .unwrap_or_else(|| panic!("no {to:?}"));
    parse(&text[start..end])
}

/// The ```sh block of `text` that holds `needle`, as steps; with the ```json block that
/// follows it, if one does, as its last command's output.
fn block_with(text: &str, needle: &str) -> Vec<Step> {
    let at = text.find(needle).unwrap_or_else(|| panic!("no {needle:?}"));
    let start = text[..at].rfind("```sh\n").expect("a ```sh block");
    let end = at + text[at..].find("\n```\n").expect("the block's end") + "\n```\n".len();
    let mut steps = parse(&text[start..end]);
    if let Some(json) = text[end..].trim_start().strip_prefix("```json\n") {
        let json = &json[..json.find("\n```").expect("the json block's end")];
        steps.last_mut().expect("a command").json = Some(json.to_owned());
    }
    steps
}

/// The steps of the ```sh blocks in `text`.
fn parse(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(output) = line.strip_prefix("# ") {
            steps
                .last_mut()
                .expect("output under a command")
                .output
                .push(output.to_owned());
            continue;
        }
        let line = without_comment(line);
        match line.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
            }
            None => {
                pending.push_str(line);
                // A quoted argument that spans lines (a JSON body) goes on to the next line.
                if pending.matches('\'').count() % 2 == 1 {
                    pending.push('\n');
                    continue;
                }
                steps.push(Step {
                    command: std::mem::take(&mut pending),
                    output: Vec::new(),
                    json: None,
                });
            }
        }
    }
    steps
}

/// `line` without a trailing `# comment` (a `#` after whitespace, outside quotes).
fn without_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => {
                return line[..at].trim_end();
            }
            _ => {}
        }
        previous = c;
    }
    line
}

/// Whether `actual` matches the documented line `doc` (`…`: any text; whitespace runs: any
/// whitespace).
fn matches(doc: &str, actual: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (doc, actual) = (squeeze(doc), squeeze(actual));
    let parts: Vec<&str> = doc.split('…').collect();
    let mut rest = actual.as_str();
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(after) = rest.strip_prefix(part) else {
                return false;
            };
            rest = after;
        } else if i == parts.len() - 1 {
            return part.is_empty() || rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// Whether the documented `lines` appear in `output`, in order.
fn documented_in(lines: &[String], output: &str) -> bool {
    let mut actual = output.lines();
    lines
        .iter()
        .all(|doc| actual.by_ref().any(|line| matches(doc, line)))
}

/// Whether the documented JSON `doc` describes `actual`: the same values, except that a
/// `"...": "..."` member stands for any other members and `…` in a string for any text.
fn json_describes(doc: &serde_json::Value, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (doc, actual) {
        (Value::Object(doc), Value::Object(actual)) => {
            let elided = doc.contains_key("...");
            doc.iter()
                .filter(|(name, _)| *name != "...")
                .all(|(name, v)| actual.get(name).is_some_and(|a| json_describes(v, a)))
                && (elided || doc.len() == actual.len())
        }
        (Value::Array(doc), Value::Array(actual)) => {
            doc.len() == actual.len() && doc.iter().zip(actual).all(|(d, a)| json_describes(d, a))
        }
        (Value::String(doc), Value::String(actual)) => matches(doc, actual),
        (doc, actual) => doc == actual,
    }
}

/// Whether `program` runs; when it does not, says so loudly (or fails, when required).
fn have(program: &str) -> bool {
    let found = Command::new("bash")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("FLOWGATE_REQUIRE_DOC_TOOLS").as_deref() == Ok("1") {
            panic!("the documented commands need {program}, and FLOWGATE_REQUIRE_DOC_TOOLS=1");
        }
        eprintln!(
            "\n!!!!!!!! SKIPPED the documented commands: {program} is not on PATH (set FLOWGATE_REQUIRE_DOC_TOOLS=1 to make this an error) !!!!!!!!\n"
        );
    }
    found
}

/// The servers a block started, stopped when dropped.
#[derive(Default)]
struct Servers {
    /// `flowgate serve`.
    flowgate: Vec<Serving>,
    /// Other processes (python's http.server).
    children: Vec<Child>,
    /// The runtime of the in-process servers (the chat).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the commands are run with: the replacements of documented addresses and paths, and
/// the environment.
struct Session {
    /// The servers started (stopped first, when the session ends).
    servers: Servers,
    /// (documented text, what replaces it), applied to every command in one pass.
    replace: Vec<(String, String)>,
    /// A directory of the test's own.
    dir: tempfile::TempDir,
    /// `PATH`, the binary under test first.
    path: String,
    /// What `export` lines set.
    env: Vec<(String, String)>,
}

impl Session {
    fn new() -> Session {
        let bin = Path::new(FLOWGATE).parent().unwrap();
        Session {
            servers: Servers::default(),
            replace: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
            path: format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
            env: Vec::new(),
        }
    }

    /// `command` with the documented addresses and paths replaced, in one pass (a replacement
    /// is never replaced again).
    fn rewrite(&self, command: &str) -> String {
        let mut out = String::with_capacity(command.len());
        let mut rest = command;
        'scan: while let Some(c) = rest.chars().next() {
            for (from, to) in &self.replace {
                if let Some(after) = rest.strip_prefix(from.as_str()) {
                    out.push_str(to);
                    rest = after;
                    continue 'scan;
                }
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    /// Adds replacements of `localhost:PORT` and `127.0.0.1:PORT` by `addr`.
    fn port(&mut self, documented: u16, addr: SocketAddr) {
        for host in ["localhost", "127.0.0.1"] {
            self.replace
                .push((format!("{host}:{documented}"), addr.to_string()));
        }
    }

    /// A `bash -c command` from the repository's root with the session's `PATH`.
    fn bash(&self, command: &str) -> Command {
        let mut bash = Command::new("bash");
        bash.arg("-c")
            .arg(command)
            .current_dir(root())
            .env("PATH", &self.path)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        bash
    }

    /// Starts the upstream a background command documents (before `flowgate serve`, which
    /// names it).
    fn start_upstream(&mut self, command: &str) {
        if command.starts_with("python3 -m http.server ") {
            // The documented port becomes 0; python says which port it took.
            let words: Vec<&str> = command.split_whitespace().collect();
            let documented: u16 = words[3].parse().expect("python's port");
            let command = self.rewrite(&command.replacen(words[3], "0", 1));
            let mut child = self
                .bash(&format!("exec {command}"))
                .env("PYTHONUNBUFFERED", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut first = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut first)
                .unwrap();
            // `Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ...`
            let port: u16 = first
                .split_whitespace()
                .skip_while(|w| *w != "port")
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("python's http.server said {first:?}"));
            self.port(documented, SocketAddr::from(([127, 0, 0, 1], port)));
            self.servers.children.push(child);
        } else if command.starts_with("cargo run -p example-ws-chat") {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let addr = listener.local_addr().unwrap();
            let config = example_ws_chat::Config::from_env().unwrap();
            runtime.spawn(async move { example_ws_chat::run(listener, &config).await.unwrap() });
            self.servers.runtime = Some(runtime);
            // The chat's address is in the WebSocket section of docs/tour/chat.yaml: a copy
            // names the bound one.
            let chat = std::fs::read_to_string(root().join("docs/tour/chat.yaml")).unwrap();
            assert!(chat.contains("ws://127.0.0.1:3001"), "{chat}");
            let copy = self.dir.path().join("chat.yaml");
            std::fs::write(
                &copy,
                chat.replace("ws://127.0.0.1:3001", &format!("ws://{addr}")),
            )
            .unwrap();
            self.replace
                .push(("docs/tour/chat.yaml".into(), copy.display().to_string()));
        } else if !command.contains("flowgate serve") {
            panic!("a background command the test does not know how to start: {command}");
        }
    }

    /// Starts a documented `flowgate serve` on ports the system picks.
    fn start_flowgate(&mut self, command: &str) {
        let command = self.rewrite(command);
        // Leading `NAME=value` words are the command's environment.
        let mut env = Vec::new();
        let mut rest = command.as_str();
        while let Some((word, after)) = rest.split_once(' ') {
            match word.split_once('=') {
                Some((name, value)) if name.chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
                    env.push((name.to_owned(), value.to_owned()));
                    rest = after.trim_start();
                }
                _ => break,
            }
        }
        let mut serve = self.bash(&format!("exec {rest}"));
        serve.envs(env).stdout(Stdio::null());
        serve
            .env("FLOWGATE_HTTP", "127.0.0.1:0")
            .env("FLOWGATE_GRPC", "127.0.0.1:0");
        if rest.contains("--upstream") {
            serve.env("FLOWGATE_GATEWAY", "127.0.0.1:0");
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let websocket = words.windows(2).any(|w| {
            w[0] == "--config"
                && std::fs::read_to_string(root().join(w[1]))
                    .is_ok_and(|yaml| yaml.lines().any(|l| l.starts_with("websocket:")))
        });
        if websocket {
            serve.env("FLOWGATE_WEBSOCKET", "127.0.0.1:0");
        }
        let serving = Serving::start(&mut serve);
        self.port(8080, serving.http);
        self.port(8081, serving.grpc);
        if let Some(gateway) = serving.gateway {
            self.port(8000, gateway);
        }
        if let Some(websocket) = serving.websocket {
            self.port(8001, websocket);
        }
        self.servers.flowgate.push(serving);
    }

    /// Runs a foreground command (within a minute) and checks its documented output.
    fn run(&mut self, step: &Step) {
        let command = self.rewrite(&step.command);
        if let Some((name, value)) = command
            .strip_prefix("export ")
            .and_then(|a| a.split_once('='))
        {
            let out = self.bash(&format!("printf %s {value}")).output().unwrap();
            assert!(out.status.success(), "{command}: {out:?}");
            let value = String::from_utf8(out.stdout).unwrap();
            assert!(!value.is_empty(), "{command} set nothing");
            self.env.push((name.to_owned(), value));
            return;
        }
        let mut child = self
            .bash(&command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("still running after a minute: {command}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{}\nexited {}:\n{stdout}\n{stderr}",
            step.command,
            out.status
        );
        assert!(
            documented_in(&step.output, &stdout),
            "{}\n(run as: {command})\nprinted:\n{stdout}\nbut the document shows:\n{}",
            step.command,
            step.output.join("\n")
        );
        if let Some(json) = &step.json {
            let doc: serde_json::Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("the document's JSON does not parse ({e}):\n{json}"));
            let actual: serde_json::Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("{command} printed no JSON ({e}):\n{stdout}"));
            assert!(
                json_describes(&doc, &actual),
                "{}\nprinted:\n{stdout}\nbut the document shows:\n{json}",
                step.command
            );
        }
    }
}

/// Runs `steps`: the `export`s first (the servers' environment), the upstreams, then
/// `flowgate serve`, then every other command in order.
fn run_steps(steps: &[Step], mut session: Session) {
    let export = |s: &&Step| s.command.starts_with("export ");
    for step in steps.iter().filter(export) {
        session.run(step);
    }
    for step in steps {
        if let Some(command) = step.background() {
            session.start_upstream(command);
        }
    }
    for step in steps {
        if let Some(command) = step.background()
            && command.contains("flowgate serve")
        {
            session.start_flowgate(command);
        }
    }
    for step in steps
        .iter()
        .filter(|s| s.background().is_none() && !export(s))
    {
        session.run(step);
    }
}

#[test]
fn the_readme_tour_prints_what_it_shows() {
    if !have("curl") || !have("python3") {
        return;
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let steps = steps(&readme, "**The service, for Envoy**", "![The dashboard]");
    // The four blocks of the tour: service, gateway, WebSocket, dashboard.
    assert_eq!(steps.iter().filter(|s| s.background().is_some()).count(), 3);
    assert!(steps.iter().filter(|s| !s.output.is_empty()).count() >= 6);
    let mut session = Session::new();
    let site = session.dir.path().join("site");
    session
        .replace
        .push(("/tmp/site".into(), site.display().to_string()));
    std::fs::create_dir_all(&site).unwrap();
    run_steps(&steps, session);
}

/// docs/service.md: the `/v1/check` example against the configuration the page shows (its
/// first ```yaml block, under "Configuration", served as `edge.yaml`), and the admin example
/// (which starts its own server).
#[test]
fn docs_service_api_and_admin_examples_print_what_they_show() {
    if !have("curl") || !have("openssl") {
        return;
    }
    let doc = std::fs::read_to_string(root().join("docs/service.md")).unwrap();
    let configuration = &doc[doc.find("## Configuration").unwrap()..];
    let yaml = configuration
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .unwrap()
        .0;
    let mut session = Session::new();
    let edge = session.dir.path().join("edge.yaml");
    std::fs::write(&edge, yaml).unwrap();
    session.start_flowgate(&format!("flowgate serve --config {}", edge.display()));
    run_steps(
        &block_with(&doc, "curl -s localhost:8080/v1/check -H"),
        session,
    );
    run_steps(
        &block_with(&doc, "export FLOWGATE_ADMIN_TOKEN=$(openssl rand -hex 32)"),
        Session::new(),
    );
    run_steps(
        &block_with(&doc, "flowgate export --server http://localhost:8080"),
        Session::new(),
    );
    run_steps(
        &block_with(
            &doc,
            "flowgate serve --config docs/concurrency/payments.yaml &",
        ),
        Session::new(),
    );
}

/// docs/llm-token-budgets.md: `check-config` on its file, and the gateway in front of a
/// static completion (python's http.server), charged the tokens it reports.
#[test]
fn docs_llm_token_budgets_commands_print_what_they_show() {
    if !have("curl") || !have("python3") {
        return;
    }
    let doc = std::fs::read_to_string(root().join("docs/llm-token-budgets.md")).unwrap();
    run_steps(
        &block_with(&doc, "flowgate check-config docs/llm/llm.yaml"),
        Session::new(),
    );
    run_steps(
        &block_with(&doc, "python3 -m http.server 3000"),
        Session::new(),
    );
}

#[test]
fn documented_output_is_matched_with_wildcards_in_order() {
    assert!(matches(
        "requests:   2000 in … s (ok 100, over limit 1900, errors 0)",
        "requests:   2000 in 0.83 s (ok 100, over limit 1900, errors 0)"
    ));
    assert!(!matches(
        "requests: 2000 in … s (ok 100, over limit 1900, errors 0)",
        "requests: 2000 in 0.24 s (ok 119, over limit 1881, errors 0)"
    ));
    assert!(matches("200 200 429", "200 200 429 "));
    assert!(!matches("200 200 429", "200 200 200 429"));
    assert!(matches(
        r#"{"openapi":"3.1.0",…"#,
        r#"{"openapi":"3.1.0","info":{}}"#
    ));
    assert!(matches(
        r#"{"domain":"edge",…,"remaining":0,…}"#,
        r#"{"domain":"edge","rule":"x","remaining":0,"reset_after_ms":5}"#
    ));
    assert!(!matches(
        r#"{"domain":"edge",…,"remaining":0,…}"#,
        r#"{"domain":"edge","rule":"x","remaining":5,"reset_after_ms":5}"#
    ));
    let doc = serde_json::json!({"a": 1, "k": "x|y#z:…", "l": [{"b": true, "...": "..."}]});
    let actual = serde_json::json!({"a": 1, "k": "x|y#z:5:6", "l": [{"b": true, "c": 2}]});
    assert!(json_describes(&doc, &actual));
    let more = serde_json::json!({"a": 1, "k": "x|y#z:5", "l": [{"b": true}], "extra": 0});
    assert!(
        !json_describes(&doc, &more),
        "an undocumented member without `...`"
    );
    assert_eq!(
        without_comment("cargo run -p x &   # the upstream, on 127.0.0.1:3001"),
        "cargo run -p x &"
    );
    assert_eq!(without_comment("curl -w '# %{x}' y"), "curl -w '# %{x}' y");
    let lines = ["a".to_owned(), "c".to_owned()];
    assert!(documented_in(&lines, "a\nb\nc\n"));
    assert!(!documented_in(&lines, "c\na\n"));
}
