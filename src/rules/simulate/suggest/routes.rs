//! `suggest --route`: a request's route template (ids grouped: `/users/{id}`), and the
//! routes chosen for the suggestion, matched as the rules' route table matches them.

use std::collections::HashMap;

use http::Method;

use crate::web::routes::{self, RouteTable};

/// The most distinct route candidates counted while choosing the routes; requests of
/// further ones are counted together.
pub(super) const MAX_CANDIDATES: usize = 10_000;

/// The longest route template a candidate may have, in bytes: the candidates' memory is
/// at most about `MAX_CANDIDATES × MAX_TEMPLATE` (2.5 MiB), whatever the log's paths.
pub(super) const MAX_TEMPLATE: usize = 256;

/// The route template of a request path: segments that look like ids (numbers, UUIDs,
/// long tokens with digits) become parameters (`/users/{id}/posts/{id2}`), braces are
/// escaped. `None` for a path no route template can name (one that does not start with
/// `/`, has a segment starting with `:` or `*`, or is longer than [`MAX_TEMPLATE`]).
pub(super) fn template(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    if path.len() > MAX_TEMPLATE {
        return None;
    }
    let mut out = String::with_capacity(path.len() + 8);
    let mut ids = 0;
    for segment in rest.split('/') {
        out.push('/');
        if segment.starts_with(':') || segment.starts_with('*') {
            return None;
        }
        if is_id(segment) {
            ids += 1;
            match ids {
                1 => out.push_str("{id}"),
                n => {
                    out.push_str("{id");
                    out.push_str(&n.to_string());
                    out.push('}');
                }
            }
        } else {
            for c in segment.chars() {
                match c {
                    '{' => out.push_str("{{"),
                    '}' => out.push_str("}}"),
                    c => out.push(c),
                }
            }
        }
    }
    (out.len() <= MAX_TEMPLATE).then_some(out)
}

/// A path segment that names one thing of many: all digits, a UUID, or a token of 16 or
/// more letters, digits, `-` and `_` with a digit in it.
fn is_id(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() {
        return false;
    }
    if b.iter().all(u8::is_ascii_digit) {
        return true;
    }
    let uuid = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        });
    uuid || (b.len() >= 16
        && b.iter().any(u8::is_ascii_digit)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'))
}

/// The routes chosen: the table matching requests to them (group `i + 1` for route `i`)
/// and each route as a rules file writes it (`GET /users/{id}`).
pub(super) struct Chosen {
    pub(super) table: RouteTable,
    pub(super) specs: Vec<String>,
}

/// The `max` routes with the most requests (ties by name) that a rules file can name;
/// the others are left out.
pub(super) fn choose(candidates: HashMap<(Method, String), u64>, max: usize) -> Chosen {
    let mut all: Vec<_> = candidates.into_iter().collect();
    all.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.1.cmp(&b.0.1))
            .then_with(|| a.0.0.as_str().cmp(b.0.0.as_str()))
    });
    let mut table = RouteTable::default();
    let mut specs = Vec::new();
    for ((method, template), _) in all {
        if specs.len() >= max {
            break;
        }
        let spec = format!("{method} {template}");
        if routes::parse_route(&spec).is_err() {
            continue;
        }
        let group = specs.len() + 1;
        match table.entries_mut(&template) {
            Ok(entries) => entries.push((Some(method), group)),
            Err(_) => continue,
        }
        specs.push(spec);
    }
    Chosen { table, specs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_parameters() {
        assert_eq!(template("/users/42").as_deref(), Some("/users/{id}"));
        assert_eq!(
            template("/a/12/b/550e8400-e29b-41d4-a716-446655440000").as_deref(),
            Some("/a/{id}/b/{id2}")
        );
        assert_eq!(
            template("/static/app.css").as_deref(),
            Some("/static/app.css")
        );
        assert_eq!(template("/").as_deref(), Some("/"));
        assert_eq!(template("/x/{y}").as_deref(), Some("/x/{{y}}"));
        assert_eq!(
            template("/tok/abcdef0123456789").as_deref(),
            Some("/tok/{id}")
        );
        assert_eq!(template("/:id"), None);
        assert_eq!(template("*"), None);
        assert_eq!(template(&format!("/{}", "a".repeat(MAX_TEMPLATE))), None);
    }

    #[test]
    fn chooses_the_busiest_routes_a_table_can_hold() {
        let mut c = HashMap::new();
        c.insert((Method::GET, "/users/{id}".to_owned()), 10);
        c.insert((Method::POST, "/users/{id}".to_owned()), 5);
        c.insert((Method::GET, "/".to_owned()), 7);
        c.insert(
            (Method::from_bytes(b"BREW").unwrap(), "/pot".to_owned()),
            50,
        );
        c.insert((Method::GET, "/rare".to_owned()), 1);
        let chosen = choose(c, 3);
        assert_eq!(
            chosen.specs,
            ["GET /users/{id}", "GET /", "POST /users/{id}"]
        );
        let parts = |m: Method, p: &str| {
            let mut r = http::Request::new(());
            *r.method_mut() = m;
            *r.uri_mut() = p.parse().unwrap();
            r.into_parts().0
        };
        assert_eq!(
            chosen.table.group_for(&parts(Method::GET, "/users/alice")),
            1
        );
        assert_eq!(chosen.table.group_for(&parts(Method::HEAD, "/")), 2);
        assert_eq!(chosen.table.group_for(&parts(Method::POST, "/users/1")), 3);
        assert_eq!(chosen.table.group_for(&parts(Method::GET, "/rare")), 0);
    }
}
