//! A fake CUDA driver and NCCL, so that the NCCL backend's real code path (cudarc, the device
//! slab, events, aborts) runs in tests on machines without a GPU; and a fake NVML, for the GPU
//! attributes of lens-otlp's resource.
//!
//! [`FakeGpu::build`] compiles one small C library with the system compiler and links it as
//! `libcuda.so` and `libnccl.so`. A process started with [`FakeGpu::env`] (the loader reads
//! `LD_LIBRARY_PATH` at start-up, so it must be a new process) sees [`FakeGpu::devices`]
//! GPUs. Device memory is host memory. An NCCL group lives in shared memory, so its ranks may
//! be threads of one process or separate processes; a broadcast completes only once every
//! rank has queued it, so deadlines and aborts behave as on a GPU. It checks a little of what
//! real NCCL needs: a current device for `ncclCommInitRank`, and the stream's device current
//! at `ncclBroadcast`. Broadcasts are limited to 96 KiB.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::Supervised;

/// The C source of the fake libraries.
pub const SOURCE: &str = include_str!("fake_gpu.c");

/// Environment variable with the number of fake devices (default 2).
pub const DEVICES_VAR: &str = "LENS_FAKE_GPU_DEVICES";

/// Environment variable naming the folder where the fake keeps its NCCL groups' files.
pub const DIR_VAR: &str = "LENS_FAKE_GPU_DIR";

/// NCCL version code the fake reports.
pub const NCCL_VERSION: i32 = 22800;

/// Fake `libcuda.so` and `libnccl.so` in a directory of their own, removed on drop.
#[derive(Debug)]
pub struct FakeGpu {
    dir: PathBuf,
    devices: usize,
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl FakeGpu {
    /// Builds the fake libraries in a new directory under the system temporary directory,
    /// for `devices` GPUs. Needs a C compiler (`$CC`, else `cc`); gives up after 60 s.
    ///
    /// # Errors
    /// When the directory cannot be made or the compiler is missing or fails.
    pub fn build(devices: usize) -> io::Result<Self> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("lens-fake-gpu-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let fake = FakeGpu { dir, devices };
        let src = fake.dir.join("fake_gpu.c");
        std::fs::write(&src, SOURCE)?;
        let lib = fake.dir.join("libfakegpu.so");
        let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
        let mut cmd = Command::new(&cc);
        cmd.args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-lpthread")
            .stdin(Stdio::null());
        let done = Supervised::spawn(&mut cmd, Duration::from_secs(60))
            .map_err(|e| other(format!("cannot run the C compiler {cc:?}: {e}")))?
            .wait();
        if done.timed_out {
            return Err(other(format!("{cc:?} ran for over 60 s")));
        }
        if !done.success() {
            return Err(other(format!(
                "{cc:?} failed ({:?}): {}",
                done.status, done.stderr
            )));
        }
        // cudarc looks for libcuda.so and libnccl.so; probes may try the versioned names.
        // lens-otlp loads NVML by its versioned name.
        for name in [
            "libcuda.so",
            "libcuda.so.1",
            "libnccl.so",
            "libnccl.so.2",
            "libnvidia-ml.so.1",
        ] {
            std::os::unix::fs::symlink("libfakegpu.so", fake.dir.join(name))?;
        }
        Ok(fake)
    }

    /// The directory holding the fake libraries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of fake devices a process started with [`FakeGpu::apply`] sees.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// `LD_LIBRARY_PATH` for a child process: the fake first, then the current value.
    pub fn ld_library_path(&self) -> OsString {
        let mut v = OsString::from(&self.dir);
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
            v.push(":");
            v.push(old);
        }
        v
    }

    /// The environment a child process needs to see the fake: `LD_LIBRARY_PATH`, the
    /// device count and the folder for group files (removed with the fake).
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_LIBRARY_PATH", self.ld_library_path()),
            (DEVICES_VAR, self.devices.to_string().into()),
            (DIR_VAR, self.dir.clone().into_os_string()),
        ]
    }

    /// Sets up `cmd` with [`FakeGpu::env`].
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.envs(self.env())
    }

    /// The folder, kept past drop (the caller removes it): for a script that starts a
    /// process with the fake on its loader's path itself.
    pub fn keep(self) -> PathBuf {
        let kept = std::mem::ManuallyDrop::new(self);
        kept.dir.clone()
    }
}

impl Drop for FakeGpu {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
