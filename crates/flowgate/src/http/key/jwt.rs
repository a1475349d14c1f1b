//! [`Jwt`] and [`JwtClaim`]: keys from a verified bearer token's claims (`sub`, `plan`).

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::request::Parts;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::{KeyExtractor, KeyRejection};

/// The longest bearer token [`Jwt`] decodes by default, in bytes: 8 KiB. Longer tokens are
/// rejected with 401 before any decoding (a real token with a few claims is well under 1 KiB).
pub const DEFAULT_JWT_MAX_LEN: usize = 8 * 1024;

/// Verifies `Authorization: Bearer <JWT>` tokens with a configured key (HS256 or RS256, via
/// the `jsonwebtoken` crate on pure-Rust crypto). `exp` is required and checked (60 s leeway);
/// audience and issuer checks are set with [`validation`](Self::validation). Tokens longer
/// than [`max_len`](Self::max_len) (default [`DEFAULT_JWT_MAX_LEN`]) are rejected unread.
///
/// Cheap to clone: clones share the key. Each [`claim`](Self::claim) is an extractor; a policy
/// keyed by `sub` with tiers from `plan` verifies the token once per extractor.
///
/// ```
/// use flowgate::http::key::{Jwt, KeyExtractor};
/// let jwt = Jwt::hs256(b"secret");
/// let (user, plan) = (jwt.claim("sub"), jwt.claim("plan"));
/// let request = http::Request::new(()).into_parts().0;
/// assert_eq!(user.extract(&request).unwrap_err().status, 401);
/// # let _ = plan;
/// ```
#[derive(Clone)]
pub struct Jwt {
    /// The key and rules, shared by clones and claims.
    inner: Arc<Verifier>,
}

