//! Child processes with a deadline, for tests that run real processes (ranks, `mpirun`, a
//! compiler): both pipes are drained on threads while the child runs, so it never stalls on
//! a full pipe, and a child that outlives its deadline, or whose handle is dropped (a failed
//! assertion), is killed.
//!
//! ```
//! use std::process::Command;
//! use std::time::Duration;
//! use lens_testkit::process::Supervised;
//!
//! let mut cmd = Command::new("sh");
//! cmd.args(["-c", "echo out; echo err >&2"]);
//! let done = Supervised::spawn(&mut cmd, Duration::from_secs(10))?.wait();
//! assert!(done.success());
//! assert_eq!((done.stdout.as_str(), done.stderr.as_str()), ("out\n", "err\n"));
//!
//! let mut sleeper = Command::new("sleep");
//! sleeper.arg("30");
//! let done = Supervised::spawn(&mut sleeper, Duration::from_millis(100))?.wait();
//! assert!(done.timed_out && !done.success());
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting parent looks at its children.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for a pipe's end after the child exited or was killed: a grandchild may
/// still hold the pipe open, and then what was read so far is all there is.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// A pipe read on its own thread into a buffer that can be taken at any time.
#[derive(Debug)]
struct Drained {
    bytes: Arc<Mutex<Vec<u8>>>,
    ended: Receiver<()>,
}

impl Drained {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Option<Self> {
        let mut pipe = pipe?;
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (tx, ended) = std::sync::mpsc::channel();
        let into = Arc::clone(&bytes);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                into.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]);
            }
            let _ = tx.send(());
        });
        Some(Drained { bytes, ended })
    }

    /// Everything read, once the pipe ends or `until` passes.
    fn take(self, until: Instant) -> String {
        let left = until.saturating_duration_since(Instant::now());
        if let Err(RecvTimeoutError::Timeout) = self.ended.recv_timeout(left) {
            // Still open (a grandchild holds it): keep what came.
        }
        let bytes = std::mem::take(&mut *self.bytes.lock().unwrap_or_else(|e| e.into_inner()));
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A running child with a deadline; killed when dropped.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    stdout: Option<Drained>,
    stderr: Option<Drained>,
    deadline: Instant,
    status: Option<ExitStatus>,
}

/// What a child left behind.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Finished {
    /// Its exit status; `None` when it was killed at its deadline.
    pub status: Option<ExitStatus>,
    /// Whether it ran past its deadline (and was killed).
    pub timed_out: bool,
    /// Everything it wrote on stdout.
    pub stdout: String,
    /// Everything it wrote on stderr.
    pub stderr: String,
}

impl Finished {
    /// Whether it exited with status 0 before its deadline.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Stdout, then stderr: all it said, for an assertion's message.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl Supervised {
    /// Starts `cmd` with stdout and stderr piped (stdin as `cmd` sets it, else inherited),
    /// to be done within `deadline` from now.
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn spawn(cmd: &mut Command, deadline: Duration) -> io::Result<Self> {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        Ok(Supervised {
            stdout: Drained::start(child.stdout.take()),
            stderr: Drained::start(child.stderr.take()),
            child,
            deadline: Instant::now() + deadline,
            status: None,
        })
    }

    /// The child's stdin, when `cmd` piped it.
    pub fn stdin(&mut self) -> Option<&mut ChildStdin> {
        self.child.stdin.as_mut()
    }

