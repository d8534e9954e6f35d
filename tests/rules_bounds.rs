//! Rules whose size or churn comes from operators: memory that returns when the rules
//! do, a cap on the number of limits, and response fields that stay small however many
//! limits apply.
#![cfg(all(feature = "rules", feature = "axum"))]

mod support;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::{get as request, header, send, sf_names};
use tollgate::clock::FakeClock;
use tollgate::rules::Rules;
use tollgate::store::MemoryStore;
use tollgate::{Limit, Quota, RateLimitLayer};

fn limits(names: impl Iterator<Item = String>, quota: &str) -> String {
    names
        .map(|name| {
            format!("[[limits]]\nname = \"{name}\"\nkey = \"peer_ip\"\nquota = \"{quota}\"\n\n")
        })
        .collect()
}

#[tokio::test]
async fn reloads_of_new_limit_names_drop_the_removed_limits_tables_not_keep_every_one() {
    let store = MemoryStore::with_clock(FakeClock::new());
    let one = limits(std::iter::once("base".to_owned()), "10/s");
    let rules = Rules::builder(store.clone())
        .text(one.clone())
        .build()
        .unwrap();
    let limiter = rules.limiter();
    limiter.check("base", "client", 1).await.unwrap();
    assert_eq!((store.table_count(), store.len()), (1, 1));

    for round in 0..40 {
        let names = (0..500).map(|i| format!("r{round}-l{i}"));
        rules
            .reload(&limits(names.chain(["base".to_owned()]), "10/s"))
            .unwrap();
        // Keys in some of this round's limits.
        for i in 0..5 {
            limiter
                .check(&format!("r{round}-l{i}"), "client", 1)
                .await
                .unwrap();
        }
        // The previous round's tables went with the rules that used them.
        assert_eq!(store.table_count(), 501, "round {round}");
        assert_eq!(store.len(), 1 + 5, "round {round}");
    }

    rules.reload(&one).unwrap();
    assert_eq!(store.table_count(), 1);
    // Only `base`'s key is left, and it kept its bucket through every reload.
    assert_eq!(store.len(), 1);
    let d = limiter.check("base", "client", 1).await.unwrap();
    assert_eq!(d.remaining(), Some(8));
}

#[tokio::test]
async fn a_document_over_max_limits_is_refused_with_the_cap_not_compiled() {
    let text = limits((0..1_001).map(|i| format!("l{i}")), "10/s");
    let err = Rules::builder(MemoryStore::new())
        .text(text.clone())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "limits");
    assert!(
        err.to_string().contains("1001 limits, more than the 1000"),
        "{err}"
    );

    // Raised, it loads; a reload over the cap keeps the running rules.
    let rules = Rules::builder(MemoryStore::new())
        .max_limits(2_000)
        .text(text)
        .build()
        .unwrap();
    let rules_small = Rules::builder(MemoryStore::new())
        .max_limits(2)
        .text(limits((0..2).map(|i| format!("l{i}")), "10/s"))
        .build()
        .unwrap();
    let err = rules_small
        .reload(&limits((0..3).map(|i| format!("l{i}")), "10/s"))
        .unwrap_err();
    assert_eq!(err.field(), "limits");
    assert_eq!(rules_small.document().limits.len(), 2);
    assert_eq!(rules.document().limits.len(), 1_001);

    // The same cap on a layer built by code.
    let many = |n: usize| {
        (0..n).fold(RateLimitLayer::builder(MemoryStore::new()), |b, i| {
            b.limit(Limit::new(format!("l{i}"), Quota::per_second(10)))
        })
    };
    assert_eq!(many(1_001).build().unwrap_err().field(), "limits");
    assert!(many(1_001).max_limits(1_001).build().is_ok());
}

#[tokio::test]
async fn a_request_under_fifty_limits_gets_eight_members_not_a_field_per_limit() {
    // 50 limits on every request; `tight` (the 30th) refuses the second request.
    let mut builder = RateLimitLayer::builder(MemoryStore::new());
    for i in 0..50 {
        let quota = if i == 30 {
            Quota::per_minute(1)
        } else {
            Quota::per_second(100 + i)
        };
        let name = if i == 30 {
            "tight".to_owned()
        } else {
            format!("l{i}")
        };
        builder = builder.limit(Limit::new(name, quota));
    }
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(builder.build().unwrap());

    let first = send(&app, request("/", "10.0.0.1")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let fields = |r: &http::Response<axum::body::Body>| {
        let limit = sf_names(&header(r.headers(), "ratelimit").unwrap());
        let policy = sf_names(&header(r.headers(), "ratelimit-policy").unwrap());
        (limit, policy)
    };
    let (limit, policy) = fields(&first);
    assert_eq!(limit.len(), tollgate::headers::MAX_MEMBERS);
    assert_eq!(limit, policy, "the two fields describe the same limits");
    // The most restrictive first: `tight` has no token left.
    assert!(limit.contains(&"tight".to_owned()), "{limit:?}");

    let second = send(&app, request("/", "10.0.0.1")).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let (limit, policy) = fields(&second);
    assert_eq!(limit.len(), tollgate::headers::MAX_MEMBERS);
    assert_eq!(limit, policy);
    assert!(limit.contains(&"tight".to_owned()), "{limit:?}");
    // Members keep the configuration's order.
    let order: Vec<usize> = limit
        .iter()
        .map(|n| {
            if n == "tight" {
                30
            } else {
                n[1..].parse().unwrap()
            }
        })
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}
