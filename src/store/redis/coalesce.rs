//! Requests of one batch that share their limits, decided by one step of `gcra.lua`.
//!
//! When a batch holds several requests of the same plain GCRA limits (the same keys, in the
//! same order, with the same quotas and modes: a hot key), the script gets them as one
//! group: the keys once, the quotas once, the members' costs, and it decides the members one
//! after the other in one pass over the keys' state (one read and at most one `SET` per key
//! instead of one per request). Its reply is the number of requests that proceeded and, per
//! limit, the TAT read and the TAT after the group; [`expand`] replays the members'
//! decisions from these, with the script's own formulas, into the replies each request would
//! have had alone, and refuses a reply whose replay does not end where the script did.
//!
//! A request joins a group only if no request between the group's last member and it
//! touches one of its keys: it moves ahead only of requests on other keys, whose decisions
//! it cannot change, so every request is decided as in the batch's order (arrival order),
//! all or nothing across its limits. Plain: GCRA, no reservation, no settle, no calendar
//! window, no in-flight units, no key twice in the request; anything else goes alone.

use super::{Mode, Part};
use crate::algo::algorithm::Algorithm;

/// One entry of a batch's call: its requests (indices into the batch), in order; two or
/// more are a group.
pub(super) type Entry = smallvec::SmallVec<[usize; 1]>;

/// Whether `parts[group]` can be decided in a group.
pub(super) fn plain(parts: &[Part], group: &[usize]) -> bool {
    !group.is_empty()
        && group.iter().enumerate().all(|(n, &i)| {
            let p = &parts[i];
            p.algorithm == Algorithm::Gcra
                && p.span.is_none()
                && p.held.is_none()
                && p.settle.is_none()
                && p.max_wait_us == 0
                && group[..n]
                    .iter()
                    .all(|&j| parts[j].redis_key != p.redis_key)
        })
}

/// Whether two plain requests meet the same limits (their costs aside).
fn same_limits(a: (&[Part], &[usize]), b: (&[Part], &[usize])) -> bool {
    a.1.len() == b.1.len()
        && a.1.iter().zip(b.1).all(|(&i, &j)| {
            let (p, q) = (&a.0[i], &b.0[j]);
            p.redis_key == q.redis_key && p.shape() == q.shape() && p.mode == q.mode
        })
}

/// The batch's entries, in the order the script decides them: each request where it
/// arrived, or in the group of an earlier request of the same limits when no request
/// between them touched those keys. `requests` yields each request's parts and group.
pub(super) fn entries<'a>(
    requests: impl ExactSizeIterator<Item = (&'a [Part], &'a [usize])> + Clone,
) -> Vec<Entry> {
    let all: Vec<_> = requests.collect();
    let mut entries: Vec<Entry> = Vec::with_capacity(all.len());
    if all.len() < 2 {
        entries.extend((0..all.len()).map(|r| smallvec::smallvec![r]));
        return entries;
    }
    let plains: Vec<bool> = all.iter().map(|&(p, g)| plain(p, g)).collect();
    // The entry that last touched each key.
    let mut last: hashbrown::HashMap<&[u8], usize, foldhash::fast::RandomState> =
        hashbrown::HashMap::with_capacity_and_hasher(all.len(), Default::default());
    for (r, &(parts, group)) in all.iter().enumerate() {
        let key = |i: usize| parts[i].redis_key.as_slice();
        let joined = plains[r]
            .then(|| last.get(key(group[0])).copied())
            .flatten()
            .filter(|&e| {
                let lead = entries[e][0];
                plains[lead]
                    && same_limits(all[lead], (parts, group))
                    && group.iter().all(|&i| last.get(key(i)) == Some(&e))
            });
        let e = match joined {
            Some(e) => {
                entries[e].push(r);
                e
            }
            None => {
                entries.push(smallvec::smallvec![r]);
                entries.len() - 1
            }
        };
        for &i in group {
            last.insert(key(i), e);
        }
    }
    entries
}

