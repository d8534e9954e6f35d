//! The route table of a layer: which limits apply to which route.

use std::collections::HashMap;

use http::Method;
use http::request::Parts;
use smallvec::SmallVec;

use crate::base::error::ConfigError;

/// A route's entries: (method, or any method; group of limits).
pub(crate) type Entries = SmallVec<[(Option<Method>, usize); 2]>;

/// The routes of a layer: a request's path matched against the templates, with axum's
/// syntax and priorities (`matchit`), wherever the layer sits. axum's `MatchedPath` is
/// not used: it names the app's route, not the table's, and a table's pattern (such as
/// `/api/{*rest}`) must decide the same requests in `Router::route_layer`, in
/// `Router::layer`, in plain hyper, and in `tollgate-rules simulate`, which sees paths.
#[derive(Default)]
pub(crate) struct RouteTable {
    /// Template to its index in `entries` (each template once).
    by_template: HashMap<Box<str>, usize>,
    /// The same templates, for request paths.
    matcher: matchit::Router<usize>,
    /// The templates, by index.
    templates: Vec<Box<str>>,
    entries: Vec<Entries>,
}

impl RouteTable {
    /// How many route templates there are.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The templates and their entries, in the order they were added.
    pub(crate) fn routes(&self) -> impl Iterator<Item = (&str, &Entries)> {
        self.templates.iter().map(|t| &**t).zip(&self.entries)
    }

    /// The entries of the route whose template matches the request path `path`.
    pub(crate) fn for_path(&self, path: &str) -> Option<&Entries> {
        self.matcher.at(path).ok().map(|m| &self.entries[*m.value])
    }

    /// The entries of `template`, added if new; matchit's error if the template is not
    /// valid or conflicts with another one.
    pub(crate) fn entries_mut(
        &mut self,
        template: &str,
    ) -> Result<&mut Entries, matchit::InsertError> {
        let index = match self.by_template.get(template) {
            Some(&i) => i,
            None => {
                let i = self.entries.len();
                self.matcher.insert(template, i)?;
                self.by_template.insert(template.into(), i);
                self.templates.push(template.into());
                self.entries.push(Entries::new());
                i
            }
        };
        Ok(&mut self.entries[index])
    }

    /// The group of limits for a request: its route's, or the default group.
    pub(crate) fn group_for(&self, parts: &Parts) -> usize {
        if self.is_empty() {
            return 0;
        }
        // The path the client sent, wherever the layer sits: one meaning for a pattern.
        let Some(entries) = self.for_path(request_path(parts)) else {
            return 0;
        };
        let with = |m: &Method| entries.iter().find(|(em, _)| em.as_ref() == Some(m));
        with(&parts.method)
            .or_else(|| {
                (parts.method == Method::HEAD)
                    .then(|| with(&Method::GET))
                    .flatten()
            })
            .or_else(|| entries.iter().find(|(m, _)| m.is_none()))
            .map_or(0, |&(_, g)| g)
    }
}

/// The methods a route entry may name: the standard ones, which axum's method routing
/// (`MethodFilter`) knows. Any other token, an extension method included, is refused:
/// an entry without a method applies to every method.
const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// `"POST /login"` or `"/login"`: the method, if any, and the path template.
///
/// Refuses an entry that could never match a request: a method token that is not one of
/// [`METHODS`] (with a hint for a lower-case one, since methods are case-sensitive), a
/// path that does not start with `/`, contains whitespace, a query or a fragment, or has
/// a segment in axum 0.7's `:param` / `*param` syntax, which axum 0.8 (and the matcher)
/// takes literally. matchit then refuses what axum's router would (bad braces, conflicts).
pub(crate) fn parse_route(spec: &str) -> Result<(Option<Method>, &str), ConfigError> {
    let field = || format!("routes[{spec:?}]");
    let spec_trimmed = spec.trim();
    let (method, path) = match spec_trimmed.split_once(char::is_whitespace) {
        Some((m, p)) if !m.starts_with('/') => (
            Some(method(m).map_err(|reason| ConfigError::new(field(), reason))?),
            p.trim(),
        ),
        _ => (None, spec_trimmed),
    };
    check_path(path).map_err(|reason| ConfigError::new(field(), reason))?;
    Ok((method, path))
}

