//! The command line: what `lens demo` and `lens bench` accept.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// lens: one OpenTelemetry trace for a whole distributed job.
#[derive(Debug, Parser)]
#[command(name = "lens", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Simulate a pipeline-parallel job on N in-process ranks and show its trace.
    Demo(DemoArgs),
    /// Measure lens's trace-context broadcast against the backend's raw transport.
    ///
    /// Operations: the backend's baselines (`raw`: one broadcast of the carrier's bytes on
    /// the bare transport; with tcp also `raw_zmq`, the same over bare ZeroMQ sockets; with
    /// mpi also `two_collective`, NeMo Lens's scheme with lens's
    /// codec: inject and encode, a length then the bytes in two collectives, decode),
    /// `lens_bytes` (lens's broadcast of the same bytes: the backend as lens drives it, no
    /// codec) and `lens` (inject and encode, the backend's broadcast, decode on every rank). The
    /// timed rounds are spread over 16 blocks; each block runs every operation in turn after
    /// 10 untimed rounds. Before each round every rank waits at a barrier; the round's time is
    /// the slowest rank's, which is what a collective costs the job. Printed: the median and
    /// 99th percentile in µs, CPU µs per rank and round, and `lens/raw` (ratio of the
    /// medians) on the two lens rows; with --json one object per line: backend, ranks, op,
    /// bytes, iters, median_us, p99_us, cpu_us_per_rank, and ratio_vs_<op> for each baseline
    /// on the lens lines. With tcp, lens's rounds poll before they sleep where the ranks on
    /// this host have a CPU each (LENS_TCP_SPIN_US, default 100 µs) and the baselines block:
    /// LENS_TCP_SPIN_US=0 compares like with like.
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Measure the step sampler on a job of many ranks: the same steps twice on one group,
    /// every span exported, then through the sampler.
    ///
    /// Each step a span per rank; one step in --slow-every is slow on one rank chosen at
    /// random (it sleeps --slow-ms inside the step). Printed: the spans exported as a
    /// fraction of exporting everything, the slow steps kept whole on every rank, the most a
    /// rank held, and rank 0's median ordinary step in each run with their ratio.
    #[command(verbatim_doc_comment)]
    SampleBench(SampleBenchArgs),
    /// Leave a TCP job running on simulated hosts and watch what grows.
    ///
    /// --ranks processes on --hosts simulated hosts (network namespaces; needs root) run a
    /// round every --every ms for --duration seconds, while a stranger on host 0 knocks at
    /// rank 0's port and the switch resets a connection of host 1 every --reset-every
    /// seconds. Every --sample-every seconds each rank reports its rounds' p50 and p99,
    /// failures, RSS, descriptors and threads. Printed: the table, each series' slope and
    /// whether it is flat; --svg writes a plot. Exits non-zero when a round failed or a
    /// series grew.
    #[cfg(feature = "tcp")]
    #[command(verbatim_doc_comment)]
    Soak(SoakArgs),
}

/// Which span the later stages' spans are children of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ParentArg {
    /// The rank's own current span (as NeMo Lens does); stages are only linked.
    Current,
    /// Rank 0's `train_step`: the whole step is one trace.
    Remote,
}

/// The transport to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendArg {
    /// N ranks in this process.
    Local,
    /// TCP: N processes on 127.0.0.1, or one rank of a real job with --rank.
    #[cfg(feature = "tcp")]
    Tcp,
    /// MPI: run under mpirun, one rank per process (the group is MPI_COMM_WORLD).
    #[cfg(feature = "mpi")]
    Mpi,
    /// NCCL, one rank per GPU: N processes on this machine (bootstrapped over loopback TCP),
    /// or one rank of a real job with --rank; the bench uses every local GPU.
    #[cfg(feature = "nccl")]
    Nccl,
}

