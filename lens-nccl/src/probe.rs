//! Is CUDA and NCCL usable here? Checked before any cudarc call, because cudarc panics
//! when a library or a symbol is missing.
// Loading the CUDA and NCCL libraries to see whether they are there.
#![allow(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};

use lens_core::{Error, Result};

pub(crate) const BACKEND: &str = "nccl";

/// Symbols lens calls, checked in each library before cudarc touches it.
const CUDA_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuCtxCreate_v2",
    "cuStreamCreate",
    "cuEventQuery",
];
const NCCL_SYMBOLS: &[&str] = &[
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclGetVersion",
];

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Probe {
    /// The CUDA driver library cudarc loads.
    pub cuda_library: String,
    /// The NCCL library cudarc loads.
    pub nccl_library: String,
    /// NCCL's version code (e.g. 22703 for 2.27.3).
    pub nccl_version: i32,
    /// Number of CUDA devices.
    pub devices: usize,
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        reason: reason.into(),
    }
}

/// The first of cudarc's candidate names for `lib` that loads and has every symbol.
fn find(lib: &str, symbols: &[&str]) -> Result<String> {
    let mut candidates = cudarc::get_lib_name_candidates(lib);
    // cudarc's list repeats some names; the reason quotes it, so keep each once, in order.
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|c| seen.insert(c.clone()));
    let mut tried = Vec::new();
    for name in &candidates {
        // SAFETY: loading a shared library runs its initialisers; the CUDA and NCCL
        // libraries are meant to be loaded this way (it is what cudarc does next).
        let Ok(library) = (unsafe { libloading::Library::new(name) }) else {
            continue;
        };
        let missing: Vec<&str> = symbols
            .iter()
            .copied()
            // SAFETY: the symbol is only looked up, never called through this pointer.
            .filter(|s| unsafe { library.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
            .collect();
        if missing.is_empty() {
            return Ok(name.clone());
        }
        tried.push(format!("{name} lacks {missing:?}"));
    }
    let mut reason = format!("lib{lib} not found (searched {candidates:?} on the loader path)");
    if !tried.is_empty() {
        reason = format!("lib{lib} is too old or incomplete: {}", tried.join("; "));
    } else if lib == "nccl" {
        // NCCL ships as libnccl.so.2, a name cudarc does not search.
        // SAFETY: as above.
        if unsafe { libloading::Library::new("libnccl.so.2") }.is_ok() {
            reason = "libnccl.so.2 is present but cudarc looks for libnccl.so: add a libnccl.so symlink \
                      to it in a directory on LD_LIBRARY_PATH (scripts/gpu-check.sh does)"
                .into();
        }
    }
    Err(unavailable(reason))
}

/// Checks that the CUDA driver and NCCL libraries can be loaded, that they have what lens
/// calls, and that there is at least one device. Never panics.
///
/// # Errors
/// [`Error::Unavailable`] saying what is missing.
pub fn probe() -> Result<Probe> {
    let cuda_library = find("cuda", CUDA_SYMBOLS)?;
    let nccl_library = find("nccl", NCCL_SYMBOLS)?;
    // Both libraries are loadable with every symbol, so cudarc will not panic on loading;
    // catch_unwind is a second guard for anything else it asserts.
    let devices = catch_unwind(AssertUnwindSafe(cudarc::driver::CudaContext::device_count))
        .map_err(|_| unavailable("the CUDA driver panicked while counting devices"))?
        .map_err(|e| unavailable(format!("the CUDA driver cannot count devices: {e:?}")))?;
    let devices = usize::try_from(devices).unwrap_or(0);
    if devices == 0 {
        return Err(unavailable("no CUDA device"));
    }
    let nccl_version = catch_unwind(AssertUnwindSafe(cudarc::nccl::result::get_nccl_version))
        .map_err(|_| unavailable("NCCL panicked while reporting its version"))?
        .map_err(|e| unavailable(format!("NCCL cannot report its version: {e:?}")))?;
    Ok(Probe {
        cuda_library,
        nccl_library,
        nccl_version,
        devices,
    })
}

/// Runs `f` (a cudarc call) and turns a panic into [`Error::Unavailable`].
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| unavailable(format!("{what} panicked in cudarc")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_unavailable_not_a_panic() {
        match find("lens-no-such-library", &["x"]) {
            Err(Error::Unavailable {
                backend: "nccl",
                reason,
            }) => assert!(reason.contains("not found"), "{reason}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn library_without_the_symbols_is_unavailable() {
        // zlib is on every machine of this kind (as libz.so.1); it has no NCCL symbols.
        match find("z", &["deflate", "ncclBroadcast"]) {
            Err(Error::Unavailable { reason, .. }) => {
                assert!(reason.contains("ncclBroadcast"), "{reason}")
            }
            other => panic!("expected Unavailable naming the missing symbol, got {other:?}"),
        }
        assert!(
            find("z", &["deflate"]).is_ok(),
            "zlib loads and has deflate"
        );
    }
}
