//! MPI backend for **lens** (rsmpi, tested with Open MPI).
//!
//! [`MpiBroadcaster`] wraps any communicator: the world, or a split one such as a
//! pipeline-parallel group, with that group's own ranks. A typical carrier travels in
//! **one** transfer of a fixed-size slab (a 16-byte header with a format marker, the slab
//! size and the payload length, then the payload); a payload that does not fit sends its
//! remainder in a second one. Ranks built with different slab sizes fail with
//! [`Error::Mismatch`] instead of reading garbage, as long as the root's first message fits
//! the other rank's slab (a longer one is a truncation MPI reports itself, which by default
//! ends the job).
//!
//! **Transfer.** A round moves the slab one of three ways: the root sends it to every
//! other rank itself, or each root's slab broadcast is prepared once and restarted every
//! round (`MPI_Bcast_init` / `MPIX_Bcast_init`, where the library has one), or it is a fresh
//! `MPI_Ibcast`. Which is fastest depends on the library, the network and how many ranks
//! share a core, so by default [`MpiBroadcasterBuilder::build`] measures each (a few dozen
//! rounds after a barrier each, the slowest rank's median kept, the same choice on every
//! rank) and keeps the fastest: [`MpiBroadcaster::transfer`] says which,
//! [`MpiBroadcaster::transfer_measured`] what each cost. On one host whose cores the
//! ranks outnumber (2 cores, 2 to 16 ranks) direct sends win at every size; on hosts with a
//! core per rank and a real network, a collective's tree (depth growing with the
//! logarithm of the group) overtakes the root's sends (one per rank) past some size, and
//! the measurement finds where. [`MpiBroadcasterBuilder::transfer`] fixes the way instead
//! (or the older size rule, [`Transfer::BySize`]). Why persistent requests: the `request`
//! module.
//!
//! **Deadline.** Every transfer is started non-blocking and polled; a rank that never
//! arrives turns into [`Error::Timeout`] instead of a hang. MPI cannot cancel a collective,
//! so after a timeout the buffer is left to MPI (leaked on purpose) and the broadcaster
//! refuses further rounds with [`Error::Closed`]: the usual reaction is to exit non-zero,
//! and the launcher then stops the job. A collective cannot say which rank is missing, so
//! a timeout is followed by a **roll call** with point-to-point messages of their own:
//! every rank tells rank 0 of the communicator it is here and waits up to one more timeout
//! for rank 0's verdict; rank 0 waits up to half a timeout for them and tells those that
//! answered who did not. The timeout then names the ranks that did not answer on every
//! rank (`missing`), through rank 0 on the others (`via` `[0]`); a rank that hears no
//! verdict names rank 0. Limits: a rank whose own timeout comes more than half a timeout
//! after rank 0's is named missing by rank 0 and names rank 0 itself; one roll call per
//! broadcaster (it is closed after it), on the communicator it was given, so give each
//! broadcaster a communicator of its own (`world.duplicate()`).
//!
//! **Configuration.** [`MpiBroadcasterBuilder::from_env`] starts from the variables of
//! [`mod@env`] (slab size, deadline, payload limit, how rounds travel) and returns the builder, so code can still
//! override any of them. The slab round itself is `lens_core::backend::slab`, shared with
//! the NCCL backend.
//!
//! **Blocking.** `broadcast` does its MPI work inside `poll` and returns when the round is
//! done. If MPI was initialised below `Threading::Serialized`, call it from the thread that
//! created the broadcaster (others get [`Error::Config`]).
//!
//! ```no_run
//! use lens_mpi::MpiBroadcaster;
//! use mpi::traits::*;
//!
//! // `None` only when MPI was initialised before, which this program does not do.
//! let universe = mpi::initialize().expect("MPI initialises once");
//! let world = universe.world();
//! // A pipeline group: ranks with the same colour share a communicator (`None` only for
//! // a rank that passes `Color::undefined()`).
//! let stage = world.split_by_color(mpi::topology::Color::with_value(world.rank() % 2))
//!     .expect("every rank has a colour");
//! let group = MpiBroadcaster::new(stage)?;
//! let carrier = lens_core::blocking::broadcast_trace_context(&group, 0)?;
//! # Ok::<(), lens_core::Error>(())
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// `unsafe` is allowed only in `request` and `transport`, which make raw MPI calls.

