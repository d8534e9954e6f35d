//! Client addresses: the peer of the connection, or the client behind trusted proxies.

use std::net::{IpAddr, SocketAddr};

use http::header::{FORWARDED, HeaderName};
use http::request::Parts;
use ipnet::IpNet;
use smallvec::SmallVec;

use super::forwarded::{forwarded_elements, parse_xff_entry};
use super::{Key, KeyBuilder, KeyError, KeyExtractor};
use crate::base::error::ConfigError;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

#[cfg(feature = "axum")]
const NO_PEER: &str = "no peer address on the request: serve the app with \
    `into_make_service_with_connect_info::<SocketAddr>()` (axum), or insert \
    `tollgate::key::PeerAddr` into each request's extensions (hyper), or use \
    `axum::extract::connect_info::MockConnectInfo` in tests";
#[cfg(not(feature = "axum"))]
const NO_PEER: &str = "no peer address on the request: insert `tollgate::key::PeerAddr` \
    into each request's extensions, or enable tollgate's `axum` feature to read axum's \
    `ConnectInfo<SocketAddr>`";

/// The peer address of a connection, as a request extension: what [`PeerIp`] and
/// [`ClientIp`] read when axum's `ConnectInfo<SocketAddr>` is not there (plain hyper
/// servers insert it per connection; see the `hyper_server` example).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// The peer's address, or the misconfiguration that leaves it unknown.
pub(crate) fn peer_ip(parts: &Parts) -> Result<IpAddr, KeyError> {
    peer_addr(parts)
        .map(|a| a.ip())
        .ok_or(KeyError::Misconfigured(NO_PEER))
}

fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    {
        use axum::extract::{ConnectInfo, connect_info::MockConnectInfo};
        if let Some(info) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
            return Some(info.0);
        }
        // axum's test double, which its own `ConnectInfo` extractor also falls back to.
        if let Some(mock) = parts.extensions.get::<MockConnectInfo<SocketAddr>>() {
            return Some(mock.0);
        }
    }
    if let Some(peer) = parts.extensions.get::<PeerAddr>() {
        return Some(peer.0);
    }
    // tonic's server (`tonic::transport::Server`) puts the peer here.
    #[cfg(feature = "grpc")]
    if let Some(info) = parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
    {
        return info.remote_addr();
    }
    // A request a replay sends (`tollgate-rules simulate`).
    #[cfg(feature = "rules")]
    if let Some(peer) = super::replayed::peer() {
        return Some(peer);
    }
    None
}

/// How addresses are grouped into buckets: IPv4 by `/v4` (32 by default, one bucket per
/// address), IPv6 by `/v6` (56 by default: one customer site usually owns a /56 or a /48,
/// and an attacker with a /64 must not get 2^64 buckets). IPv4-mapped IPv6 addresses
/// (`::ffff:a.b.c.d`) count as IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefixes {
    v4: u8,
    v6: u8,
}

const DEFAULT_PREFIXES: Prefixes = Prefixes { v4: 32, v6: 56 };

impl Prefixes {
    const fn with_v4(self, bits: u8) -> Self {
        assert!(bits <= 32, "an IPv4 prefix is at most 32 bits");
        Self { v4: bits, ..self }
    }

    const fn with_v6(self, bits: u8) -> Self {
        assert!(bits <= 128, "an IPv6 prefix is at most 128 bits");
        Self { v6: bits, ..self }
    }

    fn push(&self, ip: IpAddr, key: &mut KeyBuilder) {
        let is_v4 = match ip {
            IpAddr::V4(_) => true,
            IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        };
        key.push_ip(ip, if is_v4 { self.v4 } else { self.v6 });
    }

    fn key(&self, ip: IpAddr) -> Key {
        let mut b = KeyBuilder::new();
        self.push(ip, &mut b);
        b.finish()
    }
}

