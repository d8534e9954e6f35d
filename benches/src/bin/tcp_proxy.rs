//! A TCP proxy for `scripts/lease_stress.sh`: put between the servers and Redis, it makes
//! Redis far away (a delay each way) or unreachable (a black hole), without touching
//! either side.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

const USAGE: &str =
    "usage: tcp_proxy --listen ADDR --to ADDR [--delay-ms D] [--blackhole drop|hold]";

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
}

fn parse_args() -> Result<Args, String> {
    let (mut listen, mut to) = (None, None);
    let mut delay = Duration::ZERO;
    let mut blackhole = Blackhole::Drop;
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
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen is needed")?,
        to: to.ok_or("--to is needed")?,
        delay,
        blackhole,
    })
}

/// What the connections share.
struct Shared {
    to: SocketAddr,
    delay: Duration,
    mode: Blackhole,
    /// The black hole is on.
    hole: AtomicBool,
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
/// `to` then. Ends (closing `to`'s write side) when `from` ends.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    conn: Arc<Conn>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = {
        let shared = shared.clone();
        let conn = conn.clone();
        tokio::spawn(async move {
            while let Some((due, bytes)) = rx.recv().await {
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
            }
            let _ = to.shutdown().await;
        })
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                // Checked as read too: a dead connection's bytes never queue.
                let _ = shared.passes(&conn);
                if conn.dead.load(Ordering::Relaxed) {
                    continue;
                }
                if tx
                    .send((Instant::now() + shared.delay, buf[..n].to_vec()))
                    .is_err()
                {
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
    tokio::join!(
        pump(client_read, up_write, shared.clone(), conn.clone()),
        pump(up_read, client_write, shared, conn),
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
        hole: AtomicBool::new(false),
    });
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
        "listening on {} (pid {}), to {}, delay {:?} each way",
        args.listen,
        std::process::id(),
        args.to,
        args.delay
    );
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(client, shared.clone()));
    }
}
