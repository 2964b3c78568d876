//! lens errors as Python exceptions: the classes live in `lens_trace.errors` (plain Python,
//! so users can catch them without importing the extension), and each keeps the Rust
//! error's full text, its kind, and for a timeout the ranks that never arrived.

use std::error::Error as _;

use lens_core::{Disagreement, Error};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The `lens_trace.errors` class for `e`, and a short name of its kind.
fn class_of(e: &Error) -> (&'static str, &'static str) {
    match e {
        Error::Timeout { .. } => ("BroadcastTimeout", "timeout"),
        Error::Decode(_) | Error::Corrupt { .. } => ("DecodeError", "decode"),
        Error::Unauthenticated { .. } => ("AuthenticationError", "unauthenticated"),
        Error::InvalidRoot { .. } | Error::MissingPayload { .. } => {
            ("InvalidArgument", "invalid_argument")
        }
        Error::PayloadTooLarge { .. } => ("InvalidArgument", "payload_too_large"),
        Error::Config { .. } | Error::Mismatch { .. } => ("ConfigError", "config"),
        Error::Unavailable { .. } => ("UnavailableError", "unavailable"),
        Error::SourceFailed { .. } => ("SourceFailed", "source_failed"),
        Error::Closed { .. } => ("GroupClosed", "closed"),
        _ => ("TransportError", "transport"),
    }
}

/// What ranks disagreed about, as `ConfigError.disagreement` says it.
fn disagreement(about: Disagreement) -> &'static str {
    match about {
        Disagreement::Root => "root",
        Disagreement::SlabSize => "slab_size",
        Disagreement::Group => "group",
        Disagreement::Format => "format",
        _ => "other",
    }
}

/// The whole chain of causes, as Rust prints it with `{:#}`-style context.
fn detail(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `e` as an instance of its `lens_trace.errors` class, with `kind`, `detail` and (for a
/// timeout) `missing_ranks` and `after` set.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    match build(py, &e) {
        Ok(err) => err,
        // The package's Python half is missing (the extension imported on its own).
        Err(_) => PyRuntimeError::new_err(detail(&e)),
    }
}

fn build(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let (class, kind) = class_of(e);
    let module = py.import("lens_trace.errors")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("kind", kind)?;
    // The message is the whole chain: a traceback shows only the message, and the cause
    // (the OS's or the library's answer) is in the chain's tail.
    let text = detail(e);
    kwargs.set_item("detail", &text)?;
    if let Error::Timeout {
        after,
        missing,
        last_seen,
        via,
    } = e
    {
        kwargs.set_item("missing_ranks", missing.clone())?;
        kwargs.set_item("via", via.clone())?;
        kwargs.set_item("after", after.as_secs_f64())?;
        let seen = PyDict::new(py);
        for (rank, round) in last_seen {
            seen.set_item(rank, round)?;
        }
        kwargs.set_item("last_seen", seen)?;
    }
    if let Error::SourceFailed { root } = e {
        kwargs.set_item("source_rank", *root)?;
    }
    if let Error::Config { setting, .. } = e {
        kwargs.set_item("setting", setting.as_deref())?;
    }
    if let Error::Mismatch { about, .. } = e {
        kwargs.set_item("disagreement", disagreement(*about))?;
    }
    let instance = module.getattr(class)?.call((text,), Some(&kwargs))?;
    Ok(PyErr::from_value(instance))
}

/// A `Result` of lens mapped into Python.
pub(crate) trait IntoPy<T> {
    /// The value, or the error as its Python exception.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for lens_core::Result<T> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
