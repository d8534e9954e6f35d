//! A [`Document`] checked and turned into the crate's builder calls: limits, keys, costs,
//! plans, routes and settings. Errors name the document's field path
//! (`limits[2].quota`), which the caller locates in the text.

mod keys;
mod plans;
mod regions;
mod settle;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

pub(crate) use self::keys::CustomKeys;
use self::keys::{Composite, One, Source, key_part, source, unknown};
pub use self::plans::MAX_PLAN_KEYS;
use self::plans::{Gated, parse_quota, plans_table};
pub use self::regions::RegionsPlan;
pub(crate) use self::regions::regions as regions_plan;
use crate::algo::algorithm::Algorithm;
use crate::algo::quota::{Quota, parse_period};
use crate::base::error::ConfigError;
use crate::middleware::builder::RateLimitBuilder;
use crate::model::lease::Lease;
use crate::model::policy::{FailurePolicy, MissingKey, Mode};
use crate::model::stream::Per;
use crate::rules::document::{CostSpec, Document, LeaseSpec, LimitRule};
use crate::store::Store;
use crate::web::compile::never_met;
use crate::web::cost::Cost;
use crate::web::headers::{HeaderStyle, ResetFormat};
use crate::web::key::{ClientIp, Global, KeyExtractor, TrustedProxies};
use crate::web::limit::Limit;
use crate::web::routes::{RouteTable, parse_route};

/// A document, checked: what it adds to a [`RateLimitBuilder`].
pub(crate) struct Compiled {
    limits: Vec<(Option<Vec<String>>, Limit)>,
    style: HeaderStyle,
    client: Option<ClientIp>,
    allow: Vec<String>,
    deny: Vec<String>,
    shadow_headers: bool,
    app_routes: Option<Vec<String>>,
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
        if let Some(app) = self.app_routes {
            b = b.app_routes(app);
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
    regions::regions(doc)?;
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
        app_routes: s.app_routes.clone(),
    })
}

/// The document's route entries that meet none of `settings.app_routes` (see
/// [`Document::unmet_routes`]); errors named by the document's paths.
pub(crate) fn unmet_routes(doc: &Document) -> Result<Vec<String>, ConfigError> {
    let Some(app) = &doc.settings.app_routes else {
        return Ok(Vec::new());
    };
    let mut table = RouteTable::default();
    for rule in &doc.limits {
        for route in rule.routes.iter().flatten() {
            let (method, path) = parse_route(route).map_err(|e| rebase(doc, e))?;
            let entries = table.entries_mut(path).map_err(|e| {
                rebase(
                    doc,
                    ConfigError::new(format!("routes[{route:?}]"), format!("`{path}`: {e}")),
                )
            })?;
            if !entries.iter().any(|(m, _)| *m == method) {
                entries.push((method, 0));
            }
        }
    }
    never_met(&table, app).map_err(|e| rebase(doc, e))
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
    if let Some(spec) = field
        .strip_prefix("app_routes[")
        .and_then(|r| r.strip_suffix(']'))
    {
        let routes = doc.settings.app_routes.as_ref();
        if let Some(i) = routes
            .into_iter()
            .flatten()
            .position(|r| format!("{r:?}") == spec)
        {
            return err.with_field(format!("settings.app_routes[{i}]"));
        }
    }
    if field == "app_routes" || field.starts_with("allow[") || field.starts_with("deny[") {
        return err.with_field(format!("settings.{field}"));
    }
    err
}

