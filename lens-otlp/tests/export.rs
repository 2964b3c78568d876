//! A job's ranks export to a real OTLP receiver (gRPC and HTTP/protobuf, decoded with the
//! official protobuf definitions); what arrived is checked span by span.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lens_core::{Broadcaster as _, LinkedSpan, Parent, RankInfo, blocking};
use lens_otlp::{ExportRanks, OtlpBuilder, OtlpGuard, Protocol, env};
use lens_testkit::otlp::{ReceivedSpan, Receiver, Via, closed_port_endpoint};
use lens_testkit::{LocalCluster, on_each_rank};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::BatchConfigBuilder;

const STEP: &str = "train_step";
const STAGE: &str = "pp.recv_forward.linked";

/// A pipeline job: rank 0 opens each step and broadcasts it; the other ranks open a stage
/// span in its trace, linked to it. Each rank's guard is shut down at the end, and its
/// outcome returned.
fn run_job(
    world: usize,
    steps: usize,
    guard_for: impl Fn(RankInfo) -> OtlpGuard + Sync,
) -> Vec<lens_core::Result<lens_otlp::ExportStats>> {
    let ranks = LocalCluster::new(world).broadcasters();
    on_each_rank(&ranks, |b| {
        let info = RankInfo::new(b.rank(), world)
            .expect("rank")
            .with_local_rank(b.rank() % 2)
            .with_job_id("job-7");
        let guard = guard_for(info);
        let tracer = guard.tracer("pipeline");
        for step in 0..steps {
            let step_attr = KeyValue::new("nv.dl.step", step as i64);
            if b.rank() == 0 {
                let cx = Context::new().with_span(
                    tracer
                        .span_builder(STEP)
                        .with_attributes([step_attr])
                        .start(&tracer),
                );
                blocking::broadcast_context(b, 0, &cx).expect("broadcast");
                cx.span().end();
            } else {
                let remote = blocking::broadcast_context(b, 0, &Context::new()).expect("broadcast");
                LinkedSpan::builder(STAGE)
                    .remote(&remote)
                    .parent(Parent::Remote)
                    .kind(SpanKind::Consumer)
                    .attributes([step_attr, KeyValue::new("pp.stage", b.rank() as i64)])
                    .link_attributes([KeyValue::new("pp.microbatch", 0)])
                    .start_with_context(&tracer, &Context::new())
                    .end();
            }
        }
        guard.shutdown()
    })
}

/// Everything the issue asks of what arrived: one trace per step across all exporting ranks,
/// each stage span a child of rank 0's step span and linked to it with its attributes, every
/// rank's resource.
fn check_arrived(spans: &[ReceivedSpan], exporting: &BTreeSet<usize>, world: usize, steps: usize) {
    let ranks: BTreeSet<usize> = spans.iter().filter_map(ReceivedSpan::rank).collect();
    assert_eq!(
        &ranks, exporting,
        "spans arrived from exactly the exporting ranks"
    );
    assert_eq!(
        spans.len(),
        exporting.len() * steps,
        "one span per rank and step, none lost"
    );
    for s in spans {
        let r = s.rank().expect("rank in resource");
        assert_eq!(
            s.resource_int("nv.dl.world_size"),
            Some(world as i64),
            "rank {r}'s world size"
        );
        assert_eq!(
            s.resource_int("nv.dl.local_rank"),
            Some((r % 2) as i64),
            "rank {r}'s local rank"
        );
        assert_eq!(
            s.resource_str("nv.dl.job_id").as_deref(),
            Some("job-7"),
            "rank {r}'s job id"
        );
        let instance = s.resource_str("service.instance.id").unwrap_or_default();
        assert!(
            instance.starts_with("job-7/run-") && instance.ends_with(&format!("/rank-{r}")),
            "rank {r}'s instance id: {instance}"
        );
        assert_eq!(
            s.resource_int("process.pid"),
            Some(i64::from(std::process::id())),
            "rank {r}'s process"
        );
        assert!(
            s.resource_str("host.name").is_some_and(|h| !h.is_empty()),
            "rank {r}'s host"
        );
        assert_eq!(
            s.resource_str("service.name").as_deref(),
            Some("trainer"),
            "rank {r}'s service"
        );
    }
    let by_step: BTreeMap<i64, Vec<&ReceivedSpan>> =
        spans.iter().fold(BTreeMap::new(), |mut m, s| {
            m.entry(s.int("nv.dl.step").expect("step attribute"))
                .or_default()
                .push(s);
            m
        });
    assert_eq!(by_step.len(), if exporting.is_empty() { 0 } else { steps });
    for (step, group) in by_step {
        let traces: std::collections::HashSet<_> = group.iter().map(|s| s.trace_id).collect();
        assert_eq!(traces.len(), 1, "step {step} is one trace across ranks");
        let root = group.iter().find(|s| s.name == STEP);
        for s in group.iter().filter(|s| s.name == STAGE) {
            assert_eq!(s.kind, 5, "a stage span is a consumer");
            let Some(root) = root else { continue };
            assert_eq!(
                s.parent_span_id,
                root.span_id,
                "step {step}: rank {:?} is a child of rank 0's step",
                s.rank()
            );
            let link = s
                .links
                .iter()
                .find(|l| l.span_id == root.span_id)
                .expect("a link to the step span");
            assert_eq!(link.trace_id, root.trace_id);
            assert_eq!(link.int("lens.link.source_rank"), Some(0));
            assert_eq!(link.str("lens.link.source").as_deref(), Some("broadcast"));
            assert_eq!(link.int("pp.microbatch"), Some(0));
        }
    }
}

