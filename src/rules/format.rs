//! [`Format`]: how a rules document is written (TOML or JSON), and [`line_of`]: the line
//! of a byte offset, shared by the parser's errors and the span scanner.

/// The format of a rules document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Format {
    /// TOML (the default).
    #[default]
    Toml,
    /// JSON, with the same names.
    Json,
}

impl Format {
    /// The format a file name suggests: JSON for `.json`, TOML otherwise.
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Format::Json,
            _ => Format::Toml,
        }
    }
}

/// The 1-based line of byte `offset`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
