//! The parts of a request a document names: key parts (`peer_ip`, `header:<name>`,
//! `custom:<name>`, lists of these) and the sources a cost or a plan is read from.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

use crate::base::error::ConfigError;
use crate::web::key::{
    ClientIp, Global, Header, KeyBuilder, KeyError, KeyExtractor, PeerIp, Query,
};

/// Key parts registered by code, named `custom:<name>` in a document (the SQL source's
/// user key read from a request extension).
pub(crate) type CustomKeys = BTreeMap<String, Arc<dyn KeyExtractor>>;

/// An unknown value of `field`, with the values that are known.
pub(super) fn unknown(field: impl Into<String>, value: &str, expected: &str) -> ConfigError {
    ConfigError::new(
        field.into(),
        format!("unknown value `{value}`; expected one of: {expected}"),
    )
}

/// `header:<name>` or `query:<name>`: where a value is read.
pub(super) enum Source {
    Header(HeaderName),
    Query(Box<str>),
}

pub(super) fn source(text: &str, field: &str) -> Result<Option<Source>, ConfigError> {
    let bad = |reason: String| ConfigError::new(field.to_owned(), reason);
    if let Some(name) = text.strip_prefix("header:") {
        let name = HeaderName::try_from(name.trim())
            .map_err(|_| bad(format!("`{name}` is not a header name")))?;
        return Ok(Some(Source::Header(name)));
    }
    if let Some(name) = text.strip_prefix("query:") {
        let name = name.trim();
        if name.is_empty() {
            return Err(bad(format!("`{text}` names no query parameter")));
        }
        return Ok(Some(Source::Query(name.into())));
    }
    Ok(None)
}

/// One key part named by `text` (`global`, `peer_ip`, `client_ip`, `route`,
/// `header:<name>`, `query:<name>`, `custom:<name>`); errors are named by `field`.
pub(super) fn key_part(
    text: &str,
    client: Option<&ClientIp>,
    keys: &CustomKeys,
    field: &str,
) -> Result<Box<dyn KeyExtractor>, ConfigError> {
    if let Some(name) = text.strip_prefix("custom:") {
        return keys
            .get(name)
            .map(|k| Box::new(Custom(k.clone())) as Box<dyn KeyExtractor>)
            .ok_or_else(|| {
                ConfigError::new(
                    field.to_owned(),
                    format!("`{text}`: no key part called `{name}` was registered by code"),
                )
            });
    }
    match text {
        "global" => return Ok(Box::new(Global)),
        "peer_ip" => return Ok(Box::new(PeerIp::new())),
        "client_ip" => {
            return client
                .map(|c| Box::new(c.clone()) as Box<dyn KeyExtractor>)
                .ok_or_else(|| {
                    ConfigError::new(
                        field.to_owned(),
                        "`client_ip` needs `trusted_proxies` or `hops` in `[settings]`: which \
                         proxies may tell the client's address (use `peer_ip` without proxies)",
                    )
                });
        }
        #[cfg(feature = "axum")]
        "route" => return Ok(Box::new(crate::web::key::Route)),
        #[cfg(not(feature = "axum"))]
        "route" => {
            return Err(ConfigError::new(
                field.to_owned(),
                "`route` reads axum's matched path: it needs the `axum` feature",
            ));
        }
        _ => {}
    }
    match source(text, field)? {
        Some(Source::Header(name)) => Ok(Box::new(Header::from_name(name))),
        Some(Source::Query(name)) => Ok(Box::new(Query::new(name))),
        None => Err(unknown(
            field,
            text,
            "global, peer_ip, client_ip, route, header:<name>, query:<name>, or a list of these",
        )),
    }
}

/// A key extractor chosen at run time.
pub(super) struct One(pub(super) Box<dyn KeyExtractor>);

impl KeyExtractor for One {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.extract(parts, key)
    }

    fn describe(&self) -> Option<String> {
        self.0.describe()
    }
}

/// A key part registered by code (`custom:<name>`).
struct Custom(Arc<dyn KeyExtractor>);

impl KeyExtractor for Custom {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.extract(parts, key)
    }

    fn describe(&self) -> Option<String> {
        self.0.describe()
    }
}

/// A composite key of parts chosen at run time (a list in the document): every part,
/// missing if any part is missing, as a tuple of extractors.
pub(super) struct Composite(pub(super) Vec<Box<dyn KeyExtractor>>);

impl KeyExtractor for Composite {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.iter().try_for_each(|p| p.extract(parts, key))
    }

    fn describe(&self) -> Option<String> {
        crate::web::key::describe_all(self.0.iter().map(|p| p.describe()))
    }
}