#[test]
fn every_rank_arrives_whole_over_grpc_and_http() {
    for (protocol, via) in [
        (Protocol::Grpc, Via::Grpc),
        (Protocol::HttpProtobuf, Via::Http),
    ] {
        let receiver = Receiver::start().expect("receiver");
        let endpoint = match protocol {
            Protocol::Grpc => receiver.grpc_endpoint(),
            _ => receiver.http_endpoint(),
        };
        let (world, steps) = (4, 3);
        let outcomes = run_job(world, steps, |info| {
            OtlpBuilder::new(info)
                .protocol(protocol)
                .endpoint(endpoint.clone())
                .service_name("trainer")
                .build()
                .expect("guard")
        });
        // The batch processor waits 5 s between exports: only the shutdown flush sent these.
        for (rank, outcome) in outcomes.iter().enumerate() {
            let stats = outcome
                .as_ref()
                .unwrap_or_else(|e| panic!("{protocol}: rank {rank}: {e}"));
            assert_eq!(
                (stats.ended, stats.exported, stats.lost()),
                (3, 3, 0),
                "{protocol}: rank {rank}"
            );
        }
        let spans = receiver.spans();
        assert!(
            spans.iter().all(|s| s.via == via),
            "{protocol}: arrived over {via:?}"
        );
        check_arrived(&spans, &(0..world).collect(), world, steps);
    }
}

#[test]
fn only_the_chosen_ranks_export_and_the_others_still_link() {
    let rows: &[(ExportRanks, &[usize], &str)] = &[
        (
            ExportRanks::List([0, 2].into()),
            &[0, 2],
            "an explicit list",
        ),
        (
            ExportRanks::FirstPerNode,
            &[0, 2],
            "local rank 0 (rank % 2 here)",
        ),
        (
            ExportRanks::Fraction(1.0),
            &[0, 1, 2, 3],
            "a fraction of one",
        ),
        (ExportRanks::Fraction(0.0), &[], "a fraction of zero"),
    ];
    for (how, chosen, why) in rows {
        let receiver = Receiver::start().expect("receiver");
        let outcomes = run_job(4, 2, |info| {
            OtlpBuilder::new(info)
                .protocol(Protocol::Grpc)
                .endpoint(receiver.grpc_endpoint())
                .service_name("trainer")
                .export_ranks(how.clone())
                .build()
                .expect("guard")
        });
        for (rank, outcome) in outcomes.iter().enumerate() {
            let stats = outcome
                .as_ref()
                .unwrap_or_else(|e| panic!("{why}: rank {rank}: {e}"));
            let want = if chosen.contains(&rank) { 2 } else { 0 };
            assert_eq!(stats.exported, want, "{why}: rank {rank}");
        }
        check_arrived(&receiver.spans(), &chosen.iter().copied().collect(), 4, 2);
    }
}

