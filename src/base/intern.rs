//! [`intern`]: one `&'static` copy of a string from configuration (limit names,
//! pre-rendered header values), so that the request path can copy it around without
//! touching a shared reference count.
//!
//! An interned string lives as long as the process: decisions, audit records and the
//! limiter's names hand it out as `&'static str`. So that rules reloaded forever with new
//! names cannot grow the process without end, the copies are bounded by
//! [`INTERN_BUDGET`] bytes over the process's life; past it, [`intern`] answers `None`
//! and the caller refuses the configuration (a name) or does without the copy (a
//! pre-rendered header value, then rendered per response).

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, PoisonError};

/// The most bytes of distinct strings interned over the process's life: 16 MiB, some
/// 500,000 limit names of 32 bytes. Configuration that keeps its names (a reload that
/// changes quotas, a database table whose rules keep their ids) interns nothing new.
pub(crate) const INTERN_BUDGET: usize = 16 << 20;

struct Interned {
    texts: HashSet<&'static str>,
    bytes: usize,
}

/// The one `&'static` copy of `text`, or `None` if copying it would go past
/// [`INTERN_BUDGET`]. Only for strings from configuration, never from requests: the set
/// grows with the distinct configurations the process has built, not with traffic.
pub(crate) fn intern(text: &str) -> Option<&'static str> {
    intern_within(text, INTERN_BUDGET)
}

fn intern_within(text: &str, budget: usize) -> Option<&'static str> {
    static TEXTS: LazyLock<Mutex<Interned>> = LazyLock::new(|| {
        Mutex::new(Interned {
            texts: HashSet::new(),
            bytes: 0,
        })
    });
    let mut interned = TEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = interned.texts.get(text) {
        return Some(known);
    }
    // The copy and its place in the set.
    let cost = text.len() + 2 * size_of::<&str>();
    if interned.bytes + cost > budget {
        return None;
    }
    let leaked: &'static str = Box::leak(text.into());
    interned.texts.insert(leaked);
    interned.bytes += cost;
    Some(leaked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_one_copy() {
        let a = intern("per-ip").unwrap();
        let b = intern(&String::from("per-ip")).unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a, "per-ip");
        assert!(!std::ptr::eq(intern("global").unwrap(), a));
    }

    #[test]
    fn interning_new_names_forever_stops_at_the_budget_not_at_the_memory() {
        let known = intern("a-known-name").unwrap();
        // Nothing new fits in one byte of budget...
        assert_eq!(intern_within("a-name-never-seen-before-7f3a", 1), None);
        assert_eq!(intern_within("a-name-never-seen-before-7f3a", 1), None);
        // ...but a string already interned is still found, whatever the budget.
        assert!(std::ptr::eq(
            intern_within("a-known-name", 1).unwrap(),
            known
        ));
    }
}
