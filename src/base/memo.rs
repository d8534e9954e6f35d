//! [`Memo`]: a small cache, one per thread, of rendered values that repeat from one
//! response to the next. A refusal's problem body and its `RateLimit` value are the same
//! for every client of a limit told to wait the same number of seconds: under a flood of
//! refused requests, each thread renders and allocates them once, then hands out clones.
//!
//! Direct-mapped: each key has one slot, and a key that lands on a taken slot replaces
//! what was there. So a memo holds at most [`SLOTS`] values whatever the traffic, a lookup
//! is one slot compared, and a miss costs what the caller did without a memo (one render)
//! plus storing the result (for `Bytes` and header values, the first clone also makes the
//! bytes shared: one small allocation). Nothing is ever searched, grown or cleared.
//!
//! A key names its text by the address of a `&'static str` (a limit's interned name): a
//! static string never moves, changes nor goes away, so an equal address is an equal name.

use std::cell::RefCell;
use std::thread::LocalKey;

/// The most values one memo holds.
pub(crate) const SLOTS: usize = 64;

/// What a memoized value is made of: its kind (which rendering, with which options), a
/// static name and a number (a count of seconds, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoKey {
    kind: u8,
    name: usize,
    len: usize,
    n: u64,
}

impl MemoKey {
    pub(crate) fn new(kind: u8, name: &'static str, n: u64) -> Self {
        Self {
            kind,
            name: name.as_ptr() as usize,
            len: name.len(),
            n,
        }
    }

    /// A key of a name that lives as long as the process without its type saying so (a
    /// limit name interned by `base/intern.rs`, never freed): its address is its identity.
    pub(crate) fn interned(kind: u8, name: &str, n: u64) -> Self {
        Self {
            kind,
            name: name.as_ptr() as usize,
            len: name.len(),
            n,
        }
    }

    /// A key of a number alone.
    pub(crate) fn number(kind: u8, n: u64) -> Self {
        Self {
            kind,
            name: 0,
            len: 0,
            n,
        }
    }

    fn slot(&self) -> usize {
        let mixed = (self.name as u64 ^ self.n.rotate_left(32) ^ u64::from(self.kind))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> (64 - SLOTS.trailing_zeros())) as usize
    }
}

/// Up to [`SLOTS`] rendered values, by key (see the module's docs).
pub(crate) struct Memo<V> {
    slots: [Option<(MemoKey, V)>; SLOTS],
}

impl<V: Clone> Memo<V> {
    pub(crate) const fn new() -> Self {
        Self {
            slots: [const { None }; SLOTS],
        }
    }

    /// The value of `key`: a clone of the one kept, or else `render`'s, kept for next time
    /// (in place of whatever its slot held). `None` if `render` gives none (nothing kept).
    pub(crate) fn get_or_render(
        &mut self,
        key: MemoKey,
        render: impl FnOnce() -> Option<V>,
    ) -> Option<V> {
        let slot = &mut self.slots[key.slot()];
        if let Some((k, v)) = slot
            && *k == key
        {
            return Some(v.clone());
        }
        let v = render()?;
        *slot = Some((key, v.clone()));
        Some(v)
    }
}

/// [`Memo::get_or_render`] on this thread's memo `memo`; just `render` when the memo
/// cannot be reached (its thread is being torn down), never a panic.
pub(crate) fn memoized<V: Clone + 'static>(
    memo: &'static LocalKey<RefCell<Memo<V>>>,
    key: MemoKey,
    render: impl FnOnce() -> Option<V>,
) -> Option<V> {
    let mut render = Some(render);
    let kept = memo.try_with(|memo| {
        let mut memo = memo.try_borrow_mut().ok()?;
        // `render` is still here: nothing else takes it before this call.
        let render = render.take()?;
        Some(memo.get_or_render(key, render))
    });
    match (kept, render) {
        (Ok(Some(value)), _) => value,
        (_, Some(render)) => render(),
        // The memo took `render` and answered.
        (_, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_rendered_once_then_cloned() {
        let mut memo = Memo::new();
        let name: &'static str = "per-ip";
        let mut renders = 0;
        for _ in 0..3 {
            let v = memo.get_or_render(MemoKey::new(0, name, 7), || {
                renders += 1;
                Some(String::from("seven"))
            });
            assert_eq!(v.as_deref(), Some("seven"));
        }
        assert_eq!(renders, 1);
    }

    #[test]
    fn keys_differ_by_kind_name_and_number() {
        let mut memo = Memo::new();
        let (a, b): (&'static str, &'static str) = ("alpha", "beta");
        let keys = [
            MemoKey::new(0, a, 1),
            MemoKey::new(1, a, 1),
            MemoKey::new(0, b, 1),
            MemoKey::new(0, a, 2),
            // A prefix of the same static text: same address, another length.
            MemoKey::new(0, &a[..3], 1),
        ];
        for (i, &key) in keys.iter().enumerate() {
            let v = memo.get_or_render(key, || Some(i));
            assert_eq!(v, Some(i));
        }
        // Each key finds its own value (or, where two shared a slot, renders it again):
        // never another key's.
        for (i, &key) in keys.iter().enumerate() {
            assert_eq!(memo.get_or_render(key, || Some(i)), Some(i));
        }
    }

    #[test]
    fn the_memo_never_holds_more_than_its_slots() {
        let mut memo = Memo::new();
        let name: &'static str = "per-ip";
        for n in 0..10_000u64 {
            assert_eq!(
                memo.get_or_render(MemoKey::new(0, name, n), || Some(n)),
                Some(n)
            );
        }
        let held = memo.slots.iter().filter(|s| s.is_some()).count();
        assert!(held <= SLOTS, "{held}");
        // The last key is still there: found without rendering.
        assert_eq!(
            memo.get_or_render(MemoKey::new(0, name, 9_999), || None),
            Some(9_999)
        );
    }

    thread_local! {
        static MEMO: RefCell<Memo<u64>> = const { RefCell::new(Memo::new()) };
    }

    #[test]
    fn a_thread_memo_renders_once_and_answers_even_while_borrowed() {
        let key = MemoKey::new(0, "thread", 1);
        assert_eq!(memoized(&MEMO, key, || Some(1)), Some(1));
        assert_eq!(memoized(&MEMO, key, || Some(2)), Some(1), "kept");
        // A render that reaches the memo again (none does today) renders instead of
        // panicking on the second borrow.
        let other = MemoKey::new(0, "thread", 2);
        let nested = memoized(&MEMO, other, || memoized(&MEMO, key, || Some(3)));
        assert_eq!(nested, Some(3));
    }

    #[test]
    fn nothing_is_kept_when_nothing_is_rendered() {
        let mut memo: Memo<u64> = Memo::new();
        let key = MemoKey::new(0, "x", 1);
        assert_eq!(memo.get_or_render(key, || None), None);
        assert_eq!(memo.get_or_render(key, || Some(5)), Some(5));
    }
}
