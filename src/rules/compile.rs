//! A [`Document`] checked and turned into the crate's builder calls: limits, keys, costs,
//! plans, routes and settings. Errors name the document's field path
//! (`limits[2].quota`), which the caller locates in the text.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, StatusCode};

use crate::algo::algorithm::Algorithm;
use crate::algo::quota::{Quota, parse_period};
use crate::base::error::ConfigError;
use crate::middleware::builder::RateLimitBuilder;
use crate::model::policy::{FailurePolicy, MissingKey, Mode};
use crate::rules::document::{CostSpec, Document, LimitRule, Plans};
use crate::store::Store;
use crate::web::cost::Cost;
use crate::web::headers::{HeaderStyle, ResetFormat};
use crate::web::key::{
    ClientIp, Global, Header, KeyBuilder, KeyError, KeyExtractor, PeerIp, Query, TrustedProxies,
    query_param,
};
use crate::web::limit::Limit;
use crate::web::routes::parse_route;

/// Key parts registered by code, named `custom:<name>` in a document (the SQL source's
/// user key read from a request extension).
pub(crate) type CustomKeys = BTreeMap<String, Arc<dyn KeyExtractor>>;

/// A document, checked: what it adds to a [`RateLimitBuilder`].
pub(crate) struct Compiled {
    limits: Vec<(Option<Vec<String>>, Limit)>,
    style: HeaderStyle,
    client: Option<ClientIp>,
    allow: Vec<String>,
    deny: Vec<String>,
    shadow_headers: bool,
}

impl Compiled {
    /// The builder with the document's limits and settings.
    pub(crate) fn apply<St: Store, R>(
        self,
        mut b: RateLimitBuilder<St, R>,
    ) -> RateLimitBuilder<St, R> {
        if self.limits.is_empty() {
            // Only a document allowed to be empty gets here (`compile_maybe_empty`).
            b = b.allow_no_limits();
        }
        for (routes, limit) in self.limits {
            match routes {
                None => b = b.limit(limit),
                Some(routes) => {
                    for route in routes {
                        b = b.route(route, limit.clone());
                    }
                }
            }
        }
        b = b
            .headers(self.style)
            .shadow_headers(self.shadow_headers)
            .allow_cidrs(self.allow)
            .deny_cidrs(self.deny);
        if let Some(client) = self.client {
            b = b.client_ip(client);
        }
        b
    }
}

