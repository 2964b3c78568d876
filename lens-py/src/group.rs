//! `Group`: one rank's handle on a lens group, whatever the transport, and the functions
//! that make one.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use lens_core::backend::slab::{SlabBroadcaster, SlabOptions};
use lens_core::sample::{SampleRules, StepSampler};
use lens_core::{Broadcaster, Error, blocking};
use lens_local::LocalCluster;
use lens_tcp::{SourceReturns, TcpBroadcaster, TcpConfigBuilder};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::callback::PyCollective;
use crate::carrier::{from_dict, to_dict};
use crate::errors::IntoPy as _;

/// One rank of a lens group. Every rank calls each broadcast, in the same order; each wait
/// is bounded by the group's timeout and runs with the GIL released.
// `weakref`: torch_group keeps its groups in a WeakSet, to close them at exit.
#[pyclass(module = "lens_trace._native", frozen, weakref)]
pub(crate) struct Group {
    /// `None` once closed.
    inner: RwLock<Option<Arc<dyn Broadcaster>>>,
    /// The same broadcaster when it is a TCP one, for `flush` (cleared by `close` too).
    tcp: RwLock<Option<Arc<TcpBroadcaster>>>,
    rank: usize,
    world_size: usize,
    backend: &'static str,
    timeout: Option<Duration>,
    /// The step sampler that decides this rank's steps (`sample`), once asked for.
    sampler: RwLock<Option<StepSampler>>,
}

impl Group {
    fn new(b: Arc<dyn Broadcaster>, backend: &'static str, timeout: Option<Duration>) -> Self {
        Group {
            rank: b.rank(),
            world_size: b.world_size(),
            inner: RwLock::new(Some(b)),
            tcp: RwLock::new(None),
            backend,
            timeout,
            sampler: RwLock::new(None),
        }
    }

    fn sampler(&self) -> Option<StepSampler> {
        self.sampler
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn live(&self) -> lens_core::Result<Arc<dyn Broadcaster>> {
        let closed = || Error::Closed {
            backend: self.backend,
            reason: "close() was called on this rank".into(),
        };
        // A poisoned lock only means a panic elsewhere; the handle itself is still sound.
        let guard = self.inner.read().unwrap_or_else(|p| p.into_inner());
        guard.clone().ok_or_else(closed)
    }
}

#[pymethods]
impl Group {
    /// This rank's index in the group.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group has.
    #[getter]
    fn world_size(&self) -> usize {
        self.world_size
    }

    /// The transport: "tcp", "local" or "callback".
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// The deadline of one broadcast in seconds, where the group has one of its own.
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.timeout.map(|t| t.as_secs_f64())
    }

    /// Broadcasts raw bytes from `root`: the root passes `payload`, the others `None`; every
    /// rank gets the root's bytes.
    #[pyo3(signature = (root, payload=None))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        root: usize,
        payload: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.live().py(py)?;
        let bytes = py
            .detach(|| blocking::broadcast(&*b, root, payload))
            .py(py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Broadcasts the source's carrier (a `dict[str, str]` from the W3C propagators; the
    /// others pass `None`) and returns it on every rank, or `None` on every rank when it
    /// holds no `traceparent`. One collective; the bytes are NeMo Lens's JSON.
    #[pyo3(signature = (src_rank, carrier=None))]
    fn broadcast_carrier<'py>(
        &self,
        py: Python<'py>,
        src_rank: usize,
        carrier: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let b = self.live().py(py)?;
        let mine = match carrier {
            Some(d) if self.rank == src_rank => Some(from_dict(d)?),
            _ => None,
        };
        let got = py
            .detach(|| blocking::broadcast_carrier(&*b, src_rank, mine.as_ref()))
            .py(py)?;
        got.map(|c| to_dict(py, &c)).transpose()
    }

