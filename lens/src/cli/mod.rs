//! Command-line parsing and dispatch.

mod bench;
mod demo;
#[cfg(feature = "mpi")]
mod mpi;
mod record;
#[cfg(feature = "tcp")]
mod tcp;
mod view;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// lens: one OpenTelemetry trace for a whole distributed job.
#[derive(Debug, Parser)]
#[command(name = "lens", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate a pipeline-parallel job on N in-process ranks and show its trace.
    Demo(DemoArgs),
    /// Measure a raw broadcast of the carrier's bytes against lens's broadcast.
    Bench(BenchArgs),
}

/// Which span the later stages' spans are children of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ParentArg {
    /// The rank's own current span (as NeMo Lens does); stages are only linked.
    Current,
    /// Rank 0's `train_step`: the whole step is one trace.
    Remote,
}

/// The transport to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// N ranks in this process.
    Local,
    /// ZeroMQ over TCP: N processes on 127.0.0.1, or one rank of a real job with --rank.
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

impl BackendArg {
    fn name(self) -> &'static str {
        match self {
            BackendArg::Local => "local",
            #[cfg(feature = "tcp")]
            BackendArg::Tcp => "tcp",
            #[cfg(feature = "mpi")]
            BackendArg::Mpi => "mpi",
            #[cfg(feature = "nccl")]
            BackendArg::Nccl => "nccl",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// Number of ranks (pipeline stages).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    ranks: u32,
    /// Training steps.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    steps: u32,
    /// Parent of the later stages' spans.
    #[arg(long, value_enum, default_value_t = ParentArg::Remote)]
    parent: ParentArg,
    /// Write Chrome trace event JSON here (opens in Perfetto and chrome://tracing).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Deadline of each collective, in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Inject a fault to see how failures look: `absent:R`, `corrupt:R` or `delay:R:MS`.
    #[arg(long, value_name = "FAULT")]
    inject: Vec<String>,
    /// Print no terminal view, only the verdict.
    #[arg(long)]
    quiet: bool,
    /// Run only this rank of a multi-process job (with --backend tcp or nccl). World size,
    /// address and key come from --world, --addr and the environment (WORLD_SIZE,
    /// MASTER_ADDR/MASTER_PORT or LENS_TCP_ADDR, LENS_TCP_KEY_FILE or LENS_TCP_KEY).
    #[arg(long)]
    rank: Option<u32>,
    /// Number of ranks of the multi-process job (with --rank).
    #[arg(long)]
    world: Option<u32>,
    /// Rendezvous address HOST:PORT of the multi-process job (rank 0 binds it).
    #[arg(long)]
    addr: Option<String>,
    /// How long ranks wait for the whole group to join, in seconds (with --rank; default
    /// LENS_TCP_JOIN_TIMEOUT, else 60).
    #[arg(long)]
    join_timeout: Option<f64>,
    /// GPU of this rank with --backend nccl and --rank (default: LOCAL_RANK, else 0).
    #[arg(long)]
    device: Option<u32>,
    /// Print this rank's spans as JSON lines (used when `lens demo` starts the ranks).
    #[arg(long, hide = true)]
    emit_spans: bool,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// Group sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 4, 8])]
    ranks: Vec<usize>,
    /// Timed rounds per operation and size.
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// TCP only: tree fan-out of lens's group (default: a star from rank 0).
    #[arg(long)]
    fan_out: Option<usize>,
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
}