mod choose;
mod request;
pub use choose::Transfer;
pub use request::MpiError;
mod transport;

use std::thread::ThreadId;
use std::time::Duration;

use lens_core::backend::EnvErrors;
use lens_core::backend::slab::{self, SlabBroadcaster, SlabOptions, SlabVars};
use lens_core::{Broadcaster, Error, Result};
use mpi::environment::Threading;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

use request::Ranks;
use transport::{Mode, Mpi};

pub(crate) const BACKEND: &str = "mpi";
pub(crate) const MAGIC: [u8; 4] = *b"LNSM";
/// Bytes of the slab header: marker, slab size, payload length, format version.
pub const SLAB_HEADER: usize = slab::HEADER_LEN;
/// Default slab size in bytes (see [`slab::DEFAULT_SLAB_SIZE`] for why 256).
pub const DEFAULT_SLAB_SIZE: usize = slab::DEFAULT_SLAB_SIZE;
/// Default deadline of a round.
pub const DEFAULT_ROUND_TIMEOUT: Duration = slab::DEFAULT_ROUND_TIMEOUT;

/// Names of the variables [`MpiBroadcasterBuilder::from_env`] reads.
pub mod env {
    /// Slab size in bytes, header included; the same on every rank.
    pub const SLAB_SIZE: &str = "LENS_MPI_SLAB_SIZE";
    /// Deadline of a round, in seconds.
    pub const TIMEOUT: &str = "LENS_MPI_TIMEOUT";
    /// Largest payload, in bytes.
    pub const MAX_PAYLOAD: &str = "LENS_MPI_MAX_PAYLOAD";
    /// `0` or `false`: a fresh `MPI_Ibcast` per round instead of a persistent broadcast
    /// prepared once per root (for comparison, or an MPI whose persistent one misbehaves).
    pub const PERSISTENT: &str = "LENS_MPI_PERSISTENT";
    /// Largest group in which the root sends to every other rank itself instead of using a
    /// collective (default [`crate::DEFAULT_DIRECT_MAX`]; `0` or `1`: never). The same on
    /// every rank: ranks that move a round differently never meet, and time out.
    pub const DIRECT_MAX: &str = "LENS_MPI_DIRECT_MAX";
    /// How rounds move the slab: `measured` (the default: each way is measured when the
    /// broadcaster is built and the fastest kept), `by-size` (the size rule of
    /// [`DIRECT_MAX`] and [`PERSISTENT`], also chosen when either of those is set
    /// and this is not), `direct`, `persistent` or `ibcast`. The same on every rank; see
    /// [`crate::Transfer`].
    pub const TRANSFER: &str = "LENS_MPI_TRANSFER";
    /// Every this many rounds the ranks' arrival times are gathered at the root (default
    /// `0`: never); see [`crate::MpiBroadcasterBuilder::arrivals_every`]. The same on every
    /// rank.
    pub const ARRIVALS_EVERY: &str = "LENS_MPI_ARRIVALS_EVERY";
}

/// The size rule's limit ([`Transfer::BySize`]): largest group in which a round is direct
/// sends from the root to every other rank rather than a collective. The default way,
/// [`Transfer::Measured`], does not use it: it measures.
pub const DEFAULT_DIRECT_MAX: usize = 8;

const VARS: SlabVars = SlabVars {
    slab_size: env::SLAB_SIZE,
    timeout: env::TIMEOUT,
    max_payload: env::MAX_PAYLOAD,
    arrivals_every: env::ARRIVALS_EVERY,
};

/// One rank of an MPI communicator, as a [`Broadcaster`].
pub struct MpiBroadcaster {
    group: SlabBroadcaster<Mpi>,
    only_thread: Option<ThreadId>,
    mode: Mode,
    /// What each way cost when the broadcaster was built, where it was measured.
    measured: Vec<(Transfer, Duration)>,
    /// This rank's index among the ranks that share its memory (its host), from the library.
    local_rank: Option<usize>,
}

