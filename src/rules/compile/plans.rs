//! A document's `[limits.plans]` table: the quota (and rule id) of each plan, chosen per
//! request by the plan's name (a [`Plan`] extension, a header, a query parameter) or by
//! the request's key in a table of keys.

use std::collections::HashMap;
use std::sync::Arc;

use http::request::Parts;

use super::keys::{Source, source};
use crate::algo::quota::Quota;
use crate::base::error::ConfigError;
use crate::rules::document::Plans;
use crate::rules::locate::{Seg, render_path};
use crate::web::key::{KeyBuilder, KeyError, KeyExtractor, query_param};
use crate::web::plan::Plan;

/// A quota written as text (`10/s; burst=20`), errors named by `field`.
pub(super) fn parse_quota(text: &str, field: &str) -> Result<Quota, ConfigError> {
    text.parse::<Quota>()
        .map_err(|e| ConfigError::new(field.to_owned(), format!("{}: {}", e.field(), e.reason())))
}

/// The most keys of one limit's `[limits.plans.keys]` table; more is a `ConfigError`.
pub const MAX_PLAN_KEYS: usize = 100_000;

/// Where a request's plan comes from.
enum PlanFrom {
    /// The plan's name, read from a header or a query parameter.
    Named(Source),
    /// The plan's name, from the request's [`Plan`] extension.
    Extension,
    /// A key read from the request, looked up in a table of keys: the plan's index.
    Keys(Source, HashMap<Box<str>, usize>),
}

/// A checked `[limits.plans]`: the quota of each plan, and where the plan is read.
pub(super) struct PlanTable {
    from: PlanFrom,
    /// Each plan's name, quota and rule id (if it has one), in the document's order.
    pub(super) names: Vec<(String, Quota)>,
    rule_ids: Vec<Option<u64>>,
    by_name: HashMap<Box<str>, usize>,
    /// Whether some plan has a rule id of its own.
    pub(super) has_rule_ids: bool,
    /// No default plan: requests of no listed plan skip the limit.
    pub(super) gate: bool,
}

impl PlanTable {
    /// The index of this request's plan, if it names (or its key has) one of the table.
    /// Allocates nothing, except to decode a percent-encoded query parameter.
    fn lookup(&self, parts: &Parts) -> Option<usize> {
        let table = match &self.from {
            PlanFrom::Extension => return self.by_name.get(Plan::of(parts)?).copied(),
            PlanFrom::Named(source) => (source, &self.by_name),
            PlanFrom::Keys(source, keys) => (source, keys),
        };
        match table.0 {
            Source::Header(name) => {
                let value = parts.headers.get(name)?.to_str().ok()?;
                table.1.get(value.trim()).copied()
            }
            Source::Query(name) => table.1.get(&*query_param(parts, name)?).copied(),
        }
    }

    /// The quota of this request's plan; `None` (the limit's own quota, the default
    /// plan's) when it has no plan of the table.
    pub(super) fn quota(&self, parts: &Parts) -> Option<Quota> {
        self.lookup(parts).map(|i| self.names[i].1)
    }

    /// The rule id of this request's plan, if the plan has one.
    pub(super) fn rule_id(&self, parts: &Parts) -> Option<u64> {
        self.rule_ids[self.lookup(parts)?]
    }
}

