//! [`Route`]: the route template (`/users/{id}`) as the key, for per-endpoint limits.

use http::request::Parts;

use super::{KeyExtractor, KeyRejection};

/// The key of a request whose path matches none of the templates: they all share one counter
/// (keying by the raw path would let clients mint unlimited keys).
pub const UNMATCHED_ROUTE: &str = "*";

/// Where the template comes from.
#[derive(Debug, Clone)]
enum Source {
    /// Our own router over the configured templates.
    Templates(matchit::Router<usize>, Vec<String>),
    /// axum's `MatchedPath` (set when the layer is added with `route_layer`).
    #[cfg(feature = "axum")]
    MatchedPath,
}

/// Keys requests by the template their path matches, so that `/users/1` and `/users/2` share
/// the `/users/{id}` limit. Templates use `{name}` for one segment and `{*rest}` for the rest
/// of the path (matchit syntax, as axum 0.8).
///
/// ```
/// use flowgate::http::key::{KeyExtractor, Route};
/// let route = Route::new(["/users/{id}", "/files/{*path}"])?.with_method();
/// let request = http::Request::post("/users/42").body(()).unwrap();
/// assert_eq!(route.extract(&request.into_parts().0).unwrap(), "POST /users/{id}");
/// # Ok::<(), flowgate::http::key::RouteError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Route {
    /// How the template is found.
    source: Source,
    /// Whether the key starts with the method (`GET /users/{id}`).
    method: bool,
}

/// A template that cannot be added (invalid syntax, or it conflicts with another).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route template `{template}`: {reason}")]
pub struct RouteError {
    /// The template.
    pub template: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Route {
    /// Matches paths against `templates`; unmatched paths get [`UNMATCHED_ROUTE`].
    pub fn new<T: Into<String>>(
        templates: impl IntoIterator<Item = T>,
    ) -> Result<Self, RouteError> {
        let mut router = matchit::Router::new();
        let mut names = Vec::new();
        for template in templates {
            let template = template.into();
            router
                .insert(template.as_str(), names.len())
                .map_err(|e| RouteError {
                    template: template.clone(),
                    reason: e.to_string(),
                })?;
            names.push(template);
        }
        Ok(Route {
            source: Source::Templates(router, names),
            method: false,
        })
    }

    /// Uses axum's `MatchedPath`, which axum sets for layers added with `Router::route_layer`
    /// (a layer added with `Router::layer` runs before routing and sees [`UNMATCHED_ROUTE`]).
    #[cfg(feature = "axum")]
    pub fn matched_path() -> Self {
        Route {
            source: Source::MatchedPath,
            method: false,
        }
    }

    /// Prefixes the key with the method: `GET /users/{id}` and `POST /users/{id}` are counted
    /// apart.
    pub fn with_method(mut self) -> Self {
        self.method = true;
        self
    }

    /// The template `parts`' path matches, or [`UNMATCHED_ROUTE`].
    pub fn template<'a>(&'a self, parts: &'a Parts) -> &'a str {
        match &self.source {
            Source::Templates(router, names) => router
                .at(parts.uri.path())
                .ok()
                .and_then(|m| names.get(*m.value))
                .map_or(UNMATCHED_ROUTE, String::as_str),
            #[cfg(feature = "axum")]
            Source::MatchedPath => parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .map_or(UNMATCHED_ROUTE, |m| m.as_str()),
        }
    }
}

impl KeyExtractor for Route {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        super::extract_via_into(self, parts)
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        if self.method {
            key.push_str(parts.method.as_str());
            key.push(' ');
        }
        key.push_str(self.template(parts));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(route: &Route, uri: &str) -> String {
        route
            .extract(&http::Request::get(uri).body(()).unwrap().into_parts().0)
            .unwrap()
    }

    #[test]
    fn paths_map_to_their_templates_and_the_rest_to_one_bucket() {
        let route = Route::new(["/users/{id}", "/users/{id}/orders", "/static/{*path}"]).unwrap();
        assert_eq!(key(&route, "/users/7"), "/users/{id}");
        assert_eq!(key(&route, "/users/7/orders?x=1"), "/users/{id}/orders");
        assert_eq!(key(&route, "/static/a/b.css"), "/static/{*path}");
        assert_eq!(key(&route, "/nope"), UNMATCHED_ROUTE);
        assert_eq!(key(&route.with_method(), "/users/1"), "GET /users/{id}");
        assert!(Route::new(["/a/{x}", "/a/{y}"]).is_err());
    }
}
