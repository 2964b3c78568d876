//! The process's own resource attributes, by the semantic conventions: where it runs and
//! which life of the job it is.

use lens_core::RankInfo;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};

/// The process's own resource attributes (semantic conventions): `host.name` (where the
/// kernel says), `process.pid`, and a `service.instance.id` unique per rank and per run:
/// the rank's (`<job id>/rank-<r>`) with `run-<16 hex digits>` chosen at random when the
/// provider is built, before the rank (`job-7/run-3f9c…/rank-2`), so a requeued job's
/// ranks are told apart from their earlier lives.
pub(crate) fn process_attributes(info: &RankInfo) -> Vec<KeyValue> {
    let run = RandomIdGenerator::default().new_span_id();
    let rank = format!("rank-{}", info.rank);
    let base = info.service_instance_id();
    let job = base.strip_suffix(&rank).unwrap_or("");
    let mut kvs = vec![
        KeyValue::new("process.pid", i64::from(std::process::id())),
        KeyValue::new(
            lens_core::rank::resource_keys::SERVICE_INSTANCE_ID,
            format!("{job}run-{run}/{rank}"),
        ),
    ];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    if let Some(host) = host {
        kvs.push(KeyValue::new("host.name", host));
    }
    kvs
}
