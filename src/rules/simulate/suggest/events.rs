//! A log read as `suggest` reads it, the same way on every pass: the lines `simulate`
//! would replay (the same bad lines, the same times, a late line at the latest time seen),
//! each with its key (as the rules' key extractor makes it) and its route group.

use std::io::{self, BufRead};
use std::net::SocketAddr;

use http::{HeaderName, Method};

use super::super::lines::{Line, Lines};
use super::super::parse::{self, LogFormat};
use super::super::replay;
use super::super::uris::Uris;
use crate::model::key::{Key, KeyBuilder};
use crate::web::key::{PeerAddr, PeerIp};
use crate::web::routes::RouteTable;

/// What a bucket is: the client's address, or a request header's value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuggestKey {
    /// The client's address as `peer_ip` groups it (IPv4 per address, IPv6 per /56).
    Ip,
    /// A request header's value (`header:<name>`); JSON lines map it with
    /// [`JsonFields::header`](crate::rules::JsonFields::header).
    Header(HeaderName),
}

impl SuggestKey {
    /// The limit's `key` in a rules file.
    pub fn rules_key(&self) -> String {
        match self {
            Self::Ip => "peer_ip".into(),
            Self::Header(name) => format!("header:{name}"),
        }
    }
}

impl std::str::FromStr for SuggestKey {
    type Err = crate::base::error::ConfigError;

    /// `ip` (or `peer_ip`), or `header:<name>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "ip" || s == "peer_ip" {
            return Ok(Self::Ip);
        }
        if let Some(name) = s.strip_prefix("header:")
            && let Ok(name) = HeaderName::from_bytes(name.as_bytes())
        {
            return Ok(Self::Header(name));
        }
        Err(crate::base::error::ConfigError::new(
            "--key",
            format!("`{s}`: expected ip or header:<name>"),
        ))
    }
}

/// How requests are grouped into routes.
pub(super) enum Grouping<'a> {
    /// One group, every request.
    All,
    /// Each request's route template ([`super::routes::template`]), to choose the routes.
    Candidates,
    /// The route table of the chosen routes: a request's group (0: none of them).
    Table(&'a RouteTable),
}

/// One line, as `suggest` sees it.
pub(super) enum Item {
    /// Not replayed: its reason.
    Bad(&'static str),
    /// Replayed, without the key (or, with routes, on none of the chosen routes).
    Keyless,
    Unrouted,
    /// A route candidate (with [`Grouping::Candidates`]): method and template.
    Candidate(Method, Option<String>),
    /// A request of `key` in `group`, at `time` (ns, never earlier than the last).
    Request {
        time: i64,
        key: Key,
        group: u32,
    },
}

pub(super) struct Events<'a, R> {
    lines: Lines<R>,
    uris: Uris,
    parser: parse::Parser<'a>,
    format: &'a LogFormat,
    key: &'a SuggestKey,
    grouping: Grouping<'a>,
    latest: i64,
    /// Lines replayed at the latest time seen.
    pub(super) late: u64,
}

impl<'a, R: BufRead> Events<'a, R> {
    pub(super) fn new(
        input: R,
        max_line: usize,
        format: &'a LogFormat,
        key: &'a SuggestKey,
        grouping: Grouping<'a>,
    ) -> Self {
        Self {
            lines: Lines::new(input, max_line),
            uris: Uris::default(),
            parser: parse::Parser::new(format),
            format,
            key,
            grouping,
            latest: i64::MIN,
            late: 0,
        }
    }

    /// The next line's number and what it is; `None` at the end.
    pub(super) fn next_item(&mut self) -> io::Result<Option<(u64, Item)>> {
        let Some((number, line)) = self.lines.next_line()? else {
            return Ok(None);
        };
        let text = match line {
            Line::Text(text) => text,
            Line::TooLong => return Ok(Some((number, Item::Bad("line too long")))),
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(Some((number, Item::Bad("empty line"))));
        }
        let entry = match self.parser.parse(text) {
            Ok(entry) => entry,
            Err(reason) => return Ok(Some((number, Item::Bad(reason)))),
        };
        let request = match replay::request(self.format, &entry, &mut self.uris) {
            Ok(request) => request,
            Err(reason) => return Ok(Some((number, Item::Bad(reason)))),
        };
        // The replay's clock: a late line counts at the latest time seen.
        let mut time = entry.time_ns;
        if time < self.latest {
            self.late += 1;
            time = self.latest;
        }
        self.latest = time;
        let (mut parts, _) = request.into_parts();
        parts
            .extensions
            .insert(PeerAddr(SocketAddr::new(entry.client, 0)));
        let key = match self.key {
            SuggestKey::Ip => PeerIp::new().key(entry.client),
            SuggestKey::Header(name) => match parts.headers.get(name) {
                Some(v) if !v.is_empty() => {
                    let mut b = KeyBuilder::new();
                    b.push_bytes(v.as_bytes());
                    b.finish()
                }
                _ => return Ok(Some((number, Item::Keyless))),
            },
        };
        let group = match &self.grouping {
            Grouping::All => 1,
            Grouping::Candidates => {
                let template = super::routes::template(parts.uri.path());
                return Ok(Some((number, Item::Candidate(parts.method, template))));
            }
            Grouping::Table(table) => match table.group_for(&parts) {
                0 => return Ok(Some((number, Item::Unrouted))),
                g => g as u32,
            },
        };
        Ok(Some((number, Item::Request { time, key, group })))
    }

    /// The next request (bad, keyless and unrouted lines skipped).
    pub(super) fn next_request(&mut self) -> io::Result<Option<(i64, Key, u32)>> {
        loop {
            match self.next_item()? {
                None => return Ok(None),
                Some((_, Item::Request { time, key, group })) => {
                    return Ok(Some((time, key, group)));
                }
                Some(_) => {}
            }
        }
    }
}
