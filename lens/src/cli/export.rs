//! `lens demo --otlp`: every rank also exports its spans over OTLP, with its rank resource;
//! the demo says where they went and how many arrived.

use std::process::Command;

use lens::otlp::{OtlpBuilder, OtlpGuard, Protocol, env};
use lens::{Broadcaster, ClockOffset, RankInfo};
use opentelemetry_sdk::trace::InMemorySpanExporter;
use serde_json::{Value as Json, json};

use super::args::DemoArgs;

/// Prefix of the line a rank process prints with what became of its exported spans.
pub(crate) const OTLP_LINE: &str = "lens-otlp ";

/// The demo's service name unless `OTEL_SERVICE_NAME` says otherwise.
const SERVICE: &str = "lens-demo";

/// Where and how the demo exports, from `--otlp [ENDPOINT]` and `--otlp-protocol`.
#[derive(Debug, Clone)]
pub(crate) struct OtlpChoice {
    endpoint: Option<String>,
    protocol: Option<Protocol>,
}

impl OtlpChoice {
    pub(crate) fn from_args(args: &DemoArgs) -> Result<Option<OtlpChoice>, String> {
        let Some(endpoint) = &args.otlp else {
            return Ok(None);
        };
        let protocol = args
            .otlp_protocol
            .as_deref()
            .map(Protocol::parse)
            .transpose()
            .map_err(|e| format!("--otlp-protocol: {e}"))?;
        Ok(Some(OtlpChoice {
            endpoint: (!endpoint.trim().is_empty()).then(|| endpoint.clone()),
            protocol,
        }))
    }

    /// For ranks on simulated hosts, which reach only the simulated network: the same
    /// choice with its endpoint's address replaced by a relay's on host 0 of `net`, which
    /// forwards to the endpoint on this machine (kept alive by the returned relay).
    /// Only plain `http://` endpoints that name their port: a certificate would not name
    /// the relay's address.
    #[cfg(feature = "tcp")]
    pub(crate) fn through_relay(
        &self,
        net: &lens::testkit::hosts::Network,
    ) -> Result<(OtlpChoice, lens::testkit::hosts::Relay), String> {
        let Some(endpoint) = &self.endpoint else {
            return Err(
                "--otlp with --hosts needs the endpoint on the command line (--otlp http://HOST:PORT)"
                    .into(),
            );
        };
        let (authority, path) = endpoint
            .strip_prefix("http://")
            .map(|rest| rest.split_at(rest.find('/').unwrap_or(rest.len())))
            .ok_or_else(|| {
                format!("--otlp {endpoint:?} with --hosts: only http://HOST:PORT endpoints pass the hosts' relay")
            })?;
        let to = std::net::ToSocketAddrs::to_socket_addrs(authority)
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                format!(
                    "--otlp {endpoint:?}: {authority:?} is not a HOST:PORT this machine resolves"
                )
            })?;
        let host0 = net
            .hosts()
            .first()
            .ok_or_else(|| "the simulated network has no host".to_string())?;
        let relay = host0
            .relay_to(to)
            .map_err(|e| format!("cannot start the hosts' relay to {to}: {e}"))?;
        let choice = OtlpChoice {
            endpoint: Some(format!("http://{}{path}", relay.addr())),
            protocol: self.protocol,
        };
        Ok((choice, relay))
    }

    /// The same choice on a rank process's command line.
    #[cfg_attr(not(feature = "tcp"), allow(dead_code))]
    pub(crate) fn forward(&self, c: &mut Command) {
        c.args(["--otlp", self.endpoint.as_deref().unwrap_or("")]);
        if let Some(p) = self.protocol {
            c.args(["--otlp-protocol", p.as_str()]);
        }
    }

    /// The rank's guard; its provider also hands every span to `local` (the demo's view).
    /// With `sample`'s rules, what it exports goes through a step sampler (the guard's).
    /// With this rank's `clock` offset from rank 0, its resource names it and the spans
    /// it exports are moved onto rank 0's clock.
    pub(crate) fn guard(
        &self,
        info: RankInfo,
        local: InMemorySpanExporter,
        clock: Option<ClockOffset>,
        sample: Option<&lens::sample::SampleRules>,
    ) -> lens::Result<OtlpGuard> {
        let mut b = OtlpBuilder::from_env(info).also_export_to(local);
        if let Some(rules) = sample {
            b = b.sample(rules.clone());
        }
        if let Some(c) = clock {
            b = b.clock_offset(c);
        }
        if std::env::var(env::OTEL_SERVICE_NAME).is_err() {
            b = b.service_name(SERVICE);
        }
        if let Some(e) = &self.endpoint {
            // A URL that already names the traces path is a full URL, not a base to which
            // HTTP would add /v1/traces a second time.
            b = if e.trim_end_matches('/').ends_with("/v1/traces") {
                b.traces_endpoint(e.clone())
            } else {
                b.endpoint(e.clone())
            };
        }
        if let Some(p) = self.protocol {
            b = b.protocol(p);
        }
        b.build()
    }
}

