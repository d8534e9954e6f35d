//! Which limits can settle a cost after the fact, and how far into debt.

use super::LimitSpec;
use crate::algo::algorithm::Algorithm;
use crate::algo::quota::Quota;

impl LimitSpec {
    /// The most tokens a settle may leave a key owing under `quota`: `max_debt`, or the
    /// burst.
    #[inline]
    pub(crate) fn debt_cap(&self, quota: &Quota) -> u64 {
        self.max_debt.unwrap_or_else(|| quota.burst_size())
    }

    /// Why this limit cannot settle costs, if it cannot.
    ///
    /// Only GCRA settles: a window counts units in the window they were taken in, and a
    /// settle that comes after that window has ended (a long stream) would count them in
    /// the next one, or give back units of a window they never were in. Nor a limit in
    /// lease mode: its tokens are spent locally from a lease taken ahead, and a settle
    /// would have to reach past the lease to the shared bucket while the lease still
    /// counts the estimate.
    pub(crate) fn settle_refusal(&self) -> Result<(), &'static str> {
        if self.algorithm != Algorithm::Gcra {
            return Err(
                "only a GCRA limit settles costs (a window's units belong to the window they were taken in, which a late settle has left)",
            );
        }
        if self.lease.is_some() {
            return Err(
                "a limit in lease mode cannot settle costs (its tokens are spent from a lease taken ahead); drop `lease` or `settle`",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Algorithm, Lease, LimitSpec, Quota};

    #[test]
    fn max_debt_defaults_to_the_burst_and_needs_gcra_without_lease() {
        let q = Quota::per_minute(60_000).burst(60_000);
        let spec = LimitSpec::new("tokens", q);
        assert_eq!(spec.debt_cap(&q), 60_000);
        assert_eq!(spec.clone().max_debt(20_000).debt_cap(&q), 20_000);
        spec.clone().max_debt(0).validate().unwrap();
        let err = spec
            .clone()
            .max_debt(5)
            .algorithm(Algorithm::fixed_window())
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), r#"limits["tokens"].max_debt"#);
        assert!(err.reason().contains("GCRA"), "{err}");
        let err = spec
            .max_debt(5)
            .lease(Lease::default())
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), r#"limits["tokens"].max_debt"#);
        assert!(err.reason().contains("lease"), "{err}");
    }
}
