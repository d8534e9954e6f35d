//! Throwaway Redis servers and clusters for the tests.
//!
//! Every [`RedisServer`] is a real `redis-server` process started by the test itself, on a
//! free loopback port, with its own temporary directory (no persistence: `--save ''`,
//! `--appendonly no`). Dropping the handle kills the process, waits for it and removes the
//! directory. A small `sh` watchdog per server kills it too if the test process dies without
//! running destructors (a handle kept in a `static`, an abort), so no `redis-server` outlives
//! the tests.
//!
//! Starting is blocking (it polls until the server answers); calling it from an async test
//! is fine.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{self, Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const REDIS_SERVER: &str = "redis-server";
const NOT_FOUND: &str = "redis-server not found: run scripts/test.sh, which installs it";
/// How long a server may take to answer `PING` after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports [`RedisServer::start`] tries before giving up.
const START_ATTEMPTS: usize = 5;
/// Cluster bus port = client port + this.
const BUS_OFFSET: u16 = 10_000;

/// Ports of live handles in this process (client and cluster bus ports), so that two
/// handles never pick the same port, even while one of them is killed and waits for a
/// restart.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Picks a free loopback port (and, for a cluster node, a free bus port `port + 10000`) and
/// reserves it in this process.
fn pick_port(cluster: bool) -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let mut reserved = reserved();
        if reserved.contains(&port) {
            continue;
        }
        if cluster {
            if port > u16::MAX - BUS_OFFSET {
                continue;
            }
            let bus = port + BUS_OFFSET;
            if reserved.contains(&bus) || TcpListener::bind(("127.0.0.1", bus)).is_err() {
                continue;
            }
            reserved.insert(bus);
        }
        reserved.insert(port);
        return port;
    }
    panic!("could not find a free loopback port");
}

fn release_port(port: u16, cluster: bool) {
    let mut reserved = reserved();
    reserved.remove(&port);
    if cluster {
        reserved.remove(&(port + BUS_OFFSET));
    }
}

/// A fresh, empty directory under the system temp dir.
fn make_dir(port: u16) -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tollgate-redis-{}-{n}-{port}", process::id()));
    // A leftover from an earlier run whose pid was the same.
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// The end of the server's log and whatever it printed itself, for failure messages.
fn log_tail(dir: &Path) -> String {
    fn tail(path: &Path, lines: usize) -> String {
        match fs::read(path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("<{e}>"),
        }
    }
    format!(
        "--- {0}/redis.log (tail) ---\n{1}\n--- {0}/output.txt ---\n{2}\n---",
        dir.display(),
        tail(&dir.join("redis.log"), 40),
        tail(&dir.join("output.txt"), 40),
    )
}

/// One PING plus `INFO server` over a plain TCP connection; returns the server's pid.
fn probe(port: u16) -> io::Result<u32> {
    let timeout = Duration::from_secs(2);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    (&stream).write_all(b"PING\r\nINFO server\r\n")?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line != "+PONG\r\n" {
        return Err(io::Error::other(format!("PING answered {line:?}")));
    }
    line.clear();
    reader.read_line(&mut line)?;
    let len: usize = line
        .strip_prefix('$')
        .and_then(|n| n.trim_end().parse().ok())
        .ok_or_else(|| io::Error::other(format!("INFO answered {line:?}")))?;
    let mut body = vec![0; len + 2];
    reader.read_exact(&mut body)?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| io::Error::other("INFO server without process_id"))
}

/// A running `redis-server` and the watchdog that kills it if this process dies.
#[derive(Debug)]
struct Running {
    redis: Child,
    watchdog: Option<Child>,
}

impl Running {
    fn kill(mut self) {
        // The watchdog first, so that it can never `kill -9` a recycled pid.
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = self.redis.kill();
        let _ = self.redis.wait();
    }
}

enum SpawnError {
    /// The binary is not installed.
    NotFound,
    /// The process exited before answering (usually: the port was taken meanwhile).
    Exited(ExitStatus),
    /// Anything else: it never answered, the watchdog failed, ...
    Other(String),
}

impl SpawnError {
    fn describe(&self) -> String {
        match self {
            SpawnError::NotFound => NOT_FOUND.to_owned(),
            SpawnError::Exited(status) => format!("redis-server exited early ({status})"),
            SpawnError::Other(msg) => msg.clone(),
        }
    }
}

