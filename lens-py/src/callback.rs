//! A slab transport over a collective written in Python (a `torch.distributed` group, say):
//! lens's slab round, deadline and refusal-after-failure run in Rust; the one collective per
//! round is the Python callable's.

use lens_core::Error;
use lens_core::backend::slab::{Round, Slab, SlabTransport};
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// The Python callable `collective(buf, root, timeout_seconds)`, and optionally
/// `gather(value, root, timeout_seconds)`, which returns every rank's value (a list indexed
/// by rank) on the root.
#[derive(Debug)]
pub(crate) struct PyCollective {
    collective: Py<PyAny>,
    gather: Option<Py<PyAny>>,
    world_size: usize,
}

impl PyCollective {
    pub(crate) fn new(collective: Py<PyAny>, gather: Option<Py<PyAny>>, world_size: usize) -> Self {
        PyCollective {
            collective,
            gather,
            world_size,
        }
    }

    /// The error of a Python callable that raised: a timeout, or the transport's failure
    /// with the Python exception kept as its source.
    fn failed(py: Python<'_>, round: &Round, e: PyErr) -> lens_core::Error {
        if e.is_instance_of::<PyTimeoutError>(py) {
            return round.timed_out();
        }
        Error::Transport {
            backend: "python collective",
            message: "the collective raised".to_owned(),
            source: Some(Box::new(e)),
        }
    }

    /// One call of the collective on `buf`, whose bytes it fills in place on non-roots.
    fn run(&self, round: &Round, buf: &mut [u8]) -> lens_core::Result<()> {
        let left = round
            .deadline()
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(round.timed_out());
        }
        Python::attach(|py| {
            let array = PyByteArray::new(py, buf);
            if let Err(e) = self
                .collective
                .call1(py, (array.clone(), round.root, left.as_secs_f64()))
            {
                return Err(Self::failed(py, round, e));
            }
            let filled = array.to_vec();
            if filled.len() != buf.len() {
                return Err(Error::Corrupt {
                    reason: format!(
                        "the collective changed the buffer's length from {} to {} bytes",
                        buf.len(),
                        filled.len()
                    ),
                });
            }
            buf.copy_from_slice(&filled);
            Ok(())
        })?;
        // A collective that returned late still missed the round's deadline.
        if round.expired() {
            return Err(round.timed_out());
        }
        Ok(())
    }
}

impl SlabTransport for PyCollective {
    fn broadcast_slab(
        &mut self,
        round: &Round,
        slab: &mut Slab,
        _sent: Option<usize>,
    ) -> lens_core::Result<()> {
        self.run(round, slab)
    }

    fn broadcast_rest(&mut self, round: &Round, rest: &mut [u8]) -> lens_core::Result<()> {
        self.run(round, rest)
    }

    fn gather_i64(&mut self, round: &Round, value: i64) -> lens_core::Result<Option<Vec<i64>>> {
        let Some(gather) = &self.gather else {
            return Ok(None);
        };
        let left = round
            .deadline()
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(round.timed_out());
        }
        let n = self.world_size;
        let values = Python::attach(|py| {
            let got = gather
                .call1(py, (value, round.root, left.as_secs_f64()))
                .map_err(|e| Self::failed(py, round, e))?;
            let values: Vec<i64> = got.extract(py).map_err(|e| Error::Corrupt {
                reason: format!("the gather did not return a list of ints: {e}"),
            })?;
            if values.len() != n {
                return Err(Error::Corrupt {
                    reason: format!("the gather returned {} values for {n} ranks", values.len()),
                });
            }
            Ok(values)
        })?;
        if round.expired() {
            return Err(round.timed_out());
        }
        Ok(Some(values))
    }
}
