//! How rounds move the slab, chosen by measurement when the broadcaster is built.
//!
//! Which of the three ways is fastest depends on the library, the network and how many
//! ranks share a core, not on the group's size alone: on one 2-core host direct sends beat
//! Open MPI's collectives at every size from 2 to 16 ranks, while on hosts with a core per
//! rank a collective's tree (its depth grows with the logarithm of the group) overtakes the
//! root's sends (one per rank) somewhere past a handful of ranks. So `build` runs
//! [`ROUNDS`] timed rounds of each way that applies (after [`WARMUP`]), each after a
//! barrier, in blocks that take turns so that a slow spell of the machine falls on every
//! way, takes the slowest rank's time of every round (one `MPI_Allreduce`), and keeps the
//! way with the lowest median, or direct sends while they are within [`MARGIN_PCT`] percent
//! of it. Every rank computes the same choice from the same reduced figures. The cost is
//! paid once: about `3 × (WARMUP + ROUNDS)` rounds and barriers (20 to 40 ms at 16
//! oversubscribed ranks on 2 cores, the difference between whole `mpirun` jobs built with
//! `LENS_MPI_TRANSFER=direct` and with the default).

use std::time::{Duration, Instant};

use lens_core::backend::slab::{SlabBroadcaster, SlabOptions};
use lens_core::{Disagreement, Error, Result, blocking};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::request::{Ranks, has_bcast_init};
use crate::transport::{Mode, Mpi};
use crate::{BACKEND, MAGIC};

/// Rounds of each way run before the timed ones (connections set up, caches warm).
pub(crate) const WARMUP: usize = 8;
/// Timed rounds of each way, run in blocks of [`BLOCK`] taking turns with the other ways.
pub(crate) const ROUNDS: usize = 64;
const BLOCK: usize = 8;
/// Direct sends are kept while their median is within this percentage of the fastest.
const MARGIN_PCT: u128 = 110;
/// Largest group in which direct sends are measured at all: past it the root's sends
/// alone take longer than a collective's tree on any network lens has seen.
pub(crate) const MEASURED_DIRECT_MAX: usize = 64;
/// Bytes of the trial payload: a carrier with a traceparent and a short tracestate.
const TRIAL_BYTES: usize = 116;

/// How an [`MpiBroadcaster`](crate::MpiBroadcaster)'s rounds move the slab
/// ([`MpiBroadcasterBuilder::transfer`](crate::MpiBroadcasterBuilder::transfer),
/// variable [`env::TRANSFER`](crate::env::TRANSFER)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transfer {
    /// The default: each way that applies is measured when the broadcaster is built and the
    /// fastest is kept (see [`MpiBroadcaster::transfer_measured`](crate::MpiBroadcaster::transfer_measured)).
    Measured,
    /// The size rule: direct sends up to
    /// [`MpiBroadcasterBuilder::direct_up_to`](crate::MpiBroadcasterBuilder::direct_up_to)
    /// ranks, else a persistent broadcast where the library has one and
    /// [`MpiBroadcasterBuilder::persistent`](crate::MpiBroadcasterBuilder::persistent)
    /// allows it, else `MPI_Ibcast`. Setting either of those selects this rule.
    BySize,
    /// The root sends the slab to every other rank itself (`MPI_Isend` / `MPI_Irecv`).
    Direct,
    /// A broadcast per root prepared once and restarted every round (`MPI_Bcast_init` or
    /// Open MPI's `MPIX_Bcast_init`); a configuration error where the library has none.
    Persistent,
    /// A fresh `MPI_Ibcast` every round.
    Ibcast,
}

impl Transfer {
    /// The value of [`env::TRANSFER`](crate::env::TRANSFER): `measured`, `by-size`,
    /// `direct`, `persistent` or `ibcast` (any case, spaces trimmed).
    pub(crate) fn parse(text: &str) -> std::result::Result<Transfer, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "measured" => Ok(Transfer::Measured),
            "by-size" => Ok(Transfer::BySize),
            "direct" => Ok(Transfer::Direct),
            "persistent" => Ok(Transfer::Persistent),
            "ibcast" => Ok(Transfer::Ibcast),
            _ => Err(format!(
                "{} must be measured, by-size, direct, persistent or ibcast, not {text:?}",
                crate::env::TRANSFER
            )),
        }
    }

    pub(crate) fn of(mode: Mode) -> Transfer {
        match mode {
            Mode::Direct => Transfer::Direct,
            Mode::Persistent => Transfer::Persistent,
            Mode::Ibcast => Transfer::Ibcast,
        }
    }
}

