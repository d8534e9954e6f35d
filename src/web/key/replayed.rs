//! The peer address of the requests a replay sends (`tollgate-rules simulate`), per thread:
//! a replayed request carries no connection, and a `PeerAddr` extension on each would be
//! three allocations a line. [`peer_ip`](super::peer_ip) reads it when a request has no
//! peer address of its own.

use std::cell::Cell;
use std::marker::PhantomData;
use std::net::SocketAddr;

thread_local! {
    static PEER: Cell<Option<SocketAddr>> = const { Cell::new(None) };
}

/// The replay on this thread: [`set`](Self::set) gives the peer of the next requests;
/// dropped, requests on this thread have no replayed peer again.
pub(crate) struct Replaying {
    /// Bound to the thread whose peer it sets.
    _thread: PhantomData<*const ()>,
}

impl Replaying {
    pub(crate) fn start() -> Self {
        PEER.set(None);
        Self {
            _thread: PhantomData,
        }
    }

    /// The peer of the requests sent from now on, on this thread.
    pub(crate) fn set(&self, peer: SocketAddr) {
        PEER.set(Some(peer));
    }
}

impl Drop for Replaying {
    fn drop(&mut self) {
        PEER.set(None);
    }
}

/// The peer of the request being replayed on this thread, if one is.
pub(super) fn peer() -> Option<SocketAddr> {
    PEER.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_is_the_replays_and_only_while_it_lasts() {
        assert_eq!(peer(), None);
        let replay = Replaying::start();
        assert_eq!(peer(), None);
        let a: SocketAddr = "203.0.113.7:0".parse().unwrap();
        replay.set(a);
        assert_eq!(peer(), Some(a));
        // Another thread has no replay.
        assert_eq!(std::thread::spawn(peer).join().unwrap(), None);
        drop(replay);
        assert_eq!(peer(), None);
    }
}