struct Verifier {
    /// The HS256 secret or RS256 public key.
    key: DecodingKey,
    /// Algorithm, expiry and audience rules.
    validation: Validation,
    /// The longest token decoded.
    max_len: usize,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("algorithms", &self.inner.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Jwt {
    /// Verifies HS256 tokens signed with `secret`.
    pub fn hs256(secret: &[u8]) -> Self {
        Self::with_key(DecodingKey::from_secret(secret), Algorithm::HS256)
    }

    /// Verifies RS256 tokens with an RSA public key in PEM form.
    pub fn rs256_pem(public_key_pem: &[u8]) -> Result<Self, jsonwebtoken::errors::Error> {
        Ok(Self::with_key(
            DecodingKey::from_rsa_pem(public_key_pem)?,
            Algorithm::RS256,
        ))
    }

    /// Verifies tokens of `algorithm` with `key`.
    pub fn with_key(key: DecodingKey, algorithm: Algorithm) -> Self {
        Jwt {
            inner: Arc::new(Verifier {
                key,
                validation: Validation::new(algorithm),
                max_len: DEFAULT_JWT_MAX_LEN,
            }),
        }
    }

    /// Adjusts the validation rules (audience, issuer, leeway, required claims). Call before
    /// [`claim`](Self::claim): claims made earlier keep the rules they were made with.
    pub fn validation(mut self, f: impl FnOnce(&mut Validation)) -> Self {
        let mut validation = self.inner.validation.clone();
        f(&mut validation);
        self.inner = Arc::new(Verifier {
            key: self.inner.key.clone(),
            validation,
            max_len: self.inner.max_len,
        });
        self
    }

    /// Rejects tokens longer than `bytes` with 401 before decoding them (default
    /// [`DEFAULT_JWT_MAX_LEN`]). Call before [`claim`](Self::claim), as
    /// [`validation`](Self::validation).
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.inner = Arc::new(Verifier {
            key: self.inner.key.clone(),
            validation: self.inner.validation.clone(),
            max_len: bytes,
        });
        self
    }

    /// An extractor keying requests by the claim `name` of their verified token.
    pub fn claim(&self, name: impl Into<String>) -> JwtClaim {
        JwtClaim {
            jwt: self.clone(),
            name: name.into(),
        }
    }

    /// The verified claims of the request's bearer token; 401 when it is missing, malformed,
    /// badly signed or expired, 400 when the request has more than one `Authorization` header.
    pub fn claims(&self, parts: &Parts) -> Result<Map<String, Value>, KeyRejection> {
        let mut lines = parts.headers.get_all(AUTHORIZATION).iter();
        let header = lines
            .next()
            .ok_or_else(|| KeyRejection::unauthorized("a bearer token is required"))?;
        if lines.next().is_some() {
            // Which token would the application believe? Keying on one of them would let the
            // client choose the limit it meets.
            return Err(KeyRejection::bad_request(
                "the Authorization header appears more than once",
            ));
        }
        let token = header
            .to_str()
            .ok()
            .and_then(|h| {
                let (scheme, token) = h.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(|| KeyRejection::unauthorized("the Authorization header is not Bearer"))?;
        if token.len() > self.inner.max_len {
            return Err(KeyRejection::unauthorized(format!(
                "the bearer token is longer than {} bytes",
                self.inner.max_len
            )));
        }
        let data = jsonwebtoken::decode::<Map<String, Value>>(
            token,
            &self.inner.key,
            &self.inner.validation,
        )
        .map_err(|e| KeyRejection::unauthorized(format!("invalid bearer token: {e}")))?;
        Ok(data.claims)
    }
}

/// Keys requests by one claim of their verified bearer token (see [`Jwt`]). Strings are used
/// as they are, numbers and booleans in their JSON form; a token without the claim is rejected
/// with 401.
#[derive(Debug, Clone)]
pub struct JwtClaim {
    /// Verifies the token.
    jwt: Jwt,
    /// The claim's name.
    name: String,
}

impl KeyExtractor for JwtClaim {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        match self.jwt.claims(parts)?.remove(&self.name) {
            Some(Value::String(s)) => Ok(s),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(v.to_string()),
            _ => Err(KeyRejection::unauthorized(format!(
                "the bearer token has no `{}` claim",
                self.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    fn parts(token: &str) -> Parts {
        http::Request::builder()
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn token(secret: &[u8], claims: Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    #[test]
    fn claims_of_valid_tokens_are_keys_and_everything_else_is_401() {
        let exp = jsonwebtoken::get_current_timestamp() + 600;
        let jwt = Jwt::hs256(b"s3cret");
        let good = token(
            b"s3cret",
            serde_json::json!({"sub": "u-1", "plan": "free", "n": 7, "exp": exp}),
        );
        assert_eq!(jwt.claim("sub").extract(&parts(&good)).unwrap(), "u-1");
        assert_eq!(jwt.claim("n").extract(&parts(&good)).unwrap(), "7");
        assert_eq!(
            jwt.claim("org").extract(&parts(&good)).unwrap_err().status,
            401
        );
        let forged = token(b"other", serde_json::json!({"sub": "u-1", "exp": exp}));
        assert_eq!(
            jwt.claim("sub")
                .extract(&parts(&forged))
                .unwrap_err()
                .status,
            401
        );
        let expired = token(b"s3cret", serde_json::json!({"sub": "u-1", "exp": 1000}));
        assert_eq!(
            jwt.claim("sub")
                .extract(&parts(&expired))
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            jwt.claim("sub")
                .extract(&parts("x.y.z"))
                .unwrap_err()
                .status,
            401
        );
        // Longer than the bound: 401 unread, even when validly signed.
        let padded = token(
            b"s3cret",
            serde_json::json!({"sub": "u-1", "exp": exp, "pad": "p".repeat(DEFAULT_JWT_MAX_LEN)}),
        );
        let too_long = jwt.claim("sub").extract(&parts(&padded)).unwrap_err();
        assert_eq!(too_long.status, 401);
        assert!(too_long.detail.contains("longer than 8192 bytes"));
        let roomy = Jwt::hs256(b"s3cret").max_len(padded.len());
        assert_eq!(roomy.claim("sub").extract(&parts(&padded)).unwrap(), "u-1");
        let basic = http::Request::builder()
            .header(AUTHORIZATION, "Basic dTpw")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(jwt.claim("sub").extract(&basic).unwrap_err().status, 401);
        // Two tokens: which one the application believes is anyone's guess, so neither keys.
        let twice = http::Request::builder()
            .header(AUTHORIZATION, format!("Bearer {good}"))
            .header(AUTHORIZATION, "Bearer other")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(jwt.claim("sub").extract(&twice).unwrap_err().status, 400);
    }

    #[test]
    fn rs256_tokens_verify_with_the_public_key_only() {
        let private = include_bytes!("../../../tests/fixtures/jwt-test-rs256.key.pem");
        let public = include_bytes!("../../../tests/fixtures/jwt-test-rs256.pub.pem");
        let exp = jsonwebtoken::get_current_timestamp() + 600;
        let claims = serde_json::json!({"sub": "svc-9", "plan": "enterprise", "exp": exp});
        let signed = encode(
            &Header::new(Algorithm::RS256),
            &claims,
            &EncodingKey::from_rsa_pem(private).unwrap(),
        )
        .unwrap();
        let jwt = Jwt::rs256_pem(public).unwrap();
        assert_eq!(
            jwt.claim("plan").extract(&parts(&signed)).unwrap(),
            "enterprise"
        );
        // An HS256 token "signed" with the public key as secret (the classic key-confusion
        // attack) is refused: only RS256 is accepted.
        let confused = token(public, claims);
        assert_eq!(
            jwt.claim("sub")
                .extract(&parts(&confused))
                .unwrap_err()
                .status,
            401
        );
        assert!(Jwt::rs256_pem(b"not a key").is_err());
    }
}