/// What a spawned `redis-server` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A standalone server.
    Plain,
    /// A node of a cluster (a bus port beside the client port).
    Cluster,
    /// A replica of the server on this port.
    Replica(u16),
    /// A Sentinel watching the master on this port as `mymaster`.
    Sentinel(u16),
}

/// Spawns `redis-server` on `port` with its files in `dir` and the options `extra` after
/// the usual ones, and waits until it answers.
fn spawn(port: u16, dir: &Path, role: Role, extra: &[String]) -> Result<Running, SpawnError> {
    let output = File::options()
        .create(true)
        .append(true)
        .open(dir.join("output.txt"))
        .map_err(|e| SpawnError::Other(format!("create output.txt: {e}")))?;
    let output_err = output
        .try_clone()
        .map_err(|e| SpawnError::Other(e.to_string()))?;
    let mut cmd = Command::new(REDIS_SERVER);
    if let Role::Sentinel(master) = role {
        // A sentinel rewrites its configuration file: one of its own, in its directory.
        let conf = dir.join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor mymaster 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 4000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir = dir.display(),
                log = dir.join("redis.log").display(),
            ),
        )
        .map_err(|e| SpawnError::Other(format!("write sentinel.conf: {e}")))?;
        cmd.arg(&conf).arg("--sentinel");
    } else {
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--daemonize", "no", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local", "--loglevel", "notice"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"));
    }
    if role == Role::Cluster {
        cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            .arg("--cluster-config-file")
            .arg(dir.join("nodes.conf"));
    }
    if let Role::Replica(master) = role {
        cmd.args(["--replicaof", "127.0.0.1"])
            .arg(master.to_string());
    }
    cmd.args(extra);
    let redis = cmd
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(output_err)
        .spawn()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => SpawnError::NotFound,
            _ => SpawnError::Other(format!("spawn redis-server: {e}")),
        })?;
    // Kills redis-server (and removes its directory) when our end of the watchdog's stdin
    // pipe closes, i.e. when this process dies without dropping the handle. On a normal
    // drop the watchdog is killed first.
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(r#"read _ignored; kill -9 "$0" 2>/dev/null; rm -rf "$1""#)
        .arg(redis.id().to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut running = Running {
        redis,
        watchdog: None,
    };
    match watchdog {
        Ok(child) => running.watchdog = Some(child),
        Err(e) => {
            running.kill();
            return Err(SpawnError::Other(format!("spawn sh (watchdog): {e}")));
        }
    }

    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match running.redis.try_wait() {
            Ok(Some(status)) => {
                running.kill();
                return Err(SpawnError::Exited(status));
            }
            Ok(None) => {}
            Err(e) => {
                running.kill();
                return Err(SpawnError::Other(format!("try_wait: {e}")));
            }
        }
        let last = match probe(port) {
            // Someone else's server may answer on this port while ours is failing to bind.
            Ok(pid) if pid == running.redis.id() => return Ok(running),
            Ok(pid) => format!("port {port} answered by another redis-server (pid {pid})"),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            running.kill();
            return Err(SpawnError::Other(format!(
                "redis-server on port {port} not ready after {READY_TIMEOUT:?}: {last}"
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// One throwaway `redis-server` process on a free loopback port.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    cluster: bool,
    role: Role,
    /// Options after the usual ones (TLS, ACL, renamed commands), kept for restarts.
    extra: Vec<String>,
    /// A second port this handle reserved (the TLS port), released on drop.
    tls_port: Option<u16>,
    process: Option<Running>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// Panics (with the end of the server log) if it cannot be started.
    pub fn start() -> RedisServer {
        Self::start_inner(Role::Plain)
    }

    /// Starts a server with `extra` options after the usual ones (`--rename-command`, ...);
    /// `tls_port`, a port reserved with [`reserve_port`], is released with the handle.
    #[allow(dead_code)]
    pub fn start_with(extra: Vec<String>, tls_port: Option<u16>) -> RedisServer {
        let mut server = Self::start_inner_with(Role::Plain, extra);
        server.tls_port = tls_port;
        server
    }

    /// Starts a replica of `master` (it syncs in the background).
    #[allow(dead_code)]
    pub fn start_replica(master: &RedisServer) -> RedisServer {
        Self::start_inner(Role::Replica(master.port))
    }

    /// Starts a Sentinel that watches `master` as `mymaster` (quorum 2, down after 1 s).
    #[allow(dead_code)]
    pub fn start_sentinel(master: &RedisServer) -> RedisServer {
        Self::start_inner(Role::Sentinel(master.port))
    }

    /// Starts a replica of the master on `master_port` (its TLS port, say) with `extra`
    /// options; `tls_port` as in [`start_with`](Self::start_with).
    #[allow(dead_code)]
    pub fn start_replica_with(
        master_port: u16,
        extra: Vec<String>,
        tls_port: Option<u16>,
    ) -> RedisServer {
        let mut server = Self::start_inner_with(Role::Replica(master_port), extra);
        server.tls_port = tls_port;
        server
    }

    /// Starts a Sentinel that watches the master on `master_port` as `mymaster`, with
    /// `extra` options after its configuration file.
    #[allow(dead_code)]
    pub fn start_sentinel_with(
        master_port: u16,
        extra: Vec<String>,
        tls_port: Option<u16>,
    ) -> RedisServer {
        let mut server = Self::start_inner_with(Role::Sentinel(master_port), extra);
        server.tls_port = tls_port;
        server
    }

    fn start_inner(role: Role) -> RedisServer {
        Self::start_inner_with(role, Vec::new())
    }

    fn start_inner_with(role: Role, extra: Vec<String>) -> RedisServer {
        let cluster = role == Role::Cluster;
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = pick_port(cluster);
            let dir = make_dir(port);
            match spawn(port, &dir, role, &extra) {
                Ok(running) => {
                    return RedisServer {
                        port,
                        dir,
                        cluster,
                        role,
                        extra,
                        tls_port: None,
                        process: Some(running),
                    };
                }
                Err(SpawnError::NotFound) => {
                    let _ = fs::remove_dir_all(&dir);
                    release_port(port, cluster);
                    panic!("{NOT_FOUND}");
                }
                Err(e) => {
                    let msg = format!(
                        "attempt {attempt}/{START_ATTEMPTS} on port {port}: {}\n{}",
                        e.describe(),
                        log_tail(&dir)
                    );
                    eprintln!("redis-server failed to start, retrying on another port: {msg}");
                    failures.push(msg);
                    let _ = fs::remove_dir_all(&dir);
                    release_port(port, cluster);
                }
            }
        }
        panic!("could not start redis-server:\n{}", failures.join("\n\n"));
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's temporary directory (its `--dir`, log and `nodes.conf`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid of the running server, `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.redis.id())
    }

    /// Kills the server with SIGKILL (a crash: nothing is saved) and waits for it to exit.
    /// Does nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(running) = self.process.take() {
            running.kill();
        }
    }

    /// Starts the server again on the same port (killing it first if it still runs) and
    /// waits until it answers. It comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match spawn(self.port, &self.dir, self.role, &self.extra) {
                Ok(running) => {
                    self.process = Some(running);
                    return;
                }
                Err(SpawnError::NotFound) => panic!("{NOT_FOUND}"),
                // Most likely the port is briefly taken by someone probing for a free port.
                Err(e @ SpawnError::Exited(_)) if Instant::now() < deadline => {
                    eprintln!(
                        "redis-server restart on port {} failed ({}), retrying",
                        self.port,
                        e.describe()
                    );
                    thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!(
                    "could not restart redis-server on port {}: {}\n{}",
                    self.port,
                    e.describe(),
                    log_tail(&self.dir)
                ),
            }
        }
    }

    /// A client for this server.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid redis URL")
    }

    /// A new multiplexed connection, for assertions in tests.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// A new blocking connection with 2 s timeouts.
    pub fn sync_connection(&self) -> redis::RedisResult<redis::Connection> {
        let timeout = Duration::from_secs(2);
        let con = self.client().get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        Ok(con)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
        release_port(self.port, self.cluster);
        if let Some(tls) = self.tls_port {
            release_port(tls, false);
        }
    }
}

