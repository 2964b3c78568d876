//! Starts the ranks of a demo job as processes of this program on this machine, reads what
//! they print while they run, and gathers their spans and failures into one [`Job`].

use std::io::{BufRead as _, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::export::{ExportRecord, OTLP_LINE};
use super::record::Decided;
use super::record::{
    CLOCK_LINE, Job, KEPT_LINE, SPAN_LINE, SpanRecord, clock_from_json, kept_from_json,
};

/// Kills every child still running when dropped, so that no rank outlives a failed launch.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads a pipe to its end on a thread of its own, so that a child never stalls on a full
/// pipe, whichever of its two pipes it writes.
fn drain<T: Send + 'static>(
    pipe: Option<impl Read + Send + 'static>,
    read: impl FnOnce(BufReader<Box<dyn Read + Send>>) -> T + Send + 'static,
) -> JoinHandle<Option<T>> {
    std::thread::spawn(move || {
        pipe.map(|p| read(BufReader::new(Box::new(p) as Box<dyn Read + Send>)))
    })
}

/// How one child ended: what `read` made of its stdout, whether it succeeded, its stderr.
pub(crate) struct Exited<T> {
    pub(crate) out: T,
    pub(crate) ok: bool,
    pub(crate) stderr: String,
}

/// Runs `n` processes, process `r` as `command(r)`, until all have exited or `deadline` has
/// passed (then every one still running is killed). Each one's stdout goes through `read`
/// while it runs.
pub(crate) fn run_collect<T: Default + Send + 'static>(
    n: usize,
    command: impl Fn(usize) -> Command,
    deadline: Duration,
    read: fn(BufReader<Box<dyn Read + Send>>) -> T,
) -> Result<Vec<Exited<T>>, String> {
    let mut children = Children(Vec::with_capacity(n));
    let mut readers = Vec::with_capacity(n);
    for rank in 0..n {
        let mut child = command(rank)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        let out = drain(child.stdout.take(), read);
        let stderr = drain(child.stderr.take(), |mut r| {
            let mut text = String::new();
            let _ = r.read_to_string(&mut text);
            text
        });
        children.0.push(child);
        readers.push((out, stderr));
    }
    let until = Instant::now() + deadline;
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) {
        if Instant::now() > until {
            return Err(format!(
                "ranks still running after {deadline:?}: {:?}",
                (0..n).filter(|&r| status[r].is_none()).collect::<Vec<_>>()
            ));
        }
        for (rank, child) in children.0.iter_mut().enumerate() {
            if status[rank].is_none() {
                status[rank] = child
                    .try_wait()
                    .map_err(|e| format!("waiting for rank {rank}: {e}"))?;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut exited = Vec::with_capacity(n);
    for (rank, (out, stderr)) in readers.into_iter().enumerate() {
        let lost = || format!("reading rank {rank}'s output failed");
        exited.push(Exited {
            out: out.join().map_err(|_| lost())?.unwrap_or_default(),
            ok: status[rank].is_some_and(|s| s.success()),
            stderr: stderr.join().map_err(|_| lost())?.unwrap_or_default(),
        });
    }
    Ok(exited)
}

/// The last line a failed rank wrote to stderr, without the program's and the rank's own
/// prefix (the job's report names the rank once).
pub(crate) fn reason_of(rank: usize, stderr: &str) -> String {
    let reason = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("exited with an error")
        .trim_start_matches("lens: ");
    reason
        .strip_prefix(&format!("rank {rank}: "))
        .unwrap_or(reason)
        .to_owned()
}

/// What a demo rank prints: its spans, its export report, its clock, its sampler's steps.
type Printed = (
    Vec<SpanRecord>,
    Option<ExportRecord>,
    Option<lens::ClockOffset>,
    Option<Vec<Decided>>,
);

fn read_printed(r: BufReader<Box<dyn Read + Send>>) -> Printed {
    let (mut spans, mut export, mut clock, mut kept) = (Vec::new(), None, None, None);
    for l in r.lines().map_while(Result::ok) {
        if let Some(json) = l.strip_prefix(SPAN_LINE) {
            let json = serde_json::from_str(json).ok();
            spans.extend(json.as_ref().and_then(SpanRecord::from_json));
        } else if let Some(json) = l.strip_prefix(OTLP_LINE) {
            let json = serde_json::from_str(json).ok();
            export = json.as_ref().and_then(ExportRecord::from_json);
        } else if let Some(json) = l.strip_prefix(CLOCK_LINE) {
            let json = serde_json::from_str(json).ok();
            clock = json.as_ref().and_then(clock_from_json);
        } else if let Some(json) = l.strip_prefix(KEPT_LINE) {
            let json = serde_json::from_str(json).ok();
            kept = json.as_ref().and_then(kept_from_json);
        }
    }
    (spans, export, clock, kept)
}

/// Runs `n` ranks, rank `r` as `command(r)` (which prints its spans as span lines and a
/// one-line reason on stderr when it fails), until all have exited or `deadline` has passed.
pub(crate) fn run_ranks(
    n: usize,
    command: impl Fn(usize) -> Command,
    deadline: Duration,
) -> Result<Job, String> {
    let mut job = Job::default();
    for (rank, e) in run_collect(n, command, deadline, read_printed)?
        .into_iter()
        .enumerate()
    {
        let (spans, export, clock, kept) = e.out;
        job.ranks.push(spans);
        job.exports.extend(export);
        job.clocks.push(clock);
        job.kept.push(kept);
        if !e.ok {
            let reason = reason_of(rank, &e.stderr);
            let timeout = reason.contains("timed out");
            job.failures.push((rank, reason, timeout));
        }
    }
    Ok(job)
}
