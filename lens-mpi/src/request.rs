//! The MPI requests of a round, all polled against the round's deadline: in small groups
//! direct sends from the root to every other rank; in larger ones a persistent broadcast
//! prepared once per root and restarted each round where the library has one (MPI-4
//! `MPI_Bcast_init`, Open MPI 4.1's `MPIX_Bcast_init`), else a fresh `MPI_Ibcast`.
//!
//! Why direct sends in small groups: measured under mpirun on this 2-core machine (Open MPI
//! 4.1, 256 bytes, the slowest rank from a common barrier), an `MPI_Isend` to each rank and
//! an `MPI_Irecv` on each took 0.22 µs at 2 ranks against 0.29 for `MPI_Bcast` and 0.30 for
//! a persistent broadcast, and 0.45 µs at 4 oversubscribed ranks against 0.8 for the
//! persistent broadcast and 0.85 to 3.3 for `MPI_Bcast`: a collective's schedule costs more
//! than the few messages it would send. The root's sends grow with the group, a
//! collective's tree with its logarithm, so above a few ranks ([`crate::DEFAULT_DIRECT_MAX`])
//! the collective is used.
//!
//! Why persistent: measured under mpirun on this 2-core machine (Open MPI 4.1, 256-byte
//! slab, the slowest rank from a common barrier), a restarted persistent broadcast costs
//! what a blocking `MPI_Bcast` costs at 2 ranks (0.3 µs) and a quarter of it at 4
//! oversubscribed ranks (0.7 against 3 µs), where `MPI_Ibcast` builds its schedule anew
//! every round and costs more than the blocking call. Polling keeps the deadline: MPI cannot
//! cancel a collective, but a rank that never arrives becomes an error, not a hang.
// Raw MPI calls: the safe rsmpi API aborts the process when a request is left unfinished, and a deadline needs exactly that.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lens_core::backend::slab::Round;
use lens_core::{Error, Result};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use crate::BACKEND;

/// How long a round polls without pausing: rounds take microseconds, so a round still
/// running after this is late anyway, and then a pause between tests spares the core.
const SPIN_FOR: Duration = Duration::from_millis(2);
const PAUSE: Duration = Duration::from_micros(50);

type BcastInit = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    ffi::MPI_Datatype,
    c_int,
    ffi::MPI_Comm,
    ffi::MPI_Info,
    *mut ffi::MPI_Request,
) -> c_int;

/// The library's persistent broadcast, looked up once in the running process (a
/// link-time reference would not build against an MPI without it).
/// Whether the running MPI library has a persistent broadcast.
pub(crate) fn has_bcast_init() -> bool {
    bcast_init().is_some()
}

fn bcast_init() -> Option<BcastInit> {
    static FOUND: OnceLock<Option<BcastInit>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        [&b"MPI_Bcast_init\0"[..], &b"MPIX_Bcast_init\0"[..]]
            .iter()
            .find_map(|name| {
                // SAFETY: both names have exactly this C signature (MPI-4 and Open MPI's
                // extension); the library stays loaded for the life of the process.
                unsafe { this.get::<BcastInit>(*name).ok().map(|f| *f) }
            })
    })
}

/// An MPI call that failed: its name, its error code and the library's text for the code
/// (`MPI_Error_string`). Kept as the `source` of the [`Error::Transport`] lens returns,
/// whose message names the call; this error's text is the code and what it means, so a
/// printed chain says each once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MPI error {code}: {text}")]
pub struct MpiError {
    /// The MPI function.
    pub call: String,
    /// The code it returned.
    pub code: i32,
    /// What the library says the code means.
    pub text: String,
}

fn error_text(rc: c_int) -> String {
    let (mut up, mut down): (c_int, c_int) = (0, 0);
    // SAFETY: both may be called at any time, before MPI_Init and after MPI_Finalize.
    unsafe {
        ffi::MPI_Initialized(&mut up);
        ffi::MPI_Finalized(&mut down);
    }
    // Outside MPI's life the library may abort the process for asking.
    if up == 0 || down != 0 {
        return "MPI is not running, so it cannot say".to_owned();
    }
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING bytes, as MPI_Error_string requires;
    // `len` receives how many it wrote.
    let rc2 = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr().cast(), &mut len) };
    if rc2 != 0 {
        return "no text for this code".to_owned();
    }
    buf.truncate(usize::try_from(len).unwrap_or(0).min(buf.len()));
    String::from_utf8_lossy(&buf).into_owned()
}

