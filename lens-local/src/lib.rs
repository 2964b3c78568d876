//! The in-process backend of **lens**: N ranks of one process that broadcast through shared
//! memory. [`LocalCluster`] makes the group, one [`LocalBroadcaster`] per rank; each rank
//! runs as a task of any executor or as a thread (with [`lens_core::blocking`]). It is a
//! real backend, with the same contract as the network ones (deadlines, a root outside the
//! group refused, payload limits): `lens demo` runs on it, Python's `local_cluster` is it,
//! and simulations of a job use it. The test kit (`lens-testkit`) builds its `Cluster` on it.
//!
//! ```
//! use lens_core::{Broadcaster, blocking};
//! use lens_local::LocalCluster;
//!
//! let ranks = LocalCluster::new(3).broadcasters();
//! let got = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .iter()
//!         .map(|b| s.spawn(move || blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"hi"[..]))))
//!         .collect();
//!     // `join` fails only when a rank's thread panicked: pass that panic on.
//!     handles.into_iter().map(|h| h.join().expect("rank thread")).collect::<Result<Vec<_>, _>>()
//! })?;
//! assert!(got.iter().all(|g| g == b"hi"));
//! # Ok::<(), lens_core::Error>(())
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use event_listener::Event;
use futures::future::{Either, select};
use lens_core::arrivals::Arrivals;
use lens_core::backend::check_broadcast_args;
use lens_core::{Broadcaster, DEFAULT_MAX_PAYLOAD, Disagreement, Error, Result};

/// Default deadline of a round of the in-process backend: shorter than the network backends' 30 s,
/// since its ranks are threads of one process and a late one is a bug in the test or simulation.
pub const DEFAULT_ROUND_TIMEOUT: Duration = Duration::from_secs(10);

struct Round {
    root: usize,
    payload: Option<Arc<[u8]>>,
    /// When each rank entered the round, for the root's [`Arrivals`], and the rank it
    /// reports (itself, or the rank it stands for).
    entered: Vec<Option<(usize, Instant)>>,
    /// Which ranks voted to keep the step this round ends (the step sampler's).
    voted: Vec<bool>,
    taken: Vec<bool>,
    taken_count: usize,
    ready: Event,
    all_taken: Event,
}

struct Shared {
    world_size: usize,
    timeout: Duration,
    max_payload: usize,
    rounds: Mutex<HashMap<u64, Round>>,
    /// Per rank, how many rounds it has started: a timeout names where each missing rank is.
    started: Vec<AtomicU64>,
    /// Per rank, the ranks its last round as the root timed out waiting for (empty once a
    /// later round of its succeeds): a rank that then waits for that root in vain names
    /// them, the root cause, rather than the root.
    failed: Mutex<Vec<Vec<usize>>>,
}

impl Shared {
    fn failed(&self) -> MutexGuard<'_, Vec<Vec<usize>>> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Round>> {
        // A panic elsewhere while holding the lock leaves plain data behind; keep going.
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Builds a group of [`LocalBroadcaster`]s that talk through shared memory.
///
/// ```
/// use std::time::Duration;
/// use lens_local::LocalCluster;
/// use lens_core::Broadcaster;
///
/// let ranks = LocalCluster::new(8).timeout(Duration::from_secs(2)).broadcasters();
/// assert_eq!(ranks.len(), 8);
/// assert_eq!(ranks[3].rank(), 3);
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct LocalCluster {
    world_size: usize,
    timeout: Duration,
    max_payload: usize,
}

impl LocalCluster {
    /// A group of `world_size` ranks (at least one; zero is taken as one).
    pub fn new(world_size: usize) -> Self {
        LocalCluster {
            world_size: world_size.max(1),
            timeout: DEFAULT_ROUND_TIMEOUT,
            max_payload: DEFAULT_MAX_PAYLOAD,
        }
    }