impl std::fmt::Debug for MpiBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBroadcaster")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Builds an [`MpiBroadcaster`]; see [`MpiBroadcaster::builder`] and
/// [`MpiBroadcasterBuilder::from_env`].
#[must_use]
pub struct MpiBroadcasterBuilder {
    comm: SimpleCommunicator,
    opts: SlabOptions,
    persistent: bool,
    direct_max: usize,
    transfer: Transfer,
    /// Variables that did not parse (lens-core's one rule: code clears them).
    env_errors: EnvErrors,
}

impl std::fmt::Debug for MpiBroadcasterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBroadcasterBuilder")
            .field("opts", &self.opts)
            .field("persistent", &self.persistent)
            .field("direct_max", &self.direct_max)
            .field("transfer", &self.transfer)
            .field("env_errors", &self.env_errors)
            .finish_non_exhaustive()
    }
}

/// The settings' names under which their variables' errors are kept.
const PERSISTENT: &str = "persistent";
const DIRECT_MAX: &str = "direct_max";
const TRANSFER: &str = "transfer";

/// The value of [`env::PERSISTENT`]: on unless it says off.
fn persistent_from(value: Option<&str>) -> std::result::Result<bool, String> {
    let Some(v) = value else {
        return Ok(true);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!(
            "{} must be 0 or 1 (or true/false), not {other:?}",
            env::PERSISTENT
        )),
    }
}

/// The value of [`env::DIRECT_MAX`]: a number of ranks.
fn direct_max_from(value: Option<&str>) -> std::result::Result<usize, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_DIRECT_MAX);
    };
    v.trim()
        .parse()
        .map_err(|_| format!("{} must be a number of ranks, not {v:?}", env::DIRECT_MAX))
}

impl MpiBroadcasterBuilder {
    /// A builder for `comm` that starts from the environment: [`env::SLAB_SIZE`],
    /// [`env::TIMEOUT`] and [`env::MAX_PAYLOAD`] where set, the defaults elsewhere. A value
    /// that does not parse is reported by [`MpiBroadcasterBuilder::build`] unless code sets
    /// that field.
    pub fn from_env(comm: SimpleCommunicator) -> Self {
        Self::from_vars(comm, |name| std::env::var(name).ok())
    }

    /// [`MpiBroadcasterBuilder::from_env`] with a custom lookup of the variables (a map, a
    /// job's launcher file).
    pub fn from_vars(comm: SimpleCommunicator, var: impl Fn(&str) -> Option<String>) -> Self {
        let mut b = MpiBroadcaster::builder(comm);
        b.opts = SlabOptions::from_vars(&VARS, &var);
        match persistent_from(var(env::PERSISTENT).as_deref()) {
            Ok(on) => b.persistent = on,
            Err(e) => b.env_errors.note(PERSISTENT, e),
        }
        match direct_max_from(var(env::DIRECT_MAX).as_deref()) {
            Ok(n) => b.direct_max = n,
            Err(e) => b.env_errors.note(DIRECT_MAX, e),
        }
        // Either setting of the size rule asks for it, unless the way is named outright.
        if var(env::PERSISTENT).is_some() || var(env::DIRECT_MAX).is_some() {
            b.transfer = Transfer::BySize;
        }
        if let Some(v) = var(env::TRANSFER) {
            match Transfer::parse(&v) {
                Ok(t) => b.transfer = t,
                Err(e) => b.env_errors.note(TRANSFER, e),
            }
        }
        b
    }

    /// How rounds move the slab (default [`Transfer::Measured`]: measured when the
    /// broadcaster is built; variable [`env::TRANSFER`]). Every rank of the communicator must
    /// use the same value.
    pub fn transfer(mut self, transfer: Transfer) -> Self {
        self.transfer = transfer;
        self.env_errors.clear(TRANSFER);
        self
    }

