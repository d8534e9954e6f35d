//! Building an engine: the settings a builder collects ([`Settings`]), checked and
//! compiled into an [`Engine`] ([`compile`]) — bound limits, route groups with their
//! pre-rendered policies, lists, hooks. Shared by the layer's builder and the
//! [`Limiter`](crate::Limiter)'s, so neither goes through the other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::algo::algorithm::Algorithm;
use crate::audit::Recorder;
use crate::base::error::ConfigError;
use crate::engine::delay::WaitCounts;
use crate::engine::{Bound, Engine, Group, Observer};
use crate::model::policy::Mode;
use crate::store::Store;
use crate::web::headers::{self, HeaderStyle, RetryAfterFormat};
use crate::web::hooks::{HookSettings, Hooks};
use crate::web::limit::Limit;
use crate::web::lists::{Address, Lists, Predicate};
use crate::web::routes::{RouteTable, parse_route};

/// The default [`RateLimitBuilder::max_limits`](crate::RateLimitBuilder::max_limits): far more than real configurations have,
/// few enough that building stays quick and small.
pub const DEFAULT_MAX_LIMITS: usize = 1_000;

/// Everything a builder collects besides the store and the rejection responses.
pub(crate) struct Settings {
    pub(crate) always: Vec<Limit>,
    pub(crate) routes: Vec<(String, Limit)>,
    pub(crate) route_default: Vec<Limit>,
    pub(crate) style: HeaderStyle,
    pub(crate) shadow_headers: bool,
    pub(crate) retry_format: RetryAfterFormat,
    pub(crate) jitter: f64,
    pub(crate) unavailable_retry: Duration,
    pub(crate) decision_extension: bool,
    pub(crate) limiter_extension: bool,
    pub(crate) observer: Option<Observer>,
    pub(crate) allow: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) allow_if: Option<Predicate>,
    pub(crate) address: Address,
    /// Refusal events, offenders, metrics and gRPC settings.
    pub(crate) hooks: HookSettings,
    /// Delay mode's waiter counts, when they outlive this layer (reloaded rules).
    pub(crate) wait_counts: Option<WaitCounts>,
    /// Whether a layer without limits is valid (rules built by code with no limit, e.g.
    /// a `RateLimitRule` table with no active row): it limits nothing.
    pub(crate) no_limits_ok: bool,
    /// The most limits (route entries counted one by one) a layer takes.
    pub(crate) max_limits: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            always: Vec::new(),
            routes: Vec::new(),
            route_default: Vec::new(),
            style: HeaderStyle::Ietf,
            shadow_headers: false,
            retry_format: RetryAfterFormat::Seconds,
            jitter: 0.0,
            unavailable_retry: Duration::from_secs(1),
            decision_extension: true,
            limiter_extension: true,
            observer: None,
            allow: Vec::new(),
            deny: Vec::new(),
            allow_if: None,
            address: Address::Peer,
            hooks: HookSettings::default(),
            wait_counts: None,
            no_limits_ok: false,
            max_limits: DEFAULT_MAX_LIMITS,
        }
    }
}

