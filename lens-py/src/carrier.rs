//! The carrier between Python dicts and lens's `Carrier`, and its wire bytes.

use lens_core::Carrier;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::IntoPy as _;

/// A `dict[str, str]` as a carrier, in the dict's order; anything else is a `TypeError`.
pub(crate) fn from_dict(dict: &Bound<'_, PyDict>) -> PyResult<Carrier> {
    let mut carrier = Carrier::new();
    for (k, v) in dict.iter() {
        let (Ok(key), Ok(value)) = (k.extract::<String>(), v.extract::<String>()) else {
            return Err(PyTypeError::new_err(format!(
                "a carrier maps str to str; got {}: {}",
                k.get_type().name()?,
                v.get_type().name()?
            )));
        };
        carrier.insert(key, value);
    }
    Ok(carrier)
}

/// A carrier as a new `dict`, in its order.
pub(crate) fn to_dict<'py>(py: Python<'py>, carrier: &Carrier) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in carrier.iter() {
        dict.set_item(k, v)?;
    }
    Ok(dict)
}

/// The bytes a carrier travels as: exactly what `json.dumps(carrier).encode()` gives, as
/// NeMo Lens sends them.
#[pyfunction]
pub(crate) fn encode_carrier<'py>(
    py: Python<'py>,
    carrier: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyBytes>> {
    let carrier = from_dict(carrier)?;
    Ok(PyBytes::new(py, &carrier.to_bytes()))
}

/// A carrier from its bytes; `DecodeError` for anything that is not a JSON object of strings
/// within the size limit.
#[pyfunction]
pub(crate) fn decode_carrier<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let carrier = Carrier::decode(data)
        .map_err(lens_core::Error::from)
        .py(py)?;
    to_dict(py, &carrier)
}
