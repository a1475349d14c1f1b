//! A request's descriptors under the `gateway` section: each entry's value from its source.

use flowgate::envoy::{Descriptor, Entry};
use flowgate::http::key::{self, KeyExtractor, KeyRejection};
use http::StatusCode;
use http::request::Parts;

use crate::config::gateway::{GatewayConfig, Source};

/// The descriptors of a request under `config`. A descriptor with an entry whose source the
/// request lacks (no such header, no valid bearer token, no such claim, no host) is skipped,
/// as Envoy does; a header that is present but unusable as a key (not visible ASCII, longer
/// than 256 bytes) rejects the request with 400.
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

/// The value of one entry, `None` when the request lacks it.
fn value_of(
    config: &GatewayConfig,
    source: &Source,
    parts: &Parts,
) -> Result<Option<String>, KeyRejection> {
    Ok(match source {
        Source::RemoteAddress => Some(config.client_ip.extract(parts)?),
        // `Header` answers 401 only for a missing (or blank) header.
        Source::Header(header) => match header.extract(parts) {
            Ok(value) => Some(value),
            Err(rejection) if rejection.status == StatusCode::UNAUTHORIZED => None,
            Err(rejection) => return Err(rejection),
        },
        Source::Path => Some(parts.uri.path().to_owned()),
        Source::Method => Some(parts.method.as_str().to_owned()),
        Source::Host => key::Host.extract(parts).ok(),
        Source::JwtClaim(claim) => claim.extract(parts).ok(),
        Source::Generic(value) => Some(value.clone()),
    })
}