/// Checks a configuration and compiles it into an engine.
pub(crate) fn compile<St: Store>(store: St, mut s: Settings) -> Result<Engine<St>, ConfigError> {
    if !s.no_limits_ok && s.always.is_empty() && s.routes.is_empty() && s.route_default.is_empty() {
        return Err(ConfigError::new("limits", "no limit is configured"));
    }
    if !(0.0..=1.0).contains(&s.jitter) {
        return Err(ConfigError::new(
            "retry_after_jitter",
            "must be a fraction within 0.0..=1.0",
        ));
    }
    let count = s.always.len() + s.routes.len() + s.route_default.len();
    if count > s.max_limits {
        return Err(ConfigError::new(
            "limits",
            format!(
                "{count} limits, more than the {} a layer takes (`max_limits`)",
                s.max_limits
            ),
        ));
    }
    let mut bounds: Vec<Bound<St>> = Vec::with_capacity(count);
    let waits = s.wait_counts.clone().unwrap_or_default();
    // The algorithm of each name bound so far: a table (one name) serves one algorithm,
    // whose state means nothing to another.
    let mut algorithms: HashMap<Arc<str>, Algorithm> = HashMap::with_capacity(count);
    let mut bind = |limit: Limit| -> Result<usize, ConfigError> {
        limit.validate()?;
        match algorithms.get(&limit.name) {
            Some(other) if *other != limit.algorithm => {
                return Err(ConfigError::new(
                    "algorithm",
                    format!(
                        "{:?} here, {:?} in another limit of the same name: limits that share buckets must count alike",
                        limit.algorithm, other
                    ),
                )
                .within(format!("limits[{:?}]", &*limit.name)));
            }
            Some(_) => {}
            None => {
                algorithms.insert(limit.name.clone(), limit.algorithm);
            }
        }
        bounds.push(Bound::new(limit, &store, &waits)?);
        Ok(bounds.len() - 1)
    };
    let always = s
        .always
        .into_iter()
        .map(&mut bind)
        .collect::<Result<SmallVec<[usize; 4]>, _>>()?;
    let mut group_limits = vec![always.clone()];
    for limit in s.route_default {
        group_limits[0].push(bind(limit)?);
    }
    let mut routes = RouteTable::default();
    for (spec, limit) in s.routes {
        let (method, path) = parse_route(&spec)?;
        let entries = routes
            .entries_mut(path)
            .map_err(|e| ConfigError::new(format!("routes[{spec:?}]"), format!("`{path}`: {e}")))?;
        let group = match entries.iter().find(|(m, _)| *m == method) {
            Some(&(_, g)) => g,
            None => {
                group_limits.push(always.clone());
                entries.push((method, group_limits.len() - 1));
                group_limits.len() - 1
            }
        };
        let index = bind(limit).map_err(|e| e.within(format!("routes[{spec:?}]")))?;
        group_limits[group].push(index);
    }
    let shadow_headers = s.shadow_headers;
    let groups = group_limits
        .into_iter()
        .map(|limits| {
            check_unique(&bounds, &limits)?;
            let reported: Vec<&Limit> = limits
                .iter()
                .map(|&i| &bounds[i].limit)
                .filter(|l| l.mode == Mode::Enforce || shadow_headers)
                .collect();
            // Beyond `MAX_MEMBERS` limits, responses describe the most restrictive ones,
            // which vary: their policy is rendered per response.
            let policy = (reported.len() <= headers::MAX_MEMBERS)
                .then(|| {
                    headers::static_policy(reported.iter().map(|l| {
                        (
                            &*l.name,
                            l.quota.burst_size(),
                            l.algorithm.window_secs(&l.quota),
                        )
                    }))
                })
                .flatten();
            let limit = |&i: &usize| &bounds[i].limit;
            Ok(Group {
                reported: reported.len(),
                policy,
                dynamic_quota: limits.iter().map(limit).any(|l| l.quota_fn.is_some()),
                shadow: limits.iter().map(limit).any(|l| l.mode == Mode::Shadow),
                charged: limits.iter().map(limit).any(|l| l.charge.is_conditional()),
                delayed: limits.iter().any(|&i| bounds[i].waiters.is_some()),
                limits,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let parse_nets = |field: &str, nets: Vec<String>| {
        nets.iter()
            .enumerate()
            .map(|(i, n)| {
                parse_net(n).map_err(|reason| ConfigError::new(format!("{field}[{i}]"), reason))
            })
            .collect::<Result<Vec<IpNet>, ConfigError>>()
    };
    let allow = parse_nets("allow", s.allow)?;
    let deny = parse_nets("deny", s.deny)?;
    let audit = s.hooks.audit.take().map(|log| {
        let rule_ids = bounds
            .iter()
            .map(|b| (b.limit.rule_id, b.limit.rule_id_by.clone()));
        Recorder::new(log, s.address.clone(), s.hooks.redact_keys, rule_ids)
    });
    let lists = (!allow.is_empty() || !deny.is_empty() || s.allow_if.is_some())
        .then(|| Lists::new(allow, deny, s.allow_if, s.address));
    let mut by_name = HashMap::new();
    for (i, b) in bounds.iter().enumerate() {
        by_name.entry(b.name).or_insert(i);
    }
    #[cfg(feature = "metrics")]
    if !(0.0..=1.0).contains(&s.hooks.near_limit) {
        return Err(ConfigError::new(
            "near_limit_fraction",
            "must be a fraction within 0.0..=1.0",
        ));
    }
    let names: Vec<&'static str> = bounds.iter().map(|b| b.name).collect();
    let hooks = Hooks::new(s.hooks, &names, audit);
    Ok(Engine {
        store,
        bounds,
        by_name,
        groups,
        routes,
        lists,
        style: s.style,
        shadow_headers,
        retry_format: s.retry_format,
        jitter: s.jitter,
        unavailable_retry: s.unavailable_retry,
        decision_extension: s.decision_extension,
        limiter_extension: s.limiter_extension,
        observer: s.observer,
        hooks,
    })
}

/// A CIDR (`10.0.0.0/8`) or a single address.
fn parse_net(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    t.parse::<IpNet>()
        .or_else(|_| t.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{text}` is neither a CIDR (`10.0.0.0/8`) nor an address"))
}

/// Two limits of one request must not share a name: their headers and buckets would mix.
fn check_unique<St: Store>(bounds: &[Bound<St>], limits: &[usize]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::with_capacity(limits.len());
    for &i in limits {
        let name = &bounds[i].limit.name;
        if !seen.insert(&**name) {
            return Err(ConfigError::new(
                format!("limits[{name:?}].name"),
                "is used by two limits of the same request",
            ));
        }
    }
    Ok(())
}
