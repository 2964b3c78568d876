//! The TCP backend in the `lens` program: a demo over N processes and the bench against a
//! raw ZeroMQ ROUTER/DEALER exchange. The NCCL demo runs here too: its ranks meet over TCP,
//! which then carries the NCCL id (`NcclBroadcaster::bootstrap`).

use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lens::tcp::{TcpBroadcaster, TcpConfig, TcpConfigBuilder};
use lens::{Carrier, blocking};
use opentelemetry::Context;

#[cfg(feature = "nccl")]
use super::BackendArg;
use super::bench::{BLOCKS, WARMUP, print_header, print_pair, samples_from_ends, source_context};
use super::demo::{STAGE_SPAN, STEP_SPAN, finish, parent_of, run_one_rank};
use super::record::{Job, SPAN_LINE, SpanRecord};
use super::{BenchArgs, DemoArgs};

pub fn demo(args: &DemoArgs, rank: Option<u32>, timeout: Duration) -> Result<(), String> {
    if !args.inject.is_empty() {
        return Err(
            "--inject works with the local backend; with tcp, stop a rank's process instead".into(),
        );
    }
    match rank {
        Some(r) => one_rank(args, r as usize, timeout),
        None => {
            #[cfg(feature = "nccl")]
            if args.backend == BackendArg::Nccl {
                let found = lens::nccl::probe().map_err(|e| e.to_string())?;
                if args.ranks as usize > found.devices {
                    return Err(format!(
                        "--ranks {} needs {} GPUs; this machine has {} (NCCL refuses two ranks on one GPU)",
                        args.ranks, args.ranks, found.devices
                    ));
                }
            }
            spawn(args, timeout)
        }
    }
}

