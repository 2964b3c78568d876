//! NCCL backend for **lens**: trace-context broadcast on GPU (cudarc, loaded at run time).
//!
//! [`NcclBroadcaster`] keeps a persistent device slab (a 16-byte header and the payload);
//! a round is one `ncclBroadcast` of the slab, an event polled against a deadline, and a
//! device-to-host copy. Payloads over the slab send their remainder in a second broadcast.
//!
//! - It builds with no CUDA installed and never panics on a machine without CUDA or NCCL:
//!   [`probe`] checks the libraries and their symbols first (cudarc panics when one is
//!   missing) and everything returns [`Error::Unavailable`] with the reason.
//! - [`NcclBroadcaster::bootstrap`] creates the NCCL unique id on rank 0 and sends it over
//!   any other [`Broadcaster`] (TCP, MPI, local), then joins NCCL under a deadline
//!   ([`NcclOptions::init_timeout`]). A communicator the application already has works too:
//!   [`NcclBroadcaster::from_comm`] takes a cudarc `Comm` over,
//!   [`NcclBroadcaster::from_shared`] shares one the application keeps using, and
//!   [`NcclBroadcaster::from_raw`] takes raw NCCL and CUDA handles (from PyTorch, say).
//! - A round that does not complete by the deadline returns [`Error::Timeout`] and aborts the
//!   communicator (`ncclCommAbort`) when lens owns it; a round that fails part-way does the
//!   same (the rank is out of step with its peers). Later rounds get [`Error::Closed`].
//! - The round logic is written against a small device trait; this crate's tests run it,
//!   conformance suite included, on a simulated NCCL group, and the cudarc path runs on
//!   `lens_testkit::fake_gpu`, so both are checked without a GPU.
//! - NCCL failures keep the NCCL result code in the error.
//! - `broadcast` blocks its thread until the round is done (it polls a CUDA event).
//!
//! ```no_run
//! use lens_nccl::NcclBroadcaster;
//! use lens_tcp::{TcpBroadcaster, TcpConfig};
//!
//! # fn main() -> lens_core::Result<()> {
//! // Any broadcaster carries the NCCL id; here the job's TCP group (torchrun variables).
//! let tcp = TcpBroadcaster::connect(TcpConfig::from_env()?)?;
//! let local_rank = lens_core::RankInfo::from_env()?.local_rank.unwrap_or(0);
//! let gpu = futures::executor::block_on(NcclBroadcaster::bootstrap(&tcp, local_rank))?;
//! let carrier = lens_core::blocking::broadcast_trace_context(&gpu, 0)?;
//! # let _ = carrier;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// Loading CUDA/NCCL libraries to check them, and a Send marker for the NCCL communicator.
#![allow(unsafe_code)]

/// The cudarc this crate is built on, to name its types (`Comm`, `CudaStream`, raw handles)
/// at the same version.
pub use cudarc;

mod device;
mod probe;
#[cfg(test)]
mod sim;

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUstream;
use cudarc::nccl::sys::ncclComm_t;
use cudarc::nccl::{Comm, Id};
use lens_core::slab::SlabFormat;
use lens_core::{Broadcaster, Error, Result, check_broadcast_args};

use device::{Buf, Cuda, Device, Handle};
use probe::{BACKEND, guarded};
pub use probe::{Probe, probe};

const MAGIC: [u8; 4] = *b"LNSN";
/// Bytes of the slab header: marker, slab size, payload length, format version.
pub const HEADER: usize = lens_core::slab::HEADER_LEN;
/// Default slab size in bytes.
pub const DEFAULT_SLAB: usize = 512;
/// Default deadline of a round.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an NCCL unique id.
pub const ID_LEN: usize = 128;

/// An NCCL call's result code, kept as the source of the [`Error::Transport`] it caused.
///
/// ```
/// # fn check(e: &lens_core::Error) {
/// use std::error::Error as _;
/// if let Some(nccl) = e.source().and_then(|s| s.downcast_ref::<lens_nccl::NcclResult>()) {
///     eprintln!("NCCL said {} ({})", nccl.name, nccl.code);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NcclResult {
    /// The `ncclResult_t` value.
    pub code: i32,
    /// Its name, such as `ncclRemoteError`.
    pub name: String,
}

