//! [`Document`]: the rules as data, as written in a TOML or JSON file (or built by code,
//! e.g. from database rows), before they are checked.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::base::error::ConfigError;
use crate::rules::format::{Format, line_of};
use crate::rules::locate::{MAX_DEPTH, Tree, Unparsed};

/// A rules document: settings for the whole layer and a list of limits.
///
/// Every field mirrors a name of the file (see the [module docs](crate::rules) for each
/// one, its values and its default); unknown names are errors. Values are kept as written
/// (`quota` and `headers` are strings) and checked when the document is compiled
/// ([`Document::check`], or building a [`Rules`](crate::rules::Rules)): a document built by
/// code, e.g. from database rows, is checked exactly like a file.
///
/// ```
/// use tollgate::rules::{Document, KeySpec, LimitRule};
///
/// let doc = Document {
///     limits: vec![LimitRule {
///         name: "per-ip".into(),
///         key: Some(KeySpec::one("peer_ip")),
///         quota: Some("5/s; burst=10".into()),
///         ..LimitRule::default()
///     }],
///     ..Document::default()
/// };
/// doc.check()?;
/// assert_eq!(doc, Document::from_toml(r#"
///     [[limits]]
///     name = "per-ip"
///     key = "peer_ip"
///     quota = "5/s; burst=10"
/// "#)?);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// `[settings]`: what applies to the whole layer.
    #[serde(default)]
    pub settings: Settings,
    /// `[[limits]]`: the limits, checked all or nothing on each request they apply to.
    #[serde(default)]
    pub limits: Vec<LimitRule>,
    /// `[regions]`: the limits are one limit across regions (see
    /// [`store::regions`](crate::store::regions)).
    #[serde(default)]
    pub regions: Option<RegionsRule>,
}

/// `[regions]` of a rules document: each limit is one limit across these regions, each
/// region deciding from its own store on its part of the quota, movers carrying unspent
/// tokens between them.
///
/// ```toml
/// [regions]
/// local = "eu"             # the region this file's processes run in
/// interval = "100ms"       # the movers' interval (default 100ms)
/// link_delay = "50ms"      # the link's delay each way (default 50ms): sizes a transfer
/// floor = 0.1              # the part of its burst a region keeps (default 0.1)
///
/// [regions.stores]         # each region's store, by name (indexed in the names' order)
/// eu = "redis://eu.internal:6379"
/// us = "redis://us.internal:6379"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionsRule {
    /// `local`: the name of the region this file is read in.
    pub local: String,
    /// `stores`: each region's store URL, by region name; the regions are indexed in
    /// their names' order, so that every region's file splits the quotas alike.
    pub stores: BTreeMap<String, String>,
    /// `interval`: how often a mover looks and moves (`"100ms"`).
    pub interval: Option<String>,
    /// `link_delay`: the link's delay each way between two regions (`"50ms"`).
    pub link_delay: Option<String>,
    /// `floor`: the part of its burst a region keeps, 0 to 1.
    pub floor: Option<Factor>,
}

/// `[settings]` of a rules document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `headers`: `"draft-11"` (default), `"draft-7"`, `"draft-6"`, `"legacy"`,
    /// `"governor"` or `"none"`.
    pub headers: Option<String>,
    /// `trusted_proxies`: networks of the proxies whose forwarded headers `client_ip`
    /// believes.
    pub trusted_proxies: Option<Vec<String>>,
    /// `hops`: instead of `trusted_proxies`, the number of proxies in front of the app.
    pub hops: Option<usize>,
    /// `client_ip_header`: `"x-forwarded-for"` (default) or `"forwarded"` (RFC 7239).
    pub client_ip_header: Option<String>,
    /// `allow`: networks that skip every limit.
    pub allow: Option<Vec<String>>,
    /// `deny`: networks refused with 403 before any limit.
    pub deny: Option<Vec<String>>,
    /// `shadow_headers`: whether shadow limits appear in the rate-limit fields.
    pub shadow_headers: Option<bool>,
    /// `app_routes`: the app's own route templates (`"/api/items"`, `"POST /login"`), so
    /// that a limit's `routes` entry that can meet none of them is logged at each load and
    /// listed by `tollgate-rules check`.
    pub app_routes: Option<Vec<String>>,
}