/// The method a route entry names, or why no request could ever have it.
fn method(token: &str) -> Result<Method, String> {
    if let Some(m) = METHODS.iter().find(|m| m.as_str() == token) {
        return Ok(m.clone());
    }
    let list = "GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE or PATCH";
    match METHODS
        .iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(token))
    {
        Some(m) => Err(format!(
            "`{token}` is not a method: methods are case-sensitive, write `{m}`"
        )),
        None => Err(format!(
            "`{token}` is not a method: expected {list}, or no method for every method"
        )),
    }
}

/// Why no request path could ever match the template `path`, if so.
fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(
            "expected a path starting with `/`, optionally after a method (`POST /login`)".into(),
        );
    }
    // A request path never contains whitespace: such a route could never match.
    if path.contains(char::is_whitespace) {
        return Err(format!(
            "the path `{path}` contains whitespace, which no request path can; \
             expected `<path>` or `<METHOD> <path>`"
        ));
    }
    // Routes match the path alone: a query or a fragment is never part of it.
    if let Some(c) = path.chars().find(|c| matches!(c, '?' | '#')) {
        return Err(format!(
            "the path `{path}` contains `{c}`: routes match the request path alone, \
             without its query or fragment"
        ));
    }
    for segment in path.split('/') {
        let Some(name) = segment
            .strip_prefix(':')
            .map(|n| (n, false))
            .or_else(|| segment.strip_prefix('*').map(|n| (n, true)))
        else {
            continue;
        };
        let written = match name {
            (n, false) => format!("{{{}}}", if n.is_empty() { "id" } else { n }),
            (n, true) => format!("{{*{}}}", if n.is_empty() { "rest" } else { n }),
        };
        return Err(format!(
            "the segment `{segment}` of `{path}` would only match itself: axum 0.8 writes \
             parameters in braces, `{written}` (`:param` and `*param` are axum 0.7's syntax)"
        ));
    }
    Ok(())
}

/// The path a request was sent to, as the client (and an access log) sees it: in a router
/// nested with axum's `Router::nest`, the path before the prefix was stripped (axum's
/// `OriginalUri`), elsewhere the request's own.
#[inline]
pub(crate) fn request_path(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return original.path();
    }
    parts.uri.path()
}

/// The route of a request in logs and audit records: axum's matched template, else the
/// path.
pub(crate) fn logged_route(parts: &Parts) -> &str {
    matched_path(parts).unwrap_or_else(|| request_path(parts))
}