    /// The deadline of each collective (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest payload accepted (default [`DEFAULT_MAX_PAYLOAD`]).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// One broadcaster per rank, index = rank.
    pub fn broadcasters(self) -> Vec<LocalBroadcaster> {
        let shared = Arc::new(Shared {
            world_size: self.world_size,
            timeout: self.timeout,
            max_payload: self.max_payload,
            rounds: Mutex::new(HashMap::new()),
            started: (0..self.world_size).map(|_| AtomicU64::new(0)).collect(),
            failed: Mutex::new(vec![Vec::new(); self.world_size]),
        });
        (0..self.world_size)
            .map(|rank| LocalBroadcaster {
                shared: Arc::clone(&shared),
                rank,
                arrivals: Mutex::new(None),
                vote: AtomicBool::new(false),
                stand_in: Mutex::new(None),
            })
            .collect()
    }
}

/// One rank of an in-process group made by [`LocalCluster`].
///
/// It is truly asynchronous and needs no particular runtime (timeouts use a timer thread),
/// so ranks can run as tasks of any executor or as threads with [`lens_core::blocking`].
///
/// Semantics: a non-root returns as soon as the root's payload is there; the root returns
/// once every other rank has taken it, so a rank that never joins makes the root fail with
/// [`Error::Timeout`] naming it, and a root that never joins makes every other rank fail
/// naming the root; a rank that waits in vain for a root whose own last round timed out
/// names the ranks that root waited for, with the root as the path (`via`). Ranks other
/// than the root wait a quarter of the timeout longer than the root, so that the root's
/// word is in before they give up. Ranks that disagree on the root get [`Error::Mismatch`].
pub struct LocalBroadcaster {
    shared: Arc<Shared>,
    rank: usize,
    /// How the ranks arrived at the last round this rank was the root of.
    arrivals: Mutex<Option<Arrivals>>,
    /// This rank's vote, for its next round.
    vote: AtomicBool,
    /// The rank (and its arrival) this rank stands for in its next round.
    stand_in: Mutex<Option<(usize, Instant)>>,
}

impl std::fmt::Debug for LocalBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBroadcaster")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world_size)
            .finish_non_exhaustive()
    }
}

enum Wait<T> {
    Done(T),
    Pending(event_listener::EventListener),
}

impl LocalBroadcaster {
    /// How many rounds rank `r` has started.
    fn started_by(&self, r: usize) -> u64 {
        self.shared
            .started
            .get(r)
            .map_or(0, |s| s.load(Ordering::Relaxed))
    }

    /// A timeout naming `missing` and the last round each of them started.
    fn timed_out(&self, start: Instant, missing: Vec<usize>) -> Error {
        Error::Timeout {
            after: start.elapsed(),
            last_seen: missing.iter().map(|&r| (r, self.started_by(r))).collect(),
            missing,
            via: Vec::new(),
        }
    }

    /// A timeout waiting for `root`: the ranks the root's own last round timed out
    /// waiting for, where it did (through `root`), else the root.
    fn timed_out_waiting_for(&self, start: Instant, root: usize) -> Error {
        let theirs = self.shared.failed().get(root).cloned().unwrap_or_default();
        if theirs.is_empty() || theirs.contains(&self.rank) {
            return self.timed_out(start, vec![root]);
        }
        let mut e = self.timed_out(start, theirs);
        if let Error::Timeout { via, .. } = &mut e {
            via.push(root);
        }
        e
    }

    /// Waits until `check` returns `Some`, re-checking whenever the event it hands back fires.
    async fn wait_for<T>(
        &self,
        deadline: Instant,
        mut check: impl FnMut(&mut HashMap<u64, Round>) -> Result<Wait<T>>,
    ) -> Result<Option<T>> {
        loop {
            let listener = match check(&mut self.shared.lock())? {
                Wait::Done(v) => return Ok(Some(v)),
                Wait::Pending(l) => l,
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let timer = futures_timer::Delay::new(deadline - now);
            if let Either::Right(_) = select(listener, timer).await {
                // One last look: the event may have fired just as the timer did.
                if let Wait::Done(v) = check(&mut self.shared.lock())? {
                    return Ok(Some(v));
                }
                return Ok(None);
            }
        }
    }
}

#[async_trait::async_trait]
impl Broadcaster for LocalBroadcaster {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn max_payload(&self) -> usize {
        self.shared.max_payload
    }

    /// Every rank of an in-process cluster is on this host: its local rank is its rank.
    fn local_rank(&self) -> Option<usize> {
        Some(self.rank)
    }

    fn rounds_started(&self) -> Option<u64> {
        Some(self.started_by(self.rank))
    }

    /// Carried: the root of the next round finds it in its [`Arrivals::voted`].
    fn carry_vote(&self, vote: bool) -> bool {
        self.vote.store(vote, Ordering::Relaxed);
        true
    }

    /// Carried: the root of the next round finds `rank`, at `came`, in this rank's place.
    fn stand_for(&self, rank: usize, came: Instant) -> bool {
        *self.stand_in.lock().unwrap_or_else(|e| e.into_inner()) = Some((rank, came));
        true
    }

