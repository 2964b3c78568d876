//! One file per backend, each implementing [`super::backend::Backend`].

use std::time::Duration;

use super::args::BackendArg;
use super::backend::Backend;

#[cfg(feature = "tcp")]
mod job_key;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "tcp")]
mod tcp;
#[cfg(feature = "tcp")]
mod tcp_procs;
#[cfg(feature = "tcp")]
mod tcp_raw;
#[cfg(feature = "tcp")]
mod tcp_raw_sockets;

/// A fresh job key for TCP rank processes, in a file only this user can read (removed when
/// dropped).
#[cfg(feature = "tcp")]
pub(crate) fn tcp_key() -> Result<job_key::KeyFile, String> {
    job_key::KeyFile::new(&job_key::random_hex(32)?)
}

/// The backend the command line names.
pub(crate) fn select(arg: BackendArg) -> &'static dyn Backend {
    match arg {
        BackendArg::Local => &local::Local,
        #[cfg(feature = "tcp")]
        BackendArg::Tcp => &tcp::Tcp,
        #[cfg(feature = "mpi")]
        BackendArg::Mpi => &mpi::Mpi,
        #[cfg(feature = "nccl")]
        BackendArg::Nccl => &nccl::Nccl,
    }
}

/// A fault `--inject` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Injected {
    /// The rank never takes part in a step.
    Absent(usize),
    /// The bytes the rank receives are damaged.
    Corrupt(usize),
    /// The rank comes this late to every step's broadcast.
    Delay(usize, Duration),
    /// The rank sleeps this long inside the listed steps only (0-based).
    DelayAt(usize, Duration, Vec<usize>),
}

impl Injected {
    /// The rank the fault is for (a process of a multi-process job picks its own).
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    pub(crate) fn rank(&self) -> usize {
        match *self {
            Injected::Absent(r)
            | Injected::Corrupt(r)
            | Injected::Delay(r, _)
            | Injected::DelayAt(r, _, _) => r,
        }
    }

    /// `absent:R`, `corrupt:R`, `delay:R:MS` or `delay:R:MS@S1,S2,...`, for a job of `n`
    /// ranks.
    pub(crate) fn parse(spec: &str, n: usize) -> Result<Injected, String> {
        let parts: Vec<&str> = spec.split(':').collect();
        let rank = |s: &str| -> Result<usize, String> {
            s.parse::<usize>()
                .ok()
                .filter(|r| *r < n)
                .ok_or_else(|| format!("--inject {spec:?}: {s:?} is not a rank below {n}"))
        };
        match parts.as_slice() {
            ["absent", r] => Ok(Injected::Absent(rank(r)?)),
            ["corrupt", r] => Ok(Injected::Corrupt(rank(r)?)),
            ["delay", r, ms] => {
                let (ms, at) = match ms.split_once('@') {
                    Some((ms, at)) => (ms, Some(at)),
                    None => (*ms, None),
                };
                let ms: u64 = ms
                    .parse()
                    .map_err(|_| format!("--inject {spec:?}: {ms:?} is not milliseconds"))?;
                let d = Duration::from_millis(ms);
                let Some(at) = at else {
                    return Ok(Injected::Delay(rank(r)?, d));
                };
                let steps = at
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("--inject {spec:?}: {s:?} is not a step number"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Injected::DelayAt(rank(r)?, d, steps))
            }
            _ => Err(format!(
                "--inject {spec:?}: expected absent:R, corrupt:R, delay:R:MS or delay:R:MS@S1,S2"
            )),
        }
    }
}

/// The faults `--inject` asks of rank `me` of a collective backend: a delay, a corrupt
/// payload, and whether `me` is to be absent. A backend that cannot name an absent rank
/// refuses `absent` with `why_not_absent`.
#[cfg(any(feature = "mpi", all(feature = "nccl", feature = "tcp")))]
pub(crate) fn collective_faults(
    specs: &[String],
    n: usize,
    me: Option<usize>,
    why_not_absent: Option<&str>,
) -> Result<(Vec<lens::testkit::Fault>, bool), String> {
    use lens::testkit::{Corruption, Fault};
    let (mut faults, mut absent) = (Vec::new(), false);
    for spec in specs {
        match Injected::parse(spec, n)? {
            Injected::Absent(_) if why_not_absent.is_some() => {
                return Err(format!(
                    "--inject absent: {}",
                    why_not_absent.unwrap_or_default()
                ));
            }
            Injected::Absent(r) if Some(r) == me => absent = true,
            Injected::Delay(r, d) if Some(r) == me => faults.push(Fault::Delay(d)),
            // Not a fault of the transport: `rank_main` sleeps in those steps.
            Injected::DelayAt(..) => {}
            Injected::Corrupt(r) if Some(r) == me => {
                faults.push(Fault::Corrupt(Corruption::Truncate));
            }
            _ => {}
        }
    }
    Ok((faults, absent))
}

/// What `--inject delay:R:MS@S1,S2` asks of rank `me`: sleeps inside those steps.
pub(crate) fn step_delays(specs: &[String], n: usize, me: usize) -> Result<StepDelays, String> {
    let mut delays = Vec::new();
    for spec in specs {
        if let Injected::DelayAt(r, d, steps) = Injected::parse(spec, n)?
            && r == me
        {
            delays.push((d, steps));
        }
    }
    Ok(StepDelays(delays))
}

/// A rank's sleeps inside given steps (`--inject delay:R:MS@S1,S2`).
#[derive(Debug, Clone, Default)]
pub(crate) struct StepDelays(Vec<(Duration, Vec<usize>)>);

impl StepDelays {
    /// How long the rank sleeps inside `step`.
    pub(crate) fn in_step(&self, step: usize) -> Duration {
        self.0
            .iter()
            .filter(|(_, steps)| steps.contains(&step))
            .map(|(d, _)| *d)
            .sum()
    }
}

/// Clock exchanges per rank when a demo rank measures its offset from rank 0.
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
const CLOCK_REPETITIONS: usize = 4;
/// Largest demo job whose ranks measure their clocks: the measurement is
/// 4 × (N − 1) × 2 + 1 rounds, each of which grows with N.
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
const CLOCK_MAX_RANKS: usize = 64;

/// This rank's clock offset from rank 0, measured as the demo's group forms (a collective:
/// every rank calls it); `None` in jobs over [`CLOCK_MAX_RANKS`].
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) fn demo_clock(b: &dyn lens::Broadcaster) -> Result<Option<lens::ClockOffset>, String> {
    if b.world_size() > CLOCK_MAX_RANKS {
        return Ok(None);
    }
    let table = lens::measure_clock_offsets(b, 0, CLOCK_REPETITIONS)
        .map_err(|e| format!("measuring clock offsets: {e}"))?;
    Ok(table.get(b.rank()).copied())
}
