//! The bench method, the same for every backend.
//!
//! - **Operations.** Each backend's baselines (`raw` first: one broadcast of the carrier's
//!   bytes on the bare transport), `lens_bytes` (lens's broadcast of those same bytes: the
//!   backend as lens drives it, no codec) and `lens` (`broadcast_context` from rank 0:
//!   inject and encode, the backend's broadcast, decode on every rank).
//! - **Interleaving.** The timed rounds are spread over [`BLOCKS`] blocks; each block runs
//!   every operation in turn, [`WARMUP`] untimed rounds first, so that a slow phase of the
//!   machine falls on all operations alike.
//! - **One sample.** Every rank waits at a barrier, then times its own call. The round's
//!   time is the slowest rank's: what a collective costs the job, since the job goes on only
//!   when every rank has the bytes.
//! - **Leaving.** After the last round every rank meets the others at the barrier once
//!   more before it returns, so that no rank exits while another's round is timed.
//! - **Statistic.** The median and the 99th percentile of those samples, in µs; `lens/raw`
//!   is the ratio of the medians.
//! - **CPU.** The process's CPU time during each operation's timed calls (from the barrier's
//!   end to the call's return; the barrier itself excluded), per rank and round: on rank 0's
//!   process, divided by the ranks it runs; with `--processes`, rank 0's and the sum over
//!   every rank's process. Where ranks wait by sleeping (the in-process and TCP groups) this
//!   is the work a round costs; MPI ranks busy-poll, so there it is close to the wall time.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use lens::{Broadcaster, blocking};
use opentelemetry::Context;

/// Blocks the timed rounds are spread over.
pub(crate) const BLOCKS: usize = 16;
/// Untimed rounds of each operation at the start of each block.
pub(crate) const WARMUP: usize = 10;
/// Longest wait at a barrier: past it a rank is taken for stuck, and the bench fails.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(60);

/// What every rank runs: the same bytes and rounds for every operation.
pub(crate) struct Plan {
    /// How many baselines come before lens (the backend's `baselines()`).
    pub(crate) baselines: usize,
    /// Timed rounds per operation.
    pub(crate) iters: usize,
    /// The carrier's bytes, which the baselines broadcast.
    pub(crate) bytes: Vec<u8>,
    /// The context lens broadcasts from rank 0 (whose carrier is `bytes`).
    pub(crate) cx: Context,
    /// Run only this operation (its index: the baselines, then [`LENS_OPS`]); the others'
    /// samples stay empty.
    pub(crate) only: Option<usize>,
}

/// One rank's part of a bench group.
pub(crate) trait BenchRank {
    /// lens's group on this rank.
    fn group(&self) -> &dyn Broadcaster;
    /// One round of baseline `i`: rank 0 sends `bytes` (the carrier of `cx`, which rank 0
    /// holds: a baseline that does a codec's work starts from it); every rank has them on
    /// return.
    fn baseline(&mut self, i: usize, bytes: &[u8], cx: &Context) -> Result<(), String>;
}

/// lens's operations, after the baselines: its broadcast of the carrier's bytes, then of
/// the context.
pub(crate) const LENS_OPS: [&str; 2] = ["lens_bytes", "lens"];

