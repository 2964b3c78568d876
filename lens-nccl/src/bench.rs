//! The NCCL figures of `lens bench --backend nccl`: a raw `ncclBroadcast` of the carrier's
//! bytes (copy in, broadcast, wait, copy out; no lens code) beside lens's
//! `broadcast_trace_context`, on every local GPU, one thread per GPU.

use std::time::Instant;

use cudarc::driver::CudaContext;
use cudarc::nccl::Comm;
use lens_core::{Broadcaster, Carrier, Error, Result, blocking};
use opentelemetry::Context;

use crate::probe::{BACKEND, guarded, probe};
use crate::{NcclBroadcaster, cuda_err, nccl_err};

/// One operation's timings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Figures {
    /// `"raw"` or `"lens"`.
    pub op: &'static str,
    /// Ranks (GPUs).
    pub ranks: usize,
    /// Carrier bytes.
    pub bytes: usize,
    /// Per-round times in µs on rank 0, sorted.
    pub samples_us: Vec<f64>,
}

/// Runs `iters` rounds of each operation on every local GPU (rounds interleaved).
///
/// # Errors
/// [`Error::Unavailable`] without CUDA or NCCL; CUDA and NCCL failures.
pub fn run(iters: usize, cx: &Context) -> Result<Vec<Figures>> {
    let found = probe()?;
    let n = found.devices;
    let streams = (0..n)
        .map(|d| {
            let ctx = guarded("cuCtxCreate", || CudaContext::new(d))?
                .map_err(|e| cuda_err("opening a device", e))?;
            guarded("cuStreamCreate", || ctx.new_stream())?
                .map_err(|e| cuda_err("creating a stream", e))
        })
        .collect::<Result<Vec<_>>>()?;
    let comms = guarded("ncclCommInitAll", || Comm::from_devices(streams))?
        .map_err(|e| nccl_err("ncclCommInitAll", e))?;
    let bytes = Carrier::from_context(cx).encode();
    let groups = comms
        .into_iter()
        .map(NcclBroadcaster::from_comm)
        .collect::<Result<Vec<_>>>()?;
    let per_rank: Vec<Result<(Vec<f64>, Vec<f64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|b| {
                let bytes = &bytes;
                s.spawn(move || {
                    let (mut raw, mut lens) =
                        (Vec::with_capacity(iters), Vec::with_capacity(iters));
                    let empty = Context::new();
                    for _ in 0..iters {
                        let t = Instant::now();
                        b.raw_broadcast(
                            0,
                            (b.rank() == 0).then_some(bytes.as_slice()),
                            bytes.len(),
                        )?;
                        raw.push(t.elapsed().as_secs_f64() * 1e6);
                        let t = Instant::now();
                        blocking::broadcast_context(b, 0, if b.rank() == 0 { cx } else { &empty })?;
                        lens.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    Ok((raw, lens))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Unavailable {
                        backend: BACKEND,
                        reason: "a GPU thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut first = None;
    for r in per_rank {
        let r = r?;
        first.get_or_insert(r);
    }
    let (mut raw, mut lens) = first.unwrap_or_default();
    raw.sort_by(f64::total_cmp);
    lens.sort_by(f64::total_cmp);
    Ok(vec![
        Figures {
            op: "raw",
            ranks: n,
            bytes: bytes.len(),
            samples_us: raw,
        },
        Figures {
            op: "lens",
            ranks: n,
            bytes: bytes.len(),
            samples_us: lens,
        },
    ])
}
