//! An HTTP/1.1 load generator for `scripts/lease_stress.sh`: many clients against one or
//! more servers on the loopback, for a bounded time and a bounded number of requests, then
//! one summary line (JSON) on stdout. Written here so that the stress run needs nothing
//! but cargo (no wrk, no hey).
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin http_load -- \
//!     --ports 3000,3001,3002,3003 --seconds 10 --flood --conns 8
//! cargo run -p tollgate-bench --release --bin http_load -- \
//!     --ports 3000,3001 --seconds 10 --rate 8000 --conns 8
//! ```
//!
//! - `--flood`: `--conns` connections per port, each sending its next request as soon as
//!   the previous one is answered (closed loop, as `wrk -c`): as fast as the machine goes.
//! - `--rate R` (paced): `--conns` connections per port, each on its own interval, so that
//!   all together send `R` requests a second, spread evenly over the ports. A connection
//!   whose answer comes late skips the ticks it missed (no catch-up burst after a stall).
//!
//! Every request is `GET --path` (default `/`), with the header of `--header 'name: value'`
//! if given, and with `--header-per-port NAME` a header `NAME: client-<i>`, `i` the port's
//! place in `--ports` from 1: each server sees one client of its own (session affinity,
//! a per-client key that always lands on the same instance). Answers are counted by status: 2xx (the
//! limiter's grants), 429, 5xx and any other; transport errors (refused or reset
//! connections, after which the client reconnects) apart. Requests stop being sent at
//! `--seconds`; those still unanswered `--grace` seconds later (default 2) are given up and
//! counted as `unanswered`. `--max-requests` (default 50,000,000) bounds the count.
//!
//! The summary: the counts, `span_s` (from the first request sent to the last answer
//! received: the `d` of a limiter's bound `burst + rate·d`), the slowest request (sent to
//! last body byte, an unanswered one counting until it was given up) and when it was sent,
//! and the grants of each second of the run. With `--window A,B` (seconds from the start),
//! the requests sent within `A..B` and their grants are counted apart (`window_sent`,
//! `window_granted`): what was decided during a fault that lasted from A to B. `per_port`
//! gives the counts of each port.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, MissedTickBehavior, timeout_at};

const USAGE: &str = "usage: http_load --ports P1,P2,.. --seconds S (--flood | --rate R) \
[--conns C] [--path /] [--grace S] [--max-requests N] [--header 'name: value'] \
[--header-per-port NAME] [--window A,B]";