/// A free loopback port reserved in this process (for a server's second, TLS, port).
#[allow(dead_code)]
pub fn reserve_port() -> u16 {
    pick_port(false)
}

// Unused in test binaries that only need single servers.
#[cfg(feature = "redis-cluster")]
#[allow(unused_imports)]
pub use cluster::RedisCluster;

#[cfg(feature = "redis-cluster")]
mod cluster {
    use super::*;

    const REDIS_CLI: &str = "redis-cli";
    const SLOTS: usize = 16384;
    /// How long creating a cluster and waiting for every node to agree may take.
    const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
    const CLUSTER_ATTEMPTS: usize = 3;

    /// A throwaway Redis Cluster: `masters` nodes, no replicas, all 16384 slots assigned.
    #[derive(Debug)]
    pub struct RedisCluster {
        nodes: Vec<RedisServer>,
    }

    impl RedisCluster {
        /// Starts `masters` (>= 3) nodes, joins them with `redis-cli --cluster create` and
        /// waits until every node reports `cluster_state:ok` with the same slot map.
        ///
        /// Panics (with the node logs) if that fails.
        pub fn start(masters: usize) -> RedisCluster {
            Self::start_with(masters, || (Vec::new(), None))
        }

        /// [`start`](Self::start) with each node's `extra` options and its reserved
        /// `tls_port` from `node()` (TLS: `--tls-port`, `--tls-cluster yes`, ...). The
        /// nodes are joined over their plain ports.
        pub fn start_with(
            masters: usize,
            node: impl Fn() -> (Vec<String>, Option<u16>),
        ) -> RedisCluster {
            assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
            let mut failures = Vec::new();
            for attempt in 1..=CLUSTER_ATTEMPTS {
                let nodes: Vec<RedisServer> = (0..masters)
                    .map(|_| {
                        let (extra, tls_port) = node();
                        let mut server = RedisServer::start_inner_with(Role::Cluster, extra);
                        server.tls_port = tls_port;
                        server
                    })
                    .collect();
                let cluster = RedisCluster { nodes };
                match cluster.create().and_then(|()| cluster.wait_until_ok()) {
                    Ok(()) => return cluster,
                    Err(e) => {
                        let logs: Vec<String> =
                            cluster.nodes.iter().map(|n| log_tail(&n.dir)).collect();
                        let msg = format!(
                            "attempt {attempt}/{CLUSTER_ATTEMPTS}: {e}\n{}",
                            logs.join("\n")
                        );
                        eprintln!("redis cluster failed to start, retrying: {msg}");
                        failures.push(msg);
                    }
                }
            }
            panic!(
                "could not start a redis cluster:\n{}",
                failures.join("\n\n")
            );
        }

