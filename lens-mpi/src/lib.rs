//! MPI backend for **lens** (rsmpi, tested with Open MPI).
//!
//! [`MpiBroadcaster`] wraps any communicator: the world, or a split one such as a
//! pipeline-parallel group, with that group's own ranks. A typical carrier travels in
//! **one** `MPI_Ibcast` of a fixed-size slab (a 16-byte header with a format marker, the slab
//! size and the payload length, then the payload); a payload that does not fit sends its
//! remainder in a second one. Ranks built with different slab sizes fail with
//! [`Error::Mismatch`] instead of reading garbage.
//!
//! **Deadline.** The collective is started non-blocking and polled; a rank that never
//! arrives turns into [`Error::Timeout`] instead of a hang. MPI cannot cancel a collective,
//! so after a timeout the buffer is left to MPI (leaked on purpose) and the broadcaster
//! refuses further rounds with [`Error::Closed`]: the usual reaction is to exit non-zero,
//! and the launcher then stops the job.
//!
//! **Configuration.** [`MpiBroadcasterBuilder::from_env`] starts from the variables of
//! [`mod@env`] (slab size, deadline, payload limit) and returns the builder, so code can still
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
//! let universe = mpi::initialize().expect("MPI initialises once");
//! let world = universe.world();
//! // A pipeline group: ranks with the same colour share a communicator.
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
// Raw MPI calls: the safe rsmpi API aborts the process when a request is left unfinished,
// and a deadline needs exactly that (see `ibcast`).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use lens_core::backend::slab::{self, Round, SlabGroup, SlabOptions, SlabTransport, SlabVars};
use lens_core::{Broadcaster, Error, Result};
use mpi::environment::Threading;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

const BACKEND: &str = "mpi";
const MAGIC: [u8; 4] = *b"LNSM";
/// Bytes of the slab header: marker, slab size, payload length, format version.
pub const HEADER: usize = slab::HEADER_LEN;
/// Default slab size in bytes: room for a carrier with a trace state and some baggage.
pub const DEFAULT_SLAB: usize = slab::DEFAULT_SLAB_SIZE;
/// How long a round polls without pausing.
const SPIN_FOR: Duration = Duration::from_millis(2);
/// Default deadline of a round.
pub const DEFAULT_TIMEOUT: Duration = slab::DEFAULT_TIMEOUT;

/// Names of the variables [`MpiBroadcasterBuilder::from_env`] reads.
pub mod env {
    /// Slab size in bytes, header included; the same on every rank.
    pub const SLAB_SIZE: &str = "LENS_MPI_SLAB_SIZE";
    /// Deadline of a round, in seconds.
    pub const TIMEOUT: &str = "LENS_MPI_TIMEOUT";
    /// Largest payload, in bytes.
    pub const MAX_PAYLOAD: &str = "LENS_MPI_MAX_PAYLOAD";
}

const VARS: SlabVars = SlabVars {
    slab_size: env::SLAB_SIZE,
    timeout: env::TIMEOUT,
    max_payload: env::MAX_PAYLOAD,
};

/// The MPI side of the slab round: a communicator and a buffer MPI may keep.
struct Mpi {
    comm: SimpleCommunicator,
    /// The slab as MPI sees it; handed to MPI for each collective and leaked on a timeout.
    buf: Box<[u8]>,
}

// SAFETY: the communicator handle is only used with the slab group's mutex held, so MPI
// never sees two calls on it at once; with a threading level below Serialized every call is
// also checked to come from the creating thread (`MpiBroadcaster::check_thread`).
unsafe impl Send for Mpi {}

impl SlabTransport for Mpi {
    fn broadcast_slab(
        &mut self,
        round: &Round,
        slab: &mut [u8],
        sent: Option<usize>,
    ) -> Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        if buf.len() != slab.len() {
            buf = vec![0u8; slab.len()].into_boxed_slice();
        }
        // The root's data; elsewhere the whole slab, whose header the round zeroed, so no
        // earlier round's header is left in MPI's buffer.
        let n = sent.unwrap_or(slab.len());
        buf[..n].copy_from_slice(&slab[..n]);
        let buf = ibcast(&self.comm, round.root, buf, round.deadline)?
            .ok_or_else(|| round.timed_out())?;
        slab.copy_from_slice(&buf);
        self.buf = buf;
        Ok(())
    }

    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> Result<()> {
        let buf = ibcast(&self.comm, round.root, rest.into(), round.deadline)?
            .ok_or_else(|| round.timed_out())?;
        rest.copy_from_slice(&buf);
        Ok(())
    }
}

/// One rank of an MPI communicator, as a [`Broadcaster`].
pub struct MpiBroadcaster {
    group: SlabGroup<Mpi>,
    only_thread: Option<ThreadId>,
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
}

