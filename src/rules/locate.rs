//! Where things are in a rules document: the byte spans of every key and value, for
//! turning a field path (`limits[2].quota`) into a line, and an error's offset into a
//! field path. TOML through `toml`'s spanned tree; JSON through a small scanner (the text
//! has already been accepted by `serde_json` when it runs, or refused with a data error).
//!
//! Both walk the document recursively, so both stop at [`MAX_DEPTH`] levels: a hostile
//! file nested ten thousand levels deep is refused, not a stack overflow. The JSON scanner
//! also stops at [`MAX_NODES`] values: `serde_json` stops at a document's first error, and
//! the spans of every value of a large file would cost many times its size (an error then
//! names the line, without the field).

use std::ops::Range;

use crate::rules::format::{Format, line_of};

/// How deep a document may nest: far more than a valid one (four levels: the document,
/// `limits`, a limit, its `plans`), few enough that walking it recursively is safe on any
/// thread's stack.
pub(crate) const MAX_DEPTH: usize = 128;

/// How many values of a JSON document get a span: far more than a valid document has
/// (a few per limit), few enough that the spans take a few megabytes at most.
const MAX_NODES: usize = 100_000;

/// Why a document has no [`Tree`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unparsed {
    /// It does not parse.
    Invalid,
    /// It nests deeper than [`MAX_DEPTH`]: the byte offset of the first value too deep.
    TooDeep(usize),
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A value and where it is.
struct Node {
    span: Range<usize>,
    kind: Kind,
}

enum Kind {
    Leaf,
    /// Entries with the span of their key.
    Table(Vec<(String, Range<usize>, Node)>),
    Array(Vec<Node>),
}

/// The spans of a document.
pub(crate) struct Tree {
    root: Node,
}

impl Tree {
    /// The tree of `text`, or why there is none.
    pub(crate) fn parse(text: &str, format: Format) -> Result<Self, Unparsed> {
        let root = match format {
            Format::Toml => {
                let table = toml::de::DeTable::parse(text).map_err(|_| Unparsed::Invalid)?;
                toml_table(table.get_ref(), table.span(), 0)?
            }
            Format::Json => {
                let mut scanner = Scanner {
                    text,
                    at: 0,
                    depth: 0,
                    too_deep: None,
                    nodes: 0,
                };
                let Some(node) = scanner.value() else {
                    return Err(scanner
                        .too_deep
                        .map_or(Unparsed::Invalid, Unparsed::TooDeep));
                };
                scanner.skip_ws();
                if scanner.at != text.len() {
                    return Err(Unparsed::Invalid);
                }
                node
            }
        };
        Ok(Self { root })
    }

    /// The line where `path` is written: its key if it is a table entry, else the value;
    /// for a path that goes deeper than the document (`limits[0].quota.rate`), the deepest
    /// part that exists.
    pub(crate) fn line(&self, text: &str, path: &str) -> Option<usize> {
        let segs = parse_path(path);
        let mut node = &self.root;
        let mut at = None;
        for seg in &segs {
            let next = match (seg, &node.kind) {
                (Seg::Key(k), Kind::Table(entries)) => entries
                    .iter()
                    .find(|(name, _, _)| name == k)
                    .map(|(_, key, value)| (key.start, value)),
                (Seg::Index(i), Kind::Array(items)) => items.get(*i).map(|v| (v.span.start, v)),
                _ => None,
            };
            match next {
                Some((start, value)) => {
                    at = Some(start);
                    node = value;
                }
                None => break,
            }
        }
        at.map(|offset| line_of(text, offset))
    }

    /// The path of the deepest key or value at byte `offset` (`limits[0].quotaa`).
    pub(crate) fn path_at(&self, offset: usize) -> Option<String> {
        let mut segs = Vec::new();
        let mut node = &self.root;
        loop {
            let inside = |r: &Range<usize>| r.start <= offset && offset <= r.end;
            let next = match &node.kind {
                Kind::Table(entries) => entries
                    .iter()
                    .find(|(_, key, value)| inside(key) || inside(&value.span))
                    .map(|(name, _, value)| (Seg::Key(name.clone()), value)),
                Kind::Array(items) => items
                    .iter()
                    .enumerate()
                    .find(|(_, v)| inside(&v.span))
                    .map(|(i, v)| (Seg::Index(i), v)),
                Kind::Leaf => None,
            };
            match next {
                Some((seg, value)) => {
                    segs.push(seg);
                    node = value;
                }
                None => break,
            }
        }
        (!segs.is_empty()).then(|| render_path(&segs))
    }
}

