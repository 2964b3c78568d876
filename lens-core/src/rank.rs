//! Rank and world size from the launcher's environment, and the rank's OTel resource.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use crate::error::{Error, Result};

/// Resource attribute names (the ones NeMo Lens uses).
pub mod resource_keys {
    /// Global rank.
    pub const RANK: &str = "nv.dl.rank";
    /// Number of ranks in the job.
    pub const WORLD_SIZE: &str = "nv.dl.world_size";
    /// Rank on this node.
    pub const LOCAL_RANK: &str = "nv.dl.local_rank";
    /// The job's id, the same on every rank (from the launcher, or shared by the source rank).
    pub const JOB_ID: &str = "nv.dl.job_id";
    /// OpenTelemetry's `service.instance.id`.
    pub const SERVICE_INSTANCE_ID: &str = "service.instance.id";
}

/// The launcher whose variables gave a [`RankInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// torchrun / torch.distributed.elastic: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
    Torchrun,
    /// Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`.
    OpenMpi,
    /// MPICH / Hydra: `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`.
    MpichHydra,
    /// PMIx: `PMIX_RANK` (the size from `PMI_SIZE` or Slurm's task count).
    Pmix,
    /// Slurm's srun: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
    /// Given in code.
    Explicit,
}

struct Family {
    launcher: Launcher,
    rank: &'static str,
    size: &'static [&'static str],
    local: Option<&'static str>,
}

// Innermost launcher first: torchrun started by srun sees both, and RANK is the process's.
const FAMILIES: [Family; 5] = [
    Family {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: &["WORLD_SIZE"],
        local: Some("LOCAL_RANK"),
    },
    Family {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: &["OMPI_COMM_WORLD_SIZE"],
        local: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
    },
    Family {
        launcher: Launcher::MpichHydra,
        rank: "PMI_RANK",
        size: &["PMI_SIZE"],
        local: Some("MPI_LOCALRANKID"),
    },
    Family {
        launcher: Launcher::Pmix,
        rank: "PMIX_RANK",
        size: &["PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS"],
        local: None,
    },
    Family {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: &["SLURM_NTASKS", "SLURM_NPROCS"],
        local: Some("SLURM_LOCALID"),
    },
];

/// Where this process sits in the job.
///
/// ```
/// use lens_core::{Launcher, RankInfo};
///
/// let env = [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")];
/// let info = RankInfo::from_vars(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))?;
/// assert_eq!((info.rank, info.world_size, info.local_rank), (3, 8, Some(1)));
/// assert_eq!(info.launcher, Launcher::Torchrun);
/// # Ok::<(), lens_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankInfo {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this node, when the launcher says.
    pub local_rank: Option<usize>,
    /// Which launcher's variables were used.
    pub launcher: Launcher,
    /// The job's id when the launcher gives one (`SLURM_JOB_ID`, `TORCHELASTIC_RUN_ID`):
    /// the same on every rank and across requeues and elastic restarts.
    pub job_id: Option<String>,
    /// This run's id: one life of the job, the same on every rank, new after a requeue or
    /// an elastic restart. From the launcher, `<job id>[.<SLURM_STEP_ID>]/restart-<n>` with
    /// `n` from `TORCHELASTIC_RESTART_COUNT` or `SLURM_RESTART_COUNT` (0 when Slurm has not
    /// requeued the job), when the job id and one of those are known.
    pub run_id: Option<String>,
}

impl RankInfo {
    /// An explicit rank.
    ///
    /// # Errors
    /// [`Error::Config`] when `rank >= world_size`.
    pub fn new(rank: usize, world_size: usize) -> Result<Self> {
        if rank >= world_size {
            return Err(Error::config(format!(
                "rank {rank} is not below world size {world_size}"
            )));
        }
        Ok(Self::explicit(rank, world_size))
    }

    /// A rank given in code, nothing else known (the caller checked `rank < world_size`).
    fn explicit(rank: usize, world_size: usize) -> Self {
        RankInfo {
            rank,
            world_size,
            local_rank: None,
            launcher: Launcher::Explicit,
            job_id: None,
            run_id: None,
        }
    }

    /// A job of one rank.
    pub fn single() -> Self {
        RankInfo {
            rank: 0,
            world_size: 1,
            local_rank: Some(0),
            launcher: Launcher::Explicit,
            job_id: None,
            run_id: None,
        }
    }

    /// Sets the local rank.
    pub fn with_local_rank(mut self, local_rank: usize) -> Self {
        self.local_rank = Some(local_rank);
        self
    }

