//! Where every rank's wall clock stands against one reference rank's: an offset and a bound
//! on its error, measured over the group's own broadcasts.
//!
//! For each rank `r` and each repetition, the reference broadcasts the time it sends (`t0`,
//! its clock); `r` notes when the broadcast reached it (`t1`, its clock), then broadcasts
//! `t1` and the time it sends back (`t2`); the reference notes when that arrived (`t3`). With
//! the one-way delays `d1, d2 ≥ 0` (whatever the transport and its queues), `t1 = t0 + d1 +
//! θ` and `t3 = t2 + d2 - θ`, so `θ ≈ ((t1 - t0) + (t2 - t3)) / 2` is off by at most
//! `(d1 + d2) / 2`, which is measured: `((t3 - t0) - (t2 - t1)) / 2` is the error bound.
//! Since neither delay is negative, every exchange puts `θ` between `-(t3 - t2)` and
//! `t1 - t0`; over the repetitions `θ` lies in the narrowest of these, between minus the
//! least `t3 - t2` and the least `t1 - t0`, whose midpoint is the offset and half its width
//! the bound (minimum-delay filtering, as NTP does, for each way on its own: a path whose
//! jitter never gives one exchange short delays both ways still gives each way a short
//! one). Clocks that drift apart still get an honest answer: the offset lies within its
//! bound of a value the true offset took while that rank's exchanges ran, and they run one
//! after another (`2 × repetitions` broadcasts), so that window is short. The reference
//! then broadcasts every rank's result, so every rank knows every offset.
//!
//! "Reached" is when the bytes came, not when the round returned: a relay (TCP's rank 0 in
//! another root's round, a tree's inner ranks) forwards them and waits for the ranks below
//! before it returns, which read as delay would bias the offset by half a round trip; where
//! the backend knows the instant ([`Broadcaster::received_at`]) it is used.
//!
//! No method of two one-way messages can tell a path's asymmetry from a clock offset: with
//! `d1 ≠ d2` the offset is off by `(d1 - d2) / 2`, always within the error bound. Across
//! simulated hosts (lens-tcp's `tests/hosts.rs`, a host's clock shifted by libfaketime) the
//! offset is off by at most half the asymmetry plus 100 µs (1 ms one way, 3 ms back), and
//! by at most 100 µs over a symmetric 2 ms ± 0.2 ms path.
//!
//! Cost: `repetitions × (world_size - 1) × 2 + 1` broadcasts, once (at group formation, say)
//! or at an interval the caller chooses; every rank must call it together.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::broadcaster::Broadcaster;
use crate::error::{Error, Result};
use crate::round::round;

/// One rank's wall clock against the reference rank's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// This rank's clock minus the reference clock, in nanoseconds (`lens.clock.offset_ns`).
    pub offset_ns: i64,
    /// The most the offset can be wrong by, in nanoseconds (`lens.clock.error_ns`): half the
    /// sum of the least delay seen each way (at most half the round trip of the best
    /// exchange).
    pub error_ns: u64,
}

/// The least of each way's measured delay between the reference and one rank, each on the
/// two clocks: `out = t1 - t0` (the delay there plus the offset) and `back = t3 - t2` (the
/// delay back minus the offset).
#[derive(Debug, Clone, Copy, Default)]
struct LeastDelays {
    out: Option<i128>,
    back: Option<i128>,
}

impl LeastDelays {
    /// One exchange: the reference sent at `t0`, the rank had it at `t1` and answered at
    /// `t2`, the reference had the answer at `t3` (each on its own clock).
    fn add(&mut self, t0: i128, t1: i128, t2: i128, t3: i128) {
        let least = |old: Option<i128>, new: i128| Some(old.map_or(new, |o| o.min(new)));
        self.out = least(self.out, t1 - t0);
        self.back = least(self.back, t3 - t2);
    }

    /// The midpoint of the offsets every exchange allows, and half their width; `None`
    /// before an exchange.
    fn offset(&self) -> Option<ClockOffset> {
        let (out, back) = (self.out?, self.back?);
        let offset = (out - back) / 2;
        let error = ((out + back) / 2).max(0);
        Some(ClockOffset {
            offset_ns: i64::try_from(offset).unwrap_or(if offset < 0 {
                i64::MIN
            } else {
                i64::MAX
            }),
            error_ns: u64::try_from(error).unwrap_or(u64::MAX),
        })
    }
}

/// Resource attribute keys for [`ClockOffset`].
pub mod keys {
    /// This rank's clock minus the reference clock, in nanoseconds.
    pub const OFFSET_NS: &str = "lens.clock.offset_ns";
    /// The most the offset can be wrong by, in nanoseconds.
    pub const ERROR_NS: &str = "lens.clock.error_ns";
}

/// The system's wall clock in nanoseconds since the Unix epoch.
pub fn system_now_ns() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_nanos()).unwrap_or(i128::MAX),
    }
}

