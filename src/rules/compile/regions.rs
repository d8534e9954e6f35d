//! `[regions]`: one limit across regions, from a rules document.

use std::time::Duration;

use super::plans::parse_quota;
use crate::algo::quota::{Quota, parse_period};
use crate::base::error::ConfigError;
use crate::rules::document::Document;
use crate::store::regions::{MoverSettings, check};

/// A document's `[regions]`, checked: the regions (in their names' order), the local
/// one, each one's store URL, the movers' settings, and the limits the movers move (each
/// limit with a fixed quota; a limit's plans split per request but move no tokens).
/// [`Document::regions`](crate::rules::Document::regions) makes it.
#[derive(Clone, Debug)]
pub struct RegionsPlan {
    names: Vec<String>,
    stores: Vec<String>,
    local: usize,
    movers: MoverSettings,
    limits: Vec<(String, Quota)>,
}

impl RegionsPlan {
    /// The regions' names, in order (a region's index is its place here).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The local region's index.
    pub fn local(&self) -> usize {
        self.local
    }

    /// Each region's store URL, in the names' order.
    pub fn stores(&self) -> &[String] {
        &self.stores
    }

    /// The movers' settings.
    pub fn movers(&self) -> &MoverSettings {
        &self.movers
    }

    /// The limits the movers move tokens of: name and global quota.
    pub fn limits(&self) -> &[(String, Quota)] {
        &self.limits
    }

