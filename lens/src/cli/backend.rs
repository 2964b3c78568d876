//! What the program asks of a backend: form its group for the demo and for the bench, and
//! its raw baselines. One implementation per backend lives in `backend/`; `demo.rs` and
//! `bench.rs` see only this trait.

use std::time::Duration;

use super::args::{BenchArgs, DemoArgs};
use super::measure::{Measured, Plan};
use super::rank::RankRun;
use super::record::Job;

/// A transport as the `lens` program drives it.
pub(crate) trait Backend {
    /// The name on the command line and in the output.
    fn name(&self) -> &'static str;

    /// Runs the demo: every rank (in this process, or in processes this one starts), or
    /// this process's one rank of a job started elsewhere.
    fn demo(&self, args: &DemoArgs, timeout: Duration) -> Result<DemoRun, String>;

    /// The operations the bench times beside lens, `raw` first: one broadcast of the
    /// carrier's bytes on the bare transport, then any other scheme worth comparing.
    fn baselines(&self) -> &'static [&'static str] {
        &["raw"]
    }

    /// Forms each group the bench asks for and runs `plan` on it (see `measure.rs`).
    /// `None` on a process that does not report (an MPI rank other than 0).
    fn bench(&self, args: &BenchArgs, plan: &Plan) -> Result<Option<BenchReport>, String>;
}

/// What a demo run gives back to be checked and shown.
// Which variants are built depends on the backends compiled in.
#[cfg_attr(not(all(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) enum DemoRun {
    /// Every rank's spans and failures.
    Job(Job),
    /// The one rank this process ran, of a job whose other ranks run elsewhere.
    Rank { rank: usize, run: RankRun },
    /// This rank's part is done and another rank reports the job (MPI ranks other than 0).
    Reported,
}

/// The bench's figures, on the process that reports them.
pub(crate) struct BenchReport {
    /// How the groups ran, for the table's title ("loopback, one thread per rank").
    pub(crate) setting: String,
    /// One entry per group size.
    pub(crate) groups: Vec<Measured>,
}