/// One group size's figures: the slowest rank's round times, per operation.
pub(crate) struct Measured {
    pub(crate) ranks: usize,
    /// The baselines in order, then [`LENS_OPS`].
    pub(crate) ops: Vec<(&'static str, Vec<f64>)>,
    /// CPU µs per rank per round of each operation, in the same order.
    pub(crate) cpu_us: Vec<f64>,
    /// Where ranks are processes: CPU µs per round summed over every rank, per operation
    /// (empty elsewhere).
    pub(crate) cpu_all_us: Vec<f64>,
}

impl Measured {
    /// Names the columns of `slowest` (from [`run_rank`] or [`on_threads`]).
    pub(crate) fn new(ranks: usize, baselines: &[&'static str], timed: Timed) -> Self {
        let names = baselines.iter().copied().chain(LENS_OPS);
        Measured {
            ranks,
            ops: names.zip(timed.times).collect(),
            cpu_us: timed.cpu_us,
            cpu_all_us: Vec::new(),
        }
    }
}

/// Round times per operation, and CPU time per rank and round per operation.
pub(crate) struct Timed {
    pub(crate) times: Vec<Vec<f64>>,
    pub(crate) cpu_us: Vec<f64>,
}

/// CPU time used so far by every thread of this process.
#[allow(unsafe_code)]
pub(crate) fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant every Linux has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Runs `plan` on this rank; `barrier` returns once every rank has reached it. Returns this
/// rank's round times in µs per operation (the baselines, then lens), and the process's CPU
/// µs per timed round of each operation (all of its threads).
pub(crate) fn run_rank(
    r: &mut dyn BenchRank,
    barrier: &mut dyn FnMut() -> Result<(), String>,
    plan: &Plan,
) -> Result<Timed, String> {
    let ops = plan.baselines + LENS_OPS.len();
    let mut times = vec![Vec::with_capacity(plan.iters); ops];
    let mut cpu = vec![Duration::ZERO; ops];
    let empty = Context::new();
    let cx = if r.group().rank() == 0 {
        &plan.cx
    } else {
        &empty
    };
    for block in 0..BLOCKS {
        let per_block = plan.iters / BLOCKS + usize::from(block < plan.iters % BLOCKS);
        if per_block == 0 {
            continue;
        }
        for (op, times) in times.iter_mut().enumerate() {
            if plan.only.is_some_and(|o| o != op) {
                continue;
            }
            for round in 0..WARMUP + per_block {
                barrier()?;
                let cpu_from = (round >= WARMUP).then(process_cpu);
                let t0 = Instant::now();
                if op < plan.baselines {
                    r.baseline(op, &plan.bytes, cx)?;
                } else if op == plan.baselines {
                    let payload = (r.group().rank() == 0).then_some(&plan.bytes[..]);
                    let got = blocking::broadcast(r.group(), 0, payload)
                        .map_err(|e| format!("lens broadcast of bytes: {e}"))?;
                    std::hint::black_box(got);
                } else {
                    let got = blocking::broadcast_context(r.group(), 0, cx)
                        .map_err(|e| format!("lens broadcast: {e}"))?;
                    std::hint::black_box(got);
                }
                let us = t0.elapsed().as_secs_f64() * 1e6;
                if let Some(from) = cpu_from {
                    cpu[op] += process_cpu().saturating_sub(from);
                    times.push(us);
                }
            }
        }
    }
    // The ranks leave together: a rank that exits (closing its sockets, ending its
    // threads) while another's last round is timed takes the CPU from it; with 512
    // processes on 2 cores that held the run's last round for 0.7 to 3 s, the whole p99
    // of its operation.
    barrier()?;
    let rounds = plan.iters.max(1) as f64;
    Ok(Timed {
        times,
        cpu_us: cpu.iter().map(|c| c.as_secs_f64() * 1e6 / rounds).collect(),
    })
}

/// Element-wise maximum of every rank's times: the slowest rank's time of each round.
pub(crate) fn slowest(per_rank: Vec<Vec<Vec<f64>>>) -> Vec<Vec<f64>> {
    let mut ranks = per_rank.into_iter();
    let mut out = ranks.next().unwrap_or_default();
    for theirs in ranks {
        for (mine, theirs) in out.iter_mut().zip(theirs) {
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m = m.max(t);
            }
        }
    }
    out
}

/// Runs `plan` with one thread per rank of an in-process group; the slowest rank's times,
/// and the process's CPU per rank (rank 0's reading over the ranks it shares the process
/// with).
pub(crate) fn on_threads<R: BenchRank + Send>(ranks: Vec<R>, plan: &Plan) -> Result<Timed, String> {
    let n = ranks.len().max(1) as f64;
    let barrier = ThreadBarrier::new(ranks.len());
    let per_rank = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|mut r| {
                let barrier = &barrier;
                s.spawn(move || {
                    let got = run_rank(&mut r, &mut || barrier.wait(BARRIER_TIMEOUT), plan);
                    if got.is_err() {
                        // Release the ranks waiting for this one.
                        barrier.abandon();
                    }
                    got
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a rank's thread panicked".to_string())?
            })
            .collect::<Vec<_>>()
    });
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for r in per_rank {
        match r {
            Ok(t) => ok.push(t),
            Err(e) => errors.push(e),
        }
    }
    // A rank's own error first, not the "another rank failed" of those it released.
    errors.sort_by_key(|e| e == ABANDONED);
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    let cpu_us = ok
        .first()
        .map(|t| t.cpu_us.iter().map(|c| c / n).collect())
        .unwrap_or_default();
    Ok(Timed {
        times: slowest(ok.into_iter().map(|t| t.times).collect()),
        cpu_us,
    })
}

const ABANDONED: &str = "another rank failed";

/// A barrier for threads that gives up: at a deadline, or when a rank abandons it.
struct ThreadBarrier {
    n: usize,
    state: Mutex<BarrierState>,
    turned: Condvar,
}

#[derive(Default)]
struct BarrierState {
    arrived: usize,
    generation: u64,
    abandoned: bool,
}

impl ThreadBarrier {
    fn new(n: usize) -> Self {
        ThreadBarrier {
            n,
            state: Mutex::new(BarrierState::default()),
            turned: Condvar::new(),
        }
    }

    fn wait(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.abandoned {
            return Err(ABANDONED.into());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.turned.notify_all();
            return Ok(());
        }
        while s.generation == generation && !s.abandoned {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                s.abandoned = true;
                self.turned.notify_all();
                return Err(format!("a rank did not reach the barrier in {timeout:?}"));
            };
            s = self
                .turned
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if s.generation != generation {
            Ok(())
        } else {
            Err(ABANDONED.into())
        }
    }

    fn abandon(&self) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .abandoned = true;
        self.turned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowest_takes_each_rounds_maximum() {
        let got = slowest(vec![
            vec![vec![1.0, 5.0], vec![2.0]],
            vec![vec![3.0, 4.0], vec![1.0]],
        ]);
        assert_eq!(got, vec![vec![3.0, 5.0], vec![2.0]]);
    }

    #[test]
    fn an_abandoned_barrier_releases_its_waiters() {
        let b = ThreadBarrier::new(3);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| b.wait(Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(50));
            b.abandon();
            assert_eq!(waiter.join().ok(), Some(Err(ABANDONED.to_string())));
        });
        let lone = ThreadBarrier::new(2);
        let t = Instant::now();
        assert!(lone.wait(Duration::from_millis(50)).is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
