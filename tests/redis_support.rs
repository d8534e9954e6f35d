//! Self-test of the throwaway Redis servers in `support::redis`: they are real, independent,
//! can crash and come back, form a working cluster, and leave nothing behind.
#![cfg(feature = "redis")]

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::thread;

use redis::AsyncCommands;
use support::redis::RedisServer;

/// Pids of processes whose command line mentions `redis-server` listening on `port`, or that
/// mention `dir` (the watchdog gets the directory as an argument). Reads /proc like
/// `pgrep -f` would.
fn processes_for(port: u16, dir: &std::path::Path) -> Vec<(u32, String)> {
    let port_suffix = format!(":{port}");
    let port_arg = format!("--port {port} ");
    let dir = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        // redis-server rewrites its title to e.g. "redis-server 127.0.0.1:6379 [cluster]".
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        let redis_on_port = cmdline.contains("redis-server")
            && (cmdline.contains(&port_arg)
                || cmdline
                    .split_whitespace()
                    .any(|word| word.ends_with(&port_suffix)));
        if redis_on_port || cmdline.contains(&dir) {
            found.push((pid, cmdline.trim().to_owned()));
        }
    }
    found
}

/// Everything needed to check that a server left nothing behind once dropped.
struct Trace {
    port: u16,
    dir: PathBuf,
}

impl Trace {
    fn of(server: &RedisServer) -> Trace {
        Trace {
            port: server.port(),
            dir: server.dir().to_owned(),
        }
    }

    fn assert_gone(&self) {
        let left = processes_for(self.port, &self.dir);
        assert!(
            left.is_empty(),
            "processes left for port {}: {left:?}",
            self.port
        );
        assert!(!self.dir.exists(), "{} not removed", self.dir.display());
    }
}

fn start_in_parallel(n: usize) -> Vec<RedisServer> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(RedisServer::start)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[tokio::test]
async fn servers_started_in_parallel_are_independent() {
    let servers = start_in_parallel(2);
    let (a, b) = (&servers[0], &servers[1]);
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    assert_eq!(a.url(), format!("redis://127.0.0.1:{}/", a.port()));

    let mut con_a = a.connection().await;
    let mut con_b = b.connection().await;
    let () = con_a.set("tollgate:k", "on a").await.unwrap();
    let on_b: Option<String> = con_b.get("tollgate:k").await.unwrap();
    assert_eq!(on_b, None);
    let on_a: Option<String> = con_a.get("tollgate:k").await.unwrap();
    assert_eq!(on_a.as_deref(), Some("on a"));

    // Files go to the server's own temp dir, never the repository.
    let dir: (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query_async(&mut con_a)
        .await
        .unwrap();
    assert_eq!(
        fs::canonicalize(&dir.1).unwrap(),
        fs::canonicalize(a.dir()).unwrap()
    );
    let save: (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query_async(&mut con_a)
        .await
        .unwrap();
    assert_eq!(save.1, "");

    // The sync client works too.
    let mut sync = b.client().get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut sync).unwrap();
    assert_eq!(pong, "PONG");

    drop((con_a, con_b, sync));
    let traces: Vec<Trace> = servers.iter().map(Trace::of).collect();
    for trace in &traces {
        assert!(
            !processes_for(trace.port, &trace.dir).is_empty(),
            "the /proc scan must see the live server on {}",
            trace.port
        );
    }
    drop(servers);
    for trace in &traces {
        trace.assert_gone();
    }
}

#[tokio::test]
async fn many_servers_get_distinct_ports() {
    let servers = start_in_parallel(6);
    let ports: BTreeSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        let mut con = server.connection().await;
        let () = con.set("who", server.port()).await.unwrap();
    }
    for server in &servers {
        let mut con = server.connection().await;
        let who: u16 = con.get("who").await.unwrap();
        assert_eq!(who, server.port());
    }
    let traces: Vec<Trace> = servers.iter().map(Trace::of).collect();
    drop(servers);
    for trace in &traces {
        trace.assert_gone();
    }
}