fn mpi_error(call: &str, rc: c_int) -> Error {
    let cause = MpiError {
        call: call.to_owned(),
        code: rc,
        text: error_text(rc),
    };
    Error::Transport {
        backend: BACKEND,
        message: format!("{call} failed"),
        source: Some(Box::new(cause)),
    }
}

fn as_c_int(n: usize, what: &str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::config(format!("{what} {n} is too large for MPI")))
}

/// A persistent broadcast from one root of a buffer MPI keeps between rounds.
pub(crate) struct Persistent {
    request: ffi::MPI_Request,
    buf: *mut [u8],
}

impl Persistent {
    /// Prepares the broadcast of `len` bytes from `root` on `comm`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the library has no persistent broadcast (callers check
    /// [`has_bcast_init`] first); the library's failure otherwise.
    pub(crate) fn new(comm: &SimpleCommunicator, root: usize, len: usize) -> Result<Self> {
        let Some(init) = bcast_init() else {
            return Err(Error::Unavailable {
                backend: BACKEND,
                reason: "the MPI library has neither MPI_Bcast_init nor MPIX_Bcast_init".into(),
            });
        };
        let count = as_c_int(len, "slab size")?;
        let root = as_c_int(root, "root")?;
        let buf = Box::into_raw(vec![0u8; len].into_boxed_slice());
        // SAFETY: reading a predefined MPI constant.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` holds `count` bytes and lives until the request is freed (Drop) or
        // forever (leaked when the request may still be active); the communicator outlives
        // the transport that owns this request; the datatype and info are MPI constants.
        let rc = unsafe {
            init(
                buf.cast::<c_void>(),
                count,
                ffi::RSMPI_UINT8_T,
                root,
                comm.as_raw(),
                ffi::RSMPI_INFO_NULL,
                &mut request,
            )
        };
        if rc != 0 {
            // SAFETY: no request was made, so MPI holds no reference to the buffer.
            drop(unsafe { Box::from_raw(buf) });
            return Err(mpi_error("MPI_Bcast_init", rc));
        }
        Ok(Persistent { request, buf })
    }

    /// One round on `slab` (as long as the buffer): its first `n` bytes go in (the root's
    /// data; elsewhere a cleared header), the broadcast runs to completion or the deadline,
    /// and the result comes back into `slab`. `Ok(false)` on a timeout, after which the
    /// request may still be active: the caller must then never free it
    /// ([`Persistent::leak`]).
    pub(crate) fn round(&mut self, round: &Round, slab: &mut [u8], n: usize) -> Result<bool> {
        // SAFETY: the request is inactive here (every earlier round completed, or the
        // transport refuses rounds after one did not), so MPI does not touch the buffer.
        let buf = unsafe { &mut *self.buf };
        if buf.len() != slab.len() {
            return Err(Error::config(format!(
                "a {}-byte slab on a broadcast prepared for {} bytes",
                slab.len(),
                buf.len()
            )));
        }
        buf[..n].copy_from_slice(&slab[..n]);
        // SAFETY: an inactive persistent request made by `new`.
        let rc = unsafe { ffi::MPI_Start(&mut self.request) };
        if rc != 0 {
            return Err(mpi_error("MPI_Start", rc));
        }
        if !wait(&mut self.request, round)? {
            return Ok(false);
        }
        // SAFETY: the round completed, so MPI no longer writes the buffer.
        slab.copy_from_slice(unsafe { &*self.buf });
        Ok(true)
    }

    /// Gives up the request and its buffer without freeing them (MPI may still use both).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Persistent {
    fn drop(&mut self) {
        // After MPI_Finalize no MPI call is allowed, and the buffer may be left as it is.
        if mpi::environment::is_finalized() {
            return;
        }
        // SAFETY: the request is inactive (an active one is leaked, never dropped) and was
        // made by `new`; once freed, MPI holds no reference to the buffer.
        unsafe {
            ffi::MPI_Request_free(&mut self.request);
            drop(Box::from_raw(self.buf));
        }
    }
}

