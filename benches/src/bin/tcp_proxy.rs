//! A TCP proxy for `scripts/lease_stress.sh`: put between the servers and Redis, it makes
//! Redis far away (a delay each way), slow now and then (some replies late), or
//! unreachable (a black hole), without touching either side.
//!
//! ```text
//! cargo run -p tollgate-bench --release --bin tcp_proxy -- \
//!     --listen 127.0.0.1:7000 --to 127.0.0.1:6379 --delay-ms 30
//! kill -USR1 <pid>    # black hole on; again: off
//! ```
//!
//! - `--delay-ms D` (default 0): every byte is forwarded D ms after it was read, in both
//!   directions (a round trip of 2·D more), with no limit on throughput: what is read is
//!   stamped and queued, and written when due.
//! - `--slow-every K` (default 0: never) and `--slow-ms S` (default 300): of the chunks read
//!   from the upstream (`--to`, Redis: its replies) on each connection, every K-th is
//!   forwarded S ms later than it would be. Redis applied the command at once; only its
//!   reply is late. A connection is a byte stream, delivered in order: a late chunk holds
//!   back the chunks read after it on the same connection until it is written (a reply
//!   behind a late one is late too, by what is left of the S ms), and a read chunk may hold
//!   several replies (a pipelined batch), which are all late together. So "one chunk in K"
//!   makes more than one reply in K late, and by up to S ms each. With `--slow-every`, a
//!   line a second (when it changed) counts the upstream chunks written, those held on
//!   purpose, and those written more than 10 ms after they were read (held, or behind one).
//! - SIGUSR1 toggles the black hole. While it is on, connections are accepted but nothing
//!   is forwarded. With `--blackhole drop` (default) a connection that saw the black hole,
//!   or was opened during it, stays dead for good: what either side sends is read and
//!   thrown away, and neither side is closed (a peer gone, or a firewall dropping packets:
//!   only the client's own timeouts notice). With `--blackhole hold` the bytes are kept
//!   and delivered once the black hole ends (a network partition that heals, TCP
//!   retransmitting).
//!
//! It prints `listening on ADDR (pid N)` once ready, and each change of the black hole on
//! stderr.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

const USAGE: &str = "usage: tcp_proxy --listen ADDR --to ADDR [--delay-ms D] [--blackhole drop|hold] \
[--slow-every K] [--slow-ms S]";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Blackhole {
    /// A connection that saw the black hole is dead for good.
    Drop,
    /// Bytes wait for the black hole to end.
    Hold,
}

struct Args {
    listen: SocketAddr,
    to: SocketAddr,
    delay: Duration,
    blackhole: Blackhole,
    /// Every `.0`-th chunk read from upstream is `.1` late; `.0 == 0`: none.
    slow: (u64, Duration),
}

fn parse_args() -> Result<Args, String> {
    let (mut listen, mut to) = (None, None);
    let mut delay = Duration::ZERO;
    let mut blackhole = Blackhole::Drop;
    let mut slow = (0, Duration::from_millis(300));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = Some(value()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--to" => to = Some(value()?.parse().map_err(|e| format!("--to: {e}"))?),
            "--delay-ms" => {
                delay =
                    Duration::from_millis(value()?.parse().map_err(|e| format!("--delay-ms: {e}"))?)
            }
            "--blackhole" => {
                blackhole = match value()?.as_str() {
                    "drop" => Blackhole::Drop,
                    "hold" => Blackhole::Hold,
                    other => return Err(format!("--blackhole: drop or hold, not {other}")),
                }
            }
            "--slow-every" => {
                slow.0 = value()?.parse().map_err(|e| format!("--slow-every: {e}"))?
            }
            "--slow-ms" => {
                slow.1 =
                    Duration::from_millis(value()?.parse().map_err(|e| format!("--slow-ms: {e}"))?)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is needed")?,
        to: to.ok_or("--to is needed")?,
        delay,
        blackhole,
        slow,
    })
}

/// What the connections share.
struct Shared {
    to: SocketAddr,
    delay: Duration,
    mode: Blackhole,
    /// `--slow-every`, `--slow-ms` (upstream to client only).
    slow: (u64, Duration),
    /// The black hole is on.
    hole: AtomicBool,
    /// Upstream chunks written, held on purpose, and written over 10 ms after their read.
    written: AtomicU64,
    held: AtomicU64,
    late: AtomicU64,
}

