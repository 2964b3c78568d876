//! Every rank's resource, as the receiver decodes it: which job and which run (stable across
//! requeues, new with each restart), Slurm's ids, and the rank's GPU read through NVML (the
//! test kit's fake NVML in a child process; no NVML means no GPU attributes).

use std::process::Command;
use std::time::Duration;

use lens_core::{Broadcaster as _, RankInfo};
use lens_otlp::{OtlpBuilder, resource_keys};
use lens_testkit::fake_gpu::FakeGpu;
use lens_testkit::otlp::{ReceivedSpan, Receiver};
use lens_testkit::process::Supervised;
use lens_testkit::{LocalCluster, on_each_rank};
use opentelemetry::trace::{Span as _, Tracer as _};

/// One span from a provider built from `vars` for `rank` of 4; the span as received.
fn resource_of(rank: usize, vars: &[(&str, &str)]) -> ReceivedSpan {
    let receiver = Receiver::start().expect("receiver");
    let lookup = |k: &str| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    };
    let mut info = RankInfo::from_vars(lookup).expect("rank info");
    info.rank = rank;
    let guard = OtlpBuilder::from_vars(info, lookup)
        .endpoint(receiver.http_endpoint())
        .build()
        .expect("guard");
    guard.tracer("t").start("one").end();
    guard.shutdown().expect("exported");
    receiver
        .wait_for(1, Duration::from_secs(10))
        .pop()
        .expect("a span")
}

/// `job.uuid` stays across a requeue (Slurm's restart count) and is the same on every
/// rank; `run.uuid` is the same on every rank of one run and new after the requeue; the
/// instance id carries the run; Slurm's ids are in the resource.
#[test]
fn job_and_run_uuids_follow_requeues_and_slurm_ids_are_kept() {
    let first = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "7"),
    ];
    let requeued = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_STEP_ID", "7"),
        ("SLURM_RESTART_COUNT", "1"),
    ];
    let r0 = resource_of(0, &first);
    let r3 = resource_of(3, &first);
    let again = resource_of(0, &requeued);
    let job = |s: &ReceivedSpan| s.resource_str(resource_keys::JOB_UUID).expect("job.uuid");
    let run = |s: &ReceivedSpan| s.resource_str(resource_keys::RUN_UUID).expect("run.uuid");
    assert_eq!(job(&r0), job(&r3), "one job on every rank");
    assert_eq!(job(&r0), job(&again), "the job outlives a requeue");
    assert_eq!(run(&r0), run(&r3), "one run on every rank");
    assert_ne!(run(&r0), run(&again), "a requeue is a new run");
    let instance = |s: &ReceivedSpan| s.resource_str("service.instance.id").expect("instance");
    let short: String = run(&r0).chars().filter(|c| *c != '-').take(16).collect();
    assert_eq!(instance(&r0), format!("4242/run-{short}/rank-0"));
    assert_eq!(instance(&r3), format!("4242/run-{short}/rank-3"));
    assert_ne!(instance(&r0), instance(&again));
    assert_eq!(r0.resource_str("slurm.job.id").as_deref(), Some("4242"));
    assert_eq!(r0.resource_str("slurm.step.id").as_deref(), Some("7"));
    assert_eq!(r0.resource_int("slurm.restart_count"), Some(0));
    assert_eq!(again.resource_int("slurm.restart_count"), Some(1));

    let bare = resource_of(0, &[("RANK", "0"), ("WORLD_SIZE", "4")]);
    assert!(
        bare.resource_str(resource_keys::JOB_UUID).is_none(),
        "no job id, no job.uuid"
    );
    assert!(
        bare.resource_str(resource_keys::RUN_UUID).is_some(),
        "a run.uuid always"
    );
    assert!(bare.resource_str("slurm.job.id").is_none());
}

/// Without launcher ids, `share_job_id` gives every rank the root's job and run: one
/// `job.uuid` and one `run.uuid` across the ranks.
#[test]
fn shared_ids_give_one_run_uuid_on_every_rank() {
    let receiver = Receiver::start().expect("receiver");
    let ranks = LocalCluster::new(3).broadcasters();
    let endpoint = receiver.http_endpoint();
    on_each_rank(&ranks, |b| {
        let mut info = RankInfo::new(b.rank(), 3).expect("rank");
        futures::executor::block_on(lens_otlp::share_job_id(b, 0, &mut info)).expect("shared");
        let guard = OtlpBuilder::new(info)
            .endpoint(endpoint.clone())
            .build()
            .expect("guard");
        guard.tracer("t").start("one").end();
        guard.shutdown().expect("exported");
    });
    let spans = receiver.wait_for(3, Duration::from_secs(10));
    assert_eq!(spans.len(), 3);
    for key in [resource_keys::JOB_UUID, resource_keys::RUN_UUID] {
        let values: Vec<_> = spans.iter().map(|s| s.resource_str(key)).collect();
        assert!(values[0].is_some(), "{key}");
        assert!(values.iter().all(|v| *v == values[0]), "{key}: {values:?}");
    }
}