/// Checks `doc` and turns it into builder calls; `keys`: the `custom:<name>` key parts.
/// A document without limits is valid only if `empty_ok` (a document built by code, e.g.
/// from a `RateLimitRule` table with no active row): it limits nothing. Rules text is
/// never allowed to be empty: an empty or truncated file is refused.
pub(crate) fn compile_maybe_empty(
    doc: &Document,
    keys: &CustomKeys,
    empty_ok: bool,
) -> Result<Compiled, ConfigError> {
    let s = &doc.settings;
    let style = match s.headers.as_deref() {
        None | Some("draft-11") => HeaderStyle::Ietf,
        Some("draft-7") => HeaderStyle::Draft7,
        Some("draft-6") => HeaderStyle::Draft6,
        Some("legacy") => HeaderStyle::Legacy(ResetFormat::Epoch),
        Some("legacy-delta") => HeaderStyle::Legacy(ResetFormat::Delta),
        Some("governor") => HeaderStyle::Governor,
        Some("none") => HeaderStyle::None,
        Some(other) => {
            return Err(unknown(
                "settings.headers",
                other,
                "draft-11, draft-7, draft-6, legacy, legacy-delta, governor, none",
            ));
        }
    };
    let proxies = match (&s.trusted_proxies, s.hops) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "settings.hops",
                "give either `trusted_proxies` or `hops`, not both",
            ));
        }
        (Some(nets), None) => Some(TrustedProxies::cidrs(nets).map_err(|e| e.within("settings"))?),
        (None, Some(0)) => {
            return Err(ConfigError::new(
                "settings.hops",
                "must be at least 1 (the peer is the first hop)",
            ));
        }
        (None, Some(n)) => Some(TrustedProxies::hops(n)),
        (None, None) => None,
    };
    let client = match (proxies, s.client_ip_header.as_deref()) {
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "settings.client_ip_header",
                "needs `trusted_proxies` or `hops`: which proxies may write it",
            ));
        }
        (None, None) => None,
        (Some(p), None | Some("x-forwarded-for")) => Some(ClientIp::x_forwarded_for(p)),
        (Some(p), Some("forwarded")) => Some(ClientIp::forwarded(p)),
        (Some(_), Some(other)) => {
            return Err(unknown(
                "settings.client_ip_header",
                other,
                "x-forwarded-for, forwarded",
            ));
        }
    };
    if doc.limits.is_empty() && !empty_ok {
        return Err(ConfigError::new(
            "limits",
            "the document has no `[[limits]]`: at least one limit is needed",
        ));
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut limits = Vec::with_capacity(doc.limits.len());
    for (i, rule) in doc.limits.iter().enumerate() {
        let at = format!("limits[{i}]");
        if let Some(first) = names.insert(&rule.name, i) {
            return Err(ConfigError::new(
                format!("{at}.name"),
                format!(
                    "`{}` is also the name of limits[{first}]: names must be unique (one limit \
                     on several routes lists them all in its `routes`)",
                    rule.name
                ),
            ));
        }
        let limit = limit(rule, client.as_ref(), keys).map_err(|e| e.within(&at))?;
        limit.validate().map_err(|e| rebase(doc, e))?;
        let routes = match &rule.routes {
            None => None,
            Some(routes) if routes.is_empty() => {
                return Err(ConfigError::new(
                    format!("{at}.routes"),
                    "an empty list would never apply: leave `routes` out for every request",
                ));
            }
            Some(routes) => {
                for (k, route) in routes.iter().enumerate() {
                    parse_route(route).map_err(|e| {
                        ConfigError::new(format!("{at}.routes[{k}]"), e.reason().to_owned())
                    })?;
                }
                Some(routes.clone())
            }
        };
        limits.push((routes, limit));
    }
    Ok(Compiled {
        limits,
        style,
        client,
        allow: s.allow.clone().unwrap_or_default(),
        deny: s.deny.clone().unwrap_or_default(),
        shadow_headers: s.shadow_headers.unwrap_or(false),
    })
}

/// An error of the crate's builder (`limits["a"].cost`, `routes["POST /x"]`, `allow[1]`)
/// named by the document's path (`limits[3].cost`, `limits[3].routes[0]`,
/// `settings.allow[1]`).
pub(crate) fn rebase(doc: &Document, err: ConfigError) -> ConfigError {
    let field = err.field().to_owned();
    for (i, rule) in doc.limits.iter().enumerate() {
        let limit = format!("limits[{:?}]", rule.name);
        for (k, route) in rule.routes.iter().flatten().enumerate() {
            if let Some(rest) = field.strip_prefix(&format!("routes[{route:?}]")) {
                let path = match rest.strip_prefix('.').and_then(|r| r.strip_prefix(&limit)) {
                    Some(rest) => format!("limits[{i}]{rest}"),
                    None => format!("limits[{i}].routes[{k}]{rest}"),
                };
                return err.with_field(path);
            }
        }
        if let Some(rest) = field.strip_prefix(&limit) {
            // The builder's `on_limit.max_wait` is the document's `max_wait`.
            let rest = rest
                .strip_prefix(".on_limit.")
                .map_or_else(|| rest.to_owned(), |field| format!(".{field}"));
            return err.with_field(format!("limits[{i}]{rest}"));
        }
    }
    if field.starts_with("allow[") || field.starts_with("deny[") {
        return err.with_field(format!("settings.{field}"));
    }
    err
}

fn unknown(field: impl Into<String>, value: &str, expected: &str) -> ConfigError {
    ConfigError::new(
        field.into(),
        format!("unknown value `{value}`; expected one of: {expected}"),
    )
}