#[tokio::test]
async fn killed_server_restarts_empty_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    let url = server.url();
    let first_pid = server.pid().unwrap();

    let mut con = server.connection().await;
    let () = con.set("tollgate:k", 1).await.unwrap();

    server.kill();
    server.kill(); // idempotent
    assert_eq!(server.pid(), None);
    assert!(
        processes_for(port, server.dir())
            .iter()
            .all(|(pid, _)| *pid != first_pid),
        "killed server still running"
    );
    // The old connection sees the crash, and nothing answers on the port.
    let err = redis::cmd("PING").query_async::<String>(&mut con).await;
    assert!(err.is_err(), "PING after kill answered {err:?}");
    assert!(server.client().get_connection().is_err());

    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.url(), url);
    assert_ne!(server.pid(), Some(first_pid));
    let mut con = server.connection().await;
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert_eq!(size, 0, "a restarted server comes back empty");

    // restart() on a running server kills it first.
    server.restart();
    let mut con = server.connection().await;
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");

    let trace = Trace::of(&server);
    drop(server);
    trace.assert_gone();
}

/// Set in the environment of the child test process of
/// `server_dies_with_a_test_process_that_skips_destructors`.
const ORPHAN_CHILD: &str = "TOLLGATE_REDIS_SUPPORT_ORPHAN_CHILD";

/// In the child process only: start a server, report it, and exit without dropping it.
#[test]
fn orphan_child() {
    if std::env::var_os(ORPHAN_CHILD).is_none() {
        return;
    }
    let server = RedisServer::start();
    println!(
        "ORPHAN port={} dir={}",
        server.port(),
        server.dir().display()
    );
    std::process::exit(0);
}

#[test]
fn server_dies_with_a_test_process_that_skips_destructors() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "orphan_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ORPHAN_CHILD, "1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| Some(l.split_once("ORPHAN ")?.1))
        .unwrap_or_else(|| {
            panic!(
                "child printed no server: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let (port, dir) = line.split_once(' ').unwrap();
    let trace = Trace {
        port: port.strip_prefix("port=").unwrap().parse().unwrap(),
        dir: PathBuf::from(dir.strip_prefix("dir=").unwrap()),
    };
    // The watchdog notices the closed pipe and kills the server; give it a moment (a
    // deadline generous enough for a loaded machine: it only costs time on failure).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (!processes_for(trace.port, &trace.dir).is_empty() || trace.dir.exists())
        && std::time::Instant::now() < deadline
    {
        thread::sleep(std::time::Duration::from_millis(20));
    }
    trace.assert_gone();
}

#[cfg(feature = "redis-cluster")]
#[tokio::test]
async fn cluster_serves_keys_from_every_master() {
    use support::redis::RedisCluster;

    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);

    let mut con = cluster.connection().await;
    let keys: Vec<String> = (0..100).map(|i| format!("tollgate:key:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let () = con.set(key, i).await.unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        let value: usize = con.get(key).await.unwrap();
        assert_eq!(value, i);
    }

    // node_for_key spreads the keys over every master, and the keys are really there.
    let mut per_node = [0u64; 3];
    for key in &keys {
        per_node[cluster.node_for_key(key.as_bytes())] += 1;
    }
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    for (i, node) in cluster.nodes().iter().enumerate() {
        let mut direct = node.connection().await;
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut direct).await.unwrap();
        assert_eq!(size, per_node[i], "node {i} ({})", urls[i]);
    }
    // Hash tags keep related keys on one node.
    assert_eq!(
        cluster.node_for_key(b"{user:1}:a"),
        cluster.node_for_key(b"{user:1}:b")
    );

    let traces: Vec<Trace> = cluster.nodes().iter().map(Trace::of).collect();
    drop(con);
    drop(cluster);
    for trace in &traces {
        trace.assert_gone();
    }
}
