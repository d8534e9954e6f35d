//! Whether two route templates can match the same request path: the check behind
//! [`RateLimitBuilder::app_routes`](crate::RateLimitBuilder::app_routes), which logs the
//! route-table patterns that none of the app's routes can ever meet.
//!
//! The answer errs one way only: "no" is a proof (no path matches both), "yes" may be a
//! guess for segments it does not model exactly (a parameter inside a segment, escaped
//! braces), which it takes as "any non-empty segment".

use http::Method;

/// One segment of a template, in axum 0.8's (matchit's) syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg<'a> {
    /// Matches itself only (possibly the empty segment of a trailing `/`).
    Literal(&'a str),
    /// `{name}`, or any segment holding braces (an over-estimate for the rarer forms): one
    /// segment, empty only when more segments follow (axum's matcher takes `//x` for
    /// `/{p}/x`, not `/` for `/{p}`).
    One,
    /// `{*name}`, the last segment: the rest of the path, not empty.
    Rest,
}

fn segments(template: &str) -> Vec<Seg<'_>> {
    template
        .split('/')
        .map(|s| {
            if s.starts_with("{*") && s.ends_with('}') {
                Seg::Rest
            } else if s.contains('{') || s.contains('}') {
                Seg::One
            } else {
                Seg::Literal(s)
            }
        })
        .collect()
}

/// Whether some request path could be matched by both templates (paths only).
pub(crate) fn paths_overlap(a: &str, b: &str) -> bool {
    overlap(&segments(a), &segments(b))
}

/// Whether a route-table entry (`method`, `template`) could meet a request the app routes
/// to `app` (`app_method`: `None` for every method). `HEAD` requests reach `GET` routes.
pub(crate) fn routes_overlap(
    (method, template): (Option<&Method>, &str),
    (app_method, app): (Option<&Method>, &str),
) -> bool {
    let methods = match (method, app_method) {
        (Some(m), Some(a)) => m == a || (*m == Method::HEAD && *a == Method::GET),
        _ => true,
    };
    methods && paths_overlap(template, app)
}

fn overlap(a: &[Seg<'_>], b: &[Seg<'_>]) -> bool {
    match (a.split_first(), b.split_first()) {
        (None, None) => true,
        (Some((Seg::Rest, _)), _) => rest_not_empty(b),
        (_, Some((Seg::Rest, _))) => rest_not_empty(a),
        (None, Some(_)) | (Some(_), None) => false,
        (Some((x, a)), Some((y, b))) => {
            segment_overlap((*x, a.is_empty()), (*y, b.is_empty())) && overlap(a, b)
        }
    }
}