/// One `[[limits]]` entry as a [`Limit`]; errors are relative to the entry.
fn limit(
    rule: &LimitRule,
    client: Option<&ClientIp>,
    keys: &CustomKeys,
) -> Result<Limit, ConfigError> {
    let algorithm = algorithm(rule)?;
    let (quota, plans) = match (&rule.quota, &rule.plans) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "quota",
                "with `[limits.plans]` each plan has its quota: leave `quota` out (the \
                 default plan's quota is used for requests without a plan)",
            ));
        }
        (None, None) => {
            return Err(ConfigError::new(
                "quota",
                "missing: e.g. `quota = \"10/s; burst=20\"` (or a `[limits.plans]` table)",
            ));
        }
        (Some(q), None) => (parse_quota(q, "quota")?, None),
        (None, Some(plans)) => {
            if algorithm.is_window() {
                return Err(ConfigError::new(
                    "plans",
                    "plans choose a quota per request, which only `algorithm = \"gcra\"` \
                     can do (a window's length is part of its state)",
                ));
            }
            let (default, table) = plans_table(plans)?;
            (default, Some(table))
        }
    };
    let missing = missing_key(rule)?;
    if plans.as_ref().is_some_and(|p| p.gate) && missing != MissingKey::Skip {
        return Err(ConfigError::new(
            "on_missing_key",
            "`[limits.plans]` without `default` skips the requests of other plans as it skips \
             requests without a key: set `on_missing_key = \"skip\"`",
        ));
    }
    let mut limit = Limit::new(&rule.name, quota)
        .algorithm(algorithm)
        .mode(match rule.mode.as_deref() {
            None | Some("enforce") => Mode::Enforce,
            Some("shadow") => Mode::Shadow,
            Some(other) => return Err(unknown("mode", other, "enforce, shadow")),
        })
        .on_store_failure(match rule.on_store_failure.as_deref() {
            None | Some("fallback") => FailurePolicy::Fallback,
            Some("allow") => FailurePolicy::Allow,
            Some("deny") => FailurePolicy::Deny,
            Some(other) => {
                return Err(unknown("on_store_failure", other, "fallback, allow, deny"));
            }
        })
        .on_missing_key(missing);
    if let Some(id) = rule.rule_id {
        limit = limit.rule_id(id);
    }
    limit = on_limit(rule, limit)?;
    let key: Box<dyn KeyExtractor> = match &rule.key {
        None => Box::new(Global),
        Some(spec) if spec.0.is_empty() => {
            return Err(ConfigError::new(
                "key",
                "an empty list: name at least one part, or `\"global\"`",
            ));
        }
        Some(spec) if spec.0.len() == 1 => key_part(&spec.0[0], client, keys, "key")?,
        Some(spec) => {
            let parts = spec
                .0
                .iter()
                .enumerate()
                .map(|(j, p)| key_part(p, client, keys, &format!("key[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Box::new(Composite(parts))
        }
    };
    let cost = cost(rule)?;
    if let Some(plans) = &plans {
        // The builder cannot see the plans' bursts: a cost no plan request could pay is
        // refused here, as it is for a limit's own quota.
        for (name, quota) in &plans.names {
            cost.validate_for(quota.burst_size()).map_err(|e| {
                ConfigError::new(
                    e.field().to_owned(),
                    format!("{} (plan `{name}`)", e.reason()),
                )
            })?;
        }
    }
    limit = limit.cost(cost);
    match plans {
        None => limit = limit.key(One(key)),
        Some(plans) => {
            let plans = Arc::new(plans);
            limit = if plans.gate {
                limit.key(Gated {
                    plans: plans.clone(),
                    key,
                })
            } else {
                limit.key(One(key))
            };
            if !plans.rule_ids.is_empty() {
                let table = plans.clone();
                limit.rule_id_by = Some(Arc::new(move |parts| table.rule_id(parts)));
            }
            limit = limit.quota_by(move |parts| plans.quota(parts));
        }
    }
    Ok(limit)
}

fn parse_quota(text: &str, field: &str) -> Result<Quota, ConfigError> {
    text.parse::<Quota>()
        .map_err(|e| ConfigError::new(field.to_owned(), format!("{}: {}", e.field(), e.reason())))
}

fn algorithm(rule: &LimitRule) -> Result<Algorithm, ConfigError> {
    let algorithm = match rule.algorithm.as_deref() {
        None | Some("gcra") => Algorithm::Gcra,
        Some("fixed_window") => Algorithm::fixed_window(),
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some("sliding_log") => Algorithm::SlidingLog,
        Some(other) => {
            return Err(unknown(
                "algorithm",
                other,
                "gcra, fixed_window, sliding_window, sliding_log",
            ));
        }
    };
    match (&rule.phase, algorithm) {
        (None, a) => Ok(a),
        (Some(phase), Algorithm::FixedWindow { .. }) => match phase.as_str() {
            "aligned" => Ok(Algorithm::fixed_window()),
            "random" => Ok(Algorithm::fixed_window_random()),
            offset => parse_period(offset)
                .map(Algorithm::fixed_window_at)
                .map_err(|e| {
                    ConfigError::new(
                        "phase",
                        format!(
                            "expected `aligned`, `random` or an offset such as `2h`: {}",
                            e.reason()
                        ),
                    )
                }),
        },
        (Some(_), _) => Err(ConfigError::new(
            "phase",
            "only a `fixed_window` has a phase",
        )),
    }
}

fn missing_key(rule: &LimitRule) -> Result<MissingKey, ConfigError> {
    match (rule.on_missing_key.as_deref(), rule.missing_key_status) {
        (Some("reject"), status) => {
            let code = status.unwrap_or(400);
            StatusCode::from_u16(code)
                .ok()
                .filter(StatusCode::is_client_error)
                .map(MissingKey::Reject)
                .ok_or_else(|| {
                    ConfigError::new(
                        "missing_key_status",
                        format!("{code} is not a 4xx status: a request without a key is the client's error"),
                    )
                })
        }
        (_, Some(_)) => Err(ConfigError::new(
            "missing_key_status",
            "only applies with `on_missing_key = \"reject\"`",
        )),
        (None | Some("shared"), None) => Ok(MissingKey::SharedBucket),
        (Some("skip"), None) => Ok(MissingKey::Skip),
        (Some(other), None) => Err(unknown("on_missing_key", other, "shared, skip, reject")),
    }
}

/// `header:<name>` or `query:<name>`: where a value is read.
enum Source {
    Header(HeaderName),
    Query(Box<str>),
}

fn source(text: &str, field: &str) -> Result<Option<Source>, ConfigError> {
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

fn key_part(
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

fn cost(rule: &LimitRule) -> Result<Cost, ConfigError> {
    let default = rule.default_cost;
    let fixed = |n: u64| -> Result<Cost, ConfigError> {
        if default.is_some() {
            return Err(ConfigError::new(
                "default_cost",
                "only applies to a cost read from the request (`header:<name>`, `query:<name>`)",
            ));
        }
        u32::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .map(Cost::fixed)
            .ok_or_else(|| ConfigError::new("cost", format!("{n} is not within 1..=4294967295")))
    };
    let with_default = |c: Cost| c.default(default.unwrap_or(1));
    match &rule.cost {
        None => fixed(1),
        Some(CostSpec::Fixed(n)) => fixed(*n),
        Some(CostSpec::From(text)) => match source(text, "cost")? {
            Some(Source::Header(name)) => Ok(with_default(
                Cost::try_header(name.as_str()).map_err(|e| e.with_field("cost"))?,
            )),
            Some(Source::Query(name)) => Ok(with_default(Cost::query(&name))),
            None => match text.trim().parse::<u64>() {
                Ok(n) => fixed(n),
                Err(_) => Err(unknown(
                    "cost",
                    text,
                    "a whole number, header:<name>, query:<name>",
                )),
            },
        },
    }
}

/// A checked `[limits.plans]`: the quota of each plan, and where the plan is read.
struct PlanTable {
    from: Source,
    names: Vec<(String, Quota)>,
    by_name: HashMap<Box<str>, Quota>,
    /// Rule ids of the plans that have one.
    rule_ids: HashMap<Box<str>, u64>,
    /// No default plan: requests of no listed plan skip the limit.
    gate: bool,
}

impl PlanTable {
    /// The entry of this request's plan in `table`.
    fn lookup<'t, T>(&self, parts: &Parts, table: &'t HashMap<Box<str>, T>) -> Option<&'t T> {
        match &self.from {
            Source::Header(name) => {
                let value = parts.headers.get(name)?.to_str().ok()?;
                table.get(value.trim())
            }
            Source::Query(name) => table.get(&*query_param(parts, name)?),
        }
    }

    /// The quota of this request's plan; `None` (the limit's own quota, the default
    /// plan's) when it names no plan of the table.
    fn quota(&self, parts: &Parts) -> Option<Quota> {
        self.lookup(parts, &self.by_name).copied()
    }

    /// The rule id of this request's plan, if the plan has one.
    fn rule_id(&self, parts: &Parts) -> Option<u64> {
        self.lookup(parts, &self.rule_ids).copied()
    }
}

fn plans_table(plans: &Plans) -> Result<(Quota, PlanTable), ConfigError> {
    let from = source(&plans.from, "plans.from")?.ok_or_else(|| {
        ConfigError::new(
            "plans.from",
            format!(
                "`{}`: expected `header:<name>` or `query:<name>`",
                plans.from
            ),
        )
    })?;
    if plans.quotas.is_empty() {
        return Err(ConfigError::new(
            "plans",
            "no plan: add `<plan> = \"<quota>\"` entries",
        ));
    }
    let mut names = Vec::with_capacity(plans.quotas.len());
    for (name, quota) in &plans.quotas {
        let field = crate::rules::locate::render_path(&[
            crate::rules::locate::Seg::Key("plans".into()),
            crate::rules::locate::Seg::Key(name.clone()),
        ]);
        names.push((name.clone(), parse_quota(quota, &field)?));
    }
    let by_name: HashMap<Box<str>, Quota> =
        names.iter().map(|(n, q)| (n.as_str().into(), *q)).collect();
    let listed = || {
        names
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Without a default plan, the limit's own quota is never used for a check (requests
    // of other plans skip the limit): the first plan's stands in for it.
    let default = match &plans.default {
        None => names[0].1,
        Some(default) => *by_name.get(default.as_str()).ok_or_else(|| {
            ConfigError::new(
                "plans.default",
                format!(
                    "`{default}` is not a plan of this table (plans: {})",
                    listed()
                ),
            )
        })?,
    };
    let mut rule_ids = HashMap::with_capacity(plans.rule_ids.len());
    for (name, &id) in &plans.rule_ids {
        let field = crate::rules::locate::render_path(&[
            crate::rules::locate::Seg::Key("plans".into()),
            crate::rules::locate::Seg::Key("rule_ids".into()),
            crate::rules::locate::Seg::Key(name.clone()),
        ]);
        if !by_name.contains_key(name.as_str()) {
            return Err(ConfigError::new(
                field,
                format!("`{name}` is not a plan of this table (plans: {})", listed()),
            ));
        }
        if id > i64::MAX as u64 {
            return Err(ConfigError::new(
                field,
                "must be at most i64::MAX (9223372036854775807), the largest SQL BIGINT",
            ));
        }
        rule_ids.insert(name.as_str().into(), id);
    }
    Ok((
        default,
        PlanTable {
            from,
            names,
            by_name,
            rule_ids,
            gate: plans.default.is_none(),
        },
    ))
}

/// A key extractor chosen at run time.
struct One(Box<dyn KeyExtractor>);

impl KeyExtractor for One {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.extract(parts, key)
    }
}

/// A key part registered by code (`custom:<name>`).
struct Custom(Arc<dyn KeyExtractor>);

impl KeyExtractor for Custom {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.extract(parts, key)
    }
}

/// The key of a limit whose plans have no default: missing (so the limit is skipped)
/// when the request names no plan of the table.
struct Gated {
    plans: Arc<PlanTable>,
    key: Box<dyn KeyExtractor>,
}

impl KeyExtractor for Gated {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        if self.plans.quota(parts).is_none() {
            return Err(KeyError::Missing);
        }
        self.key.extract(parts, key)
    }
}

