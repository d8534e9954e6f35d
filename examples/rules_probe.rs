//! Measures what hostile or large rules cost a running server: request latency while a
//! big file is reloaded on `SIGHUP`, memory across reloads of freshly named limits, and
//! the time and memory to load many limits. The figures of the CHANGELOG and of the
//! "Rules under hostile input" work come from this program, run on the code before and
//! after in one session.
//!
//! ```text
//! cargo run -p tollgate --release --example rules_probe --features rules,axum -- sighup 50   # MB
//! cargo run -p tollgate --release --example rules_probe --features rules,axum -- churn
//! cargo run -p tollgate --release --example rules_probe --features rules,axum -- many 10000
//! MAX_LIMITS=200000 cargo run -p tollgate --release --example rules_probe --features rules,axum -- many 100000
//! ```
//!
//! Memory is reported twice: the bytes the program holds on its heap (counted by a
//! wrapping allocator, exact, independent of how the allocator returns memory), and the
//! resident set from `/proc/self/statm`.
#![allow(unsafe_code)] // the counting allocator below, and nothing else

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use tollgate::rules::Rules;
use tollgate::store::MemoryStore;

/// The system allocator, counting the bytes it has handed out and not taken back.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

fn resident() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn memory(label: &str) {
    println!(
        "{label:<44} heap {:>8.1} MB   resident {:>8.1} MB",
        mb(LIVE.load(Ordering::Relaxed)),
        mb(resident())
    );
}

fn limits(names: impl Iterator<Item = String>, quota: &str) -> String {
    let mut text = String::new();
    for name in names {
        text.push_str(&format!(
            "[[limits]]\nname = \"{name}\"\nkey = \"peer_ip\"\nquota = \"{quota}\"\n\n"
        ));
    }
    text
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("sighup") => sighup(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(50)),
        Some("churn") => churn(),
        Some("many") => many(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000)),
        _ => eprintln!("usage: rules_probe sighup [MB] | churn | many [N]"),
    }
}

/// 40 reloads of 500 freshly named limits, then back to one limit.
fn churn() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let one = limits(std::iter::once("base".to_owned()), "10/s");
    memory("start");
    let rules = Rules::builder(MemoryStore::new())
        .text(one.clone())
        .build()
        .expect("rules");
    memory("one limit");
    for round in 0..40 {
        let text = limits((0..500).map(|i| format!("r{round}-l{i}")), "10/s");
        if let Err(e) = rules.reload(&text) {
            println!("reload {round} refused: {e}");
            break;
        }
    }
    memory("after 40 reloads of 500 new names");
    rules.reload(&one).expect("back to one limit");
    memory("back to one limit");
    for round in 0..40 {
        let quota = format!("{}/s", 10 + round);
        rules
            .reload(&limits(std::iter::once("base".to_owned()), &quota))
            .expect("quota change");
    }
    memory("after 40 quota-only reloads");
}

/// Loads `n` limits: time, memory, and the size of one response's rate-limit fields.
fn many(n: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let text = limits((0..n).map(|i| format!("limit-{i}")), "100/s");
    memory("start (text built)");
    let started = Instant::now();
    let mut builder = Rules::builder(MemoryStore::new()).text(text);
    // A cap raised past the default (1,000), to time building beyond it.
    if let Some(max) = std::env::var("MAX_LIMITS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.max_limits(max);
    }
    let built = builder.build();
    let took = started.elapsed();
    match &built {
        Ok(_) => println!("{n} limits: loaded in {:.3} s", took.as_secs_f64()),
        Err(e) => println!(
            "{n} limits: refused in {:.3} s: {}",
            took.as_secs_f64(),
            truncate(&e.to_string())
        ),
    }
    memory("after loading");
    if let Ok(rules) = built {
        use tower::ServiceExt;
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(rules.layer());
        let request = http::Request::builder()
            .uri("/")
            .extension(axum::extract::ConnectInfo(SocketAddr::from((
                [127, 0, 0, 1],
                1,
            ))))
            .body(axum::body::Body::empty())
            .unwrap();
        let started = Instant::now();
        let response = runtime.block_on(app.oneshot(request)).unwrap();
        let header_bytes: usize = response
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        println!(
            "one request: {} in {:.1} ms, {} header bytes",
            response.status(),
            started.elapsed().as_secs_f64() * 1e3,
            header_bytes
        );
        drop(rules);
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// Serves requests over loopback while the rules file is replaced by a `size_mb` MB file
/// and reloaded with `SIGHUP` five times, then by a FIFO nobody writes into; prints the
/// latencies a client saw in each phase.
fn sighup(size_mb: usize) {
    let dir = std::env::temp_dir().join(format!("rules-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.toml");
    let small = limits(std::iter::once("per-ip".to_owned()), "100000/s");
    std::fs::write(&path, &small).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(async {
        let rules = Rules::builder(MemoryStore::new())
            .file(&path)
            .watch(false)
            .build()
            .expect("rules");
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(rules.layer())
            .route("/health", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _rules = rules;
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        });
        addr
    });

    // The client runs on its own thread: what it sees is the server's latency.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<(Instant, Duration)>::new()));
    let client = {
        let stop = stop.clone();
        let samples = samples.clone();
        std::thread::spawn(move || {
            let mut stream = connect(addr);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                if request(&mut stream, "/health").is_err() {
                    stream = connect(addr);
                    continue;
                }
                samples.lock().unwrap().push((started, started.elapsed()));
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let phase = |name: &str, from: Instant| {
        let samples = samples.lock().unwrap();
        let mut lat: Vec<Duration> = samples
            .iter()
            .filter(|(at, _)| *at >= from)
            .map(|&(_, d)| d)
            .collect();
        lat.sort();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "{name:<34} {:>6} requests  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>8.2} ms",
            lat.len(),
            pick(0.5),
            pick(0.99),
            lat.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        );
    };
    let hup = || {
        std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .unwrap();
    };

    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    phase("quiet", from);

    let mut big = String::with_capacity(size_mb << 20);
    big.push_str(&small);
    let line = format!("# {}\n", "x".repeat(1000));
    while big.len() < size_mb << 20 {
        big.push_str(&line);
    }
    std::fs::write(&path, &big).unwrap();
    let from = Instant::now();
    for _ in 0..5 {
        hup();
        std::thread::sleep(Duration::from_millis(600));
    }
    phase(&format!("5 SIGHUPs of a {size_mb} MB file"), from);

    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let from = Instant::now();
        hup();
        std::thread::sleep(Duration::from_secs(2));
        phase("SIGHUP of a FIFO (never written)", from);
        // Requests sent from half a second after the signal to the end of the phase.
        let late = from + Duration::from_millis(500);
        let answered = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at > late)
            .count();
        println!(
            "requests answered 0.5-2 s after the FIFO's SIGHUP: {answered}{}",
            if answered == 0 {
                " (server stalled)"
            } else {
                ""
            }
        );
    }
    stop.store(true, Ordering::Relaxed);
    let _ = std::fs::remove_dir_all(&dir);
    // A stalled server never answers the client again: don't wait for it.
    std::thread::sleep(Duration::from_millis(100));
    if client.is_finished() {
        client.join().unwrap();
    }
    std::process::exit(0);
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
}

/// One keep-alive `GET`; the response is read up to its (short) body.
fn request(stream: &mut TcpStream, path: &str) -> std::io::Result<()> {
    write!(stream, "GET {path} HTTP/1.1\r\nhost: probe\r\n\r\n")?;
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return Ok(());
            }
        }
    }
}
