//! The process's own resource attributes, by the semantic conventions and NeMo Lens's: where
//! it runs (host, process, GPU), and which job and which life of the job it is.

use lens_core::RankInfo;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
use sha2::{Digest as _, Sha256};

use crate::nvml;

/// `job.uuid`: the same on every rank and across requeues (made from the job id).
pub const JOB_UUID: &str = "job.uuid";
/// `run.uuid`: the same on every rank of one run, new after a requeue or restart.
pub const RUN_UUID: &str = "run.uuid";

/// The variables [`process_attributes`] reads.
pub(crate) const DETECTED: [&str; 5] = [
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "CUDA_VISIBLE_DEVICES",
    "HOSTNAME",
];

/// A UUID (version 8, RFC 9562) made from `text`: the same text gives the same UUID.
fn uuid_of(text: &str) -> String {
    let digest = Sha256::digest(format!("lens:{text}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    format_uuid(b, 0x80)
}

/// A random UUID (version 4).
fn random_uuid() -> String {
    format_uuid(RandomIdGenerator::default().new_trace_id().to_bytes(), 0x40)
}

fn format_uuid(mut b: [u8; 16], version: u8) -> String {
    b[6] = (b[6] & 0x0f) | version;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The run's UUID: made from the run id when the launcher gave one (so every rank makes
/// the same), else drawn at random (per rank, unless [`crate::share_job_id`] shared one).
pub(crate) fn run_uuid(info: &RankInfo) -> String {
    match &info.run_id {
        Some(run) => uuid_of(&format!("run:{run}")),
        None => random_uuid(),
    }
}

/// The process's attributes: `host.name`, `process.pid`; `job.uuid` (when the job id is
/// known) and `run.uuid`; a `service.instance.id` unique per rank and per run,
/// `<job id>/run-<the first 16 hex digits of run.uuid>/rank-<r>`; Slurm's job id, step
/// and restart count when `lookup` has them; the rank's GPU when NVML can be loaded.
pub(crate) fn process_attributes(
    info: &RankInfo,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Vec<KeyValue> {
    let run = run_uuid(info);
    let rank = format!("rank-{}", info.rank);
    let base = info.service_instance_id();
    let job = base.strip_suffix(&rank).unwrap_or("");
    let short: String = run.chars().filter(|c| *c != '-').take(16).collect();
    let mut kvs = vec![
        KeyValue::new("process.pid", i64::from(std::process::id())),
        KeyValue::new(
            lens_core::rank::resource_keys::SERVICE_INSTANCE_ID,
            format!("{job}run-{short}/{rank}"),
        ),
        KeyValue::new(RUN_UUID, run),
    ];
    if let Some(job) = &info.job_id {
        kvs.push(KeyValue::new(JOB_UUID, uuid_of(&format!("job:{job}"))));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| lookup("HOSTNAME"))
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    if let Some(host) = host {
        kvs.push(KeyValue::new("host.name", host));
    }
    kvs.extend(slurm_attributes(lookup));
    kvs.extend(nvml::gpu_attributes(gpu_of(info, lookup)));
    kvs
}

/// Slurm's `SLURM_JOB_ID`, `SLURM_STEP_ID` and `SLURM_RESTART_COUNT`, when set, as
/// `slurm.job.id`, `slurm.step.id` (strings: steps may be `batch` or `extern`) and
/// `slurm.restart_count`.
fn slurm_attributes(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<KeyValue> {
    let set = |k: &str| {
        lookup(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let mut kvs = Vec::new();
    if let Some(job) = set("SLURM_JOB_ID") {
        kvs.push(KeyValue::new("slurm.job.id", job));
        if let Some(step) = set("SLURM_STEP_ID") {
            kvs.push(KeyValue::new("slurm.step.id", step));
        }
        let restarts = set("SLURM_RESTART_COUNT")
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        kvs.push(KeyValue::new("slurm.restart_count", restarts));
    }
    kvs
}

/// Which GPU is the rank's: CUDA device `local_rank` (0 when unknown), as torch's
/// `cuda:<local_rank>` convention has it, through `CUDA_VISIBLE_DEVICES` when that lists
/// the devices this process sees.
fn gpu_of(info: &RankInfo, lookup: &dyn Fn(&str) -> Option<String>) -> nvml::Which {
    let ordinal = info.local_rank.unwrap_or(0);
    let visible = lookup("CUDA_VISIBLE_DEVICES");
    match visible.as_deref().map(str::trim) {
        None | Some("") => nvml::Which::Index(ordinal),
        Some(list) => match list.split(',').map(str::trim).nth(ordinal) {
            None => nvml::Which::None,
            Some(entry) => match entry.parse::<usize>() {
                Ok(i) => nvml::Which::Index(i),
                Err(_) if entry.starts_with("GPU-") || entry.starts_with("MIG-") => {
                    nvml::Which::Uuid(entry.to_owned())
                }
                Err(_) => nvml::Which::None,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_well_formed_and_derived_ones_repeat() {
        let a = uuid_of("job:4242");
        assert_eq!(a, uuid_of("job:4242"), "the same job, the same UUID");
        assert_ne!(a, uuid_of("job:4243"));
        assert_ne!(random_uuid(), random_uuid());
        for (u, version) in [(a, '8'), (random_uuid(), '4')] {
            let parts: Vec<&str> = u.split('-').collect();
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{u}");
            assert!(parts[2].starts_with(version), "{u}: version {version}");
            assert!(
                matches!(parts[3].chars().next(), Some('8' | '9' | 'a' | 'b')),
                "{u}: variant"
            );
        }
    }

    #[test]
    fn the_rank_s_gpu_follows_cuda_visible_devices() {
        // (local rank, CUDA_VISIBLE_DEVICES, the GPU, why)
        let rows: &[(Option<usize>, Option<&str>, nvml::Which, &str)] = &[
            (None, None, nvml::Which::Index(0), "no local rank: device 0"),
            (Some(3), None, nvml::Which::Index(3), "cuda:<local rank>"),
            (
                Some(1),
                Some("4,6"),
                nvml::Which::Index(6),
                "through the visible list",
            ),
            (
                Some(0),
                Some("GPU-abc,GPU-def"),
                nvml::Which::Uuid("GPU-abc".into()),
                "a UUID in the list",
            ),
            (
                Some(2),
                Some("0,1"),
                nvml::Which::None,
                "past the list: no GPU",
            ),
            (Some(0), Some("NoDevFiles"), nvml::Which::None, "no devices"),
        ];
        for (local, visible, want, why) in rows {
            let mut info = RankInfo::new(0, 8).expect("rank 0 is below a world of 8");
            info.local_rank = *local;
            let lookup = |k: &str| {
                (k == "CUDA_VISIBLE_DEVICES")
                    .then(|| visible.map(str::to_owned))
                    .flatten()
            };
            assert_eq!(&gpu_of(&info, &lookup), want, "{why}");
        }
    }
}
