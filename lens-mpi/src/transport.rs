//! The MPI side of the slab round: one collective per round on the communicator.
// The `Send` marker of the communicator the transport owns.
#![allow(unsafe_code)]

use lens_core::Result;
use lens_core::backend::slab::{RollCall, Round, Slab, SlabTransport};
use mpi::topology::SimpleCommunicator;

use crate::request::{Persistent, Ranks, direct, gather, ibcast, roll_call};

/// Roots that get a persistent broadcast of their own; rounds from others use `MPI_Ibcast`.
/// Each prepared broadcast holds a slab and the library's schedule; sources are usually a
/// handful of ranks (rank 0, the first stage of each pipeline).
const MAX_PERSISTENT_ROOTS: usize = 64;

/// How a round moves the bytes (chosen once, when the broadcaster is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The root sends to every other rank itself (small groups).
    Direct,
    /// A persistent broadcast per root, restarted each round.
    Persistent,
    /// A fresh `MPI_Ibcast` each round.
    Ibcast,
}

/// A communicator, and the buffers MPI may keep.
pub(crate) struct Mpi {
    comm: SimpleCommunicator,
    ranks: Ranks,
    mode: Mode,
    /// Scratch space for the requests of a direct round.
    requests: Vec<mpi::ffi::MPI_Request>,
    /// The persistent slab broadcast of each root, made at its first round.
    by_root: Vec<Option<Persistent>>,
    /// The slab as MPI sees it in the direct and `MPI_Ibcast` paths; leaked on a timeout.
    buf: Box<[u8]>,
    /// A round failed ([`SlabTransport::stop`]): a request may still be active, so none is
    /// freed.
    leak: bool,
}

// SAFETY: the communicator handle and the requests are only used with the slab group's
// mutex held, so MPI never sees two calls on them at once; with a threading level below
// Serialized every call is also checked to come from the creating thread
// (`MpiBroadcaster::check_thread`).
unsafe impl Send for Mpi {}

impl Mpi {
    /// [`Mode::Persistent`] only where the library has a persistent broadcast
    /// ([`crate::request::has_bcast_init`]).
    pub(crate) fn new(comm: SimpleCommunicator, ranks: Ranks, mode: Mode) -> Self {
        Mpi {
            comm,
            ranks,
            mode,
            requests: Vec::new(),
            by_root: Vec::new(),
            buf: Box::default(),
            leak: false,
        }
    }

    /// The prepared broadcast from `root` for slabs of `len` bytes, made on first use.
    fn persistent_for(&mut self, root: usize, len: usize) -> Result<Option<&mut Persistent>> {
        if self.mode != Mode::Persistent || root >= MAX_PERSISTENT_ROOTS {
            return Ok(None);
        }
        if self.by_root.len() <= root {
            self.by_root.resize_with(root + 1, || None);
        }
        if self.by_root[root].is_none() {
            self.by_root[root] = Some(Persistent::new(&self.comm, root, len)?);
        }
        Ok(self.by_root[root].as_mut())
    }
}

impl SlabTransport for Mpi {
    fn broadcast_slab(
        &mut self,
        round: &Round,
        slab: &mut Slab,
        sent: Option<usize>,
    ) -> Result<()> {
        // The root's data; elsewhere the whole slab, whose header the round zeroed, so no
        // earlier round's header is left in MPI's buffer.
        let n = sent.unwrap_or(slab.len());
        let len = slab.len();
        // A failure returns an error, after which the slab group calls `stop`: then nothing
        // MPI may still use is freed.
        if let Some(p) = self.persistent_for(round.root, len)? {
            return match p.round(round, slab, n)? {
                true => Ok(()),
                false => Err(round.timed_out()),
            };
        }
        // The slab itself goes to MPI and comes back: exchanged with this buffer, not
        // copied (copied only the first time, when there is no buffer of its length yet).
        // If MPI keeps it (a timeout), the slab is left with the spare one.
        let mut buf = std::mem::take(&mut self.buf);
        if !slab.exchange(&mut buf) {
            buf = Box::from(&slab[..]);
        }
        let got = if self.mode == Mode::Direct {
            direct(&self.comm, self.ranks, round, buf, n, &mut self.requests)?
        } else {
            ibcast(&self.comm, round.root, buf, round)?
        };
        let Some(mut buf) = got else {
            return Err(round.timed_out());
        };
        if !slab.exchange(&mut buf) {
            // Not reached: MPI gave back the buffer made from this slab.
            slab.copy_from_slice(&buf[..len]);
        }
        self.buf = buf;
        Ok(())
    }

    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> Result<()> {
        let buf: Box<[u8]> = rest.into();
        let got = if self.mode == Mode::Direct {
            let len = rest.len();
            direct(&self.comm, self.ranks, round, buf, len, &mut self.requests)?
        } else {
            ibcast(&self.comm, round.root, buf, round)?
        };
        let Some(buf) = got else {
            return Err(round.timed_out());
        };
        rest.copy_from_slice(&buf);
        Ok(())
    }

    fn stop(&mut self) {
        self.leak = true;
    }

    fn gather_i64(&mut self, round: &Round, value: i64) -> Result<Option<Vec<i64>>> {
        match gather(&self.comm, self.ranks, round, value, &mut self.requests)? {
            Some(values) => Ok(Some(values)),
            None => Err(round.timed_out()),
        }
    }

    fn roll_call(&mut self, round: u64, wait: std::time::Duration) -> Option<RollCall> {
        roll_call(&self.comm, self.ranks, round, wait).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the roll call after a timeout failed");
            None
        })
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        if self.leak {
            for p in self.by_root.drain(..).flatten() {
                p.leak();
            }
        }
    }
}