/// A composite key of parts chosen at run time (a list in the document): every part,
/// missing if any part is missing, as a tuple of extractors.
struct Composite(Vec<Box<dyn KeyExtractor>>);

impl KeyExtractor for Composite {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        self.0.iter().try_for_each(|p| p.extract(parts, key))
    }
}

/// `on_limit`, `max_wait`, `max_waiters` and `max_reserved` (the builder checks the rest:
/// a sliding algorithm or a shadow limit cannot delay, `max_reserved` needs GCRA).
fn on_limit(rule: &LimitRule, mut limit: Limit) -> Result<Limit, ConfigError> {
    match rule.on_limit.as_deref() {
        None | Some("reject") => {
            if rule.max_wait.is_some() {
                return Err(ConfigError::new(
                    "max_wait",
                    "only a limit with `on_limit = \"delay\"` waits",
                ));
            }
            if rule.max_waiters.is_some() {
                return Err(ConfigError::new(
                    "max_waiters",
                    "only a limit with `on_limit = \"delay\"` has waiters",
                ));
            }
        }
        Some("delay") => {
            let Some(max_wait) = &rule.max_wait else {
                return Err(ConfigError::new(
                    "max_wait",
                    "missing: `on_limit = \"delay\"` needs the longest wait, e.g. `max_wait = \"2s\"`",
                ));
            };
            let max_wait = parse_period(max_wait).map_err(|e| {
                ConfigError::new(
                    "max_wait",
                    format!("expected a duration such as `2s`: {}", e.reason()),
                )
            })?;
            limit = limit.delay(max_wait, rule.max_waiters.unwrap_or(100));
        }
        Some(other) => return Err(unknown("on_limit", other, "reject, delay")),
    }
    if let Some(tokens) = rule.max_reserved {
        limit = limit.max_reserved(tokens);
    }
    Ok(limit)
}

