//! Reading what Redis answers: `gcra.lua`'s reply checked and turned into each
//! limit's outcome, windows included; a malformed reply is a store failure, never a guess.

use super::*;

/// One limit's answer from `gcra.lua`, in microseconds.
#[derive(Clone, Copy)]
pub(super) struct Answer {
    pub(super) verdict: gcra::Admission,
    /// Until the bucket is full again, after this request.
    pub(super) reset_after: u64,
    /// The TAT written, if the request consumed from this limit.
    pub(super) written: Option<u64>,
    /// The TAT before the request.
    pub(super) previous: u64,
    /// Redis's `now` for this call.
    pub(super) now: u64,
    /// A window limit's outcome after this request.
    pub(super) window: Option<Outcome>,
    /// What an undo of this request gives back: its cost, or for a fixed window the
    /// units it added to the use (more than its cost for a reservation that skipped what
    /// was left of the current window).
    pub(super) undo: u64,
}

#[derive(Debug, Clone)]
pub(super) enum Failure {
    Redis(redis::RedisError),
    Reply(usize),
    /// The batch a check waited for was dropped unsent (the runtime is shutting down).
    Abandoned,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Redis(e) => write!(f, "{e}"),
            Failure::Reply(n) => write!(f, "unexpected reply of {n} integers"),
            Failure::Abandoned => f.write_str("the batch of this check was dropped unsent"),
        }
    }
}

impl std::error::Error for Failure {}

/// Reads `gcra.lua`'s reply for the limits `group` of `parts`: the verdicts and times to
/// full, from which everything else follows (the script writes `now + reset_after` for each
/// consuming limit of a request no enforcing limit refused).
pub(super) fn parse_reply(
    reply: &[i64],
    parts: &[Part],
    group: &[usize],
) -> Result<Vec<Answer>, Failure> {
    let malformed = || Failure::Reply(reply.len());
    let (&now, rest) = reply.split_first().ok_or_else(malformed)?;
    let expected: usize = group.iter().map(|&i| parts[i].width()).sum();
    if rest.len() != expected || reply.iter().any(|&v| v < 0) {
        return Err(malformed());
    }
    let now = now as u64;
    let mut chunks: SmallVec<[&[i64]; 4]> = SmallVec::new();
    let mut tail = rest;
    for &i in group {
        let (r, t) = tail.split_at(parts[i].width());
        chunks.push(r);
        tail = t;
    }
    let refused = group
        .iter()
        .zip(&chunks)
        .any(|(&i, r)| parts[i].mode == Mode::Enforce && r[0] != 0);
    group
        .iter()
        .zip(&chunks)
        .map(|(&i, r)| {
            let p = &parts[i];
            let cost = u64::from(p.cost);
            if p.algorithm.is_window() {
                let verdict = match r[0] {
                    0 => gcra::Admission::Allowed,
                    1 if r[1] > 0 => gcra::Admission::Denied {
                        retry_after: r[1] as u64,
                    },
                    2 => gcra::Admission::Never,
                    _ => return Err(malformed()),
                };
                let written = (verdict.is_allowed() && cost > 0 && !refused).then_some(now);
                let fixed = p.algorithm.is_fixed();
                return Ok(Answer {
                    verdict,
                    reset_after: r[3] as u64,
                    written,
                    previous: 0,
                    now,
                    window: Some(window_outcome(p, verdict, &r[2..5])),
                    undo: if fixed { (r[4] as u64).max(cost) } else { cost },
                });
            }
            let params = p.params();
            let reset_after = r[1] as u64;
            let verdict = match r[0] {
                0 => gcra::Admission::Allowed,
                1 => gcra::Admission::Denied {
                    // `after` is the TAT as it stands: `reset_after + cost * T` takes the
                    // request, beyond `tau` by the wait.
                    retry_after: (reset_after + cost * params.t())
                        .checked_sub(params.tau())
                        .filter(|&w| w > 0)
                        .ok_or_else(malformed)?,
                },
                2 => gcra::Admission::Never,
                _ => return Err(malformed()),
            };
            let written =
                (verdict.is_allowed() && cost > 0 && !refused).then_some(now + reset_after);
            Ok(Answer {
                verdict,
                reset_after,
                written,
                previous: r[2] as u64,
                now,
                window: None,
                undo: cost,
            })
        })
        .collect()
}

