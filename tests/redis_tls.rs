//! The Redis store over TLS (`rediss://`, feature `redis-tls`) against real `redis-server`
//! processes serving TLS with a CA and certificates made for each test: one node, mutual
//! TLS, the black-box checks of the plain store (two instances share a limit, `kill -9`
//! follows the failure policy, a restart recovers), and what is refused.
#![cfg(feature = "redis-tls")]

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use support::redis::RedisServer;
use support::tls::{Pki, start_tls};
use support::{count, get as req, send, statuses};
use tollgate::key::PeerIp;
use tollgate::store::{RedisStore, RedisTls};
use tollgate::{FailurePolicy, Limit, Quota, RateLimitLayer};

/// A router limited to `quota` per peer over `store`, failing closed: a request that does
/// not reach Redis is a 503, so every 200 and 429 below was decided by Redis.
fn app(store: RedisStore, quota: Quota) -> Router {
    let layer = RateLimitLayer::builder(store)
        .limit(
            Limit::new("per-ip", quota)
                .key(PeerIp::new())
                .on_store_failure(FailurePolicy::Deny),
        )
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

fn tls_url(port: u16) -> String {
    format!("rediss://127.0.0.1:{port}/")
}

/// A store over TLS with a timeout generous enough for a loaded machine.
fn store(url: &str, tls: &RedisTls) -> RedisStore {
    RedisStore::open_tls(url, 1, tls)
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// Sends requests from `peer` until one is not a 503 (the first connection, a TLS
/// handshake, may outlast a call), at most 10 s; the status of that one.
async fn first_answer(app: &Router, peer: &str) -> StatusCode {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = send(app, req("/", peer)).await.status();
        if status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn two_instances_share_a_limit_over_tls_and_survive_a_kill() {
    let pki = Pki::new();
    let (mut server, port) = start_tls(&pki, false, &[]);
    let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
    let a_store = store(&tls_url(port), &tls).breaker(2, Duration::from_millis(200));
    let a = app(a_store.clone(), Quota::per_minute(4));
    let b = app(store(&tls_url(port), &tls), Quota::per_minute(4));

    assert_eq!(first_answer(&a, "192.0.2.1").await, StatusCode::OK);
    assert_eq!(first_answer(&b, "192.0.2.1").await, StatusCode::OK);
    let mut seen = Vec::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { &a } else { &b };
        seen.push(send(app, req("/", "192.0.2.1")).await.status());
    }
    // 4 a minute between both instances: 2 more, then refusals.
    assert_eq!(count(&seen, StatusCode::OK), 2, "{seen:?}");
    assert_eq!(count(&seen, StatusCode::TOO_MANY_REQUESTS), 4, "{seen:?}");

    // The keys are in the server behind the TLS port.
    let mut plain = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tollgate:per-ip:*")
        .query_async(&mut plain)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");

    // `kill -9`: the limit fails closed, as configured.
    server.kill();
    let down = statuses(&a, 3, || req("/", "192.0.2.2")).await;
    assert_eq!(count(&down, StatusCode::SERVICE_UNAVAILABLE), 3, "{down:?}");

    // It comes back (empty): the store reconnects over TLS by itself.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while send(&a, req("/", "192.0.2.3")).await.status() != StatusCode::OK {
        assert!(Instant::now() < deadline, "never recovered over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!a_store.is_unavailable());
    let after = statuses(&a, 5, || req("/", "192.0.2.4")).await;
    assert_eq!(count(&after, StatusCode::OK), 4, "{after:?}");
}

#[tokio::test]
async fn mutual_tls_presents_the_client_certificate_and_fails_closed_without_it() {
    let pki = Pki::new();
    let (server, port) = start_tls(&pki, true, &[]);
    let url = tls_url(port);

    // From files, as a deployment has them.
    let with_cert = RedisTls::new()
        .ca_file(pki.file("ca.pem"))
        .unwrap()
        .client_files(pki.file("client.pem"), pki.file("client.key"))
        .unwrap();
    let a = app(store(&url, &with_cert), Quota::per_minute(2));
    let b = app(store(&url, &with_cert), Quota::per_minute(2));
    assert_eq!(first_answer(&a, "192.0.2.1").await, StatusCode::OK);
    assert_eq!(
        send(&b, req("/", "192.0.2.1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&a, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // The server asks for a certificate: without one the handshake fails, every call
    // fails, and the limit follows its policy (here: closed).
    let without = app(
        store(&url, &RedisTls::new().ca_pem(&pki.ca).unwrap()),
        Quota::per_minute(100),
    );
    let refused = statuses(&without, 3, || req("/", "192.0.2.5")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        3,
        "{refused:?}"
    );

    // A client certificate of another CA is refused the same way.
    let other = Pki::new();
    let foreign = RedisTls::new()
        .ca_pem(&pki.ca)
        .unwrap()
        .client_pem(&other.client_cert, &other.client_key)
        .unwrap();
    let foreign = app(store(&url, &foreign), Quota::per_minute(100));
    let refused = statuses(&foreign, 3, || req("/", "192.0.2.6")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        3,
        "{refused:?}"
    );
    drop(server);
}

#[tokio::test]
async fn an_acl_user_logs_in_over_tls_and_a_wrong_password_fails_closed() {
    let pki = Pki::new();
    let (server, port) = start_tls(&pki, false, &[]);
    let mut admin = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">app-password", "~*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
    let url = |password: &str| format!("rediss://app:{password}@127.0.0.1:{port}/");
    let a = app(store(&url("app-password"), &tls), Quota::per_minute(1));
    assert_eq!(first_answer(&a, "192.0.2.1").await, StatusCode::OK);
    assert_eq!(
        send(&a, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let wrong = app(store(&url("not-it"), &tls), Quota::per_minute(100));
    let refused = statuses(&wrong, 2, || req("/", "192.0.2.2")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        2,
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_server_that_speaks_only_tls_1_2_is_reached() {
    let pki = Pki::new();
    let (_server, port) = start_tls(&pki, false, &["--tls-protocols", "TLSv1.2"]);
    let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
    let a = app(store(&tls_url(port), &tls), Quota::per_minute(1));
    assert_eq!(first_answer(&a, "192.0.2.1").await, StatusCode::OK);
    assert_eq!(
        send(&a, req("/", "192.0.2.1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_server_certificate_is_verified() {
    let pki = Pki::new();
    let (_server, port) = start_tls(&pki, false, &[]);
    let url = tls_url(port);

    // `open` trusts the platform's roots, which do not hold the test CA.
    let platform = app(
        RedisStore::open(&url)
            .unwrap()
            .timeout(Duration::from_secs(2)),
        Quota::per_minute(100),
    );
    let refused = statuses(&platform, 2, || req("/", "192.0.2.1")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        2,
        "{refused:?}"
    );

    // Another CA's certificate is refused too.
    let other = Pki::new();
    let wrong = app(
        store(&url, &RedisTls::new().ca_pem(&other.ca).unwrap()),
        Quota::per_minute(100),
    );
    let refused = statuses(&wrong, 2, || req("/", "192.0.2.2")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        2,
        "{refused:?}"
    );

    // The right CA, and the URL's host is in the certificate (`localhost` as a DNS name).
    let right = app(
        store(
            &format!("rediss://localhost:{port}/"),
            &RedisTls::new().ca_pem(&pki.ca).unwrap(),
        ),
        Quota::per_minute(100),
    );
    assert_eq!(first_answer(&right, "192.0.2.3").await, StatusCode::OK);
}

#[tokio::test]
async fn certificates_are_for_rediss_urls_and_a_plain_port_does_not_speak_tls() {
    let pki = Pki::new();
    let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
    let err = RedisStore::open_tls("redis://u:secret@127.0.0.1:6379/", 1, &tls).unwrap_err();
    assert_eq!(err.field(), "redis_url");
    assert!(err.reason().contains("rediss://"), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");

    // TLS against the plain port: no handshake, every call fails into the policy.
    let server = RedisServer::start();
    let app = app(store(&tls_url(server.port()), &tls), Quota::per_minute(100));
    let refused = statuses(&app, 2, || req("/", "192.0.2.1")).await;
    assert_eq!(
        count(&refused, StatusCode::SERVICE_UNAVAILABLE),
        2,
        "{refused:?}"
    );
}

/// Redis Sentinel over TLS: a master and its replica serving TLS, replicating over TLS,
/// and three sentinels that speak TLS to them and to the store.
#[cfg(feature = "redis-sentinel")]
mod sentinel {
    use super::*;
    use support::redis::reserve_port;
    use tollgate::store::SentinelOptions;

    /// What the sentinel on `sentinel`'s plain port names as the master's port.
    async fn named_port(sentinel: &RedisServer) -> Option<u16> {
        let mut c = sentinel.connection().await;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query_async(&mut c)
            .await
            .ok()?;
        addr.and_then(|(_, port)| port.parse().ok())
    }

    async fn eventually<F: Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f().await {
            assert!(Instant::now() < deadline, "{what}: not within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn with_replication(mut args: Vec<String>) -> Vec<String> {
        args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
        args
    }

    #[tokio::test]
    async fn a_store_through_sentinels_over_tls_shares_and_follows_a_failover() {
        let pki = Pki::new();
        let (mut master, master_tls) = start_tls(&pki, false, &["--tls-replication", "yes"]);
        let replica_tls = reserve_port();
        let replica = RedisServer::start_replica_with(
            master_tls,
            with_replication(pki.server_args(replica_tls, false)),
            Some(replica_tls),
        );
        let sentinels: Vec<(RedisServer, u16)> = (0..3)
            .map(|_| {
                let port = reserve_port();
                let server = RedisServer::start_sentinel_with(
                    master_tls,
                    with_replication(pki.server_args(port, false)),
                    Some(port),
                );
                (server, port)
            })
            .collect();
        eventually("the replica syncs over TLS", || async {
            let mut c = replica.connection().await;
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            info.contains("master_link_status:up")
        })
        .await;
        eventually("the sentinels know the replica", || async {
            let mut c = sentinels[0].0.connection().await;
            let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg("mymaster")
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            !replicas.is_empty()
        })
        .await;

        let urls: Vec<String> = sentinels.iter().map(|(_, p)| tls_url(*p)).collect();
        let options =
            || SentinelOptions::new().certificates(RedisTls::new().ca_pem(&pki.ca).unwrap());
        let open = || {
            RedisStore::sentinel_with(&urls, "mymaster", options())
                .unwrap()
                .timeout(Duration::from_secs(2))
        };
        let (a, b) = (
            app(open(), Quota::per_minute(4)),
            app(open(), Quota::per_minute(4)),
        );
        assert_eq!(first_answer(&a, "192.0.2.1").await, StatusCode::OK);
        assert_eq!(first_answer(&b, "192.0.2.1").await, StatusCode::OK);
        let mut seen = Vec::new();
        for i in 0..4 {
            let app = if i % 2 == 0 { &a } else { &b };
            seen.push(send(app, req("/", "192.0.2.1")).await.status());
        }
        assert_eq!(count(&seen, StatusCode::OK), 2, "{seen:?}");

        // Replication is asynchronous: the first key is on the replica before the master
        // goes (a write the replica never got is lost with it, whatever the store does).
        eventually("the replica has the first key", || async {
            let mut c = replica.connection().await;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("tollgate:per-ip:*")
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            !keys.is_empty()
        })
        .await;
        // `kill -9` of the master: the sentinels promote the replica (at its TLS port),
        // and the store decides through it.
        master.kill();
        eventually("the sentinels promote the replica", || async {
            named_port(&sentinels[0].0).await == Some(replica_tls)
        })
        .await;
        eventually("the store decides through the new master", || async {
            send(&a, req("/", "192.0.2.2")).await.status() == StatusCode::OK
        })
        .await;
        let mut c = replica.connection().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate:per-ip:*")
            .query_async(&mut c)
            .await
            .unwrap();
        assert!(keys.len() >= 2, "{keys:?}");
    }
}

/// A 3-node Redis Cluster serving TLS (`--tls-cluster yes`: its bus too, and `CLUSTER
/// SLOTS` names the TLS ports to a TLS client).
#[cfg(feature = "redis-cluster")]
mod cluster {
    use super::*;
    use support::redis::{RedisCluster, reserve_port};
    use tollgate::{LimitSpec, Limiter};

    async fn store(urls: &[String], tls: &RedisTls) -> RedisStore {
        let client = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .certs(tls.certificates())
            .build()
            .unwrap();
        RedisStore::cluster(client.get_async_connection().await.unwrap())
            .timeout(Duration::from_secs(2))
    }

    #[tokio::test]
    async fn two_instances_share_limits_on_a_cluster_over_tls_and_notice_a_node_losing_its_data() {
        let pki = Pki::new();
        let cluster = RedisCluster::start_with(3, || {
            let port = reserve_port();
            let mut args = pki.server_args(port, false);
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            (args, Some(port))
        });
        // Each node's TLS port, as it says.
        let urls: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| {
                let mut c = n.sync_connection().unwrap();
                let port: (String, String) = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("tls-port")
                    .query(&mut c)
                    .unwrap();
                tls_url(port.1.parse().unwrap())
            })
            .collect();
        let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
        let spec =
            LimitSpec::new("login", Quota::per_minute(3)).on_store_failure(FailurePolicy::Deny);
        let a = Limiter::builder(store(&urls, &tls).await)
            .limit(spec.clone())
            .build()
            .unwrap();
        let b = Limiter::builder(store(&urls, &tls).await.deny_cache(false))
            .limit(spec)
            .build()
            .unwrap();

        // Keys in every slot range: 3 a minute each, between both instances.
        let users: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
        for user in &users {
            let mut allowed = 0;
            for i in 0..5 {
                let l = if i % 2 == 0 { &a } else { &b };
                let d = l.check("login", user.as_str(), 1).await.unwrap();
                assert!(
                    matches!(d.status(), tollgate::Status::Checked(_)),
                    "{user}: {d:?}"
                );
                allowed += usize::from(d.allowed());
            }
            assert_eq!(allowed, 3, "{user}");
        }
        let mut per_node = Vec::new();
        for node in cluster.nodes() {
            let mut c = node.connection().await;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("tollgate:login:*")
                .query_async(&mut c)
                .await
                .unwrap();
            per_node.push(keys.len());
        }
        assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");

        // One node loses its data: the per-master marker (read through CLUSTER SLOTS over
        // TLS) notices, and the keys the instances saw spent are written back.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        a.check("login", "probe", 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let node = &cluster.nodes()[1];
        let mut c = node.connection().await;
        let lost: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate:login:*")
            .query_async(&mut c)
            .await
            .unwrap();
        let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
        let user = lost
            .iter()
            .find_map(|k| k.strip_prefix("tollgate:login:"))
            .filter(|u| u.starts_with("user-"))
            .expect("a user on the flushed node")
            .to_owned();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            a.check("login", "probe", 1).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            if b.peek("login", user.as_str()).await.unwrap().remaining() == Some(0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the node's loss was never noticed"
            );
        }
    }

    #[tokio::test]
    async fn a_cluster_node_killed_fails_its_keys_closed_and_its_restart_recovers_over_tls() {
        let pki = Pki::new();
        let mut cluster = RedisCluster::start_with(3, || {
            let port = reserve_port();
            let mut args = pki.server_args(port, false);
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            (args, Some(port))
        });
        let urls: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| {
                let mut c = n.sync_connection().unwrap();
                let port: (String, String) = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("tls-port")
                    .query(&mut c)
                    .unwrap();
                tls_url(port.1.parse().unwrap())
            })
            .collect();
        let tls = RedisTls::new().ca_pem(&pki.ca).unwrap();
        let spec =
            LimitSpec::new("login", Quota::per_minute(1_000)).on_store_failure(FailurePolicy::Deny);
        let a = Limiter::builder(
            store(&urls, &tls)
                .await
                .breaker(2, Duration::from_millis(200)),
        )
        .limit(spec)
        .build()
        .unwrap();
        let user = "user-killed";
        let victim = cluster.node_for_key(format!("tollgate:login:{user}").as_bytes());
        let d = a.check("login", user, 1).await.unwrap();
        assert!(matches!(d.status(), tollgate::Status::Checked(_)), "{d:?}");

        // `kill -9` of the node that holds the key: its checks fail closed.
        cluster.kill_node(victim);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let d = a.check("login", user, 1).await.unwrap();
            if !d.allowed() && matches!(d.status(), tollgate::Status::FailedClosed) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a dead node's key still decided: {d:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Restarted (empty, with its cluster configuration): the key is decided by Redis
        // again, over TLS.
        cluster.restart_node(victim);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let d = a.check("login", user, 1).await.unwrap();
            if d.allowed() && matches!(d.status(), tollgate::Status::Checked(_)) {
                break;
            }
            assert!(Instant::now() < deadline, "never recovered: {d:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
