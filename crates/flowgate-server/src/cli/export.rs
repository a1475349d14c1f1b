//! `flowgate export`: a domain's usage as CSV or JSON lines, for billing.
//!
//! Reads every page of `GET /v1/keys/{domain}?prefix=…` from a running service (following
//! `next_cursor` to the last page) with the admin token of `FLOWGATE_ADMIN_TOKEN` (never
//! printed), and writes one line per counter to stdout or `--output`:
//!
//! * `csv`: a header, then `domain,descriptor,key,algorithm,limit,burst,period_ms,calendar,
//!   used,remaining,reset_after_ms,fallback` (RFC 4180 quoting; `descriptor` is the
//!   admin path form `key=value/…`, percent-encoded);
//! * `jsonl`: each counter as the API shows it, with its `domain`.
//!
//! Exit status: 0 when every counter was exported; 3 when the service said its listing may
//! be incomplete (a memory store whose names directory was full: every counter it named was
//! still written); 1 on any error (the service's problem `detail` is shown).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

/// How long one page may take.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest page body read.
const MAX_PAGE_BYTES: usize = 64 << 20;

/// The exit status of an export the service said may be incomplete.
pub const INCOMPLETE: u8 = 3;

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

/// `flowgate export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The service's HTTP API (`http://host:port`).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The domain whose counters to export.
    #[arg(long)]
    pub domain: String,
    /// Only counters whose descriptor starts with these entries: `key=value/key2=val…`, each
    /// part percent-encoded, the last value possibly cut short.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// The output format.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
    /// Counters asked for per page (the service serves at most 1000).
    #[arg(long, default_value_t = 1000)]
    pub page_size: usize,
    /// Where to write (default: stdout).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Runs the export; returns the process's exit code.
