//! Busy-polling before a round's wait sleeps.
//!
//! A rank that sleeps in epoll until a frame comes pays the wake-up after it came: on a
//! 2-core VM a round of two ranks (data, then its ack: two wake-ups) took 75-100 µs asleep
//! and 37-52 µs when each wait first polled without sleeping for up to 100 µs
//! (`lens-py/bench/latency.py`, `raw_tcp`; lens-py/README.md). So a round's waits poll for
//! up to a budget first, as MPI libraries do.
//!
//! Polling costs the CPU it runs on, which only pays when no other rank wants that core
//! and the frame comes within the budget. So a group polls only where its ranks on a host
//! are no more than the CPUs each may use (the launcher's local world size; the whole
//! group when none is given), as MPI libraries stop polling on an oversubscribed host:
//! with more ranks than cores a polling rank takes the core the rank it waits for needs
//! (`lens bench --processes`, 4-64 processes on 2 cores: lens/raw 1.13-1.24 asleep,
//! 1.55-2.04 with every rank polling for 50 µs). And a rank whose waits are long (a member waiting for a slow
//! source) stops polling: each wait that outlasts twice the budget takes a point, one that
//! does not restores them all, and with no point left the waits sleep at once. Waits are
//! still timed then, so a rank whose frames come quickly again polls again.
//!
//! The system's count of runnable tasks (`/proc/loadavg`) was tried as the test of a free
//! core and dropped: two Python ranks with their gloo threads showed 2-5 runnable tasks at a
//! round's start on 2 cores, where polling still halved the round.

use std::time::Duration;

/// Points a rank holds while its waits end soon: after this many long waits in a row it
/// stops polling.
const POINTS: u8 = 4;

#[derive(Debug)]
pub(crate) struct Spin {
    budget: Duration,
    /// Set while a round runs: only a round's waits poll (not the join's, not the keeper's).
    armed: bool,
    points: u8,
}

impl Spin {
    /// `budget` per wait; zero where the host has more of the group's ranks than CPUs.
    pub(crate) fn new(budget: Duration) -> Spin {
        Spin {
            budget,
            armed: false,
            points: POINTS,
        }
    }

    /// A round begins (`true`) or ends.
    pub(crate) fn arm(&mut self, on: bool) {
        self.armed = on;
    }

    /// Whether waits are timed at all (a round runs and polling is configured).
    pub(super) fn active(&self) -> bool {
        self.armed && !self.budget.is_zero()
    }

    /// How long a wait of at most `timeout` (`None`: no limit) polls before it sleeps.
    pub(super) fn allowance(&self, timeout: Option<Duration>) -> Duration {
        if !self.active() || self.points == 0 {
            return Duration::ZERO;
        }
        timeout.map_or(self.budget, |t| t.min(self.budget))
    }

    /// A wait ended after `waited`, with something to read (`ready`) or not. One that ended
    /// empty early (its timeout was short: a deadline, a reconnection) says nothing.
    pub(super) fn record(&mut self, waited: Duration, ready: bool) {
        if !self.active() {
            return;
        }
        let long = waited > self.budget.saturating_mul(2);
        if ready && !long {
            self.points = POINTS;
        } else if long {
            self.points = self.points.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(50);

    /// One row: the waits a rank saw (µs, and whether something came), then how long its
    /// next wait of no limit polls.
    struct Row {
        why: &'static str,
        waits: &'static [(u64, bool)],
        polls_us: u64,
    }

    #[test]
    fn a_rank_polls_while_its_waits_end_soon_and_stops_after_long_ones() {
        let rows = [
            Row {
                why: "a fresh rank polls for the budget",
                waits: &[],
                polls_us: 50,
            },
            Row {
                why: "three long waits leave a point",
                waits: &[(5_000, true), (5_000, true), (5_000, true)],
                polls_us: 50,
            },
            Row {
                why: "four long waits in a row: no more polling",
                waits: &[(5_000, true), (5_000, true), (5_000, true), (5_000, true)],
                polls_us: 0,
            },
            Row {
                why: "a wait that ended soon restores every point",
                waits: &[
                    (5_000, true),
                    (5_000, true),
                    (5_000, true),
                    (30, true),
                    (5_000, true),
                ],
                polls_us: 50,
            },
            Row {
                why: "a sleeping rank whose frame came within twice the budget polls again",
                waits: &[
                    (900, true),
                    (900, true),
                    (900, true),
                    (900, true),
                    (90, true),
                ],
                polls_us: 50,
            },
            Row {
                why: "a wait cut short by its timeout, empty, says nothing",
                waits: &[(5_000, true), (5_000, true), (5_000, true), (10, false)],
                polls_us: 50,
            },
            Row {
                why: "an empty wait that ran long counts against",
                waits: &[
                    (5_000, false),
                    (5_000, false),
                    (5_000, false),
                    (5_000, false),
                ],
                polls_us: 0,
            },
        ];
        for row in rows {
            let mut s = armed(BUDGET);
            for &(us, ready) in row.waits {
                s.record(Duration::from_micros(us), ready);
            }
            assert_eq!(
                s.allowance(None),
                Duration::from_micros(row.polls_us),
                "{}",
                row.why
            );
        }
    }

    /// A spin armed for a round.
    fn armed(budget: Duration) -> Spin {
        let mut s = Spin::new(budget);
        s.arm(true);
        s
    }

    #[test]
    fn polling_is_bounded_by_the_timeout_and_off_outside_a_round_or_at_zero() {
        let mut s = armed(BUDGET);
        s.arm(false);
        assert_eq!(
            s.allowance(None),
            Duration::ZERO,
            "not armed: the join, the keeper"
        );
        s.arm(true);
        assert_eq!(
            s.allowance(Some(Duration::from_micros(20))),
            Duration::from_micros(20),
            "a wait polls no longer than its own timeout"
        );
        s.arm(false);
        s.record(Duration::from_secs(1), true);
        s.arm(true);
        assert_eq!(
            s.allowance(None),
            BUDGET,
            "waits outside a round are not counted"
        );
        let off = armed(Duration::ZERO);
        assert_eq!(
            off.allowance(None),
            Duration::ZERO,
            "a budget of 0 never polls"
        );
    }
}