fn random_hex(bytes: usize) -> Result<String, String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness for a job key: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The job key of spawned ranks, in a file only this user can read (not in the
/// environment, which child processes inherit); removed when dropped.
struct KeyFile(std::path::PathBuf);

impl KeyFile {
    fn new(key: &str) -> Result<KeyFile, String> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = std::env::temp_dir().join(format!(
            "lens-demo-{}-{}.key",
            std::process::id(),
            &key[..8]
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot write the job key file {}: {e}", path.display()))?;
        f.write_all(key.as_bytes())
            .map_err(|e| format!("cannot write the job key file {}: {e}", path.display()))?;
        Ok(KeyFile(path))
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One rank of a real (possibly multi-host) job: the environment as torchrun sets it, with
/// the command line on top.
fn one_rank(args: &DemoArgs, rank: usize, timeout: Duration) -> Result<(), String> {
    let mut builder = TcpConfigBuilder::from_env().rank(rank).timeout(timeout);
    if let Some(world) = args.world {
        builder = builder.world_size(world as usize);
    }
    if let Some(addr) = &args.addr {
        builder = builder.addr(addr.clone());
    }
    if let Some(secs) = args.join_timeout {
        builder = builder.join_timeout(super::demo::secs_arg("--join-timeout", secs)?);
    }
    let config = builder.build().map_err(|e| format!("rank {rank}: {e}"))?;
    let group = TcpBroadcaster::connect(config).map_err(|e| format!("rank {rank}: {e}"))?;
    let steps = args.steps as usize;
    let (outcome, spans) = run_rank_over(&group, args, rank, timeout)?;
    if args.emit_spans {
        for s in &spans {
            println!("{SPAN_LINE}{}", s.to_json());
        }
    }
    outcome.map_err(|e| format!("rank {rank}: {e}"))?;
    if !args.emit_spans {
        println!("{}", verify_rank(rank, &spans, steps, args)?);
    }
    Ok(())
}

/// The demo on this rank over `group`, or (with `--backend nccl`) over the NCCL group that
/// `group` bootstraps.
#[cfg(feature = "nccl")]
fn run_rank_over(
    group: &TcpBroadcaster,
    args: &DemoArgs,
    rank: usize,
    timeout: Duration,
) -> Result<(lens::Result<()>, Vec<SpanRecord>), String> {
    use lens::nccl::{NcclBroadcaster, NcclOptions};
    if args.backend != BackendArg::Nccl {
        return run_one_rank(group, args);
    }
    let device = match args.device {
        Some(d) => d as usize,
        None => lens::RankInfo::from_env()
            .ok()
            .and_then(|i| i.local_rank)
            .unwrap_or(0),
    };
    let opts = NcclOptions::default().timeout(timeout);
    let gpu = futures::executor::block_on(NcclBroadcaster::bootstrap_with(group, device, &opts))
        .map_err(|e| format!("rank {rank} (GPU {device}): {e}"))?;
    run_one_rank(&gpu, args)
}

#[cfg(not(feature = "nccl"))]
fn run_rank_over(
    group: &TcpBroadcaster,
    args: &DemoArgs,
    _rank: usize,
    _timeout: Duration,
) -> Result<(lens::Result<()>, Vec<SpanRecord>), String> {
    run_one_rank(group, args)
}

/// What one rank can check alone: its spans link to rank 0's step span (and are its
/// children with --parent remote).
fn verify_rank(
    rank: usize,
    spans: &[SpanRecord],
    steps: usize,
    args: &DemoArgs,
) -> Result<String, String> {
    let name = if rank == 0 { STEP_SPAN } else { STAGE_SPAN };
    let mine: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    if mine.len() != steps {
        return Err(format!(
            "rank {rank} recorded {} {name} spans, expected {steps}",
            mine.len()
        ));
    }
    if rank > 0 {
        for s in mine {
            let link = s
                .links
                .iter()
                .find(|l| l.source_rank == Some(0))
                .ok_or_else(|| format!("rank {rank}, step {:?}: no link to rank 0", s.step))?;
            if parent_of(args.parent) == lens::Parent::Remote
                && (s.trace_id != link.trace_id || s.parent_span_id != link.span_id)
            {
                return Err(format!(
                    "rank {rank}, step {:?}: not a child of rank 0's {STEP_SPAN}",
                    s.step
                ));
            }
        }
    }
    Ok(format!(
        "ok: rank {rank}, {steps} step(s) correlated with rank 0"
    ))
}

/// Kills every child still running when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `--ranks N`: N processes of this program on 127.0.0.1, one rank each (with nccl, rank r
/// on GPU r).
fn spawn(args: &DemoArgs, timeout: Duration) -> Result<(), String> {
    let n = args.ranks as usize;
    let steps = args.steps as usize;
    let backend = args.backend.name();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))?
        .port();
    let key = KeyFile::new(&random_hex(32)?)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let parent = match args.parent {
        super::ParentArg::Current => "current",
        super::ParentArg::Remote => "remote",
    };
    let mut children = Children(Vec::with_capacity(n));
    let mut readers = Vec::with_capacity(n);
    for rank in 0..n {
        let mut child = Command::new(&exe)
            .args(["demo", "--backend", backend, "--emit-spans", "--quiet"])
            .args(["--device", &rank.to_string()])
            .args(["--rank", &rank.to_string(), "--world", &n.to_string()])
            .args([
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--steps",
                &steps.to_string(),
            ])
            .args(["--parent", parent, "--timeout", &args.timeout.to_string()])
            .env(lens::tcp::env::KEY_FILE, &key.0)
            .env_remove(lens::tcp::env::KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        let (out, err) = (child.stdout.take(), child.stderr.take());
        children.0.push(child);
        // Read while the ranks run, so that no pipe fills up.
        readers.push(std::thread::spawn(move || {
            let spans: Vec<SpanRecord> = out
                .map(|o| {
                    BufReader::new(o)
                        .lines()
                        .map_while(Result::ok)
                        .filter_map(|l| l.strip_prefix(SPAN_LINE).map(str::to_owned))
                        .filter_map(|j| {
                            serde_json::from_str(&j)
                                .ok()
                                .as_ref()
                                .and_then(SpanRecord::from_json)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut stderr = String::new();
            if let Some(mut e) = err {
                let _ = e.read_to_string(&mut stderr);
            }
            (spans, stderr)
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60) + timeout * (steps as u32 + 2);
    let mut status = vec![None; n];
    while status.iter().any(Option::is_none) {
        if Instant::now() > deadline {
            return Err(format!(
                "ranks still running at the deadline: {:?}",
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
    let mut job = Job::default();
    for (rank, reader) in readers.into_iter().enumerate() {
        let (spans, stderr) = reader
            .join()
            .map_err(|_| format!("reading rank {rank}'s output failed"))?;
        job.ranks.push(spans);
        if status[rank].is_some_and(|s| !s.success()) {
            let reason = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("exited with an error")
                .trim_start_matches("lens: ")
                .to_owned();
            let timeout = reason.contains("timed out");
            job.failures.push((rank, reason, timeout));
        }
    }
    finish(&job, args, backend, steps)
}

/// `lens bench --backend tcp`: per group size, a raw ZeroMQ fan-out of the carrier's bytes
/// (ROUTER to every DEALER, each acknowledging, no lens code) beside lens's trace-context
/// broadcast over `TcpBroadcaster`, interleaved in blocks, one thread per rank.
pub fn bench(args: &BenchArgs) -> Result<(), String> {
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(bad) = args.ranks.iter().find(|n| **n < 2 || **n > 256) {
        return Err(format!("--ranks {bad}: the tcp bench takes 2 to 256 ranks"));
    }
    let cx = source_context();
    let bytes = Carrier::from_context(&cx).encode();
    if !args.json {
        println!(
            "lens bench: backend tcp (loopback), {} carrier bytes, {} timed rounds per op, one thread per rank, lens {}",
            bytes.len(),
            args.iters,
            args.fan_out
                .map_or("as a star".to_owned(), |k| format!("with fan-out {k}"))
        );
        print_header();
    }
    for &n in &args.ranks {
        let raw_group = RawGroup::new(n)?;
        let lens_group = lens_group(n, args.fan_out)?;
        let (mut raw, mut lens) = (Vec::new(), Vec::new());
        for block in 0..BLOCKS {
            let per_block = args.iters / BLOCKS + usize::from(block < args.iters % BLOCKS);
            if per_block == 0 {
                continue;
            }
            raw.extend(raw_group.measure(WARMUP + per_block, &bytes)?);
            lens.extend(measure_lens(&lens_group, WARMUP + per_block, &cx)?);
        }
        print_pair(args, n, bytes.len(), &mut raw, &mut lens);
    }
    Ok(())
}

fn lens_group(n: usize, fan_out: Option<usize>) -> Result<Vec<TcpBroadcaster>, String> {
    let key = random_hex(32)?;
    let cfg = |rank: usize, addr: &str| {
        let mut b = TcpConfig::builder()
            .rank(rank)
            .world_size(n)
            .addr(addr)
            .key(&key)
            .timeout(Duration::from_secs(30));
        if let Some(k) = fan_out {
            b = b.fan_out(k);
        }
        b.build().map_err(|e| e.to_string())
    };
    let hub = TcpBroadcaster::start(cfg(0, "127.0.0.1:0")?).map_err(|e| e.to_string())?;
    let addr = hub.local_addr().ok_or("rank 0 has no address")?.to_string();
    let others = (1..n)
        .map(|r| TcpBroadcaster::start(cfg(r, &addr)?).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = std::iter::once(hub)
            .chain(others)
            .map(|r| s.spawn(move || r.finish()))
            .collect();
        let mut ranks = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a rank's thread failed".to_string())?
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        ranks.sort_by_key(lens::Broadcaster::rank);
        Ok(ranks)
    })
}

fn measure_lens(ranks: &[TcpBroadcaster], rounds: usize, cx: &Context) -> Result<Vec<f64>, String> {
    let ends = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|b| {
                s.spawn(move || {
                    let cx = if lens::Broadcaster::rank(b) == 0 {
                        cx.clone()
                    } else {
                        Context::new()
                    };
                    let mut ends = Vec::with_capacity(rounds);
                    for _ in 0..rounds {
                        std::hint::black_box(blocking::broadcast_context(b, 0, &cx)?);
                        ends.push(Instant::now());
                    }
                    Ok::<_, lens::Error>(ends)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a rank's thread failed".to_string())?
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    Ok(samples_from_ends(&ends, WARMUP))
}

/// The raw baseline: a ROUTER at rank 0 and a DEALER per other rank, no lens code.
struct RawGroup {
    // One context (and so one I/O thread) per rank, as separate processes would have and as
    // each TcpBroadcaster has.
    _ctx: Vec<zmq::Context>,
    // Sockets are not Sync; each is used by one thread at a time.
    router: std::sync::Mutex<zmq::Socket>,
    dealers: Vec<std::sync::Mutex<zmq::Socket>>,
}

fn zerr(e: zmq::Error) -> String {
    format!("zmq: {e}")
}

impl RawGroup {
    fn new(n: usize) -> Result<Self, String> {
        let mut contexts = vec![zmq::Context::new()];
        let router = contexts[0].socket(zmq::ROUTER).map_err(zerr)?;
        router.set_linger(0).map_err(zerr)?;
        router.bind("tcp://127.0.0.1:0").map_err(zerr)?;
        let endpoint = router
            .get_last_endpoint()
            .map_err(zerr)?
            .map_err(|_| "no endpoint".to_string())?;
        let mut dealers = Vec::new();
        for r in 1..n {
            let ctx = zmq::Context::new();
            let d = ctx.socket(zmq::DEALER).map_err(zerr)?;
            contexts.push(ctx);
            d.set_linger(0).map_err(zerr)?;
            d.set_identity(format!("r{r}").as_bytes()).map_err(zerr)?;
            d.connect(&endpoint).map_err(zerr)?;
            d.send(&b"hello"[..], 0).map_err(zerr)?;
            dealers.push(std::sync::Mutex::new(d));
        }
        for _ in 1..n {
            if router.poll(zmq::POLLIN, 10_000).map_err(zerr)? == 0 {
                return Err("raw group did not form".into());
            }
            router.recv_multipart(0).map_err(zerr)?;
        }
        Ok(RawGroup {
            _ctx: contexts,
            router: std::sync::Mutex::new(router),
            dealers,
        })
    }

    fn measure(&self, rounds: usize, bytes: &[u8]) -> Result<Vec<f64>, String> {
        let n = self.dealers.len() + 1;
        let ends = std::thread::scope(|s| {
            let router = &self.router;
            let root = s.spawn(move || {
                let router = router.lock().map_err(|_| "poisoned".to_string())?;
                let mut ends = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    for r in 1..n {
                        router
                            .send_multipart([format!("r{r}").as_bytes(), bytes], 0)
                            .map_err(zerr)?;
                    }
                    for _ in 1..n {
                        if router.poll(zmq::POLLIN, 30_000).map_err(zerr)? == 0 {
                            return Err("raw round timed out".to_string());
                        }
                        router.recv_multipart(0).map_err(zerr)?;
                    }
                    ends.push(Instant::now());
                }
                Ok(ends)
            });
            let others: Vec<_> = self
                .dealers
                .iter()
                .map(|d| {
                    s.spawn(move || {
                        let d = d.lock().map_err(|_| "poisoned".to_string())?;
                        let mut ends = Vec::with_capacity(rounds);
                        for _ in 0..rounds {
                            if d.poll(zmq::POLLIN, 30_000).map_err(zerr)? == 0 {
                                return Err("raw round timed out".to_string());
                            }
                            std::hint::black_box(d.recv_bytes(0).map_err(zerr)?);
                            d.send(&b"ack"[..], 0).map_err(zerr)?;
                            ends.push(Instant::now());
                        }
                        Ok(ends)
                    })
                })
                .collect();
            std::iter::once(root)
                .chain(others)
                .map(|h| h.join().map_err(|_| "a rank's thread failed".to_string())?)
                .collect::<Result<Vec<_>, String>>()
        })?;
        Ok(samples_from_ends(&ends, WARMUP))
    }
}
