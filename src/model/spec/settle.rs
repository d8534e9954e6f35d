//! Which limits can settle a cost after the fact, and how far into debt.

use super::LimitSpec;
use crate::algo::algorithm::Algorithm;

/// The debt cap of a limit without `max_debt`: none. A settle takes the whole usage: the
/// stores' arithmetic saturates (the memory store's TAT at `u64::MAX` ns, the Redis
/// store's at 2^53 − 1 µs, past which `gcra.lua` would lose exactness), so even a cost of
/// `u32::MAX` tokens at a quota of one token per 100 years overflows nothing.
pub(crate) const NO_DEBT_CAP: u64 = u64::MAX;

impl LimitSpec {
    /// The most tokens a settle may leave a key owing: `max_debt`, or [`NO_DEBT_CAP`]
    /// (the whole usage is charged).
    #[inline]
    pub(crate) fn debt_cap(&self) -> u64 {
        self.max_debt.unwrap_or(NO_DEBT_CAP)
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

    /// Issue 45: the debt was capped at the burst by default, so an estimate of 1 that
    /// used 1,100 tokens of a 100-token burst was charged 200 at most. No cap by default.
    #[test]
    fn max_debt_defaults_to_no_cap_and_needs_gcra_without_lease() {
        let q = Quota::per_minute(60_000).burst(60_000);
        let spec = LimitSpec::new("tokens", q);
        assert_eq!(spec.debt_cap(), u64::MAX);
        assert_eq!(spec.clone().max_debt(20_000).debt_cap(), 20_000);
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
