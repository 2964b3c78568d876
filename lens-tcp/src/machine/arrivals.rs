//! When the ranks of a subtree came to a round, as acks carry it: durations on each rank's
//! own monotonic clock, so no rank needs another's clock.

use std::time::{Duration, Instant};

use crate::message::{Came, MAX_ARRIVALS};

/// How long before `later` the instant `at` was, in ns (negative when it was after).
pub(super) fn ns_between(at: Instant, later: Instant) -> i64 {
    let before = later.saturating_duration_since(at).as_nanos();
    let after = at.saturating_duration_since(later).as_nanos();
    i64::try_from(before).unwrap_or(i64::MAX) - i64::try_from(after).unwrap_or(i64::MAX)
}

/// The instant `before` ns before `now` (after it, for a negative `before`), as near as
/// the clock can say.
pub(super) fn shift(now: Instant, before: i64) -> Instant {
    let d = Duration::from_nanos(before.unsigned_abs());
    if before >= 0 {
        now.checked_sub(d).unwrap_or(now)
    } else {
        now.checked_add(d).unwrap_or(now)
    }
}

/// A rank of this rank's subtree came to the round at `at` (this rank's clock), shown to
/// the root as `shown` (itself, or the rank it stands for).
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrived {
    pub rank: usize,
    pub shown: usize,
    pub at: Instant,
}

impl Arrived {
    /// As an ack sent at `now` carries it.
    pub(super) fn before(self, now: Instant) -> Came {
        Came {
            rank: self.rank,
            ns: ns_between(self.at, now),
            shown: self.shown,
        }
    }

    /// As an ack received at `now` says it.
    pub(super) fn heard(c: &Came, now: Instant) -> Arrived {
        Arrived {
            rank: c.rank,
            shown: c.shown,
            at: shift(now, c.ns),
        }
    }
}

/// What an ACK carries of its subtree's arrivals (each in ns before the ack): the latest
/// ones and the earliest, at most [`MAX_ARRIVALS`] (a star's ack carries its own rank's).
pub(super) fn few_arrivals(mut all: Vec<Came>) -> Vec<Came> {
    if all.len() <= MAX_ARRIVALS {
        return all;
    }
    // Latest first: the fewest ns before the ack.
    all.sort_unstable_by(|a, b| a.ns.cmp(&b.ns).then(a.rank.cmp(&b.rank)));
    let earliest = all[all.len() - 1];
    all.truncate(MAX_ARRIVALS - 1);
    all.push(earliest);
    all
}
