//! [`rules_document`]: `RateLimitRule` rows as a rules [`Document`], checked, with errors
//! naming the row and the column.

use std::collections::BTreeMap;
use std::time::Duration;

use http::HeaderName;
use sha2::{Digest, Sha256};

use super::options::{PlanSource, SqlSourceOptions, UserKeyRepr};
use super::{SqlPlanKeyRow, SqlRuleRow};
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::rules::{CustomKeys, Document, KeySpec, LimitRule, MAX_PLAN_KEYS, Plans};

/// The plan name of a row whose `plan` is `NULL`: the default quota of its limit.
pub const DEFAULT_PLAN: &str = "*";

/// What precedes the route in a `key_pattern`.
const ENDPOINT: &str = "endpoint:";

/// The name documents give the user key of [`UserKey::extension`](super::UserKey::extension).
const USER_KEY: &str = "user";

/// The rows as a rules [`Document`], checked as [`Rules`](crate::rules::Rules) will
/// check it: what the SQL source installs at each change of the table.
///
/// - Rows with `is_active` false are left out.
/// - Rows of one `key_pattern` are one limit, named after the pattern (kept as it is when
///   it is a valid limit name — printable ASCII, at most 64 characters, no surrounding
///   whitespace —, else made one, with 8 hex digits of its SHA-256): the name, and so the
///   buckets, stay while the pattern does, whatever else changes.
/// - `scope`: `global` is one bucket; `ip` one per client address (`client_ip` behind the
///   settings' trusted proxies, else the peer's address); `user` one per user (the
///   options' [`UserKey`](super::UserKey); requests without a user skip the rule);
///   `endpoint` one bucket for the endpoint its `key_pattern` names (the
///   endpoint's own capacity, shared by every client):
///   `endpoint:/api/search` (every method) or `endpoint:POST /login`, in axum's path
///   syntax, checked on the requests of that route only. What follows `endpoint:` in a
///   `key_pattern` restricts a rule of any scope to that route: scope `ip` with
///   `ip:{ip}:endpoint:POST /login` is one bucket per client on that route. Other
///   patterns (`user:{user_id}`, `ip:{ip}`, `global`) are names only.
/// - `rate_per_second` and `burst_capacity` are the quota, exactly: the rate is read as
///   the decimal it is written as (`0.5` is 1 token per 2 s, `2.5` is 5 per 2 s, `0.1`
///   1 per 10 s).
/// - `plan`: rows of one pattern with a plan become one limit with plans, the plan read
///   where the options say (a header, default `x-plan`; the [`Plan`](crate::Plan)
///   extension; or by API key, see [`rules_document_with_keys`]); the row with a `NULL` plan is the quota of requests
///   of any other plan or of none (its plan name is [`DEFAULT_PLAN`]). Without such a
///   row, requests of no listed plan are not limited by that pattern. Each plan carries
///   its row's `rule_id` into violations.
/// - Every limit carries its `rule_id` ([`Limit::rule_id`](crate::Limit::rule_id)).
///
/// A row that cannot be mapped refuses the whole set: the error names the row and the
/// column, e.g. `RateLimitRule[rule_id=4].rate_per_second`.
///
/// No active row (an empty table, or every rule switched off) is a valid state: a
/// document without limits, whose rules limit nothing (the settings' allow and deny lists
/// still apply). Only rules built by code may be empty this way: rules text without a
/// limit is refused.
///
/// ```
/// use tollgate::sql::{SqlRuleRow, SqlSourceOptions, rules_document};
///
/// let rows = vec![
///     SqlRuleRow::new(1, "global", "global", 50_000.0, 100_000),
///     SqlRuleRow::new(2, "endpoint:/api/search", "endpoint", 0.5, 2),
/// ];
/// let doc = rules_document(&rows, &SqlSourceOptions::default())?;
/// assert_eq!(doc.limits[1].name, "endpoint:/api/search");
/// assert_eq!(doc.limits[1].quota.as_deref(), Some("1/2s; burst=2"));
/// assert_eq!(doc.limits[1].routes, Some(vec!["/api/search".to_owned()]));
/// assert_eq!(doc.limits[1].rule_id, Some(2));
///
/// let bad = vec![SqlRuleRow::new(7, "global", "global", -1.0, 10)];
/// let err = rules_document(&bad, &SqlSourceOptions::default()).unwrap_err();
/// assert_eq!(err.field(), "RateLimitRule[rule_id=7].rate_per_second");
///
/// let mut off = SqlRuleRow::new(8, "global", "global", 1.0, 1);
/// off.is_active = false;
/// assert!(rules_document(&[off], &SqlSourceOptions::default())?.limits.is_empty());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub fn rules_document(
    rows: &[SqlRuleRow],
    options: &SqlSourceOptions,
) -> Result<Document, ConfigError> {
    rules_document_with_keys(rows, &[], options)
}

