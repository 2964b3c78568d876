//! One job id on every rank.

use lens_core::{Broadcaster, Error, RankInfo, Result};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

/// Makes every rank agree on the job id before the providers are built: `root`'s id (from its
/// launcher, or a random one it draws when the launcher gave none) is broadcast and set in
/// each rank's `info`. Call it once, collectively, when the launcher may not give a job id
/// (`SLURM_JOB_ID` and torchrun's `TORCHELASTIC_RUN_ID` are read by [`RankInfo::from_env`]).
///
/// # Errors
/// The broadcast's errors; [`Error::Config`] when the id received is not UTF-8.
pub async fn share_job_id(b: &dyn Broadcaster, root: usize, info: &mut RankInfo) -> Result<String> {
    let payload = (b.rank() == root).then(|| {
        info.job_id
            .clone()
            .unwrap_or_else(|| format!("{:032x}", RandomIdGenerator::default().new_trace_id()))
    });
    let bytes = b
        .broadcast(root, payload.as_deref().map(str::as_bytes))
        .await?;
    let id = String::from_utf8(bytes).map_err(|_| {
        Error::config(format!(
            "the job id broadcast from rank {root} is not UTF-8"
        ))
    })?;
    info.job_id = Some(id.clone());
    Ok(id)
}
