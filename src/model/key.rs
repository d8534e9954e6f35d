//! [`Key`] and [`KeyBuilder`]: bounded, injective bucket identities.
//!
//! One job per file: `identity` holds the [`Key`] type, its rendered form and address
//! masking; `hash` the hashes the stores take of a key; `builder` the [`KeyBuilder`] that
//! writes a key's parts; `part` what can be written into a key ([`KeyPart`], [`IntoKey`]).

mod builder;
mod hash;
mod identity;
mod part;

pub use self::builder::KeyBuilder;
pub use self::identity::Key;
pub use self::part::{IntoKey, KeyPart};

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::identity::masked;
    use super::*;

    fn key(part: impl KeyPart) -> Key {
        Key::from_part(part)
    }

    /// The first implementation of `masked`, all in 128-bit arithmetic: the reference.
    fn masked_reference(ip: IpAddr, prefix: u8) -> ([u8; 16], u8) {
        let (v6, prefix) = match ip {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + prefix.min(32)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => (v4.to_ipv6_mapped(), 96 + prefix.min(32)),
                None => (v6, prefix.min(128)),
            },
        };
        let bits = u128::from(v6);
        let mask = if prefix == 0 {
            0
        } else {
            u128::MAX << (128 - prefix)
        };
        ((bits & mask).to_be_bytes(), prefix)
    }

    #[test]
    fn masking_matches_the_128_bit_reference_for_every_prefix() {
        let ips: [IpAddr; 6] = [
            "203.0.113.77".parse().unwrap(),
            "255.255.255.255".parse().unwrap(),
            "0.0.0.0".parse().unwrap(),
            "::ffff:198.51.100.9".parse().unwrap(),
            "2001:db8:abcd:12ff:ffff:ffff:ffff:fffe".parse().unwrap(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
        ];
        for ip in ips {
            for prefix in 0..=200u8 {
                assert_eq!(
                    masked(ip, prefix),
                    masked_reference(ip, prefix),
                    "{ip}/{prefix}"
                );
            }
        }
    }

    #[test]
    fn addresses_are_kept_exactly_and_masked() {
        let k = key("203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(k.to_string(), "@203.0.113.7");
        assert_eq!(k.ip(), Some("203.0.113.7".parse().unwrap()));
        let mut b = KeyBuilder::new();
        b.push_ip("2001:db8:ab12:cd34::1".parse().unwrap(), 56);
        assert_eq!(b.finish().to_string(), "@[2001:db8:ab12:cd00::]/56");
        let mut b = KeyBuilder::new();
        b.push_ip("198.51.100.77".parse().unwrap(), 24);
        assert_eq!(b.finish().to_string(), "@198.51.100.0/24");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_folded_to_ipv4() {
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        let mut b = KeyBuilder::new();
        b.push_ip(mapped, 56); // the IPv6 prefix does not apply to an IPv4 client
        let k = b.finish();
        assert_eq!(k, key(IpAddr::from([203, 0, 113, 7])));
        assert_eq!(k.to_string(), "@203.0.113.7");
    }

    #[test]
    fn text_is_escaped_so_input_cannot_pick_a_slot_or_collide() {
        assert_eq!(key("{victim}").to_string(), "%7Bvictim%7D");
        assert_eq!(key("a:b").to_string(), "a%3Ab");
        assert_eq!(key(("a", "b")).to_string(), "a:b");
        assert_ne!(key(("ab", "c")), key(("a", "bc")));
        assert_ne!(key(("", "a")), key(("a", "")));
        assert_ne!(key(("a", "")), key("a"));
        assert_eq!(key(&b"\x00\xff"[..]).to_string(), "%00%FF");
        assert_eq!(key("user@example.com").to_string(), "user%40example.com");
        assert_eq!(key("~x").to_string(), "%7Ex");
    }

    #[test]
    fn an_address_inside_a_composite_stays_unambiguous() {
        let ip: IpAddr = "::1".parse().unwrap();
        let other: IpAddr = "::1:2".parse().unwrap();
        let composite = key((ip, 2u8));
        assert_eq!(composite.to_string(), "@[::1]:2");
        assert_ne!(composite.to_string(), key(other).to_string());
        assert_eq!(key((2u8, ip)).to_string(), "2:@[::1]");
    }

    #[test]
    fn long_or_binary_material_is_hashed_to_a_bounded_size() {
        let long = vec![b'x'; 10_000];
        let k = key(&long[..]);
        let s = k.to_string();
        assert_eq!(s.len(), 65);
        assert!(s.starts_with('~'));
        assert_eq!(key(&long[..]), k, "deterministic");
        let mut other = long.clone();
        other[9_999] = b'y';
        assert_ne!(key(&other[..]), k);
        // 64 bytes stay inline, 65 are hashed.
        assert_eq!(key("a".repeat(64)).to_string(), "a".repeat(64));
        assert!(key("a".repeat(65)).to_string().starts_with('~'));
        assert!(
            key("{".repeat(22)).to_string().starts_with('~'),
            "escaping counts"
        );
    }

    #[test]
    fn compact_form_keeps_addresses_and_separates_texts() {
        let secret = (1, 2);
        let a = key(IpAddr::from([10, 0, 0, 1])).compact(&secret);
        assert_eq!(a, u128::from(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()));
        assert_ne!(key("a").compact(&secret), key("b").compact(&secret));
        assert_ne!(
            key("a").compact(&secret),
            key("a").compact(&(3, 4)),
            "keyed"
        );
        assert_eq!(Key::global().compact(&secret), key("").compact(&secret));
    }

    #[test]
    fn display_and_integers() {
        assert_eq!(key(42u64).to_string(), "42");
        assert_eq!(key(-1i32).to_string(), "-1");
        assert_eq!(
            key((http::Method::GET, "/users/{id}")).to_string(),
            "GET:/users/%7Bid%7D"
        );
    }
}
