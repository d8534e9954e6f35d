//! [`intern`]: one `&'static` copy of a string from configuration (limit names,
//! pre-rendered header values), so that the request path can copy it around without
//! touching a shared reference count.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, PoisonError};

/// The one `&'static` copy of `text`. Only for strings from configuration, never from
/// requests: the set grows with the distinct configurations the process has built, not
/// with traffic.
pub(crate) fn intern(text: &str) -> &'static str {
    static TEXTS: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);
    let mut texts = TEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = texts.get(text) {
        return known;
    }
    let leaked: &'static str = Box::leak(text.into());
    texts.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_share_one_copy() {
        let a = intern("per-ip");
        let b = intern(&String::from("per-ip"));
        assert!(std::ptr::eq(a, b));
        assert_eq!(a, "per-ip");
        assert!(!std::ptr::eq(intern("global"), a));
    }
}
