//! The rank's GPU, read through NVML (`libnvidia-ml.so.1`) loaded at run time: nothing is
//! needed to build, and a machine without NVML (or without the GPU asked for) gets no GPU
//! attributes, never an error.
// NVML is a C library: calling it is unsafe code, kept to this file.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use libloading::Library;
use opentelemetry::KeyValue;

/// `nv.gpu.uuid`: the GPU's UUID (`GPU-…`).
pub const GPU_UUID: &str = "nv.gpu.uuid";
/// `nv.gpu.index`: the GPU's NVML index on its host (not renumbered by
/// `CUDA_VISIBLE_DEVICES`).
pub const GPU_INDEX: &str = "nv.gpu.index";
/// `nv.gpu.model`: the GPU's product name.
pub const GPU_MODEL: &str = "nv.gpu.model";
/// `nv.gpu.driver_version`: the driver's version.
pub const GPU_DRIVER_VERSION: &str = "nv.gpu.driver_version";

/// Which GPU to describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Which {
    /// By NVML index.
    Index(usize),
    /// By UUID (`GPU-…` or `MIG-…`, as `CUDA_VISIBLE_DEVICES` may name it).
    Uuid(String),
    /// None (the process sees no GPU).
    None,
}

/// The four GPU attributes, or none when NVML cannot be loaded or does not know the GPU.
pub(crate) fn gpu_attributes(which: Which) -> Vec<KeyValue> {
    if which == Which::None {
        return Vec::new();
    }
    match query(&which) {
        Ok(kvs) => kvs,
        Err(reason) => {
            tracing::debug!(%reason, ?which, "no GPU attributes");
            Vec::new()
        }
    }
}

type Init = unsafe extern "C" fn() -> c_int;
type ByIndex = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type ByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type DeviceText = unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int;
type DeviceIndex = unsafe extern "C" fn(*mut c_void, *mut c_uint) -> c_int;
type SystemText = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;

/// NVML's longest strings (UUIDs, names and versions are shorter than this).
const TEXT: usize = 96;

fn text(buf: &[c_char; TEXT]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn query(which: &Which) -> Result<Vec<KeyValue>, String> {
    // SAFETY: loading NVML runs its initialisers, as for every program that uses NVML.
    let lib = unsafe { Library::new("libnvidia-ml.so.1") }.map_err(|e| e.to_string())?;
    // SAFETY: each symbol is looked up with the signature nvml.h gives it.
    let (init, shutdown, by_index, by_uuid, uuid, name, index, driver) = unsafe {
        (
            *lib.get::<Init>(b"nvmlInit_v2\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<Init>(b"nvmlShutdown\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<ByIndex>(b"nvmlDeviceGetHandleByIndex_v2\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<ByUuid>(b"nvmlDeviceGetHandleByUUID\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<DeviceText>(b"nvmlDeviceGetUUID\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<DeviceText>(b"nvmlDeviceGetName\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<DeviceIndex>(b"nvmlDeviceGetIndex\0")
                .map_err(|e| e.to_string())?,
            *lib.get::<SystemText>(b"nvmlSystemGetDriverVersion\0")
                .map_err(|e| e.to_string())?,
        )
    };
    let check = |rc: c_int, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("{what} returned NVML error {rc}"))
        }
    };
    // SAFETY: NVML's own calls, with pointers to buffers of the sizes passed; the device
    // handle is used only between init and shutdown, while `lib` is loaded.
    unsafe {
        check(init(), "nvmlInit_v2")?;
        let described = (|| {
            let mut device: *mut c_void = std::ptr::null_mut();
            match which {
                Which::Index(i) => {
                    let i = c_uint::try_from(*i).map_err(|_| "index out of range".to_owned())?;
                    check(by_index(i, &mut device), "nvmlDeviceGetHandleByIndex_v2")?;
                }
                Which::Uuid(u) => {
                    let u = CString::new(u.as_str()).map_err(|e| e.to_string())?;
                    check(
                        by_uuid(u.as_ptr(), &mut device),
                        "nvmlDeviceGetHandleByUUID",
                    )?;
                }
                Which::None => return Err("no GPU".to_owned()),
            }
            let mut buf = [0 as c_char; TEXT];
            check(
                uuid(device, buf.as_mut_ptr(), TEXT as c_uint),
                "nvmlDeviceGetUUID",
            )?;
            let gpu_uuid = text(&buf);
            let mut buf = [0 as c_char; TEXT];
            check(
                name(device, buf.as_mut_ptr(), TEXT as c_uint),
                "nvmlDeviceGetName",
            )?;
            let model = text(&buf);
            let mut idx: c_uint = 0;
            check(index(device, &mut idx), "nvmlDeviceGetIndex")?;
            let mut buf = [0 as c_char; TEXT];
            check(
                driver(buf.as_mut_ptr(), TEXT as c_uint),
                "nvmlSystemGetDriverVersion",
            )?;
            let version = text(&buf);
            Ok(vec![
                KeyValue::new(GPU_UUID, gpu_uuid),
                KeyValue::new(GPU_INDEX, i64::from(idx)),
                KeyValue::new(GPU_MODEL, model),
                KeyValue::new(GPU_DRIVER_VERSION, version),
            ])
        })();
        let _ = shutdown();
        described
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stops_at_the_nul() {
        let mut buf = [0 as c_char; TEXT];
        for (i, b) in b"GPU-1234".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(text(&buf), "GPU-1234");
    }
}