/// [`rules_document`], with the plan of each API key (the active rows of
/// `RateLimitPlanKey`) for options that read plans by key
/// ([`SqlSourceOptions::plan_by_key`]): each limit with plans gets the keys of its own
/// plans as its `[limits.plans.keys]`. More than
/// [`MAX_PLAN_KEYS`](crate::rules::MAX_PLAN_KEYS) keys, or a key that is empty or begins
/// or ends with whitespace, refuses the set (the error names `RateLimitPlanKey`, never
/// the key). With other options the keys are not used.
pub fn rules_document_with_keys(
    rows: &[SqlRuleRow],
    keys: &[SqlPlanKeyRow],
    options: &SqlSourceOptions,
) -> Result<Document, ConfigError> {
    let mapped = map(rows, keys, options)?;
    mapped
        .document
        .check_with(&custom_keys(options))
        .map_err(|e| mapped.rename(e))?;
    Ok(mapped.document)
}

/// The key parts the options register (`custom:user` for a user key read from an
/// extension).
pub(crate) fn custom_keys(options: &SqlSourceOptions) -> CustomKeys {
    let mut keys = CustomKeys::new();
    if let UserKeyRepr::Extension { key, .. } = &options.user_key.0 {
        keys.insert(USER_KEY.to_owned(), key.clone());
    }
    keys
}

/// A document and the rows of each of its limits (to name rows in errors).
struct Mapped {
    document: Document,
    rows: Vec<Vec<i64>>,
}

impl Mapped {
    /// A document error (`limits[2].routes[0]: ...`) named by the rows of that limit.
    fn rename(&self, e: ConfigError) -> ConfigError {
        let field = e.field().to_owned();
        let Some((index, rest)) = field
            .strip_prefix("limits[")
            .and_then(|r| r.split_once(']'))
            .and_then(|(i, rest)| Some((i.parse::<usize>().ok()?, rest)))
        else {
            return e;
        };
        let Some(ids) = self.rows.get(index) else {
            return e;
        };
        let ids = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let column = if rest.starts_with(".routes") {
            Some("key_pattern")
        } else if rest.starts_with(".plans") {
            Some("plan")
        } else if rest.starts_with(".quota") {
            Some("rate_per_second")
        } else {
            None
        };
        let renamed = match column {
            Some(column) => format!("RateLimitRule[rule_id={ids}].{column}"),
            None => format!("RateLimitRule[rule_id={ids}]"),
        };
        let reason = format!("{}: {}", field, e.reason());
        ConfigError::new(renamed, reason)
    }
}

fn at(id: i64, column: &str) -> String {
    format!("RateLimitRule[rule_id={id}].{column}")
}

/// The active rows of one `key_pattern`.
struct Group<'a> {
    pattern: &'a str,
    rows: Vec<&'a SqlRuleRow>,
}

