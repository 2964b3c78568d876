//! One job id and one run id on every rank.

use lens_core::{Broadcaster, Error, RankInfo, Result};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

/// Makes every rank agree on the job id and the run id before the providers are built:
/// `root`'s ids (from its launcher, or random ones it draws when the launcher gave none)
/// are broadcast, in one round, and set in each rank's `info`. Call it once, collectively,
/// when the launcher may not give them (`SLURM_JOB_ID`, torchrun's `TORCHELASTIC_RUN_ID`
/// and the restart counts are read by [`RankInfo::from_env`]); without it, a rank whose
/// launcher gives no run id draws a `run.uuid` of its own. Returns the job id.
///
/// # Errors
/// The broadcast's errors; [`Error::Config`] when what is received is not two UTF-8 lines.
pub async fn share_job_id(b: &dyn Broadcaster, root: usize, info: &mut RankInfo) -> Result<String> {
    let draw = || format!("{:032x}", RandomIdGenerator::default().new_trace_id());
    let payload = (b.rank() == root).then(|| {
        let job = info.job_id.clone().unwrap_or_else(draw);
        let run = info.run_id.clone().unwrap_or_else(draw);
        format!("{job}\n{run}")
    });
    let bytes = b
        .broadcast(root, payload.as_deref().map(str::as_bytes))
        .await?;
    let text = String::from_utf8(bytes).map_err(|_| {
        Error::config(format!(
            "the job id broadcast from rank {root} is not UTF-8"
        ))
    })?;
    let (job, run) = text.split_once('\n').ok_or_else(|| {
        Error::config(format!("rank {root} broadcast no run id beside the job id"))
    })?;
    info.job_id = Some(job.to_owned());
    info.run_id = Some(run.to_owned());
    Ok(job.to_owned())
}
