//! `lens_trace._native`: the Rust half of the `lens_trace` Python package.
//!
//! It exposes lens's groups (the TCP group Rust ranks join, the in-process cluster, and a
//! slab group over a collective written in Python such as `torch.distributed`) and the
//! carrier codec. The Python half (`lens-py/python/lens_trace`) builds the drop-in API for
//! `nemo.lens.distributed` on top. Every wait happens with the GIL released.
#![warn(missing_docs)]
// Library paths return errors; unwrap/expect only in tests.
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// PyO3's macros expand to `unsafe` FFI glue; this crate writes none of its own.
#![allow(unsafe_code)]

mod callback;
mod carrier;
mod errors;
mod group;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<group::Group>()?;
    m.add_function(wrap_pyfunction!(group::tcp_group, m)?)?;
    m.add_function(wrap_pyfunction!(group::local_cluster, m)?)?;
    m.add_function(wrap_pyfunction!(group::callback_group, m)?)?;
    m.add_function(wrap_pyfunction!(carrier::encode_carrier, m)?)?;
    m.add_function(wrap_pyfunction!(carrier::decode_carrier, m)?)?;
    m.add("MAX_CARRIER_LEN", lens_core::Carrier::DEFAULT_MAX_LEN)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