    /// Broadcasts the source's carrier, whatever it holds (another propagator's headers,
    /// baggage alone, nothing), and returns it on every rank as a `dict`. One collective;
    /// a `traceparent`, when present, is checked.
    #[pyo3(signature = (src_rank, carrier=None))]
    fn broadcast_map<'py>(
        &self,
        py: Python<'py>,
        src_rank: usize,
        carrier: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let b = self.live().py(py)?;
        let mine = match carrier {
            Some(d) if self.rank == src_rank => Some(from_dict(d)?),
            _ => None,
        };
        let got = py
            .detach(|| blocking::broadcast_carrier_whole(&*b, src_rank, mine.as_ref()))
            .py(py)?;
        to_dict(py, &got)
    }

    /// `broadcast_map` for the default W3C pair, with the source's carrier written here
    /// from its parts: `ids` is `(trace_id, span_id, trace_flags)` of a valid span context
    /// (`None` for none), `tracestate` and `baggage` the headers where there are any. The
    /// other ranks pass only `src_rank`. The carrier is put into `into` (a `dict`, empty)
    /// where given, else a new `dict`: the same keys, values and order as `broadcast_map` of
    /// what the W3C propagators inject, without a `dict` made and read on the way.
    #[pyo3(signature = (src_rank, ids=None, tracestate=None, baggage=None, into=None))]
    fn broadcast_w3c<'py>(
        &self,
        py: Python<'py>,
        src_rank: usize,
        ids: Option<(u128, u64, u8)>,
        tracestate: Option<&str>,
        baggage: Option<&str>,
        into: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let b = self.live().py(py)?;
        let mine = (self.rank == src_rank).then(|| {
            let mut c = lens_core::Carrier::new();
            if let Some((trace_id, span_id, flags)) = ids {
                c.insert(
                    "traceparent",
                    format!("00-{trace_id:032x}-{span_id:016x}-{flags:02x}"),
                );
                if let Some(ts) = tracestate.filter(|t| !t.is_empty()) {
                    c.insert("tracestate", ts);
                }
            }
            if let Some(bg) = baggage.filter(|b| !b.is_empty()) {
                c.insert("baggage", bg);
            }
            c
        });
        let got = py
            .detach(|| blocking::broadcast_carrier_whole(&*b, src_rank, mine.as_ref()))
            .py(py)?;
        let dict = into.unwrap_or_else(|| PyDict::new(py));
        for (k, v) in got.iter() {
            dict.set_item(k, v)?;
        }
        Ok(dict)
    }

    /// How the ranks came to the last round this rank was the source of, where the
    /// transport knows (`tcp_group`, `local_cluster`): a tuple
    /// `(last_rank, spread_ns, [(rank, ns_after_first), ...latest first])`, taken (asked
    /// once); `None` elsewhere. The list holds only ranks later than `later_than_ns` after
    /// the first, and at most `most` of them, where given: the source asks for the few it
    /// reports, not a tuple per rank of the group.
    #[pyo3(signature = (later_than_ns=None, most=None))]
    fn take_arrivals(
        &self,
        later_than_ns: Option<u64>,
        most: Option<usize>,
    ) -> Option<(usize, u64, Vec<(usize, u64)>)> {
        let b = self.live().ok()?;
        let a = b.take_arrivals()?;
        let ranks = a
            .ranks
            .into_iter()
            .filter(|&(_, ns)| later_than_ns.is_none_or(|t| ns > t))
            .take(most.unwrap_or(usize::MAX))
            .collect();
        Some((a.last_rank, a.spread_ns, ranks))
    }

    /// How many rounds this rank has started, where the transport counts them.
    fn rounds_started(&self) -> Option<u64> {
        self.live().ok()?.rounds_started()
    }

    /// Every rank's wall-clock offset from `reference`'s: a list indexed by rank of
    /// `(offset_ns, error_ns)` (this rank's clock minus the reference's, and the most it can
    /// be wrong by). Collective: every rank calls it with the same arguments; it costs
    /// `repetitions × (world_size − 1) × 2 + 1` broadcasts.
    #[pyo3(signature = (reference=0, repetitions=4))]
    fn clock_offsets(
        &self,
        py: Python<'_>,
        reference: usize,
        repetitions: usize,
    ) -> PyResult<Vec<(i64, u64)>> {
        let b = self.live().py(py)?;
        let table = py
            .detach(|| lens_core::measure_clock_offsets(&*b, reference, repetitions))
            .py(py)?;
        Ok(table.iter().map(|c| (c.offset_ns, c.error_ns)).collect())
    }

    /// A TCP group made with `source_returns="queued"`: waits, within that round's
    /// deadline, until the last round this rank was the source of has reached every rank,
    /// and raises its failure (`BroadcastTimeout` naming the ranks that did not
    /// acknowledge it). Returns at once for every other group.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let tcp = self.tcp.read().unwrap_or_else(|p| p.into_inner()).clone();
        match tcp {
            Some(t) => py.detach(|| t.flush()).py(py),
            None => Ok(()),
        }
    }

    /// Leaves the group: later calls on this rank raise `GroupClosed`. Idempotent. A TCP
    /// group made with `source_returns="queued"` first flushes (see `flush`) and raises
    /// the last round's failure after closing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let tcp = self.tcp.write().unwrap_or_else(|p| p.into_inner()).take();
        let flushed = match &tcp {
            Some(t) => py.detach(|| t.flush()),
            None => Ok(()),
        };
        let taken = {
            let mut guard = self.inner.write().unwrap_or_else(|p| p.into_inner());
            guard.take()
        };
        // A TCP group's sockets close as it drops; let that happen without the GIL. (A
        // callback group's Python objects dropped there are released as `detach` takes the
        // GIL back: `test_closing_a_callback_group_lets_go_of_its_collective_at_once`.)
        py.detach(move || drop((taken, tcp)));
        flushed.py(py)
    }

    /// Decides this rank's steps with lens's step sampler, by `rules` (the text of
    /// `LENS_SAMPLE`; `None`: the variables'): from now on each trace-context broadcast of
    /// the group ends a step, and the source's decisions travel in the carriers. The spans
    /// are held by `lens_trace.StepSampler`, which follows `sample_decisions`. Every rank
    /// calls it, before the steps it samples. Raises `ConfigError` for bad rules.
    #[pyo3(signature = (rules=None))]
    fn sample(&self, py: Python<'_>, rules: Option<&str>) -> PyResult<()> {
        let rules = match rules {
            Some(text) => SampleRules::parse(text)
                .map_err(|e| Error::config_of(lens_core::sample::LENS_SAMPLE, e)),
            None => SampleRules::from_env(),
        }
        .py(py)?;
        let mut sampler = self.sampler.write().unwrap_or_else(|p| p.into_inner());
        if sampler.is_some() {
            return Err(PyValueError::new_err("this group samples already"));
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let Some(b) = inner.take() else {
            return Err(Error::Closed {
                backend: self.backend,
                reason: "close() was called on this rank".into(),
            })
            .py(py);
        };
        let s = StepSampler::deciding_only(rules);
        *inner = Some(Arc::new(s.group(b)));
        *sampler = Some(s);
        Ok(())
    }

    /// The current step in the source's count (0 before the first broadcast), or `None`
    /// where the group does not sample.
    fn sample_step(&self) -> Option<u64> {
        self.sampler().map(|s| s.current_step())
    }

    /// The steps decided after step `since` (of the last 4,096 decided), oldest first:
    /// `(step, reason or None when dropped, th)`, th the tracestate threshold its kept
    /// spans carry.
    #[pyo3(signature = (since=0))]
    fn sample_decisions(&self, since: u64) -> Vec<(u64, Option<&'static str>, String)> {
        self.sampler().map_or_else(Vec::new, |s| {
            s.decision_log(since)
                .into_iter()
                .map(|(step, r, t)| (step, r.map(|r| r.as_str()), t.th()))
                .collect()
        })
    }

    /// Votes to keep this rank's current step on every rank (where the transport carries
    /// votes: `local_cluster`, `tcp_group`).
    fn sample_vote(&self) {
        if let Some(s) = self.sampler() {
            s.keep_this_step();
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.live().is_err()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<lens_trace Group backend={} rank={} world_size={}{}>",
            self.backend,
            self.rank,
            self.world_size,
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// Seconds from Python as a `Duration`: positive and finite, else `ValueError`.
fn seconds(what: &str, secs: f64) -> PyResult<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        return Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {secs}"
        )));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|e| PyValueError::new_err(format!("{what} of {secs} s: {e}")))
}

