//! A stand-in for N GPUs and their NCCL communicator, one [`SimGpu`] per rank (each used from
//! its own thread), so the slab protocol, the deadline and the abort run in tests without a
//! GPU. It keeps NCCL's rules that matter here: a broadcast is queued and completes only once
//! every rank has queued the same collective (the n-th call on each rank); the root's bytes
//! land in every rank's buffer; nothing can be read before the work is done; an aborted
//! communicator takes no more work. It is stricter than CUDA where lens could be wrong: using
//! a buffer past its reserved size or downloading before completion is an error.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use lens_core::{Error, Result};

use crate::device::{Buf, Device};

/// Where a simulated device fails on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimFault {
    /// Every call works.
    None,
    /// The n-th upload (counting from 1) fails, as a failed host-to-device copy would.
    FailUpload(u64),
}

#[derive(Default)]
struct Collective {
    posted: usize,
    applied: usize,
    data: Option<Vec<u8>>,
}

/// The communicator every simulated rank shares.
pub(crate) struct SimWorld {
    ranks: usize,
    collectives: Mutex<HashMap<u64, Collective>>,
}

impl SimWorld {
    pub(crate) fn new(ranks: usize) -> Arc<Self> {
        Arc::new(SimWorld {
            ranks,
            collectives: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Collective>> {
        self.collectives.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a test can see of a simulated device after the fact.
#[derive(Debug, Default)]
pub(crate) struct SimLog {
    /// Spill-buffer allocations.
    pub allocations: usize,
    /// Whether the communicator was aborted.
    pub aborted: bool,
}

/// One rank's simulated GPU.
pub(crate) struct SimGpu {
    world: Arc<SimWorld>,
    rank: usize,
    slab: Vec<u8>,
    spill: Vec<u8>,
    gather: Vec<u8>,
    /// Collectives queued and not yet seen complete: (sequence, buffer, length).
    queued: VecDeque<(u64, Buf, usize)>,
    calls: u64,
    uploads: u64,
    fault: SimFault,
    log: Arc<Mutex<SimLog>>,
}

impl SimGpu {
    pub(crate) fn new(
        world: &Arc<SimWorld>,
        rank: usize,
        slab_size: usize,
        fault: SimFault,
    ) -> (Self, Arc<Mutex<SimLog>>) {
        let log = Arc::new(Mutex::new(SimLog::default()));
        let gpu = SimGpu {
            world: world.clone(),
            rank,
            slab: vec![0; slab_size],
            spill: Vec::new(),
            gather: Vec::new(),
            queued: VecDeque::new(),
            calls: 0,
            uploads: 0,
            fault,
            log: log.clone(),
        };
        (gpu, log)
    }

    fn log(&self) -> std::sync::MutexGuard<'_, SimLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn buffer(&mut self, buf: Buf, len: usize) -> Result<&mut [u8]> {
        let b = match buf {
            Buf::Slab => &mut self.slab,
            Buf::Spill => &mut self.spill,
            Buf::Gather => &mut self.gather,
        };
        let have = b.len();
        b.get_mut(..len)
            .ok_or_else(|| fail(format!("{buf:?} of {have} bytes used for {len}")))
    }

    fn check_open(&self) -> Result<()> {
        if self.log().aborted {
            return Err(fail("the simulated communicator was aborted".into()));
        }
        Ok(())
    }
}

fn fail(message: String) -> Error {
    Error::Transport {
        backend: "nccl-sim",
        message,
        source: None,
    }
}

impl Device for SimGpu {
    fn reserve(&mut self, buf: Buf, len: usize) -> Result<()> {
        if buf == Buf::Spill && self.spill.len() < len {
            self.spill = vec![0; len];
            self.log().allocations += 1;
        }
        Ok(())
    }

    fn upload(&mut self, buf: Buf, bytes: &[u8]) -> Result<()> {
        self.uploads += 1;
        if self.fault == SimFault::FailUpload(self.uploads) {
            return Err(fail(format!("upload {} failed on purpose", self.uploads)));
        }
        self.buffer(buf, bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    fn broadcast(&mut self, buf: Buf, len: usize, root: usize) -> Result<()> {
        self.check_open()?;
        let data = self.buffer(buf, len)?.to_vec();
        self.calls += 1;
        let mut all = self.world.lock();
        let c = all.entry(self.calls).or_default();
        c.posted += 1;
        if self.rank == root {
            c.data = Some(data);
        }
        self.queued.push_back((self.calls, buf, len));
        Ok(())
    }

    fn all_gather(&mut self, value: &[u8], ranks: usize) -> Result<()> {
        self.check_open()?;
        let (each, total) = (value.len(), value.len() * ranks);
        if self.gather.len() != total {
            self.gather = vec![0; total];
        }
        self.calls += 1;
        let mut all = self.world.lock();
        let c = all.entry(self.calls).or_default();
        c.posted += 1;
        let parts = c.data.get_or_insert_with(|| vec![0; total]);
        let mine = parts
            .get_mut(self.rank * each..(self.rank + 1) * each)
            .ok_or_else(|| fail(format!("rank {} outside a gather of {ranks}", self.rank)))?;
        mine.copy_from_slice(value);
        self.queued.push_back((self.calls, Buf::Gather, total));
        Ok(())
    }

    fn finished(&mut self) -> Result<bool> {
        self.check_open()?;
        while let Some(&(seq, buf, len)) = self.queued.front() {
            let data = {
                let mut all = self.world.lock();
                let Some(c) = all.get_mut(&seq) else {
                    return Err(fail(format!("collective {seq} vanished")));
                };
                if c.posted < self.world.ranks {
                    return Ok(false);
                }
                let Some(data) = c.data.clone() else {
                    return Err(fail(format!("collective {seq}: the root never posted")));
                };
                c.applied += 1;
                if c.applied == self.world.ranks {
                    all.remove(&seq);
                }
                data
            };
            // Ranks that disagree on the size (a lens bug or a mismatched job) get what fits.
            let n = len.min(data.len());
            self.buffer(buf, n)?.copy_from_slice(&data[..n]);
            self.queued.pop_front();
        }
        Ok(true)
    }

    fn download(&mut self, buf: Buf, out: &mut [u8]) -> Result<()> {
        if !self.queued.is_empty() {
            return Err(fail("download while a broadcast is still queued".into()));
        }
        out.copy_from_slice(self.buffer(buf, out.len())?);
        Ok(())
    }

    fn abort(&mut self) {
        self.log().aborted = true;
    }
}