/// `limits[2].plans.pro`; keys that are not plain names are quoted (`plans["a b"]`).
pub(crate) fn render_path(segs: &[Seg]) -> String {
    let mut out = String::new();
    for seg in segs {
        match seg {
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Key(k) if is_plain(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Key(k) => out.push_str(&format!("[{k:?}]")),
        }
    }
    out
}

fn is_plain(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The steps of a path made by [`render_path`].
fn parse_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            rest = r;
        } else if let Some(r) = rest.strip_prefix("[\"") {
            // A quoted key, as `{:?}` writes it.
            let mut key = String::new();
            let mut chars = r.char_indices();
            let mut end = r.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, e)) = chars.next() {
                            key.push(e);
                        }
                    }
                    '"' => {
                        end = i;
                        break;
                    }
                    c => key.push(c),
                }
            }
            segs.push(Seg::Key(key));
            rest = r.get(end + 1..).unwrap_or("");
            rest = rest.strip_prefix(']').unwrap_or(rest);
        } else if let Some(r) = rest.strip_prefix('[') {
            let close = r.find(']').unwrap_or(r.len());
            match r[..close].parse() {
                Ok(i) => segs.push(Seg::Index(i)),
                Err(_) => break,
            }
            rest = r.get(close + 1..).unwrap_or("");
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            segs.push(Seg::Key(rest[..end].to_owned()));
            rest = &rest[end..];
        }
    }
    segs
}

/// A TOML table at `depth`. Its span is widened to cover its entries: the span `toml`
/// gives an array of tables is its first header's.
fn toml_table(
    table: &toml::de::DeTable<'_>,
    span: Range<usize>,
    depth: usize,
) -> Result<Node, Unparsed> {
    if depth >= MAX_DEPTH {
        return Err(Unparsed::TooDeep(span.start));
    }
    let entries = table
        .iter()
        .map(|(key, value)| {
            Ok((
                key.get_ref().to_string(),
                key.span(),
                toml_value(value.get_ref(), value.span(), depth + 1)?,
            ))
        })
        .collect::<Result<Vec<_>, Unparsed>>()?;
    let span = entries.iter().fold(span, |s, (_, key, value)| {
        s.start.min(key.start).min(value.span.start)..s.end.max(key.end).max(value.span.end)
    });
    Ok(Node {
        span,
        kind: Kind::Table(entries),
    })
}

fn toml_value(
    value: &toml::de::DeValue<'_>,
    span: Range<usize>,
    depth: usize,
) -> Result<Node, Unparsed> {
    match value {
        toml::de::DeValue::Table(t) => toml_table(t, span, depth),
        toml::de::DeValue::Array(items) => {
            if depth >= MAX_DEPTH {
                return Err(Unparsed::TooDeep(span.start));
            }
            let items = items
                .iter()
                .map(|v| toml_value(v.get_ref(), v.span(), depth + 1))
                .collect::<Result<Vec<Node>, Unparsed>>()?;
            let span = items.iter().fold(span, |s, v| {
                s.start.min(v.span.start)..s.end.max(v.span.end)
            });
            Ok(Node {
                span,
                kind: Kind::Array(items),
            })
        }
        _ => Ok(Node {
            span,
            kind: Kind::Leaf,
        }),
    }
}

/// A JSON reader that keeps spans, and stops at [`MAX_DEPTH`] levels.
struct Scanner<'a> {
    text: &'a str,
    at: usize,
    /// The objects and arrays open around `at`.
    depth: usize,
    /// Where the value deeper than [`MAX_DEPTH`] starts, once met.
    too_deep: Option<usize>,
    /// The values met so far, up to [`MAX_NODES`].
    nodes: usize,
}