#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    pub(crate) backend: BackendArg,
    /// Number of ranks (pipeline stages).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) ranks: u32,
    /// Training steps.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) steps: u32,
    /// Parent of the later stages' spans.
    #[arg(long, value_enum, default_value_t = ParentArg::Remote)]
    pub(crate) parent: ParentArg,
    /// Write Chrome trace event JSON here (opens in Perfetto and chrome://tracing).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Draw the first steps' trace as an SVG picture here: a bar per rank, a curve per link.
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    /// Deadline of each collective, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) timeout: f64,
    /// Inject a fault to see how failures look: `absent:R`, `corrupt:R`, `delay:R:MS`
    /// (rank R comes MS ms late to every step) or `delay:R:MS@S1,S2,...` (rank R sleeps MS ms
    /// inside the listed steps only, counted from 0).
    #[arg(long, value_name = "FAULT")]
    pub(crate) inject: Vec<String>,
    /// Keep or drop each step whole on every rank (lens's step sampler): the rules, as
    /// LENS_SAMPLE takes them, comma-separated: `slower-than=25ms` or `slower-than=p99`,
    /// `spread-over=5ms`, `votes=off`, `baseline=50` (1 in 50 of the rest). Only the export
    /// (--otlp) is sampled; the view shows every step and marks the kept ones and why.
    #[arg(long, value_name = "RULES")]
    pub(crate) sample: Option<String>,
    /// Print no terminal view, only the verdict.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Run only this rank of a multi-process job (with --backend tcp or nccl). World size,
    /// address and key come from --world, --addr and the environment (WORLD_SIZE,
    /// MASTER_ADDR/MASTER_PORT or LENS_TCP_ADDR, LENS_TCP_KEY_FILE or LENS_TCP_KEY).
    #[arg(long)]
    pub(crate) rank: Option<u32>,
    /// Number of ranks of the multi-process job (with --rank).
    #[arg(long)]
    pub(crate) world: Option<u32>,
    /// Rendezvous address HOST:PORT of the multi-process job (rank 0 binds it).
    #[arg(long)]
    pub(crate) addr: Option<String>,
    /// How long ranks wait for the whole group to join, in seconds (with --rank; default
    /// LENS_TCP_JOIN_TIMEOUT, else 60).
    #[arg(long)]
    pub(crate) join_timeout: Option<f64>,
    /// GPU of this rank with --backend nccl and --rank (default: LOCAL_RANK, else 0).
    #[arg(long)]
    pub(crate) device: Option<u32>,
    /// Also export every rank's spans over OTLP: to ENDPOINT, a receiver's base URL such as
    /// http://localhost:4318 (HTTP adds /v1/traces) or http://localhost:4317 (gRPC), or a
    /// full URL ending in /v1/traces (used as given), or, with no ENDPOINT, where
    /// OTEL_EXPORTER_OTLP_ENDPOINT says. Each rank's resource names its rank.
    #[arg(long, value_name = "ENDPOINT", num_args = 0..=1, default_missing_value = "")]
    pub(crate) otlp: Option<String>,
    /// The OTLP protocol with --otlp: grpc or http/protobuf (default
    /// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_name = "PROTOCOL", requires = "otlp")]
    pub(crate) otlp_protocol: Option<String>,
    #[command(flatten)]
    pub(crate) hosts: HostsArgs,
    /// Print this rank's spans as JSON lines (used when `lens demo` starts the ranks).
    #[arg(long, hide = true)]
    pub(crate) emit_spans: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    pub(crate) backend: BackendArg,
    /// Group sizes, comma-separated (local and tcp; mpi takes the size from mpirun, nccl
    /// uses every local GPU).
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 4, 8])]
    pub(crate) ranks: Vec<usize>,
    /// Timed rounds per operation and size.
    #[arg(long, default_value_t = 2000)]
    pub(crate) iters: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// TCP only: tree fan-out of lens's group (default: a star from rank 0).
    #[arg(long)]
    pub(crate) fan_out: Option<usize>,
    /// TCP only: each rank its own process of this program, as in a job (default: one
    /// thread per rank). Adds each round's CPU summed over all ranks (`cpu_all`); `cpu_us`
    /// is then rank 0's.
    #[arg(long)]
    pub(crate) processes: bool,
    /// Time only this operation (`raw`, another of the backend's baselines, `lens_bytes`
    /// or `lens`), so that a profiler such as `perf` sees it alone; no ratio is printed.
    #[arg(long, value_name = "OP")]
    pub(crate) only: Option<String>,
    #[command(flatten)]
    pub(crate) hosts: HostsArgs,
    #[command(flatten)]
    pub(crate) spawned: SpawnedRank,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SampleBenchArgs {
    /// Backend: local (threads) or tcp (processes on 127.0.0.1).
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    pub(crate) backend: BackendArg,
    /// Ranks.
    #[arg(long, default_value_t = 256)]
    pub(crate) ranks: usize,
    /// Steps of each run.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) steps: usize,
    /// One step in this many is slow, on one rank.
    #[arg(long, default_value_t = 100)]
    pub(crate) slow_every: u64,
    /// How long the slow rank sleeps inside a slow step, in ms.
    #[arg(long, default_value_t = 30)]
    pub(crate) slow_ms: u64,
    /// The sampler's rules (as `LENS_SAMPLE` and `lens demo --sample` take them).
    #[arg(long, default_value = "slower-than=15ms,baseline=100")]
    pub(crate) sample: String,
    /// Deadline of each collective, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) timeout: f64,
    /// Only one of the two runs, with --backend local (for an instruction counter such as
    /// `valgrind --tool=callgrind`, one run per process).
    #[arg(long, value_enum)]
    pub(crate) only: Option<OnlyArg>,
    #[command(flatten)]
    pub(crate) spawned: SpawnedRank,
}