/// One `[[limits]]` entry of a rules document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRule {
    /// `name`: unique in the document; names the limit in headers, logs and the store
    /// (a limit that keeps its name across reloads keeps its buckets).
    pub name: String,
    /// `key`: what a bucket is; default `"global"`.
    pub key: Option<KeySpec>,
    /// `quota`: `"<rate>/<period>[; burst=<n>]"`; required unless `plans` is given.
    pub quota: Option<String>,
    /// `algorithm`: `"gcra"` (default), `"fixed_window"`, `"sliding_window"`,
    /// `"sliding_log"`, `"calendar"` (windows that reset at calendar boundaries).
    pub algorithm: Option<String>,
    /// `phase` of a fixed window: `"aligned"` (default), `"random"`, or an offset such as
    /// `"2h"`.
    pub phase: Option<String>,
    /// `cost`: a number, `"header:<name>"` or `"query:<name>"`; default 1.
    pub cost: Option<CostSpec>,
    /// `default_cost`: the cost when the header or parameter is absent or invalid;
    /// default 1.
    pub default_cost: Option<u32>,
    /// `mode`: `"enforce"` (default) or `"shadow"`.
    pub mode: Option<String>,
    /// `on_missing_key`: `"shared"` (default), `"skip"` or `"reject"`.
    pub on_missing_key: Option<String>,
    /// `missing_key_status`: the 4xx status of `on_missing_key = "reject"`; default 400
    /// (401 sends `WWW-Authenticate: ApiKey` unless `missing_key_challenge` gives one).
    pub missing_key_status: Option<u16>,
    /// `missing_key_challenge`: with `on_missing_key = "reject"`, a 401 with this
    /// `WWW-Authenticate` challenge, e.g. `Bearer realm="api"`.
    pub missing_key_challenge: Option<String>,
    /// `on_store_failure`: `"share"` (default: this instance's share of the quota),
    /// `"fallback"` (the whole quota, per instance), `"allow"` or `"deny"`.
    pub on_store_failure: Option<String>,
    /// `routes`: `["POST /login", "/api/{*rest}"]`; absent: every request.
    pub routes: Option<Vec<String>>,
    /// `[limits.plans]`: the quota chosen per request by a plan name.
    pub plans: Option<Plans>,
    /// `rule_id`: the id of the rule this limit comes from (e.g. a `RateLimitRule` row),
    /// carried into the audit log's violations ([`Limit::rule_id`](crate::Limit::rule_id));
    /// at most `i64::MAX`.
    pub rule_id: Option<u64>,
    /// `on_limit`: `"reject"` (default: a 429) or `"delay"` (a request over the limit
    /// waits for its tokens, up to `max_wait`: [`Limit::delay`](crate::Limit::delay)).
    pub on_limit: Option<String>,
    /// `max_wait`: with `on_limit = "delay"`, the longest a request waits, as a duration
    /// (`"2s"`, `"500ms"`); required there, refused elsewhere.
    pub max_wait: Option<String>,
    /// `max_waiters`: with `on_limit = "delay"`, how many requests of the limit may wait
    /// at once, default 100; with `over_limit = "wait"` (a limit of messages or bytes),
    /// how many streams, default 10,000.
    pub max_waiters: Option<usize>,
    /// `striped`: split each key into this many stripes in the memory store (1 to 64,
    /// default 1), so that a hot key scales with cores ([`Limit::striped`](crate::Limit::striped)).
    pub striped: Option<u8>,
    /// `max_reserved`: the tokens one key may have reserved ahead (delay mode and
    /// [`Limiter::reserve`](crate::Limiter::reserve)); GCRA only.
    pub max_reserved: Option<u32>,
    /// `lease`: `"auto"`, or the most tokens one instance holds (a number): the limit is
    /// spent from leases when its store is remote ([`Limit::lease`](crate::Limit::lease)).
    pub lease: Option<LeaseSpec>,
    /// `lease_max_age`: how long leased tokens may wait to be spent (default `"1s"`);
    /// only with `lease`.
    pub lease_max_age: Option<String>,
    /// `settle`: `"header:<name>"` or `"trailer:<name>"`, where the actual cost of a
    /// request is found when its response ends; `cost` is then the estimate
    /// ([`Limit::settle`](crate::Limit::settle)); absent or invalid in a response, the
    /// estimate stands. GCRA without `lease` only.
    pub settle: Option<String>,
    /// `max_debt`: with `settle`, caps how far below empty a key's bucket may go, in
    /// tokens (default: no cap, the whole usage is charged).
    pub max_debt: Option<u64>,
    /// `ban`: bans that escalate ([`Limit::ban`](crate::Limit::ban)), an inline table
    /// `{ after, within, for, escalate, max, forget }`.
    pub ban: Option<BanRule>,
    /// `ban_status`: the status of a banned key's requests, 403 (default) or 429; only
    /// with `ban`.
    pub ban_status: Option<u16>,
    /// `in_flight`: instead of `quota`, the most requests of a key in flight at once
    /// (1 to 1,000,000): [`Limit::in_flight`](crate::Limit::in_flight).
    pub in_flight: Option<u64>,
    /// `retry_after`: with `in_flight`, the `Retry-After` of its refusals, as a duration
    /// (default `"1s"`).
    pub retry_after: Option<String>,
    /// `time_zone`: with `algorithm = "calendar"`, the IANA zone whose local hours, days,
    /// weeks and months the windows follow (`"Europe/Berlin"`); default `"UTC"`.
    pub time_zone: Option<String>,
    /// `per`: what a token pays for: `"request"` (default: checked when a request
    /// arrives), `"message"` or `"byte"` (charged inside long-lived requests by the
    /// streams that name the limit: [`Limiter::pacer`](crate::Limiter::pacer)).
    pub per: Option<String>,
    /// `direction`: with `per = "message"` or `"byte"`, which way the units are counted:
    /// `"in"` (default: from the client), `"out"` or `"both"`.
    pub direction: Option<String>,
    /// `over_limit`: with `per = "message"` or `"byte"`, `"wait"` (default:
    /// backpressure, up to `max_wait`, default `"30s"`) or `"end"` (the stream ends).
    pub over_limit: Option<String>,
    /// `rate_after`: with `per = "byte"`, the bytes of each body that pass uncharged
    /// (`"1MiB"`; nginx's `limit_rate_after`).
    pub rate_after: Option<String>,
}