fn map(
    rows: &[SqlRuleRow],
    keys: &[SqlPlanKeyRow],
    options: &SqlSourceOptions,
) -> Result<Mapped, ConfigError> {
    let header = |field: &'static str, name: &str| {
        HeaderName::try_from(name)
            .map_err(|_| ConfigError::new(field, format!("`{name}` is not a header name")))
    };
    let source = match &options.plan {
        PlanSource::Header(name) => {
            PlanFrom::From(format!("header:{}", header("plan_header", name)?))
        }
        PlanSource::Extension => PlanFrom::From("extension".to_owned()),
        PlanSource::ByKey(name) => {
            if keys.len() > MAX_PLAN_KEYS {
                return Err(ConfigError::new(
                    "RateLimitPlanKey",
                    format!("more than {MAX_PLAN_KEYS} active keys: at most {MAX_PLAN_KEYS}"),
                ));
            }
            if let Some(bad) = keys
                .iter()
                .find(|k| k.api_key.is_empty() || k.api_key.trim() != k.api_key)
            {
                return Err(ConfigError::new(
                    "RateLimitPlanKey.api_key",
                    format!(
                        "a key of plan `{}` is empty or begins or ends with whitespace: keys \
                         are compared with a header's value, trimmed",
                        bad.plan
                    ),
                ));
            }
            PlanFrom::By(format!("header:{}", header("plan_key_header", name)?), keys)
        }
    };
    let user_key = match &options.user_key.0 {
        UserKeyRepr::Header(name) => {
            let name = HeaderName::try_from(name.as_str()).map_err(|_| {
                ConfigError::new("user_header", format!("`{name}` is not a header name"))
            })?;
            format!("header:{name}")
        }
        UserKeyRepr::Extension { .. } => format!("custom:{USER_KEY}"),
    };
    let behind_proxies =
        options.settings.trusted_proxies.is_some() || options.settings.hops.is_some();
    let ip_key = if behind_proxies {
        "client_ip"
    } else {
        "peer_ip"
    };

    let mut active: Vec<&SqlRuleRow> = rows.iter().filter(|r| r.is_active).collect();
    active.sort_by_key(|r| r.rule_id);
    // Groups in the order of their first rule id.
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for row in active {
        let i = *index.entry(row.key_pattern.as_str()).or_insert_with(|| {
            groups.push(Group {
                pattern: &row.key_pattern,
                rows: Vec::new(),
            });
            groups.len() - 1
        });
        groups[i].rows.push(row);
    }

    let mut names: BTreeMap<String, i64> = BTreeMap::new();
    let mut limits = Vec::with_capacity(groups.len());
    let mut ids = Vec::with_capacity(groups.len());
    for group in &groups {
        let first = group.rows[0];
        for row in &group.rows {
            if row.rule_id < 0 {
                return Err(ConfigError::new(
                    at(row.rule_id, "rule_id"),
                    "must not be negative (violations carry it as an unsigned id)",
                ));
            }
            if row.scope != first.scope {
                return Err(ConfigError::new(
                    at(row.rule_id, "scope"),
                    format!(
                        "`{}`, but row {} of the same key_pattern `{}` says `{}`: the rows of \
                         one key_pattern are one limit, of one scope",
                        row.scope, first.rule_id, group.pattern, first.scope
                    ),
                ));
            }
        }
        if group.pattern.trim().is_empty() {
            return Err(ConfigError::new(
                at(first.rule_id, "key_pattern"),
                "must not be empty",
            ));
        }
        // The route: what follows the first `endpoint:`.
        let routes = match group.pattern.find(ENDPOINT) {
            Some(i) => Some(vec![route(
                &group.pattern[i + ENDPOINT.len()..],
                first.rule_id,
            )?]),
            None => None,
        };
        let key = match first.scope.as_str() {
            "global" => None,
            "ip" => Some(KeySpec::one(ip_key)),
            "user" => Some(KeySpec::one(user_key.as_str())),
            "endpoint" => {
                if routes.is_none() {
                    return Err(ConfigError::new(
                        at(first.rule_id, "key_pattern"),
                        format!(
                            "`{}`: an `endpoint` rule names its route as `endpoint:<path>` or \
                             `endpoint:<METHOD> <path>`, e.g. `endpoint:POST /login`",
                            group.pattern
                        ),
                    ));
                }
                None
            }
            other => {
                return Err(ConfigError::new(
                    at(first.rule_id, "scope"),
                    format!("unknown value `{other}`; expected one of: global, ip, user, endpoint"),
                ));
            }
        };
        let mut limit = LimitRule {
            name: limit_name(group.pattern),
            key,
            routes,
            // Anonymous requests are not limited by per-user rules (ip and global rules
            // still apply to them).
            on_missing_key: (first.scope == "user").then(|| "skip".to_owned()),
            ..LimitRule::default()
        };
        if let Some(other) = names.insert(limit.name.clone(), first.rule_id) {
            return Err(ConfigError::new(
                at(first.rule_id, "key_pattern"),
                format!(
                    "`{}` gives the limit name `{}`, as row {other} does: key patterns must \
                     differ in their first 55 printable ASCII characters",
                    group.pattern, limit.name
                ),
            ));
        }
        plan_quotas(group, &source, &mut limit)?;
        limits.push(limit);
        ids.push(group.rows.iter().map(|r| r.rule_id).collect());
    }
    Ok(Mapped {
        document: Document {
            settings: options.settings.clone(),
            limits,
            regions: None,
        },
        rows: ids,
    })
}