/// Whether the segments left could spell a non-empty rest of a path.
fn rest_not_empty(segs: &[Seg<'_>]) -> bool {
    match segs {
        [] => false,
        [Seg::Literal(s)] => !s.is_empty(),
        _ => true,
    }
}

/// Whether two segments, each with whether it is its template's last, meet. A parameter
/// matches an empty segment (`//`) except at the end of a path, as axum's matcher does.
fn segment_overlap((x, x_last): (Seg<'_>, bool), (y, y_last): (Seg<'_>, bool)) -> bool {
    match (x, y) {
        (Seg::Literal(p), Seg::Literal(q)) => p == q,
        (Seg::Literal(p), _) => !p.is_empty() || !y_last,
        (_, Seg::Literal(p)) => !p.is_empty() || !x_last,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn literals_parameters_and_the_rest() {
        for (a, b, both) in [
            ("/api/{*rest}", "/api/items", true),
            ("/api/{*rest}", "/api/items/{id}", true),
            ("/api/{*rest}", "/api", false),
            ("/api/{*rest}", "/api/", false),
            ("/api/{*rest}", "/apix/items", false),
            ("/users/{id}", "/users/me", true),
            ("/users/{id}", "/users/{name}", true),
            ("/users/{id}", "/users/", false),
            ("/a/{p}/b", "/a//b", true),
            ("/a/{p}/{*r}", "/a//x", true),
            ("/{p}", "/", false),
            ("/users/{id}", "/users/{id}/posts", false),
            ("/", "/", true),
            ("/", "/{*rest}", false),
            ("/{*rest}", "/a/b/c", true),
            ("/a/", "/a/{*rest}", false),
            ("/a//", "/a/{*rest}", true),
            ("/login", "/logout", false),
            ("/files/{name}.txt", "/files/a.txt", true),
            ("/v1/{{x}}", "/v1/y", true),
            // An escaped brace alone (`}}` is a literal `}`) is still taken as any segment.
            ("/a}}", "/a}", true),
            ("/a{{", "/a{", true),
        ] {
            assert_eq!(paths_overlap(a, b), both, "{a} and {b}");
            assert_eq!(paths_overlap(b, a), both, "{b} and {a}");
        }
    }

    #[test]
    fn methods_must_meet() {
        let (get, post, head) = (Method::GET, Method::POST, Method::HEAD);
        assert!(routes_overlap((Some(&post), "/login"), (None, "/login")));
        assert!(routes_overlap((None, "/login"), (Some(&post), "/login")));
        assert!(!routes_overlap(
            (Some(&post), "/login"),
            (Some(&get), "/login")
        ));
        assert!(routes_overlap((Some(&head), "/a"), (Some(&get), "/a")));
        assert!(!routes_overlap((Some(&get), "/a"), (Some(&get), "/b")));
    }

    /// A path that both match, segment by segment, where `overlap` says there is one.
    fn witness(a: &[Seg<'_>], b: &[Seg<'_>]) -> Option<Vec<String>> {
        let instance = |segs: &[Seg<'_>]| {
            segs.iter()
                .map(|s| match s {
                    Seg::Literal(l) => (*l).to_owned(),
                    Seg::One | Seg::Rest => "x".to_owned(),
                })
                .collect::<Vec<_>>()
        };
        match (a.split_first(), b.split_first()) {
            (None, None) => Some(Vec::new()),
            (Some((Seg::Rest, _)), _) => rest_not_empty(b).then(|| instance(b)),
            (_, Some((Seg::Rest, _))) => rest_not_empty(a).then(|| instance(a)),
            (None, Some(_)) | (Some(_), None) => None,
            (Some((x, a)), Some((y, b))) => {
                let here = match (*x, *y) {
                    (Seg::Literal(p), Seg::Literal(q)) => (p == q).then(|| p.to_owned()),
                    (Seg::Literal(p), _) => (!p.is_empty() || !b.is_empty()).then(|| p.to_owned()),
                    (_, Seg::Literal(p)) => (!p.is_empty() || !a.is_empty()).then(|| p.to_owned()),
                    _ => Some("z".to_owned()),
                }?;
                let mut rest = witness(a, b)?;
                rest.insert(0, here);
                Some(rest)
            }
        }
    }

    /// A template from a small alphabet, so that generated ones often meet.
    fn template() -> impl Strategy<Value = String> {
        let seg = prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just(String::new()),
            Just("{p}".to_owned()),
        ];
        (proptest::collection::vec(seg, 0..4), proptest::bool::ANY).prop_map(|(segs, rest)| {
            let mut t = String::new();
            for s in segs {
                t.push('/');
                t.push_str(&s);
            }
            if rest {
                t.push_str("/{*r}");
            }
            if t.is_empty() {
                t.push('/');
            }
            t
        })
    }

    fn path() -> impl Strategy<Value = String> {
        let seg = prop_oneof![Just("a"), Just("b"), Just(""), Just("c"), Just("{p}")];
        proptest::collection::vec(seg, 0..6).prop_map(|segs| {
            let p: String = segs.iter().map(|s| format!("/{s}")).collect();
            if p.is_empty() { "/".to_owned() } else { p }
        })
    }

    proptest! {
        /// "No" is a proof: a path that both templates match (as axum's matcher matches
        /// them) is never missed.
        #[test]
        fn never_says_no_to_a_path_both_match(
            a in template(),
            b in template(),
            paths in proptest::collection::vec(path(), 1..40),
        ) {
            let router = |t: &str| {
                let mut r = matchit::Router::new();
                r.insert(t, ()).ok().map(|()| r)
            };
            let (Some(ra), Some(rb)) = (router(&a), router(&b)) else {
                return Ok(());
            };
            for p in &paths {
                if ra.at(p).is_ok() && rb.at(p).is_ok() {
                    prop_assert!(paths_overlap(&a, &b), "{a} and {b} both match {p}");
                }
            }
            // "Yes" has a witness: a path both match.
            if paths_overlap(&a, &b) {
                let w = witness(&segments(&a), &segments(&b));
                prop_assert!(w.is_some(), "{a} and {b}: no witness");
                let w = w.unwrap().join("/");
                prop_assert!(ra.at(&w).is_ok() && rb.at(&w).is_ok(), "{a}, {b}: {w}");
            }
            // And each template's own instances.
            let instance = |t: &str| t.replace("{*r}", "x/y").replace("{p}", "z");
            for p in [instance(&a), instance(&b)] {
                if ra.at(&p).is_ok() && rb.at(&p).is_ok() {
                    prop_assert!(paths_overlap(&a, &b), "{a} and {b} both match {p}");
                }
            }
        }
    }
}