/// The tag of lens's own messages; lens sends them on a communicator of its own (the one
/// it was given, which callers duplicate), so no other message can match them.
const DIRECT_TAG: c_int = 0x4c4e;

/// The ranks of a communicator a direct round needs: this one's and how many there are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ranks {
    pub(crate) me: c_int,
    pub(crate) size: c_int,
}

/// Which way a point-to-point request goes.
#[derive(Clone, Copy)]
enum Way {
    /// `MPI_Isend` to the peer.
    Send,
    /// `MPI_Irecv` from the peer.
    Recv,
}

/// Starts one point-to-point request on `buf` (`count` items of `datatype`) with `peer` and
/// keeps it in `requests`, even when MPI refuses it (then an error naming the call).
///
/// # Safety
/// `buf` must point to `count` items of `datatype` that stay allocated (and, for a receive,
/// untouched) until the request completes; the communicator must be valid.
unsafe fn start_p2p(
    way: Way,
    (buf, count, datatype): (*mut c_void, c_int, ffi::MPI_Datatype),
    peer: c_int,
    tag: c_int,
    comm: &SimpleCommunicator,
    requests: &mut Vec<ffi::MPI_Request>,
) -> Result<()> {
    // SAFETY: reading a predefined MPI constant; the rest as the caller promises.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    let (rc, call) = match way {
        Way::Send => (
            unsafe { ffi::MPI_Isend(buf, count, datatype, peer, tag, comm.as_raw(), &mut request) },
            "MPI_Isend",
        ),
        Way::Recv => (
            unsafe { ffi::MPI_Irecv(buf, count, datatype, peer, tag, comm.as_raw(), &mut request) },
            "MPI_Irecv",
        ),
    };
    requests.push(request);
    if rc == 0 {
        Ok(())
    } else {
        Err(mpi_error(call, rc))
    }
}

/// One round of direct sends: on `round.root`, the first `count` bytes of `buf` go to every
/// other rank (`MPI_Isend`); elsewhere up to `buf.len()` bytes come from the root
/// (`MPI_Irecv`). Polled until every request completes or the deadline passes. Gives the
/// buffer back when done; `None` on a timeout, when the buffer is leaked because MPI may
/// still use it. `requests` is scratch space kept between rounds.
///
/// Messages between two ranks arrive in the order they were sent, and every rank sees the
/// rounds in the same order, so a message always matches the receive of its own round.
pub(crate) fn direct(
    comm: &SimpleCommunicator,
    ranks: Ranks,
    round: &Round,
    buf: Box<[u8]>,
    count: usize,
    requests: &mut Vec<ffi::MPI_Request>,
) -> Result<Option<Box<[u8]>>> {
    let root = as_c_int(round.root, "root")?;
    let count = as_c_int(count.min(buf.len()), "buffer of")?;
    let len = as_c_int(buf.len(), "buffer of")?;
    let ptr = Box::into_raw(buf);
    requests.clear();
    let bytes = ptr.cast::<c_void>();
    // SAFETY (each call): `ptr` points to `len` bytes that stay allocated until every
    // request completes (below) or forever (leaked on a timeout or a failed start, when a
    // request may still use them); the communicator is valid while the caller holds it; the
    // datatype is a predefined MPI constant.
    let started = if ranks.me == root {
        let out = (bytes, count, unsafe { ffi::RSMPI_UINT8_T });
        (0..ranks.size)
            .filter(|&to| to != root)
            .try_for_each(|to| unsafe { start_p2p(Way::Send, out, to, DIRECT_TAG, comm, requests) })
    } else {
        let into = (bytes, len, unsafe { ffi::RSMPI_UINT8_T });
        unsafe { start_p2p(Way::Recv, into, root, DIRECT_TAG, comm, requests) }
    };
    // On a failed start the buffer stays leaked: earlier requests may use it.
    started?;
    if wait_all(requests, round)? {
        // SAFETY: every request completed, so MPI no longer uses the buffer.
        Ok(Some(unsafe { Box::from_raw(ptr) }))
    } else {
        tracing::warn!("MPI sends of a round timed out; their buffer is left to MPI");
        Ok(None)
    }
}

