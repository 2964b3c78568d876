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
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use lens_core::slab::SlabFormat;
use lens_core::{Broadcaster, Error, Result, check_broadcast_args};
use mpi::environment::Threading;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::Communicator;

const BACKEND: &str = "mpi";
const MAGIC: [u8; 4] = *b"LNSM";
/// Bytes of the slab header: marker, slab size, payload length, format version.
pub const HEADER: usize = lens_core::slab::HEADER_LEN;
/// Default slab size in bytes: room for a carrier with a trace state and some baggage.
pub const DEFAULT_SLAB: usize = 512;
/// How long a round polls without pausing.
const SPIN_FOR: Duration = Duration::from_millis(2);
/// Default deadline of a round.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

struct Inner {
    comm: SimpleCommunicator,
    slab: Box<[u8]>,
    broken: Option<String>,
}

// SAFETY: the communicator handle is only used with the mutex held, so MPI never sees two
// calls on it at once; with a threading level below Serialized every call is also checked
// to come from the creating thread (`MpiBroadcaster::check_thread`).
unsafe impl Send for Inner {}

/// One rank of an MPI communicator, as a [`Broadcaster`].
pub struct MpiBroadcaster {
    inner: Mutex<Inner>,
    rank: usize,
    world_size: usize,
    slab_size: usize,
    timeout: Duration,
    max_payload: usize,
    only_thread: Option<ThreadId>,
}

impl std::fmt::Debug for MpiBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiBroadcaster")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("slab_size", &self.slab_size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Builds an [`MpiBroadcaster`]; see [`MpiBroadcaster::builder`].
#[must_use]
pub struct MpiBroadcasterBuilder {
    comm: SimpleCommunicator,
    slab_size: usize,
    timeout: Duration,
    max_payload: usize,
}

impl MpiBroadcasterBuilder {
    /// Slab size in bytes, header included (default [`DEFAULT_SLAB`]). Every rank of the
    /// communicator must use the same size.
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.slab_size = bytes;
        self
    }

    /// Deadline of each round (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Largest payload (default [`lens_core::DEFAULT_MAX_PAYLOAD`]).
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.max_payload = bytes;
        self
    }

    /// The broadcaster.
    ///
    /// # Errors
    /// [`Error::Config`] for a slab smaller than its header or over `i32::MAX` bytes, or a
    /// timeout that is zero or over [`lens_core::MAX_TIMEOUT`].
    pub fn build(self) -> Result<MpiBroadcaster> {
        if self.slab_size <= HEADER || c_int::try_from(self.slab_size).is_err() {
            return Err(Error::config(format!(
                "slab size {} must be over the {HEADER}-byte header and fit an int",
                self.slab_size
            )));
        }
        lens_core::check_timeout("the MPI timeout", self.timeout)?;
        let (rank, size) = (self.comm.rank(), self.comm.size());
        let only_thread = (mpi::environment::threading_support() < Threading::Serialized)
            .then(|| std::thread::current().id());
        Ok(MpiBroadcaster {
            rank: usize::try_from(rank).unwrap_or_default(),
            world_size: usize::try_from(size).unwrap_or(1),
            slab_size: self.slab_size,
            timeout: self.timeout,
            max_payload: self.max_payload.min(c_int::MAX as usize),
            only_thread,
            inner: Mutex::new(Inner {
                comm: self.comm,
                slab: vec![0u8; self.slab_size].into_boxed_slice(),
                broken: None,
            }),
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

    /// A builder for `comm`.
    pub fn builder(comm: SimpleCommunicator) -> MpiBroadcasterBuilder {
        MpiBroadcasterBuilder {
            comm,
            slab_size: DEFAULT_SLAB,
            timeout: DEFAULT_TIMEOUT,
            max_payload: lens_core::DEFAULT_MAX_PAYLOAD,
        }
    }

    /// The slab size in bytes, header included.
    pub fn slab_size(&self) -> usize {
        self.slab_size
    }

    /// Payload bytes that travel in the first collective.
    pub fn slab_capacity(&self) -> usize {
        self.slab_size - HEADER
    }

    fn check_thread(&self) -> Result<()> {
        match self.only_thread {
            Some(t) if t != std::thread::current().id() => Err(Error::config(
                "MPI was initialised below Threading::Serialized: call from the thread that created the broadcaster",
            )),
            _ => Ok(()),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn round(&self, inner: &mut Inner, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let cap = self.slab_capacity();
        let format = SlabFormat {
            magic: MAGIC,
            slab_size: self.slab_size,
            max_payload: self.max_payload,
        };
        let mut slab = std::mem::take(&mut inner.slab);
        match payload {
            Some(p) => {
                format.fill(&mut slab, p);
            }
            None => slab[..HEADER].fill(0),
        }
        let timed_out = |inner: &mut Inner, missing: Vec<usize>| {
            inner.broken = Some(format!("a broadcast from root {root} timed out"));
            Error::Timeout {
                after: start.elapsed(),
                missing,
            }
        };
        let back = ibcast(&inner.comm, root, slab, deadline)?;
        let Some(slab) = back else {
            return Err(timed_out(inner, Vec::new()));
        };
        let len = match format.read(&slab, root) {
            Ok(len) => len,
            Err(e) => {
                inner.slab = slab;
                // The root may still send a remainder this rank cannot size: stop here.
                inner.broken = Some(e.to_string());
                return Err(e);
            }
        };
        let first = len.min(cap);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&slab[HEADER..HEADER + first]);
        inner.slab = slab;
        if len > cap {
            // The remainder, in a second collective every rank knows to expect from the header.
            let rest: Box<[u8]> = match payload {
                Some(p) => p[cap..].into(),
                None => vec![0u8; len - cap].into_boxed_slice(),
            };
            let back = ibcast(&inner.comm, root, rest, deadline)?;
            let Some(rest) = back else {
                return Err(timed_out(inner, Vec::new()));
            };
            out.extend_from_slice(&rest);
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl Broadcaster for MpiBroadcaster {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn max_payload(&self) -> usize {
        self.max_payload
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        self.check_thread()?;
        let mut inner = self.inner();
        if let Some(why) = &inner.broken {
            return Err(Error::Closed {
                backend: BACKEND,
                reason: format!(
                    "{why}; MPI cannot cancel a collective, so this communicator is no longer usable"
                ),
            });
        }
        self.round(&mut inner, root, payload)
    }
}