/// Where the limits with plans read a request's plan.
enum PlanFrom<'a> {
    /// `from`: a header or the extension.
    From(String),
    /// `by` a header, and the keys.
    By(String, &'a [SqlPlanKeyRow]),
}

/// The quota (one row) or the plans (rows with a plan) of a group, and its rule ids.
fn plan_quotas(
    group: &Group<'_>,
    source: &PlanFrom<'_>,
    limit: &mut LimitRule,
) -> Result<(), ConfigError> {
    let mut default: Option<&SqlRuleRow> = None;
    let mut plans = Plans::default();
    for row in &group.rows {
        let quota = quota(row)?;
        match row.plan.as_deref() {
            None => {
                if let Some(first) = default.replace(row) {
                    return Err(ConfigError::new(
                        at(row.rule_id, "plan"),
                        format!(
                            "NULL, as row {} of the same key_pattern `{}`: one row without a \
                             plan per key_pattern (UNIQUE does not apply to NULLs)",
                            first.rule_id, group.pattern
                        ),
                    ));
                }
                plans.quotas.insert(DEFAULT_PLAN.to_owned(), quota);
            }
            Some(plan) => {
                check_plan(plan, row.rule_id)?;
                plans.quotas.insert(plan.to_owned(), quota);
                plans.rule_ids.insert(plan.to_owned(), row.rule_id as u64);
            }
        }
    }
    limit.rule_id = default.map(|row| row.rule_id as u64);
    if plans.rule_ids.is_empty() {
        // One row without a plan: a plain quota.
        limit.quota = plans.quotas.remove(DEFAULT_PLAN);
        return Ok(());
    }
    match source {
        PlanFrom::From(from) => plans.from = Some(from.clone()),
        PlanFrom::By(by, keys) => {
            plans.by = Some(by.clone());
            // The keys of this limit's plans; others have its default plan.
            plans.keys = keys
                .iter()
                .filter(|k| k.plan != DEFAULT_PLAN && plans.rule_ids.contains_key(&k.plan))
                .map(|k| (k.api_key.clone(), k.plan.clone()))
                .collect();
        }
    }
    plans.default = default.map(|_| DEFAULT_PLAN.to_owned());
    if plans.default.is_none() {
        // Requests of no listed plan skip the limit, as requests without a key do.
        limit.on_missing_key = Some("skip".to_owned());
    }
    limit.plans = Some(plans);
    Ok(())
}

fn check_plan(plan: &str, id: i64) -> Result<(), ConfigError> {
    let reason = if plan.is_empty() {
        "must not be empty (NULL is the default plan)".to_owned()
    } else if plan == DEFAULT_PLAN {
        format!("`{DEFAULT_PLAN}` names the rows whose plan is NULL")
    } else if plan.trim() != plan || !plan.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        format!(
            "`{plan}`: a plan is compared with a header value, so it must be printable ASCII \
             without surrounding whitespace"
        )
    } else {
        return Ok(());
    };
    Err(ConfigError::new(at(id, "plan"), reason))
}

/// `endpoint:<route>`: the route, checked.
fn route(spec: &str, id: i64) -> Result<String, ConfigError> {
    let spec = spec.trim();
    crate::web::routes::parse_route(spec).map_err(|e| {
        ConfigError::new(
            at(id, "key_pattern"),
            format!(
                "`endpoint:{spec}`: expected `endpoint:<path>` or `endpoint:<METHOD> <path>` in \
                 axum's path syntax: {}",
                e.reason()
            ),
        )
    })?;
    Ok(spec.to_owned())
}