    /// Reads the launcher's variables from the process environment.
    ///
    /// Launchers are tried innermost first: torchrun, Open MPI, MPICH/Hydra, PMIx, Slurm.
    ///
    /// # Errors
    /// [`Error::Config`] when no launcher's variables are set, a value is not a number, a
    /// rank is given without a world size, a rank is not below its world size, or two
    /// launchers that describe the same job (the same world size) give different ranks.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`RankInfo::from_env`] with a custom lookup.
    ///
    /// # Errors
    /// As [`RankInfo::from_env`].
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let number = |name: &str| -> Result<Option<usize>> {
            match lookup(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    Error::config_for(name, format!("{name}={v:?} is not a non-negative integer"))
                }),
            }
        };
        let mut found: Vec<RankInfo> = Vec::new();
        for family in &FAMILIES {
            let Some(rank) = number(family.rank)? else {
                continue;
            };
            let mut world_size = None;
            for name in family.size {
                if let Some(size) = number(name)? {
                    world_size = Some(size);
                    break;
                }
            }
            let Some(world_size) = world_size else {
                return Err(Error::config_for(
                    family.size.join(" or "),
                    format!(
                        "{} is set but its world size ({}) is not",
                        family.rank,
                        family.size.join(" or ")
                    ),
                ));
            };
            if rank >= world_size {
                return Err(Error::config_for(
                    family.rank,
                    format!(
                        "{}={rank} is not below the world size {world_size}",
                        family.rank
                    ),
                ));
            }
            let local_rank = match family.local {
                Some(name) => number(name)?,
                None => None,
            };
            if let Some(local) = local_rank {
                if local >= world_size {
                    return Err(Error::config(format!(
                        "local rank {local} is not below the world size {world_size}"
                    )));
                }
            }
            found.push(RankInfo {
                rank,
                world_size,
                local_rank,
                launcher: family.launcher,
                job_id: None,
                run_id: None,
            });
        }
        for (i, a) in found.iter().enumerate() {
            for b in &found[i + 1..] {
                if a.world_size == b.world_size && a.rank != b.rank {
                    return Err(Error::config(format!(
                        "conflicting ranks for a world of {}: {:?} says {}, {:?} says {}",
                        a.world_size, a.launcher, a.rank, b.launcher, b.rank
                    )));
                }
            }
        }
        let mut info = found.into_iter().next().ok_or_else(|| {
            Error::config(
                "no launcher variables found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK, SLURM_*)",
            )
        })?;
        let set = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        // torchrun's default rendezvous id is the word "none": no id at all.
        info.job_id = set("TORCHELASTIC_RUN_ID")
            .filter(|v| v != "none")
            .or_else(|| set("SLURM_JOB_ID"));
        let slurm = set("SLURM_JOB_ID").is_some();
        let restart = set("TORCHELASTIC_RESTART_COUNT")
            .or_else(|| set("SLURM_RESTART_COUNT"))
            .or_else(|| slurm.then(|| "0".to_owned()));
        let step = set("SLURM_STEP_ID")
            .map(|s| format!(".{s}"))
            .unwrap_or_default();
        if let (Some(job), Some(restart)) = (&info.job_id, restart) {
            info.run_id = Some(format!("{job}{step}/restart-{restart}"));
        }
        Ok(info)
    }

    /// The `service.instance.id` lens uses: `<job id>/rank-<rank>`, or `rank-<rank>`.
    pub fn service_instance_id(&self) -> String {
        match &self.job_id {
            Some(job) => format!("{job}/rank-{}", self.rank),
            None => format!("rank-{}", self.rank),
        }
    }

    /// The rank of `group` as the trace should name it: rank and world size from the group;
    /// the launcher's local rank, job id and run id when its variables describe this same
    /// rank of a group of this size ([`RankInfo::from_env`]); else the group's
    /// [`Broadcaster::local_rank`](crate::Broadcaster::local_rank).
    pub fn of_group(group: &dyn crate::Broadcaster) -> RankInfo {
        let (rank, world_size) = (group.rank(), group.world_size());
        let mut info = RankInfo::from_env()
            .ok()
            .filter(|i| i.rank == rank && i.world_size == world_size)
            .unwrap_or_else(|| Self::explicit(rank, world_size));
        if info.local_rank.is_none() {
            info.local_rank = group.local_rank();
        }
        info
    }

    /// Sets the run's id (the same on every rank, new on every restart).
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }

    /// Sets the job's id (the same on every rank).
    pub fn with_job_id(mut self, job_id: impl Into<String>) -> Self {
        self.job_id = Some(job_id.into());
        self
    }

    /// The rank's resource attributes: `nv.dl.rank`, `nv.dl.world_size`,
    /// `nv.dl.local_rank` and `nv.dl.job_id` (when known) and `service.instance.id`.
    pub fn attributes(&self) -> Vec<KeyValue> {
        let int = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let mut kvs = vec![
            KeyValue::new(resource_keys::RANK, int(self.rank)),
            KeyValue::new(resource_keys::WORLD_SIZE, int(self.world_size)),
        ];
        if let Some(local) = self.local_rank {
            kvs.push(KeyValue::new(resource_keys::LOCAL_RANK, int(local)));
        }
        if let Some(job) = &self.job_id {
            kvs.push(KeyValue::new(resource_keys::JOB_ID, job.clone()));
        }
        kvs.push(KeyValue::new(
            resource_keys::SERVICE_INSTANCE_ID,
            self.service_instance_id(),
        ));
        kvs
    }

    /// A resource holding [`RankInfo::attributes`] (plus the SDK's default detectors).
    pub fn resource(&self) -> Resource {
        Resource::builder()
            .with_attributes(self.attributes())
            .build()
    }
}
