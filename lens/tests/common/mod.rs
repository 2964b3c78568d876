//! Runs the `lens` program as a user would, with a deadline; killed if it outlives it.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::Duration;

use lens::testkit::process::Supervised;

pub(crate) mod otlp;

pub(crate) struct Run {
    pub(crate) ok: bool,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// `lens args` with `env` set (and no `LENS_TCP_KEY` inherited), killed past `deadline`.
pub(crate) fn lens_with_env(args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lens"));
    cmd.args(args)
        .env_remove("LENS_TCP_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let done = Supervised::spawn(&mut cmd, deadline)
        .expect("lens starts")
        .wait();
    assert!(
        !done.timed_out,
        "lens {args:?} ran past its {deadline:?} deadline and was killed"
    );
    Run {
        ok: done.success(),
        stdout: done.stdout,
        stderr: done.stderr,
    }
}

/// `lens args`, killed past `deadline`.
pub(crate) fn lens(args: &[&str], deadline: Duration) -> Run {
    lens_with_env(args, &[], deadline)
}

/// The demo's per-step "arrivals:" lines in `stdout`: asserts one per step, each naming
/// `rank` as the rank that came last; returns each step's spread in ms.
pub(crate) fn steps_naming_the_straggler(stdout: &str, rank: usize, steps: usize) -> Vec<f64> {
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains("arrivals:")).collect();
    assert_eq!(lines.len(), steps, "one per step shown: {stdout}");
    lines
        .iter()
        .map(|l| {
            assert!(l.contains(&format!("rank {rank} came last")), "{l}");
            l.split("last, ")
                .nth(1)
                .and_then(|t| t.split(" ms").next())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("no spread in {l}"))
        })
        .collect()
}

impl Run {
    /// Asserts the run failed with a one-line reason on stderr, and returns that line.
    pub(crate) fn failure_line(&self) -> &str {
        assert!(!self.ok, "expected a failure; stdout: {}", self.stdout);
        let line = self.stderr.trim();
        assert_eq!(line.lines().count(), 1, "one line expected: {line}");
        line
    }

    /// Where the backend is `available`, asserts the run succeeded; elsewhere, that it failed
    /// in one line saying `backend` is unavailable. Returns `available`.
    pub(crate) fn ran_or_unavailable(&self, available: bool, backend: &str) -> bool {
        if available {
            assert!(self.ok, "{}", self.stderr);
        } else {
            let line = self.failure_line();
            let want = format!("{backend} backend is unavailable");
            assert!(line.contains(&want), "{line}");
        }
        available
    }

    /// Asserts the run succeeded and printed `lens bench --json` lines for `backend`, one
    /// per `(ranks, op)` in order, each with `iters` rounds and sane timings; returns them.
    pub(crate) fn bench_lines(
        &self,
        backend: &str,
        expected: &[(u64, &str)],
        iters: u64,
    ) -> Vec<serde_json::Value> {
        assert!(self.ok, "stderr: {}", self.stderr);
        let lines: Vec<serde_json::Value> = self
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        assert_eq!(lines.len(), expected.len(), "{}", self.stdout);
        for (line, (ranks, op)) in lines.iter().zip(expected) {
            assert_eq!(
                (
                    line["backend"].as_str(),
                    line["ranks"].as_u64(),
                    line["op"].as_str()
                ),
                (Some(backend), Some(*ranks), Some(*op)),
                "{line}"
            );
            assert_eq!(line["iters"], iters, "{line}");
            assert!(line["bytes"].as_u64().is_some_and(|b| b > 55), "{line}");
            let median = line["median_us"].as_f64().expect("median");
            let p99 = line["p99_us"].as_f64().expect("p99");
            assert!(median > 0.0 && p99 >= median, "{line}");
            let cpu = line["cpu_us_per_rank"].as_f64().expect("cpu_us_per_rank");
            assert!(cpu > 0.0, "{line}");
        }
        for line in lines
            .iter()
            .filter(|l| l["op"] == "lens" || l["op"] == "lens_bytes")
        {
            assert!(line["ratio_vs_raw"].as_f64().is_some(), "{line}");
        }
        lines
    }
}