/// Messages of an arrivals gather: apart from the rounds' own.
const GATHER_TAG: c_int = 0x4c47;

/// Gathers `value` from every rank at `round.root` with point-to-point messages (an
/// `MPI_Irecv` per rank at the root, an `MPI_Isend` elsewhere), polled until done or the
/// deadline. The root gets every rank's value indexed by rank, the others an empty list;
/// `None` on a timeout, when the buffers are leaked because MPI may still use them.
pub(crate) fn gather(
    comm: &SimpleCommunicator,
    ranks: Ranks,
    round: &Round,
    value: i64,
    requests: &mut Vec<ffi::MPI_Request>,
) -> Result<Option<Vec<i64>>> {
    let root = as_c_int(round.root, "root")?;
    let size = usize::try_from(ranks.size).unwrap_or(0);
    let slots: Box<[i64]> = if ranks.me == root {
        let mut v = vec![0i64; size];
        if let Some(mine) = v.get_mut(round.root) {
            *mine = value;
        }
        v.into_boxed_slice()
    } else {
        vec![value].into_boxed_slice()
    };
    let ptr = Box::into_raw(slots);
    let base = ptr.cast::<i64>();
    requests.clear();
    // SAFETY (each call): `ptr` points to `size` (root) or 1 (elsewhere) i64s that stay
    // allocated until every request completes (below) or forever (leaked on a timeout or a
    // failed start); each receive writes one i64 into its own slot (`from` < size); the
    // communicator is valid while the caller holds it; the datatype is a predefined MPI
    // constant.
    let started = if ranks.me == root {
        (0..ranks.size)
            .filter(|&from| from != root)
            .try_for_each(|from| {
                let slot = usize::try_from(from).unwrap_or(0);
                let into = (unsafe { base.add(slot) }.cast::<c_void>(), 1, unsafe {
                    ffi::RSMPI_INT64_T
                });
                unsafe { start_p2p(Way::Recv, into, from, GATHER_TAG, comm, requests) }
            })
    } else {
        let out = (base.cast::<c_void>(), 1, unsafe { ffi::RSMPI_INT64_T });
        unsafe { start_p2p(Way::Send, out, root, GATHER_TAG, comm, requests) }
    };
    started?;
    if wait_all(requests, round)? {
        // SAFETY: every request completed, so MPI no longer uses the buffer.
        let slots = unsafe { Box::from_raw(ptr) };
        Ok(Some(if ranks.me == root {
            slots.into_vec()
        } else {
            Vec::new()
        }))
    } else {
        tracing::warn!("an MPI arrivals gather timed out; its buffer is left to MPI");
        Ok(None)
    }
}

/// A rank's "here" in a roll call, to rank 0.
const HERE_TAG: c_int = 0x4c48;
/// Rank 0's verdict of a roll call: who did not answer.
const VERDICT_TAG: c_int = 0x4c56;
/// Between two passes over a roll call's requests: a roll call runs once, after a failure.
const ROLL_CALL_PAUSE: Duration = Duration::from_millis(1);

