//! Building a layer: the settings a builder collects ([`Settings`]), checked and compiled
//! into an engine and its HTTP policy ([`compile`]): bound limits, route groups with their
//! pre-rendered policies, lists, hooks. Used by the layer's builder and by rules reloads.

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::audit::Recorder;
use crate::base::error::ConfigError;
use crate::engine::delay::WaitCounts;
use crate::engine::{DEFAULT_MAX_LIMITS, Engine, unique_names};
use crate::limiter::can_wait;
use crate::model::policy::Mode;
use crate::model::stream::Per;
use crate::store::Store;
use crate::web::headers;
use crate::web::hooks::{HookSettings, Hooks};
use crate::web::limit::Limit;
use crate::web::lists::{Address, Lists, Predicate};
use crate::web::overlap;
use crate::web::policy::{Group, Options, Policy, PolicyLimit};
use crate::web::routes::{RouteTable, parse_route};

/// Everything a builder collects.
pub(crate) struct Settings {
    pub(crate) always: Vec<Limit>,
    pub(crate) routes: Vec<(String, Limit)>,
    pub(crate) route_default: Vec<Limit>,
    /// How the layer answers; kept as they are.
    pub(crate) options: Options,
    pub(crate) allow: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) allow_if: Option<Predicate>,
    pub(crate) address: Address,
    /// Refusal events, offenders, metrics, the audit log.
    pub(crate) hooks: HookSettings,
    /// Shared with earlier versions of reloaded rules.
    pub(crate) wait_counts: Option<WaitCounts>,
    /// Rules may have no limit at all (every row of a table inactive).
    pub(crate) no_limits_ok: bool,
    /// The most limits the layer takes.
    pub(crate) max_limits: usize,
    /// The app's own routes, when the builder was told them: route-table entries that
    /// none of them can meet are logged.
    pub(crate) app_routes: Option<Vec<String>>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            always: Vec::new(),
            routes: Vec::new(),
            route_default: Vec::new(),
            options: Options::default(),
            allow: Vec::new(),
            deny: Vec::new(),
            allow_if: None,
            address: Address::Peer,
            hooks: HookSettings::default(),
            wait_counts: None,
            no_limits_ok: false,
            max_limits: DEFAULT_MAX_LIMITS,
            app_routes: None,
        }
    }
}

/// The most app routes [`never_met`] compares the route table with: each build compares
/// every entry with every app route.
pub(crate) const MAX_APP_ROUTES: usize = 10_000;

