//! Responses held until their logged duration has passed (in-flight limits): a min-heap
//! of end times, at most `max` held; past that, the one ending first is let go early.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// The responses a replay holds, by end time (nanoseconds on the replay's clock).
pub(super) struct Held<B> {
    heap: BinaryHeap<Holding<B>>,
    max: usize,
    /// Order of arrival: equal ends are let go first come, first served.
    next: u64,
    /// The most held at once.
    pub(super) most: usize,
    /// Held responses let go before their end because `max` were held.
    pub(super) released_early: u64,
}

struct Holding<B> {
    end: u64,
    seq: u64,
    body: B,
}

impl<B> PartialEq for Holding<B> {
    fn eq(&self, other: &Self) -> bool {
        (self.end, self.seq) == (other.end, other.seq)
    }
}

impl<B> Eq for Holding<B> {}

impl<B> PartialOrd for Holding<B> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Reversed: the heap's top is the earliest end.
impl<B> Ord for Holding<B> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.end, other.seq).cmp(&(self.end, self.seq))
    }
}

impl<B> Held<B> {
    /// At most `max` held at once.
    pub(super) fn new(max: usize) -> Self {
        Self {
            heap: BinaryHeap::new(),
            max,
            next: 0,
            most: 0,
            released_early: 0,
        }
    }

    /// Holds `body` until `end`; if `max` are held already, the one that ends first
    /// (`body` itself, with `max` 0) is given back to be let go now.
    pub(super) fn hold(&mut self, end: u64, body: B) -> Option<B> {
        if self.max == 0 {
            self.released_early += 1;
            return Some(body);
        }
        let early = if self.heap.len() >= self.max {
            self.released_early += 1;
            self.heap.pop().map(|h| h.body)
        } else {
            None
        };
        self.heap.push(Holding {
            end,
            seq: self.next,
            body,
        });
        self.next += 1;
        self.most = self.most.max(self.heap.len());
        early
    }

    /// The held response that ends first, with its end, if it ends by `now`
    /// (`u64::MAX`: whatever is held).
    pub(super) fn due(&mut self, now: u64) -> Option<(u64, B)> {
        if self.heap.peek()?.end > now {
            return None;
        }
        self.heap.pop().map(|h| (h.end, h.body))
    }

    /// How many are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_end_in_order_of_their_ends_then_of_arrival() {
        let mut held = Held::new(10);
        for (end, name) in [(30, "c"), (10, "a"), (20, "b1"), (20, "b2")] {
            assert!(held.hold(end, name).is_none());
        }
        assert_eq!(held.due(5), None);
        assert_eq!(held.due(20), Some((10, "a")));
        assert_eq!(held.due(20), Some((20, "b1")));
        assert_eq!(held.due(20), Some((20, "b2")));
        assert_eq!(held.due(29), None);
        assert_eq!((held.len(), held.most), (1, 4));
        assert_eq!(held.due(u64::MAX), Some((30, "c")));
        assert_eq!(held.due(u64::MAX), None);
        assert_eq!(held.released_early, 0);
    }

    #[test]
    fn past_the_cap_the_first_to_end_is_let_go_early() {
        let mut held = Held::new(2);
        assert!(held.hold(50, "x").is_none());
        assert!(held.hold(40, "y").is_none());
        assert_eq!(held.hold(60, "z"), Some("y"));
        assert_eq!((held.len(), held.most, held.released_early), (2, 2, 1));
        assert_eq!(held.due(u64::MAX), Some((50, "x")));
        let mut none = Held::new(0);
        assert_eq!(none.hold(1, "w"), Some("w"));
        assert_eq!((none.len(), none.released_early), (0, 1));
    }
}