impl fmt::Display for Document {
    /// One line per limit: name, quota (or plans), key, algorithm, mode and routes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for rule in &self.limits {
            write!(f, "{}: ", rule.name)?;
            match (&rule.quota, &rule.plans) {
                (Some(q), _) => write!(f, "{q}")?,
                (None, Some(p)) => {
                    match &p.default {
                        Some(default) => write!(f, "plans from {} (default {default}):", p.from)?,
                        None => write!(f, "plans from {} (no default):", p.from)?,
                    }
                    for (i, (name, q)) in p.quotas.iter().enumerate() {
                        write!(f, "{} {name} = {q}", if i == 0 { "" } else { "," })?;
                        if let Some(id) = p.rule_ids.get(name) {
                            write!(f, " (rule {id})")?;
                        }
                    }
                }
                (None, None) => write!(f, "(no quota)")?,
            }
            let key = rule
                .key
                .as_ref()
                .map_or_else(|| "global".to_owned(), |k| k.0.join(" + "));
            write!(f, " per {key}")?;
            write!(f, ", {}", rule.algorithm.as_deref().unwrap_or("gcra"))?;
            if let Some(mode) = &rule.mode {
                write!(f, ", {mode}")?;
            }
            match &rule.cost {
                Some(CostSpec::Fixed(n)) => write!(f, ", cost {n}")?,
                Some(CostSpec::From(s)) => write!(f, ", cost from {s}")?,
                None => {}
            }
            if let Some(id) = rule.rule_id {
                write!(f, ", rule {id}")?;
            }
            if rule.on_limit.as_deref() == Some("delay") {
                let wait = rule.max_wait.as_deref().unwrap_or("?");
                let waiters = rule.max_waiters.unwrap_or(100);
                write!(f, ", delay up to {wait} ({waiters} waiters)")?;
            }
            match &rule.routes {
                Some(routes) => writeln!(f, ", routes: {}", routes.join(", "))?,
                None => writeln!(f, ", every request")?,
            }
        }
        Ok(())
    }
}