/// Joins lens's TCP group (the one Rust ranks join with `TcpBroadcaster`): settings from
/// the environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `LENS_TCP_KEY_FILE`
/// or `LENS_TCP_KEY`, `LENS_TCP_TIMEOUT`, ...), each overridden by the argument given.
/// Blocks, without the GIL, until every rank has joined or the join timeout passes.
/// `source_returns="queued"` (`LENS_TCP_SOURCE_RETURNS`) makes a source's broadcast return
/// once its data is queued: a rank missing from that round is named by the source's next
/// call (or logged when the group closes), and the source's span gets no straggler
/// attributes; the default `"delivered"` waits for every rank's acknowledgement.
/// `spin_us` (`LENS_TCP_SPIN_US`, default 100) is how long each wait of a round polls
/// before it sleeps; 0: never.
#[pyfunction]
#[pyo3(signature = (*, rank=None, world_size=None, addr=None, key=None, timeout=None, join_timeout=None, fan_out=None, source_returns=None, spin_us=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments, each optional.
pub(crate) fn tcp_group(
    py: Python<'_>,
    rank: Option<usize>,
    world_size: Option<usize>,
    addr: Option<String>,
    key: Option<&Bound<'_, PyAny>>,
    timeout: Option<f64>,
    join_timeout: Option<f64>,
    fan_out: Option<usize>,
    source_returns: Option<&str>,
    spin_us: Option<i64>,
) -> PyResult<Group> {
    let mut b = TcpConfigBuilder::from_env();
    if let Some(r) = rank {
        b = b.rank(r);
    }
    if let Some(n) = world_size {
        b = b.world_size(n);
    }
    if let Some(a) = addr {
        b = b.addr(a);
    }
    if let Some(k) = key {
        b = if let Ok(s) = k.cast::<PyString>() {
            b.key(s.extract::<String>()?.as_bytes())
        } else if let Ok(bytes) = k.cast::<PyBytes>() {
            b.key(bytes.as_bytes())
        } else {
            return Err(PyTypeError::new_err("key must be str or bytes"));
        };
    }
    if let Some(t) = timeout {
        b = b.timeout(seconds("timeout", t)?);
    }
    if let Some(t) = join_timeout {
        b = b.join_timeout(seconds("join_timeout", t)?);
    }
    if let Some(k) = fan_out {
        b = b.fan_out(k);
    }
    if let Some(when) = source_returns {
        b = b.source_returns(SourceReturns::parse(when).py(py)?);
    }
    if let Some(us) = spin_us {
        let us = u64::try_from(us).map_err(|_| {
            PyValueError::new_err(format!("spin_us must be 0 or more microseconds, not {us}"))
        })?;
        b = b.spin(Duration::from_micros(us));
    }
    let config = b.build().py(py)?;
    let deadline = config.timeout();
    let group = py.detach(|| TcpBroadcaster::connect(config)).py(py)?;
    let group = Arc::new(group);
    let g = Group::new(
        Arc::clone(&group) as Arc<dyn Broadcaster>,
        "tcp",
        Some(deadline),
    );
    *g.tcp.write().unwrap_or_else(|p| p.into_inner()) = Some(group);
    Ok(g)
}