/// Measures every rank's clock offset against `reference`'s, with the system's wall clock;
/// returns them all, indexed by rank (the reference's own is zero with no error).
/// Collective: every rank calls it with the same arguments.
///
/// # Errors
/// The broadcasts' errors; [`Error::Config`] for a reference outside the group or zero
/// repetitions; [`Error::Corrupt`] when a rank's reply is not what this protocol sends.
pub fn measure_clock_offsets(
    b: &dyn Broadcaster,
    reference: usize,
    repetitions: usize,
) -> Result<Vec<ClockOffset>> {
    measure_clock_offsets_with(b, reference, repetitions, &system_now_ns)
}

/// [`measure_clock_offsets`] with a clock of the caller's (nanoseconds): for tests and
/// simulations of ranks whose clocks are off.
///
/// # Errors
/// As [`measure_clock_offsets`].
pub fn measure_clock_offsets_with(
    b: &dyn Broadcaster,
    reference: usize,
    repetitions: usize,
    now: &dyn Fn() -> i128,
) -> Result<Vec<ClockOffset>> {
    futures::executor::block_on(measure_with(b, reference, repetitions, now))
}

/// [`measure_clock_offsets`] for async code, where the ranks may be tasks that one thread
/// polls (the in-process backend's): never blocks the thread.
///
/// # Errors
/// As [`measure_clock_offsets`].
pub async fn measure_clock_offsets_async(
    b: &dyn Broadcaster,
    reference: usize,
    repetitions: usize,
) -> Result<Vec<ClockOffset>> {
    measure_with(b, reference, repetitions, &system_now_ns).await
}

/// When the bytes of the round that just returned reached this rank, on `now`'s clock: a
/// relay that waited for acknowledgements after it had them returns a round trip or more
/// later, which would read as a one-way delay and bias the offset by half of it
/// ([`Broadcaster::received_at`]).
///
/// The time since the data came is taken before the clock is read: a stall between the two
/// (a preempted thread) then makes the reading late, which only widens the bound, never
/// early, which would put the data's arrival before its sending and the offset outside
/// its bound.
fn came_at(b: &dyn Broadcaster, now: &dyn Fn() -> i128) -> i128 {
    let since = b.received_at().map(|at| at.elapsed());
    let t = now();
    since.map_or(t, |d| t - i128::try_from(d.as_nanos()).unwrap_or(0))
}

async fn measure_with(
    b: &dyn Broadcaster,
    reference: usize,
    repetitions: usize,
    now: &dyn Fn() -> i128,
) -> Result<Vec<ClockOffset>> {
    let (me, n) = (b.rank(), b.world_size());
    if reference >= n {
        return Err(Error::config(format!(
            "clock reference rank {reference} is outside a group of {n}"
        )));
    }
    if repetitions == 0 {
        return Err(Error::config(
            "measuring clock offsets needs at least one repetition",
        ));
    }
    let mut least = vec![LeastDelays::default(); n];
    // Each rank's exchanges one after another: its least delays then come from a window of
    // `2 × repetitions` broadcasts, not from the whole measurement, over which clocks that
    // drift apart would move the offset (`N × repetitions × 2` broadcasts for N ranks).
    for r in (0..n).filter(|&r| r != reference) {
        for _ in 0..repetitions {
            // Out: the reference's send time.
            let t0 = now();
            let out = (me == reference).then(|| t0.to_le_bytes());
            let got = round(b, reference, out.as_ref().map(|a| &a[..])).await?;
            let t1 = came_at(b, now);
            let t0 = read_i128(&got, 0)?;
            // Back: rank r's receive and send times.
            let back = (me == r).then(|| {
                let mut v = Vec::with_capacity(32);
                v.extend_from_slice(&t1.to_le_bytes());
                v.extend_from_slice(&now().to_le_bytes());
                v
            });
            let got = round(b, r, back.as_deref()).await?;
            let t3 = came_at(b, now);
            if me == reference {
                let (t1, t2) = (read_i128(&got, 0)?, read_i128(&got, 16)?);
                least[r].add(t0, t1, t2, t3);
            }
        }
    }
    // The reference tells every rank every result.
    let table = (me == reference).then(|| {
        least
            .iter()
            .map(|l| {
                l.offset().unwrap_or(ClockOffset {
                    offset_ns: 0,
                    error_ns: 0, // the reference itself
                })
            })
            .flat_map(|c| {
                let mut e = c.offset_ns.to_le_bytes().to_vec();
                e.extend_from_slice(&c.error_ns.to_le_bytes());
                e
            })
            .collect::<Vec<u8>>()
    });
    let got = round(b, reference, table.as_deref()).await?;
    if got.len() != 16 * n {
        return Err(Error::Corrupt {
            reason: format!(
                "the clock table from rank {reference} has {} bytes, not {}",
                got.len(),
                16 * n
            ),
        });
    }
    Ok(got
        .chunks_exact(16)
        .map(|c| {
            let mut o = [0u8; 8];
            let mut e = [0u8; 8];
            o.copy_from_slice(&c[..8]);
            e.copy_from_slice(&c[8..]);
            ClockOffset {
                offset_ns: i64::from_le_bytes(o),
                error_ns: u64::from_le_bytes(e),
            }
        })
        .collect())
}