/// One connection's state: dead for good (in `drop` mode, once it saw the black hole).
#[derive(Default)]
struct Conn {
    dead: AtomicBool,
}

impl Shared {
    /// Whether bytes of `conn` may be forwarded now; marks the connection dead in `drop`
    /// mode when the black hole is on.
    fn passes(&self, conn: &Conn) -> bool {
        if self.hole.load(Ordering::Relaxed) {
            if self.mode == Blackhole::Drop {
                conn.dead.store(true, Ordering::Relaxed);
            }
            return false;
        }
        !conn.dead.load(Ordering::Relaxed)
    }
}

/// Reads from `from`, stamps each chunk with when it is due; the writer task writes it to
/// `to` then, in the order read (a chunk due later holds back those behind it). Ends
/// (closing `to`'s write side) when `from` ends. `slow`: every `.0`-th chunk read is `.1`
/// later (`.0 == 0`: none).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    slow: (u64, Duration),
) {
    // (when due, when read, the bytes)
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Instant, Vec<u8>)>();
    let counted = slow.0 > 0;
    let writer = {
        let shared = shared.clone();
        let conn = conn.clone();
        tokio::spawn(async move {
            while let Some((due, read_at, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                // Held (or dropped) while the black hole is on.
                loop {
                    if shared.passes(&conn) {
                        break;
                    }
                    if conn.dead.load(Ordering::Relaxed) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if conn.dead.load(Ordering::Relaxed) {
                    continue; // thrown away
                }
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
                if counted {
                    shared.written.fetch_add(1, Ordering::Relaxed);
                    if read_at.elapsed() > shared.delay + Duration::from_millis(10) {
                        shared.late.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            let _ = to.shutdown().await;
        })
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut chunks = 0u64;
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Checked as read too: a dead connection's bytes never queue.
                let _ = shared.passes(&conn);
                if conn.dead.load(Ordering::Relaxed) {
                    continue;
                }
                chunks += 1;
                let read_at = Instant::now();
                let mut due = read_at + shared.delay;
                if slow.0 > 0 && chunks.is_multiple_of(slow.0) {
                    due += slow.1;
                    shared.held.fetch_add(1, Ordering::Relaxed);
                }
                if tx.send((due, read_at, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let conn = Arc::new(Conn::default());
    // Opened during the black hole: in drop mode, never forwarded.
    let _ = shared.passes(&conn);
    if conn.dead.load(Ordering::Relaxed) {
        // Accepted, read and ignored until the client closes it.
        let mut client = client;
        let mut buf = vec![0u8; 16 * 1024];
        while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
        return;
    }
    let Ok(upstream) = TcpStream::connect(shared.to).await else {
        return; // dropping `client` closes it, as a refused connection would
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (up_read, up_write) = upstream.into_split();
    let slow = shared.slow;
    tokio::join!(
        pump(
            client_read,
            up_write,
            shared.clone(),
            conn.clone(),
            (0, Duration::ZERO)
        ),
        pump(up_read, client_write, shared, conn, slow),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp_proxy: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let shared = Arc::new(Shared {
        to: args.to,
        delay: args.delay,
        mode: args.blackhole,
        slow: args.slow,
        hole: AtomicBool::new(false),
        written: AtomicU64::new(0),
        held: AtomicU64::new(0),
        late: AtomicU64::new(0),
    });
    if args.slow.0 > 0 {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut last = u64::MAX;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let written = shared.written.load(Ordering::Relaxed);
                if written != last {
                    last = written;
                    println!(
                        "slow: upstream chunks written={written} held={} late={}",
                        shared.held.load(Ordering::Relaxed),
                        shared.late.load(Ordering::Relaxed)
                    );
                }
            }
        });
    }
    {
        let shared = shared.clone();
        let mut usr1 =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                .expect("a SIGUSR1 handler");
        tokio::spawn(async move {
            while usr1.recv().await.is_some() {
                let on = !shared.hole.fetch_xor(true, Ordering::Relaxed);
                eprintln!("tcp_proxy: black hole {}", if on { "on" } else { "off" });
            }
        });
    }
    println!(
        "listening on {} (pid {}), to {}, delay {:?} each way, one reply chunk in {} late by {:?}",
        args.listen,
        std::process::id(),
        args.to,
        args.delay,
        args.slow.0,
        args.slow.1
    );
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(client, shared.clone()));
    }
}