    /// Selects the size rule ([`Transfer::BySize`]) with this limit: in a group of at most
    /// `ranks` ranks each round is direct sends from the root to every other rank
    /// (`MPI_Isend` / `MPI_Irecv`) instead of a collective (default
    /// [`DEFAULT_DIRECT_MAX`]; `0` or `1` never; variable [`env::DIRECT_MAX`]). Every rank
    /// of the communicator must use the same value.
    pub fn direct_up_to(mut self, ranks: usize) -> Self {
        self.direct_max = ranks;
        self.transfer = Transfer::BySize;
        self.env_errors.clear(DIRECT_MAX);
        self
    }

    /// Selects the size rule ([`Transfer::BySize`]) and, in groups larger than
    /// [`MpiBroadcasterBuilder::direct_up_to`], whether each root's slab broadcast is
    /// prepared once and restarted every round (`MPI_Bcast_init`, or Open MPI's
    /// `MPIX_Bcast_init`; default, and used only where the library has one) or started
    /// afresh with `MPI_Ibcast`; variable [`env::PERSISTENT`].
    pub fn persistent(mut self, on: bool) -> Self {
        self.persistent = on;
        self.transfer = Transfer::BySize;
        self.env_errors.clear(PERSISTENT);
        self
    }

    /// Slab size in bytes, header included (default [`DEFAULT_SLAB_SIZE`]; variable
    /// [`env::SLAB_SIZE`]). Every rank of the communicator must use the same size.
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.opts = self.opts.slab_size(bytes);
        self
    }

    /// Deadline of each round (default [`DEFAULT_ROUND_TIMEOUT`]; variable [`env::TIMEOUT`]).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.opts = self.opts.timeout(d);
        self
    }

    /// Largest payload (default [`lens_core::DEFAULT_MAX_PAYLOAD`]; variable
    /// [`env::MAX_PAYLOAD`]).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.opts = self.opts.max_payload(bytes);
        self
    }

    /// Gathers the ranks' arrival times at the root every `rounds` rounds (0, the default:
    /// never), so that the source's step span names the rank that came last
    /// ([`lens_core::arrivals`]): one more point-to-point exchange of 8 bytes per rank
    /// after such a round. Arrival times are wall clocks: ranks on different hosts need
    /// synchronised clocks, or the spread includes their offsets. Variable
    /// [`env::ARRIVALS_EVERY`].
    pub fn arrivals_every(mut self, rounds: u64) -> Self {
        self.opts = self.opts.arrivals_every(rounds);
        self
    }

    /// The slab settings at once, replacing what the variables ([`env::SLAB_SIZE`],
    /// [`env::TIMEOUT`], [`env::MAX_PAYLOAD`], [`env::ARRIVALS_EVERY`]) set.
    pub fn options(mut self, opts: SlabOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The broadcaster. Collective: every rank of the communicator calls it. Ranks meet at
    /// a barrier polled against the round's deadline first, so a rank that never calls it
    /// makes the others fail instead of hang; then, by default, the ways of moving the slab
    /// are measured ([`Transfer::Measured`]).
    ///
    /// # Errors
    /// [`Error::Config`] for a slab no larger than its header or over `i32::MAX` bytes, a
    /// timeout that is zero or over [`lens_core::backend::MAX_TIMEOUT`], or a variable that did not
    /// parse; [`Error::Timeout`] when a rank did not come to the build within the round's
    /// timeout; [`Error::Mismatch`] (measured way) when the ranks' slab sizes differ.
    pub fn build(self) -> Result<MpiBroadcaster> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let only_thread =
            (mpi::environment::threading_support() < Threading::Serialized).then(this_thread);
        let me = (
            usize::try_from(rank).unwrap_or_default(),
            usize::try_from(size).unwrap_or(1),
        );
        self.env_errors.check()?;
        let (persistent, direct_max) = (self.persistent, self.direct_max);
        let by_size = || {
            if me.1 > 1 && me.1 <= direct_max {
                Mode::Direct
            } else if persistent && request::has_bcast_init() {
                Mode::Persistent
            } else {
                Mode::Ibcast
            }
        };
        let ranks = Ranks { me: rank, size };
        // Collective, like the rest of build: every rank gets here, or none (the errors
        // above come from settings every rank shares). A rank that never does makes the
        // others fail here at the round's deadline; past this barrier every rank is in
        // `build`, so its blocking collectives below wait for ranks that are there.
        if me.1 > 1 {
            self.opts.check(BACKEND)?;
            choose::barrier_within(&self.comm, self.opts.timeout)?;
        }
        let (mode, measured) = match self.transfer {
            Transfer::Measured if me.1 > 1 => {
                let ways = choose::candidates(me.1);
                choose::measure(&self.comm, ranks, me, &self.opts, &ways)?
            }
            Transfer::Direct => (Mode::Direct, Vec::new()),
            Transfer::Persistent if request::has_bcast_init() => (Mode::Persistent, Vec::new()),
            Transfer::Persistent => {
                return Err(Error::config(
                    "Transfer::Persistent: this MPI library has neither MPI_Bcast_init nor MPIX_Bcast_init",
                ));
            }
            Transfer::Ibcast => (Mode::Ibcast, Vec::new()),
            Transfer::Measured | Transfer::BySize => (by_size(), Vec::new()),
        };
        let local_rank = usize::try_from(self.comm.split_shared(0).rank()).ok();
        let transport = Mpi::new(self.comm, ranks, mode);
        Ok(MpiBroadcaster {
            group: SlabBroadcaster::new(BACKEND, MAGIC, transport, me, &self.opts)?,
            only_thread,
            mode,
            measured,
            local_rank,
        })
    }
}