/// A stable, valid limit name for `pattern`.
fn limit_name(pattern: &str) -> String {
    if crate::web::limit::validate_name(pattern).is_ok() {
        return pattern.to_owned();
    }
    let digest = Sha256::digest(pattern.as_bytes());
    let clean: String = pattern
        .trim()
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
        .take(55)
        .collect();
    format!(
        "{}~{:02x}{:02x}{:02x}{:02x}",
        clean.trim_end(),
        digest[0],
        digest[1],
        digest[2],
        digest[3]
    )
}

/// The row's quota as a document writes it: the rate read as the decimal it is written
/// as, reduced (`0.5` → `1/2s`), and the burst.
fn quota(row: &SqlRuleRow) -> Result<String, ConfigError> {
    let rate = row.rate_per_second;
    let bad_rate = |reason: String| ConfigError::new(at(row.rule_id, "rate_per_second"), reason);
    if !rate.is_finite() || rate <= 0.0 {
        return Err(bad_rate(format!(
            "`{rate}` must be a positive number of tokens per second"
        )));
    }
    if row.burst_capacity < 1 {
        return Err(ConfigError::new(
            at(row.rule_id, "burst_capacity"),
            format!("`{}` must be at least 1", row.burst_capacity),
        ));
    }
    let burst = row.burst_capacity as u64;
    let (tokens, secs) = fraction(rate).ok_or_else(|| {
        bad_rate(format!(
            "`{rate}` has more digits than a quota can keep exactly"
        ))
    })?;
    Quota::new(tokens, Duration::from_secs(secs))
        .and_then(|q| q.try_burst(burst))
        .map_err(|e| {
            let column = if e.field() == "burst" {
                "burst_capacity"
            } else {
                "rate_per_second"
            };
            ConfigError::new(
                at(row.rule_id, column),
                format!(
                    "`{rate}` per second (burst {burst}): {}: {}",
                    e.field(),
                    e.reason()
                ),
            )
        })?;
    Ok(if secs == 1 {
        format!("{tokens}/s; burst={burst}")
    } else {
        format!("{tokens}/{secs}s; burst={burst}")
    })
}

/// `rate` as `tokens / secs` in lowest terms, from its shortest decimal form (the one
/// that reads back as the same `f64`: what was written, for any rate written with up
/// to 15 significant digits).
fn fraction(rate: f64) -> Option<(u64, u64)> {
    // `Display` of an `f64` is its shortest round-trip decimal, never in exponent form.
    let text = rate.to_string();
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let mut tokens: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        tokens = tokens
            .checked_mul(10)?
            .checked_add(u128::from(b.checked_sub(b'0')?))?;
    }
    let mut secs = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let g = gcd(tokens, secs);
    tokens /= g;
    secs /= g;
    Some((u64::try_from(tokens).ok()?, u64::try_from(secs).ok()?))
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_as_written() {
        assert_eq!(fraction(0.5), Some((1, 2)));
        assert_eq!(fraction(2.5), Some((5, 2)));
        assert_eq!(fraction(0.1), Some((1, 10)));
        assert_eq!(fraction(10.0), Some((10, 1)));
        assert_eq!(fraction(1000.0), Some((1000, 1)));
        assert_eq!(fraction(0.333), Some((333, 1000)));
        assert_eq!(fraction(1e-7), Some((1, 10_000_000)));
        assert_eq!(fraction(1e300), None);
    }

    #[test]
    fn names_are_stable_valid_and_distinct() {
        assert_eq!(limit_name("endpoint:POST /login"), "endpoint:POST /login");
        let long = "x".repeat(80);
        let a = limit_name(&long);
        assert!(crate::web::limit::validate_name(&a).is_ok(), "{a}");
        assert_eq!(a, limit_name(&long), "stable");
        assert_ne!(a, limit_name(&format!("{long}y")));
        let accents = limit_name("user:é");
        assert!(accents.starts_with("user:_~"), "{accents}");
        assert_ne!(accents, limit_name("user:è"));
        assert!(crate::web::limit::validate_name(&limit_name(" padded ")).is_ok());
    }
}
