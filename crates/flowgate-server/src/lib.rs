//! The Flowgate service: the `flowgate` binary's commands and server.
//!
//! The binary is a thin `main` around [`cli::run`]; everything it does is reachable from here
//! so tests can start a server on port 0 and talk to it:
//!
//! * [`config`]: envoyproxy/ratelimit-compatible YAML, validation, reload;
//! * [`api`]: the gRPC (Envoy RLS v3) and HTTP APIs over one [`api::Service`];
//! * [`rlqs`]: Envoy's Rate Limit Quota Service on the gRPC listener;
//! * [`gateway`]: the rate-limiting HTTP reverse proxy (`--upstream URL`);
//! * [`listen`]: bounded listeners (connection cap, header read timeout, TLS handshake);
//! * [`tls`]: rustls certificates (reloaded) for the listeners and `https://` upstreams;
//! * [`metrics`]: Prometheus metrics;
//! * [`dashboard`]: the live page at `/dashboard`;
//! * [`server`]: `run(config, listeners, shutdown)`;
//! * [`xds`]: rules from an xDS management server (`--config-source xds://HOST:PORT`);
//! * [`cli`]: `serve`, `check-config`, `loadgen`, `simulate`;
//! * [`coalesce`]: HTTP/2 write coalescing (the gRPC server and `loadgen`'s client);
//! * `fuzzing` (feature `fuzzing`): the entry points of the fuzz targets under `fuzz/`.

pub mod api;
pub mod backend;
pub mod cli;
pub mod coalesce;
pub mod config;
pub mod dashboard;
pub mod gateway;
pub mod listen;
pub mod metrics;
pub mod rlqs;
pub mod server;
pub mod tls;
pub mod xds;