/// Makes the ranks agree on a job id (the launcher's if it gave one, else one rank 0 draws),
/// so that the trace backend can group the job's resources.
pub(crate) async fn job_info(b: &dyn Broadcaster) -> lens::Result<RankInfo> {
    // The launcher's local rank and ids where they describe this rank, else the backend's.
    let mut info = RankInfo::of_group(b);
    lens::otlp::share_job_id(b, 0, &mut info).await?;
    Ok(info)
}

/// What became of one rank's exported spans.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExportRecord {
    pub(crate) rank: usize,
    pub(crate) target: Option<String>,
    pub(crate) ended: u64,
    pub(crate) exported: u64,
    pub(crate) error: Option<String>,
}

impl ExportRecord {
    /// Shuts the guard down (flushing its spans) and records the outcome.
    pub(crate) fn finish(guard: OtlpGuard) -> ExportRecord {
        let rank = guard.rank_info().rank;
        let target = guard
            .endpoint()
            .map(|e| format!("{e} ({})", guard.protocol().unwrap_or_default()));
        match guard.shutdown() {
            Ok(s) => ExportRecord {
                rank,
                target,
                ended: s.ended,
                exported: s.exported,
                error: None,
            },
            Err(e) => ExportRecord {
                rank,
                target,
                ended: 0,
                exported: 0,
                error: Some(e.to_string()),
            },
        }
    }

    /// A guard that could not be built.
    pub(crate) fn failed(rank: usize, error: String) -> ExportRecord {
        ExportRecord {
            rank,
            target: None,
            ended: 0,
            exported: 0,
            error: Some(error),
        }
    }

    pub(crate) fn to_json(&self) -> Json {
        json!({"rank": self.rank, "target": self.target, "ended": self.ended,
               "exported": self.exported, "error": self.error})
    }

    #[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
    pub(crate) fn from_json(v: &Json) -> Option<ExportRecord> {
        Some(ExportRecord {
            rank: usize::try_from(v.get("rank")?.as_u64()?).ok()?,
            target: v.get("target").and_then(Json::as_str).map(str::to_owned),
            ended: v.get("ended")?.as_u64()?,
            exported: v.get("exported")?.as_u64()?,
            error: v.get("error").and_then(Json::as_str).map(str::to_owned),
        })
    }
}

/// One rank's line, for a rank run on its own (`--rank`).
pub(crate) fn rank_summary(r: &ExportRecord) -> Result<String, String> {
    if let Some(e) = &r.error {
        return Err(format!("otlp: rank {}: {e}", r.rank));
    }
    Ok(match &r.target {
        Some(t) => format!(
            "otlp: rank {} sent {} span(s) to {t}; the receiver accepted all",
            r.rank, r.exported
        ),
        None => format!(
            "otlp: rank {} was not chosen to export (LENS_OTLP_EXPORT_RANKS)",
            r.rank
        ),
    })
}

/// One line saying where the spans went and how many arrived, or why some did not.
pub(crate) fn summary(records: &[ExportRecord], world: usize) -> Result<String, String> {
    if let Some(bad) = records.iter().find(|r| r.error.is_some()) {
        return Err(format!(
            "otlp: rank {}: {}",
            bad.rank,
            bad.error.as_deref().unwrap_or_default()
        ));
    }
    if records.len() < world {
        let have: Vec<usize> = records.iter().map(|r| r.rank).collect();
        let missing: Vec<usize> = (0..world).filter(|r| !have.contains(r)).collect();
        return Err(format!("otlp: no export report from rank(s) {missing:?}"));
    }
    let exporting: Vec<&ExportRecord> = records.iter().filter(|r| r.target.is_some()).collect();
    let spans: u64 = exporting.iter().map(|r| r.exported).sum();
    let mut targets: Vec<&str> = exporting
        .iter()
        .filter_map(|r| r.target.as_deref())
        .collect();
    targets.dedup();
    if exporting.is_empty() {
        return Ok(format!(
            "otlp: no rank of {world} was chosen to export (LENS_OTLP_EXPORT_RANKS)"
        ));
    }
    Ok(format!(
        "otlp: sent {spans} span(s) from {} of {world} rank(s) to {}; the receiver accepted all",
        exporting.len(),
        targets.join(", ")
    ))
}
