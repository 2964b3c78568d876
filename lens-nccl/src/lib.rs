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
//!   any other [`Broadcaster`] (TCP, MPI, local); [`NcclBroadcaster::from_comm`] wraps a
//!   communicator (and its stream) that the application already owns.
//! - A round that does not complete by the deadline aborts the communicator
//!   (`ncclCommAbort`) and returns [`Error::Timeout`]; later rounds get [`Error::Closed`].
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

pub mod bench;
mod probe;

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, Id};
use lens_core::slab::SlabFormat;
use lens_core::{Broadcaster, Error, Result, check_broadcast_args};

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

fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> Error {
    Error::Transport {
        backend: BACKEND,
        message: format!(
            "{what} failed with NCCL result {:?} (code {})",
            e.0, e.0 as i32
        ),
        source: None,
    }
}

fn cuda_err(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Transport {
        backend: BACKEND,
        message: format!("{what} failed with CUDA error {:?}", e.0),
        source: None,
    }
}

/// The communicator, unless a timeout aborted it.
fn live(comm: Option<&Comm>) -> Result<&Comm> {
    comm.ok_or_else(|| Error::Closed {
        backend: BACKEND,
        reason: "the communicator was aborted".into(),
    })
}

struct Inner {
    comm: Option<Comm>,
    stream: Arc<CudaStream>,
    slab: CudaSlice<u8>,
    host: Vec<u8>,
    broken: Option<String>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; every use goes through the mutex around `Inner`.
unsafe impl Send for Inner {}

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

impl NcclBroadcaster {
    /// Joins an NCCL communicator on GPU `device` with the ranks of `other`: rank 0 creates
    /// the unique id, `other` carries it to every rank, and each rank initialises NCCL.
    ///
    /// # Errors
    /// [`Error::Unavailable`] on a machine without CUDA, NCCL or the device (on every rank:
    /// rank 0's failure is sent to the others); NCCL and CUDA failures as
    /// [`Error::Transport`] with their result codes.
    pub async fn bootstrap(other: &dyn Broadcaster, device: usize) -> Result<Self> {
        let id = exchange_id(other, new_id).await?;
        probe()?;
        let ctx = guarded("cuCtxCreate", || CudaContext::new(device))?
            .map_err(|e| cuda_err(&format!("opening device {device}"), e))?;
        let stream = guarded("cuStreamCreate", || ctx.new_stream())?
            .map_err(|e| cuda_err("creating a stream", e))?;
        let mut internal = [0 as c_char; ID_LEN];
        for (i, b) in internal.iter_mut().zip(id) {
            *i = b as c_char;
        }
        let (rank, world) = (other.rank(), other.world_size());
        let comm = guarded("ncclCommInitRank", || {
            Comm::from_rank(stream, rank, world, Id::uninit(internal))
        })?
        .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Self::from_comm(comm)
    }

    /// Wraps a communicator the application already owns (its stream is used too).
    ///
    /// # Errors
    /// [`Error::Transport`] when the device slab cannot be allocated.
    pub fn from_comm(comm: Comm) -> Result<Self> {
        Self::with_options(comm, DEFAULT_SLAB, DEFAULT_TIMEOUT)
    }

    /// [`NcclBroadcaster::from_comm`] with a slab size (header included) and a deadline.
    ///
    /// # Errors
    /// [`Error::Config`] for a slab not over the header or a zero timeout;
    /// [`Error::Transport`] when the slab cannot be allocated.
    pub fn with_options(comm: Comm, slab_size: usize, timeout: Duration) -> Result<Self> {
        if slab_size <= HEADER || timeout.is_zero() {
            return Err(Error::config(format!(
                "slab size {slab_size} must be over the {HEADER}-byte header and the timeout positive"
            )));
        }
        let stream = comm.stream();
        let slab = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(slab_size))?
            .map_err(|e| cuda_err("allocating the device slab", e))?;
        Ok(NcclBroadcaster {
            rank: comm.rank(),
            world_size: comm.world_size(),
            slab_size,
            timeout,
            max_payload: lens_core::DEFAULT_MAX_PAYLOAD,
            inner: Mutex::new(Inner {
                comm: Some(comm),
                stream,
                slab,
                host: vec![0u8; slab_size],
                broken: None,
            }),
        })
    }