    /// Waits (until `timeout`, and never past the child's deadline) for a line on its
    /// stdout that starts with `prefix`, while it runs; returns the rest of that line.
    pub fn wait_for_line(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let until = (Instant::now() + timeout).min(self.deadline);
        let out = self.stdout.as_ref()?;
        loop {
            let found = {
                let bytes = out.bytes.lock().unwrap_or_else(|e| e.into_inner());
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
            };
            if found.is_some() || Instant::now() >= until {
                return found;
            }
            std::thread::sleep(POLL);
        }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (never blocks); kills it when its deadline has passed.
    fn done(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status.is_some() || Instant::now() >= self.deadline
    }

    /// Waits until the child exits or its deadline passes (then kills it), and returns what
    /// it left.
    pub fn wait(mut self) -> Finished {
        while !self.done() {
            std::thread::sleep(POLL);
        }
        self.finish()
    }

    fn finish(mut self) -> Finished {
        let timed_out = self.status.is_none();
        if timed_out {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let until = Instant::now() + PIPE_GRACE;
        let take = |d: Option<Drained>| d.map(|d| d.take(until)).unwrap_or_default();
        Finished {
            status: self.status,
            timed_out,
            stdout: take(self.stdout.take()),
            stderr: take(self.stderr.take()),
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `mpirun -n <ranks>` with the flags lens's tests run Open MPI with (as root, more ranks
/// than cores, no cross-process memory attach, which containers often forbid); the program
/// and its arguments follow. `None` when `mpirun` is not on the `PATH`, so that a test can
/// report itself ignored.
pub fn mpirun(ranks: usize) -> Option<Command> {
    let paths = std::env::var_os("PATH")?;
    let exe = std::env::split_paths(&paths)
        .map(|p| p.join("mpirun"))
        .find(|p| p.is_file())?;
    let mut cmd = Command::new(exe);
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n"])
        .arg(ranks.to_string())
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
    Some(cmd)
}

/// Waits for every child at once (each until its own deadline) and returns what each left,
/// in order, calling `on_exit` as each one ends so a caller can fail early (dropping the
/// rest kills them).
pub fn wait_all(
    children: Vec<Supervised>,
    mut on_exit: impl FnMut(usize, &Finished),
) -> Vec<Finished> {
    let mut running: Vec<Option<Supervised>> = children.into_iter().map(Some).collect();
    let mut out: Vec<Option<Finished>> = (0..running.len()).map(|_| None).collect();
    while out.iter().any(Option::is_none) {
        for (i, slot) in running.iter_mut().enumerate() {
            if slot.as_mut().is_some_and(Supervised::done) {
                if let Some(child) = slot.take() {
                    let done = child.finish();
                    on_exit(i, &done);
                    out[i] = Some(done);
                }
            }
        }
        std::thread::sleep(POLL);
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_fills_both_pipes_does_not_stall() {
        // 1 MiB on each pipe: far over a pipe's buffer, so an undrained pipe would block it.
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "head -c 1048576 /dev/zero | tr '\\0' e >&2; head -c 1048576 /dev/zero | tr '\\0' o",
        ]);
        let done = Supervised::spawn(&mut cmd, Duration::from_secs(30))
            .expect("Debian has /bin/sh")
            .wait();
        assert!(done.success() && !done.timed_out, "{:?}", done.status);
        assert_eq!((done.stdout.len(), done.stderr.len()), (1 << 20, 1 << 20));
    }

    #[test]
    fn a_line_is_seen_while_the_child_runs() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo noise; echo 'ADDR 127.0.0.1:9'; sleep 60"]);
        let child =
            Supervised::spawn(&mut cmd, Duration::from_secs(30)).expect("Debian has /bin/sh");
        let got = child.wait_for_line("ADDR ", Duration::from_secs(10));
        assert_eq!(got.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(
            child.wait_for_line("NEVER ", Duration::from_millis(50)),
            None
        );
    }

    #[test]
    fn wait_all_reports_each_child_as_it_ends() {
        let start = |script: &str| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", script]);
            Supervised::spawn(&mut cmd, Duration::from_secs(2)).expect("Debian has /bin/sh")
        };
        let mut order = Vec::new();
        let t = Instant::now();
        let done = wait_all(
            vec![
                start("sleep 0.3; exit 3"),
                start("exit 0"),
                start("sleep 60"),
            ],
            |i, _| order.push(i),
        );
        assert_eq!(order, [1, 0, 2]);
        assert_eq!(done[0].status.and_then(|s| s.code()), Some(3));
        assert!(done[1].success());
        assert!(done[2].timed_out, "the sleeper is killed at its deadline");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}
