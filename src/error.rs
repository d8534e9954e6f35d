//! Configuration errors.

use std::borrow::Cow;
use std::fmt;

/// A configuration that cannot work, reported when the layer (or a quota) is built.
///
/// The error names the offending field, e.g. `limits["per-ip"].quota.burst`, so that a
/// value read from a configuration file can be traced back to its source.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.field(), "rate");
/// assert_eq!(err.to_string(), "invalid `rate`: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: Cow<'static, str>,
    reason: Cow<'static, str>,
}

impl ConfigError {
    pub(crate) fn new(
        field: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Prefixes the field with the path of the structure that holds it
    /// (`burst` becomes `limits["api"].quota.burst`).
    pub(crate) fn within(mut self, parent: impl fmt::Display) -> Self {
        self.field = Cow::Owned(format!("{parent}.{}", self.field));
        self
    }

    /// The field that holds the bad value.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why the value was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}
