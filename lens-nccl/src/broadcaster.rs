//! [`NcclBroadcaster`]: the slab round of `lens_core::backend::slab` on a GPU, and the ways
//! to wrap a communicator the application already has.
// A communicator and stream handed in by the application (raw handles).
#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUstream;
use cudarc::nccl::Comm;
use cudarc::nccl::sys::ncclComm_t;
use lens_core::backend::check_broadcast_args;
use lens_core::backend::slab::{Round, Slab, SlabBroadcaster, SlabTransport};
use lens_core::{Broadcaster, Error, Result};

use crate::NcclOptions;
use crate::device::{Buf, Cuda, Device, Handle};
use crate::error::{cuda_err, nccl_err};
use crate::probe::{BACKEND, guarded, probe};

const MAGIC: [u8; 4] = *b"LNSN";

/// The GPU side of the slab round: one device, one communicator, one stream.
pub(crate) struct Gpu {
    dev: Box<dyn Device>,
    rank: usize,
    world_size: usize,
}

impl Gpu {
    /// Waits for the queued broadcast until the round's deadline.
    fn wait(&mut self, round: &Round) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if self.dev.finished()? {
                return Ok(());
            }
            if round.expired() {
                return Err(round.timed_out());
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

    /// Broadcasts the first `out.len()` bytes of `buf` (uploaded beforehand on the root)
    /// and downloads them into `out`.
    fn broadcast_into(&mut self, round: &Round, buf: Buf, out: &mut [u8]) -> Result<()> {
        self.dev.broadcast(buf, out.len(), round.root)?;
        self.wait(round)?;
        self.dev.download(buf, out)
    }
}

impl SlabTransport for Gpu {
    fn broadcast_slab(
        &mut self,
        round: &Round,
        slab: &mut Slab,
        sent: Option<usize>,
    ) -> Result<()> {
        if let Some(n) = sent {
            // Only the header and the payload's first part go up: receivers read no further.
            self.dev.upload(Buf::Slab, &slab[..n])?;
        }
        self.broadcast_into(round, Buf::Slab, slab)
    }

    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> Result<()> {
        self.dev.reserve(Buf::Spill, rest.len())?;
        if self.rank == round.root {
            self.dev.upload(Buf::Spill, rest)?;
        }
        self.broadcast_into(round, Buf::Spill, rest)
    }

    fn stop(&mut self) {
        // No kernel of this rank may wait on its peers any more.
        self.dev.abort();
    }

    /// One `ncclAllGather` of 8 bytes per rank, waited for under the round's deadline.
    fn gather_i64(&mut self, round: &Round, value: i64) -> Result<Option<Vec<i64>>> {
        self.dev.all_gather(&value.to_le_bytes(), self.world_size)?;
        self.wait(round)?;
        let mut all = vec![0u8; 8 * self.world_size];
        self.dev.download(Buf::Gather, &mut all)?;
        if self.rank != round.root {
            return Ok(Some(Vec::new()));
        }
        let values = all
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                i64::from_le_bytes(b)
            })
            .collect();
        Ok(Some(values))
    }
}

/// One rank of an NCCL communicator, one GPU per rank, as a [`Broadcaster`].
pub struct NcclBroadcaster {
    group: SlabBroadcaster<Gpu>,
}

impl std::fmt::Debug for NcclBroadcaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclBroadcaster")
            .field("group", &self.group)
            .finish()
    }
}

impl NcclBroadcaster {
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
        opts.check()?;
        let dev = Cuda::new(comm, stream, opts.slab.slab_size)?;
        Self::from_device(Box::new(dev), rank, world_size, opts)
    }

    pub(crate) fn from_device(
        dev: Box<dyn Device>,
        rank: usize,
        world_size: usize,
        opts: &NcclOptions,
    ) -> Result<Self> {
        let gpu = Gpu {
            dev,
            rank,
            world_size,
        };
        Ok(NcclBroadcaster {
            group: SlabBroadcaster::new(BACKEND, MAGIC, gpu, (rank, world_size), &opts.slab)?,
        })
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
        self.group.exclusive(root, |gpu, round| {
            let mut out = vec![0u8; len];
            gpu.dev.reserve(Buf::Spill, len)?;
            if let Some(p) = payload {
                gpu.dev.upload(Buf::Spill, p)?;
            }
            gpu.broadcast_into(round, Buf::Spill, &mut out)?;
            Ok(out)
        })
    }

    /// This rank's measured clock offset (`lens_core::measure_clock_offsets`, or a
    /// `ClockTracker`), taken off the arrival times it gathers
    /// ([`NcclOptions::arrivals_every`](crate::NcclOptions::arrivals_every)) so that ranks
    /// on hosts whose clocks differ are compared on the reference's clock.
    pub fn set_clock_offset(&self, offset: lens_core::ClockOffset) {
        self.group.set_clock_offset(offset.offset_ns);
    }

    /// Payload bytes that travel in the first broadcast.
    pub fn slab_capacity(&self) -> usize {
        self.group.slab_capacity()
    }
}

// Every method written out: a default here would hide what the slab group knows.
#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl Broadcaster for NcclBroadcaster {
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
        self.group.round(root, payload)
    }

    /// NCCL's communicator knows no node-local rank; `RankInfo` takes the launcher's.
    fn local_rank(&self) -> Option<usize> {
        None
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
        Some(self.group.round(root, payload))
    }
}
