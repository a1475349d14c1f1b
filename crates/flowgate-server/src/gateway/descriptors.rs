//! A request's descriptors under the `gateway` section: each entry's value from its source.

use flowgate::envoy::{Descriptor, Entry};
use flowgate::http::key::{self, KeyExtractor, KeyRejection};
use http::StatusCode;
use http::request::Parts;

use crate::config::gateway::{GatewayConfig, Source};

/// The descriptors of a request under `config`. A descriptor with an entry whose source the
/// request lacks (no such header, no valid bearer token, no such claim, no host) is skipped,
/// as Envoy does; a header that is present but unusable as a key (not visible ASCII, longer
/// than 256 bytes, or repeated — see [`Header`](flowgate::http::key::Header)) rejects the
/// request with 400, and so do two `Authorization` headers under a `jwt_claim` source.
pub fn of_request(config: &GatewayConfig, parts: &Parts) -> Result<Vec<Descriptor>, KeyRejection> {
    let mut out = Vec::with_capacity(config.descriptors.len());
    'descriptors: for entries in &config.descriptors {
        let mut built = Vec::with_capacity(entries.len());
        for entry in entries {
            let Some(value) = value_of(config, &entry.source, parts)? else {
                continue 'descriptors;
            };
            built.push(Entry {
                key: entry.key.clone(),
                value,
            });
        }
        out.push(Descriptor::new(built));
    }
    Ok(out)
}

/// Whether a descriptor of `config` is keyed by the client's address (read from the request's
/// [`PeerAddr`](flowgate::http::key::PeerAddr) extension, which must then be set).
pub(crate) fn need_peer(config: &GatewayConfig) -> bool {
    config
        .descriptors
        .iter()
        .flatten()
        .any(|entry| matches!(entry.source, Source::RemoteAddress))
}

/// The value of one entry, `None` when the request lacks it.
pub(crate) fn value_of(
    config: &GatewayConfig,
    source: &Source,
    parts: &Parts,
) -> Result<Option<String>, KeyRejection> {
    Ok(match source {
        Source::RemoteAddress => Some(config.client_ip.extract(parts)?),
        Source::Header(header) => present(header.extract(parts))?,
        Source::Path => Some(parts.uri.path().to_owned()),
        Source::Method => Some(parts.method.as_str().to_owned()),
        Source::Host => key::Host.extract(parts).ok(),
        Source::JwtClaim(claim) => present(claim.extract(parts))?,
        Source::Generic(value) => Some(value.clone()),
    })
}

/// A key extractor's answer with "absent" told apart from "unusable": `Header` and `JwtClaim`
/// answer 401 only when the request lacks the value (no header, a blank one, no valid token or
/// no such claim) — then `None` — and 400 when it is there but cannot be a key.
pub(crate) fn present(
    extracted: Result<String, KeyRejection>,
) -> Result<Option<String>, KeyRejection> {
    match extracted {
        Ok(value) => Ok(Some(value)),
        Err(rejection) if rejection.status == StatusCode::UNAUTHORIZED => Ok(None),
        Err(rejection) => Err(rejection),
    }
}