impl Scanner<'_> {
    fn skip_ws(&mut self) {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && matches!(bytes[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// An object or an array opens at `start`: one level deeper, unless that is too deep.
    fn enter(&mut self, start: usize) -> Option<()> {
        if self.depth >= MAX_DEPTH {
            self.too_deep = Some(start);
            return None;
        }
        self.depth += 1;
        self.at += 1;
        Some(())
    }

    fn value(&mut self) -> Option<Node> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return None;
        }
        self.skip_ws();
        let start = self.at;
        let kind = match self.peek()? {
            b'{' => {
                self.enter(start)?;
                let mut entries = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                } else {
                    loop {
                        self.skip_ws();
                        let key_start = self.at;
                        let key = self.string()?;
                        let key_span = key_start..self.at;
                        self.skip_ws();
                        (self.peek()? == b':').then_some(())?;
                        self.at += 1;
                        let value = self.value()?;
                        entries.push((key, key_span, value));
                        self.skip_ws();
                        match self.peek()? {
                            b',' => self.at += 1,
                            b'}' => {
                                self.at += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                Kind::Table(entries)
            }
            b'[' => {
                self.enter(start)?;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.at += 1;
                } else {
                    loop {
                        items.push(self.value()?);
                        self.skip_ws();
                        match self.peek()? {
                            b',' => self.at += 1,
                            b']' => {
                                self.at += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                Kind::Array(items)
            }
            b'"' => {
                self.string()?;
                Kind::Leaf
            }
            _ => {
                // A number or a literal: up to the next delimiter.
                let bytes = self.text.as_bytes();
                while self.at < bytes.len()
                    && !matches!(
                        bytes[self.at],
                        b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    self.at += 1;
                }
                (self.at > start).then_some(())?;
                Kind::Leaf
            }
        };
        Some(Node {
            span: start..self.at,
            kind,
        })
    }

    /// A string, decoded.
    fn string(&mut self) -> Option<String> {
        let bytes = self.text.as_bytes();
        (self.peek()? == b'"').then_some(())?;
        let start = self.at;
        self.at += 1;
        while self.at < bytes.len() {
            match bytes[self.at] {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return serde_json::from_str(self.text.get(start..self.at)?).ok();
                }
                _ => self.at += 1,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = "[settings]\nheaders = \"none\"\n\n[[limits]]\nname = \"a\"\n\n[[limits]]\nname = \"b\"\nquota = \"1/s\"\n[limits.plans]\npro = \"2/s\"\n";
    const JSON: &str = "{\n  \"settings\": {\"headers\": \"none\"},\n  \"limits\": [\n    {\"name\": \"a\"},\n    {\n      \"name\": \"b\",\n      \"quota\": \"1/s\",\n      \"plans\": {\"pro\": \"2/s\"}\n    }\n  ]\n}\n";

    #[test]
    fn paths_to_lines_and_back() {
        for (text, format, lines) in [
            (TOML, Format::Toml, [2, 5, 9, 11]),
            (JSON, Format::Json, [2, 4, 7, 8]),
        ] {
            let tree = Tree::parse(text, format).unwrap();
            let paths = [
                "settings.headers",
                "limits[0].name",
                "limits[1].quota",
                "limits[1].plans.pro",
            ];
            for (path, line) in paths.iter().zip(lines) {
                assert_eq!(tree.line(text, path), Some(line), "{format:?} {path}");
            }
            // Deeper than the document: the deepest part that exists.
            assert_eq!(tree.line(text, "limits[1].quota.rate"), Some(lines[2]));
            assert_eq!(tree.line(text, "nothing"), None);
            let at = text.find("\"2/s\"").unwrap();
            assert_eq!(tree.path_at(at + 1).as_deref(), Some("limits[1].plans.pro"));
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_walked() {
        // Deeper than the limit: refused at the first value too deep, in both formats.
        let deep = 10_000;
        let json = format!("{{\"limits\": {}{}}}", "[".repeat(deep), "]".repeat(deep));
        let first = json.find('[').unwrap();
        assert_eq!(
            Tree::parse(&json, Format::Json).err(),
            Some(Unparsed::TooDeep(first + MAX_DEPTH - 1))
        );
        let keys = vec!["a"; deep].join(".");
        for toml in [format!("[{keys}]\nx = 1\n"), format!("{keys} = 1\n")] {
            assert!(Tree::parse(&toml, Format::Toml).is_err());
        }
        // Up to the limit: parsed.
        let json = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(Tree::parse(&json, Format::Json).is_ok());
    }

    #[test]
    fn a_json_document_of_too_many_values_gets_no_spans() {
        let values = |n: usize| format!("{{\"limits\": [{}1]}}", "1,".repeat(n - 1));
        // The document, the array and its items.
        assert!(Tree::parse(&values(MAX_NODES - 2), Format::Json).is_ok());
        assert_eq!(
            Tree::parse(&values(MAX_NODES - 1), Format::Json).err(),
            Some(Unparsed::Invalid)
        );
        // Still an error with its line, from `serde_json`.
        let err = crate::rules::Document::from_json(&values(1_000_000)).unwrap_err();
        assert_eq!((err.line(), err.field()), (Some(1), ""));
    }

    #[test]
    fn quoted_keys_round_trip() {
        let segs = vec![
            Seg::Key("limits".into()),
            Seg::Index(3),
            Seg::Key("plans".into()),
            Seg::Key("a \"b\".c".into()),
        ];
        let path = render_path(&segs);
        assert_eq!(path, r#"limits[3].plans["a \"b\".c"]"#);
        assert_eq!(parse_path(&path), segs);
    }
}
