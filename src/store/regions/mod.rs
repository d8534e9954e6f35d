//! One limit across regions: each region decides from its own store, and movers carry
//! unspent quota between them.
//!
//! The global quota (rate `r`, burst `B`) is split between the `n` regions ([`share`]:
//! Σ rᵢ = r, Σ Bᵢ = B); each region's store keeps its part as an ordinary bucket, which
//! that region's instances use as they would any limit ([`Regional`] puts the part in
//! each request's items). No request waits on another region.
//!
//! A [`Mover`] per region (elected through the region's store, [`Escrow::lead`]) looks at
//! the demand every interval `Δ` and moves unspent tokens of a key from its region to the
//! region refusing that key: a debit in its own store first, then a credit in the other,
//! both under one [`TransferId`] and applied once each ([`Escrow`]), so that no token is in
//! two regions at once; the credit is sent again under the same id until it lands,
//! however long a partition lasts, and the region starts no other transfer meanwhile: its
//! store keeps the transfer outstanding ([`Escrow::outstanding`]), a debit while it is
//! there takes nothing, and a mover that loses the lead mid-transfer leaves it to the next
//! leader, which finishes it before any other.
//!
//! # The bound
//!
//! Over any window of length `T`, the regions together grant at most
//!
//! ```text
//! bound(T) = B + ⌈r·T⌉ + n · (M + 1),   M = ⌈r · (Δ + 2d)⌉
//! ```
//!
//! ([`bound`], [`max_move`]): what one global bucket grants, plus the tokens of one
//! transfer per region in flight (debited at its source, which refills behind it, and
//! credited later), plus one token of rounding per region. `d` is the link's delay each
//! way as configured: it sizes a transfer so that a mover can follow a demand of the whole
//! rate; the time a transfer actually takes does not enter the bound (one transfer in
//! flight per mover, whatever it takes). A window inside a partition grants at most
//! `B + ⌈r·T⌉ + n` ([`partition_bound`]): no credit lands, each region spends what it
//! holds, and the cost is availability (a region whose demand grows refuses earlier than
//! one global bucket would). With leases, add the lease bound of each region's
//! instances; with a region's store down, that region's failure policy.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::Quota;
//! use tollgate::store::regions::{bound, MoverSettings};
//!
//! let q = Quota::per_second(1000);
//! let movers = MoverSettings::new()
//!     .interval(Duration::from_millis(100))
//!     .link_delay(Duration::from_millis(80));
//! let m = movers.max_move(q);
//! assert_eq!(m, 260);
//! // Over 10 s two regions grant at most 1.047 × what one bucket would.
//! assert_eq!(bound(q, 2, m, Duration::from_secs(10)), 11_522);
//! ```

mod escrow;
mod mover;
mod regional;
mod split;

pub use escrow::{Demand, Escrow, EscrowFuture, Ledger, Transfer, TransferId};
pub use mover::{Mover, MoverReport, MoverSettings, MoverStats};
pub use regional::Regional;
pub use split::{bound, check, max_move, partition_bound, share};
