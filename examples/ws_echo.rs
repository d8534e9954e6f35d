//! A WebSocket echo server with a per-address message limit (feature `ws`).
//!
//! `GET /ws` upgrades to a WebSocket whose received messages are charged to the limit
//! `ws-messages`: 20 a second per client address, 10 at once. The key is computed once,
//! at the upgrade. Over the limit the socket closes with 1008 (policy violation) and the
//! reason `rate limit "ws-messages" exceeded; retry in N ms`; `WAIT=1` makes it wait
//! instead (backpressure: the socket is not read until the next message is due, so a
//! flooding client is slowed by TCP).
//!
//! # Run it
//!
//! ```text
//! cargo run -p tollgate --example ws_echo --features ws          # PORT=8080 to move it
//! ```
//!
//! `DEMO=1` connects, sends 100 messages as fast as it can and prints how many echoes
//! came back and how the socket closed.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::Response;
use axum::routing::get;
use futures_util::{SinkExt, StreamExt};
use tollgate::key::PeerIp;
use tollgate::pace::{OverLimit, Per};
use tollgate::store::MemoryStore;
use tollgate::ws::{Close, Limited};
use tollgate::{Limit, Limiter, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let over = if std::env::var_os("WAIT").is_some() {
        OverLimit::wait(Duration::from_secs(10))
    } else {
        OverLimit::End
    };
    let layer = RateLimitLayer::builder(MemoryStore::new())
        // Upgrades count as requests: 30 a minute per address.
        .limit(Limit::new("per-ip", Quota::per_minute(30)).key(PeerIp::new()))
        .limit(
            Limit::new("ws-messages", Quota::per_second(20).burst(10))
                .per(Per::Message)
                .over_limit(over),
        )
        .build()?;
    let app = Router::new()
        .route("/ws", get(echo))
        .with_state(layer.limiter())
        .layer(layer);
    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let addr = listener.local_addr()?;
    println!("listening on ws://{addr}/ws");
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    if std::env::var_os("DEMO").is_some() {
        tokio::spawn(async move { server.await });
        return demo(addr).await;
    }
    server.await?;
    Ok(())
}

async fn echo(
    upgrade: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(limiter): State<Limiter>,
) -> Response {
    // The key, once: the address that upgraded.
    let pacer = limiter.pacer("ws-messages", PeerIp::new().key(peer.ip()));
    upgrade.on_upgrade(move |socket| async move {
        let Ok(pacer) = pacer else { return };
        let mut socket = Limited::new(socket, pacer).close_with(Close::PolicyViolation);
        while let Some(message) = socket.next().await {
            match message {
                Ok(message @ (Message::Text(_) | Message::Binary(_))) => {
                    if socket.send(message).await.is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // Over the limit: the close frame is on its way.
                    println!("{peer}: {e}");
                }
            }
        }
    })
}

/// Sends 100 messages at once; counts the echoes and prints the close frame.
async fn demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A minimal client: the handshake, then 100 masked text frames "hi".
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!(
            "GET /ws HTTP/1.1\r\nhost: {addr}\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
             sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await?);
    }
    println!(
        "{}",
        String::from_utf8_lossy(&head).lines().next().unwrap_or("")
    );
    let frame = [0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2];
    for _ in 0..100 {
        s.write_all(&frame).await?;
    }
    let (mut echoes, mut closed) = (0, None);
    while closed.is_none() {
        let (first, len) = (s.read_u8().await?, s.read_u8().await? & 0x7f);
        let mut payload = vec![0; len as usize];
        s.read_exact(&mut payload).await?;
        match first & 0x0f {
            0x1 => echoes += 1,
            0x8 => closed = Some(payload),
            _ => {}
        }
    }
    let payload = closed.unwrap_or_default();
    let code = payload
        .get(..2)
        .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
    println!(
        "{echoes} echoes, then closed with {code}: {}",
        String::from_utf8_lossy(payload.get(2..).unwrap_or_default())
    );
    Ok(())
}