#[test]
fn the_standard_variables_pick_protocol_endpoint_service_and_ranks() {
    let receiver = Receiver::start().expect("receiver");
    for (protocol, endpoint, via) in [
        ("grpc", receiver.grpc_endpoint(), Via::Grpc),
        ("http/protobuf", receiver.http_endpoint(), Via::Http),
    ] {
        let before = receiver.spans().len();
        let vars = [
            (env::OTEL_EXPORTER_OTLP_PROTOCOL, protocol.to_owned()),
            (env::OTEL_EXPORTER_OTLP_ENDPOINT, endpoint),
            (env::OTEL_SERVICE_NAME, "from-env".to_owned()),
            (env::LENS_OTLP_EXPORT_RANKS, "ranks:1".to_owned()),
        ];
        let lookup = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        for rank in 0..2 {
            let guard = OtlpBuilder::from_vars(RankInfo::new(rank, 2).expect("rank"), lookup)
                .build()
                .expect("guard");
            assert_eq!(
                guard.exporting(),
                rank == 1,
                "{protocol}: only rank 1 exports"
            );
            guard.tracer("t").start("work").end();
            guard.shutdown().expect("all exported");
        }
        let spans = &receiver.spans()[before..];
        assert_eq!(spans.len(), 1, "{protocol}");
        assert_eq!(
            (spans[0].via, spans[0].rank()),
            (via, Some(1)),
            "{protocol}"
        );
        assert_eq!(
            spans[0].resource_str("service.name").as_deref(),
            Some("from-env")
        );
    }
}

#[test]
fn a_bad_variable_is_an_error_naming_it_unless_code_overrides_it() {
    let rows: &[(&str, &str, &str)] = &[
        (env::OTEL_EXPORTER_OTLP_PROTOCOL, "http/json", "http/json"),
        (
            env::LENS_OTLP_EXPORT_RANKS,
            "half",
            env::LENS_OTLP_EXPORT_RANKS,
        ),
        (env::LENS_OTLP_TIMEOUT, "soon", env::LENS_OTLP_TIMEOUT),
        (
            env::OTEL_EXPORTER_OTLP_ENDPOINT,
            "collector:4318",
            "collector:4318",
        ),
        (
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
            "10s",
            env::OTEL_EXPORTER_OTLP_TIMEOUT,
        ),
        (
            env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
            "0",
            env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
        ),
        (
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
            "brotli",
            env::OTEL_EXPORTER_OTLP_COMPRESSION,
        ),
        (
            env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
            "zstd",
            env::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
        ),
        (
            env::OTEL_EXPORTER_OTLP_INSECURE,
            "maybe",
            env::OTEL_EXPORTER_OTLP_INSECURE,
        ),
        (env::OTEL_SDK_DISABLED, "yes", env::OTEL_SDK_DISABLED),
        (
            env::OTEL_EXPORTER_OTLP_HEADERS,
            "api-key",
            env::OTEL_EXPORTER_OTLP_HEADERS,
        ),
        (
            env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
            "a=%zz",
            env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
        ),
    ];
    let mut rows = rows.to_vec();
    // A TLS file beside the default endpoint (http://) cannot be used.
    for tls in [
        env::OTEL_EXPORTER_OTLP_CERTIFICATE,
        env::OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
        env::OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
        env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
        env::OTEL_EXPORTER_OTLP_CLIENT_KEY,
        env::OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
    ] {
        rows.push((tls, "/etc/ssl/ca.pem", tls));
    }
    for (var, value, named) in &rows {
        let lookup = |k: &str| (k == *var).then(|| value.to_string());
        let err = OtlpBuilder::from_vars(RankInfo::single(), lookup)
            .build()
            .expect_err("a bad value is refused");
        assert!(err.to_string().contains(named), "{var}={value}: {err}");
        assert_eq!(
            err.to_string().matches("invalid configuration").count(),
            1,
            "said once: {err}"
        );
    }
    let lookup = |k: &str| (k == env::LENS_OTLP_EXPORT_RANKS).then(|| "half".to_owned());
    let guard = OtlpBuilder::from_vars(RankInfo::single(), lookup)
        .export_ranks(ExportRanks::List(BTreeSet::new()))
        .build()
        .expect("code overrides the bad variable");
    assert!(!guard.exporting());
}

