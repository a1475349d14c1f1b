//! The clients `loadgen` drives: Envoy RLS over gRPC, and HTTP `POST /json` or `/v1/check`.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tonic::transport::{Channel, Endpoint};

use super::LoadgenArgs;

/// Which API is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    Grpc,
    /// `POST /json` (RLS in proto-JSON).
    Json,
    /// `POST /v1/check`.
    Check,
}

impl Protocol {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc ShouldRateLimit",
            Protocol::Json => "http /json",
            Protocol::Check => "http /v1/check",
        }
    }
}

/// The answer to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed.
    Ok,
    /// Over the limit.
    OverLimit,
    /// Failed.
    Error,
}

/// What every request shares.
#[derive(Debug)]
struct Shape {
    domain: String,
    key: String,
    hits: u32,
}

/// A connected target.
#[derive(Debug)]
pub struct Target {
    protocol: Protocol,
    shape: Arc<Shape>,
    channels: Vec<RateLimitServiceClient<Channel>>,
    http: Option<(Client<HttpConnector, Full<Bytes>>, hyper::Uri)>,
}

/// One caller's client.
#[derive(Debug)]
pub struct Caller {
    shape: Arc<Shape>,
    kind: CallerKind,
}

#[derive(Debug)]
enum CallerKind {
    Grpc(RateLimitServiceClient<Channel>),
    Http(Box<(Client<HttpConnector, Full<Bytes>>, hyper::Uri)>),
}

impl Target {
    /// Parses `--target` and connects.
    pub async fn connect(args: &LoadgenArgs) -> Result<Target, String> {
        let shape = Arc::new(Shape {
            domain: args.domain.clone(),
            key: args.key.clone(),
            hits: args.hits,
        });
        if let Some(authority) = args.target.strip_prefix("grpc://") {
            let endpoint = Endpoint::from_shared(format!("http://{authority}"))
                .map_err(|e| format!("invalid target {}: {e}", args.target))?
                .tcp_nodelay(true);
            let mut channels = Vec::new();
            for _ in 0..args.connections.max(1) {
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", args.target))?;
                channels.push(RateLimitServiceClient::new(channel));
            }
            return Ok(Target {
                protocol: Protocol::Grpc,
                shape,
                channels,
                http: None,
            });
        }
        let uri: hyper::Uri = args
            .target
            .parse()
            .map_err(|e| format!("invalid target {}: {e}", args.target))?;
        let protocol = match (uri.scheme_str(), uri.path()) {
            (Some("http"), "/json") => Protocol::Json,
            (Some("http"), "/v1/check") => Protocol::Check,
            _ => {
                return Err(format!(
                    "unsupported target {}: use grpc://HOST:PORT, http://HOST:PORT/json or http://HOST:PORT/v1/check",
                    args.target
                ));
            }
        };
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(args.concurrency)
            .build(connector);
        Ok(Target {
            protocol,
            shape,
            channels: Vec::new(),
            http: Some((client, uri)),
        })
    }

    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A client for caller number `worker`.
    pub fn client(&self, worker: usize) -> Caller {
        let kind = match &self.http {
            Some((client, uri)) => CallerKind::Http(Box::new((client.clone(), uri.clone()))),
            None => CallerKind::Grpc(self.channels[worker % self.channels.len()].clone()),
        };
        Caller {
            shape: self.shape.clone(),
            kind,
        }
    }
}

impl Caller {
    /// One request for key value `k{key}`.
    pub async fn call(&self, key: u64) -> Outcome {
        let value = format!("k{key}");
        match &self.kind {
            CallerKind::Grpc(client) => {
                let request = RateLimitRequest {
                    domain: self.shape.domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: self.shape.key.clone(),
                            value,
                        }],
                        ..Default::default()
                    }],
                    hits_addend: self.shape.hits,
                };
                match client.clone().should_rate_limit(request).await {
                    Ok(response) => match response.get_ref().overall_code {
                        1 => Outcome::Ok,
                        2 => Outcome::OverLimit,
                        _ => Outcome::Error,
                    },
                    Err(_) => Outcome::Error,
                }
            }
            CallerKind::Http(http) => {
                let (client, uri) = &**http;
                let body = serde_json::json!({
                    "domain": self.shape.domain,
                    "descriptors": [{"entries": [{"key": self.shape.key, "value": value}]}],
                    "hits_addend": self.shape.hits,
                });
                let request = hyper::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())));
                let Ok(request) = request else {
                    return Outcome::Error;
                };
                match client.request(request).await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        // Read the whole body: the answer is only complete then.
                        if response.into_body().collect().await.is_err() {
                            return Outcome::Error;
                        }
                        match status {
                            200 => Outcome::Ok,
                            429 => Outcome::OverLimit,
                            _ => Outcome::Error,
                        }
                    }
                    Err(_) => Outcome::Error,
                }
            }
        }
    }
}