pub fn run(args: &ExportArgs) -> ExitCode {
    let token = match std::env::var("FLOWGATE_ADMIN_TOKEN") {
        Ok(token) if !token.trim().is_empty() => token.trim().to_owned(),
        _ => {
            eprintln!("flowgate export: set FLOWGATE_ADMIN_TOKEN to the service's admin token");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("flowgate export: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match &args.output {
        Some(path) => std::fs::File::create(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))
            .and_then(|file| runtime.block_on(export(args, &token, std::io::BufWriter::new(file)))),
        None => runtime.block_on(export(
            args,
            &token,
            std::io::BufWriter::new(std::io::stdout().lock()),
        )),
    };
    match result {
        Ok(Summary { counters, complete }) => {
            eprintln!(
                "flowgate export: {counters} counters of domain `{}`",
                args.domain
            );
            if complete {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "flowgate export: the service says its listing may be incomplete (its memory store had to leave counter names out); every counter it named was written"
                );
                ExitCode::from(INCOMPLETE)
            }
        }
        Err(e) => {
            eprintln!("flowgate export: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What an export wrote.
struct Summary {
    counters: u64,
    complete: bool,
}

/// The CSV columns, in order.
const COLUMNS: [&str; 12] = [
    "domain",
    "descriptor",
    "key",
    "algorithm",
    "limit",
    "burst",
    "period_ms",
    "calendar",
    "used",
    "remaining",
    "reset_after_ms",
    "fallback",
];

/// Fetches every page and writes it to `out`.
async fn export(args: &ExportArgs, token: &str, mut out: impl Write) -> Result<Summary, String> {
    let base = args.server.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(format!(
            "--server {base}: only http:// URLs are supported (reach a TLS listener through a local proxy or tunnel)"
        ));
    }
    let write_error = |e: std::io::Error| format!("cannot write the export: {e}");
    if args.format == Format::Csv {
        writeln!(out, "{}", COLUMNS.join(",")).map_err(write_error)?;
    }
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let domain = utf8_percent_encode(&args.domain, NON_ALPHANUMERIC).to_string();
    let prefix = utf8_percent_encode(&args.prefix, NON_ALPHANUMERIC).to_string();
    let mut summary = Summary {
        counters: 0,
        complete: true,
    };
    let mut cursor: Option<String> = None;
    loop {
        let mut uri = format!(
            "{base}/v1/keys/{domain}?prefix={prefix}&limit={}",
            args.page_size.max(1)
        );
        if let Some(cursor) = &cursor {
            uri.push_str("&cursor=");
            uri.push_str(&utf8_percent_encode(cursor, NON_ALPHANUMERIC).to_string());
        }
        let page = fetch(&client, &uri, token).await?;
        summary.complete &= page["complete"].as_bool().unwrap_or(false);
        for counter in page["counters"].as_array().into_iter().flatten() {
            write_counter(&mut out, args.format, &args.domain, counter).map_err(write_error)?;
            summary.counters += 1;
        }
        let next = page["next_cursor"].as_str().map(str::to_owned);
        match next {
            None => break,
            Some(next) if cursor.as_deref() == Some(next.as_str()) => {
                return Err("the service handed out the same cursor twice".into());
            }
            Some(next) => cursor = Some(next),
        }
    }
    out.flush().map_err(write_error)?;
    Ok(summary)
}

/// One page, as JSON.
async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    uri: &str,
    token: &str,
) -> Result<serde_json::Value, String> {
    let request = http::Request::get(uri)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Empty::new())
        .map_err(|e| format!("cannot make a request for {uri}: {e}"))?;
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("cannot reach the service: {e}"))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_PAGE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("cannot read the service's answer: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(PAGE_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("the service did not answer within {PAGE_TIMEOUT:?}"))??;
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if !status.is_success() {
        let detail = json["detail"].as_str().unwrap_or("(no detail)");
        return Err(format!("the service answered {status}: {detail}"));
    }
    if !json["counters"].is_array() {
        return Err("the service's answer is not a page of counters".into());
    }
    Ok(json)
}

/// Writes one counter in `format`.
fn write_counter(
    out: &mut impl Write,
    format: Format,
    domain: &str,
    counter: &serde_json::Value,
) -> std::io::Result<()> {
    match format {
        Format::Jsonl => {
            let mut line = counter.clone();
            if let Some(object) = line.as_object_mut() {
                object.insert("domain".into(), domain.into());
            }
            writeln!(out, "{line}")
        }
        Format::Csv => {
            let fields: Vec<String> = COLUMNS
                .iter()
                .map(|&column| match column {
                    "domain" => csv_field(domain),
                    "descriptor" => csv_field(counter["path"].as_str().unwrap_or_default()),
                    column => match &counter[column] {
                        serde_json::Value::Null => String::new(),
                        serde_json::Value::String(s) => csv_field(s),
                        other => csv_field(&other.to_string()),
                    },
                })
                .collect();
            writeln!(out, "{}", fields.join(","))
        }
    }
}

/// `text` as a CSV field: quoted (with `"` doubled) when it holds a comma, a quote or a line
/// break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_when_they_must_be() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    #[test]
    fn a_counter_becomes_one_csv_line_and_one_json_line() {
        let counter = serde_json::json!({
            "path": "api_key=a%2Cb", "key": "api|api_key=a,b#gcra:2:60000000000:2",
            "algorithm": "gcra", "limit": 2, "burst": 2, "period_ms": 60000,
            "used": 1, "remaining": 1, "reset_after_ms": 30000,
        });
        let mut out = Vec::new();
        write_counter(&mut out, Format::Csv, "api", &counter).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "api,api_key=a%2Cb,\"api|api_key=a,b#gcra:2:60000000000:2\",gcra,2,2,60000,,1,1,30000,\n"
        );
        let mut out = Vec::new();
        write_counter(&mut out, Format::Jsonl, "api", &counter).unwrap();
        let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (line["domain"].as_str(), line["used"].as_u64()),
            (Some("api"), Some(1))
        );
    }
}
