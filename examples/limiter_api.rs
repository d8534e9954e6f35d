//! The [`Limiter`] handle from code, without HTTP: every operation on one bucket, and an
//! all-or-nothing check of two limits, with what each left behind.
//!
//! ```text
//! cargo run -p tollgate --example limiter_api
//! ```
//!
//! The limit `per-user` is a bucket of 3 tokens that gets one back every 10 seconds
//! (`Quota::per_minute(6).burst(3)`), so nothing refills while the program runs (it takes
//! a few milliseconds: waits print a hair under their round values). Each line shows the
//! operation, whether it was allowed, the whole tokens left, the wait a refused request
//! is told (`retry`), and the time until the next token (`next`).
//!
//! - `peek` looks without taking (and creates no key);
//! - `check` takes `cost` tokens if they are all there, and takes nothing when it refuses;
//! - `refund` gives tokens back (never beyond a full bucket);
//! - `penalize` takes tokens whatever is left: the bucket goes into debt;
//! - `block` refuses the key for a while, whatever its tokens;
//! - `reset` makes it a full bucket again (and lifts a block);
//! - `check_all` checks several limits at once: if one refuses, none is charged.
//!
//! `peek`, `refund`, `penalize`, `block` and `reset` answer the bucket's state as a
//! request of cost 0 sees it: an empty bucket still passes a peek (`left` 0, allowed),
//! only a bucket in debt refuses it, and the `retry` of such a reply is the time until
//! the debt is paid — one token (10 s) less than the wait of a request of cost 1, which
//! the `check` after it shows. To ask "would one more request pass?", look at `left`.

use std::time::Duration;

use tollgate::store::MemoryStore;
use tollgate::{LimitDecision, LimitSpec, Limiter, LimiterError, Quota};

/// A bucket of 3, one token back every 10 s.
const USER: &str = "per-user";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::builder(MemoryStore::new())
        .limit(LimitSpec::new(USER, Quota::per_minute(6).burst(3)))
        .limit(LimitSpec::new("per-tenant", Quota::per_minute(2)))
        .build()?;
    println!("limits: {:?}\n", limiter.limits());

    header();
    let (l, u) = (&limiter, "alice");
    row("peek (no key yet)", l.peek(USER, u).await?);
    for _ in 0..3 {
        row("check cost 1", l.check(USER, u, 1).await?);
    }
    row("check cost 1 (empty)", l.check(USER, u, 1).await?);
    row("peek (empty: still passes)", l.peek(USER, u).await?);
    row("refund 1", l.refund(USER, u, 1).await?);
    row("check cost 1", l.check(USER, u, 1).await?);
    row("refund 5 (capped at full)", l.refund(USER, u, 5).await?);
    row("check cost 4 (> burst: never)", l.check(USER, u, 4).await?);
    row("penalize 5 (2 in debt)", l.penalize(USER, u, 5).await?);
    row("peek (in debt)", l.peek(USER, u).await?);
    row("check cost 1", l.check(USER, u, 1).await?);
    row("reset", l.reset(USER, u).await?);
    row("peek", l.peek(USER, u).await?);
    row(
        "block 60 s",
        l.block(USER, u, Duration::from_secs(60)).await?,
    );
    row("check cost 1 (blocked)", l.check(USER, u, 1).await?);
    row("reset (unblocks)", l.reset(USER, u).await?);
    row("check cost 1", l.check(USER, u, 1).await?);
    row("peek bob (untouched)", l.peek(USER, "bob").await?);

    // Several limits at once: all or nothing. The tenant has 2 tokens, carol has 3.
    println!("\ncheck_all [(per-user, carol, 1), (per-tenant, acme, 1)]:");
    header();
    let calls = [(USER, "carol", 1), ("per-tenant", "acme", 1)];
    for round in 1..=3 {
        let decision = limiter.check_all(calls).await?;
        let verdict = if decision.allowed() {
            "allowed"
        } else {
            "refused"
        };
        for l in decision.limits() {
            row(&format!("#{round} {verdict}: {}", l.name()), l.clone());
        }
    }
    // The third call was refused by the tenant: it took nothing from carol.
    row("peek carol", l.peek(USER, "carol").await?);

    // A name that is not configured is an error, not a panic.
    match l.check("no-such-limit", u, 1).await {
        Err(e @ LimiterError::UnknownLimit { .. }) => println!("\ncheck: {e}"),
        other => println!("\nunexpected: {other:?}"),
    }
    Ok(())
}

fn header() {
    println!(
        "{:<34} {:<8} {:>4} {:>10} {:>10}",
        "operation", "allowed", "left", "retry", "next"
    );
    println!("{}", "-".repeat(70));
}

fn row(op: &str, d: LimitDecision) {
    let secs =
        |w: Option<Duration>| w.map_or("-".to_owned(), |w| format!("{:.2} s", w.as_secs_f64()));
    let outcome = d.outcome();
    println!(
        "{:<34} {:<8} {:>4} {:>10} {:>10}",
        op,
        if d.allowed() { "yes" } else { "no" },
        d.remaining().map_or("-".to_owned(), |r| r.to_string()),
        secs(d.retry_after()),
        secs(outcome.and_then(|o| o.next_after())),
    );
}
