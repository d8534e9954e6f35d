//! A [`Document`] as text (`tollgate-rules check`, `on_reload` logs): per limit, what it
//! limits and how, every setting with its effective value (defaults filled in).

use std::fmt;

use crate::rules::document::{CostSpec, Document, LeaseSpec, LimitRule, Plans};

impl fmt::Display for Document {
    /// Per limit, a line `name: quota per key`, then one indented line per aspect: its
    /// kind (rate, in-flight, calendar) and algorithm, plans, mode, cost, settled costs,
    /// ban, lease, what a refusal does, missing keys, store failures, rule id and routes.
    /// API keys of a plans table are not printed, only how many there are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.limits.iter().try_for_each(|rule| limit(f, rule))
    }
}

fn limit(f: &mut fmt::Formatter<'_>, rule: &LimitRule) -> fmt::Result {
    let key = rule
        .key
        .as_ref()
        .map_or_else(|| "global".to_owned(), |k| k.0.join(" + "));
    write!(f, "{}: ", rule.name)?;
    match (rule.in_flight, &rule.quota, &rule.plans) {
        (Some(n), _, _) => write!(f, "at most {n} in flight")?,
        (None, Some(q), _) => write!(f, "{q}")?,
        (None, None, Some(_)) => write!(f, "a quota per plan")?,
        (None, None, None) => write!(f, "(no quota)")?,
    }
    writeln!(f, " per {key}")?;
    kind(f, rule)?;
    if let Some(per @ ("message" | "byte")) = rule.per.as_deref() {
        return stream(f, rule, per);
    }
    if let Some(plans) = &rule.plans {
        write!(f, "  plans: ")?;
        self::plans(f, plans)?;
        writeln!(f)?;
    }
    writeln!(f, "  mode: {}", rule.mode.as_deref().unwrap_or("enforce"))?;
    match &rule.cost {
        None => writeln!(f, "  cost: 1")?,
        Some(CostSpec::Fixed(n)) => writeln!(f, "  cost: {n}")?,
        Some(CostSpec::From(s)) => writeln!(
            f,
            "  cost: from {s} (default {})",
            rule.default_cost.unwrap_or(1)
        )?,
    }
    if let Some(settle) = &rule.settle {
        write!(f, "  settled from {settle}")?;
        match rule.max_debt {
            Some(debt) => writeln!(f, " (debt up to {debt})")?,
            None => writeln!(f, " (debt up to the burst)")?,
        }
    }
    if let Some(ban) = &rule.ban {
        let for_ = ban.for_.as_deref().unwrap_or("?");
        writeln!(
            f,
            "  ban: after {} refusals within {}, for {for_}, escalating x{}, at most {}, \
             forgotten after {}; status {}",
            ban.after,
            ban.within.as_deref().unwrap_or("1m"),
            ban.escalate.map_or(1.0, |e| e.0),
            ban.max.as_deref().unwrap_or(for_),
            ban.forget.as_deref().unwrap_or("1d"),
            rule.ban_status.unwrap_or(403),
        )?;
    }
    if let Some(lease) = &rule.lease {
        match lease {
            LeaseSpec::Auto => write!(f, "  leased (auto)")?,
            LeaseSpec::Tokens(n) => write!(f, "  leased (up to {n})")?,
        }
        writeln!(
            f,
            ", spent within {}",
            rule.lease_max_age.as_deref().unwrap_or("1s")
        )?;
    }
    if rule.on_limit.as_deref() == Some("delay") {
        let wait = rule.max_wait.as_deref().unwrap_or("?");
        let waiters = rule.max_waiters.unwrap_or(100);
        write!(f, "  on limit: delay up to {wait} ({waiters} waiters)")?;
    } else {
        write!(f, "  on limit: reject")?;
    }
    match rule.max_reserved {
        Some(n) => writeln!(f, ", at most {n} tokens reserved ahead")?,
        None => writeln!(f)?,
    }
    match rule.on_missing_key.as_deref() {
        Some("reject") => match &rule.missing_key_challenge {
            Some(challenge) => writeln!(f, "  missing key: reject (401, {challenge})")?,
            None => writeln!(
                f,
                "  missing key: reject ({})",
                rule.missing_key_status.unwrap_or(400)
            )?,
        },
        other => writeln!(f, "  missing key: {}", other.unwrap_or("shared"))?,
    }
    writeln!(
        f,
        "  on store failure: {}",
        rule.on_store_failure.as_deref().unwrap_or("share")
    )?;
    if let Some(id) = rule.rule_id {
        writeln!(f, "  rule {id}")?;
    }
    match &rule.routes {
        Some(routes) => writeln!(f, "  routes: {}", routes.join(", ")),
        None => writeln!(f, "  routes: every request"),
    }
}

