//! A rule's `settle` and `max_debt` (settled costs); the builder checks the algorithm and
//! lease mode.

use crate::base::error::ConfigError;
use crate::rules::document::LimitRule;
use crate::web::limit::Limit;
use crate::web::settle::Settle;

/// `settle = "header:<name>" | "trailer:<name>"` and `max_debt` (only with `settle`).
pub(super) fn settle(rule: &LimitRule, mut limit: Limit) -> Result<Limit, ConfigError> {
    let Some(source) = &rule.settle else {
        if rule.max_debt.is_some() {
            return Err(ConfigError::new(
                "max_debt",
                "only a limit with `settle` goes into debt: add e.g. `settle = \"header:x-usage-tokens\"`",
            ));
        }
        return Ok(limit);
    };
    limit = limit.settle(source.parse::<Settle>()?);
    if let Some(tokens) = rule.max_debt {
        limit = limit.max_debt(tokens);
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use crate::rules::Document;

    fn check(extra: &str) -> Result<(), crate::ConfigError> {
        let text = format!(
            "[[limits]]\nname = \"tokens\"\nkey = \"header:x-api-key\"\nquota = \"60000/min; burst=60000\"\n{extra}"
        );
        Document::from_toml(&text)?.check()
    }

    #[test]
    fn the_issues_tokens_limit_is_accepted_and_mistakes_name_their_field() {
        check(
            "cost = \"header:x-max-tokens\"\nsettle = \"header:x-usage-tokens\"\nmax_debt = 20000\n",
        )
        .unwrap();
        check("settle = \"trailer:x-usage-tokens\"\n").unwrap();
        let err = check("settle = \"body:usage\"\n").unwrap_err();
        assert_eq!(err.field(), "limits[0].settle");
        let err = check("max_debt = 5\n").unwrap_err();
        assert_eq!(err.field(), "limits[0].max_debt");
        let err = check("settle = \"header:x-usage\"\nalgorithm = \"fixed_window\"\n").unwrap_err();
        assert_eq!(err.field(), "limits[0].settle");
        assert!(err.reason().contains("GCRA"), "{err}");
        let err = check("settle = \"header:x-usage\"\nlease = \"auto\"\n").unwrap_err();
        assert_eq!(err.field(), "limits[0].settle");
    }
}
