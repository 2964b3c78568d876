//! What a round asks of the GPU side, behind a small trait: CUDA + NCCL in production
//! ([`Cuda`]), an in-process simulation in this crate's tests, so that the slab protocol, the
//! deadline and the abort are exercised on machines without a GPU.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, sys::CUevent_flags};
use cudarc::nccl::Comm;
use lens_core::{Error, Result};

use crate::probe::{BACKEND, guarded};
use crate::{cuda_err, nccl_err};

/// A device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The persistent slab: header and the first part of the payload.
    Slab,
    /// A buffer kept between rounds for payloads over the slab (and the raw bench); it grows
    /// to the largest size asked for.
    Spill,
}

/// One rank's GPU and communicator. Calls queue work on one stream, in order.
pub(crate) trait Device: Send {
    /// Makes `buf` at least `len` bytes long.
    fn reserve(&mut self, buf: Buf, len: usize) -> Result<()>;
    /// Copies `bytes` to the start of `buf`.
    fn upload(&mut self, buf: Buf, bytes: &[u8]) -> Result<()>;
    /// Queues a broadcast of the first `len` bytes of `buf` from `root`, in place.
    fn broadcast(&mut self, buf: Buf, len: usize, root: usize) -> Result<()>;
    /// Whether everything queued so far has finished (never blocks).
    fn finished(&mut self) -> Result<bool>;
    /// Copies the start of `buf` into `out` once the queued work is done (blocks for it).
    fn download(&mut self, buf: Buf, out: &mut [u8]) -> Result<()>;
    /// Aborts the communicator so no kernel of this rank waits on its peers any more.
    fn abort(&mut self);
}

/// The communicator, unless it was aborted.
fn live(comm: Option<&Comm>) -> Result<&Comm> {
    comm.ok_or_else(|| Error::Closed {
        backend: BACKEND,
        reason: "the communicator was aborted".into(),
    })
}

/// A GPU through cudarc: a communicator, its stream, the slab, the spill buffer and one
/// event re-recorded after each broadcast.
pub(crate) struct Cuda {
    // Declared first so it is dropped (aborted) before the buffers its kernels use.
    comm: Option<Comm>,
    stream: Arc<CudaStream>,
    event: CudaEvent,
    slab: CudaSlice<u8>,
    spill: Option<CudaSlice<u8>>,
}

// SAFETY: an NCCL communicator and the CUDA objects may be used from any thread as long as
// calls do not overlap; `NcclBroadcaster` keeps its device behind a mutex.
unsafe impl Send for Cuda {}

impl Cuda {
    /// Allocates a zeroed slab of `slab_size` bytes on `comm`'s stream.
    pub(crate) fn new(comm: Comm, slab_size: usize) -> Result<Self> {
        let stream = comm.stream();
        let slab = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(slab_size))?
            .map_err(|e| cuda_err("allocating the device slab", e))?;
        let event = guarded("cuEventCreate", || {
            stream
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        })?
        .map_err(|e| cuda_err("creating an event", e))?;
        Ok(Cuda {
            comm: Some(comm),
            stream,
            event,
            slab,
            spill: None,
        })
    }
}

/// The buffer `buf` names (a free function, so the communicator can be borrowed beside it).
fn pick<'a>(
    slab: &'a mut CudaSlice<u8>,
    spill: &'a mut Option<CudaSlice<u8>>,
    buf: Buf,
) -> Result<&'a mut CudaSlice<u8>> {
    match buf {
        Buf::Slab => Ok(slab),
        Buf::Spill => spill.as_mut().ok_or_else(|| Error::Transport {
            backend: BACKEND,
            message: "the spill buffer was used before it was reserved".into(),
            source: None,
        }),
    }
}

impl Device for Cuda {
    fn reserve(&mut self, buf: Buf, len: usize) -> Result<()> {
        if buf == Buf::Slab {
            return Ok(());
        }
        if self.spill.as_ref().is_some_and(|s| s.len() >= len) {
            return Ok(());
        }
        let stream = &self.stream;
        let spill = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(len.max(1)))?
            .map_err(|e| cuda_err("allocating the spill buffer", e))?;
        self.spill = Some(spill);
        Ok(())
    }

    fn upload(&mut self, buf: Buf, bytes: &[u8]) -> Result<()> {
        let (stream, dst) = (&self.stream, pick(&mut self.slab, &mut self.spill, buf)?);
        guarded("cuMemcpyHtoD", || {
            stream.memcpy_htod(bytes, &mut dst.slice_mut(..bytes.len()))
        })?
        .map_err(|e| cuda_err("copying to the device", e))
    }

    fn broadcast(&mut self, buf: Buf, len: usize, root: usize) -> Result<()> {
        let root =
            i32::try_from(root).map_err(|_| Error::config("root does not fit NCCL's int"))?;
        let dst = pick(&mut self.slab, &mut self.spill, buf)?;
        let comm = live(self.comm.as_ref())?;
        // NCCL launches on the thread's current device: a non-root rank reaches this call
        // without any cudarc call having bound the context on this thread.
        let ctx = self.stream.context();
        guarded("cuCtxSetCurrent", || ctx.bind_to_thread())?
            .map_err(|e| cuda_err("binding the CUDA context", e))?;
        guarded("ncclBroadcast", || {
            comm.broadcast_in_place(&mut dst.slice_mut(..len), root)
        })?
        .map_err(|e| nccl_err("ncclBroadcast", e))?;
        let (event, stream) = (&self.event, &self.stream);
        guarded("cuEventRecord", || event.record(stream))?
            .map_err(|e| cuda_err("recording an event", e))
    }

    fn finished(&mut self) -> Result<bool> {
        guarded("cuEventQuery", || self.event.try_is_complete())?
            .map_err(|e| cuda_err("waiting for the broadcast", e))
    }

    fn download(&mut self, buf: Buf, out: &mut [u8]) -> Result<()> {
        let (stream, src) = (&self.stream, pick(&mut self.slab, &mut self.spill, buf)?);
        guarded("cuMemcpyDtoH", || {
            stream.memcpy_dtoh(&src.slice(..out.len()), out)
        })?
        .map_err(|e| cuda_err("copying from the device", e))?;
        guarded("cuStreamSynchronize", || stream.synchronize())?
            .map_err(|e| cuda_err("synchronising", e))
    }

    fn abort(&mut self) {
        // Dropping a cudarc communicator calls ncclCommAbort (and panics if that fails).
        let comm = self.comm.take();
        if guarded("ncclCommAbort", move || drop(comm)).is_err() {
            tracing::warn!("ncclCommAbort failed");
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // cudarc's own drop would panic on a failed abort; this one logs it.
        self.abort();
    }
}