        /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, with a timeout.
        fn create(&self) -> Result<(), String> {
            let out_path = self.nodes[0].dir.join("cluster-create.txt");
            let out = File::create(&out_path).map_err(|e| e.to_string())?;
            let out_err = out.try_clone().map_err(|e| e.to_string())?;
            let mut cmd = Command::new(REDIS_CLI);
            cmd.args(["--cluster", "create"]);
            for node in &self.nodes {
                cmd.arg(format!("127.0.0.1:{}", node.port));
            }
            let mut child = cmd
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(out_err)
                .spawn()
                .map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => {
                        "redis-cli not found: run scripts/test.sh, which installs it".to_owned()
                    }
                    _ => format!("spawn redis-cli: {e}"),
                })?;
            let deadline = Instant::now() + CLUSTER_TIMEOUT;
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break Ok(status),
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(20));
                    }
                    Ok(None) => break Err(format!("timed out after {CLUSTER_TIMEOUT:?}")),
                    Err(e) => break Err(e.to_string()),
                }
            };
            if !matches!(status, Ok(s) if s.success()) {
                let _ = child.kill();
                let _ = child.wait();
            }
            let output = fs::read_to_string(&out_path).unwrap_or_default();
            match status {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => Err(format!("redis-cli --cluster create: {s}\n{output}")),
                Err(e) => Err(format!("redis-cli --cluster create: {e}\n{output}")),
            }
        }

        /// Polls every node until all report `cluster_state:ok`, know all nodes, and return
        /// the same complete slot map.
        fn wait_until_ok(&self) -> Result<(), String> {
            let deadline = Instant::now() + CLUSTER_TIMEOUT;
            loop {
                let problem = match self.check() {
                    Ok(()) => return Ok(()),
                    Err(problem) => problem,
                };
                if Instant::now() >= deadline {
                    return Err(format!(
                        "cluster not ready after {CLUSTER_TIMEOUT:?}: {problem}"
                    ));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }

        fn check(&self) -> Result<(), String> {
            let n = self.nodes.len();
            let mut first_map: Option<Vec<(u16, u16, u16)>> = None;
            for node in &self.nodes {
                let mut con = node.sync_connection().map_err(|e| e.to_string())?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .map(str::trim)
                        .unwrap_or("")
                        .to_owned()
                };
                let expected = [
                    ("cluster_state", "ok".to_owned()),
                    ("cluster_slots_assigned", SLOTS.to_string()),
                    ("cluster_slots_ok", SLOTS.to_string()),
                    ("cluster_known_nodes", n.to_string()),
                    ("cluster_size", n.to_string()),
                ];
                for (name, want) in expected {
                    let got = field(name);
                    if got != want {
                        return Err(format!("node {}: {name}:{got}, want {want}", node.port));
                    }
                }
                let map = slot_map(&mut con).map_err(|e| format!("node {}: {e}", node.port))?;
                match &first_map {
                    None => first_map = Some(map),
                    Some(first) if *first != map => {
                        return Err(format!(
                            "node {} sees slots {map:?}, node {} sees {first:?}",
                            node.port, self.nodes[0].port
                        ));
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        }

        /// Kills node `i` with SIGKILL (see [`RedisServer::kill`]).
        pub fn kill_node(&mut self, i: usize) {
            self.nodes[i].kill();
        }

        /// Starts node `i` again on its port, with its `nodes.conf` (it rejoins empty).
        pub fn restart_node(&mut self, i: usize) {
            self.nodes[i].restart();
        }

        /// One URL per node.
        pub fn urls(&self) -> Vec<String> {
            self.nodes.iter().map(RedisServer::url).collect()
        }

        /// The nodes, in the order of [`urls`](Self::urls).
        pub fn nodes(&self) -> &[RedisServer] {
            &self.nodes
        }

        /// A cluster client seeded with every node.
        pub fn client(&self) -> redis::cluster::ClusterClient {
            redis::cluster::ClusterClient::new(self.urls()).expect("valid cluster URLs")
        }

        /// A new async cluster connection.
        pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
            self.client()
                .get_async_connection()
                .await
                .unwrap_or_else(|e| panic!("connect to cluster {:?}: {e}", self.urls()))
        }

        /// Index (into [`urls`](Self::urls)) of the master serving `key`'s slot.
        pub fn node_for_key(&self, key: &[u8]) -> usize {
            let mut con = self.nodes[0]
                .sync_connection()
                .unwrap_or_else(|e| panic!("connect to {}: {e}", self.nodes[0].url()));
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut con)
                .expect("CLUSTER KEYSLOT");
            let map = slot_map(&mut con).expect("CLUSTER SLOTS");
            let port = map
                .iter()
                .find(|(start, end, _)| (*start..=*end).contains(&slot))
                .map(|(_, _, port)| *port)
                .unwrap_or_else(|| panic!("slot {slot} is not served: {map:?}"));
            self.nodes
                .iter()
                .position(|n| n.port == port)
                .unwrap_or_else(|| panic!("slot {slot} served by unknown port {port}"))
        }
    }

    /// `CLUSTER SLOTS` as sorted `(first slot, last slot, master port)`, checked to cover
    /// every slot exactly once.
    fn slot_map(con: &mut redis::Connection) -> Result<Vec<(u16, u16, u16)>, String> {
        let entries: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(con)
            .map_err(|e| e.to_string())?;
        let mut map = Vec::with_capacity(entries.len());
        for entry in entries {
            let redis::Value::Array(items) = entry else {
                return Err(format!("bad CLUSTER SLOTS entry {entry:?}"));
            };
            let (Some(start), Some(end), Some(redis::Value::Array(master))) =
                (items.first(), items.get(1), items.get(2))
            else {
                return Err(format!("bad CLUSTER SLOTS entry {items:?}"));
            };
            let start: u16 = redis::from_redis_value_ref(start).map_err(|e| e.to_string())?;
            let end: u16 = redis::from_redis_value_ref(end).map_err(|e| e.to_string())?;
            let port: u16 = master
                .get(1)
                .ok_or_else(|| format!("bad CLUSTER SLOTS node {master:?}"))
                .and_then(|p| redis::from_redis_value_ref(p).map_err(|e| e.to_string()))?;
            map.push((start, end, port));
        }
        map.sort_unstable();
        let mut next = 0usize;
        for &(start, end, _) in &map {
            if usize::from(start) != next || end < start {
                return Err(format!("slots not covered exactly once: {map:?}"));
            }
            next = usize::from(end) + 1;
        }
        if next != SLOTS {
            return Err(format!("slots {next}..{SLOTS} not covered: {map:?}"));
        }
        Ok(map)
    }

    impl Drop for RedisCluster {
        fn drop(&mut self) {
            // Kill every node first so none notices the others going away; each node's own
            // Drop then removes its directory.
            for node in &mut self.nodes {
                node.kill();
            }
        }
    }
}