/// Checks a `[limits.plans]` table: the default quota (the default plan's, or the first
/// plan's when there is no default) and the table.
pub(super) fn plans_table(plans: &Plans) -> Result<(Quota, PlanTable), ConfigError> {
    let read = |text: &str, field: &str| {
        source(text, field)?.ok_or_else(|| {
            ConfigError::new(
                field.to_owned(),
                format!("`{text}`: expected `header:<name>` or `query:<name>`"),
            )
        })
    };
    let mut from = match (&plans.from, &plans.by) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "plans.by",
                "give `from` (where the plan is read) or `by` (where the key whose plan \
                 `keys` gives is read), not both",
            ));
        }
        (None, None) => {
            return Err(ConfigError::new(
                "plans.from",
                "missing: `from = \"extension\"` (the plan your authentication found), or \
                 `by = \"header:<name>\"` with a `[limits.plans.keys]` table of API keys",
            ));
        }
        (Some(text), None) if text.trim() == "extension" => PlanFrom::Extension,
        (Some(text), None) => PlanFrom::Named(read(text, "plans.from").map_err(|e| {
            ConfigError::new(
                e.field().to_owned(),
                e.reason()
                    .replace("`query:<name>`", "`query:<name>` or `extension`"),
            )
        })?),
        (None, Some(text)) => PlanFrom::Keys(read(text, "plans.by")?, HashMap::new()),
    };
    if !plans.keys.is_empty() && !matches!(from, PlanFrom::Keys(..)) {
        return Err(ConfigError::new(
            "plans.keys",
            "a table of keys needs `by`: where each request's key is read (and no `from`)",
        ));
    }
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
    let by_name: HashMap<Box<str>, usize> = names
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str().into(), i))
        .collect();
    let listed = || {
        names
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let not_a_plan = |field: String, plan: &str| {
        ConfigError::new(
            field,
            format!("`{plan}` is not a plan of this table (plans: {})", listed()),
        )
    };
    // Without a default plan, the limit's own quota is never used for a check (requests
    // of other plans skip the limit): the first plan's stands in for it.
    let default = match &plans.default {
        None => names[0].1,
        Some(default) => match by_name.get(default.as_str()) {
            Some(&i) => names[i].1,
            None => return Err(not_a_plan("plans.default".into(), default)),
        },
    };
    if let PlanFrom::Keys(_, table) = &mut from {
        if plans.keys.len() > MAX_PLAN_KEYS {
            return Err(ConfigError::new(
                "plans.keys",
                format!(
                    "{} keys: at most {MAX_PLAN_KEYS} per limit (look larger tables up in your \
                     authentication and set the plan as an extension: `from = \"extension\"`)",
                    plans.keys.len()
                ),
            ));
        }
        table.reserve(plans.keys.len());
        for (key, plan) in &plans.keys {
            let field = || {
                render_path(&[
                    Seg::Key("plans".into()),
                    Seg::Key("keys".into()),
                    Seg::Key(key.clone()),
                ])
            };
            if key.is_empty() || key.trim() != key {
                return Err(ConfigError::new(
                    field(),
                    "a key is compared with a header's value, trimmed: it must not be empty \
                     nor begin or end with whitespace",
                ));
            }
            let &i = by_name
                .get(plan.as_str())
                .ok_or_else(|| not_a_plan(field(), plan))?;
            table.insert(key.as_str().into(), i);
        }
    }
    let mut rule_ids = vec![None; names.len()];
    for (name, &id) in &plans.rule_ids {
        let field = render_path(&[
            Seg::Key("plans".into()),
            Seg::Key("rule_ids".into()),
            Seg::Key(name.clone()),
        ]);
        let Some(&i) = by_name.get(name.as_str()) else {
            return Err(not_a_plan(field, name));
        };
        if id > i64::MAX as u64 {
            return Err(ConfigError::new(
                field,
                "must be at most i64::MAX (9223372036854775807), the largest SQL BIGINT",
            ));
        }
        rule_ids[i] = Some(id);
    }
    Ok((
        default,
        PlanTable {
            from,
            names,
            has_rule_ids: !plans.rule_ids.is_empty(),
            rule_ids,
            by_name,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(toml: &str) -> Result<PlanTable, ConfigError> {
        let doc = crate::rules::Document::from_toml(&format!(
            "[[limits]]\nname = \"a\"\n[limits.plans]\n{toml}"
        ))?;
        plans_table(doc.limits[0].plans.as_ref().unwrap()).map(|(_, t)| t)
    }

    fn parts(headers: &[(&str, &str)], plan: Option<&'static str>) -> Parts {
        let mut b = http::Request::builder().uri("/?k=k2");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut request = b.body(()).unwrap();
        if let Some(plan) = plan {
            request.extensions_mut().insert(Plan::from_static(plan));
        }
        request.into_parts().0
    }

    const PLANS: &str = "default = \"free\"\nfree = \"1/s\"\npro = \"5/s\"\n";

    #[test]
    fn a_key_in_the_table_has_its_plan_others_the_default() {
        let t = table(&format!(
            "by = \"header:x-api-key\"\n{PLANS}[limits.plans.keys]\nk1 = \"pro\"\nk2 = \"free\"\n"
        ))
        .unwrap();
        let pro = Some(Quota::per_second(5));
        assert_eq!(t.quota(&parts(&[("x-api-key", "k1")], None)), pro);
        assert_eq!(t.quota(&parts(&[("x-api-key", " k1 ")], None)), pro);
        assert_eq!(
            t.quota(&parts(&[("x-api-key", "k2")], None)),
            Some(Quota::per_second(1))
        );
        // Not in the table, no key, or a plan the client names: the default plan.
        assert_eq!(t.quota(&parts(&[("x-api-key", "k9")], None)), None);
        assert_eq!(t.quota(&parts(&[("x-plan", "pro")], Some("pro"))), None);
        let q = table(&format!(
            "by = \"query:k\"\n{PLANS}[limits.plans.keys]\nk2 = \"pro\"\n"
        ))
        .unwrap();
        assert_eq!(q.quota(&parts(&[], None)), pro);
    }

    #[test]
    fn a_plan_extension_is_read_and_a_header_is_not() {
        let t = table(&format!("from = \"extension\"\n{PLANS}")).unwrap();
        assert_eq!(
            t.quota(&parts(&[], Some("pro"))),
            Some(Quota::per_second(5))
        );
        assert_eq!(t.quota(&parts(&[("x-plan", "pro")], None)), None);
        assert_eq!(t.quota(&parts(&[], Some("gold"))), None);
    }

    #[test]
    fn bad_tables_are_refused_naming_the_field() {
        let cases = [
            (
                "default = \"free\"\nfree = \"1/s\"\n",
                "plans.from",
                "missing",
            ),
            (
                "from = \"extension\"\nby = \"header:k\"\nfree = \"1/s\"\n",
                "plans.by",
                "not both",
            ),
            (
                "from = \"cookie:p\"\nfree = \"1/s\"\n",
                "plans.from",
                "`extension`",
            ),
            (
                "by = \"extension\"\nfree = \"1/s\"\n",
                "plans.by",
                "header:<name>",
            ),
            (
                "from = \"header:x-plan\"\nfree = \"1/s\"\n[limits.plans.keys]\nk = \"free\"\n",
                "plans.keys",
                "needs `by`",
            ),
            (
                "by = \"header:k\"\nfree = \"1/s\"\n[limits.plans.keys]\nk = \"gold\"\n",
                "plans.keys.k",
                "`gold` is not a plan",
            ),
            (
                "by = \"header:k\"\nfree = \"1/s\"\n[limits.plans.keys]\n\" k\" = \"free\"\n",
                "plans.keys[\" k\"]",
                "whitespace",
            ),
        ];
        for (toml, field, reason) in cases {
            let err = table(toml)
                .err()
                .unwrap_or_else(|| panic!("accepted:\n{toml}"));
            assert_eq!(err.field(), field, "{toml}\n=> {err}");
            assert!(err.reason().contains(reason), "{toml}\n=> {err}");
        }
    }

    #[test]
    fn the_key_table_is_bounded() {
        let mut plans = Plans {
            by: Some("header:x-api-key".into()),
            ..Plans::default()
        };
        plans.quotas.insert("free".into(), "1/s".into());
        plans.keys = (0..MAX_PLAN_KEYS)
            .map(|i| (format!("k{i}"), "free".to_owned()))
            .collect();
        assert_eq!(plans_table(&plans).map(|_| ()), Ok(()));
        plans.keys.insert("one-more".into(), "free".into());
        let err = plans_table(&plans).map(|_| ()).unwrap_err();
        assert_eq!(err.field(), "plans.keys");
        assert!(err.reason().contains("at most 100000"), "{err}");
    }
}