struct Args {
    ports: Vec<u16>,
    seconds: f64,
    /// Total requests a second over every connection; `None`: a flood.
    rate: Option<f64>,
    conns: usize,
    path: String,
    grace: f64,
    max_requests: u64,
    /// A header sent with every request.
    header: Option<(HeaderName, HeaderValue)>,
    /// A header whose value names the port (`client-<i>`).
    header_per_port: Option<HeaderName>,
    /// The requests sent within this span (seconds from the start) are counted apart.
    window: Option<(f64, f64)>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        ports: Vec::new(),
        seconds: 10.0,
        rate: None,
        conns: 8,
        path: "/".into(),
        grace: 2.0,
        max_requests: 50_000_000,
        header: None,
        header_per_port: None,
        window: None,
    };
    let mut flood = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--ports" => {
                args.ports = value()?
                    .split(',')
                    .map(|p| p.trim().parse().map_err(|e| format!("--ports: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--rate" => args.rate = Some(value()?.parse().map_err(|e| format!("--rate: {e}"))?),
            "--flood" => flood = true,
            "--conns" => args.conns = value()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--path" => args.path = value()?,
            "--grace" => args.grace = value()?.parse().map_err(|e| format!("--grace: {e}"))?,
            "--max-requests" => {
                args.max_requests = value()?
                    .parse()
                    .map_err(|e| format!("--max-requests: {e}"))?
            }
            "--header" => {
                let v = value()?;
                let (name, val) = v
                    .split_once(':')
                    .ok_or("--header: 'name: value'".to_string())?;
                let name =
                    HeaderName::try_from(name.trim()).map_err(|e| format!("--header: {e}"))?;
                let val =
                    HeaderValue::try_from(val.trim()).map_err(|e| format!("--header: {e}"))?;
                args.header = Some((name, val));
            }
            "--header-per-port" => {
                args.header_per_port = Some(
                    HeaderName::try_from(value()?.trim())
                        .map_err(|e| format!("--header-per-port: {e}"))?,
                )
            }
            "--window" => {
                let v = value()?;
                let (a, b) = v.split_once(',').ok_or("--window: A,B".to_string())?;
                let a: f64 = a.trim().parse().map_err(|e| format!("--window: {e}"))?;
                let b: f64 = b.trim().parse().map_err(|e| format!("--window: {e}"))?;
                if !(a >= 0.0 && b > a) {
                    return Err("--window: 0 <= A < B".into());
                }
                args.window = Some((a, b));
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.ports.is_empty() || args.conns == 0 {
        return Err("--ports and --conns (at least 1) are needed".into());
    }
    if !(args.seconds > 0.0 && args.seconds <= 600.0 && args.grace >= 0.0 && args.grace <= 60.0) {
        return Err("--seconds must be in (0, 600], --grace in [0, 60]".into());
    }
    match (flood, args.rate) {
        (true, None) => {}
        (false, Some(r)) if r > 0.0 => {}
        _ => return Err("give exactly one of --flood and --rate R (R > 0)".into()),
    }
    Ok(args)
}

/// One connection's counts, summed at the end (no shared counters on the hot path but the
/// request budget).
#[derive(Default, Clone)]
struct Stats {
    sent: u64,
    granted: u64,
    limited: u64,
    server_error: u64,
    other: u64,
    transport_errors: u64,
    unanswered: u64,
    slowest: Duration,
    /// When the slowest request was sent, from the start.
    slowest_at: Duration,
    /// The last answer, from the start.
    last_answer: Duration,
    /// Grants in each second of the run.
    granted_per_s: Vec<u64>,
    /// The requests sent within `--window`, and those of them granted.
    window_sent: u64,
    window_granted: u64,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.sent += o.sent;
        self.granted += o.granted;
        self.limited += o.limited;
        self.server_error += o.server_error;
        self.other += o.other;
        self.transport_errors += o.transport_errors;
        self.unanswered += o.unanswered;
        self.window_sent += o.window_sent;
        self.window_granted += o.window_granted;
        if o.slowest > self.slowest {
            self.slowest = o.slowest;
            self.slowest_at = o.slowest_at;
        }
        self.last_answer = self.last_answer.max(o.last_answer);
        if self.granted_per_s.len() < o.granted_per_s.len() {
            self.granted_per_s.resize(o.granted_per_s.len(), 0);
        }
        for (a, b) in self.granted_per_s.iter_mut().zip(o.granted_per_s) {
            *a += b;
        }
    }

    fn took(&mut self, sent_at: Instant, start: Instant, now: Instant) {
        let took = now - sent_at;
        if took > self.slowest {
            self.slowest = took;
            self.slowest_at = sent_at - start;
        }
    }
}

/// What every connection shares: where to send, when to stop, the request budget.
struct Plan {
    path: String,
    start: Instant,
    /// No request is sent from then on.
    stop_at: Instant,
    /// Requests still unanswered then are given up.
    give_up_at: Instant,
    /// Requests left to send (the count bound).
    budget: AtomicU64,
    /// A header for every request.
    header: Option<(HeaderName, HeaderValue)>,
    /// `--window`, as instants.
    window: Option<(Instant, Instant)>,
}

type Sender = http1::SendRequest<Empty<Bytes>>;

async fn connect(port: u16) -> Result<Sender, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; ends when the sender is dropped or the server closes it.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One client connection: sends until `stop_at` (on `ticks` if paced, back-to-back if not),
/// reconnecting after transport errors.
/// `own`: the header of `--header-per-port` for this connection's port.
async fn client(
    port: u16,
    own: Option<(HeaderName, HeaderValue)>,
    plan: Arc<Plan>,
    mut ticks: Option<tokio::time::Interval>,
) -> Stats {
    let mut stats = Stats::default();
    let mut sender: Option<Sender> = None;
    loop {
        if let Some(t) = ticks.as_mut()
            && timeout_at(plan.stop_at, t.tick()).await.is_err()
        {
            break;
        }
        if Instant::now() >= plan.stop_at {
            break;
        }
        if plan
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
        {
            break;
        }
        let mut s = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => match timeout_at(plan.stop_at, connect(port)).await {
                Ok(Ok(s)) => s,
                Ok(Err(_)) => {
                    stats.transport_errors += 1;
                    // Refused (a server not up, or gone): try again a little later.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                Err(_) => break,
            },
        };
        let mut request = Request::get(plan.path.as_str())
            .header(header::HOST, "127.0.0.1")
            .body(Empty::<Bytes>::new())
            .expect("a valid request");
        for (name, value) in plan.header.iter().chain(own.iter()) {
            request.headers_mut().insert(name.clone(), value.clone());
        }
        let sent_at = Instant::now();
        stats.sent += 1;
        let in_window = plan
            .window
            .is_some_and(|(from, to)| sent_at >= from && sent_at < to);
        if in_window {
            stats.window_sent += 1;
        }
        let answer = timeout_at(plan.give_up_at, async {
            s.ready().await?;
            let response = s.send_request(request).await?;
            let status = response.status();
            // The whole body: a request is answered when its last byte is in.
            response.into_body().collect().await?;
            Ok::<StatusCode, hyper::Error>(status)
        })
        .await;
        let now = Instant::now();
        stats.took(sent_at, plan.start, now);
        match answer {
            Err(_) => {
                stats.unanswered += 1;
                break;
            }
            Ok(Err(_)) => {
                stats.transport_errors += 1;
                continue; // `s` dropped: a new connection next time
            }
            Ok(Ok(status)) => {
                stats.last_answer = now - plan.start;
                if status.is_success() {
                    stats.granted += 1;
                    if in_window {
                        stats.window_granted += 1;
                    }
                    let second = (now - plan.start).as_secs() as usize;
                    if stats.granted_per_s.len() <= second {
                        stats.granted_per_s.resize(second + 1, 0);
                    }
                    stats.granted_per_s[second] += 1;
                } else if status == StatusCode::TOO_MANY_REQUESTS {
                    stats.limited += 1;
                } else if status.is_server_error() {
                    stats.server_error += 1;
                } else {
                    stats.other += 1;
                }
                sender = Some(s);
            }
        }
    }
    stats
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (total, per_port) = runtime.block_on(run(&args));
    let answered = total.granted + total.limited + total.server_error + total.other;
    let per_s: Vec<String> = total.granted_per_s.iter().map(u64::to_string).collect();
    let ports: Vec<String> = args
        .ports
        .iter()
        .zip(&per_port)
        .map(|(port, s)| {
            format!(
                "{{\"port\":{port},\"sent\":{},\"granted\":{},\"window_sent\":{},\"window_granted\":{}}}",
                s.sent, s.granted, s.window_sent, s.window_granted
            )
        })
        .collect();
    let window = args
        .window
        .map_or("null".to_string(), |(a, b)| format!("[{a},{b}]"));
    println!(
        "{{\"load\":\"{}\",\"rate\":{},\"ports\":{},\"conns_per_port\":{},\"seconds\":{},\
\"span_s\":{:.3},\"sent\":{},\"answered\":{},\"granted\":{},\"limited\":{},\"server_error\":{},\
\"other\":{},\"transport_errors\":{},\"unanswered\":{},\"slowest_ms\":{:.1},\"slowest_at_s\":{:.3},\
\"granted_per_s\":[{}],\"window\":{},\"window_sent\":{},\"window_granted\":{},\"per_port\":[{}]}}",
        if args.rate.is_some() {
            "paced"
        } else {
            "flood"
        },
        args.rate.unwrap_or(0.0),
        args.ports.len(),
        args.conns,
        args.seconds,
        total.last_answer.as_secs_f64(),
        total.sent,
        answered,
        total.granted,
        total.limited,
        total.server_error,
        total.other,
        total.transport_errors,
        total.unanswered,
        total.slowest.as_secs_f64() * 1e3,
        total.slowest_at.as_secs_f64(),
        per_s.join(","),
        window,
        total.window_sent,
        total.window_granted,
        ports.join(",")
    );
    // Connections still open (given up on) are not waited for.
    runtime.shutdown_background();
}

/// Every connection's counts summed, and each port's (in the order of `--ports`).
async fn run(args: &Args) -> (Stats, Vec<Stats>) {
    let start = Instant::now();
    let stop_at = start + Duration::from_secs_f64(args.seconds);
    let plan = Arc::new(Plan {
        path: args.path.clone(),
        start,
        stop_at,
        give_up_at: stop_at + Duration::from_secs_f64(args.grace),
        budget: AtomicU64::new(args.max_requests),
        header: args.header.clone(),
        window: args.window.map(|(a, b)| {
            (
                start + Duration::from_secs_f64(a),
                start + Duration::from_secs_f64(b),
            )
        }),
    });
    let workers = args.ports.len() * args.conns;
    let mut handles = Vec::with_capacity(workers);
    for i in 0..workers {
        let place = i % args.ports.len();
        let port = args.ports[place];
        let own = args.header_per_port.as_ref().map(|name| {
            let value = HeaderValue::try_from(format!("client-{}", place + 1))
                .expect("a valid header value");
            (name.clone(), value)
        });
        let ticks = args.rate.map(|rate| {
            // Each connection sends rate / workers a second; their ticks staggered evenly.
            let period = Duration::from_secs_f64(workers as f64 / rate);
            let phase = period.mul_f64(i as f64 / workers as f64);
            let mut t = tokio::time::interval_at(start + phase, period);
            t.set_missed_tick_behavior(MissedTickBehavior::Skip);
            t
        });
        handles.push((place, tokio::spawn(client(port, own, plan.clone(), ticks))));
    }
    let mut total = Stats::default();
    let mut per_port = vec![Stats::default(); args.ports.len()];
    for (place, h) in handles {
        let s = h.await.expect("a client task");
        per_port[place].add(s.clone());
        total.add(s);
    }
    (total, per_port)
}