/// One `[[limits]]` entry as a [`Limit`]; errors are relative to the entry.
fn limit(
    rule: &LimitRule,
    client: Option<&ClientIp>,
    keys: &CustomKeys,
) -> Result<Limit, ConfigError> {
    let per = stream::per(rule)?;
    // A limit of bytes: its quota in sizes, counted in tokens of `unit` bytes.
    let mut unit = None;
    let (algorithm, in_flight) = match in_flight(rule)? {
        Some((algorithm, quota)) => (algorithm, Some(quota)),
        None => (algorithm(rule)?, None),
    };
    let (quota, plans) = match (&rule.quota, &rule.plans, in_flight) {
        (None, None, Some(quota)) => (quota, None),
        (_, _, Some(_)) => {
            let field = if rule.quota.is_some() {
                "quota"
            } else {
                "plans"
            };
            return Err(ConfigError::new(
                field,
                "an `in_flight` limit counts requests in flight, not per time: leave `quota` and `[limits.plans]` out",
            ));
        }
        (q, p, None) => match (q, p) {
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
            (Some(q), None) if per == Per::Byte => {
                let (quota, bytes) = stream::byte_quota(q, "quota")?;
                unit = Some(bytes);
                (quota, None)
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
        },
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
            None | Some("share") => FailurePolicy::Share,
            Some("fallback") => FailurePolicy::Fallback,
            Some("allow") => FailurePolicy::Allow,
            Some("deny") => FailurePolicy::Deny,
            Some(other) => {
                return Err(unknown(
                    "on_store_failure",
                    other,
                    "share, fallback, allow, deny",
                ));
            }
        })
        .on_missing_key(missing);
    if let Some(id) = rule.rule_id {
        limit = limit.rule_id(id);
    }
    if let Some(n) = rule.striped {
        limit = limit.striped(n);
    }
    limit = stream::settings(rule, per, unit, limit)?;
    limit = if per == Per::Request {
        on_limit(rule, limit)?
    } else {
        // `max_wait` is the stream's (`over_limit = "wait"`).
        if let Some(tokens) = rule.max_reserved {
            limit = limit.max_reserved(tokens);
        }
        lease(rule, limit)?
    };
    limit = settle::settle(rule, limit)?;
    limit = ban(rule, limit)?;
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
            if plans.has_rule_ids {
                let table = plans.clone();
                limit.rule_id_by = Some(Arc::new(move |parts| table.rule_id(parts)));
            }
            limit = limit.quota_by(move |parts| plans.quota(parts));
        }
    }
    Ok(limit)
}

