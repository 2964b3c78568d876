//! The slab round of collective backends (MPI, NCCL): a fixed-size slab with a length
//! header goes in **one** collective; a payload longer than the slab sends its remainder in
//! a second collective that every rank sizes from the header.
//!
//! A backend implements [`SlabTransport`] (one collective of a buffer from a root, finished
//! by a deadline) and wraps it in a [`SlabBroadcaster`], which is a [`Broadcaster`]: it checks the
//! arguments, runs the round, and after any failure part-way (a timeout, a foreign or
//! mismatched header, a transport error) stops the transport once and refuses every later
//! round with [`Error::Closed`], since this rank is then out of step with its peers. A
//! round that times out first asks the transport which ranks are missing
//! ([`SlabTransport::roll_call`]), where it can tell (MPI can; NCCL cannot).

mod format;
mod options;

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use format::{HEADER_LEN, SlabFormat};
pub use options::{
    DEFAULT_ROUND_TIMEOUT, DEFAULT_SLAB_SIZE, MAX_SLAB_BYTES, SlabOptions, SlabVars,
};

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::arrivals::Arrivals;
use crate::backend::check_broadcast_args;
use crate::broadcaster::Broadcaster;
use crate::error::{Error, Result};

/// Bytes a receiver allocates for its output before the collective; a longer payload
/// grows it once its length is known.
const PREALLOCATE: usize = 1024;

/// One round's root and deadline, handed to the transport.
///
/// The clock is read when a transport first asks about the deadline (as its wait begins),
/// not when the round is made: a round that completes without waiting, as most do in a
/// few microseconds, then reads no clock at all (a 1-rank slab round went from 84 to 55 ns
/// without it: `cargo bench -p lens-core --bench round`). The deadline thus counts from the start of the wait, at most microseconds
/// after the call.
#[derive(Debug, Clone)]
pub struct Round {
    /// The rank whose bytes are broadcast.
    pub root: usize,
    timeout: Duration,
    started: Cell<Option<Instant>>,
}

impl Round {
    /// A round from `root` that must be done within `timeout` of its start.
    pub fn new(root: usize, timeout: Duration) -> Self {
        Round {
            root,
            timeout,
            started: Cell::new(None),
        }
    }

    /// When the round started: the first time this or [`Round::deadline`],
    /// [`Round::expired`] or [`Round::expired_at`] was called.
    pub fn started(&self) -> Instant {
        self.started_at(Instant::now())
    }

    fn started_at(&self, now: Instant) -> Instant {
        match self.started.get() {
            Some(t) => t,
            None => {
                self.started.set(Some(now));
                now
            }
        }
    }

    /// When the round must be done.
    pub fn deadline(&self) -> Instant {
        self.started() + self.timeout
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        self.expired_at(Instant::now())
    }

    /// Whether the deadline has passed at `now` (a reading the caller already has).
    pub fn expired_at(&self, now: Instant) -> bool {
        now >= self.started_at(now) + self.timeout
    }

    /// The error of a round that missed its deadline. A collective cannot tell which ranks
    /// are missing, so none are named (the slab group then asks
    /// [`SlabTransport::roll_call`]).
    pub fn timed_out(&self) -> Error {
        Error::timeout(self.started().elapsed(), Vec::new())
    }
}

/// The slab of a round: `slab_size` bytes that the group fills (on the root) or reads (on
/// every rank) and the transport broadcasts. It dereferences to those bytes; a transport
/// that hands MPI a buffer of its own may [`Slab::exchange`] it with the slab's instead of
/// copying the bytes in and out.
#[derive(Debug)]
pub struct Slab(Vec<u8>);

impl Slab {
    fn new(len: usize) -> Self {
        Slab(vec![0u8; len])
    }

    /// Swaps the slab's bytes with `buf`'s, when both are as long (else `false`, and nothing
    /// changes). No bytes are copied: the two allocations change hands.
    #[must_use]
    pub fn exchange(&mut self, buf: &mut Box<[u8]>) -> bool {
        if buf.len() != self.0.len() {
            return false;
        }
        let mine = std::mem::take(&mut self.0).into_boxed_slice();
        self.0 = std::mem::replace(buf, mine).into_vec();
        true
    }
}