/// The route-table entries (`"POST /login"`, `"/api/{*rest}"`) that no request routed to
/// one of `app` (the app's routes, each with or without a method) can meet; an app route
/// that could never match a request is a [`ConfigError`] naming it.
pub(crate) fn never_met(routes: &RouteTable, app: &[String]) -> Result<Vec<String>, ConfigError> {
    if app.len() > MAX_APP_ROUTES {
        return Err(ConfigError::new(
            "app_routes",
            format!(
                "{} routes, more than the {MAX_APP_ROUTES} the check takes",
                app.len()
            ),
        ));
    }
    let app = app
        .iter()
        .map(|spec| {
            parse_route(spec).map_err(|e| {
                ConfigError::new(format!("app_routes[{spec:?}]"), e.reason().to_owned())
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut unmet = Vec::new();
    for (template, entries) in routes.routes() {
        for (method, _) in entries {
            let met = app.iter().any(|(m, a)| {
                overlap::routes_overlap((method.as_ref(), template), (m.as_ref(), a))
            });
            if !met {
                unmet.push(match method {
                    Some(m) => format!("{m} {template}"),
                    None => template.to_owned(),
                });
            }
        }
    }
    Ok(unmet)
}

/// Whether the stream limit `limit` may be given a route: a limit of bytes, with an
/// algorithm a pacer takes. It paces the response bodies (`direction = "out"`), request
/// bodies (`"in"`, the default) or both of its routes. Messages are counted by the streams
/// that name them.
fn routed_stream(limit: &Limit) -> Result<(), ConfigError> {
    let stream = &limit.spec.stream;
    if stream.per != Per::Byte {
        return Err(ConfigError::new(
            "per",
            "a limit of messages is charged by the streams that name it (`Limiter::pacer`), \
             not by route: give it no route (only a limit of bytes paces the bodies of its \
             routes)",
        ));
    }
    let over = stream.over_limit.unwrap_or_default();
    if limit.spec.algorithm.is_in_flight() || !can_wait(limit.spec.algorithm, over) {
        return Err(ConfigError::new(
            "algorithm",
            "a limit of bytes that waits paces with GCRA or a fixed window (sliding windows \
             and calendar windows take no reservations: `over_limit = \"end\"`, or another \
             algorithm)",
        ));
    }
    Ok(())
}

/// Checks a configuration and compiles it into an engine and its HTTP policy.
pub(crate) fn compile<St: Store>(
    store: St,
    mut s: Settings,
) -> Result<(Engine<St>, Policy), ConfigError> {
    if !s.no_limits_ok && s.always.is_empty() && s.routes.is_empty() && s.route_default.is_empty() {
        return Err(ConfigError::new("limits", "no limit is configured"));
    }
    if !(0.0..=1.0).contains(&s.options.jitter) {
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
    let mut engine = Engine::new(store, s.wait_counts.clone().unwrap_or_default(), count);
    let mut limits: Vec<PolicyLimit> = Vec::with_capacity(count);
    let mut bind = |limit: Limit| -> Result<usize, ConfigError> {
        limit.validate()?;
        let index = engine.bind(limit.spec.clone())?;
        limits.push(PolicyLimit::new(limit));
        Ok(index)
    };
    // A limit of messages or bytes is bound (the streams that name it charge it through
    // the layer's limiter) but checked by no request.
    let mut always: SmallVec<[usize; 4]> = SmallVec::new();
    for limit in s.always {
        let stream = limit.spec.stream.is_stream();
        let index = bind(limit)?;
        if !stream {
            always.push(index);
        }
    }
    let mut group_limits = vec![always.clone()];
    for limit in s.route_default {
        let stream = limit.spec.stream.is_stream();
        let index = bind(limit)?;
        if !stream {
            group_limits[0].push(index);
        }
    }
    let mut routes = RouteTable::default();
    // The limits of bytes that pace each group's response bodies.
    let mut group_paced: Vec<SmallVec<[usize; 1]>> = vec![SmallVec::new()];
    for (spec, limit) in s.routes {
        let paced = limit.spec.stream.is_stream();
        if paced {
            routed_stream(&limit).map_err(|e| {
                e.within(format!("routes[{spec:?}].limits[{:?}]", limit.spec.name()))
            })?;
        }
        let (method, path) = parse_route(&spec)?;
        let entries = routes
            .entries_mut(path)
            .map_err(|e| ConfigError::new(format!("routes[{spec:?}]"), format!("`{path}`: {e}")))?;
        let group = match entries.iter().find(|(m, _)| *m == method) {
            Some(&(_, g)) => g,
            None => {
                group_limits.push(always.clone());
                group_paced.push(SmallVec::new());
                entries.push((method, group_limits.len() - 1));
                group_limits.len() - 1
            }
        };
        let index = bind(limit).map_err(|e| e.within(format!("routes[{spec:?}]")))?;
        if paced {
            group_paced[group].push(index);
        } else {
            group_limits[group].push(index);
        }
    }
    if let Some(app) = &s.app_routes {
        for entry in never_met(&routes, app)? {
            tracing::warn!(
                target: "tollgate::routes",
                route = %entry,
                "the route entry `{entry}` can meet none of the app's routes (`app_routes`): \
                 its limits apply only to requests no route serves (404s, under \
                 `Router::layer`); patterns match the request path, e.g. `/api/{{*rest}}` \
                 for everything under `/api/`"
            );
        }
    }
    let shadow_headers = s.options.shadow_headers;
    let groups = group_limits
        .into_iter()
        .zip(group_paced)
        .map(|(members, paced)| {
            check_unique(&limits, &members)?;
            let reported: Vec<&Limit> = members
                .iter()
                .map(|&i| &limits[i].limit)
                .filter(|l| l.spec.mode == Mode::Enforce || shadow_headers)
                .collect();
            // Beyond `MAX_MEMBERS` limits, responses describe the most restrictive ones,
            // which vary: their policy is rendered per response.
            let policy = (reported.len() <= headers::MAX_MEMBERS)
                .then(|| {
                    headers::static_policy(reported.iter().map(|l| {
                        (
                            &*l.spec.name,
                            l.spec.quota.burst_size(),
                            l.spec.algorithm.window_secs(&l.spec.quota),
                        )
                    }))
                })
                .flatten();
            let limit = |&i: &usize| &limits[i].limit;
            Ok(Group {
                reported: reported.len(),
                policy,
                dynamic_quota: members.iter().map(limit).any(|l| l.quota_fn.is_some()),
                shadow: members
                    .iter()
                    .map(limit)
                    .any(|l| l.spec.mode == Mode::Shadow),
                charged: members.iter().map(limit).any(|l| l.charge.is_conditional()),
                held: members
                    .iter()
                    .map(limit)
                    .any(|l| l.spec.algorithm.is_in_flight()),
                delayed: members.iter().any(|&i| engine.bounds[i].waiters.is_some()),
                queued: members.iter().any(|&i| engine.bounds[i].queue.is_some()),
                settled: members.iter().map(limit).any(|l| l.settle.is_some()),
                banned: members.iter().any(|&i| engine.bounds[i].bans.is_some()),
                limits: members,
                paced,
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
        let rule_ids = limits
            .iter()
            .map(|l| (l.limit.spec.rule_id, l.limit.rule_id_by.clone()));
        Recorder::new(log, s.address.clone(), s.hooks.redact_keys, rule_ids)
    });
    let lists = (!allow.is_empty() || !deny.is_empty() || s.allow_if.is_some())
        .then(|| Lists::new(allow, deny, s.allow_if, s.address));
    if !(0.0..=1.0).contains(&s.hooks.near_limit) {
        return Err(ConfigError::new(
            "near_limit_fraction",
            "must be a fraction within 0.0..=1.0",
        ));
    }
    let names: Vec<&'static str> = engine.bounds.iter().map(|b| b.name).collect();
    let mut hooks = Hooks::new(s.hooks, &names, audit);
    // A banning limit counts its refusals by key.
    hooks.wants_keys |= engine.bounds.iter().any(|b| b.bans.is_some());
    let policy = Policy {
        limits,
        groups,
        routes,
        lists,
        options: s.options,
        hooks,
    };
    Ok((engine, policy))
}

/// A CIDR (`10.0.0.0/8`) or a single address.
fn parse_net(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    t.parse::<IpNet>()
        .or_else(|_| t.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{text}` is neither a CIDR (`10.0.0.0/8`) nor an address"))
}

/// Two limits of one request must not share a name: their headers and buckets would mix.
pub(crate) fn check_unique(limits: &[PolicyLimit], members: &[usize]) -> Result<(), ConfigError> {
    unique_names(members.iter().map(|&i| &*limits[i].limit.spec.name))
}