/// Appends a group's arguments to `cmd` (its keys go first, with the batch's keys): `g`,
/// the members, the limits, then per limit `t`, `burst`, enforce and the costs (one
/// integer when every member pays the same).
pub(super) fn push_group<'a>(
    cmd: &mut redis::Cmd,
    members: impl Iterator<Item = (&'a [Part], &'a [usize])> + Clone,
) {
    let mut first = members.clone();
    let (parts, group) = first.next().expect("a group has members");
    let m = 1 + first.count();
    cmd.arg("g").arg(m).arg(group.len());
    for (n, &i) in group.iter().enumerate() {
        let p = &parts[i];
        let (t, burst) = p.shape();
        cmd.arg(t).arg(burst).arg(u8::from(p.mode == Mode::Enforce));
        let cost = |(parts, group): (&[Part], &[usize])| parts[group[n]].cost;
        let one = p.cost;
        if members.clone().all(|r| cost(r) == one) {
            cmd.arg(one);
        } else {
            let mut list = Vec::with_capacity(4 * m);
            for r in members.clone() {
                if !list.is_empty() {
                    list.push(b',');
                }
                list.extend_from_slice(itoa::Buffer::new().format(cost(r)).as_bytes());
            }
            cmd.arg(list);
        }
    }
}

/// Integers a group of `limits` limits adds to the reply.
pub(super) fn width(limits: usize) -> usize {
    1 + 2 * limits
}