const GPU_KEYS: [&str; 4] = [
    resource_keys::GPU_UUID,
    resource_keys::GPU_INDEX,
    resource_keys::GPU_MODEL,
    resource_keys::GPU_DRIVER_VERSION,
];

/// In this process (no fake on the loader's path): the four GPU attributes come all
/// together or not at all (none where NVML is absent), and the provider builds either way.
#[test]
fn gpu_attributes_come_whole_or_not_at_all() {
    let span = resource_of(0, &[("RANK", "0"), ("WORLD_SIZE", "1")]);
    let present = GPU_KEYS
        .iter()
        .filter(|k| span.resource.iter().any(|(n, _)| n == *k))
        .count();
    assert!(
        present == 0 || present == 4,
        "{present} of the 4 GPU attributes"
    );
}

/// A rank of a process that loads NVML (the test kit's fake, 4 GPUs) names its GPU: the
/// device of its local rank, through `CUDA_VISIBLE_DEVICES`; a device NVML does not have
/// gives no GPU attributes, and no error.
#[test]
fn the_rank_s_gpu_is_named_through_nvml() {
    let fake = match FakeGpu::build(4) {
        Ok(f) => f,
        Err(e) => panic!("the fake NVML needs a C compiler: {e}"),
    };
    // (LOCAL_RANK, CUDA_VISIBLE_DEVICES, the NVML index or none)
    let rows: &[(&str, Option<&str>, Option<i64>)] = &[
        ("1", None, Some(1)),
        ("1", Some("3,2"), Some(2)),
        (
            "0",
            Some("GPU-1e45fa4e-0000-4000-8000-000000000003"),
            Some(3),
        ),
        ("2", Some("0,1"), None),
        ("0", Some("9"), None),
    ];
    for (local, visible, want) in rows {
        let receiver = Receiver::start().expect("receiver");
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args(["--exact", "gpu_child", "--ignored", "--test-threads=1"])
            .env("LENS_TEST_CHILD", "1")
            .env("LENS_TEST_ENDPOINT", receiver.http_endpoint())
            .env("RANK", "0")
            .env("WORLD_SIZE", "8")
            .env("LOCAL_RANK", local)
            .env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        fake.apply(&mut cmd);
        // Killed at its deadline; its pipes drained as it runs.
        let done = Supervised::spawn(&mut cmd, Duration::from_secs(60))
            .expect("start the child")
            .wait();
        assert!(
            done.success() && done.stdout.contains("1 passed"),
            "{}",
            done.output()
        );
        let span = receiver
            .wait_for(1, Duration::from_secs(10))
            .pop()
            .expect("a span");
        let why = format!("LOCAL_RANK={local} CUDA_VISIBLE_DEVICES={visible:?}");
        match want {
            Some(index) => {
                assert_eq!(
                    span.resource_int(resource_keys::GPU_INDEX),
                    Some(*index),
                    "{why}"
                );
                assert_eq!(
                    span.resource_str(resource_keys::GPU_UUID),
                    Some(format!("GPU-1e45fa4e-0000-4000-8000-{index:012}")),
                    "{why}"
                );
                assert_eq!(
                    span.resource_str(resource_keys::GPU_MODEL).as_deref(),
                    Some("lens fake GPU"),
                    "{why}"
                );
                assert_eq!(
                    span.resource_str(resource_keys::GPU_DRIVER_VERSION)
                        .as_deref(),
                    Some("999.99-fake"),
                    "{why}"
                );
            }
            None => {
                for k in GPU_KEYS {
                    assert!(!span.resource.iter().any(|(n, _)| n == k), "{why}: {k}");
                }
            }
        }
    }
}

/// The child of `the_rank_s_gpu_is_named_through_nvml`: one span, the resource from the
/// process's environment.
#[test]
#[ignore = "a child process of the_rank_s_gpu_is_named_through_nvml, not a test on its own"]
fn gpu_child() {
    assert_eq!(std::env::var("LENS_TEST_CHILD").as_deref(), Ok("1"));
    let info = RankInfo::from_env().expect("rank info");
    let guard = OtlpBuilder::from_env(info)
        .endpoint(std::env::var("LENS_TEST_ENDPOINT").expect("endpoint"))
        .build()
        .expect("guard");
    guard.tracer("t").start("on a GPU").end();
    guard.shutdown().expect("exported");
}