/// A limit of messages or bytes: what it counts, what a stream over it does, and who
/// charges it.
fn stream(f: &mut fmt::Formatter<'_>, rule: &LimitRule, per: &str) -> fmt::Result {
    write!(
        f,
        "  counts: each {per} {}",
        match rule.direction.as_deref().unwrap_or("in") {
            "out" => "sent",
            "both" => "received or sent",
            _ => "received",
        }
    )?;
    match &rule.rate_after {
        Some(after) => writeln!(f, ", the first {after} of each body free")?,
        None => writeln!(f)?,
    }
    match rule.over_limit.as_deref() {
        Some("end") => writeln!(f, "  over limit: end the stream")?,
        _ => writeln!(
            f,
            "  over limit: wait up to {} ({} waiters)",
            rule.max_wait.as_deref().unwrap_or("30s"),
            rule.max_waiters
                .unwrap_or(crate::model::stream::DEFAULT_MAX_WAITERS)
        )?,
    }
    if let Some(lease) = &rule.lease {
        match lease {
            LeaseSpec::Auto => writeln!(f, "  leased (auto)")?,
            LeaseSpec::Tokens(n) => writeln!(f, "  leased (up to {n})")?,
        }
    }
    writeln!(
        f,
        "  on store failure: {}",
        rule.on_store_failure.as_deref().unwrap_or("share")
    )?;
    if let Some(id) = rule.rule_id {
        writeln!(f, "  rule {id}")?;
    }
    match &rule.routes {
        Some(routes) => writeln!(
            f,
            "  paces the {} bodies of: {}",
            match rule.direction.as_deref().unwrap_or("in") {
                "out" => "response",
                "both" => "request and response",
                _ => "request",
            },
            routes.join(", ")
        ),
        None => writeln!(
            f,
            "  charged by the streams that name it (`Limiter::pacer`)"
        ),
    }
}

/// `kind: rate (gcra)`, `kind: in-flight (retry after 1s)`, `kind: calendar (months in
/// UTC)`.
fn kind(f: &mut fmt::Formatter<'_>, rule: &LimitRule) -> fmt::Result {
    if rule.in_flight.is_some() {
        let retry = rule.retry_after.as_deref().unwrap_or("1s");
        return writeln!(f, "  kind: in-flight (retry after {retry})");
    }
    let algorithm = rule.algorithm.as_deref().unwrap_or("gcra");
    if algorithm == "calendar" {
        // The quota's period (`10000/month`, `5/2d; ...`) is the calendar's unit.
        let period = rule
            .quota
            .as_deref()
            .and_then(|q| q.split(';').next()?.split_once('/'))
            .map_or("?", |(_, p)| p.trim());
        let zone = rule.time_zone.as_deref().unwrap_or("UTC");
        return writeln!(f, "  kind: calendar (windows of {period} in {zone})");
    }
    match &rule.phase {
        Some(phase) => writeln!(f, "  kind: rate ({algorithm}, phase {phase})"),
        None => writeln!(f, "  kind: rate ({algorithm})"),
    }
}