    /// A raw `ncclBroadcast` of `len` bytes (the root's `payload`) with no lens framing:
    /// copy to the device, broadcast, wait, copy back. The baseline of the NCCL bench.
    ///
    /// # Errors
    /// As [`Broadcaster::broadcast`].
    pub fn raw_broadcast(
        &self,
        root: usize,
        payload: Option<&[u8]>,
        len: usize,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut inner = self.inner();
        let root_i32 =
            i32::try_from(root).map_err(|_| Error::config("root does not fit NCCL's int"))?;
        let stream = inner.stream.clone();
        let mut buf = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(len.max(1)))?
            .map_err(|e| cuda_err("allocating", e))?;
        if let Some(p) = payload {
            guarded("cuMemcpyHtoD", || stream.memcpy_htod(p, &mut buf))?
                .map_err(|e| cuda_err("copying to the device", e))?;
        }
        {
            let comm = live(inner.comm.as_ref())?;
            guarded("ncclBroadcast", || {
                comm.broadcast_in_place(&mut buf, root_i32)
            })?
            .map_err(|e| nccl_err("ncclBroadcast", e))?;
        }
        Self::wait(&mut inner, start + self.timeout, start)?;
        let mut out = vec![0u8; len.max(1)];
        guarded("cuMemcpyDtoH", || stream.memcpy_dtoh(&buf, &mut out))?
            .map_err(|e| cuda_err("copying from the device", e))?;
        guarded("cuStreamSynchronize", || stream.synchronize())?
            .map_err(|e| cuda_err("synchronising", e))?;
        out.truncate(len);
        Ok(out)
    }

    /// Payload bytes that travel in the first broadcast.
    pub fn slab_capacity(&self) -> usize {
        self.slab_size - HEADER
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the work queued on the stream, up to `deadline`; on a timeout aborts the
    /// communicator so that no rank stays stuck in it.
    fn wait(inner: &mut Inner, deadline: Instant, start: Instant) -> Result<()> {
        let event = guarded("cuEventRecord", || inner.stream.record_event(None))?
            .map_err(|e| cuda_err("recording an event", e))?;
        let mut spins = 0u32;
        loop {
            match guarded("cuEventQuery", || event.try_is_complete())? {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(cuda_err("waiting for the broadcast", e)),
            }
            if Instant::now() >= deadline {
                inner.broken =
                    Some("a broadcast timed out and the communicator was aborted".into());
                // Dropping a cudarc communicator calls ncclCommAbort.
                let comm = inner.comm.take();
                if guarded("ncclCommAbort", move || drop(comm)).is_err() {
                    tracing::warn!("ncclCommAbort failed");
                }
                return Err(Error::Timeout {
                    after: start.elapsed(),
                    missing: Vec::new(),
                });
            }
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
        let deadline = start + self.timeout;
        let cap = self.slab_capacity();
        let root_i32 =
            i32::try_from(root).map_err(|_| Error::config("root does not fit NCCL's int"))?;
        let format = SlabFormat {
            magic: MAGIC,
            slab_size: self.slab_size,
            max_payload: self.max_payload,
        };
        if let Some(p) = payload {
            format.fill(&mut inner.host, p);
            let (stream, host, slab) = (&inner.stream, &inner.host, &mut inner.slab);
            guarded("cuMemcpyHtoD", || stream.memcpy_htod(host, slab))?
                .map_err(|e| cuda_err("copying to the device", e))?;
        }
        {
            let Inner { comm, slab, .. } = &mut *inner;
            let comm = live(comm.as_ref())?;
            guarded("ncclBroadcast", || comm.broadcast_in_place(slab, root_i32))?
                .map_err(|e| nccl_err("ncclBroadcast", e))?;
        }
        Self::wait(inner, deadline, start)?;
        {
            let (stream, host, slab) = (&inner.stream, &mut inner.host, &inner.slab);
            guarded("cuMemcpyDtoH", || stream.memcpy_dtoh(slab, host))?
                .map_err(|e| cuda_err("copying from the device", e))?;
            guarded("cuStreamSynchronize", || stream.synchronize())?
                .map_err(|e| cuda_err("synchronising", e))?;
        }
        let len = match format.read(&inner.host, root) {
            Ok(len) => len,
            Err(e) => {
                // The root may still send a remainder this rank cannot size: stop here.
                inner.broken = Some(e.to_string());
                return Err(e);
            }
        };
        let h = &inner.host;
        let mut out = h[HEADER..HEADER + len.min(cap)].to_vec();
        if len > cap {
            let rest_len = len - cap;
            let stream = inner.stream.clone();
            let mut rest = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(rest_len))?
                .map_err(|e| cuda_err("allocating the remainder", e))?;
            if let Some(p) = payload {
                guarded("cuMemcpyHtoD", || stream.memcpy_htod(&p[cap..], &mut rest))?
                    .map_err(|e| cuda_err("copying to the device", e))?;
            }
            {
                let comm = live(inner.comm.as_ref())?;
                guarded("ncclBroadcast", || {
                    comm.broadcast_in_place(&mut rest, root_i32)
                })?
                .map_err(|e| nccl_err("ncclBroadcast", e))?;
            }
            Self::wait(inner, deadline, start)?;
            let mut host_rest = vec![0u8; rest_len];
            guarded("cuMemcpyDtoH", || stream.memcpy_dtoh(&rest, &mut host_rest))?
                .map_err(|e| cuda_err("copying from the device", e))?;
            guarded("cuStreamSynchronize", || stream.synchronize())?
                .map_err(|e| cuda_err("synchronising", e))?;
            out.extend_from_slice(&host_rest);
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
        let mut inner = self.inner();
        if let Some(why) = &inner.broken {
            return Err(Error::Closed {
                backend: BACKEND,
                reason: why.clone(),
            });
        }
        self.round(&mut inner, root, payload)
    }
}
