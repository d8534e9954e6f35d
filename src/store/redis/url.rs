//! Redis URLs: what a store connects with, and how one is shown — never with its
//! password.

use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::base::error::ConfigError;

/// The connection settings of `url` (field `field` in errors), with the client's name and
/// version left out of the connection's set-up (`CLIENT SETINFO`): a command less for an
/// ACL user to allow, and one that managed services rename or forbid.
///
/// `rediss://` without the feature `redis-tls` is an error naming the feature.
pub(super) fn connection_info(
    url: &str,
    field: &'static str,
) -> Result<ConnectionInfo, ConfigError> {
    let shown = hide_password(url);
    if is_tls(url) && !cfg!(feature = "redis-tls") {
        return Err(ConfigError::new(
            field,
            format!("`{shown}`: `rediss://` (TLS) needs tollgate's feature `redis-tls`"),
        ));
    }
    let info = url
        .into_connection_info()
        .map_err(|e| ConfigError::new(field, format!("`{shown}`: {e}")))?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    Ok(info.set_redis_settings(settings))
}

/// Whether `url` asks for TLS (`rediss://`, in any case).
pub(super) fn is_tls(url: &str) -> bool {
    url.get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

/// `url` with the password of its user part (between `:` and `@` after the scheme) and the
/// value of a `password=` query parameter replaced by `***`, for error messages and logs.
pub(crate) fn hide_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let mut shown = url.to_owned();
    let rest = &url[scheme_end + 3..];
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    if let Some(at) = authority.rfind('@')
        && let Some(colon) = authority[..at].find(':')
    {
        let start = scheme_end + 3 + colon + 1;
        let end = scheme_end + 3 + at;
        shown.replace_range(start..end, "***");
    }
    if let Some(query) = shown.find('?') {
        let mut out = shown[..=query].to_owned();
        let (params, fragment) = match shown[query + 1..].split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (&shown[query + 1..], None),
        };
        for (i, param) in params.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match param.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                    out.push_str(name);
                    out.push_str("=***");
                }
                _ => out.push_str(param),
            }
        }
        if let Some(f) = fragment {
            out.push('#');
            out.push_str(f);
        }
        shown = out;
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hide_password_hides_only_the_password() {
        assert_eq!(
            hide_password("redis://u:secret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(hide_password("redis://:secret@h/"), "redis://:***@h/");
        assert_eq!(hide_password("rediss://u:s@cret@h/"), "rediss://u:***@h/");
        assert_eq!(hide_password("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(hide_password("redis://u@h/"), "redis://u@h/");
        assert_eq!(hide_password("not a url"), "not a url");
        assert_eq!(hide_password("redis://h/a:b@c"), "redis://h/a:b@c");
        assert_eq!(
            hide_password("redis://h/?protocol=resp3&password=secret#x"),
            "redis://h/?protocol=resp3&password=***#x"
        );
    }

    #[test]
    fn tls_is_the_rediss_scheme() {
        assert!(is_tls("rediss://h:6380/"));
        assert!(is_tls("REDISS://h/"));
        assert!(!is_tls("redis://h/"));
        assert!(!is_tls("rediss:/"));
    }

    #[test]
    fn rediss_without_the_feature_names_the_feature() {
        let result = connection_info("rediss://u:secret@127.0.0.1:6380/", "redis_url");
        if cfg!(feature = "redis-tls") {
            assert!(result.is_ok());
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.field(), "redis_url");
            assert!(err.reason().contains("redis-tls"), "{err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }

    #[test]
    fn connections_skip_the_client_name() {
        let info = connection_info("redis://u:p@127.0.0.1:6379/2", "redis_url").unwrap();
        assert!(info.redis_settings().skip_set_lib_name());
        assert_eq!(info.redis_settings().username(), Some("u"));
        assert_eq!(info.redis_settings().db(), 2);
    }
}
