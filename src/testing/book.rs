//! What a region's simulated store keeps for its movers: the demand each key met, the
//! transfers applied, the lead.

use std::collections::HashMap;
use std::time::Duration;

use crate::model::key::Key;
use crate::store::regions::Ledger;

/// How long a server remembers the transfers it applied: longer than any partition a
/// test makes.
pub(super) const LEDGER_TTL: Duration = Duration::from_secs(3600);

/// What a region's server keeps for its movers: the demand each key met (counted per
/// mover interval), the transfers applied, the lead.
pub(super) struct Escrowed {
    /// The length of a demand window in ns; 0 while the server is no region's.
    pub(super) window: u64,
    pub(super) book: HashMap<(String, Key), Seen>,
    pub(super) ledger: Ledger,
    pub(super) lead: Option<(String, u64)>,
    /// The movers' calls that reached the server.
    pub(super) calls: u64,
}

/// Grants and refusals of one key: the current window's and the previous one's.
#[derive(Default)]
pub(super) struct Seen {
    window: u64,
    pub(super) now: (u64, u64),
    pub(super) before: (u64, u64),
}

impl Seen {
    pub(super) fn roll(&mut self, window: u64) {
        if window == self.window.saturating_add(1) {
            self.before = self.now;
        } else if window != self.window {
            self.before = (0, 0);
        }
        if window != self.window {
            self.now = (0, 0);
            self.window = window;
        }
    }
}

impl Escrowed {
    pub(super) fn new() -> Self {
        Self {
            window: 0,
            book: HashMap::new(),
            ledger: Ledger::new(LEDGER_TTL),
            lead: None,
            calls: 0,
        }
    }

    /// Counts the instances' checks (grants and refusals per key), while a region's.
    pub(super) fn record<'a>(
        &mut self,
        checks: impl Iterator<Item = (&'a str, &'a Key, u32, bool)>,
        now: u64,
    ) {
        if self.window == 0 {
            return;
        }
        let window = now / self.window;
        for (table, key, cost, allowed) in checks {
            if cost == 0 {
                continue;
            }
            let seen = self
                .book
                .entry((table.to_owned(), key.clone()))
                .or_default();
            seen.roll(window);
            if allowed {
                seen.now.0 += 1;
            } else {
                seen.now.1 += 1;
            }
        }
    }
}