    /// Opens each region's `RedisStore` (feature `redis`): the regions seen from the local
    /// one. A URL that does not open is a [`ConfigError`] naming `regions.stores.<name>`.
    #[cfg(feature = "redis")]
    pub fn open(&self) -> Result<crate::store::RedisRegions, ConfigError> {
        let stores = self
            .names
            .iter()
            .zip(&self.stores)
            .map(|(name, url)| {
                crate::store::RedisStore::open(url)
                    .map(|s| (name.clone(), s))
                    .map_err(|e| {
                        ConfigError::new(format!("regions.stores.{name}"), e.reason().to_owned())
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        crate::store::RedisStore::regions(stores, &self.names[self.local])
    }
}

fn duration(text: Option<&str>, field: &str, default: Duration) -> Result<Duration, ConfigError> {
    text.map_or(Ok(default), |t| {
        parse_period(t).map_err(|e| ConfigError::new(field.to_owned(), e.reason().to_owned()))
    })
}

/// `[regions]` checked (`None` without one); errors name `regions.<field>` or the limit
/// that cannot be split (`limits[i].quota`, `limits[i].algorithm`).
pub(crate) fn regions(doc: &Document) -> Result<Option<RegionsPlan>, ConfigError> {
    let Some(r) = &doc.regions else {
        return Ok(None);
    };
    if r.stores.is_empty() {
        return Err(ConfigError::new(
            "regions.stores",
            "no region: name each region's store (`eu = \"redis://...\"`)",
        ));
    }
    let names: Vec<String> = r.stores.keys().cloned().collect();
    let Some(local) = names.iter().position(|n| *n == r.local) else {
        return Err(ConfigError::new(
            "regions.local",
            format!("`{}` is not one of the regions {names:?}", r.local),
        ));
    };
    let defaults = MoverSettings::new();
    let interval = duration(r.interval.as_deref(), "regions.interval", defaults.every())?;
    if interval < Duration::from_millis(1) {
        return Err(ConfigError::new("regions.interval", "must be at least 1ms"));
    }
    let link_delay = duration(
        r.link_delay.as_deref(),
        "regions.link_delay",
        defaults.delay(),
    )?;
    let floor = r.floor.as_ref().map_or(0.1, |f| f.0);
    if !(0.0..=1.0).contains(&floor) {
        return Err(ConfigError::new(
            "regions.floor",
            format!("{floor} is not a part of a burst: 0 to 1"),
        ));
    }
    let n = names.len();
    let mut limits = Vec::new();
    for (i, rule) in doc.limits.iter().enumerate() {
        if !matches!(rule.algorithm.as_deref(), None | Some("gcra")) {
            return Err(ConfigError::new(
                format!("limits[{i}].algorithm"),
                "a limit across regions is a GCRA limit (tokens move between regions; a window's count does not)",
            ));
        }
        let Some(text) = &rule.quota else {
            continue;
        };
        let field = format!("limits[{i}].quota");
        let quota = parse_quota(text, &field)?;
        check(quota, n).map_err(|reason| ConfigError::new(field, reason))?;
        limits.push((rule.name.clone(), quota));
    }
    Ok(Some(RegionsPlan {
        names,
        stores: r.stores.values().cloned().collect(),
        local,
        movers: MoverSettings::new()
            .interval(interval)
            .link_delay(link_delay)
            .floor(floor),
        limits,
    }))
}

#[cfg(test)]
mod tests {
    use crate::rules::Document;

    fn err(text: &str) -> (String, String) {
        let e = Document::from_toml(text).unwrap().check().unwrap_err();
        (e.field().to_owned(), e.reason().to_owned())
    }

    const LIMIT: &str = "[[limits]]\nname = \"api\"\nquota = \"100/s\"\n";

    #[test]
    fn regions_read_with_their_movers_settings() {
        let doc = Document::from_toml(&format!(
            "{LIMIT}[regions]\nlocal = \"us\"\ninterval = \"200ms\"\nlink_delay = \"30ms\"\nfloor = 0.2\n[regions.stores]\nus = \"redis://us\"\neu = \"redis://eu\"\n"
        ))
        .unwrap();
        doc.check().unwrap();
        let plan = doc.regions().unwrap().unwrap();
        assert_eq!(plan.names(), ["eu", "us"]);
        assert_eq!(plan.local(), 1);
        assert_eq!(plan.stores(), ["redis://eu", "redis://us"]);
        assert_eq!(plan.movers().every(), std::time::Duration::from_millis(200));
        assert_eq!(plan.movers().delay(), std::time::Duration::from_millis(30));
        assert_eq!(plan.limits()[0].0, "api");
        assert!(
            Document::from_toml(LIMIT)
                .unwrap()
                .regions()
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_local_region_first_in_the_names_order_is_index_zero() {
        let doc = Document::from_toml(&format!(
            "{LIMIT}[regions]\nlocal = \"eu\"\n[regions.stores]\nus = \"redis://us\"\neu = \"redis://eu\"\n"
        ))
        .unwrap();
        let plan = doc.regions().unwrap().unwrap();
        assert_eq!(plan.names(), ["eu", "us"]);
        assert_eq!(plan.local(), 0);
        assert_eq!(plan.stores()[plan.local()], "redis://eu");
    }

    #[test]
    fn a_movers_interval_of_one_millisecond_is_the_shortest_accepted() {
        let plan = |interval: &str| {
            Document::from_toml(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\ninterval = \"{interval}\"\n[regions.stores]\neu = \"redis://eu\"\nus = \"redis://us\"\n"
            ))
            .unwrap()
            .regions()
        };
        let one = plan("1ms").unwrap().unwrap();
        assert_eq!(one.movers().every(), std::time::Duration::from_millis(1));
        let under = plan("999us").unwrap_err();
        assert_eq!(under.field(), "regions.interval");
        assert_eq!(under.reason(), "must be at least 1ms");
    }

    #[test]
    fn a_bad_regions_table_names_its_field() {
        let stores = "[regions.stores]\neu = \"redis://eu\"\nus = \"redis://us\"\n";
        assert_eq!(
            err(&format!("{LIMIT}[regions]\nlocal = \"ap\"\n{stores}")).0,
            "regions.local"
        );
        assert_eq!(
            err(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\ninterval = \"soon\"\n{stores}"
            ))
            .0,
            "regions.interval"
        );
        assert_eq!(
            err(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\ninterval = \"0ms\"\n{stores}"
            ))
            .0,
            "regions.interval"
        );
        assert_eq!(
            err(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\nlink_delay = \"x\"\n{stores}"
            ))
            .0,
            "regions.link_delay"
        );
        assert_eq!(
            err(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\nfloor = 1.5\n{stores}"
            ))
            .0,
            "regions.floor"
        );
        assert_eq!(
            err(&format!(
                "{LIMIT}[regions]\nlocal = \"eu\"\n[regions.stores]\n"
            ))
            .0,
            "regions.stores"
        );
        let (field, reason) = err(&format!(
            "[[limits]]\nname = \"a\"\nquota = \"1/s\"\n[regions]\nlocal = \"eu\"\n{stores}"
        ));
        assert_eq!(field, "limits[0].quota");
        assert!(reason.contains("split between 2 regions"), "{reason}");
        assert_eq!(
            err(&format!(
                "[[limits]]\nname = \"a\"\nquota = \"10/s\"\nalgorithm = \"sliding_window\"\n[regions]\nlocal = \"eu\"\n{stores}"
            ))
            .0,
            "limits[0].algorithm"
        );
    }
}