/// The prefix setters and `key` of an address extractor (a type with a `prefixes`
/// field), written once for [`PeerIp`] and [`ClientIp`]; the doc comments given are
/// added to `key`'s.
macro_rules! prefix_methods {
    ($ty:ident $(, $(#[$key_doc:meta])+)?) => {
        impl $ty {
            /// Groups IPv6 clients by the first `bits` bits (56 by default: one customer
            /// site; 128: one bucket per address).
            ///
            /// # Panics
            ///
            /// If `bits > 128`.
            pub const fn ipv6_prefix(mut self, bits: u8) -> Self {
                self.prefixes = self.prefixes.with_v6(bits);
                self
            }

            /// Groups IPv4 clients by the first `bits` bits (32, the default: one bucket
            /// per address).
            ///
            /// # Panics
            ///
            /// If `bits > 32`.
            pub const fn ipv4_prefix(mut self, bits: u8) -> Self {
                self.prefixes = self.prefixes.with_v4(bits);
                self
            }

            /// The key this extractor makes for a client at `ip` (masked to its prefix):
            /// what the [`Limiter`](crate::Limiter) handle takes to reach the same bucket.
            $($(#[$key_doc])+)?
            pub fn key(&self, ip: IpAddr) -> Key {
                self.prefixes.key(ip)
            }
        }
    };
}

/// The address of the connection's peer.
///
/// Reads axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a [`PeerAddr`] extension.
/// Without either the app is misconfigured: the request gets a 500 whose problem document
/// says how to fix it (and an error log line saying the same, once), never a silent pass.
///
/// Behind a reverse proxy every request has the proxy's address: use [`ClientIp`] there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    prefixes: Prefixes,
}

impl PeerIp {
    /// The peer address, IPv4 per address, IPv6 per /56.
    pub const fn new() -> Self {
        Self {
            prefixes: DEFAULT_PREFIXES,
        }
    }
}

prefix_methods!(
    PeerIp,
    ///
    /// ```
    /// use tollgate::key::{Key, PeerIp};
    ///
    /// let ip = "2001:db8:1:2::7".parse().unwrap();
    /// // One bucket per /56 by default: another address of the same /56 shares it.
    /// assert_eq!(PeerIp::new().key(ip), PeerIp::new().key("2001:db8:1:ff::1".parse().unwrap()));
    /// assert_ne!(PeerIp::new().key(ip), Key::from_part(ip));
    /// ```
);

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    #[inline]
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let peer = peer_addr(parts).ok_or(KeyError::Misconfigured(NO_PEER))?;
        self.prefixes.push(peer.ip(), key);
        Ok(())
    }

    /// Nothing: a request always has a peer (or the app is misconfigured, a 500).
    fn describe(&self) -> Option<String> {
        Some(String::new())
    }
}

/// Which proxies may tell us the client's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies {
    trust: Trust,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Trust {
    /// Addresses in these networks are proxies of ours.
    Nets(Vec<IpNet>),
    /// The last `n` hops (the peer counts as the first) are proxies of ours.
    Hops(usize),
}

impl TrustedProxies {
    /// Proxies whose addresses fall in these networks (`"10.0.0.0/8"`, `"2001:db8::/32"`,
    /// or a single address such as `"192.0.2.10"`). A [`ConfigError`] names the entry
    /// that does not parse, e.g. `trusted_proxies[1]`.
    pub fn cidrs<I, S>(nets: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = nets
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        ConfigError::new(
                            format!("trusted_proxies[{i}]"),
                            format!("`{s}` is neither a network (`10.0.0.0/8`) nor an address"),
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_nets(nets))
    }

    /// Proxies whose addresses fall in these networks.
    pub fn from_nets(nets: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trust: Trust::Nets(nets.into_iter().map(|n| n.trunc()).collect()),
        }
    }

    /// Loopback, RFC 1918 private and IPv6 unique-local networks: proxies on the same
    /// host or in the same private network (typical for Kubernetes ingresses).
    pub fn private_networks() -> Self {
        Self::cidrs([
            "127.0.0.0/8",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "::1/128",
            "fc00::/7",
        ])
        .expect("valid networks")
    }

    /// A fixed chain of `n` proxies in front of the app: the peer is the first, each
    /// further one appended an entry, and the entry `n` places from the right is the
    /// client. With fewer entries than that, the leftmost one is used.
    pub fn hops(n: usize) -> Self {
        Self {
            trust: Trust::Hops(n),
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match &self.trust {
            Trust::Nets(nets) => nets.iter().any(|n| n.contains(&ip)),
            Trust::Hops(_) => false,
        }
    }
}

/// Which header carries the chain of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    XForwardedFor,
    Forwarded,
}