/// `from header:x-plan (default free): free = 10/min, pro = 10/s (rule 2)`, or
/// `by header:x-api-key, 3 keys (no default): ...`.
fn plans(f: &mut fmt::Formatter<'_>, p: &Plans) -> fmt::Result {
    match (&p.from, &p.by) {
        (Some(from), _) => write!(f, "from {from}")?,
        (None, Some(by)) => {
            let n = p.keys.len();
            write!(f, "by {by}, {n} key{}", if n == 1 { "" } else { "s" })?;
        }
        (None, None) => write!(f, "from ?")?,
    }
    match &p.default {
        Some(default) => write!(f, " (default {default}):")?,
        None => write!(f, " (no default):")?,
    }
    for (i, (name, q)) in p.quotas.iter().enumerate() {
        write!(f, "{} {name} = {q}", if i == 0 { "" } else { "," })?;
        if let Some(id) = p.rule_ids.get(name) {
            write!(f, " (rule {id})")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY_KIND: &str = r#"
        [[limits]]
        name = "rate"
        key = "peer_ip"
        quota = "5/s; burst=10"
        mode = "shadow"
        on_store_failure = "deny"
        rule_id = 4
        routes = ["POST /login"]
        ban = { after = 3, within = "2m", for = "10m", escalate = 2, max = "1d" }
        ban_status = 429

        [[limits]]
        name = "conns"
        key = "header:x-api-key"
        in_flight = 10
        retry_after = "2s"
        on_missing_key = "reject"
        missing_key_status = 401

        [[limits]]
        name = "monthly"
        key = "header:x-api-key"
        quota = "10000/month"
        algorithm = "calendar"
        time_zone = "Europe/Berlin"

        [[limits]]
        name = "tokens"
        quota = "1000/min; burst=5000"
        cost = "header:x-estimate"
        default_cost = 100
        settle = "trailer:x-usage"
        max_debt = 20000

        [[limits]]
        name = "leased"
        quota = "1000/s"
        lease = "auto"
        lease_max_age = "2s"

        [[limits]]
        name = "smooth"
        quota = "10/s; burst=5"
        on_limit = "delay"
        max_wait = "1s"
        max_waiters = 50
        max_reserved = 20

        [[limits]]
        name = "per-key"
        key = "header:x-api-key"
        [limits.plans]
        by = "header:x-api-key"
        default = "free"
        free = "10/min"
        pro = "10/s; burst=50"
        [limits.plans.keys]
        "k1" = "pro"
        "k2" = "free"
    "#;

    #[test]
    fn every_kind_and_setting_is_printed() {
        let doc = Document::from_toml(EVERY_KIND).unwrap();
        doc.check().unwrap();
        let text = doc.to_string();
        for line in [
            "rate: 5/s; burst=10 per peer_ip",
            "  kind: rate (gcra)",
            "  mode: shadow",
            "  ban: after 3 refusals within 2m, for 10m, escalating x2, at most 1d, forgotten after 1d; status 429",
            "  on store failure: deny",
            "  rule 4",
            "  routes: POST /login",
            "conns: at most 10 in flight per header:x-api-key",
            "  kind: in-flight (retry after 2s)",
            "  missing key: reject (401)",
            "monthly: 10000/month per header:x-api-key",
            "  kind: calendar (windows of month in Europe/Berlin)",
            "  cost: from header:x-estimate (default 100)",
            "  settled from trailer:x-usage (debt up to 20000)",
            "  leased (auto), spent within 2s",
            "  on limit: delay up to 1s (50 waiters), at most 20 tokens reserved ahead",
            "per-key: a quota per plan per header:x-api-key",
            "  plans: by header:x-api-key, 2 keys (default free): free = 10/min, pro = 10/s; burst=50",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // Defaults are filled in; API keys are never printed.
        assert_eq!(text.matches("  on limit: reject\n").count(), 6, "{text}");
        assert_eq!(text.matches("  missing key: shared\n").count(), 6, "{text}");
        assert_eq!(
            text.matches("  routes: every request\n").count(),
            6,
            "{text}"
        );
        assert!(!text.contains("k1") && !text.contains("k2"), "{text}");
    }

    #[test]
    fn plans_from_a_header_or_an_extension_show_their_source_and_rule_ids() {
        let mut plans = Plans {
            from: Some("extension".into()),
            ..Plans::default()
        };
        plans.quotas.insert("pro".into(), "5/s".into());
        plans.rule_ids.insert("pro".into(), 2);
        let mut out = String::new();
        fmt::write(&mut out, format_args!("{}", Shown(&plans))).unwrap();
        assert_eq!(out, "from extension (no default): pro = 5/s (rule 2)");
    }

    struct Shown<'a>(&'a Plans);

    impl fmt::Display for Shown<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            plans(f, self.0)
        }
    }
}
