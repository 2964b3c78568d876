//! Forming an NCCL group: the unique id made on rank 0 and carried by another broadcaster,
//! and NCCL's init under a deadline (it has none of its own).
// The NCCL communicator moved from the thread that made it.
#![allow(unsafe_code)]

use std::ffi::c_char;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use cudarc::nccl::{Comm, Id};
use lens_core::{Broadcaster, Error, Result};

use crate::error::{cuda_err, nccl_err};
use crate::probe::{BACKEND, guarded, probe};
use crate::{ID_LEN, NcclBroadcaster, NcclOptions};

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

/// A cudarc `Comm` moved from the helper thread that made it to the caller's.
struct SendComm(Comm);

// SAFETY: a `Comm` made on a helper thread and handed over once, never used by two threads
// at a time; NCCL communicators may be used from any thread as long as calls do not overlap.
unsafe impl Send for SendComm {}

/// Runs `f` on a helper thread and waits for it until `timeout`. On a timeout the thread is
/// left behind (blocked in a call that cannot be cancelled, such as `ncclCommInitRank`) and
/// whatever it returns later is dropped there.
pub(crate) fn with_deadline<T: Send + 'static>(
    what: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("lens-nccl {what}"))
        .spawn(move || {
            let made = guarded(what, f).and_then(|r| r);
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
        Ok(made) => made,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            tracing::warn!(
                ?timeout,
                "{what} did not finish in time; its thread is left behind"
            );
            Err(Error::timeout(start.elapsed(), Vec::new()))
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
                .map(SendComm)
                .map_err(|e| nccl_err("ncclCommInitRank", e))
        })?
        .0;
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
}
