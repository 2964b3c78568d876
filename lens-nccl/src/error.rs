//! NCCL and CUDA failures as lens errors, with the NCCL result code kept.

use lens_core::Error;

use crate::probe::BACKEND;

/// An NCCL call's result code, kept as the source of the [`Error::Transport`] it caused,
/// whose message names the call; this error's text is the result, so a printed chain says
/// each once.
///
/// ```
/// # fn check(e: &lens_core::Error) {
/// use std::error::Error as _;
/// if let Some(nccl) = e.source().and_then(|s| s.downcast_ref::<lens_nccl::NcclResult>()) {
///     eprintln!("NCCL said {} ({})", nccl.name, nccl.code);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NcclResult {
    /// The `ncclResult_t` value.
    pub code: i32,
    /// Its name, such as `ncclRemoteError`.
    pub name: String,
}

impl std::fmt::Display for NcclResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.name, self.code)
    }
}

impl std::error::Error for NcclResult {}

pub(crate) fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> Error {
    let result = NcclResult {
        code: e.0 as i32,
        name: format!("{:?}", e.0),
    };
    Error::Transport {
        backend: BACKEND,
        message: format!("{what} failed"),
        source: Some(Box::new(result)),
    }
}

pub(crate) fn cuda_err(what: &str, e: cudarc::driver::DriverError) -> Error {
    Error::Transport {
        backend: BACKEND,
        message: format!("{what} failed"),
        source: Some(Box::new(e)),
    }
}