/// Each rank's measured clock offset is in its resource, as the names the checks read.
#[test]
fn the_measured_clock_offset_is_in_every_rank_s_resource() {
    let receiver = Receiver::start().expect("receiver");
    let ranks = LocalCluster::new(3).broadcasters();
    let endpoint = receiver.http_endpoint();
    on_each_rank(&ranks, |b| {
        let table = lens_core::measure_clock_offsets(b, 0, 3).expect("measured");
        let guard = OtlpBuilder::new(RankInfo::new(b.rank(), 3).expect("rank"))
            .endpoint(endpoint.clone())
            .clock_offset(table[b.rank()])
            .build()
            .expect("guard");
        guard.tracer("t").start("one").end();
        guard.shutdown().expect("exported");
    });
    let spans = receiver.wait_for(3, Duration::from_secs(10));
    assert_eq!(spans.len(), 3);
    for s in &spans {
        let offset = s.resource_int("lens.clock.offset_ns").expect("offset");
        let error = s.resource_int("lens.clock.error_ns").expect("error");
        assert!(
            offset.abs() <= error + 1,
            "one clock: {offset} within {error}"
        );
        if s.rank() == Some(0) {
            assert_eq!((offset, error), (0, 0), "the reference");
        }
    }
}

/// A re-measured offset moves the spans exported after it (the resource keeps the first).
#[test]
fn a_remeasured_offset_moves_later_spans() {
    let first = lens_core::ClockOffset {
        offset_ns: 2_000_000_000,
        error_ns: 1_000,
    };
    let receiver = Receiver::start().expect("receiver");
    let guard = OtlpBuilder::new(RankInfo::new(1, 2).expect("rank"))
        .endpoint(receiver.http_endpoint())
        .clock_offset(first)
        .build()
        .expect("guard");
    // (why, offset in force, span name)
    let rows = [
        ("the offset given at build", 2_000_000_000_i64, "before"),
        ("measured again: 3 s ahead", 3_000_000_000, "after"),
        ("measured again: 1 s behind", -1_000_000_000, "behind"),
    ];
    let mut windows = Vec::new();
    for (_, offset, name) in rows {
        guard.set_clock_offset(lens_core::ClockOffset {
            offset_ns: offset,
            error_ns: 1_000,
        });
        let before = lens_core::clock::system_now_ns() as i64;
        guard.tracer("t").start(name).end();
        let after = lens_core::clock::system_now_ns() as i64;
        windows.push((before, after));
    }
    // No flush in between: the three went in one batch, each moved by its own figure.
    guard.shutdown().expect("exported");
    let spans = receiver.wait_for(3, Duration::from_secs(10));
    for ((why, offset, name), (before, after)) in rows.iter().zip(windows) {
        let span = spans.iter().find(|s| s.name == *name).expect(why);
        let t = span.start_unix_nano as i64;
        assert!(
            t >= before - offset && t <= after - offset,
            "{why}: start {t} not in [{}, {}]",
            before - offset,
            after - offset
        );
        assert_eq!(
            span.resource_int("lens.clock.offset_ns"),
            Some(2_000_000_000),
            "{why}: the resource keeps the first"
        );
        // A span moved by another figure than the resource's names it.
        let own = (*offset != 2_000_000_000).then_some(*offset);
        assert_eq!(span.int("lens.clock.offset_ns"), own, "{why}");
        assert_eq!(span.int("lens.clock.error_ns"), own.map(|_| 1_000), "{why}");
    }
}

/// A rank whose clock is 2 s ahead of the reference exports its spans on the reference
/// clock (start, end), unless told not to; the offset is in the resource either way.
#[test]
fn exported_timestamps_are_moved_onto_the_reference_clock() {
    let ahead = lens_core::ClockOffset {
        offset_ns: 2_000_000_000,
        error_ns: 1_000,
    };
    for correct in [true, false] {
        let receiver = Receiver::start().expect("receiver");
        let guard = OtlpBuilder::new(RankInfo::new(1, 2).expect("rank"))
            .endpoint(receiver.http_endpoint())
            .clock_offset(ahead)
            .correct_timestamps(correct)
            .build()
            .expect("guard");
        let before = lens_core::clock::system_now_ns() as u64;
        guard.tracer("t").start("one").end();
        let after = lens_core::clock::system_now_ns() as u64;
        guard.shutdown().expect("exported");
        let span = receiver
            .wait_for(1, Duration::from_secs(10))
            .pop()
            .expect("a span");
        let shift = if correct { 2_000_000_000 } else { 0 };
        for (what, t) in [("start", span.start_unix_nano), ("end", span.end_unix_nano)] {
            assert!(
                t >= before - shift && t <= after - shift,
                "correct={correct}: {what} {t} not in [{}, {}]",
                before - shift,
                after - shift
            );
        }
        assert_eq!(
            span.resource_int("lens.clock.offset_ns"),
            Some(2_000_000_000)
        );
    }
}
