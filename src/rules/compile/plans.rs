//! A document's `[limits.plans]` table: the quota (and rule id) of each plan, chosen per
//! request from a header or a query parameter.

use std::collections::HashMap;
use std::sync::Arc;

use http::request::Parts;

use super::keys::{Source, source};
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::rules::document::Plans;
use crate::rules::locate::{Seg, render_path};
use crate::web::key::{KeyBuilder, KeyError, KeyExtractor, query_param};

/// A quota written as text (`10/s; burst=20`), errors named by `field`.
pub(super) fn parse_quota(text: &str, field: &str) -> Result<Quota, ConfigError> {
    text.parse::<Quota>()
        .map_err(|e| ConfigError::new(field.to_owned(), format!("{}: {}", e.field(), e.reason())))
}

/// A checked `[limits.plans]`: the quota of each plan, and where the plan is read.
pub(super) struct PlanTable {
    from: Source,
    pub(super) names: Vec<(String, Quota)>,
    by_name: HashMap<Box<str>, Quota>,
    /// Rule ids of the plans that have one.
    pub(super) rule_ids: HashMap<Box<str>, u64>,
    /// No default plan: requests of no listed plan skip the limit.
    pub(super) gate: bool,
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
    pub(super) fn quota(&self, parts: &Parts) -> Option<Quota> {
        self.lookup(parts, &self.by_name).copied()
    }

    /// The rule id of this request's plan, if the plan has one.
    pub(super) fn rule_id(&self, parts: &Parts) -> Option<u64> {
        self.lookup(parts, &self.rule_ids).copied()
    }
}

/// Checks a `[limits.plans]` table: the default quota (the default plan's, or the first
/// plan's when there is no default) and the table.
pub(super) fn plans_table(plans: &Plans) -> Result<(Quota, PlanTable), ConfigError> {
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
        let field = render_path(&[Seg::Key("plans".into()), Seg::Key(name.clone())]);
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
        let field = render_path(&[
            Seg::Key("plans".into()),
            Seg::Key("rule_ids".into()),
            Seg::Key(name.clone()),
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

/// The key of a limit whose plans have no default: missing (so the limit is skipped)
/// when the request names no plan of the table.
pub(super) struct Gated {
    pub(super) plans: Arc<PlanTable>,
    pub(super) key: Box<dyn KeyExtractor>,
}

impl KeyExtractor for Gated {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        if self.plans.quota(parts).is_none() {
            return Err(KeyError::Missing);
        }
        self.key.extract(parts, key)
    }
}
