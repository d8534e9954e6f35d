//! The replay's parsed paths, remembered: a log names the same few paths again and again,
//! and a path parsed once is a reference count after that. Bounded: when it holds
//! [`MAX_URIS`] paths it starts afresh.

use http::Uri;

/// The most paths remembered.
pub(super) const MAX_URIS: usize = 4096;

#[derive(Default)]
pub(super) struct Uris {
    map: hashbrown::HashMap<Box<str>, Uri, foldhash::fast::RandomState>,
}

impl Uris {
    /// `path` as a URI, or `None` if it is not one.
    pub(super) fn get(&mut self, path: &str) -> Option<Uri> {
        if let Some(uri) = self.map.get(path) {
            return Some(uri.clone());
        }
        let uri = Uri::try_from(path).ok()?;
        if self.map.len() >= MAX_URIS {
            self.map.clear();
        }
        self.map.insert(path.into(), uri.clone());
        Some(uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_parsed_once_and_the_memory_is_bounded() {
        let mut uris = Uris::default();
        let a = uris.get("/items/1?x=2").unwrap();
        assert_eq!((a.path(), a.query()), ("/items/1", Some("x=2")));
        assert_eq!(uris.get("/items/1?x=2").unwrap(), a);
        assert_eq!(uris.map.len(), 1);
        assert!(uris.get("/bad path").is_none());
        assert_eq!(uris.map.len(), 1, "a bad path is not remembered");
        for i in 0..MAX_URIS + 10 {
            assert_eq!(uris.get(&format!("/{i}")).unwrap().path(), format!("/{i}"));
            assert!(uris.map.len() <= MAX_URIS);
        }
        // 4,095 filled it with the first path; the next started afresh, and 10 followed.
        assert_eq!(uris.map.len(), 11);
    }
}
