//! A slab transport over a collective written in Python (a `torch.distributed` group, say):
//! lens's slab round, deadline and refusal-after-failure run in Rust; the one collective per
//! round is the Python callable's.

use lens_core::Error;
use lens_core::backend::slab::{Round, Slab, SlabTransport};
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// The Python callable `collective(buf, root, timeout_seconds)`.
#[derive(Debug)]
pub(crate) struct PyCollective {
    collective: Py<PyAny>,
}

impl PyCollective {
    pub(crate) fn new(collective: Py<PyAny>) -> Self {
        PyCollective { collective }
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
            match self
                .collective
                .call1(py, (array.clone(), round.root, left.as_secs_f64()))
            {
                Ok(_) => {}
                Err(e) if e.is_instance_of::<PyTimeoutError>(py) => return Err(round.timed_out()),
                Err(e) => {
                    return Err(Error::Transport {
                        backend: "python collective",
                        message: e.to_string(),
                        source: Some(Box::new(e)),
                    });
                }
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
}