/// `world_size` ranks in this process, for tests: call each rank's broadcasts from its own
/// thread. A round that some rank misses fails after `timeout` seconds (default 30).
#[pyfunction]
#[pyo3(signature = (world_size, *, timeout=None))]
pub(crate) fn local_cluster(world_size: usize, timeout: Option<f64>) -> PyResult<Vec<Group>> {
    if world_size == 0 {
        return Err(PyValueError::new_err("a cluster needs at least one rank"));
    }
    let timeout = timeout
        .map(|t| seconds("timeout", t))
        .transpose()?
        .unwrap_or(lens_core::backend::slab::DEFAULT_ROUND_TIMEOUT);
    Ok(LocalCluster::new(world_size)
        .timeout(timeout)
        .broadcasters()
        .into_iter()
        .map(|b| Group::new(Arc::new(b), "local", Some(timeout)))
        .collect())
}

/// A group over a collective written in Python (such as one `torch.distributed.broadcast`
/// of a byte tensor): `collective(buf: bytearray, root: int, timeout: float)` must broadcast
/// `buf` from `root` in place within `timeout` seconds and raise `TimeoutError` past it.
/// lens runs its slab round on top: one collective of `slab_size` bytes per carrier, a
/// second only for a carrier that does not fit, and refusal of every round after a failed
/// one (this rank is then out of step with its peers). With `gather(value: int, root: int,
/// timeout: float) -> list[int]` (every rank's value, indexed by rank, on the root) and
/// `arrivals_every=n`, every n rounds each rank's entry time (wall clock) goes to the root
/// after the round, so the source's span names the rank that came last.
#[pyfunction]
#[pyo3(signature = (collective, rank, world_size, *, timeout=None, slab_size=None, gather=None, arrivals_every=0))]
#[allow(clippy::too_many_arguments)] // the Python signature: keywords, not a struct
pub(crate) fn callback_group(
    py: Python<'_>,
    collective: Py<PyAny>,
    rank: usize,
    world_size: usize,
    timeout: Option<f64>,
    slab_size: Option<usize>,
    gather: Option<Py<PyAny>>,
    arrivals_every: u64,
) -> PyResult<Group> {
    if !collective.bind(py).is_callable() {
        return Err(PyTypeError::new_err("collective must be callable"));
    }
    if gather.as_ref().is_some_and(|g| !g.bind(py).is_callable()) {
        return Err(PyTypeError::new_err("gather must be callable"));
    }
    if arrivals_every > 0 && gather.is_none() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "arrivals_every needs a gather callable",
        ));
    }
    let mut opts = SlabOptions::default().arrivals_every(arrivals_every);
    if let Some(t) = timeout {
        opts = opts.timeout(seconds("timeout", t)?);
    }
    if let Some(s) = slab_size {
        opts = opts.slab_size(s);
    }
    let deadline = opts.timeout;
    let group = SlabBroadcaster::new(
        "python collective",
        *b"LNSP",
        PyCollective::new(collective, gather, world_size),
        (rank, world_size),
        &opts,
    )
    .py(py)?;
    Ok(Group::new(Arc::new(group), "callback", Some(deadline)))
}