/// A limit's `ban = { after = 3, within = "1m", for = "10m", escalate = 2, max = "1d",
/// forget = "1d" }`: see [`Ban`](crate::Ban).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BanRule {
    /// `after`: the refusals within `within` that ban the key (required, at least 1).
    pub after: u32,
    /// `within`: a duration (default `"1m"`).
    pub within: Option<String>,
    /// `for`: the first ban's length (required).
    #[serde(rename = "for")]
    pub for_: Option<String>,
    /// `escalate`: each repeat's factor, at least 1 (default 1).
    pub escalate: Option<Factor>,
    /// `max`: the longest ban (default: `for`).
    pub max: Option<String>,
    /// `forget`: how long after a ban's end a new one is still a repeat (default `"1d"`).
    pub forget: Option<String>,
}

/// A number (integer or not) as written in a rules file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Factor(pub f64);

// Compared for "did the document change": a NaN cannot be written in TOML or JSON.
impl Eq for Factor {}

/// A limit's `lease`: `"auto"`, or the most tokens one instance holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseSpec {
    /// `"auto"`: sized by each instance's rate, at most an eighth of the burst.
    Auto,
    /// At most this many tokens per instance.
    Tokens(u64),
}

impl<'de> Deserialize<'de> for LeaseSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = LeaseSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\" or a whole number of tokens")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LeaseSpec, E> {
                Ok(LeaseSpec::Tokens(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LeaseSpec, E> {
                u64::try_from(v)
                    .map(LeaseSpec::Tokens)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LeaseSpec, E> {
                match v {
                    "auto" => Ok(LeaseSpec::Auto),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[limits.plans]`: a quota per plan, the plan of each request read from it (`from`) or
/// looked up by its API key (`by` and `keys`).
///
/// `from`, `by`, `default` and `keys` are reserved; every other entry is a plan name and
/// its quota. Exactly one of `from` and `by` is given.
///
/// ```
/// use tollgate::rules::Document;
///
/// let doc = Document::from_toml(r#"
///     [[limits]]
///     name = "per-key"
///     key = "header:x-api-key"
///     [limits.plans]
///     by = "header:x-api-key"
///     default = "free"
///     free = "10/min"
///     pro = "10/s; burst=50"
///     [limits.plans.keys]
///     "key-abc" = "pro"
/// "#)?;
/// doc.check()?;
/// let plans = doc.limits[0].plans.as_ref().unwrap();
/// assert_eq!(plans.by.as_deref(), Some("header:x-api-key"));
/// assert_eq!(plans.keys["key-abc"], "pro");
/// // Logging the document shows no key.
/// assert!(!format!("{doc:?}").contains("key-abc"));
/// assert!(format!("{plans:?}").contains("keys: <1 keys>"));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// Its `Debug` shows how many keys there are, never the keys (they are secrets, and a
/// document is often logged).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Plans {
    /// `from`: where the plan's name is read: `"extension"` (the request's
    /// [`Plan`](crate::Plan) extension, set by your authentication), `"header:<name>"` or
    /// `"query:<name>"` (a value the client sends: only a header your gateway sets is to
    /// be trusted). Not with `by`.
    pub from: Option<String>,
    /// `by`: where the request's API key is read (`"header:<name>"` or
    /// `"query:<name>"`); its plan is its entry in `keys` (a key not listed has the
    /// default plan). Not with `from`.
    pub by: Option<String>,
    /// `default`: the plan of requests without a plan, or with one not listed. Left out,
    /// those requests are not limited by this limit (which then needs
    /// `on_missing_key = "skip"`: they are skipped as requests without a key are).
    pub default: Option<String>,
    /// Plan name → quota string.
    pub quotas: BTreeMap<String, String>,
    /// `[limits.plans.keys]`, with `by`: API key → plan name; at most
    /// [`MAX_PLAN_KEYS`](crate::rules::MAX_PLAN_KEYS) keys.
    pub keys: BTreeMap<String, String>,
    /// Plan name → the rule id of violations of requests of that plan (e.g. one
    /// `RateLimitRule` row per plan); a plan not listed has the limit's `rule_id`. Not
    /// read from files (every other entry of the table is a plan): set by code, such as
    /// the SQL source.
    pub rule_ids: BTreeMap<String, u64>,
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plans")
            .field("from", &self.from)
            .field("by", &self.by)
            .field("default", &self.default)
            .field("quotas", &self.quotas)
            .field("keys", &format_args!("<{} keys>", self.keys.len()))
            .field("rule_ids", &self.rule_ids)
            .finish()
    }
}

/// A limit's `key`: one part, or several (a composite key, e.g.
/// `["header:x-tenant", "client_ip"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeySpec(pub Vec<String>);

impl KeySpec {
    /// A key of one part, such as `"peer_ip"` or `"header:x-api-key"`.
    pub fn one(part: impl Into<String>) -> Self {
        Self(vec![part.into()])
    }
}

/// A limit's `cost`: a fixed number, or where to read it (`"header:<name>"`,
/// `"query:<name>"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostSpec {
    /// Every request costs this.
    Fixed(u64),
    /// Read from the request: `"header:<name>"` or `"query:<name>"`.
    From(String),
}

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeySpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key (\"client_ip\", \"header:x-api-key\", ...) or a list of keys")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeySpec, E> {
                Ok(KeySpec::one(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeySpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(part) = seq.next_element::<String>()? {
                    parts.push(part);
                }
                Ok(KeySpec(parts))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for CostSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = CostSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number, \"header:<name>\" or \"query:<name>\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CostSpec, E> {
                Ok(CostSpec::Fixed(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CostSpec, E> {
                u64::try_from(v)
                    .map(CostSpec::Fixed)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CostSpec, E> {
                Ok(CostSpec::From(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Plans {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Plans;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a table with `from` or `by`, an optional `default`, one quota per plan \
                     and, with `by`, a `keys` table",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Plans, A::Error> {
                let mut plans = Plans::default();
                let mut keys = false;
                while let Some(name) = map.next_key::<String>()? {
                    let slot = match name.as_str() {
                        "from" => &mut plans.from,
                        "by" => &mut plans.by,
                        "default" => &mut plans.default,
                        "keys" => {
                            if std::mem::replace(&mut keys, true) {
                                return Err(de::Error::duplicate_field("keys"));
                            }
                            plans.keys = map.next_value()?;
                            continue;
                        }
                        _ => {
                            let value = map.next_value::<String>()?;
                            plans.quotas.insert(name, value);
                            continue;
                        }
                    };
                    if slot.replace(map.next_value::<String>()?).is_some() {
                        return Err(de::Error::duplicate_field("plans entry"));
                    }
                }
                // Neither `from` nor `by`: refused when the document is checked.
                Ok(plans)
            }
        }
        d.deserialize_map(V)
    }
}

impl Document {
    /// Reads a TOML document. Errors name the line and the field
    /// (`line 4: limits[0].quota: ...`); the document is not checked (see
    /// [`check`](Self::check)). A document nested too deep is refused (`toml`'s
    /// recursion limit).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, Format::Toml, None)
    }

    /// Reads a JSON document, with the same names as TOML. A document nested more than
    /// 128 levels deep is refused (`line 1: invalid JSON: nested more than 128 levels
    /// deep`).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, Format::Json, None)
    }

    /// Reads a document in `format`; `file` names it in errors.
    pub(crate) fn parse(
        text: &str,
        format: Format,
        file: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let (field, line, reason) = match format {
            Format::Toml => match toml::from_str::<Document>(text) {
                Ok(doc) => return Ok(doc),
                Err(e) => {
                    let offset = e.span().map(|s| s.start);
                    let field = offset.and_then(|o| Tree::parse(text, format).ok()?.path_at(o));
                    let line = offset.map(|o| line_of(text, o));
                    (field, line, e.message().to_owned())
                }
            },
            Format::Json => match serde_json::from_str::<Document>(text) {
                Ok(doc) => return Ok(doc),
                Err(e) => {
                    let field = match e.classify() {
                        serde_json::error::Category::Data => {
                            let offset = offset_of(text, e.line(), e.column());
                            match Tree::parse(text, format) {
                                Ok(tree) => tree.path_at(offset),
                                // `serde_json` stops at the first value of the wrong type;
                                // the rest of the text may nest without end.
                                Err(Unparsed::TooDeep(at)) => {
                                    return Err(too_deep(format, file, line_of(text, at)));
                                }
                                Err(Unparsed::Invalid) => None,
                            }
                        }
                        _ => None,
                    };
                    // serde_json's message ends with " at line L column C": the line is ours.
                    let message = e.to_string();
                    let reason = match message.rfind(" at line ") {
                        Some(i) => message[..i].to_owned(),
                        None => message,
                    };
                    (field, Some(e.line()), reason)
                }
            },
        };
        let field = field.unwrap_or_default();
        let reason = if field.is_empty() {
            format!("invalid {}: {reason}", format_name(format))
        } else {
            reason
        };
        Err(ConfigError::new(field, reason).located(file, line))
    }
}

/// A document nested deeper than [`MAX_DEPTH`] levels, at `line`.
fn too_deep(format: Format, file: Option<&str>, line: usize) -> ConfigError {
    ConfigError::new(
        "",
        format!(
            "invalid {}: nested more than {MAX_DEPTH} levels deep",
            format_name(format)
        ),
    )
    .located(file, Some(line))
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Toml => "TOML",
        Format::Json => "JSON",
    }
}

/// The byte offset of serde_json's 1-based line and column (the column counts bytes).
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + column.saturating_sub(1)).min(text.len())
}
