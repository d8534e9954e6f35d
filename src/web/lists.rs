//! Allow and deny lists: clients that skip every limit, and clients refused outright, both
//! decided before any store call.

use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;
use ipnet::IpNet;

use crate::base::throttle::LogOnce;
use crate::web::key::{ClientIp, KeyError};

/// A predicate on the request head (see
/// [`RateLimitBuilder::allow_if`](crate::RateLimitBuilder::allow_if)).
pub(crate) type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// Where the lists read the client's address.
#[derive(Debug, Clone, Default)]
pub(crate) enum Address {
    /// The connection's peer (axum `ConnectInfo` or [`PeerAddr`](crate::key::PeerAddr)).
    #[default]
    Peer,
    /// The client behind trusted proxies.
    Client(ClientIp),
}

impl Address {
    /// The client's address for this request: the peer's, or the client's behind the
    /// trusted proxies. What the lists check and what the audit log records.
    pub(crate) fn client_ip(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        match self {
            Address::Peer => crate::web::key::peer_ip(parts),
            Address::Client(c) => c.client_ip(parts),
        }
    }
}

/// Where a request stands with the lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    /// On neither list: the limits apply.
    No,
    /// Safelisted: no limit applies.
    Allowed,
    /// Blocklisted: refused (403).
    Denied,
}

pub(crate) struct Lists {
    pub(crate) allow: Vec<IpNet>,
    pub(crate) deny: Vec<IpNet>,
    pub(crate) allow_if: Option<Predicate>,
    pub(crate) address: Address,
    misconfigured_log: LogOnce,
}

impl Lists {
    pub(crate) fn new(
        allow: Vec<IpNet>,
        deny: Vec<IpNet>,
        allow_if: Option<Predicate>,
        address: Address,
    ) -> Self {
        Self {
            allow,
            deny,
            allow_if,
            address,
            misconfigured_log: LogOnce::new(),
        }
    }

    /// The safelist wins over the blocklist, which wins over the limits. A client whose
    /// address cannot be trusted (a forwarded chain that does not parse) is on neither list.
    pub(crate) fn classify(&self, parts: &Parts) -> Result<Listed, &'static str> {
        if self.allow_if.as_ref().is_some_and(|f| f(parts)) {
            return Ok(Listed::Allowed);
        }
        if self.allow.is_empty() && self.deny.is_empty() {
            return Ok(Listed::No);
        }
        let ip = match self.address.client_ip(parts) {
            Ok(ip) => ip,
            Err(KeyError::Misconfigured(reason)) => return Err(reason),
            Err(_) => return Ok(Listed::No),
        };
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self.allow.iter().any(|net| net.contains(&ip)) {
            Ok(Listed::Allowed)
        } else if self.deny.iter().any(|net| net.contains(&ip)) {
            Ok(Listed::Denied)
        } else {
            Ok(Listed::No)
        }
    }

    /// Logs the lists' misconfiguration once: the line is the 500's `detail`, which every
    /// request carries.
    pub(crate) fn log_misconfiguration(&self, reason: &str) {
        if self.misconfigured_log.first() {
            tracing::error!(
                "tollgate cannot apply its allow and deny lists: {reason} (logged once; until \
                 this is fixed, each request gets a 500 that says so)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::key::{PeerAddr, TrustedProxies};
    use http::Request;

    fn from(peer: &str, xff: Option<&str>) -> Parts {
        let mut b = Request::get("/");
        if let Some(x) = xff {
            b = b.header("x-forwarded-for", x);
        }
        let (mut parts, ()) = b.body(()).unwrap().into_parts();
        let addr = std::net::SocketAddr::new(peer.parse().unwrap(), 1);
        parts.extensions.insert(PeerAddr(addr));
        parts
    }

    fn nets(n: &[&str]) -> Vec<IpNet> {
        n.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn safelist_beats_blocklist_beats_limits() {
        let lists = Lists::new(
            nets(&["10.1.0.0/16"]),
            nets(&["10.0.0.0/8", "2001:db8::/32"]),
            None,
            Address::Peer,
        );
        assert_eq!(lists.classify(&from("10.1.2.3", None)), Ok(Listed::Allowed));
        assert_eq!(lists.classify(&from("10.2.2.3", None)), Ok(Listed::Denied));
        assert_eq!(
            lists.classify(&from("::ffff:10.2.2.3", None)),
            Ok(Listed::Denied)
        );
        assert_eq!(
            lists.classify(&from("2001:db8::1", None)),
            Ok(Listed::Denied)
        );
        assert_eq!(lists.classify(&from("192.0.2.1", None)), Ok(Listed::No));
        // A spoofed header changes nothing without trusted proxies.
        assert_eq!(
            lists.classify(&from("192.0.2.1", Some("10.1.2.3"))),
            Ok(Listed::No)
        );
    }

    #[test]
    fn behind_trusted_proxies_the_client_address_counts() {
        let proxies = TrustedProxies::cidrs(["192.0.2.0/24"]).unwrap();
        let lists = Lists::new(
            vec![],
            nets(&["203.0.113.0/24"]),
            None,
            Address::Client(ClientIp::x_forwarded_for(proxies)),
        );
        let blocked = from("192.0.2.1", Some("203.0.113.9"));
        assert_eq!(lists.classify(&blocked), Ok(Listed::Denied));
        // An entry that does not parse is trusted for nothing.
        let garbled = from("192.0.2.1", Some("not-an-address"));
        assert_eq!(lists.classify(&garbled), Ok(Listed::No));
    }

    #[test]
    fn a_predicate_safelists_without_an_address() {
        let lists = Lists::new(
            vec![],
            vec![],
            Some(Arc::new(|p: &Parts| p.headers.contains_key("x-internal"))),
            Address::Peer,
        );
        let (parts, ()) = Request::get("/")
            .header("x-internal", "1")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(lists.classify(&parts), Ok(Listed::Allowed));
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert_eq!(lists.classify(&parts), Ok(Listed::No));
    }

    #[test]
    fn no_peer_address_is_a_misconfiguration() {
        let lists = Lists::new(vec![], nets(&["10.0.0.0/8"]), None, Address::Peer);
        let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
        assert!(lists.classify(&parts).is_err());
    }
}