impl std::ops::Deref for Slab {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Slab {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// One collective transport: broadcasts a buffer from a root, in place, by a deadline.
pub trait SlabTransport: Send {
    /// Broadcasts `slab` (the whole slab) from `round.root`. On the root, `sent` is how many
    /// leading bytes carry data (the header and the payload's first part; the rest may be
    /// left out); elsewhere it is `None`. On return `slab` holds the root's bytes on every
    /// rank, at least the first `sent` of them.
    ///
    /// # Errors
    /// [`Round::timed_out`] past the deadline; the transport's failure otherwise.
    fn broadcast_slab(&mut self, round: &Round, slab: &mut Slab, sent: Option<usize>)
    -> Result<()>;

    /// Broadcasts `rest` (the payload after the slab) from `round.root`: on the root it
    /// holds the bytes, elsewhere a buffer of the announced length to fill.
    ///
    /// # Errors
    /// As [`SlabTransport::broadcast_slab`].
    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> Result<()>;

    /// Called once, after the round that left this rank out of step with its peers: abort
    /// the communicator, say, so that nothing of this rank waits on them any more.
    fn stop(&mut self) {}

    /// Gathers one number from every rank at `round.root`: there, every rank's value
    /// indexed by rank; elsewhere an empty list. `Ok(None)`, the default, where the
    /// transport has no gather ([`SlabOptions::arrivals_every`] then reports nothing).
    ///
    /// # Errors
    /// As [`SlabTransport::broadcast_slab`].
    fn gather_i64(&mut self, round: &Round, value: i64) -> Result<Option<Vec<i64>>> {
        let _ = (round, value);
        Ok(None)
    }