impl std::fmt::Debug for MpiBroadcasterBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBroadcasterBuilder")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl MpiBroadcasterBuilder {
    /// A builder for `comm` that starts from the environment: [`env::SLAB_SIZE`],
    /// [`env::TIMEOUT`] and [`env::MAX_PAYLOAD`] where set, the defaults elsewhere. A value
    /// that does not parse is reported by [`MpiBroadcasterBuilder::build`] unless code sets
    /// that field.
    pub fn from_env(comm: SimpleCommunicator) -> Self {
        MpiBroadcasterBuilder {
            comm,
            opts: SlabOptions::from_vars(&VARS, |k| std::env::var(k).ok()),
        }
    }

    /// Slab size in bytes, header included (default [`DEFAULT_SLAB`]; variable
    /// [`env::SLAB_SIZE`]). Every rank of the communicator must use the same size.
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.opts = self.opts.slab_size(bytes);
        self
    }

    /// Deadline of each round (default [`DEFAULT_TIMEOUT`]; variable [`env::TIMEOUT`]).
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

    /// All three settings at once.
    pub fn options(mut self, opts: SlabOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The broadcaster.
    ///
    /// # Errors
    /// [`Error::Config`] for a slab no larger than its header or over `i32::MAX` bytes, a
    /// timeout that is zero or over [`lens_core::MAX_TIMEOUT`], or a variable that did not
    /// parse.
    pub fn build(self) -> Result<MpiBroadcaster> {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let only_thread = (mpi::environment::threading_support() < Threading::Serialized)
            .then(|| std::thread::current().id());
        let me = (
            usize::try_from(rank).unwrap_or_default(),
            usize::try_from(size).unwrap_or(1),
        );
        let transport = Mpi {
            comm: self.comm,
            buf: Box::default(),
        };
        Ok(MpiBroadcaster {
            group: SlabGroup::new(BACKEND, MAGIC, transport, me, &self.opts)?,
            only_thread,
        })
    }
}

/// Runs one `MPI_Ibcast` of `buf` from `root` and polls it until it completes or the
/// deadline passes. Gives the buffer back when done; `None` on a timeout, when the buffer
/// is leaked because MPI may still write into it.
fn ibcast(
    comm: &SimpleCommunicator,
    root: usize,
    buf: Box<[u8]>,
    deadline: Instant,
) -> Result<Option<Box<[u8]>>> {
    let count =
        c_int::try_from(buf.len()).map_err(|_| Error::config("buffer too large for MPI"))?;
    let root = c_int::try_from(root).map_err(|_| Error::config("root too large for MPI"))?;
    let ptr = Box::into_raw(buf);
    // SAFETY: reading a predefined MPI constant.
    let mut request: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `ptr` points to `count` bytes that stay allocated until the request
    // completes (below) or forever (leaked on a timeout); the communicator is valid while
    // the caller holds it; the datatype is a predefined MPI constant.
    let rc = unsafe {
        ffi::MPI_Ibcast(
            ptr.cast::<std::ffi::c_void>(),
            count,
            ffi::RSMPI_UINT8_T,
            root,
            comm.as_raw(),
            &mut request,
        )
    };
    if rc != 0 {
        // SAFETY: the request was not started, so MPI holds no reference to the buffer.
        drop(unsafe { Box::from_raw(ptr) });
        return Err(Error::Transport {
            backend: BACKEND,
            message: format!("MPI_Ibcast failed with code {rc}"),
            source: None,
        });
    }
    let started = Instant::now();
    loop {
        let mut flag: c_int = 0;
        // SAFETY: `request` is the live request started above; status is ignored.
        let rc = unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            // The request's state is unknown: leave the buffer to MPI.
            return Err(Error::Transport {
                backend: BACKEND,
                message: format!("MPI_Test failed with code {rc}"),
                source: None,
            });
        }
        if flag != 0 {
            // SAFETY: the request completed, so MPI no longer uses the buffer.
            return Ok(Some(unsafe { Box::from_raw(ptr) }));
        }
        if Instant::now() >= deadline {
            tracing::warn!("MPI broadcast timed out; its buffer is left to MPI");
            return Ok(None);
        }
        // Keep testing (each test moves the collective on): yielding between tests was
        // measured slower, even with more ranks than cores. After a few milliseconds the
        // round is late anyway; then sleep between tests so a long wait does not burn a core.
        if started.elapsed() > SPIN_FOR {
            std::thread::sleep(Duration::from_micros(50));
        }
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
        }
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
            Some(t) if t != std::thread::current().id() => Err(Error::config(
                "MPI was initialised below Threading::Serialized: call from the thread that created the broadcaster",
            )),
            _ => Ok(()),
        }
    }
}

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

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        self.check_thread()?;
        self.group.broadcast_blocking(root, payload)
    }
}