/// The members' replies (each `now`, then per limit verdict, reset after, previous TAT, as
/// the script answers a request alone), replayed from the group's reply `r`: proceeded,
/// then per limit the TAT read and the TAT after. `None` if the replay does not end where
/// the script did.
pub(super) fn expand<'a>(
    now: i64,
    r: &[i64],
    members: impl Iterator<Item = (&'a [Part], &'a [usize])>,
) -> Option<Vec<Vec<i64>>> {
    let (&proceeded, tats) = r.split_first()?;
    let mut tats: smallvec::SmallVec<[i64; 8]> = tats.chunks_exact(2).map(|c| c[0]).collect();
    let mut out = Vec::new();
    let mut passed = 0;
    let mut verdicts: smallvec::SmallVec<[(i64, i64, bool); 4]> = smallvec::SmallVec::new();
    for (parts, group) in members {
        if group.len() != tats.len() {
            return None;
        }
        verdicts.clear();
        let mut refused = false;
        for (n, &i) in group.iter().enumerate() {
            let p = &parts[i];
            let (t, burst) = p.shape();
            let (t, burst, cost) = (t as i64, burst as i64, i64::from(p.cost));
            let base = tats[n].max(now);
            let verdict = if cost > burst {
                2
            } else if cost == 0 || base + cost * t - now <= burst * t {
                0
            } else {
                1
            };
            refused |= verdict != 0 && p.mode == Mode::Enforce;
            let after = base + if verdict == 0 { cost * t } else { 0 };
            verdicts.push((verdict, after, verdict == 0 && cost > 0));
        }
        let mut reply = Vec::with_capacity(1 + 3 * group.len());
        reply.push(now);
        for (n, &(verdict, after, writes)) in verdicts.iter().enumerate() {
            let after = if refused { tats[n].max(now) } else { after };
            reply.extend_from_slice(&[verdict, after - now, tats[n]]);
            if !refused && writes {
                tats[n] = after;
            }
        }
        passed += i64::from(!refused);
        out.push(reply);
    }
    let ends = r[1..].chunks_exact(2).map(|c| c[1]);
    (passed == proceeded && tats.iter().copied().eq(ends)).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::quota::Quota;

    fn part(key: &str, quota: Quota, cost: u32, mode: Mode) -> Part {
        Part {
            redis_key: key.as_bytes().to_vec(),
            quota,
            cost,
            mode,
            algorithm: Algorithm::Gcra,
            phase_us: 0,
            max_wait_us: 0,
            span: None,
            held: None,
            settle: None,
            ban: None,
        }
    }

    fn one(p: Part) -> (Vec<Part>, Vec<usize>) {
        (vec![p], vec![0])
    }

    fn view(
        rs: &[(Vec<Part>, Vec<usize>)],
    ) -> impl ExactSizeIterator<Item = (&[Part], &[usize])> + Clone {
        rs.iter().map(|(p, g)| (p.as_slice(), g.as_slice()))
    }

    const Q: Quota = Quota::per_second(10);

    #[test]
    fn requests_of_one_key_form_one_group_and_others_stay_where_they_are() {
        let rs = [
            one(part("hot", Q, 1, Mode::Enforce)),
            one(part("a", Q, 1, Mode::Enforce)),
            one(part("hot", Q, 2, Mode::Enforce)),
            one(part("b", Q, 1, Mode::Enforce)),
            one(part("hot", Q, 1, Mode::Enforce)),
        ];
        let e = entries(view(&rs));
        let e: Vec<Vec<usize>> = e.into_iter().map(|e| e.to_vec()).collect();
        assert_eq!(e, [vec![0, 2, 4], vec![1], vec![3]]);
    }

    #[test]
    fn a_request_between_on_the_same_key_closes_the_group() {
        let mut reservation = part("hot", Q, 1, Mode::Enforce);
        reservation.max_wait_us = 5;
        let rs = [
            one(part("hot", Q, 1, Mode::Enforce)),
            one(part("hot", Q, 1, Mode::Enforce)),
            one(reservation),
            one(part("hot", Q, 1, Mode::Enforce)),
            // another quota on the same key, then another mode: neither joins
            one(part("hot", Quota::per_second(20), 1, Mode::Enforce)),
            one(part("hot", Quota::per_second(20), 1, Mode::Shadow)),
        ];
        let e: Vec<Vec<usize>> = entries(view(&rs)).into_iter().map(|e| e.to_vec()).collect();
        assert_eq!(e, [vec![0, 1], vec![2], vec![3], vec![4], vec![5]]);
    }

    #[test]
    fn requests_of_several_limits_group_only_with_the_same_keys() {
        let two = |a: &str, b: &str| {
            (
                vec![part(a, Q, 1, Mode::Enforce), part(b, Q, 1, Mode::Enforce)],
                vec![0, 1],
            )
        };
        let rs = [
            two("g", "u1"),
            two("g", "u1"),
            two("g", "u2"),
            two("g", "u1"),
            one(part("u2", Q, 1, Mode::Enforce)),
            two("u2", "g"),
            two("g", "g"),
            two("g", "g"),
        ];
        let e: Vec<Vec<usize>> = entries(view(&rs)).into_iter().map(|e| e.to_vec()).collect();
        // g, u2 touched 0..1's key g: 3 starts anew; a key twice is never plain.
        assert_eq!(
            e,
            [
                vec![0, 1],
                vec![2],
                vec![3],
                vec![4],
                vec![5],
                vec![6],
                vec![7]
            ]
        );
        assert!(!plain(&rs[6].0, &rs[6].1));
        assert!(plain(&rs[0].0, &rs[0].1));
        assert!(!plain(&rs[0].0, &[]));
    }

    #[test]
    fn only_plain_gcra_checks_are_plain() {
        let ok = || part("k", Q, 1, Mode::Enforce);
        let is_plain = |p: Part| plain(&[p], &[0]);
        assert!(is_plain(ok()));
        assert!(is_plain(part("k", Q, 0, Mode::Shadow)));
        let mut p = ok();
        p.algorithm = Algorithm::fixed_window();
        assert!(!is_plain(p));
        let mut p = ok();
        p.span = Some((0, 1));
        assert!(!is_plain(p));
        let mut p = ok();
        p.held = Some((1, std::sync::Arc::from("m")));
        assert!(!is_plain(p));
        let mut p = ok();
        p.settle = Some(super::super::settle::Settle::Credit);
        assert!(!is_plain(p));
        let mut p = ok();
        p.max_wait_us = 1;
        assert!(!is_plain(p));
        let two = [ok(), part("j", Q, 1, Mode::Enforce), ok()];
        assert!(plain(&two, &[0, 1]));
        assert!(!plain(&two, &[0, 1, 2]), "k twice");
    }

    #[test]
    fn a_lone_request_is_one_entry() {
        let rs = [one(part("hot", Q, 1, Mode::Enforce))];
        assert_eq!(entries(view(&rs)).len(), 1);
        assert!(entries(view(&rs[..0])).is_empty());
    }

    /// Two requests of one key, the smallest batch that can share a step, are one group.
    #[test]
    fn two_requests_of_one_key_are_one_group() {
        let rs = [
            one(part("hot", Q, 1, Mode::Enforce)),
            one(part("hot", Q, 3, Mode::Enforce)),
        ];
        let e: Vec<Vec<usize>> = entries(view(&rs)).into_iter().map(|e| e.to_vec()).collect();
        assert_eq!(e, [vec![0, 1]]);
    }

    #[test]
    fn the_arguments_name_the_costs_once_when_all_pay_the_same() {
        let rs = [
            one(part("hot", Q, 1, Mode::Enforce)),
            one(part("hot", Q, 1, Mode::Enforce)),
        ];
        let args = |rs: &[(Vec<Part>, Vec<usize>)]| -> Vec<Vec<u8>> {
            let mut cmd = redis::cmd("X");
            push_group(&mut cmd, view(rs));
            cmd.args_iter()
                .skip(1)
                .map(|a| match a {
                    redis::Arg::Simple(b) => b.to_vec(),
                    _ => Vec::new(),
                })
                .collect()
        };
        assert_eq!(
            args(&rs),
            [&b"g"[..], b"2", b"1", b"100000", b"10", b"1", b"1"]
        );
        let rs = [
            one(part("hot", Q, 1, Mode::Shadow)),
            one(part("hot", Q, 3, Mode::Shadow)),
            one(part("hot", Q, 0, Mode::Shadow)),
        ];
        assert_eq!(
            args(&rs),
            [&b"g"[..], b"3", b"1", b"100000", b"10", b"0", b"1,3,0"]
        );
        assert_eq!(width(3), 7);
    }

    /// Burst 2 at T = 100 ms: two pass, the third is denied, a peek passes, a cost of 3 is
    /// never; a replay that ends elsewhere than the script is refused.
    #[test]
    fn a_replay_answers_as_the_script_does_alone() {
        let now = 1_000_000;
        let q = Quota::per_second(10).burst(2);
        let rs = [
            one(part("hot", q, 1, Mode::Enforce)),
            one(part("hot", q, 1, Mode::Enforce)),
            one(part("hot", q, 1, Mode::Enforce)),
            one(part("hot", q, 0, Mode::Enforce)),
            one(part("hot", q, 3, Mode::Enforce)),
        ];
        let out = expand(now, &[3, 0, now + 200_000], view(&rs)).expect("consistent");
        assert_eq!(
            out,
            [
                vec![now, 0, 100_000, 0],
                vec![now, 0, 200_000, now + 100_000],
                vec![now, 1, 200_000, now + 200_000],
                vec![now, 0, 200_000, now + 200_000],
                vec![now, 2, 200_000, now + 200_000],
            ]
        );
        assert!(expand(now, &[3, 0, now + 100_000], view(&rs)).is_none());
        assert!(expand(now, &[2, 0, now + 200_000], view(&rs)).is_none());
        assert!(expand(now, &[3, 0, now + 200_000, 0, 0], view(&rs)).is_none());
        assert!(expand(now, &[], view(&rs)).is_none());
    }

    /// Two limits, the second shadow: the first refusing consumes nothing on either, the
    /// shadow one denied refuses nothing.
    #[test]
    fn a_replay_is_all_or_nothing_and_shadow_limits_refuse_nothing() {
        let now = 5_000_000;
        let (a, b) = (
            Quota::per_second(10).burst(2),
            Quota::per_second(10).burst(1),
        );
        let req = || {
            (
                vec![
                    part("a", a, 1, Mode::Enforce),
                    part("b", b, 1, Mode::Shadow),
                ],
                vec![0, 1],
            )
        };
        let rs = [req(), req(), req()];
        let out =
            expand(now, &[2, 0, now + 200_000, 0, now + 100_000], view(&rs)).expect("consistent");
        assert_eq!(
            out,
            [
                vec![now, 0, 100_000, 0, 0, 100_000, 0],
                vec![now, 0, 200_000, now + 100_000, 1, 100_000, now + 100_000],
                vec![now, 1, 200_000, now + 200_000, 1, 100_000, now + 100_000],
            ]
        );
        // an enforced "never" refuses the request: the other limit reports as it stands
        let mut never = req();
        never.0[0].cost = 3;
        let rs = [never];
        let out = expand(now, &[0, 0, 0, 0, 0], view(&rs)).expect("consistent");
        assert_eq!(out, [vec![now, 2, 0, 0, 0, 0, 0]]);
    }

    /// A peek of an absent key writes nothing: the next request still reads it absent.
    #[test]
    fn a_peek_leaves_an_absent_key_absent() {
        let now = 1_000_000;
        let rs = [
            one(part("hot", Q, 0, Mode::Enforce)),
            one(part("hot", Q, 1, Mode::Enforce)),
        ];
        let out = expand(now, &[2, 0, now + 100_000], view(&rs)).expect("consistent");
        assert_eq!(out, [vec![now, 0, 0, 0], vec![now, 0, 100_000, 0]]);
    }
}
