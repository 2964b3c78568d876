//! What a round asks of the GPU side, behind a small trait: CUDA + NCCL in production
//! ([`Cuda`]), an in-process simulation in this crate's tests, so that the slab protocol, the
//! deadline and the abort are exercised on machines without a GPU.
// Device memory and raw CUDA and NCCL handles.
#![allow(unsafe_code)]

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys::CUevent_flags,
};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t};
use cudarc::nccl::{Comm, result as nccl};
use lens_core::{Error, Result};

use crate::error::{cuda_err, nccl_err};
use crate::probe::{BACKEND, guarded};

/// A device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// The persistent slab: header and the first part of the payload.
    Slab,
    /// A buffer kept between rounds for payloads over the slab (and the raw bench); it grows
    /// to the largest size asked for.
    Spill,
    /// Where [`Device::all_gather`] leaves every rank's value, in rank order.
    Gather,
}

/// One rank's GPU and communicator. Calls queue work on one stream, in order.
pub(crate) trait Device: Send {
    /// Makes `buf` at least `len` bytes long.
    fn reserve(&mut self, buf: Buf, len: usize) -> Result<()>;
    /// Copies `bytes` to the start of `buf`.
    fn upload(&mut self, buf: Buf, bytes: &[u8]) -> Result<()>;
    /// Queues a broadcast of the first `len` bytes of `buf` from `root`, in place.
    fn broadcast(&mut self, buf: Buf, len: usize, root: usize) -> Result<()>;
    /// Queues an all-gather of `value` (the same length on each of the `ranks` ranks):
    /// once done, [`Buf::Gather`] holds every rank's value in rank order.
    fn all_gather(&mut self, value: &[u8], ranks: usize) -> Result<()>;
    /// Whether everything queued so far has finished (never blocks).
    fn finished(&mut self) -> Result<bool>;
    /// Copies the start of `buf` into `out` once the queued work is done (blocks for it).
    fn download(&mut self, buf: Buf, out: &mut [u8]) -> Result<()>;
    /// Aborts the communicator so no kernel of this rank waits on its peers any more.
    fn abort(&mut self);
}

/// How this rank holds its communicator.
pub(crate) enum Handle {
    /// lens owns it: aborted (by cudarc's drop) after a failed round and on drop.
    Owned(Comm),
    /// Shared with the application, which keeps its own `Arc`: lens never aborts it while
    /// the application holds it (the last owner's drop does, as cudarc's `Comm` does).
    Shared(Arc<Comm>),
    /// The application's raw handle: lens never aborts or destroys it.
    Raw(ncclComm_t),
}

/// Drops a cudarc communicator (which aborts it when it is the last owner) without letting
/// cudarc's panic on a failed abort through.
fn release(what: Handle) {
    if guarded("ncclCommAbort", move || drop(what)).is_err() {
        tracing::warn!("ncclCommAbort failed");
    }
}

/// A GPU through cudarc: a communicator, its stream, the slab, the spill buffer and one
/// event re-recorded after each broadcast.
pub(crate) struct Cuda {
    comm: Option<Handle>,
    stream: Arc<CudaStream>,
    event: CudaEvent,
    // Leaked instead of freed when a kernel may still write to them: after a failed round on
    // a communicator lens may not abort.
    slab: ManuallyDrop<CudaSlice<u8>>,
    spill: ManuallyDrop<Option<CudaSlice<u8>>>,
    /// The all-gather's send and receive buffers, made at its first use.
    gather: ManuallyDrop<Option<(CudaSlice<u8>, CudaSlice<u8>)>>,
    leak_buffers: bool,
}

// SAFETY: an NCCL communicator and the CUDA objects may be used from any thread as long as
// calls do not overlap; `NcclBroadcaster` keeps its device behind a mutex.
unsafe impl Send for Cuda {}

impl Cuda {
    /// Allocates a zeroed slab of `slab_size` bytes on `stream`, the stream `comm` works on.
    pub(crate) fn new(comm: Handle, stream: Arc<CudaStream>, slab_size: usize) -> Result<Self> {
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
            slab: ManuallyDrop::new(slab),
            spill: ManuallyDrop::new(None),
            gather: ManuallyDrop::new(None),
            leak_buffers: false,
        })
    }
}