impl MpiBroadcaster {
    /// Wraps `comm` with the default slab size and timeout.
    ///
    /// # Errors
    /// As [`MpiBroadcasterBuilder::build`].
    pub fn new(comm: SimpleCommunicator) -> Result<Self> {
        Self::builder(comm).build()
    }

    /// A builder for `comm` with the defaults (see also [`MpiBroadcasterBuilder::from_env`]).
    pub fn builder(comm: SimpleCommunicator) -> MpiBroadcasterBuilder {
        MpiBroadcasterBuilder {
            comm,
            opts: SlabOptions::default(),
            persistent: true,
            direct_max: DEFAULT_DIRECT_MAX,
            transfer: Transfer::Measured,
            env_errors: EnvErrors::default(),
        }
    }

    /// How rounds move the slab: [`Transfer::Direct`], [`Transfer::Persistent`] or
    /// [`Transfer::Ibcast`], measured or as configured.
    pub fn transfer(&self) -> Transfer {
        Transfer::of(self.mode)
    }

    /// Where the way was measured ([`Transfer::Measured`], the default): each way tried
    /// and the median, over the timed rounds, of the slowest rank's round; empty elsewhere.
    pub fn transfer_measured(&self) -> &[(Transfer, Duration)] {
        &self.measured
    }

    /// Whether rounds are direct sends from the root to every other rank.
    pub fn direct_sends(&self) -> bool {
        self.mode == Mode::Direct
    }

    /// Whether rounds restart a persistent broadcast prepared once per root (the library
    /// has `MPI_Bcast_init` or `MPIX_Bcast_init`), rather than start an `MPI_Ibcast` each
    /// round or send directly.
    pub fn persistent_broadcasts(&self) -> bool {
        self.mode == Mode::Persistent
    }

    /// This rank's measured clock offset (`lens_core::measure_clock_offsets`, or a
    /// `ClockTracker`), taken off the arrival times it sends
    /// ([`MpiBroadcasterBuilder::arrivals_every`]) so that ranks on hosts whose clocks
    /// differ are compared on the reference's clock.
    pub fn set_clock_offset(&self, offset: lens_core::ClockOffset) {
        self.group.set_clock_offset(offset.offset_ns);
    }

    /// The slab size in bytes, header included.
    pub fn slab_size(&self) -> usize {
        self.group.slab_size()
    }

    /// Payload bytes that travel in the first collective.
    pub fn slab_capacity(&self) -> usize {
        self.group.slab_capacity()
    }

    fn check_thread(&self) -> Result<()> {
        match self.only_thread {
            Some(t) if t != this_thread() => Err(Error::config(
                "MPI was initialised below Threading::Serialized: call from the thread that created the broadcaster",
            )),
            _ => Ok(()),
        }
    }
}