fn algorithm(rule: &LimitRule) -> Result<Algorithm, ConfigError> {
    let algorithm = match rule.algorithm.as_deref() {
        None | Some("gcra") => Algorithm::Gcra,
        Some("fixed_window") => Algorithm::fixed_window(),
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some("sliding_log") => Algorithm::SlidingLog,
        Some("calendar") => Algorithm::calendar(crate::calendar::Zone::get(
            rule.time_zone.as_deref().unwrap_or("UTC"),
        )?),
        Some(other) => {
            return Err(unknown(
                "algorithm",
                other,
                "gcra, fixed_window, sliding_window, sliding_log, calendar",
            ));
        }
    };
    if rule.time_zone.is_some() && !algorithm.is_calendar() {
        return Err(ConfigError::new(
            "time_zone",
            "only a limit with `algorithm = \"calendar\"` has a time zone",
        ));
    }
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
    let challenge = rule.missing_key_challenge.as_deref();
    match (rule.on_missing_key.as_deref(), rule.missing_key_status) {
        (Some("reject"), status) if challenge.is_some() => {
            if status.is_some_and(|s| s != 401) {
                return Err(ConfigError::new(
                    "missing_key_challenge",
                    "a challenge is the `WWW-Authenticate` of a 401: leave out \
                     `missing_key_status` or make it 401",
                ));
            }
            let challenge = challenge.unwrap_or_default();
            // Checked as the builder checks it, so that the error names this field.
            if challenge.trim().is_empty() || http::HeaderValue::from_str(challenge).is_err() {
                return Err(ConfigError::new(
                    "missing_key_challenge",
                    format!(
                        "{challenge:?} is not a `WWW-Authenticate` value \
                         (e.g. `Bearer realm=\"api\"`)"
                    ),
                ));
            }
            // One copy per distinct challenge over the process's life, as limit names.
            let challenge = crate::base::intern::intern(challenge).ok_or_else(|| {
                ConfigError::new(
                    "missing_key_challenge",
                    "too many distinct strings configured over this process's life",
                )
            })?;
            Ok(MissingKey::Unauthorized(challenge))
        }
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
        _ if challenge.is_some() => Err(ConfigError::new(
            "missing_key_challenge",
            "only applies with `on_missing_key = \"reject\"`",
        )),
        (None | Some("shared"), None) => Ok(MissingKey::SharedBucket),
        (Some("skip"), None) => Ok(MissingKey::Skip),
        (Some(other), None) => Err(unknown("on_missing_key", other, "shared, skip, reject")),
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

/// `in_flight` and its `retry_after`: the algorithm and the quota of an in-flight limit,
/// or `None` for a limit over time.
fn in_flight(rule: &LimitRule) -> Result<Option<(Algorithm, Quota)>, ConfigError> {
    let Some(n) = rule.in_flight else {
        if rule.retry_after.is_some() {
            return Err(ConfigError::new(
                "retry_after",
                "only with `in_flight` (a limit over time tells clients when to retry itself)",
            ));
        }
        return Ok(None);
    };
    if rule.algorithm.is_some() {
        return Err(ConfigError::new(
            "algorithm",
            "an `in_flight` limit counts requests in flight: leave `algorithm` out",
        ));
    }
    if !(1..=crate::algo::algorithm::IN_FLIGHT_MAX).contains(&n) {
        return Err(ConfigError::new(
            "in_flight",
            format!(
                "must be 1 to {} (requests of one key in flight at once), not {n}",
                crate::algo::algorithm::IN_FLIGHT_MAX
            ),
        ));
    }
    let retry_after = match &rule.retry_after {
        None => Duration::from_secs(1),
        Some(d) => parse_period(d).map_err(|e| {
            ConfigError::new(
                "retry_after",
                format!("expected a duration such as `1s`: {}", e.reason()),
            )
        })?,
    };
    let quota = Quota::new(n, Duration::from_secs(1)).map_err(|e| e.with_field("in_flight"))?;
    Ok(Some((Algorithm::in_flight_retry_after(retry_after), quota)))
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
    lease(rule, limit)
}

/// `lease` and `lease_max_age` (the builder checks the lease against the algorithm and
/// the burst).
fn lease(rule: &LimitRule, limit: Limit) -> Result<Limit, ConfigError> {
    let Some(spec) = &rule.lease else {
        if rule.lease_max_age.is_some() {
            return Err(ConfigError::new(
                "lease_max_age",
                "only a limit with a `lease` has leases to age",
            ));
        }
        return Ok(limit);
    };
    let mut lease = match spec {
        LeaseSpec::Auto => Lease::auto(),
        LeaseSpec::Tokens(n) => Lease::tokens(u32::try_from(*n).map_err(|_| {
            ConfigError::new("lease", format!("{n} tokens is more than a lease can hold"))
        })?),
    };
    if let Some(age) = &rule.lease_max_age {
        let age = parse_period(age).map_err(|e| {
            ConfigError::new(
                "lease_max_age",
                format!("expected a duration such as `1s`: {}", e.reason()),
            )
        })?;
        lease = lease.max_age(age);
    }
    Ok(limit.lease(lease))
}

/// `ban` and `ban_status` (the builder checks the values: `ban.after` at least 1,
/// `escalate` at least 1, `max` at least `for`).
fn ban(rule: &LimitRule, limit: Limit) -> Result<Limit, ConfigError> {
    let Some(spec) = &rule.ban else {
        if rule.ban_status.is_some() {
            return Err(ConfigError::new(
                "ban_status",
                "only a limit with a `ban` has banned requests",
            ));
        }
        return Ok(limit);
    };
    let duration = |field: &'static str, text: &str| {
        parse_period(text).map_err(|e| {
            ConfigError::new(
                format!("ban.{field}"),
                format!("expected a duration such as `10m`: {}", e.reason()),
            )
        })
    };
    let Some(for_) = &spec.for_ else {
        return Err(ConfigError::new(
            "ban.for",
            "missing: the first ban's length, e.g. `for = \"10m\"`",
        ));
    };
    let mut ban = crate::model::ban::Ban::after(spec.after).for_(duration("for", for_)?);
    if let Some(within) = &spec.within {
        ban = ban.within(duration("within", within)?);
    }
    if let Some(factor) = spec.escalate {
        ban = ban.escalate(factor.0);
    }
    if let Some(max) = &spec.max {
        ban = ban.max(duration("max", max)?);
    }
    if let Some(forget) = &spec.forget {
        ban = ban.forget(duration("forget", forget)?);
    }
    let limit = limit.ban(ban);
    Ok(match rule.ban_status {
        None => limit,
        Some(403) => limit.ban_status(http::StatusCode::FORBIDDEN),
        Some(429) => limit.ban_status(http::StatusCode::TOO_MANY_REQUESTS),
        Some(other) => return Err(unknown("ban_status", &other.to_string(), "403, 429")),
    })
}