/// The training loop's cost per span while the receiver misbehaves: ending a span only
/// queues it, whatever the receiver does.
fn loop_time(guard: &OtlpGuard, spans: usize) -> Duration {
    let tracer = guard.tracer("loop");
    let t = Instant::now();
    for _ in 0..spans {
        tracer.start("step").end();
    }
    t.elapsed()
}

#[test]
fn a_receiver_down_slow_or_refusing_costs_spans_not_time_and_the_loss_is_reported() {
    let receiver = Receiver::start().expect("receiver");
    let down = closed_port_endpoint().expect("port");
    // (how, endpoint, setup)
    let rows: Vec<(&str, String, Box<dyn Fn()>)> = vec![
        ("down", down, Box::new(|| {})),
        (
            "refusing",
            receiver.grpc_endpoint(),
            Box::new(|| receiver.set_refusing(true)),
        ),
        (
            "slow",
            receiver.grpc_endpoint(),
            Box::new(|| {
                receiver.set_refusing(false);
                receiver.set_delay(Duration::from_secs(5));
            }),
        ),
    ];
    for (how, endpoint, setup) in rows {
        setup();
        let shutdown_timeout = Duration::from_secs(2);
        let guard = OtlpBuilder::new(RankInfo::single())
            .protocol(Protocol::Grpc)
            .endpoint(endpoint)
            .timeout(Duration::from_millis(500))
            .shutdown_timeout(shutdown_timeout)
            .batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(50))
                    .build(),
            )
            .build()
            .expect("guard");
        let spent = loop_time(&guard, 200);
        // Generous for a debug build on 2 cores; an export blocking the loop costs 500 ms.
        assert!(
            spent < Duration::from_millis(300),
            "{how}: 200 spans took {spent:?}"
        );
        std::thread::sleep(Duration::from_millis(200)); // let a batch go out and fail
        let t = Instant::now();
        let err = guard.shutdown().expect_err("the loss is reported");
        let took = t.elapsed();
        assert!(
            took < shutdown_timeout + Duration::from_millis(700),
            "{how}: shutdown took {took:?}, bound {shutdown_timeout:?}"
        );
        match &err {
            lens_core::Error::Export { lost, reason } => {
                assert_eq!(*lost, 200, "{how}: {reason}");
                assert!(reason.contains("0 of 200"), "{how}: {reason}");
            }
            other => panic!("{how}: expected Error::Export, got {other}"),
        }
    }
    assert!(
        receiver.refused() > 0,
        "the refusing receiver was asked and refused"
    );
}

#[test]
fn a_full_queue_drops_spans_and_they_are_counted() {
    let receiver = Receiver::start().expect("receiver");
    receiver.set_delay(Duration::from_millis(300));
    let guard = OtlpBuilder::new(RankInfo::single())
        .protocol(Protocol::HttpProtobuf)
        .endpoint(receiver.http_endpoint())
        .batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(16)
                .with_max_export_batch_size(8)
                .build(),
        )
        .build()
        .expect("guard");
    loop_time(&guard, 500);
    let err = guard.shutdown().expect_err("spans over the queue are lost");
    let lens_core::Error::Export { lost, .. } = err else {
        panic!("expected Error::Export, got {err}")
    };
    let arrived = receiver.spans().len() as u64;
    assert_eq!(
        lost + arrived,
        500,
        "every span is either counted lost or arrived"
    );
    assert!(
        lost >= 400,
        "a queue of 16 kept at most a few dozen: lost {lost}"
    );
}