    /// Called once, after a round (the `round`-th this rank started) timed out without
    /// naming the missing ranks, as a collective cannot: which ranks are still here, asked
    /// by a means apart from the stuck collective, within about `wait`. `None`, the
    /// default, where the transport cannot ask (the timeout then names no rank).
    fn roll_call(&mut self, round: u64, wait: Duration) -> Option<RollCall> {
        let _ = (round, wait);
        None
    }
}

/// What a [`SlabTransport::roll_call`] found: the ranks that did not answer, and how this
/// rank knows (they become the timeout's `missing` and `via`, see [`Error::Timeout`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RollCall {
    /// The ranks that did not answer: the root cause of the timeout.
    pub missing: Vec<usize>,
    /// The ranks this rank heard it through, nearest first (empty: this rank asked itself).
    pub via: Vec<usize>,
}

impl RollCall {
    /// `missing` ranks, heard through `via`.
    pub fn new(missing: Vec<usize>, via: Vec<usize>) -> Self {
        RollCall { missing, via }
    }
}

struct State<T> {
    transport: T,
    slab: Slab,
    broken: Option<String>,
    /// Rounds started, for hang reports.
    rounds: u64,
    /// How the ranks came to the last round this rank was the root of, where gathered.
    arrivals: Option<Arrivals>,
}

/// A [`Broadcaster`] over a [`SlabTransport`]: the slab round, its deadline and the refusal
/// after a failure, written once for every collective backend.
pub struct SlabBroadcaster<T> {
    state: Mutex<State<T>>,
    backend: &'static str,
    format: SlabFormat,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    arrivals_every: u64,
    /// This rank's clock minus the reference clock, taken off its arrival times.
    clock_offset_ns: AtomicI64,
    /// This rank's vote (the step sampler's), for its next round's gather.
    vote: AtomicBool,
}

impl<T> std::fmt::Debug for SlabBroadcaster<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabBroadcaster")
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("slab_size", &self.format.slab_size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<T: SlabTransport> SlabBroadcaster<T> {
    /// Rank `rank` of `world_size` over `transport`; `magic` marks this backend's slabs.
    ///
    /// # Errors
    /// [`Error::Config`] for bad options ([`SlabOptions::check`]) or a rank outside the group.
    pub fn new(
        backend: &'static str,
        magic: [u8; 4],
        transport: T,
        (rank, world_size): (usize, usize),
        opts: &SlabOptions,
    ) -> Result<Self> {
        opts.check(backend)?;
        if rank >= world_size {
            return Err(Error::config(format!(
                "rank {rank} is outside a group of {world_size}"
            )));
        }
        Ok(SlabBroadcaster {
            state: Mutex::new(State {
                transport,
                slab: Slab::new(opts.slab_size),
                broken: None,
                rounds: 0,
                arrivals: None,
            }),
            backend,
            format: SlabFormat {
                magic,
                slab_size: opts.slab_size,
                max_payload: opts.max_payload,
            },
            rank,
            world_size,
            timeout: opts.timeout,
            arrivals_every: opts.arrivals_every,
            clock_offset_ns: AtomicI64::new(0),
            vote: AtomicBool::new(false),
        })
    }

    /// This rank's measured clock offset (`lens_core::clock`), taken off the arrival times
    /// it sends ([`SlabOptions::arrivals_every`]), so that ranks on hosts whose clocks
    /// differ are compared on the reference's clock.
    pub fn set_clock_offset(&self, offset_ns: i64) {
        self.clock_offset_ns.store(offset_ns, Ordering::Relaxed);
    }

    /// The slab size in bytes, header included.
    pub fn slab_size(&self) -> usize {
        self.format.slab_size
    }

    /// Payload bytes that travel in the first collective.
    pub fn slab_capacity(&self) -> usize {
        self.format.capacity()
    }

    /// The deadline of a round.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the transport as one round from `root` (a raw baseline, say): refused
    /// with [`Error::Closed`] once the group is broken, and a failure breaks it.
    ///
    /// # Errors
    /// [`Error::Closed`], or `f`'s error.
    pub fn exclusive<R>(
        &self,
        root: usize,
        f: impl FnOnce(&mut T, &Round) -> Result<R>,
    ) -> Result<R> {
        self.locked(root, |t, _, round| f(t, round))
    }

    fn locked<R>(
        &self,
        root: usize,
        f: impl FnOnce(&mut T, &mut Slab, &Round) -> Result<R>,
    ) -> Result<R> {
        self.locked_as(root, true, f)
    }

    /// [`SlabBroadcaster::locked`]; `counted`: whether it is a round of the caller's (an
    /// arrivals gather is not).
    fn locked_as<R>(
        &self,
        root: usize,
        counted: bool,
        f: impl FnOnce(&mut T, &mut Slab, &Round) -> Result<R>,
    ) -> Result<R> {
        let mut state = self.state();
        let State {
            transport,
            slab,
            broken,
            rounds,
            ..
        } = &mut *state;
        if counted {
            *rounds += 1;
        }
        if let Some(why) = broken {
            return Err(Error::Closed {
                backend: self.backend,
                reason: why.clone(),
            });
        }
        let round = Round::new(root, self.timeout);
        let timeout = self.timeout;
        let result = f(transport, slab, &round).map_err(|mut e| {
            // The collective cannot say who is missing: the transport may find out.
            if let Error::Timeout { missing, via, .. } = &mut e
                && missing.is_empty()
                && let Some(call) = transport.roll_call(*rounds, timeout)
            {
                *missing = call.missing;
                *via = call.via;
            }
            e
        });
        if let Err(e) = &result {
            *broken = Some(format!(
                "an earlier round failed ({e}), and this rank is out of step with its peers"
            ));
            transport.stop();
        }
        result
    }

    /// One round, on the calling thread: the body of both [`Broadcaster::broadcast`] and
    /// [`Broadcaster::broadcast_sync`], for a backend's broadcaster that wraps this one
    /// (its error as it is: the lens-core call that runs the wrapper's round reports a
    /// timeout, once).
    ///
    /// # Errors
    /// As [`Broadcaster::broadcast`]; [`Error::Closed`] after a failed round.
    pub fn round(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        if self.arrivals_every > 0 {
            return self.round_with_arrivals(root, payload);
        }
        self.round_only(root, payload)
    }

    /// A round, then, every [`SlabOptions::arrivals_every`] rounds, a gather of when each
    /// rank came to it (its wall clock, so ranks on other hosts need synchronised clocks
    /// or the spread includes their offsets) to the root.
    fn round_with_arrivals(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let entered = crate::clock::system_now_ns();
        let out = self.round_only(root, payload)?;
        let due = self.state().rounds % self.arrivals_every == 0;
        if due {
            let offset = i128::from(self.clock_offset_ns.load(Ordering::Relaxed));
            let entered = i64::try_from(entered - offset).unwrap_or(i64::MAX);
            // The lowest bit carries the rank's vote: a nanosecond of the entry time.
            let vote = i64::from(self.vote.swap(false, Ordering::Relaxed));
            let value = (entered & !1) | vote;
            let got = self.locked_as(root, false, |t, _, round| t.gather_i64(round, value))?;
            if let Some(times) = got.filter(|_| self.rank == root) {
                let voted = (times.iter().enumerate())
                    .filter(|(_, t)| *t & 1 == 1)
                    .map(|(r, _)| r)
                    .collect();
                let arrivals = Arrivals::from_times(times.into_iter().enumerate())
                    .map(|a| a.with_voted(voted));
                self.state().arrivals = arrivals;
            }
        }
        Ok(out)
    }

    fn round_only(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let format = self.format;
        let cap = format.capacity();
        self.locked(root, |t, slab, round| {
            let sent = payload.map(|p| HEADER_LEN + format.fill(slab, p));
            if sent.is_none() {
                // No stale header of an earlier round can pass for this one's.
                slab[..HEADER_LEN].fill(0);
            }
            // The output is allocated where it is off the round's critical path: by a
            // receiver before the collective (it waits for the root anyway), by the root
            // after (its bytes are on their way).
            let mut out = match payload {
                None => Vec::with_capacity(cap.min(PREALLOCATE)),
                Some(_) => Vec::new(),
            };
            t.broadcast_slab(round, slab, sent)?;
            let len = format.read(slab, root)?;
            out.reserve_exact(len);
            out.extend_from_slice(&slab[HEADER_LEN..HEADER_LEN + len.min(cap)]);
            if len > cap {
                match payload {
                    Some(p) => out.extend_from_slice(&p[cap..]),
                    None => out.resize(len, 0),
                }
                t.broadcast_rest(round, &mut out[cap..])?;
            }
            Ok(out)
        })
    }
}

#[async_trait::async_trait]
impl<T: SlabTransport> Broadcaster for SlabBroadcaster<T> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn max_payload(&self) -> usize {
        self.format.max_payload
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        self.round(root, payload)
    }

    fn broadcast_sync(&self, root: usize, payload: Option<&[u8]>) -> Option<Result<Vec<u8>>> {
        Some(self.round(root, payload))
    }

    fn rounds_started(&self) -> Option<u64> {
        Some(self.state().rounds)
    }

    fn take_arrivals(&self) -> Option<Arrivals> {
        self.state().arrivals.take()
    }

    /// Carried where every round gathers arrivals ([`SlabOptions::arrivals_every`] of 1,
    /// on a transport that gathers): in the lowest bit of the rank's entry time. Not
    /// otherwise: a vote kept for a later gather would be counted for a later step.
    fn carry_vote(&self, vote: bool) -> bool {
        if self.arrivals_every != 1 {
            return false;
        }
        self.vote.store(vote, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn exchange_swaps_buffers_of_one_length_only() {
        let mut slab = Slab::new(4);
        slab.copy_from_slice(b"slab");
        let mut buf: Box<[u8]> = Box::new(*b"buff");
        let theirs = buf.as_ptr();
        assert!(slab.exchange(&mut buf));
        assert_eq!((&slab[..], &buf[..]), (&b"buff"[..], &b"slab"[..]));
        // The allocations changed hands: nothing was copied.
        assert_eq!(slab.as_ptr(), theirs);
        let mut short: Box<[u8]> = Box::new(*b"abc");
        assert!(!slab.exchange(&mut short));
        assert_eq!((&slab[..], &short[..]), (&b"buff"[..], &b"abc"[..]));
    }
}