impl std::fmt::Display for NcclResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL result {} (code {})", self.name, self.code)
    }
}

impl std::error::Error for NcclResult {}

fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> Error {
    let result = NcclResult {
        code: e.0 as i32,
        name: format!("{:?}", e.0),
    };
    Error::Transport {
        backend: BACKEND,
        message: format!("{what} failed with {result}"),
        source: Some(Box::new(result)),
    }
}

fn cuda_err(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Transport {
        backend: BACKEND,
        message: format!("{what} failed with CUDA error {:?}", e.0),
        source: Some(Box::new(e)),
    }
}

struct Inner {
    dev: Box<dyn Device>,
    /// Host copy of the slab.
    host: Vec<u8>,
    /// Why later rounds are refused, once a round left the group out of step.
    broken: Option<String>,
}

/// One rank of an NCCL communicator, one GPU per rank, as a [`Broadcaster`].
pub struct NcclBroadcaster {
    inner: Mutex<Inner>,
    rank: usize,
    world_size: usize,
    slab_size: usize,
    timeout: Duration,
    max_payload: usize,
}

impl std::fmt::Debug for NcclBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclBroadcaster")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("slab_size", &self.slab_size)
            .finish_non_exhaustive()
    }
}

/// The id exchange of [`NcclBroadcaster::bootstrap`]: rank 0 runs `make_id` and sends
/// `[1] + id` (or `[0] + why it failed`) over `other`; every rank returns the id.
///
/// # Errors
/// On rank 0, `make_id`'s error; on the others [`Error::Unavailable`] with rank 0's reason,
/// [`Error::Corrupt`] for a malformed message, or `other`'s transport error.
pub async fn exchange_id(
    other: &dyn Broadcaster,
    make_id: impl FnOnce() -> Result<[u8; ID_LEN]>,
) -> Result<[u8; ID_LEN]> {
    if other.rank() == 0 {
        let made = make_id();
        let msg = match &made {
            Ok(id) => [&[1u8][..], id].concat(),
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
        };
        other.broadcast(0, Some(&msg)).await?;
        return made;
    }
    let msg = other.broadcast(0, None).await?;
    match msg.split_first() {
        Some((1, id)) if id.len() == ID_LEN => {
            let mut out = [0u8; ID_LEN];
            out.copy_from_slice(id);
            Ok(out)
        }
        Some((0, why)) => Err(Error::Unavailable {
            backend: BACKEND,
            reason: format!(
                "rank 0 could not create the NCCL id: {}",
                String::from_utf8_lossy(why)
            ),
        }),
        _ => Err(Error::Corrupt {
            reason: format!("malformed NCCL id message of {} bytes", msg.len()),
        }),
    }
}

fn new_id() -> Result<[u8; ID_LEN]> {
    probe()?;
    let id = guarded("ncclGetUniqueId", Id::new)?.map_err(|e| nccl_err("ncclGetUniqueId", e))?;
    let mut out = [0u8; ID_LEN];
    for (o, c) in out.iter_mut().zip(id.internal()) {
        *o = *c as u8;
    }
    Ok(out)
}

/// Settings of an [`NcclBroadcaster`]; every rank of a group must use the same slab size.
///
/// ```
/// use std::time::Duration;
/// let opts = lens_nccl::NcclOptions::default()
///     .slab_size(1024)
///     .timeout(Duration::from_secs(5));
/// assert_eq!(opts.slab_size, 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NcclOptions {
    /// Slab size in bytes, header included (default [`DEFAULT_SLAB`]).
    pub slab_size: usize,
    /// Deadline of one round (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// Deadline of `ncclCommInitRank` in [`NcclBroadcaster::bootstrap_with`] (default
    /// [`DEFAULT_INIT_TIMEOUT`]): NCCL's init waits for every rank with no deadline of its own.
    pub init_timeout: Duration,
}