#[test]
fn ranks_agree_on_a_job_id_from_the_source() {
    for (root_has, why) in [
        (Some("slurm-123"), "the launcher's id"),
        (None, "a drawn id"),
    ] {
        let ranks = LocalCluster::new(3).broadcasters();
        let ids = on_each_rank(&ranks, |b| {
            let mut info = RankInfo::new(b.rank(), 3).expect("rank");
            if b.rank() == 1 {
                if let Some(id) = root_has {
                    info = info.with_job_id(id);
                }
            }
            let id = futures::executor::block_on(lens_otlp::share_job_id(b, 1, &mut info))
                .expect("shared");
            assert_eq!(info.job_id.as_deref(), Some(id.as_str()));
            id
        });
        assert!(ids.iter().all(|id| *id == ids[0]), "{why}: {ids:?}");
        if let Some(id) = root_has {
            assert_eq!(ids[0], id, "{why}");
        } else {
            assert_eq!(ids[0].len(), 32, "{why}: a 128-bit hex id");
        }
    }
}

/// No endpoint string, protocol or unreachable host makes `build` (or the guard's shutdown
/// and drop) panic, in a plain caller or inside async code on either tokio runtime: the
/// gRPC exporter's own runtime must never be dropped inside the caller's.
#[test]
fn no_endpoint_panics_in_sync_or_async_callers() {
    let endpoints = [
        "https://127.0.0.1:1",
        "https://[::1]:1/v1/traces",
        "http://127.0.0.1:1",
        "https://no-such-host.invalid:4317",
        "grpc://127.0.0.1:4317",
        "ftp://127.0.0.1:1",
        "http://",
        "http://exa mple.com:1",
        "http://127.0.0.1:99999",
        "",
        "   ",
        "\u{0}",
    ];
    let attempt = |endpoint: &str, protocol: Protocol| {
        let built = OtlpBuilder::new(RankInfo::single())
            .protocol(protocol)
            .endpoint(endpoint)
            .timeout(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_millis(200))
            .build();
        if let Ok(guard) = built {
            guard.tracer("t").start("a span").end();
            let _ = guard.shutdown();
        }
    };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        for endpoint in endpoints {
            attempt(endpoint, protocol);
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async { attempt(endpoint, protocol) });
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(async { attempt(endpoint, protocol) });
        }
    }
}

