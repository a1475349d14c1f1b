//! An axum app behind Flowgate's rate-limit layer.
//!
//! ```text
//! cargo run -p example-axum-app                  # listens on 127.0.0.1:3000
//! curl -i 'localhost:3000/'                      # RateLimit headers on every response
//! TOKEN=$(curl -s -X POST 'localhost:3000/login?user=ann&plan=free')
//! curl -i -H "authorization: Bearer $TOKEN" localhost:3000/api/hello
//! ```
//!
//! The limits:
//! * `per-ip`: 100 r/s (bursts of 200) per client IP, believing `X-Forwarded-For` only from
//!   the proxies in `TRUSTED_PROXIES` (comma-separated CIDRs; default loopback).
//! * `login`: 5 per minute per IP on `POST /login`.
//! * `per-user` on `/api`: by the verified token's `sub`, with the plan as tier — free 10 r/s
//!   (bursts of 20), enterprise 500 r/s (bursts of 1000).
//!
//! The layers, outside in: timeout → per-IP/login limits → routing → per-user limit → handler.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{BoxError, Router};
use flowgate::Quota;
use flowgate::http::key::{ClientIp, Jwt, Route};
use flowgate::http::{Limit, Limits, RateLimitLayer};
use flowgate::store::MemoryStore;
use tower::ServiceBuilder;

/// The app, with tokens signed by `secret` and `X-Forwarded-For` believed from `trusted`.
fn app(secret: &'static [u8], trusted: Vec<ipnet::IpNet>) -> Result<Router, Box<dyn Error>> {
    // One store for both layers (an `Arc` of a store is a store); in a fleet, use the Redis
    // store, wrapped in a `FallbackStore` for fail open, closed or local.
    let store = std::sync::Arc::new(MemoryStore::new());

    let edge = Limits::new()
        .limit(Limit::new(
            "per-ip",
            ClientIp::new(trusted.clone()),
            Quota::per_second(100).with_burst(200)?,
        ))
        .limit(
            // Tiered by route: only `POST /login` has a quota; other routes skip this limit.
            Limit::tiered(
                "login",
                ClientIp::new(trusted),
                Route::new(["/login"])?.with_method(),
            )
            .tier("POST /login", Quota::per_minute(5)),
        );
    let edge = RateLimitLayer::new(store.clone(), edge)?;

    let jwt = Jwt::hs256(secret);
    let per_user = Limits::new().limit(
        Limit::tiered("per-user", jwt.claim("sub"), jwt.claim("plan"))
            .tier("free", Quota::per_second(10).with_burst(20)?)
            .tier("enterprise", Quota::per_second(500).with_burst(1000)?),
    );
    let per_user = RateLimitLayer::new(store, per_user)?;

    let api = Router::new()
        .route("/hello", get(|| async { "hello, subscriber\n" }))
        .route_layer(per_user);

    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(move |q: Query<Login>| login(q, secret)))
        .nest("/api", api)
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async {
                    StatusCode::GATEWAY_TIMEOUT
                }))
                .timeout(Duration::from_secs(10))
                .layer(edge),
        ))
}

/// `POST /login?user=ann&plan=free`.
#[derive(serde::Deserialize)]
struct Login {
    user: String,
    plan: String,
}

/// Issues a demo token (no password: this is an example of limits, not of authentication).
async fn login(Query(login): Query<Login>, secret: &[u8]) -> Result<String, StatusCode> {
    let claims = serde_json::json!({
        "sub": login.user,
        "plan": login.plan,
        "exp": jsonwebtoken::get_current_timestamp() + 3600,
    });
    let key = jsonwebtoken::EncodingKey::from_secret(secret);
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key)
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let trusted = std::env::var("TRUSTED_PROXIES")
        .unwrap_or_else(|_| "127.0.0.0/8,::1/128".into())
        .split(',')
        .map(|cidr| cidr.trim().parse())
        .collect::<Result<Vec<ipnet::IpNet>, _>>()?;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    let app = app(b"example-secret", trusted)?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use http::Request;
    use tower::ServiceExt;

    async fn call(app: &Router, method: &str, uri: &str, token: Option<&str>) -> StatusCode {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut request = request.body(Body::empty()).unwrap();
        let peer: SocketAddr = "192.0.2.10:5000".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(request).await.unwrap().status()
    }

    async fn token(app: &Router, user: &str, plan: &str) -> String {
        let uri = format!("/login?user={user}&plan={plan}");
        let request = Request::post(uri).body(Body::empty()).unwrap();
        let mut request = request;
        let peer: SocketAddr = "198.51.100.1:5000".parse().unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = app.clone().oneshot(request).await.unwrap();
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn login_is_limited_per_ip_and_plans_get_their_burst() {
        let app = app(b"test", vec!["10.0.0.0/8".parse().unwrap()]).unwrap();
        let logins: Vec<_> = [0; 6].iter().map(|_| "/login?user=x&plan=free").collect();
        let mut statuses = Vec::new();
        for uri in logins {
            statuses.push(call(&app, "POST", uri, None).await);
        }
        assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 5);
        assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS);

        let (free, enterprise) = (
            token(&app, "ann", "free").await,
            token(&app, "bob", "enterprise").await,
        );
        let mut ok = 0;
        for _ in 0..25 {
            if call(&app, "GET", "/api/hello", Some(&free)).await == StatusCode::OK {
                ok += 1;
            }
        }
        assert_eq!(ok, 20);
        for _ in 0..25 {
            assert_eq!(
                call(&app, "GET", "/api/hello", Some(&enterprise)).await,
                StatusCode::OK
            );
        }
        assert_eq!(
            call(&app, "GET", "/api/hello", None).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(call(&app, "GET", "/", None).await, StatusCode::OK);
    }
}