/// Tests each of `requests` until all completed or `until` passes; which completed.
fn poll_each(requests: &mut [ffi::MPI_Request], until: Instant) -> Result<Vec<bool>> {
    let mut done = vec![false; requests.len()];
    loop {
        for (request, done) in requests.iter_mut().zip(done.iter_mut()) {
            if *done {
                continue;
            }
            let mut flag: c_int = 0;
            // SAFETY: a live request made by `start_p2p` (MPI sets it to the null request
            // once complete, and `done` keeps it from being tested again).
            let rc = unsafe { ffi::MPI_Test(request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                return Err(mpi_error("MPI_Test", rc));
            }
            *done = flag != 0;
        }
        if done.iter().all(|d| *d) || Instant::now() >= until {
            return Ok(done);
        }
        std::thread::sleep(ROLL_CALL_PAUSE);
    }
}

/// `len` i64s that MPI may use for the rest of the process: a roll call's requests may
/// never complete (a rank that is gone), so their buffers are never freed. A few bytes,
/// once per broadcaster, after its failure.
fn leaked_i64s(len: usize) -> *mut i64 {
    Box::leak(vec![0i64; len].into_boxed_slice()).as_mut_ptr()
}

/// After a round (the `round`-th this rank started) timed out, finds out which ranks are
/// still here with messages apart from the stuck collective. Every rank other than 0 tells
/// rank 0 it is here and waits up to `wait` for rank 0's verdict: the ranks that did not
/// answer, through rank 0 (`via` `[0]`); without a verdict, rank 0 itself is the one
/// missing. Rank 0 waits up to `wait / 2` for every other rank to say it is here and tells
/// those that did who did not. `None` when every rank answered (none is missing, so the
/// timeout has another cause) or on a one-rank group.
pub(crate) fn roll_call(
    comm: &SimpleCommunicator,
    ranks: Ranks,
    round: u64,
    wait: Duration,
) -> Result<Option<lens_core::backend::slab::RollCall>> {
    use lens_core::backend::slab::RollCall;
    let n = usize::try_from(ranks.size).unwrap_or(0);
    if n < 2 {
        return Ok(None);
    }
    let verdict_len = as_c_int(n + 1, "verdict of")?;
    // SAFETY (each call below): the buffers are leaked, so they outlive any request that
    // may still use them; each receive writes into its own slot; the communicator is valid
    // while the caller holds it; the datatype is a predefined MPI constant.
    let int64 = unsafe { ffi::RSMPI_INT64_T };
    if ranks.me != 0 {
        let here = leaked_i64s(1);
        unsafe { *here = i64::try_from(round).unwrap_or(i64::MAX) };
        let mut requests = Vec::with_capacity(2);
        let out = (here.cast::<c_void>(), 1, int64);
        unsafe { start_p2p(Way::Send, out, 0, HERE_TAG, comm, &mut requests) }?;
        let verdict = leaked_i64s(n + 1);
        let into = (verdict.cast::<c_void>(), verdict_len, int64);
        unsafe { start_p2p(Way::Recv, into, 0, VERDICT_TAG, comm, &mut requests) }?;
        let heard = poll_each(&mut requests[1..], Instant::now() + wait)?;
        if !heard.first().copied().unwrap_or(false) {
            tracing::warn!(round, "rank 0 did not answer the roll call after a timeout");
            return Ok(Some(RollCall::new(vec![0], Vec::new())));
        }
        // SAFETY: the receive completed, so MPI has written the verdict and no longer uses it.
        let words = unsafe { std::slice::from_raw_parts(verdict, n + 1) };
        let count = usize::try_from(words[0]).unwrap_or(0).min(n);
        let me = usize::try_from(ranks.me).unwrap_or(0);
        let missing: Vec<usize> = words[1..=count]
            .iter()
            .filter_map(|&r| usize::try_from(r).ok())
            .filter(|&r| r < n && r != me)
            .collect();
        return Ok((!missing.is_empty()).then(|| RollCall::new(missing, vec![0])));
    }
    let slots = leaked_i64s(n);
    let mut requests = Vec::with_capacity(n - 1);
    for from in 1..ranks.size {
        let slot = usize::try_from(from).unwrap_or(0);
        let into = (unsafe { slots.add(slot) }.cast::<c_void>(), 1, int64);
        unsafe { start_p2p(Way::Recv, into, from, HERE_TAG, comm, &mut requests) }?;
    }
    let answered = poll_each(&mut requests, Instant::now() + wait / 2)?;
    let missing: Vec<usize> = (1..n).filter(|&r| !answered[r - 1]).collect();
    tracing::warn!(round, ?missing, "roll call after a timeout");
    if missing.is_empty() {
        return Ok(None);
    }
    let verdict = leaked_i64s(n + 1);
    // SAFETY: the buffer holds n + 1 i64s and no request uses it yet.
    let words = unsafe { std::slice::from_raw_parts_mut(verdict, n + 1) };
    words[0] = i64::try_from(missing.len()).unwrap_or(0);
    for (w, &r) in words[1..].iter_mut().zip(&missing) {
        *w = i64::try_from(r).unwrap_or(-1);
    }
    let mut sends = Vec::with_capacity(n - 1);
    for to in (1..n).filter(|r| answered[r - 1]) {
        let out = (verdict.cast::<c_void>(), verdict_len, int64);
        let to = as_c_int(to, "rank")?;
        unsafe { start_p2p(Way::Send, out, to, VERDICT_TAG, comm, &mut sends) }?;
    }
    // Small messages leave at once; a rank that stopped reading is not waited for long.
    poll_each(&mut sends, Instant::now() + wait / 4)?;
    Ok(Some(RollCall::new(missing, Vec::new())))
}

/// Runs one `MPI_Ibcast` of `buf` from `root` and polls it until it completes or the
/// deadline passes. Gives the buffer back when done; `None` on a timeout, when the buffer
/// is leaked because MPI may still write into it.
pub(crate) fn ibcast(
    comm: &SimpleCommunicator,
    root: usize,
    buf: Box<[u8]>,
    round: &Round,
) -> Result<Option<Box<[u8]>>> {
    let count = as_c_int(buf.len(), "buffer of")?;
    let root = as_c_int(root, "root")?;
    let ptr = Box::into_raw(buf);
    // SAFETY: reading a predefined MPI constant.
    let mut request: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `ptr` points to `count` bytes that stay allocated until the request
    // completes (below) or forever (leaked on a timeout); the communicator is valid while
    // the caller holds it; the datatype is a predefined MPI constant.
    let rc = unsafe {
        ffi::MPI_Ibcast(
            ptr.cast::<c_void>(),
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
        return Err(mpi_error("MPI_Ibcast", rc));
    }
    if wait(&mut request, round)? {
        // SAFETY: the request completed, so MPI no longer uses the buffer.
        Ok(Some(unsafe { Box::from_raw(ptr) }))
    } else {
        tracing::warn!("MPI broadcast timed out; its buffer is left to MPI");
        Ok(None)
    }
}

/// Tests between two readings of the clock: a round takes a few tests, and reading the
/// clock at each one was a tenth of a round's time.
const TESTS_PER_CLOCK: u32 = 32;

/// Tests `request` until it completes (`true`) or the round's deadline passes (`false`).
fn wait(request: &mut ffi::MPI_Request, round: &Round) -> Result<bool> {
    wait_all(std::slice::from_mut(request), round)
}

/// Tests `requests` until all complete (`true`) or the round's deadline passes (`false`).
fn wait_all(requests: &mut [ffi::MPI_Request], round: &Round) -> Result<bool> {
    let count = as_c_int(requests.len(), "request count")?;
    let mut tests = 0u32;
    loop {
        let mut flag: c_int = 0;
        // SAFETY: `requests` are live requests (or null ones); the statuses are ignored.
        let rc = unsafe {
            match requests {
                [one] => ffi::MPI_Test(one, &mut flag, ffi::RSMPI_STATUS_IGNORE),
                _ => ffi::MPI_Testall(
                    count,
                    requests.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                ),
            }
        };
        if rc != 0 {
            return Err(mpi_error("MPI_Testall", rc));
        }
        if flag != 0 {
            return Ok(true);
        }
        tests += 1;
        if tests % TESTS_PER_CLOCK != 0 {
            continue;
        }
        let now = Instant::now();
        if round.expired_at(now) {
            return Ok(false);
        }
        // Each test moves the transfer on, so keep testing: yielding between tests was
        // measured slower, even with more ranks than cores.
        if now - round.started() > SPIN_FOR {
            std::thread::sleep(PAUSE);
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn an_mpi_failure_keeps_the_call_code_and_text_as_its_source() {
        let e = mpi_error("MPI_Ibcast", 13);
        let Error::Transport {
            source: Some(source),
            ..
        } = &e
        else {
            panic!("not a transport error with a source: {e:?}")
        };
        let cause = source.downcast_ref::<MpiError>().expect("an MpiError");
        assert_eq!((cause.call.as_str(), cause.code), ("MPI_Ibcast", 13));
        assert!(!cause.text.is_empty());
        // The cause is printed once: in the source, not again in the message.
        assert_eq!(e.to_string().matches("13").count(), 0, "{e}");
        assert!(cause.to_string().starts_with("MPI error 13: "), "{cause}");
        // The whole chain, as Python and `{:#}` reports print it, names the call once.
        let chain = format!("{e}: {cause}");
        assert_eq!(chain.matches("MPI_Ibcast").count(), 1, "{chain}");
    }
}