/// The route template axum's router matched for this request (`/users/{id}`, its
/// `MatchedPath`): `None` for a request no route serves (axum's fallback), on plain hyper
/// or tower, and without the `axum` feature. The one place that reads it.
#[inline]
pub(crate) fn matched_path(parts: &Parts) -> Option<&str> {
    #[cfg(feature = "axum")]
    {
        parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(axum::extract::MatchedPath::as_str)
    }
    #[cfg(not(feature = "axum"))]
    {
        let _ = parts;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limit, Quota, RateLimitLayer, store::MemoryStore};
    use http::Request;

    #[test]
    fn routes_are_matched_by_path_and_method() {
        let q = Quota::per_second(1);
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .route("POST /login", Limit::new("login-post", q))
            .route("/login", Limit::new("login-any", q))
            .route("GET /items", Limit::new("items", q))
            .route_default(Limit::new("other", q))
            .build()
            .unwrap();
        let name = |m: Method, p: &str| layer.source.with(|s| names_for(&s.policy, m, p));
        assert_eq!(name(Method::POST, "/login"), ["login-post"]);
        assert_eq!(name(Method::GET, "/login"), ["login-any"]);
        assert_eq!(name(Method::GET, "/items"), ["items"]);
        assert_eq!(name(Method::HEAD, "/items"), ["items"]);
        assert_eq!(name(Method::POST, "/items"), ["other"]);
        assert_eq!(name(Method::GET, "/elsewhere"), ["other"]);
    }

    /// The names of the limits a request gets, without axum's `MatchedPath`.
    fn names_for(policy: &crate::web::policy::Policy, method: Method, path: &str) -> Vec<String> {
        let (parts, _) = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
            .into_parts();
        let g = policy.routes.group_for(&parts);
        policy.groups[g]
            .limits
            .iter()
            .map(|&i| policy.limits[i].limit.name().to_owned())
            .collect()
    }

    #[test]
    fn without_a_matched_path_templates_match_the_request_path() {
        let q = Quota::per_second(1);
        let layer = RateLimitLayer::builder(MemoryStore::new())
            .route("/users/{id}", Limit::new("user", q))
            .route("POST /users/{id}", Limit::new("user-post", q))
            .route("GET /users/me", Limit::new("me", q))
            .route("/files/{*rest}", Limit::new("files", q))
            .route("/orgs/{org}/repos/{repo}", Limit::new("repo", q))
            .route("/plain", Limit::new("plain", q))
            .route_default(Limit::new("other", q))
            .build()
            .unwrap();
        let name = |m: Method, p: &str| layer.source.with(|s| names_for(&s.policy, m, p));
        assert_eq!(name(Method::GET, "/users/7"), ["user"]);
        assert_eq!(name(Method::GET, "/users/8"), ["user"]);
        assert_eq!(name(Method::DELETE, "/users/8"), ["user"]);
        assert_eq!(name(Method::POST, "/users/7"), ["user-post"]);
        assert_eq!(name(Method::GET, "/users/me"), ["me"], "static wins");
        assert_eq!(name(Method::HEAD, "/users/me"), ["me"], "HEAD uses GET");
        assert_eq!(name(Method::POST, "/users/me"), ["other"]);
        assert_eq!(name(Method::GET, "/files/a/b.txt"), ["files"]);
        assert_eq!(name(Method::GET, "/orgs/x/repos/y"), ["repo"]);
        assert_eq!(name(Method::GET, "/plain"), ["plain"]);
        assert_eq!(
            name(Method::GET, "/plain?q=1"),
            ["plain"],
            "the query is not the path"
        );
        for unmatched in [
            "/users",
            "/users/7/x",
            "/users/",
            "/files/",
            "/plain/",
            "/x",
        ] {
            assert_eq!(name(Method::GET, unmatched), ["other"], "{unmatched}");
        }
        // The template itself, as a raw path, is just a path like any other.
        assert_eq!(name(Method::GET, "/users/%7Bid%7D"), ["user"]);
    }

    fn build_err(route: &str) -> ConfigError {
        RateLimitLayer::builder(MemoryStore::new())
            .route(route, Limit::new("a", Quota::per_second(1)))
            .build()
            .map(|_| ())
            .expect_err(route)
    }

    #[test]
    fn a_misspelt_or_lower_case_method_is_refused_not_a_route_that_never_matches() {
        for (route, hint) in [
            ("PSOT /a", "expected GET, HEAD, POST"),
            ("GETT /a", "expected GET, HEAD, POST"),
            ("PURGE /a", "no method for every method"),
            ("post /b", "write `POST`"),
            ("Get /b", "write `GET`"),
            ("delete /users/{id}", "write `DELETE`"),
        ] {
            let err = build_err(route);
            assert_eq!(err.field(), format!("routes[{route:?}]"), "{err}");
            assert!(err.reason().contains("is not a method"), "{route}: {err}");
            assert!(err.reason().contains(hint), "{route}: {err}");
        }
        for m in METHODS {
            let route = format!("{m} /a");
            assert_eq!(parse_route(&route).unwrap(), (Some(m), "/a"));
        }
    }

    #[test]
    fn an_axum_0_7_colon_or_star_parameter_is_refused_not_a_route_that_never_matches() {
        for (route, written) in [
            ("GET /users/:id", "`{id}`"),
            ("/orgs/:org/repos", "`{org}`"),
            ("/files/*rest", "`{*rest}`"),
            ("/a/:", "`{id}`"),
            ("/a/*", "`{*rest}`"),
        ] {
            let err = build_err(route);
            assert_eq!(err.field(), format!("routes[{route:?}]"), "{err}");
            assert!(err.reason().contains("axum 0.8"), "{route}: {err}");
            assert!(err.reason().contains(written), "{route}: {err}");
        }
        // A colon or a star inside a segment is a plain character.
        assert!(parse_route("/v1/things:batch").is_ok());
        assert!(parse_route("/a/b*").is_ok());
    }

    #[test]
    fn a_query_a_fragment_or_unbalanced_braces_in_a_path_are_refused_not_a_route_that_never_matches()
     {
        for (route, reason) in [
            ("", "starting with `/`"),
            ("GET", "starting with `/`"),
            ("GET users", "starting with `/`"),
            ("/search?q=1", "query"),
            ("/page#top", "fragment"),
            ("/users/{id", "valid name"),
            ("/users/id}", "valid name"),
            ("/a/{}", "valid name"),
        ] {
            let err = build_err(route);
            assert_eq!(err.field(), format!("routes[{route:?}]"), "{err}");
            assert!(err.reason().contains(reason), "{route:?}: {err}");
        }
    }
}