/// Default deadline of the NCCL init in [`NcclBroadcaster::bootstrap`].
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            slab_size: DEFAULT_SLAB,
            timeout: DEFAULT_TIMEOUT,
            init_timeout: DEFAULT_INIT_TIMEOUT,
        }
    }
}

impl NcclOptions {
    /// Sets the slab size (header included; must be over [`HEADER`]).
    pub fn slab_size(mut self, bytes: usize) -> Self {
        self.slab_size = bytes;
        self
    }

    /// Sets the deadline of one round (must be positive).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the deadline of the NCCL init (must be positive).
    pub fn init_timeout(mut self, timeout: Duration) -> Self {
        self.init_timeout = timeout;
        self
    }

    fn check(&self) -> Result<()> {
        if self.slab_size <= HEADER {
            return Err(Error::config(format!(
                "slab size {} must be over the {HEADER}-byte header",
                self.slab_size
            )));
        }
        lens_core::check_timeout("the NCCL timeout", self.timeout)?;
        lens_core::check_timeout("the NCCL init timeout", self.init_timeout)?;
        Ok(())
    }
}

/// A value moved to another thread although its type is not `Send`.
struct AssertSend<T>(T);

// SAFETY: used only for a cudarc `Comm` made on a helper thread and handed over once; NCCL
// communicators may be used from any thread as long as calls do not overlap.
unsafe impl<T> Send for AssertSend<T> {}

/// Runs `f` on a helper thread and waits for it until `timeout`. On a timeout the thread is
/// left behind (blocked in a call that cannot be cancelled, such as `ncclCommInitRank`) and
/// whatever it returns later is dropped there.
fn with_deadline<T: 'static>(
    what: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("lens-nccl {what}"))
        .spawn(move || {
            let made = guarded(what, || f().map(AssertSend)).and_then(|r| r);
            if let Err(std::sync::mpsc::TrySendError::Disconnected(Ok(late))) = tx.try_send(made) {
                tracing::warn!("{what} finished after its deadline; dropping what it made");
                // A late communicator is aborted by its drop, which cudarc lets panic.
                let _ = guarded("dropping a late result", move || drop(late));
            }
        })
        .map_err(|e| Error::Transport {
            backend: BACKEND,
            message: format!("cannot start a thread for {what}"),
            source: Some(Box::new(e)),
        })?;
    match rx.recv_timeout(timeout) {
        Ok(made) => made.map(|AssertSend(v)| v),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            tracing::warn!(
                ?timeout,
                "{what} did not finish in time; its thread is left behind"
            );
            Err(Error::Timeout {
                after: start.elapsed(),
                missing: Vec::new(),
            })
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Unavailable {
            backend: BACKEND,
            reason: format!("{what} ended without an answer"),
        }),
    }
}

impl NcclBroadcaster {
    /// Joins an NCCL communicator on GPU `device` with the ranks of `other`: rank 0 creates
    /// the unique id, `other` carries it to every rank, and each rank initialises NCCL.
    /// Default [`NcclOptions`].
    ///
    /// # Errors
    /// As [`NcclBroadcaster::bootstrap_with`].
    pub async fn bootstrap(other: &dyn Broadcaster, device: usize) -> Result<Self> {
        Self::bootstrap_with(other, device, &NcclOptions::default()).await
    }