/// This thread's id, kept per thread: `std::thread::current()` clones a handle each call,
/// and the check runs every round.
fn this_thread() -> ThreadId {
    thread_local! {
        static ID: ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}

// Every method written out: a default here would hide what the slab group knows.
#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl Broadcaster for MpiBroadcaster {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn max_payload(&self) -> usize {
        self.group.max_payload()
    }

    fn local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        self.check_thread()?;
        self.group.round(root, payload)
    }

    fn rounds_started(&self) -> Option<u64> {
        self.group.rounds_started()
    }

    fn received_at(&self) -> Option<std::time::Instant> {
        self.group.received_at()
    }

    fn take_arrivals(&self) -> Option<lens_core::arrivals::Arrivals> {
        self.group.take_arrivals()
    }

    /// Carried when every round gathers arrivals (`arrivals_every(1)`), in the gather.
    fn carry_vote(&self, vote: bool) -> bool {
        self.group.carry_vote(vote)
    }

    /// Not carried: the gather of arrivals names each rank by its place in it.
    fn stand_for(&self, rank: usize, came: std::time::Instant) -> bool {
        self.group.stand_for(rank, came)
    }

    fn step_sampler(&self) -> Option<&lens_core::sample::StepSampler> {
        None
    }

    fn broadcast_sync(&self, root: usize, payload: Option<&[u8]>) -> Option<Result<Vec<u8>>> {
        Some(
            self.check_thread()
                .and_then(|()| self.group.round(root, payload)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::persistent_from;

    /// One row per value of LENS_MPI_DIRECT_MAX: (why, value, the limit or an error).
    #[test]
    fn direct_max_variable_values() {
        let rows: [(&str, Option<&str>, Option<usize>); 5] = [
            ("unset: the default", None, Some(super::DEFAULT_DIRECT_MAX)),
            ("a number", Some("16"), Some(16)),
            ("spaces around it", Some(" 2 "), Some(2)),
            ("never", Some("0"), Some(0)),
            ("not a number", Some("many"), None),
        ];
        for (why, value, want) in rows {
            assert_eq!(super::direct_max_from(value).ok(), want, "{why}");
        }
        let err = super::direct_max_from(Some("many")).expect_err("refused");
        assert!(err.contains("LENS_MPI_DIRECT_MAX"), "{err}");
    }

    /// One row per value of LENS_MPI_TRANSFER: (why, value, the way or an error).
    #[test]
    fn transfer_variable_values() {
        use super::Transfer;
        let rows: [(&str, &str, Option<Transfer>); 7] = [
            ("the default, named", "measured", Some(Transfer::Measured)),
            ("the size rule", "by-size", Some(Transfer::BySize)),
            (
                "any case, spaces trimmed",
                " Direct ",
                Some(Transfer::Direct),
            ),
            ("persistent", "persistent", Some(Transfer::Persistent)),
            ("ibcast", "IBCAST", Some(Transfer::Ibcast)),
            ("empty is an error, not a silent default", "", None),
            ("not a way", "fastest", None),
        ];
        for (why, value, want) in rows {
            assert_eq!(Transfer::parse(value).ok(), want, "{why}");
        }
        let err = Transfer::parse("fastest").expect_err("refused");
        assert!(
            err.contains("LENS_MPI_TRANSFER") && err.contains("fastest"),
            "{err}"
        );
    }

    #[test]
    fn persistent_variable_values() {
        let rows: [(Option<&str>, Option<bool>, &str); 7] = [
            (None, Some(true), "unset: on"),
            (Some("1"), Some(true), "1"),
            (Some(" TRUE "), Some(true), "any case, spaces trimmed"),
            (Some("0"), Some(false), "0"),
            (Some("off"), Some(false), "off"),
            (Some(""), None, "empty is an error, not a silent default"),
            (Some("2"), None, "not a switch"),
        ];
        for (value, want, why) in rows {
            assert_eq!(persistent_from(value).ok(), want, "{why}");
        }
        let err = persistent_from(Some("maybe")).expect_err("refused");
        assert!(
            err.contains("LENS_MPI_PERSISTENT") && err.contains("maybe"),
            "{err}"
        );
    }
}