    /// Every rank's entry into the round, on the process's one clock.
    fn take_arrivals(&self) -> Option<Arrivals> {
        self.arrivals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        let n = self.shared.world_size;
        if n == 1 {
            return Ok(payload.map(<[u8]>::to_vec).unwrap_or_default());
        }
        let round_no = self.shared.started[self.rank].fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let came = self
            .stand_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or((self.rank, start));
        // A rank that waits for the root waits a quarter longer than the root waits for
        // it (as TCP's members do), so that a root that times out first has said which
        // ranks it waited for before the others give up on it.
        let timeout = self.shared.timeout;
        let deadline = start
            + if payload.is_some() {
                timeout
            } else {
                timeout + timeout / 4
            };
        let new_round = || Round {
            root,
            payload: None,
            entered: vec![None; n],
            voted: vec![false; n],
            taken: vec![false; n],
            taken_count: 0,
            ready: Event::new(),
            all_taken: Event::new(),
        };
        let mismatch = |theirs: usize| {
            Error::mismatch(
                Disagreement::Root,
                format!(
                    "round {round_no}: rank {} uses root {root}, another rank uses root {theirs}",
                    self.rank
                ),
            )
        };

        if let Some(bytes) = payload {
            let shared: Arc<[u8]> = Arc::from(bytes);
            {
                let mut rounds = self.shared.lock();
                let round = rounds.entry(round_no).or_insert_with(new_round);
                if round.root != root {
                    return Err(mismatch(round.root));
                }
                round.entered[root] = Some(came);
                round.payload = Some(Arc::clone(&shared));
                round.ready.notify(usize::MAX);
            }
            let done = self
                .wait_for(deadline, |rounds| {
                    let Some(round) = rounds.get(&round_no) else {
                        return Ok(Wait::Done(None));
                    };
                    if round.taken_count + 1 >= n {
                        let entered = rounds.remove(&round_no).map(|r| (r.entered, r.voted));
                        return Ok(Wait::Done(entered));
                    }
                    Ok(Wait::Pending(round.all_taken.listen()))
                })
                .await?;
            if let Some(Some((entered, voted))) = &done {
                let voted = voted
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v)
                    .map(|(r, _)| r)
                    .collect();
                *self.arrivals.lock().unwrap_or_else(|e| e.into_inner()) =
                    Arrivals::from_instants(entered.iter().filter_map(|e| *e))
                        .map(|a| a.with_voted(voted));
            }
            if done.is_none() {
                let mut rounds = self.shared.lock();
                let missing = rounds
                    .remove(&round_no)
                    .map(|r| {
                        (0..n)
                            .filter(|&i| i != root && !r.taken[i])
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                tracing::debug!(
                    round = round_no,
                    ?missing,
                    "local broadcast timed out at the root"
                );
                drop(rounds);
                if let Some(mine) = self.shared.failed().get_mut(self.rank) {
                    mine.clone_from(&missing);
                }
                return Err(self.timed_out(start, missing));
            }
            if let Some(mine) = self.shared.failed().get_mut(self.rank) {
                mine.clear();
            }
            Ok(shared.to_vec())
        } else {
            let me = self.rank;
            let got = self
                .wait_for(deadline, |rounds| {
                    let round = rounds.entry(round_no).or_insert_with(new_round);
                    if round.root != root {
                        return Err(mismatch(round.root));
                    }
                    round.entered[me].get_or_insert(came);
                    match &round.payload {
                        Some(p) => {
                            let p = Arc::clone(p);
                            if !round.taken[me] {
                                round.voted[me] = self.vote.swap(false, Ordering::Relaxed);
                                round.taken[me] = true;
                                round.taken_count += 1;
                                if round.taken_count + 1 >= n {
                                    round.all_taken.notify(1);
                                }
                            }
                            Ok(Wait::Done(p))
                        }
                        None => Ok(Wait::Pending(round.ready.listen())),
                    }
                })
                .await?;
            match got {
                Some(p) => Ok(p.to_vec()),
                None => {
                    tracing::debug!(
                        round = round_no,
                        root,
                        "local broadcast timed out waiting for the root"
                    );
                    Err(self.timed_out_waiting_for(start, root))
                }
            }
        }
    }
}

impl LocalCluster {
    /// A [`lens_core::Hierarchical`] group over `layout`, built from local groups (one per
    /// node, plus one for the leaders) with this builder's settings; index = global rank.
    ///
    /// # Errors
    /// [`Error::Config`] if the layout is inconsistent (it cannot be, if built by
    /// [`lens_core::NodeLayout`]).
    pub fn hierarchical(
        &self,
        layout: &lens_core::NodeLayout,
    ) -> Result<Vec<lens_core::Hierarchical<LocalBroadcaster, LocalBroadcaster>>> {
        let with_size = |n: usize| LocalCluster {
            world_size: n,
            ..self.clone()
        };
        let nodes = (0..layout.node_count())
            .map(|node| with_size(layout.node(node).map_or(0, <[usize]>::len)).broadcasters())
            .collect();
        let leaders = with_size(layout.node_count()).broadcasters();
        lens_core::Hierarchical::assemble(layout, nodes, leaders)
    }
}