    /// [`NcclBroadcaster::bootstrap`] with options.
    ///
    /// # Errors
    /// [`Error::Unavailable`] on a machine without CUDA, NCCL or the device (on every rank:
    /// rank 0's failure is sent to the others); [`Error::Timeout`] when a rank does not join
    /// NCCL's init in time (NCCL cannot cancel it: its helper thread is left behind, blocked
    /// in `ncclCommInitRank`, and a communicator it makes later is aborted there); NCCL and CUDA failures as [`Error::Transport`] with their result
    /// codes; [`Error::Config`] for bad options.
    pub async fn bootstrap_with(
        other: &dyn Broadcaster,
        device: usize,
        opts: &NcclOptions,
    ) -> Result<Self> {
        opts.check()?;
        let id = exchange_id(other, new_id).await?;
        probe()?;
        let mut internal = [0 as c_char; ID_LEN];
        for (i, b) in internal.iter_mut().zip(id) {
            *i = b as c_char;
        }
        let (rank, world) = (other.rank(), other.world_size());
        // The context, stream and communicator are made on one thread (NCCL's init uses the
        // thread's current device); cudarc binds the context again wherever it is used.
        let comm = with_deadline("ncclCommInitRank", opts.init_timeout, move || {
            let ctx = CudaContext::new(device)
                .map_err(|e| cuda_err(&format!("opening device {device}"), e))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| cuda_err("creating a stream", e))?;
            Comm::from_rank(stream, rank, world, Id::uninit(internal))
                .map_err(|e| nccl_err("ncclCommInitRank", e))
        })?;
        Self::with_options(comm, opts)
    }

    /// One broadcaster per local GPU, all in this process (`ncclCommInitAll`): a group on one
    /// machine with no other transport to carry the NCCL id, as a benchmark or a test uses.
    /// Run each rank's rounds on a thread of its own: a collective waits for every rank.
    ///
    /// # Errors
    /// [`Error::Unavailable`] without CUDA or NCCL; NCCL and CUDA failures as
    /// [`Error::Transport`]; [`Error::Config`] for bad options.
    pub fn on_every_device(opts: &NcclOptions) -> Result<Vec<Self>> {
        opts.check()?;
        let found = probe()?;
        let streams = (0..found.devices)
            .map(|d| {
                let ctx = guarded("cuCtxCreate", || CudaContext::new(d))?
                    .map_err(|e| cuda_err(&format!("opening device {d}"), e))?;
                guarded("cuStreamCreate", || ctx.new_stream())?
                    .map_err(|e| cuda_err("creating a stream", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let comms = guarded("ncclCommInitAll", || Comm::from_devices(streams))?
            .map_err(|e| nccl_err("ncclCommInitAll", e))?;
        comms
            .into_iter()
            .map(|c| Self::with_options(c, opts))
            .collect()
    }

    /// Wraps a cudarc communicator, which lens then owns (its stream is used too), with
    /// default [`NcclOptions`]. To keep using the communicator, see
    /// [`NcclBroadcaster::from_shared`].
    ///
    /// # Errors
    /// [`Error::Transport`] when the device slab cannot be allocated.
    pub fn from_comm(comm: Comm) -> Result<Self> {
        Self::with_options(comm, &NcclOptions::default())
    }

    /// [`NcclBroadcaster::from_comm`] with options (`init_timeout` is not used). A failed
    /// round aborts the communicator; so does dropping the broadcaster (cudarc's `Comm`
    /// aborts on drop).
    ///
    /// # Errors
    /// [`Error::Config`] for bad options; [`Error::Transport`] when the slab cannot be
    /// allocated.
    pub fn with_options(comm: Comm, opts: &NcclOptions) -> Result<Self> {
        opts.check()?;
        let (rank, world_size, stream) = (comm.rank(), comm.world_size(), comm.stream());
        Self::over(Handle::Owned(comm), stream, rank, world_size, opts)
    }

    /// Works on a cudarc communicator (and its stream) that the application keeps using: lens
    /// holds a clone of the `Arc`, and its rounds queue on the communicator's stream in order
    /// with the application's work. lens never aborts it while the application holds it: after
    /// a round that timed out, lens drops its clone and refuses later rounds, and the
    /// application decides (a collective is stuck in the communicator; dropping the last
    /// `Arc` aborts it). The device buffers of such a round are leaked, since a kernel may
    /// still write to them.
    ///
    /// # Safety
    /// cudarc's `Comm` is neither `Send` nor `Sync`, and NCCL communicators are not
    /// thread-safe; the broadcaster may run rounds from any thread. The application must not
    /// call NCCL on this communicator (or drop its last `Arc`) on another thread while a lens
    /// round runs.
    ///
    /// # Errors
    /// [`Error::Config`] for bad options; [`Error::Transport`] when the slab cannot be
    /// allocated.
    pub unsafe fn from_shared(comm: Arc<Comm>, opts: &NcclOptions) -> Result<Self> {
        opts.check()?;
        let (rank, world_size, stream) = (comm.rank(), comm.world_size(), comm.stream());
        Self::over(Handle::Shared(comm), stream, rank, world_size, opts)
    }

    /// Works on an NCCL communicator and CUDA stream that the application owns as raw
    /// handles, for instance from PyTorch (`ProcessGroupNCCL`'s communicator and
    /// `torch.cuda.current_stream().cuda_stream`) in a mixed Python and Rust process. Rank,
    /// world size and device are read from the communicator. lens never aborts or destroys
    /// either handle; after a round that timed out it refuses later rounds and leaks its
    /// device buffers (a kernel may still write to them), and the application decides what
    /// to do with the communicator (a collective is stuck in it).
    ///
    /// # Safety
    /// - `comm` is a valid NCCL communicator and `stream` a valid CUDA stream of the
    ///   communicator's device, in the primary context of that device; both outlive the
    ///   broadcaster.
    /// - Nothing calls NCCL on `comm` from another thread while a lens round runs.
    /// - The NCCL library lens loads (`libnccl.so` on the loader path, see [`probe`]) is the
    ///   file that made `comm`: a `libnccl.so` link to the application's `libnccl.so.2`, so
    ///   the loader hands back the copy already in the process.
    ///
    /// # Errors
    /// [`Error::Unavailable`] without CUDA or NCCL; NCCL and CUDA failures as
    /// [`Error::Transport`]; [`Error::Config`] for bad options.
    pub unsafe fn from_raw(comm: ncclComm_t, stream: CUstream, opts: &NcclOptions) -> Result<Self> {
        opts.check()?;
        probe()?;
        let ask = |what: &'static str, f: unsafe fn(ncclComm_t) -> std::result::Result<i32, _>| {
            // SAFETY: `comm` is valid (the caller's promise); these only read from it.
            guarded(what, || unsafe { f(comm) })?
                .map_err(|e| nccl_err(what, e))
                .and_then(|v| {
                    usize::try_from(v).map_err(|_| Error::config(format!("{what} gave {v}")))
                })
        };
        let rank = ask("ncclCommUserRank", cudarc::nccl::result::comm_user_rank)?;
        let world_size = ask("ncclCommCount", cudarc::nccl::result::comm_count)?;
        let device = ask("ncclCommCuDevice", cudarc::nccl::result::comm_cu_device)?;
        let ctx = guarded("cuDevicePrimaryCtxRetain", || CudaContext::new(device))?
            .map_err(|e| cuda_err(&format!("opening device {device}"), e))?;
        // SAFETY: `stream` belongs to this device's primary context and outlives the
        // broadcaster (the caller's promise); the wrapper never destroys it.
        let stream = unsafe { ctx.wrap_borrowed_stream(stream) };
        Self::over(Handle::Raw(comm), stream, rank, world_size, opts)
    }

    fn over(
        comm: Handle,
        stream: Arc<cudarc::driver::CudaStream>,
        rank: usize,
        world_size: usize,
        opts: &NcclOptions,
    ) -> Result<Self> {
        let dev = Cuda::new(comm, stream, opts.slab_size)?;
        Ok(Self::from_device(
            Box::new(dev),
            rank,
            world_size,
            opts.slab_size,
            opts.timeout,
        ))
    }

    fn from_device(
        dev: Box<dyn Device>,
        rank: usize,
        world_size: usize,
        slab_size: usize,
        timeout: Duration,
    ) -> Self {
        NcclBroadcaster {
            rank,
            world_size,
            slab_size,
            timeout,
            max_payload: lens_core::DEFAULT_MAX_PAYLOAD,
            inner: Mutex::new(Inner {
                dev,
                host: vec![0u8; slab_size],
                broken: None,
            }),
        }
    }

    /// A raw `ncclBroadcast` of `len` bytes (the root's `payload`) with no lens framing:
    /// copy to the device, broadcast, wait, copy back, through a device buffer kept between
    /// calls. The baseline of the NCCL bench.
    ///
    /// # Errors
    /// As [`Broadcaster::broadcast`]; [`Error::Config`] when the root's payload is not `len`
    /// bytes long.
    pub fn raw_broadcast(
        &self,
        root: usize,
        payload: Option<&[u8]>,
        len: usize,
    ) -> Result<Vec<u8>> {
        let payload = check_broadcast_args(self, root, payload)?;
        if let Some(p) = payload.filter(|p| p.len() != len) {
            return Err(Error::config(format!(
                "raw payload of {} bytes where {len} were announced",
                p.len()
            )));
        }
        let start = Instant::now();
        let mut guard = self.inner();
        let inner = &mut *guard;
        Self::check_live(inner)?;
        let mut out = vec![0u8; len];
        let result = (|| {
            inner.dev.reserve(Buf::Spill, len)?;
            if let Some(p) = payload {
                inner.dev.upload(Buf::Spill, p)?;
            }
            inner.dev.broadcast(Buf::Spill, len, root)?;
            self.wait(&mut *inner.dev, start)?;
            inner.dev.download(Buf::Spill, &mut out)
        })();
        Self::stop_on_error(inner, result).map(|()| out)
    }

    /// Payload bytes that travel in the first broadcast.
    pub fn slab_capacity(&self) -> usize {
        self.slab_size - HEADER
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_live(inner: &Inner) -> Result<()> {
        match &inner.broken {
            Some(why) => Err(Error::Closed {
                backend: BACKEND,
                reason: why.clone(),
            }),
            None => Ok(()),
        }
    }

    /// A round that failed part-way leaves this rank out of step with the others (they may
    /// still be inside the collective, or the root may still send a remainder): abort the
    /// communicator, so none of this rank's kernels wait on the peers, and refuse later rounds.
    fn stop_on_error<T>(inner: &mut Inner, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            if inner.broken.is_none() {
                inner.broken = Some(format!("an earlier round failed: {e}"));
                inner.dev.abort();
            }
        }
        result
    }

    /// Waits for the queued broadcast until the round's deadline; a timeout is reported as
    /// an error (and the communicator then aborted by [`Self::stop_on_error`]).
    fn wait(&self, dev: &mut dyn Device, start: Instant) -> Result<()> {
        let deadline = start + self.timeout;
        let mut spins = 0u32;
        loop {
            if dev.finished()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    after: start.elapsed(),
                    missing: Vec::new(),
                });
            }
            // Spin briefly (a broadcast on one node takes microseconds), then yield the core.
            spins += 1;
            if spins > 2_000 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn round(&self, inner: &mut Inner, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        let start = Instant::now();
        let cap = self.slab_capacity();
        let format = SlabFormat {
            magic: MAGIC,
            slab_size: self.slab_size,
            max_payload: self.max_payload,
        };
        if let Some(p) = payload {
            // Only the header and the payload's first part: receivers read no further.
            let put = format.fill(&mut inner.host, p);
            inner.dev.upload(Buf::Slab, &inner.host[..HEADER + put])?;
        }
        inner.dev.broadcast(Buf::Slab, self.slab_size, root)?;
        self.wait(&mut *inner.dev, start)?;
        inner.dev.download(Buf::Slab, &mut inner.host)?;
        let len = format.read(&inner.host, root)?;
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&inner.host[HEADER..HEADER + len.min(cap)]);
        if len > cap {
            let rest = len - cap;
            inner.dev.reserve(Buf::Spill, rest)?;
            if let Some(p) = payload {
                inner.dev.upload(Buf::Spill, &p[cap..])?;
            }
            inner.dev.broadcast(Buf::Spill, rest, root)?;
            self.wait(&mut *inner.dev, start)?;
            out.resize(len, 0);
            inner.dev.download(Buf::Spill, &mut out[cap..])?;
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl Broadcaster for NcclBroadcaster {
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
        let mut guard = self.inner();
        let inner = &mut *guard;
        Self::check_live(inner)?;
        let result = self.round(inner, root, payload);
        Self::stop_on_error(inner, result)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use lens_core::blocking;
    use lens_testkit::conformance::{Options, pattern, run_threads};
    use lens_testkit::on_each_rank as on_each;

    use super::*;
    use crate::sim::{SimFault, SimGpu, SimLog, SimWorld};

    type Logs = Vec<Arc<Mutex<SimLog>>>;

    /// A simulated group: one rank per slab size, each with its fault.
    fn group(
        slabs: &[usize],
        faults: &[SimFault],
        timeout: Duration,
    ) -> (Vec<NcclBroadcaster>, Logs) {
        let world = SimWorld::new(slabs.len());
        slabs
            .iter()
            .enumerate()
            .map(|(rank, &slab)| {
                let fault = faults.get(rank).copied().unwrap_or(SimFault::None);
                let (gpu, log) = SimGpu::new(&world, rank, slab, fault);
                let b =
                    NcclBroadcaster::from_device(Box::new(gpu), rank, slabs.len(), slab, timeout);
                (b, log)
            })
            .unzip()
    }

    fn aborted(log: &Arc<Mutex<SimLog>>) -> bool {
        log.lock().expect("log").aborted
    }

    #[test]
    fn conformance_on_simulated_gpus() {
        // (why, slab size of every rank, ranks)
        let rows = [
            ("one rank, as on a single-GPU machine", DEFAULT_SLAB, 1),
            ("two ranks, default slab", DEFAULT_SLAB, 2),
            ("four ranks, default slab", DEFAULT_SLAB, 4),
            ("one-byte slab: nearly every payload spills", HEADER + 1, 3),
            ("large slab: nothing spills below 4 KiB", HEADER + 4096, 2),
        ];
        for (why, slab, n) in rows {
            let (ranks, logs) = group(&vec![slab; n], &[], Duration::from_secs(20));
            if let Err(f) = run_threads(&ranks, &Options::default().rounds(200)) {
                panic!("{why}: {f:#?}");
            }
            assert!(!logs.iter().any(aborted), "{why}: nothing may abort");
        }
    }

    #[test]
    fn spill_buffer_is_kept_between_rounds() {
        let (ranks, logs) = group(&[DEFAULT_SLAB; 2], &[], Duration::from_secs(20));
        on_each(&ranks, |b| {
            let raw = pattern(0, 0, 1000);
            let big = pattern(1, 0, 5000);
            for _ in 0..50 {
                let got = b
                    .raw_broadcast(0, (b.rank() == 0).then_some(&raw[..]), raw.len())
                    .expect("raw");
                assert_eq!(got, raw);
                let got =
                    blocking::broadcast(b, 0, (b.rank() == 0).then_some(&big[..])).expect("lens");
                assert_eq!(got, big);
            }
        });
        for log in &logs {
            // One allocation for the raw 1,000 bytes, one when the 5,000-byte payload's
            // remainder outgrew it; none per round.
            assert_eq!(log.lock().expect("log").allocations, 2);
        }
    }

    #[test]
    fn a_rank_that_never_calls_times_out_the_others_and_they_abort() {
        let timeout = Duration::from_millis(300);
        let (ranks, logs) = group(&[DEFAULT_SLAB; 3], &[], timeout);
        let got = on_each(&ranks[..2], |b| {
            let t = Instant::now();
            let r = blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]));
            (r, t.elapsed())
        });
        for (rank, (r, took)) in got.into_iter().enumerate() {
            assert!(
                matches!(r, Err(Error::Timeout { .. })),
                "rank {rank}: {r:?}"
            );
            assert!(
                took >= timeout && took < timeout * 10,
                "rank {rank} took {took:?}"
            );
            assert!(
                aborted(&logs[rank]),
                "rank {rank} must abort its communicator"
            );
            let again = blocking::broadcast(&ranks[rank], 0, (rank == 0).then_some(&b"x"[..]));
            assert!(
                matches!(again, Err(Error::Closed { .. })),
                "rank {rank}: {again:?}"
            );
        }
        assert!(!aborted(&logs[2]));
    }

    #[test]
    fn a_failed_upload_fails_the_root_and_closes_it() {
        let (ranks, logs) = group(
            &[DEFAULT_SLAB; 2],
            &[SimFault::FailUpload(1)],
            Duration::from_millis(300),
        );
        let got = on_each(&ranks, |b| {
            blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]))
        });
        match &got[0] {
            Err(Error::Transport { message, .. }) => {
                assert!(message.contains("upload"), "{message}")
            }
            other => panic!("root: expected the upload's error, got {other:?}"),
        }
        assert!(matches!(got[1], Err(Error::Timeout { .. })), "{:?}", got[1]);
        assert!(aborted(&logs[0]) && aborted(&logs[1]));
        match blocking::broadcast(&ranks[0], 0, Some(b"again")) {
            Err(Error::Closed { reason, .. }) => assert!(reason.contains("upload"), "{reason}"),
            other => panic!("expected Closed naming the first failure, got {other:?}"),
        }
    }

    #[test]
    fn ranks_with_different_slabs_are_told_and_stop() {
        let (ranks, logs) = group(
            &[DEFAULT_SLAB, 2 * DEFAULT_SLAB],
            &[],
            Duration::from_secs(5),
        );
        let got = on_each(&ranks, |b| {
            blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]))
        });
        assert_eq!(got[0].as_deref().ok(), Some(&b"ctx"[..]));
        assert!(
            matches!(got[1], Err(Error::Mismatch { .. })),
            "{:?}",
            got[1]
        );
        assert!(aborted(&logs[1]));
        assert!(matches!(
            blocking::broadcast(&ranks[1], 0, None),
            Err(Error::Closed { .. })
        ));
    }

    #[test]
    fn nccl_failures_keep_their_result_code() {
        use cudarc::nccl::sys::ncclResult_t;
        use std::error::Error as _;
        let e = nccl_err(
            "ncclBroadcast",
            cudarc::nccl::result::NcclError(ncclResult_t::ncclInternalError),
        );
        assert!(e.to_string().contains("ncclInternalError (code 3)"), "{e}");
        let kept = e
            .source()
            .and_then(|s| s.downcast_ref::<NcclResult>())
            .expect("the NCCL result is the source");
        assert_eq!(kept.code, 3);
    }

    #[test]
    fn a_stuck_init_is_a_timeout_not_a_hang() {
        let t = Instant::now();
        let r: Result<()> = with_deadline("stuck", Duration::from_millis(200), || {
            std::thread::sleep(Duration::from_secs(30));
            Ok(())
        });
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(
            with_deadline("quick", Duration::from_secs(5), || Ok(7)).ok(),
            Some(7)
        );
        let r: Result<()> = with_deadline("failing", Duration::from_secs(5), || {
            Err(Error::config("no device"))
        });
        assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
        let r: Result<()> = with_deadline("panicking", Duration::from_secs(5), || {
            panic!("as cudarc does without a library")
        });
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    }

    #[test]
    fn bad_arguments_are_errors_before_any_work() {
        let rows = [
            (
                "slab no larger than the header",
                NcclOptions::default().slab_size(HEADER),
            ),
            ("empty slab", NcclOptions::default().slab_size(0)),
            (
                "zero timeout",
                NcclOptions::default().timeout(Duration::ZERO),
            ),
            (
                "zero init timeout",
                NcclOptions::default().init_timeout(Duration::ZERO),
            ),
        ];
        for (why, opts) in rows {
            assert!(matches!(opts.check(), Err(Error::Config { .. })), "{why}");
        }
        assert!(NcclOptions::default().check().is_ok());
        // Bad options are refused before the id exchange, so no rank waits on this one.
        let one = lens_testkit::LocalCluster::new(1).broadcasters();
        let r = futures::executor::block_on(NcclBroadcaster::bootstrap_with(
            &one[0],
            0,
            &NcclOptions::default().slab_size(1),
        ));
        assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
        let (ranks, logs) = group(&[DEFAULT_SLAB], &[], Duration::from_secs(1));
        let r = ranks[0].raw_broadcast(0, Some(b"four"), 3);
        assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
        let r = ranks[0].raw_broadcast(1, Some(b"four"), 4);
        assert!(matches!(r, Err(Error::InvalidRoot { .. })), "{r:?}");
        assert!(
            !aborted(&logs[0]),
            "a rejected call must not break the group"
        );
        assert_eq!(
            ranks[0].raw_broadcast(0, Some(b"four"), 4).expect("raw"),
            b"four"
        );
    }
}