/// A window limit's outcome from `gcra.lua`'s three state integers (see the script):
/// derived with [`window`]'s functions, as the memory store derives it.
pub(super) fn window_outcome(p: &Part, verdict: gcra::Admission, r: &[i64]) -> Outcome {
    let (a, b, c) = (r[0] as u64, r[1] as u64, r[2] as u64);
    let g = window::Geometry::new(p.quota.rate(), p.quota.period_ns() / 1_000, 0);
    let report = match p.algorithm {
        // (a calendar window never holds more than its limit: its length is not needed)
        alg if alg.is_fixed() => window::fixed_report(g, a, b),
        Algorithm::SlidingWindow if verdict.is_allowed() => {
            return Outcome::sliding_allowed(g, a.min(0xffff), b.min(0xffff), c);
        }
        Algorithm::SlidingWindow => window::sliding_report(g, a, b, c),
        _ => return Outcome::window(window_report(r, verdict), 1_000),
    };
    Outcome::window(window::Report { verdict, ..report }, 1_000)
}

/// A window limit's `remaining, reset_after, next_after (0: none)` from a script.
pub(super) fn window_report(r: &[i64], verdict: gcra::Admission) -> window::Report {
    window::Report {
        verdict,
        remaining: r[0] as u64,
        reset_after: r[1] as u64,
        next_after: (r[2] > 0).then_some(r[2] as u64),
        wait: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_validated() {
        // T = 100 ms, burst 10, cost 2; and a shadow limit of cost 1.
        let part = |cost, mode| Part {
            redis_key: b"t:".to_vec(),
            quota: Quota::per_second(10),
            cost,
            mode,
            algorithm: Algorithm::Gcra,
            phase_us: 0,
            max_wait_us: 0,
            span: None,
            held: None,
            settle: None,
            ban: None,
        };
        let parts = [part(2, Mode::Enforce), part(1, Mode::Shadow)];
        let now = 1_700_000_000_000_000i64;
        for bad in [
            &[][..],
            &[now, 0, 200_000][..],
            &[now, 0, 200_000, 0, 0, 100_000][..],
            &[now, 0, -1, 0, 0, 100_000, 0][..],
            &[now, 3, 200_000, 0, 0, 100_000, 0][..],
            // a denial whose wait would be zero
            &[now, 1, 800_000, 0, 0, 100_000, 0][..],
        ] {
            assert!(parse_reply(bad, &parts, &[0, 1]).is_err(), "{bad:?}");
        }
        // Both pass: both consumed, written at now + reset_after.
        let a = parse_reply(&[now, 0, 200_000, 0, 0, 100_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(a[0].verdict, gcra::Admission::Allowed);
        assert_eq!(a[0].written, Some(now as u64 + 200_000));
        assert_eq!(a[1].written, Some(now as u64 + 100_000));
        // The enforcing limit refuses (900 ms to full, cost 2 needs 1.1 s): nothing written,
        // and the wait is what the request lacks.
        let d = parse_reply(&[now, 1, 900_000, 5, 0, 100_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(
            d[0].verdict,
            gcra::Admission::Denied {
                retry_after: 100_000
            }
        );
        assert_eq!(d[0].previous, 5);
        assert_eq!((d[0].written, d[1].written), (None, None));
        // A shadow limit's refusal does not stop the others.
        let s = parse_reply(&[now, 0, 200_000, 0, 1, 1_000_000, 0], &parts, &[0, 1]).unwrap();
        assert_eq!(s[0].written, Some(now as u64 + 200_000));
    }
}