/// The client's address behind reverse proxies, with explicit trust only.
///
/// Starting from the connection's peer, the chain of addresses in `X-Forwarded-For` (or
/// RFC 7239 `Forwarded`, `for=` parameters) is walked **from the right**: each address that
/// belongs to a trusted proxy is skipped, and the first one that does not is the client.
/// Everything left of it was written by the client and is ignored, so a client cannot
/// choose its own key by sending a forged header. When the peer itself is not a trusted
/// proxy, the headers are ignored altogether.
///
/// An entry that does not parse where the client's address should be makes the key
/// missing (see [`MissingKey`](crate::MissingKey)); nothing malformed is ever trusted.
///
/// ```
/// use tollgate::key::{ClientIp, TrustedProxies};
///
/// // Behind a load balancer in 10.0.0.0/8:
/// let client = ClientIp::x_forwarded_for(TrustedProxies::cidrs(["10.0.0.0/8"])?);
/// // Behind exactly one proxy that sends RFC 7239 `Forwarded`:
/// let client = ClientIp::forwarded(TrustedProxies::hops(1)).ipv6_prefix(64);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    source: Source,
    trusted: TrustedProxies,
    prefixes: Prefixes,
}

impl ClientIp {
    /// The client address from `X-Forwarded-For`, trusting `proxies`.
    pub fn x_forwarded_for(proxies: TrustedProxies) -> Self {
        Self {
            source: Source::XForwardedFor,
            trusted: proxies,
            prefixes: DEFAULT_PREFIXES,
        }
    }

    /// The client address from RFC 7239 `Forwarded` (`for=`), trusting `proxies`.
    pub fn forwarded(proxies: TrustedProxies) -> Self {
        Self {
            source: Source::Forwarded,
            trusted: proxies,
            prefixes: DEFAULT_PREFIXES,
        }
    }

    /// The client address for a request, or why there is none.
    pub fn client_ip(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_addr(parts)
            .ok_or(KeyError::Misconfigured(NO_PEER))?
            .ip();
        // Walk the chain right to left: the peer, then each entry from the last one.
        // The walk stops at the first decision, so a long forged header costs nothing.
        let mut walk = Walk::new(&self.trusted);
        if let Some(done) = walk.step(Some(peer)) {
            return done;
        }
        match self.source {
            Source::XForwardedFor => {
                for line in parts.headers.get_all(X_FORWARDED_FOR).iter().rev() {
                    // A line that is not text cannot be trusted.
                    let Ok(line) = line.to_str() else {
                        if let Some(done) = walk.step(None) {
                            return done;
                        }
                        continue;
                    };
                    for entry in line.rsplit(',') {
                        if let Some(done) = walk.step(parse_xff_entry(entry)) {
                            return done;
                        }
                    }
                }
            }
            Source::Forwarded => {
                for line in parts.headers.get_all(FORWARDED).iter().rev() {
                    let mut elements: SmallVec<[Option<IpAddr>; 4]> = SmallVec::new();
                    match line.to_str() {
                        Ok(line) => forwarded_elements(line, |e| elements.push(e)),
                        Err(_) => elements.push(None),
                    }
                    for element in elements.into_iter().rev() {
                        if let Some(done) = walk.step(element) {
                            return done;
                        }
                    }
                }
            }
        }
        walk.end()
    }
}

prefix_methods!(ClientIp);

