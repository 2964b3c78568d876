//! Which rank came last to a round, and how far apart the ranks came: the straggler of each
//! step, written on the source's step span.
//!
//! A backend that knows when each rank entered a round (the in-process backend; TCP, whose
//! acknowledgements carry how long before each was sent its ranks came) hands the source an [`Arrivals`] through
//! [`Broadcaster::take_arrivals`](crate::Broadcaster::take_arrivals). The broadcasts of this
//! crate then put [`keys::LAST_RANK`] and [`keys::SPREAD_NS`] on the span that was current
//! on the source (the step span), and one [`keys::LATE_EVENT`] event for each rank that came
//! more than the [late threshold](set_late_threshold) after the first.
//!
//! ```
//! use lens_core::arrivals::Arrivals;
//!
//! // Rank 2 entered 5 ms after rank 0, rank 1 waited 1 ms for the data.
//! // `None` only for no ranks at all; three are given.
//! let a = Arrivals::from_times([(0, 0), (1, -1_000_000), (2, 5_000_000)]).expect("three ranks");
//! assert_eq!(a.last_rank, 2);
//! assert_eq!(a.spread_ns, 6_000_000);
//! assert_eq!(a.ranks[0], (2, 6_000_000));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::trace::SpanRef;

/// The names lens writes on the source's span.
pub mod keys {
    /// The rank that entered the round last (an integer attribute).
    pub const LAST_RANK: &str = "lens.round.last_rank";
    /// From the first rank's arrival to the last's, in nanoseconds (an integer attribute).
    pub const SPREAD_NS: &str = "lens.round.spread_ns";
    /// The event for a rank later than the threshold, with [`RANK`] and [`LATE_NS`].
    pub const LATE_EVENT: &str = "lens.round.late_rank";
    /// The late rank, on a [`LATE_EVENT`].
    pub const RANK: &str = "lens.round.rank";
    /// How long after the first rank it came, in nanoseconds, on a [`LATE_EVENT`].
    pub const LATE_NS: &str = "lens.round.late_ns";
}

/// A rank that comes more than this after the first is named in an event: 1 ms.
pub const DEFAULT_LATE_THRESHOLD: Duration = Duration::from_millis(1);

/// Events named per round at most, latest first: a step span stays small in a large job.
pub const MAX_LATE_EVENTS: usize = 16;

static LATE_THRESHOLD_NS: AtomicU64 = AtomicU64::new(1_000_000);

/// Sets, for this process, how late after the first rank a rank must come to be named in a
/// [`keys::LATE_EVENT`] event (default [`DEFAULT_LATE_THRESHOLD`]).
pub fn set_late_threshold(threshold: Duration) {
    let ns = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
    LATE_THRESHOLD_NS.store(ns, Ordering::Relaxed);
}

/// The threshold [`set_late_threshold`] set.
pub fn late_threshold() -> Duration {
    Duration::from_nanos(LATE_THRESHOLD_NS.load(Ordering::Relaxed))
}

/// How the ranks arrived at one round, on the source's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Arrivals {
    /// The rank that entered the round last.
    pub last_rank: usize,
    /// From the first rank's arrival to the last's, in nanoseconds.
    pub spread_ns: u64,
    /// Ranks with how long after the first each came (ns), latest first: every rank where
    /// the backend hears from every rank (in process, a TCP star), the latest few of each
    /// subtree in a TCP tree.
    pub ranks: Vec<(usize, u64)>,
    /// The ranks that voted to keep the step this round ended ([`crate::sample`]), where
    /// the backend carries votes ([`crate::Broadcaster::carry_vote`]).
    pub voted: Vec<usize>,
}

impl Arrivals {
    /// From each rank's arrival time in nanoseconds on any one clock (negative is fine);
    /// `None` for no ranks.
    pub fn from_times(times: impl IntoIterator<Item = (usize, i64)>) -> Option<Arrivals> {
        let mut times: Vec<(usize, i64)> = times.into_iter().collect();
        let first = times.iter().map(|&(_, t)| t).min()?;
        // Latest first; ties by rank, so the result does not depend on the order given.
        times.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let ranks: Vec<(usize, u64)> = times.iter().map(|&(r, t)| (r, t.abs_diff(first))).collect();
        let &(last_rank, spread_ns) = ranks.first()?;
        Some(Arrivals {
            last_rank,
            spread_ns,
            ranks,
            voted: Vec::new(),
        })
    }

    /// From each rank's arrival as an instant of one monotonic clock (ranks of one
    /// process); `None` for no ranks.
    pub fn from_instants(instants: impl IntoIterator<Item = (usize, Instant)>) -> Option<Arrivals> {
        let instants: Vec<(usize, Instant)> = instants.into_iter().collect();
        let first = instants.iter().map(|&(_, at)| at).min()?;
        Arrivals::from_times(instants.into_iter().map(|(r, at)| {
            let after = at.saturating_duration_since(first).as_nanos();
            (r, i64::try_from(after).unwrap_or(i64::MAX))
        }))
    }

    /// With `voted`, the ranks that voted ([`Arrivals::voted`]).
    #[must_use]
    pub fn with_voted(mut self, voted: Vec<usize>) -> Self {
        self.voted = voted;
        self
    }

    /// Writes the attributes on `span`, and an event for each rank later than `threshold`
    /// after the first (at most [`MAX_LATE_EVENTS`], latest first).
    pub fn record(&self, span: &SpanRef<'_>, threshold: Duration) {
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new(keys::LAST_RANK, as_i64(self.last_rank)));
        span.set_attribute(KeyValue::new(keys::SPREAD_NS, as_i64(self.spread_ns)));
        let threshold = u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX);
        for &(rank, late) in self
            .ranks
            .iter()
            .filter(|&&(_, late)| late > threshold)
            .take(MAX_LATE_EVENTS)
        {
            span.add_event(
                keys::LATE_EVENT,
                vec![
                    KeyValue::new(keys::RANK, as_i64(rank)),
                    KeyValue::new(keys::LATE_NS, as_i64(late)),
                ],
            );
        }
    }
}

fn as_i64(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_table() {
        // (why, times, last rank, spread, order of ranks)
        let rows: Vec<(&str, Vec<(usize, i64)>, usize, u64, Vec<usize>)> = vec![
            ("one rank", vec![(0, 7)], 0, 0, vec![0]),
            (
                "all at once: the lowest rank is named",
                vec![(2, 0), (0, 0), (1, 0)],
                0,
                0,
                vec![0, 1, 2],
            ),
            (
                "the last is named",
                vec![(0, 0), (1, 10), (2, 3)],
                1,
                10,
                vec![1, 2, 0],
            ),
            (
                "early ranks count from the first",
                vec![(0, 0), (1, -50), (2, 20)],
                2,
                70,
                vec![2, 0, 1],
            ),
            (
                "far apart",
                vec![(0, i64::MIN), (1, i64::MAX)],
                1,
                u64::MAX,
                vec![1, 0],
            ),
        ];
        for (why, times, last, spread, order) in rows {
            let a = Arrivals::from_times(times).expect(why);
            assert_eq!(a.last_rank, last, "{why}");
            assert_eq!(a.spread_ns, spread, "{why}");
            let got: Vec<usize> = a.ranks.iter().map(|&(r, _)| r).collect();
            assert_eq!(got, order, "{why}");
        }
        assert_eq!(Arrivals::from_times([]), None, "no ranks");
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(3);
        let a = Arrivals::from_instants([(1, later), (0, t0)]).expect("two ranks are given");
        assert_eq!((a.last_rank, a.spread_ns), (1, 3_000_000), "instants");
    }
}
