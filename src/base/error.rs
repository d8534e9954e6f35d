//! Configuration errors.

use std::borrow::Cow;
use std::fmt;

/// A configuration that cannot work, reported when the layer (or a quota) is built.
///
/// The error names the offending field, e.g. `limits["per-ip"].quota.burst`, so that a
/// value read from a configuration file can be traced back to its source. Errors of a
/// rules document (feature `rules`) also name the [`file`](Self::file) and the
/// [`line`](Self::line), and display as `rules.toml:14: limits[2].quota: <reason>`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.field(), "rate");
/// assert_eq!(err.to_string(), "invalid `rate`: must be at least 1");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: Cow<'static, str>,
    reason: Cow<'static, str>,
    /// Where in a rules document the value was written (boxed: rarely there).
    location: Option<Box<Location>>,
}

/// A place in a rules document.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    file: Option<Box<str>>,
    line: Option<usize>,
}

impl ConfigError {
    pub(crate) fn new(
        field: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
            location: None,
        }
    }

    /// The same error, located in a rules document: `file` (if it was read from one) and
    /// the 1-based `line` (if known).
    #[cfg(feature = "rules")]
    pub(crate) fn located(mut self, file: Option<&str>, line: Option<usize>) -> Self {
        if file.is_some() || line.is_some() {
            self.location = Some(Box::new(Location {
                file: file.map(Into::into),
                line,
            }));
        }
        self
    }

    /// The same error about another field (a rules document's path for it).
    #[cfg(feature = "rules")]
    pub(crate) fn with_field(mut self, field: impl Into<Cow<'static, str>>) -> Self {
        self.field = field.into();
        self
    }

    /// Prefixes the field with the path of the structure that holds it
    /// (`burst` becomes `limits["api"].quota.burst`).
    pub(crate) fn within(mut self, parent: impl fmt::Display) -> Self {
        self.field = Cow::Owned(format!("{parent}.{}", self.field));
        self
    }

    /// The field that holds the bad value (empty for a syntax error of a rules document,
    /// which belongs to no field).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rules document the value was read from, if it was read from a file.
    pub fn file(&self) -> Option<&str> {
        self.location.as_ref()?.file.as_deref()
    }

    /// The line (1-based) of the rules document where the value was written, if known.
    pub fn line(&self) -> Option<usize> {
        self.location.as_ref()?.line
    }

    /// Why the value was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(at) = &self.location else {
            return write!(f, "invalid `{}`: {}", self.field, self.reason);
        };
        match (&at.file, at.line) {
            (Some(file), Some(line)) => write!(f, "{file}:{line}: ")?,
            (Some(file), None) => write!(f, "{file}: ")?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.reason)
    }
}

/// The message, as [`Display`](fmt::Display) writes it: what `main` prints when it returns
/// the error (`Error: invalid `rate`: must be at least 1`). `{:#?}` shows the parts.
impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("ConfigError")
                .field("field", &self.field)
                .field("reason", &self.reason)
                .field("file", &self.file())
                .field("line", &self.line())
                .finish();
        }
        write!(f, "{self}")
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_the_message_so_main_prints_it() {
        let err = ConfigError::new("rate", "must be at least 1");
        assert_eq!(format!("{err:?}"), "invalid `rate`: must be at least 1");
        let boxed: Box<dyn std::error::Error> = Box::new(err.clone());
        assert_eq!(format!("{boxed:?}"), "invalid `rate`: must be at least 1");
        assert!(format!("{err:#?}").contains("reason: \"must be at least 1\""));
    }
}