/// The walk along a chain of hops, right to left.
struct Walk<'a> {
    trusted: &'a TrustedProxies,
    /// Index of the next hop (the peer is 0).
    index: usize,
    /// The leftmost hop seen so far.
    last: Option<IpAddr>,
}

impl<'a> Walk<'a> {
    fn new(trusted: &'a TrustedProxies) -> Self {
        Self {
            trusted,
            index: 0,
            last: None,
        }
    }

    /// Takes the next hop; `Some` once the client is known (or known to be unknowable).
    fn step(&mut self, hop: Option<IpAddr>) -> Option<Result<IpAddr, KeyError>> {
        let index = self.index;
        self.index += 1;
        self.last = hop;
        match &self.trusted.trust {
            Trust::Hops(n) => (index == *n).then_some(hop.ok_or(KeyError::Missing)),
            Trust::Nets(_) => match hop {
                Some(ip) if self.trusted.contains(ip) => None,
                Some(ip) => Some(Ok(ip)),
                None => Some(Err(KeyError::Missing)),
            },
        }
    }

    /// The chain ended before a decision: every hop was one of our proxies (the request
    /// comes from inside), or it was shorter than the hop count. The leftmost hop it is.
    fn end(self) -> Result<IpAddr, KeyError> {
        self.last.ok_or(KeyError::Missing)
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts, key: &mut KeyBuilder) -> Result<(), KeyError> {
        let ip = self.client_ip(parts)?;
        self.prefixes.push(ip, key);
        Ok(())
    }

