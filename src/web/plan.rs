//! [`Plan`]: a request's plan, put in its extensions by the application's authentication.

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;

/// A request's plan, as your authentication found it: insert it in the request's
/// extensions before the rate limiter runs, and the limit chooses its quota by it
/// (`[limits.plans] from = "extension"` in a rules file, or [`Plan::of`] in
/// [`Limit::quota_by`](crate::Limit::quota_by)).
///
/// The plan then comes from who the client is, never from what the client says: a
/// header such as `x-plan` is the client's to forge, unless a gateway in front of the
/// application sets it.
///
/// A plan made from a `&'static str` allocates nothing; looking it up allocates nothing.
///
/// ```
/// use tollgate::{Limit, Plan, Quota, key::Header};
///
/// // In the authentication middleware, once the API key is known:
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Plan::from_static("pro"));
///
/// // The limit reads it:
/// let per_key = Limit::new("per-key", Quota::per_minute(10)) // free: the limit's own
///     .key(Header::new("x-api-key"))
///     .quota_by(|parts| match Plan::of(parts)? {
///         "pro" => Some(Quota::per_second(10).burst(50)),
///         "enterprise" => Some(Quota::per_second(100).burst(500)),
///         _ => None,
///     });
/// # let _ = per_key;
/// let (parts, ()) = request.into_parts();
/// assert_eq!(Plan::of(&parts), Some("pro"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Plan(Cow<'static, str>);

impl Plan {
    /// A plan called `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self(name.into())
    }

    /// A plan called `name`, without allocating.
    pub const fn from_static(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The name of the plan in a request's extensions, if any.
    pub fn of(parts: &Parts) -> Option<&str> {
        parts.extensions.get::<Plan>().map(Plan::name)
    }
}

impl From<&'static str> for Plan {
    fn from(name: &'static str) -> Self {
        Self::from_static(name)
    }
}

impl From<String> for Plan {
    fn from(name: String) -> Self {
        Self::new(name)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_read_from_the_extensions() {
        let mut request = http::Request::new(());
        let (parts, ()) = http::Request::new(()).into_parts();
        assert_eq!(Plan::of(&parts), None);
        request
            .extensions_mut()
            .insert(Plan::new(String::from("pro")));
        let (parts, ()) = request.into_parts();
        assert_eq!(Plan::of(&parts), Some("pro"));
        assert_eq!(Plan::from("free").to_string(), "free");
        assert!(matches!(Plan::from_static("free").0, Cow::Borrowed(_)));
    }
}