/// The specification's timeout is in milliseconds, and the traces variable wins over the
/// generic one: against a receiver that answers after 3 s, a 300 ms timeout bounds the
/// export and the guard's shutdown (the default of 10 s would wait for the answer).
#[test]
fn the_specification_timeout_is_milliseconds_and_honoured() {
    let receiver = Receiver::start().expect("receiver");
    receiver.set_delay(Duration::from_secs(3));
    let rows: [(&str, &[(&str, &str)]); 2] = [
        ("generic", &[(env::OTEL_EXPORTER_OTLP_TIMEOUT, "300")]),
        (
            "the traces variable wins",
            &[
                (env::OTEL_EXPORTER_OTLP_TIMEOUT, "60000"),
                (env::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, "300"),
            ],
        ),
    ];
    for (why, vars) in rows {
        let endpoint = receiver.grpc_endpoint();
        let lookup = |k: &str| {
            if k == env::OTEL_EXPORTER_OTLP_PROTOCOL {
                return Some("grpc".to_owned());
            }
            if k == env::OTEL_EXPORTER_OTLP_ENDPOINT {
                return Some(endpoint.clone());
            }
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let guard = OtlpBuilder::from_vars(RankInfo::single(), lookup)
            .build()
            .expect("guard");
        guard.tracer("t").start("slow to arrive").end();
        let t = Instant::now();
        let err = guard
            .shutdown()
            .expect_err("the receiver answered too late");
        assert!(
            t.elapsed() < Duration::from_millis(2000),
            "{why}: shutdown took {:?}",
            t.elapsed()
        );
        assert!(
            matches!(err, lens_core::Error::Export { lost: 1, .. }),
            "{why}: {err}"
        );
    }
}

/// `OTEL_SDK_DISABLED=true` (any case): nothing is recorded or exported, while the spans
/// still carry a context, so a broadcast of it and links still work.
#[test]
fn a_disabled_sdk_exports_nothing_and_contexts_still_travel() {
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.http_endpoint();
    let lookup = |k: &str| match k {
        env::OTEL_SDK_DISABLED => Some("TRUE".to_owned()),
        env::OTEL_EXPORTER_OTLP_ENDPOINT => Some(endpoint.clone()),
        _ => None,
    };
    let guard = OtlpBuilder::from_vars(RankInfo::single(), lookup)
        .build()
        .expect("guard");
    assert!(!guard.exporting());
    let span = guard.tracer("t").start("step");
    assert!(!span.is_recording());
    let cx = Context::new().with_span(span);
    let carrier = lens_core::Carrier::from_context(&cx);
    assert!(
        carrier.span_context().is_some(),
        "the context still travels"
    );
    cx.span().end();
    guard.shutdown().expect("nothing to lose");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(receiver.requests(), 0, "nothing was sent");
    // Code overrides the variable.
    let guard = OtlpBuilder::from_vars(RankInfo::single(), lookup)
        .disabled(false)
        .build()
        .expect("guard");
    assert!(guard.exporting());
}

/// `service.instance.id` is unique per rank and per run: two providers for the same rank
/// of the same job (a requeued job, say) get different ones, with the rank and job in both.
#[test]
fn the_instance_id_is_new_on_every_run() {
    let receiver = Receiver::start().expect("receiver");
    let info = RankInfo::new(3, 4).expect("rank").with_job_id("job-9");
    for _ in 0..2 {
        let guard = OtlpBuilder::new(info.clone())
            .endpoint(receiver.http_endpoint())
            .build()
            .expect("guard");
        guard.tracer("t").start("a run").end();
        guard.shutdown().expect("exported");
    }
    let ids: Vec<String> = receiver
        .wait_for(2, Duration::from_secs(10))
        .iter()
        .map(|s| s.resource_str("service.instance.id").unwrap_or_default())
        .collect();
    assert_eq!(ids.len(), 2);
    for id in &ids {
        assert!(
            id.starts_with("job-9/run-") && id.ends_with("/rank-3"),
            "{id}"
        );
    }
    assert_ne!(ids[0], ids[1], "a new run id each time");
}

/// `service.version` from code reaches the receiver with the rank's resource.
#[test]
fn the_service_version_is_in_the_resource() {
    let receiver = Receiver::start().expect("receiver");
    let guard = OtlpBuilder::new(RankInfo::single())
        .endpoint(receiver.http_endpoint())
        .service_version("1.4.2+abc123")
        .build()
        .expect("guard");
    guard.tracer("t").start("versioned").end();
    guard.shutdown().expect("exported");
    let spans = receiver.wait_for(1, Duration::from_secs(10));
    assert_eq!(
        spans[0].resource_str("service.version").as_deref(),
        Some("1.4.2+abc123")
    );
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` compresses every export request, on both
/// transports, as the receiver sees it; without it nothing is compressed.
#[test]
fn gzip_is_seen_at_the_receiver_on_both_transports() {
    for (protocol, gzip) in [
        ("grpc", true),
        ("http/protobuf", true),
        ("grpc", false),
        ("http/protobuf", false),
    ] {
        let receiver = Receiver::start().expect("receiver");
        let endpoint = if protocol == "grpc" {
            receiver.grpc_endpoint()
        } else {
            receiver.http_endpoint()
        };
        let lookup = |k: &str| match k {
            env::OTEL_EXPORTER_OTLP_PROTOCOL => Some(protocol.to_owned()),
            env::OTEL_EXPORTER_OTLP_ENDPOINT => Some(endpoint.clone()),
            env::OTEL_EXPORTER_OTLP_COMPRESSION => {
                Some(if gzip { "GZIP" } else { "none" }.to_owned())
            }
            _ => None,
        };
        let guard = OtlpBuilder::from_vars(RankInfo::single(), lookup)
            .build()
            .expect("guard");
        for _ in 0..10 {
            guard.tracer("t").start("compressed or not").end();
        }
        guard.shutdown().expect("exported");
        assert_eq!(
            receiver.wait_for(10, Duration::from_secs(10)).len(),
            10,
            "{protocol}"
        );
        assert!(receiver.requests() > 0, "{protocol}");
        assert_eq!(
            receiver.compressed() == receiver.requests(),
            gzip,
            "{protocol} gzip={gzip}: {} of {} requests compressed",
            receiver.compressed(),
            receiver.requests()
        );
        if !gzip {
            assert_eq!(receiver.compressed(), 0, "{protocol}");
        }
    }
}