/// The buffer `buf` names (a free function, so the communicator can be borrowed beside it).
fn pick<'a>(
    slab: &'a mut CudaSlice<u8>,
    spill: &'a mut Option<CudaSlice<u8>>,
    gather: &'a mut Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    buf: Buf,
) -> Result<&'a mut CudaSlice<u8>> {
    let unready = |what: &str| Error::Transport {
        backend: BACKEND,
        message: format!("the {what} buffer was used before it was made"),
        source: None,
    };
    match buf {
        Buf::Slab => Ok(slab),
        Buf::Spill => spill.as_mut().ok_or_else(|| unready("spill")),
        Buf::Gather => gather
            .as_mut()
            .map(|(_, recv)| recv)
            .ok_or_else(|| unready("gather")),
    }
}

/// The communicator, or the error of a round after an abort.
fn live(comm: Option<&Handle>) -> Result<&Handle> {
    comm.ok_or_else(|| Error::Closed {
        backend: BACKEND,
        reason: "the communicator was aborted".into(),
    })
}

impl Device for Cuda {
    fn reserve(&mut self, buf: Buf, len: usize) -> Result<()> {
        if buf != Buf::Spill {
            return Ok(()); // the slab is made with the device, the gather's at its first use
        }
        if self.spill.as_ref().is_some_and(|s| s.len() >= len) {
            return Ok(());
        }
        let stream = &self.stream;
        let spill = guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(len.max(1)))?
            .map_err(|e| cuda_err("allocating the spill buffer", e))?;
        *self.spill = Some(spill);
        Ok(())
    }

    fn upload(&mut self, buf: Buf, bytes: &[u8]) -> Result<()> {
        let dst = pick(&mut self.slab, &mut self.spill, &mut self.gather, buf)?;
        let stream = &self.stream;
        guarded("cuMemcpyHtoD", || {
            stream.memcpy_htod(bytes, &mut dst.slice_mut(..bytes.len()))
        })?
        .map_err(|e| cuda_err("copying to the device", e))
    }

    fn broadcast(&mut self, buf: Buf, len: usize, root: usize) -> Result<()> {
        let root =
            i32::try_from(root).map_err(|_| Error::config("root does not fit NCCL's int"))?;
        let stream = &self.stream;
        let dst = pick(&mut self.slab, &mut self.spill, &mut self.gather, buf)?;
        let comm = live(self.comm.as_ref())?;
        // NCCL launches on the thread's current device: a non-root rank may reach this call
        // without any other CUDA call on this thread.
        let ctx = stream.context();
        guarded("cuCtxSetCurrent", || ctx.bind_to_thread())?
            .map_err(|e| cuda_err("binding the CUDA context", e))?;
        let mut view = dst.slice_mut(..len);
        guarded("ncclBroadcast", || match comm {
            Handle::Owned(c) => c.broadcast_in_place(&mut view, root),
            Handle::Shared(c) => c.broadcast_in_place(&mut view, root),
            Handle::Raw(raw) => {
                let (ptr, _record) = view.device_ptr_mut(stream);
                // SAFETY: `raw` is a valid communicator on `stream`'s device (the caller of
                // `NcclBroadcaster::from_raw` promised it); `ptr` is `len` bytes of device
                // memory that outlive the round (they are leaked if it never ends).
                unsafe {
                    nccl::broadcast(
                        ptr as *const std::ffi::c_void,
                        ptr as *mut std::ffi::c_void,
                        len,
                        ncclDataType_t::ncclUint8,
                        root,
                        *raw,
                        stream.cu_stream() as _,
                    )
                }
            }
        })?
        .map_err(|e| nccl_err("ncclBroadcast", e))?;
        let event = &self.event;
        guarded("cuEventRecord", || event.record(stream))?
            .map_err(|e| cuda_err("recording an event", e))
    }

    fn all_gather(&mut self, value: &[u8], ranks: usize) -> Result<()> {
        let stream = &self.stream;
        let want = value.len() * ranks;
        if self.gather.as_ref().is_none_or(|(_, r)| r.len() != want) {
            let alloc = |n: usize| {
                guarded("cuMemAlloc", || stream.alloc_zeros::<u8>(n.max(1)))?
                    .map_err(|e| cuda_err("allocating the gather buffers", e))
            };
            *self.gather = Some((alloc(value.len())?, alloc(want)?));
        }
        let comm = live(self.comm.as_ref())?;
        let Some((send, recv)) = self.gather.as_mut() else {
            return Ok(()); // made just above
        };
        guarded("cuMemcpyHtoD", || stream.memcpy_htod(value, send))?
            .map_err(|e| cuda_err("copying to the device", e))?;
        let ctx = stream.context();
        guarded("cuCtxSetCurrent", || ctx.bind_to_thread())?
            .map_err(|e| cuda_err("binding the CUDA context", e))?;
        guarded("ncclAllGather", || match comm {
            Handle::Owned(c) => c.all_gather(send, recv),
            Handle::Shared(c) => c.all_gather(send, recv),
            Handle::Raw(raw) => {
                let (from, _r1) = send.device_ptr(stream);
                let (to, _r2) = recv.device_ptr_mut(stream);
                // SAFETY: `raw` is a valid communicator on `stream`'s device (the caller of
                // `NcclBroadcaster::from_raw` promised it); `from` holds `value.len()` bytes
                // and `to` that many per rank, device memory that outlives the round.
                unsafe {
                    nccl::all_gather(
                        from as *const std::ffi::c_void,
                        to as *mut std::ffi::c_void,
                        value.len(),
                        ncclDataType_t::ncclUint8,
                        *raw,
                        stream.cu_stream() as _,
                    )
                }
            }
        })?
        .map_err(|e| nccl_err("ncclAllGather", e))?;
        let event = &self.event;
        guarded("cuEventRecord", || event.record(stream))?
            .map_err(|e| cuda_err("recording an event", e))
    }

    fn finished(&mut self) -> Result<bool> {
        guarded("cuEventQuery", || self.event.try_is_complete())?
            .map_err(|e| cuda_err("waiting for the broadcast", e))
    }

    fn download(&mut self, buf: Buf, out: &mut [u8]) -> Result<()> {
        let src = pick(&mut self.slab, &mut self.spill, &mut self.gather, buf)?;
        let stream = &self.stream;
        guarded("cuMemcpyDtoH", || {
            stream.memcpy_dtoh(&src.slice(..out.len()), out)
        })?
        .map_err(|e| cuda_err("copying from the device", e))?;
        guarded("cuStreamSynchronize", || stream.synchronize())?
            .map_err(|e| cuda_err("synchronising", e))
    }

    fn abort(&mut self) {
        match self.comm.take() {
            Some(Handle::Owned(comm)) => release(Handle::Owned(comm)),
            Some(Handle::Shared(comm)) => {
                // Only the last owner's drop aborts: otherwise a kernel of this round may
                // still be in flight on the application's communicator.
                self.leak_buffers = Arc::strong_count(&comm) > 1;
                release(Handle::Shared(comm));
                if self.leak_buffers {
                    tracing::warn!(
                        "the shared NCCL communicator is left to the application, not aborted"
                    );
                }
            }
            Some(Handle::Raw(_)) => {
                self.leak_buffers = true;
                tracing::warn!("the application's NCCL communicator is left to it, not aborted");
            }
            None => {}
        }
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // After clean rounds no kernel of lens is in flight: release the communicator as its
        // kind asks (an owned one is aborted by cudarc's drop, a raw one is left alone).
        if let Some(comm) = self.comm.take() {
            release(comm);
        }
        if !self.leak_buffers {
            // SAFETY: each is dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.slab);
                ManuallyDrop::drop(&mut self.spill);
                ManuallyDrop::drop(&mut self.gather);
            }
        }
    }
}