/// The ways worth measuring for a group of `size` ranks.
pub(crate) fn candidates(size: usize) -> Vec<Mode> {
    let mut ways = Vec::with_capacity(3);
    if size <= MEASURED_DIRECT_MAX {
        ways.push(Mode::Direct);
    }
    if has_bcast_init() {
        ways.push(Mode::Persistent);
    }
    ways.push(Mode::Ibcast);
    ways
}

/// Runs each of `ways` on a duplicate of `comm` and returns the fastest, with every way's
/// median slowest-rank round. Collective: every rank calls it with the same `ways`.
pub(crate) fn measure(
    comm: &SimpleCommunicator,
    ranks: Ranks,
    me: (usize, usize),
    opts: &SlabOptions,
    ways: &[Mode],
) -> Result<(Mode, Vec<(Transfer, Duration)>)> {
    // Ranks built with different slabs would fail the trial in ways MPI may end the job
    // for (a truncated broadcast): every rank learns of it here instead, by name.
    let size = u64::try_from(opts.slab_size).unwrap_or(u64::MAX);
    let (mut largest, mut smallest) = (0u64, 0u64);
    comm.all_reduce_into(&size, &mut largest, SystemOperation::max());
    comm.all_reduce_into(&size, &mut smallest, SystemOperation::min());
    if largest != smallest {
        return Err(Error::mismatch(
            Disagreement::SlabSize,
            format!(
                "the ranks' slabs differ, from {smallest}-byte to {largest}-byte (this rank: {size}); every rank must use the same slab size ({})",
                crate::env::SLAB_SIZE
            ),
        ));
    }
    // The trial carries no arrival gathers: only the transfer is measured.
    let opts = opts.clone().arrivals_every(0);
    let payload = [0x5a_u8; TRIAL_BYTES];
    let mine = (me.0 == 0).then_some(&payload[..]);
    let trials = ways
        .iter()
        .map(|&way| {
            let t = Mpi::new(comm.duplicate(), ranks, way);
            SlabBroadcaster::new(BACKEND, MAGIC, t, me, &opts)
        })
        .collect::<Result<Vec<_>>>()?;
    let round = |trial: &SlabBroadcaster<Mpi>| -> Result<u64> {
        barrier_within(comm, opts.timeout)?;
        let started = Instant::now();
        blocking::broadcast(trial, 0, mine)?;
        Ok(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX))
    };
    for trial in &trials {
        for _ in 0..WARMUP {
            round(trial)?;
        }
    }
    // Blocks of each way in turn, so that a slow spell of the machine falls on all of them.
    let mut times = vec![0u64; ways.len() * ROUNDS];
    for block in 0..ROUNDS / BLOCK {
        for (w, trial) in trials.iter().enumerate() {
            for k in 0..BLOCK {
                times[w * ROUNDS + block * BLOCK + k] = round(trial)?;
            }
        }
    }
    // Every rank is here (the barrier says so) before the one blocking reduce.
    barrier_within(comm, opts.timeout)?;
    let mut slowest = vec![0u64; times.len()];
    comm.all_reduce_into(&times[..], &mut slowest[..], SystemOperation::max());
    let scores: Vec<(Mode, Duration)> = ways
        .iter()
        .zip(slowest.chunks_exact_mut(ROUNDS))
        .map(|(&way, t)| {
            t.sort_unstable();
            (way, Duration::from_nanos(t[ROUNDS / 2]))
        })
        .collect();
    // Direct sends unless another way is clearly faster: they keep no library schedule,
    // and at the sizes where the ways come close the difference is noise.
    let fastest = scores.iter().map(|(_, d)| *d).min().unwrap_or_default();
    let best = scores
        .iter()
        .find(|(w, d)| *w == Mode::Direct && d.as_nanos() * 100 <= fastest.as_nanos() * MARGIN_PCT)
        .or_else(|| scores.iter().find(|(_, d)| *d == fastest))
        .map_or(Mode::Ibcast, |(w, _)| *w);
    tracing::debug!(?scores, ?best, "MPI transfer measured");
    let scores = scores
        .into_iter()
        .map(|(w, d)| (Transfer::of(w), d))
        .collect();
    Ok((best, scores))
}

/// A barrier that gives up at `timeout` (a rank that never comes) instead of hanging.
pub(crate) fn barrier_within(comm: &SimpleCommunicator, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut request = comm.immediate_barrier();
    let mut spins = 0u32;
    loop {
        match request.test() {
            Ok(_) => return Ok(()),
            Err(pending) => request = pending,
        }
        if Instant::now() >= deadline {
            // MPI cannot cancel a barrier: the request is left to the library.
            std::mem::forget(request);
            return Err(Error::timeout(timeout, Vec::new()));
        }
        spins += 1;
        if spins > 1_000 {
            std::thread::sleep(Duration::from_micros(20));
        } else {
            std::hint::spin_loop();
        }
    }
}
