//! Coalesced Redis decisions (`src/store/redis/coalesce.rs`): requests of the same plain
//! GCRA limits in one batch are decided by one group step of `gcra.lua`. Against a real
//! `redis-server`, the same arrival sequences decided through a batching store (requests
//! queued behind the calls in flight, so they share calls and coalesce) and through a
//! store that sends each request alone, in the same order, at the same instant: the same
//! answers, request by request, and the same state left in every bucket.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::redis::RedisServer;
use tollgate::clock::FakeClock;
use tollgate::key::Key;
use tollgate::store::{Checked, Item, RedisStore, Statuses, Store};
use tollgate::{Algorithm, Mode, Quota, Status};

/// One limit of a request: its table (0, 1: GCRA; 2: a fixed window; 3: GCRA whose
/// requests are reservations), key (0 is the hot one), cost and mode.
#[derive(Debug, Clone, Copy)]
struct Lim {
    table: usize,
    key: u32,
    cost: u32,
    shadow: bool,
}

const TABLES: [&str; 4] = ["a", "b", "w", "r"];

fn quota(table: usize) -> Quota {
    match table {
        0 => Quota::per_second(10).burst(6),
        1 => Quota::per_second(4).burst(3),
        2 => Quota::per_minute(5),
        _ => Quota::per_second(2).burst(2),
    }
}

async fn check<S: Store>(store: &S, items: &[Item<'_, S::Table>]) -> Statuses {
    match store.check(items) {
        Checked::Ready(s) => s,
        Checked::Pending(f) => f.await,
    }
}

fn store(
    conn: redis::aio::ConnectionManager,
    at: Duration,
    batch: usize,
    prefix: &str,
) -> RedisStore {
    RedisStore::new(conn)
        .caller_time(FakeClock::at(at))
        .timeout(Duration::from_secs(5))
        .deny_cache(false)
        .batch(batch)
        .prefix(prefix)
}

fn items<'a>(
    tables: &'a [<RedisStore as Store>::Table],
    request: &[Lim],
) -> Vec<Item<'a, <RedisStore as Store>::Table>> {
    request
        .iter()
        .map(|l| {
            let item = Item::new(
                &tables[l.table],
                Key::from_part(l.key),
                quota(l.table),
                l.cost,
            )
            .mode(if l.shadow {
                Mode::Shadow
            } else {
                Mode::Enforce
            });
            match l.table {
                2 => item.algorithm(Algorithm::fixed_window()),
                3 => item.max_wait(Duration::from_millis(700)),
                _ => item,
            }
        })
        .collect()
}

/// Decides `requests` through `store`: all at once (tasks spawned in order on a
/// current-thread runtime enter the batch queue in that order) or one after the other;
/// then what a peek of every bucket answers.
async fn run(
    store: RedisStore,
    requests: &[Vec<Lim>],
    together: bool,
) -> (Vec<String>, Vec<String>) {
    let tables: Arc<Vec<_>> = Arc::new(TABLES.iter().map(|t| store.table(t)).collect());
    let mut answers = Vec::new();
    if together {
        let tasks: Vec<_> = requests
            .iter()
            .map(|r| {
                let (store, tables, r) = (store.clone(), tables.clone(), r.clone());
                tokio::spawn(async move { check(&store, &items(&tables, &r)).await })
            })
            .collect();
        for t in tasks {
            answers.push(format!("{:?}", t.await.unwrap()));
        }
    } else {
        for r in requests {
            answers.push(format!("{:?}", check(&store, &items(&tables, r)).await));
        }
    }
    let mut peeks = Vec::new();
    for table in 0..TABLES.len() {
        for key in 0..3 {
            let peek = Lim {
                table,
                key,
                cost: 0,
                shadow: false,
            };
            peeks.push(format!(
                "{:?}",
                check(&store, &items(&tables, &[peek])).await
            ));
        }
    }
    (answers, peeks)
}

fn lim() -> impl Strategy<Value = Lim> {
    (
        prop_oneof![6 => Just(0usize), 3 => Just(1usize), 1 => Just(2usize), 1 => Just(3usize)],
        prop_oneof![5 => Just(0u32), 1 => 1..3u32],
        prop_oneof![6 => Just(1u32), 1 => Just(0u32), 1 => 2..8u32],
        prop::bool::weighted(0.15),
    )
        .prop_map(|(table, key, cost, shadow)| Lim {
            table,
            key,
            cost,
            shadow,
        })
}

/// A request: one to three limits of distinct tables.
fn request() -> impl Strategy<Value = Vec<Lim>> {
    prop::collection::vec(lim(), 1..=3).prop_map(|mut ls| {
        ls.sort_by_key(|l| l.table);
        ls.dedup_by_key(|l| l.table);
        ls
    })
}

#[test]
fn coalesced_decisions_are_those_of_one_call_per_request() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let conn = runtime
        .block_on(server.client().get_connection_manager())
        .unwrap();
    let at = Duration::from_secs(1_800_000_000);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0);
    let coalesced = std::cell::Cell::new(0);
    runner
        .run(&prop::collection::vec(request(), 1..80), |requests| {
            let n = case.get() + 1;
            case.set(n);
            let batched = store(conn.clone(), at, 128, &format!("c{n}:b:"));
            let alone = store(conn.clone(), at, 1, &format!("c{n}:a:"));
            let (b, a) = runtime.block_on(async {
                let b = run(batched, &requests, true).await;
                let a = run(alone, &requests, false).await;
                (b, a)
            });
            prop_assert_eq!(&b.0, &a.0, "answers");
            prop_assert_eq!(&b.1, &a.1, "buckets afterwards");
            coalesced.set(coalesced.get() + usize::from(requests.len() > 3));
            Ok(())
        })
        .unwrap();
    assert!(coalesced.get() > 0, "some cases batch several requests");
}

/// `INFO commandstats` calls of one command.
async fn calls(server: &RedisServer, command: &str) -> u64 {
    let mut c = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// 300 requests of one hot key (burst 200) at one instant, queued together: the first 200
/// in arrival order pass, the rest are refused, and Redis writes the key once per call,
/// not once per granted request.
#[test]
fn a_hot_key_is_written_once_per_call_and_grants_in_arrival_order() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    runtime.block_on(async {
        let conn = server.client().get_connection_manager().await.unwrap();
        let store = store(conn, Duration::from_secs(1_800_000_000), 128, "hot:");
        let table = Arc::new(store.table("hot"));
        let q = Quota::per_hour(200);
        check(&store, &[Item::new(&*table, Key::from_part("warm"), q, 0)]).await;
        let mut c = server.connection().await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut c)
            .await
            .unwrap();
        let tasks: Vec<_> = (0..300)
            .map(|_| {
                let (store, table) = (store.clone(), table.clone());
                tokio::spawn(async move {
                    let s = check(&store, &[Item::new(&*table, Key::global(), q, 1)]).await;
                    match s[0] {
                        Status::Checked(o) => o.is_allowed(),
                        ref other => panic!("{other:?}"),
                    }
                })
            })
            .collect();
        let mut allowed = Vec::new();
        for t in tasks {
            allowed.push(t.await.unwrap());
        }
        let first_refused = allowed.iter().position(|a| !a).unwrap();
        assert_eq!(first_refused, 200);
        assert!(allowed[200..].iter().all(|a| !a));
        let (sets, scripts) = (calls(&server, "set").await, calls(&server, "evalsha").await);
        assert!(scripts < 300, "requests shared calls: {scripts}");
        assert!(sets <= scripts, "{sets} SETs for {scripts} calls");
    });
}
