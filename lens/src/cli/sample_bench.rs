//! `lens sample-bench`: what the step sampler costs and saves in a job of many ranks. The
//! same job runs twice on the same group, every span exported and then through the sampler:
//! each step a span per rank, one step in `--slow-every` slow on one rank chosen at random.
//! Printed: the spans exported as a fraction of all, the slow steps kept whole on every
//! rank, what a rank held at most, and the median ordinary step of each run with their
//! ratio.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lens::sample::{SampleRules, StepSampler};
use lens::{Broadcaster, LinkedSpan, Parent, blocking};
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, Span, SpanData, SpanProcessor};
use serde_json::{Value as Json, json};

use super::args::{BackendArg, OnlyArg, SampleBenchArgs};

/// Prefix of the line a rank process prints with its figures.
#[cfg_attr(not(feature = "tcp"), allow(dead_code))]
pub(crate) const FIGURES_LINE: &str = "lens-sample-bench ";

/// Stands in for an exporter: counts the spans that reach it, and the steps they are of.
#[derive(Debug, Default, Clone)]
struct Counter {
    spans: Arc<AtomicU64>,
    steps: Arc<Mutex<BTreeSet<i64>>>,
}

impl SpanProcessor for Counter {
    fn on_start(&self, _: &mut Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        self.spans.fetch_add(1, Ordering::Relaxed);
        let step = span.attributes.iter().find_map(|kv| match kv.value {
            Value::I64(s) if kv.key.as_str() == "nv.dl.step" => Some(s),
            _ => None,
        });
        if let Some(s) = step {
            self.steps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(s);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The job: how many steps, which are slow and on which rank.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) steps: usize,
    pub(crate) slow_every: u64,
    pub(crate) slow: Duration,
    pub(crate) rules: SampleRules,
}

impl Job {
    pub(crate) fn of(args: &SampleBenchArgs) -> Result<Job, String> {
        let rules = SampleRules::parse(&args.sample)
            .map_err(|e| format!("--sample {:?}: {e}", args.sample))?;
        if rules.is_off() {
            return Err(format!(
                "--sample {:?}: no rule keeps any step",
                args.sample
            ));
        }
        if args.slow_every == 0 || args.steps == 0 {
            return Err("--steps and --slow-every are at least 1".into());
        }
        Ok(Job {
            steps: args.steps,
            slow_every: args.slow_every,
            slow: Duration::from_millis(args.slow_ms),
            rules,
        })
    }

    /// The rank that is slow in `step`, if the step is slow: one in `slow_every`, by a
    /// hash of the step, so every rank agrees without talking.
    pub(crate) fn slow_rank(&self, step: usize, n: usize) -> Option<usize> {
        let h = mix(step as u64);
        (h % self.slow_every == 0).then(|| (mix(h) % n as u64) as usize)
    }

    pub(crate) fn slow_steps(&self, n: usize) -> BTreeSet<i64> {
        (0..self.steps)
            .filter(|&s| self.slow_rank(s, n).is_some())
            .map(|s| s as i64)
            .collect()
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One rank's figures for one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Figures {
    pub(crate) rank: usize,
    pub(crate) sampled: bool,
    pub(crate) exported: u64,
    pub(crate) steps: BTreeSet<i64>,
    pub(crate) peak_spans: usize,
    pub(crate) peak_bytes: usize,
    /// Rank 0: each ordinary step's time, round to round, in ns.
    pub(crate) ordinary_ns: Vec<u64>,
}

// What a TCP rank process prints and its launcher reads.
#[cfg_attr(not(feature = "tcp"), allow(dead_code))]
impl Figures {
    pub(crate) fn to_json(&self) -> Json {
        json!({
            "rank": self.rank, "sampled": self.sampled, "exported": self.exported,
            "steps": self.steps, "peak_spans": self.peak_spans, "peak_bytes": self.peak_bytes,
            "ordinary_ns": self.ordinary_ns,
        })
    }