/// `lens soak`'s settings.
#[cfg(feature = "tcp")]
#[derive(Debug, clap::Args)]
pub(crate) struct SoakArgs {
    /// Rank processes.
    #[arg(long, default_value_t = 4)]
    pub(crate) ranks: usize,
    /// Simulated hosts they run on, in blocks (at least 2: the resets are on host 1's
    /// link).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=250))]
    pub(crate) hosts: u32,
    /// Every host's link, as `lens bench --link` takes it.
    #[arg(long, default_value = "rtt=200us")]
    pub(crate) link: Option<String>,
    /// A round every this many ms (on a common tick of the wall clock).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) every: f64,
    /// How long, in seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub(crate) duration: f64,
    /// Each rank reports every this many seconds.
    #[arg(long, default_value_t = 60.0)]
    pub(crate) sample_every: f64,
    /// How often a stranger connects to rank 0's port and sends bytes not of this job
    /// (0: never).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) knocks_per_sec: f64,
    /// Every this many seconds the switch resets a connection of host 1.
    #[arg(long, default_value_t = 60.0)]
    pub(crate) reset_every: f64,
    /// Write the plot (SVG) here.
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) spawned: SpawnedRank,
}

/// What a command sets on the rank processes it starts (`bench --processes`,
/// `sample-bench --backend tcp`, `soak`): hidden, not for users.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct SpawnedRank {
    /// This process's rank.
    #[arg(long, hide = true)]
    pub(crate) rank: Option<usize>,
    /// The group's size.
    #[arg(long, hide = true)]
    pub(crate) world: Option<usize>,
    /// Rank 0's address.
    #[arg(long, hide = true)]
    pub(crate) addr: Option<String>,
}

/// Which run of `sample-bench` to make alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnlyArg {
    /// Every span exported.
    All,
    /// Through the step sampler.
    Sampled,
}

/// `--hosts` and `--link`, as `lens demo` and `lens bench` take them.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HostsArgs {
    /// Run the rank processes on this many simulated hosts (TCP): a network namespace
    /// each with an address of its own, ranks placed in blocks (hosts 0..H get ranks
    /// 0..N/H, ...). Needs root, /dev/net/tun and `ip`. Traffic between hosts crosses the
    /// test kit's switch, with --link's delays. With --otlp http://HOST:PORT the ranks
    /// export through a relay on host 0 to that endpoint on this machine.
    #[arg(long, value_name = "H", value_parser = clap::value_parser!(u32).range(1..=250))]
    pub(crate) hosts: Option<u32>,
    /// Every host's link to the switch (with --hosts): `rtt=1ms` (the round trip between
    /// two hosts), or `delay=` (each way), `send=`/`recv=` (asymmetric), `jitter=`,
    /// `loss=`, `reset=` (a chance per TCP segment with data), comma-separated.
    #[arg(long, value_name = "LINK", requires = "hosts")]
    pub(crate) link: Option<String>,
}

/// A deadline given in seconds on the command line: positive and at most
/// [`lens::backend::MAX_TIMEOUT`] (a larger one would overflow the clock).
pub(crate) fn secs_arg(name: &str, secs: f64) -> Result<Duration, String> {
    let d = Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{name} {secs} is not a positive number of seconds"))?;
    lens::backend::check_timeout(name, d).map_err(|e| e.to_string())
}