fn read_i128(bytes: &[u8], at: usize) -> Result<i128> {
    let slice = bytes.get(at..at + 16).ok_or_else(|| Error::Corrupt {
        reason: format!("a clock exchange of {} bytes is too short", bytes.len()),
    })?;
    let mut a = [0u8; 16];
    a.copy_from_slice(slice);
    Ok(i128::from_le_bytes(a))
}

/// Every rank's clock offsets, measured when the group forms and again every `every` steps:
/// call [`ClockTracker::start`] right after the group forms and [`ClockTracker::step`]
/// once per training step, on every rank (both are collectives: the steps count the same
/// on every rank, so every rank measures at the same step, whatever its clock says).
///
/// Cost: each measurement is `repetitions × (world_size − 1) × 2 + 1` broadcasts; a step
/// that does not measure costs nothing.
///
/// ```
/// use lens_core::clock::ClockTracker;
/// use lens_testkit::LocalCluster;
///
/// let ranks = LocalCluster::new(2).broadcasters();
/// let tables = lens_testkit::on_each_rank(&ranks, |b| {
///     let mut clock = ClockTracker::start(b, 0, 3, 100)?;
///     for _step in 0..250 {
///         // ... the step's work and its broadcast ...
///         clock.step(b)?;
///     }
///     Ok::<_, lens_core::Error>((clock.measurements(), clock.offsets().to_vec()))
/// });
/// for t in tables {
///     let (measured, table) = t?;
///     assert_eq!(measured, 3); // at the start, and at steps 100 and 200
///     assert_eq!(table.len(), 2);
/// }
/// # Ok::<(), lens_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClockTracker {
    reference: usize,
    repetitions: usize,
    every: u64,
    steps: u64,
    measurements: u64,
    table: Vec<ClockOffset>,
}

impl ClockTracker {
    /// Measures now against `reference` with `repetitions` exchanges per rank, and again
    /// every `every` steps (0: never again).
    ///
    /// # Errors
    /// As [`measure_clock_offsets`].
    pub fn start(
        b: &dyn Broadcaster,
        reference: usize,
        repetitions: usize,
        every: u64,
    ) -> Result<ClockTracker> {
        let table = measure_clock_offsets(b, reference, repetitions)?;
        Ok(ClockTracker {
            reference,
            repetitions,
            every,
            steps: 0,
            measurements: 1,
            table,
        })
    }

    /// One step: measures again when `every` steps have passed since the last time, and
    /// returns the new table then.
    ///
    /// # Errors
    /// As [`measure_clock_offsets`]; the last table is kept.
    pub fn step(&mut self, b: &dyn Broadcaster) -> Result<Option<&[ClockOffset]>> {
        self.steps += 1;
        if self.every == 0 || self.steps % self.every != 0 {
            return Ok(None);
        }
        self.table = measure_clock_offsets(b, self.reference, self.repetitions)?;
        self.measurements += 1;
        Ok(Some(&self.table))
    }

    /// Every rank's offset from the last measurement, indexed by rank.
    pub fn offsets(&self) -> &[ClockOffset] {
        &self.table
    }

    /// Rank `rank`'s offset from the last measurement.
    pub fn offset(&self, rank: usize) -> Option<ClockOffset> {
        self.table.get(rank).copied()
    }

    /// How many times the offsets have been measured.
    pub fn measurements(&self) -> u64 {
        self.measurements
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i128 = 1_000_000;

    #[test]
    fn each_ways_least_delay_bounds_the_offset() {
        // (why, the true offset, each exchange's delay there and back, the offset and bound
        // expected)
        let rows: &[(&str, i128, &[(i128, i128)], i64, u64)] = &[
            (
                "one symmetric exchange",
                7 * MS,
                &[(MS, MS)],
                7_000_000,
                1_000_000,
            ),
            (
                "an asymmetric path: off by half the asymmetry, within the bound",
                -2_500 * MS,
                &[(MS, 3 * MS), (2 * MS, 4 * MS)],
                -2_501_000_000,
                2_000_000,
            ),
            (
                "jitter that never gives one exchange both ways short: each way's least",
                0,
                &[
                    (MS, 14 * MS / 10),
                    (14 * MS / 10, MS),
                    (12 * MS / 10, 12 * MS / 10),
                ],
                0,
                1_000_000,
            ),
            ("no delay at all", 5, &[(0, 0)], 5, 0),
        ];
        for &(why, truth, exchanges, offset_ns, error_ns) in rows {
            let mut least = LeastDelays::default();
            for (k, &(there, back)) in (0_i128..).zip(exchanges) {
                let t0 = k * 100 * MS;
                let t1 = t0 + there + truth;
                let t2 = t1 + 50_000;
                let t3 = t2 + back - truth;
                least.add(t0, t1, t2, t3);
            }
            let got = least.offset().expect("exchanges were added");
            assert_eq!(
                got,
                ClockOffset {
                    offset_ns,
                    error_ns
                },
                "{why}"
            );
            let truth = i64::try_from(truth).expect("small");
            assert!(
                got.offset_ns.abs_diff(truth) <= got.error_ns,
                "{why}: the bound holds"
            );
        }
        assert_eq!(
            LeastDelays::default().offset(),
            None,
            "no exchange, no offset"
        );
    }
}