    /// Nothing a client sends: the address is missing only when our own proxies' chain
    /// does not parse, which no client's developer can fix.
    fn describe(&self) -> Option<String> {
        Some(String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::key::tests::{extract, parts};
    use http::Request;

    fn req(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::get("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut p = parts(b.body(()).unwrap());
        p.extensions
            .insert(PeerAddr(SocketAddr::new(peer.parse().unwrap(), 4000)));
        p
    }

    fn lb() -> ClientIp {
        ClientIp::x_forwarded_for(TrustedProxies::cidrs(["10.0.0.0/8"]).unwrap())
    }

    #[test]
    fn peer_ip_groups_ipv6_and_folds_mapped_ipv4() {
        let p = req("2001:db8:1:2:3:4:5:6", &[]);
        assert_eq!(extract(&PeerIp::new(), &p).unwrap(), "@[2001:db8:1::]/56");
        assert_eq!(
            extract(&PeerIp::new().ipv6_prefix(128), &p).unwrap(),
            "@[2001:db8:1:2:3:4:5:6]"
        );
        let p = req("::ffff:192.0.2.1", &[]);
        assert_eq!(extract(&PeerIp::new(), &p).unwrap(), "@192.0.2.1");
        assert_eq!(
            extract(&PeerIp::new().ipv4_prefix(24), &p).unwrap(),
            "@192.0.2.0/24"
        );
    }

    #[test]
    fn peer_ip_without_connect_info_is_a_misconfiguration() {
        let p = parts(Request::get("/").body(()).unwrap());
        let err = extract(&PeerIp::new(), &p).unwrap_err();
        let KeyError::Misconfigured(msg) = err else {
            panic!("{err:?}")
        };
        assert!(msg.contains("into_make_service_with_connect_info"));
        assert!(matches!(
            extract(&lb(), &p),
            Err(KeyError::Misconfigured(_))
        ));
    }

    #[test]
    fn untrusted_peer_ignores_forwarded_headers() {
        let p = req("203.0.113.9", &[("x-forwarded-for", "198.51.100.1")]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@203.0.113.9");
    }

    #[test]
    fn rightmost_untrusted_entry_is_the_client() {
        // The client forged the first entry; our LB appended the real one.
        let p = req("10.0.0.5", &[("x-forwarded-for", "1.1.1.1, 198.51.100.7")]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@198.51.100.7");
        // Two of our proxies in the chain.
        let p = req(
            "10.0.0.5",
            &[("x-forwarded-for", "1.1.1.1, 198.51.100.7, 10.1.1.1")],
        );
        assert_eq!(extract(&lb(), &p).unwrap(), "@198.51.100.7");
        // Split across header lines: one list.
        let p = req(
            "10.0.0.5",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-forwarded-for", "198.51.100.7, 10.1.1.1"),
            ],
        );
        assert_eq!(extract(&lb(), &p).unwrap(), "@198.51.100.7");
    }

    #[test]
    fn malformed_entries_are_never_trusted() {
        let p = req("10.0.0.5", &[("x-forwarded-for", "198.51.100.7, garbage")]);
        assert_eq!(extract(&lb(), &p), Err(KeyError::Missing));
        let p = req("10.0.0.5", &[("x-forwarded-for", "garbage, 198.51.100.7")]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@198.51.100.7");
        let p = req("10.0.0.5", &[("x-forwarded-for", ",,,")]);
        assert_eq!(extract(&lb(), &p), Err(KeyError::Missing));
        let mut p = req("10.0.0.5", &[]);
        p.headers.insert(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(extract(&lb(), &p), Err(KeyError::Missing));
    }

    #[test]
    fn all_trusted_means_the_leftmost_proxy_hop() {
        let p = req("10.0.0.5", &[]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@10.0.0.5");
        let p = req("10.0.0.5", &[("x-forwarded-for", "10.9.9.9")]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@10.9.9.9");
    }

    #[test]
    fn hop_count_picks_the_nth_from_the_right() {
        let one = ClientIp::x_forwarded_for(TrustedProxies::hops(1));
        let two = ClientIp::x_forwarded_for(TrustedProxies::hops(2));
        let p = req(
            "192.0.2.1",
            &[("x-forwarded-for", "1.1.1.1, 198.51.100.7, 192.0.2.2")],
        );
        assert_eq!(extract(&one, &p).unwrap(), "@192.0.2.2");
        assert_eq!(extract(&two, &p).unwrap(), "@198.51.100.7");
        let p = req("192.0.2.1", &[]);
        assert_eq!(
            extract(&two, &p).unwrap(),
            "@192.0.2.1",
            "short chain: leftmost"
        );
        let zero = ClientIp::x_forwarded_for(TrustedProxies::hops(0));
        let p = req("192.0.2.1", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(extract(&zero, &p).unwrap(), "@192.0.2.1");
    }

    #[test]
    fn forwarded_header() {
        let c = ClientIp::forwarded(
            TrustedProxies::cidrs(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap(),
        );
        let p = req(
            "10.0.0.5",
            &[(
                "forwarded",
                r#"for=1.1.1.1, for="[2001:db8:cafe::17]:4711";proto=https, for=2001:db8:ffff::1"#,
            )],
        );
        assert_eq!(extract(&c, &p).unwrap(), "@[2001:db8:cafe::]/56");
        let p = req("10.0.0.5", &[("forwarded", "for=unknown")]);
        assert_eq!(extract(&c, &p), Err(KeyError::Missing));
        let p = req(
            "10.0.0.5",
            &[("forwarded", "for=10.2.2.2, for=198.51.100.7")],
        );
        assert_eq!(
            extract(&c.clone().ipv4_prefix(16), &p).unwrap(),
            "@198.51.0.0/16"
        );
    }

    #[test]
    fn trusted_networks_match_mapped_addresses_and_report_bad_entries() {
        let p = req("::ffff:10.0.0.5", &[("x-forwarded-for", "198.51.100.7")]);
        assert_eq!(extract(&lb(), &p).unwrap(), "@198.51.100.7");
        let err = TrustedProxies::cidrs(["10.0.0.0/8", "nope"]).unwrap_err();
        assert_eq!(err.field(), "trusted_proxies[1]");
        assert!(
            TrustedProxies::cidrs(["192.0.2.10"])
                .unwrap()
                .contains("192.0.2.10".parse().unwrap())
        );
        assert!(TrustedProxies::private_networks().contains("172.20.1.1".parse().unwrap()));
    }
}