    pub(crate) fn from_json(v: &Json) -> Option<Figures> {
        let ints = |k: &str| -> Option<Vec<u64>> {
            v.get(k)?.as_array()?.iter().map(Json::as_u64).collect()
        };
        Some(Figures {
            rank: usize::try_from(v.get("rank")?.as_u64()?).ok()?,
            sampled: v.get("sampled")?.as_bool()?,
            exported: v.get("exported")?.as_u64()?,
            steps: v
                .get("steps")?
                .as_array()?
                .iter()
                .map(Json::as_i64)
                .collect::<Option<_>>()?,
            peak_spans: usize::try_from(v.get("peak_spans")?.as_u64()?).ok()?,
            peak_bytes: usize::try_from(v.get("peak_bytes")?.as_u64()?).ok()?,
            ordinary_ns: ints("ordinary_ns")?,
        })
    }
}

/// Runs the job on this rank of `b`, every span exported (`sampled` false) or through a
/// step sampler with the job's rules.
pub(crate) fn run_rank(b: &dyn Broadcaster, job: &Job, sampled: bool) -> Result<Figures, String> {
    let (rank, n) = (b.rank(), b.world_size());
    let counter = Counter::default();
    let sampler = sampled.then(|| StepSampler::new(job.rules.clone(), counter.clone()));
    let provider = match &sampler {
        Some(s) => SdkTracerProvider::builder().with_span_processor(s.processor()),
        None => SdkTracerProvider::builder().with_span_processor(counter.clone()),
    }
    .build();
    let tracer = provider.tracer("sample-bench");
    let wrapped = sampler.as_ref().map(|s| s.group(b));
    let group: &dyn Broadcaster = match &wrapped {
        Some(g) => g,
        None => b,
    };
    let fail = |e: lens::Error| format!("rank {rank}: {e}");
    // Every rank starts together.
    blocking::broadcast(b, 0, (rank == 0).then_some(&b"go"[..])).map_err(fail)?;
    let mut ordinary_ns = Vec::new();
    let mut last = Instant::now();
    for step in 0..job.steps {
        let attr = KeyValue::new("nv.dl.step", step as i64);
        let slow = job.slow_rank(step, n);
        if rank == 0 {
            let cx = Context::new().with_span(
                tracer
                    .span_builder("train_step")
                    .with_attributes([attr])
                    .start(&tracer),
            );
            blocking::broadcast_context(group, 0, &cx).map_err(fail)?;
            let now = Instant::now();
            // The step before ended with this round: ordinary when no rank was slow in it.
            if step > 0 && job.slow_rank(step - 1, n).is_none() {
                ordinary_ns.push(u64::try_from((now - last).as_nanos()).unwrap_or(u64::MAX));
            }
            last = now;
            if slow == Some(0) {
                std::thread::sleep(job.slow);
            }
            cx.span().end();
        } else {
            let remote = blocking::broadcast_context(group, 0, &Context::new()).map_err(fail)?;
            let mut span = LinkedSpan::builder("stage")
                .remote(&remote)
                .parent(Parent::Remote)
                .attributes([attr])
                .start_with_context(&tracer, &Context::new());
            if slow == Some(rank) {
                std::thread::sleep(job.slow);
            }
            span.end();
        }
    }
    // The last step ends with one more round.
    blocking::broadcast(b, 0, (rank == 0).then_some(&b"end"[..])).map_err(fail)?;
    let stats = sampler.as_ref().map(StepSampler::stats);
    drop(wrapped);
    let _ = provider.shutdown();
    let steps = counter
        .steps
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    Ok(Figures {
        rank,
        sampled,
        exported: counter.spans.load(Ordering::Relaxed),
        steps,
        peak_spans: stats.map_or(0, |s| s.peak_spans),
        peak_bytes: stats.map_or(0, |s| s.peak_bytes),
        ordinary_ns,
    })
}

/// The report, from every rank's figures of both runs.
pub(crate) fn report(
    setting: &str,
    n: usize,
    job: &Job,
    all: &[Figures],
) -> Result<String, String> {
    let run =
        |sampled: bool| -> Vec<&Figures> { all.iter().filter(|f| f.sampled == sampled).collect() };
    let (full, sampled) = (run(false), run(true));
    if full.len() != n || sampled.len() != n {
        return Err(format!(
            "figures from {} and {} of {n} ranks",
            full.len(),
            sampled.len()
        ));
    }
    let total = |r: &[&Figures]| r.iter().map(|f| f.exported).sum::<u64>();
    let (every, kept) = (total(&full), total(&sampled));
    let slow = job.slow_steps(n);
    let whole = slow
        .iter()
        .filter(|s| sampled.iter().all(|f| f.steps.contains(s)))
        .count();
    let first = &sampled[0].steps;
    let same = sampled.iter().all(|f| &f.steps == first);
    let peak_spans = sampled.iter().map(|f| f.peak_spans).max().unwrap_or(0);
    let peak_bytes = sampled.iter().map(|f| f.peak_bytes).max().unwrap_or(0);
    let median = |r: &[&Figures]| {
        let mut v: Vec<u64> = r
            .iter()
            .find(|f| f.rank == 0)
            .map(|f| f.ordinary_ns.clone())
            .unwrap_or_default();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0) as f64 / 1e3
    };
    let (m_full, m_sampled) = (median(&full), median(&sampled));
    Ok(format!(
        "lens sample-bench: {setting}, {n} ranks, {} steps, {} slow (one rank {} ms late), rules {}\n\
         spans exported: {kept} of {every} ({:.2}%); steps kept on every rank alike: {}\n\
         slow steps kept whole (spans from every rank): {whole} of {}\n\
         held per rank at most: {peak_spans} spans, {:.1} KiB\n\
         ordinary step (median, rank 0): {m_sampled:.1} us sampled, {m_full:.1} us exporting everything: {:.3}x",
        job.steps,
        slow.len(),
        job.slow.as_millis(),
        rules_text(&job.rules),
        100.0 * kept as f64 / every.max(1) as f64,
        if same { "yes" } else { "NO" },
        slow.len(),
        peak_bytes as f64 / 1024.0,
        m_sampled / m_full.max(f64::MIN_POSITIVE),
    ))
}

fn rules_text(r: &SampleRules) -> String {
    let mut parts = Vec::new();
    if let Some(d) = r.slower_than() {
        parts.push(format!("slower-than={}ms", d.as_millis()));
    }
    if let Some(q) = r.quantile() {
        parts.push(format!("slower-than=p{}", q * 100.0));
    }
    if let Some(d) = r.spread_over() {
        parts.push(format!("spread-over={}ms", d.as_millis()));
    }
    if let Some(k) = r.baseline() {
        parts.push(format!("baseline={k}"));
    }
    parts.join(",")
}

/// Runs the bench as the command line asks: in-process ranks on threads, or TCP processes
/// of this program on 127.0.0.1 (and, with the hidden `--rank`, one such process).
pub(crate) fn run(args: &SampleBenchArgs) -> Result<(), String> {
    let job = Job::of(args)?;
    let n = args.ranks;
    if n < 2 {
        return Err("--ranks: at least 2".into());
    }
    let timeout = super::args::secs_arg("--timeout", args.timeout)?;
    if args.only.is_some() && args.backend != BackendArg::Local {
        return Err("--only applies to --backend local".into());
    }
    match args.backend {
        BackendArg::Local => {
            let runs: &[bool] = match args.only {
                None => &[false, true],
                Some(OnlyArg::All) => &[false],
                Some(OnlyArg::Sampled) => &[true],
            };
            let mut all = Vec::new();
            for &sampled in runs {
                let ranks = lens::local::LocalCluster::new(n)
                    .timeout(timeout)
                    .broadcasters();
                let got = lens::testkit::on_each_rank(&ranks, |b| run_rank(b, &job, sampled));
                all.extend(got.into_iter().collect::<Result<Vec<_>, _>>()?);
            }
            if args.only.is_some() {
                let spans: u64 = all.iter().map(|f| f.exported).sum();
                println!(
                    "lens sample-bench: one run, {} steps on {n} ranks, {spans} spans exported",
                    job.steps
                );
                return Ok(());
            }
            println!(
                "{}",
                report("in-process ranks, one thread each", n, &job, &all)?
            );
            Ok(())
        }
        #[cfg(feature = "tcp")]
        BackendArg::Tcp => match args.spawned.rank {
            Some(rank) => tcp_rank(args, &job, rank, timeout),
            None => {
                let all = tcp_job(args, timeout)?;
                println!(
                    "{}",
                    report("TCP processes on loopback, a star", n, &job, &all)?
                );
                Ok(())
            }
        },
        #[allow(unreachable_patterns)]
        _ => Err("sample-bench runs on --backend local or tcp".into()),
    }
}

/// One rank process of the TCP job: both runs on one group, its figures on stdout.
#[cfg(feature = "tcp")]
fn tcp_rank(
    args: &SampleBenchArgs,
    job: &Job,
    rank: usize,
    timeout: Duration,
) -> Result<(), String> {
    let mut builder = lens::tcp::TcpConfigBuilder::from_env()
        .rank(rank)
        .timeout(timeout)
        .world_size(args.spawned.world.unwrap_or(args.ranks));
    if let Some(addr) = &args.spawned.addr {
        builder = builder.addr(addr.clone());
    }
    let config = builder.build().map_err(|e| format!("rank {rank}: {e}"))?;
    let group =
        lens::tcp::TcpBroadcaster::connect(config).map_err(|e| format!("rank {rank}: {e}"))?;
    for sampled in [false, true] {
        let f = run_rank(&group, job, sampled)?;
        println!("{FIGURES_LINE}{}", f.to_json());
    }
    Ok(())
}

/// Starts the TCP job's processes and gathers their figures.
#[cfg(feature = "tcp")]
fn tcp_job(args: &SampleBenchArgs, timeout: Duration) -> Result<Vec<Figures>, String> {
    use super::backends::tcp_key;
    use std::io::BufRead as _;
    let n = args.ranks;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))?
        .port();
    let key = tcp_key()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let command = |rank: usize| {
        let mut c = std::process::Command::new(&exe);
        c.args(["sample-bench", "--backend", "tcp"])
            .args(["--rank", &rank.to_string(), "--world", &n.to_string()])
            .args(["--addr", &format!("127.0.0.1:{port}")])
            .args(["--steps", &args.steps.to_string()])
            .args(["--slow-every", &args.slow_every.to_string()])
            .args(["--slow-ms", &args.slow_ms.to_string()])
            .args(["--sample", &args.sample])
            .args(["--timeout", &args.timeout.to_string()])
            .env(lens::tcp::env::KEY_FILE, &key.0)
            .env_remove(lens::tcp::env::KEY);
        c
    };
    let read = |r: std::io::BufReader<Box<dyn std::io::Read + Send>>| -> Vec<Figures> {
        r.lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let json = serde_json::from_str(l.strip_prefix(FIGURES_LINE)?).ok()?;
                Figures::from_json(&json)
            })
            .collect()
    };
    // Two runs of the steps, each slow step late by its delay.
    let per_run = timeout + job_time(args);
    let deadline = Duration::from_secs(120) + per_run * 2;
    let exited = super::launcher::run_collect(n, command, deadline, read)?;
    let mut all = Vec::new();
    for (rank, e) in exited.into_iter().enumerate() {
        if !e.ok {
            return Err(format!("rank {rank} failed: {}", e.stderr.trim()));
        }
        all.extend(e.out);
    }
    Ok(all)
}

/// A generous bound on one run: the slow steps' delays and 20 ms a step.
#[cfg(feature = "tcp")]
fn job_time(args: &SampleBenchArgs) -> Duration {
    let steps = args.steps as u64;
    Duration::from_millis(steps / args.slow_every.max(1) * args.slow_ms + steps * 20)
}
