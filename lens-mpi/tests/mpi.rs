//! MPI tests. Each case runs under `mpirun -n N` as its own job: this binary is both the
//! parent (no `LENS_MPI_CASE` set: it launches every case with a deadline) and the ranks
//! (`LENS_MPI_CASE` names the case). Without `mpirun` every case is reported ignored.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use lens_core::{Broadcaster, Disagreement, Error, blocking};
use lens_mpi::{MpiBroadcaster, MpiBroadcasterBuilder, Transfer};
use lens_testkit::conformance::{Options, pattern, run_rank};
use lens_testkit::process::{Supervised, mpirun};
use mpi::traits::*;

/// (case, ranks, expected to exit with success)
const CASES: &[(&str, usize, bool)] = &[
    ("conformance_2", 2, true),
    ("conformance_4", 4, true),
    ("conformance_persistent", 3, true),
    ("conformance_without_persistent_requests", 3, true),
    ("split_groups", 4, true),
    ("slab_boundaries", 3, true),
    ("ten_thousand_rounds", 2, true),
    ("carrier_on_every_rank", 3, true),
    ("slab_size_mismatch", 2, true),
    ("settings_from_the_environment", 2, true),
    ("skipped_call_times_out", 2, false),
    ("rank_that_never_builds_times_out", 2, false),
    ("absent_rank_is_named_by_every_rank", 4, false),
    ("arrivals_name_the_straggler", 3, true),
    ("votes_ride_in_the_gather", 3, true),
    ("transfer_measured", 4, true),
    // Rank 1 runs under libfaketime 2.5 s ahead (an MPMD launch; skipped without faketime).
    ("clock_under_faketime", 2, true),
];

/// Whether the faketime wrapper is on the PATH.
fn has_faketime() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join("faketime").is_file()))
}

const DEADLINE: Duration = Duration::from_secs(180);

fn main() {
    match std::env::var("LENS_MPI_CASE") {
        Ok(case) => rank_main(&case),
        Err(_) => parent(),
    }
}

fn parent() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let cases: Vec<_> = CASES
        .iter()
        .filter(|(name, ..)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", cases.len());
    if mpirun(1).is_none() {
        for (name, ..) in &cases {
            println!("test {name} ... ignored, mpirun not found on PATH (install openmpi-bin)");
        }
        println!(
            "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; 0 filtered out\n",
            cases.len()
        );
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, n, should_succeed) in cases {
        let started = Instant::now();
        let faked = *name == "clock_under_faketime";
        if faked && !has_faketime() {
            println!("test {name} ... ignored, faketime not found on PATH (install faketime)");
            continue;
        }
        let mut cmd = mpirun(if faked { 1 } else { *n }).expect("mpirun was found above");
        cmd.arg(&exe);
        if faked {
            // The second rank's program: this binary under faketime, only its wall clock.
            cmd.args([":", "-n", "1", "faketime", "-f", "+2.5s"])
                .arg(&exe)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.env("LENS_MPI_CASE", name)
            // Read by `settings_from_the_environment` (the others build from code).
            .env(lens_mpi::env::SLAB_SIZE, "64")
            .env(lens_mpi::env::MAX_PAYLOAD, "1000")
            .env(lens_mpi::env::PERSISTENT, "0")
            .env(lens_mpi::env::DIRECT_MAX, "1")
            .stdin(Stdio::null());
        let done = Supervised::spawn(&mut cmd, DEADLINE)
            .expect("start mpirun")
            .wait();
        let (status, output) = (done.status, done.output());
        let ok = match status {
            None => false,
            Some(s) if *should_succeed => s.success() && output.contains("lens-mpi case ok"),
            // A rank that timed out must make the job exit non-zero, on its own, in time.
            Some(s) => !s.success() && output.contains("timed out as expected"),
        };
        if ok {
            passed += 1;
            println!(
                "test {name} ({n} ranks) ... ok ({:.1}s)",
                started.elapsed().as_secs_f64()
            );
        } else {
            println!("test {name} ({n} ranks) ... FAILED ({status:?})\n{output}");
            failed.push(*name);
        }
    }
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {} failed; 0 ignored; 0 measured; 0 filtered out\n",
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

fn check<T>(r: Result<T, impl std::fmt::Display>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("lens-mpi case failed: {what}: {e}");
        std::process::exit(2)
    })
}

fn rank_main(case: &str) {
    let universe = mpi::initialize().expect("MPI initialises");
    let world = universe.world();
    let me = world.rank();
    match case {
        "conformance_2" | "conformance_4" => {
            // Two ranks: direct sends, named outright (the persistent and MPI_Ibcast paths
            // have cases of their own); four: whichever way measured fastest.
            let b = if case == "conformance_2" {
                let b = check(
                    MpiBroadcaster::builder(world.duplicate())
                        .transfer(Transfer::Direct)
                        .build(),
                    "build",
                );
                assert!(b.direct_sends() && !b.persistent_broadcasts());
                b
            } else {
                let b = check(MpiBroadcaster::new(world.duplicate()), "build");
                assert!(!b.transfer_measured().is_empty());
                b
            };
            // The library's node-local rank, as mpirun names it; the trace's local rank.
            let launcher: Option<usize> = std::env::var("OMPI_COMM_WORLD_LOCAL_RANK")
                .ok()
                .and_then(|v| v.parse().ok());
            assert!(b.local_rank().is_some(), "MPI knows the local rank");
            if launcher.is_some() {
                assert_eq!(b.local_rank(), launcher);
            }
            assert_eq!(lens_core::RankInfo::of_group(&b).local_rank, b.local_rank());
            check(
                futures::executor::block_on(run_rank(&b, &Options::default())),
                "conformance",
            );
        }
        "arrivals_name_the_straggler" => {
            // Every round gathers arrival times: the conformance suite's straggler case
            // applies, and rank 2, 40 ms late to a round from rank 0, is named.
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .arrivals_every(1)
                    .build(),
                "build",
            );
            check(
                futures::executor::block_on(run_rank(&b, &Options::default().rounds(50))),
                "conformance",
            );
            let _ = b.take_arrivals();
            // The hang report names a round by this count.
            assert!(b.rounds_started().is_some_and(|r| r > 50));
            if me == 2 {
                std::thread::sleep(Duration::from_millis(40));
            }
            let mine = (me == 0).then_some(&b"step"[..]);
            check(lens_core::blocking::broadcast(&b, 0, mine), "round");
            if me == 0 {
                let a = b.take_arrivals().expect("the root gathered the arrivals");
                assert_eq!(a.last_rank, 2, "{a:?}");
                assert!(a.spread_ns >= 35_000_000, "{a:?}");
            } else {
                assert_eq!(b.take_arrivals(), None);
            }
        }
        "votes_ride_in_the_gather" => {
            // Every round gathers arrival times, and a rank's step-sampler vote rides in
            // the gather: rank 2's vote keeps step 3 on every rank.
            use lens_core::sample::{Reason, SampleRules, StepSampler};
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .arrivals_every(1)
                    .build(),
                "build",
            );
            let sampler =
                StepSampler::deciding_only(check(SampleRules::parse("slower-than=60s"), "rules"));
            let g = sampler.group(&b);
            for step in 1..=6u64 {
                check(blocking::broadcast_trace_context(&g, 0), "round");
                if me == 2 && step == 3 {
                    sampler.keep_this_step();
                }
            }
            let d = sampler.decisions();
            assert!(d.contains(&(3, Some(Reason::Vote))), "rank {me}: {d:?}");
            assert!(d.contains(&(2, None)), "rank {me}: {d:?}");
        }
        "conformance_persistent" => {
            // A group over the direct-send limit: Open MPI 4.1 (the tested MPI) has
            // MPIX_Bcast_init, and rounds restart it.
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .direct_up_to(2)
                    .build(),
                "build",
            );
            assert!(!b.direct_sends());
            assert!(b.persistent_broadcasts(), "no persistent broadcast found");
            check(
                futures::executor::block_on(run_rank(&b, &Options::default())),
                "conformance",
            );
        }
        "conformance_without_persistent_requests" => {
            // The MPI_Ibcast path (LENS_MPI_PERSISTENT=0, or an MPI without persistent
            // collectives) meets the same contract.
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .direct_up_to(0)
                    .persistent(false)
                    .build(),
                "build",
            );
            assert!(!b.persistent_broadcasts() && !b.direct_sends());
            check(
                futures::executor::block_on(run_rank(&b, &Options::default())),
                "conformance",
            );
        }
        "split_groups" => {
            // Two pipeline groups of two, {0, 2} and {1, 3}, each with its own roots.
            let color = mpi::topology::Color::with_value(me % 2);
            let comm = world.split_by_color(color).expect("a colour");
            let b = check(MpiBroadcaster::new(comm), "build");
            assert_eq!(
                (b.world_size(), b.rank()),
                (2, usize::try_from(me / 2).expect("rank"))
            );
            for round in 0..200 {
                let root = (round + usize::try_from(me % 2).expect("c")) % 2;
                let want = pattern(
                    round,
                    root * 10 + usize::try_from(me % 2).expect("c"),
                    30 + round,
                );
                let got = check(
                    blocking::broadcast(&b, root, (b.rank() == root).then_some(want.as_slice())),
                    "round",
                );
                assert_eq!(got, want, "group {} round {round}", me % 2);
            }
            check(
                futures::executor::block_on(run_rank(&b, &Options::default().rounds(100))),
                "conformance in a group",
            );
        }
        "slab_boundaries" => {
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .slab_size(128)
                    .build(),
                "build",
            );
            let cap = b.slab_capacity();
            for (i, len) in [0, 1, cap - 1, cap, cap + 1, 2 * cap, 10_000]
                .into_iter()
                .enumerate()
            {
                let root = i % b.world_size();
                let want = pattern(i, root, len);
                let got = check(
                    blocking::broadcast(&b, root, (b.rank() == root).then_some(want.as_slice())),
                    "round",
                );
                assert_eq!(got, want, "payload of {len} bytes (slab capacity {cap})");
            }
        }
        "ten_thousand_rounds" => {
            let b = check(MpiBroadcaster::new(world.duplicate()), "build");
            for round in 0..10_000 {
                let root = round % 2;
                let want = pattern(round, root, round % 700);
                let got = check(
                    blocking::broadcast(&b, root, (b.rank() == root).then_some(want.as_slice())),
                    "round",
                );
                assert_eq!(got, want, "round {round}");
            }
        }
        "carrier_on_every_rank" => {
            let b = check(MpiBroadcaster::new(world.duplicate()), "build");
            let cx = lens_testkit::conformance::sample_context();
            let got = check(blocking::broadcast_context(&b, 1, &cx), "broadcast_context")
                .expect("a carrier");
            assert_eq!(got.source_rank(), Some(1));
            assert!(got.span_context().is_some());
        }
        "slab_size_mismatch" => {
            // Rank 0 (the root) uses 256-byte slabs, rank 1 128-byte ones; the root's slab
            // message fits in rank 1's, whose header check names the difference.
            let size = if me == 0 { 256 } else { 128 };
            // Measuring the ways (the default) finds it first, on every rank.
            match MpiBroadcaster::builder(world.duplicate())
                .slab_size(size)
                .build()
            {
                Err(Error::Mismatch {
                    about: Disagreement::SlabSize,
                    reason,
                }) => assert!(
                    reason.contains("128-byte to 256-byte")
                        && reason.contains("LENS_MPI_SLAB_SIZE"),
                    "{reason}"
                ),
                other => panic!("rank {me}: expected a mismatch at build, got {other:?}"),
            }
            // With the way named, the first round's header check names it.
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .slab_size(size)
                    .transfer(Transfer::Direct)
                    .build(),
                "build",
            );
            let got = blocking::broadcast(&b, 0, (me == 0).then_some(&b"short"[..]));
            match (me, got) {
                (0, Ok(bytes)) => assert_eq!(bytes, b"short"),
                (
                    1,
                    Err(Error::Mismatch {
                        about: Disagreement::SlabSize,
                        reason,
                    }),
                ) => {
                    assert!(
                        reason.contains("256-byte") && reason.contains("128-byte"),
                        "{reason}"
                    );
                    // And the group refuses later rounds.
                    assert!(matches!(
                        blocking::broadcast(&b, 0, None),
                        Err(Error::Closed { .. })
                    ));
                }
                (rank, other) => panic!("rank {rank}: unexpected {other:?}"),
            }
        }
        "clock_under_faketime" => {
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .arrivals_every(1)
                    .build(),
                "build",
            );
            let table = check(lens_core::measure_clock_offsets(&b, 0, 16), "clock offsets");
            let c = table[1];
            println!(
                "rank 1 under faketime +2.5 s: offset {} ns, error bound {} ns",
                c.offset_ns, c.error_ns
            );
            assert!(
                (c.offset_ns - 2_500_000_000).abs() < 1_000_000,
                "offset {c:?}"
            );
            assert!(c.error_ns < 1_000_000, "error bound {c:?}");
            // Arrival times are wall clocks: 2.5 s apart until each rank takes its offset
            // off, then as close as the ranks came.
            let step = |b: &MpiBroadcaster| {
                let _ = b.take_arrivals();
                check(
                    blocking::broadcast(b, 0, (me == 0).then_some(&b"step"[..])),
                    "round",
                );
                b.take_arrivals()
            };
            if let Some(a) = step(&b) {
                assert!(a.spread_ns > 2_000_000_000, "clocks 2.5 s apart: {a:?}");
            }
            b.set_clock_offset(table[usize::try_from(me).unwrap_or(0)]);
            if let Some(a) = step(&b) {
                println!("with offsets taken off: spread {} ns", a.spread_ns);
                assert!(a.spread_ns < 100_000_000, "offsets taken off: {a:?}");
            }
        }
        "transfer_measured" => {
            // The default measures each way and keeps the fastest, the same on every rank.
            let b = check(MpiBroadcaster::new(world.duplicate()), "build");
            let measured = b.transfer_measured();
            let tried: Vec<Transfer> = measured.iter().map(|(t, _)| *t).collect();
            assert!(
                tried.contains(&Transfer::Direct) && tried.contains(&Transfer::Ibcast),
                "{measured:?}"
            );
            // The fastest, or direct sends while within 10 % of it.
            let fastest = measured.iter().map(|(_, d)| *d).min().expect("measured");
            let best = match measured.iter().find(|(t, _)| *t == Transfer::Direct) {
                Some((_, d)) if d.as_nanos() * 100 <= fastest.as_nanos() * 110 => Transfer::Direct,
                _ => measured
                    .iter()
                    .find(|(_, d)| *d == fastest)
                    .map(|(t, _)| *t)
                    .expect("measured"),
            };
            assert_eq!(b.transfer(), best, "{measured:?}");
            let index = tried.iter().position(|t| *t == best).expect("tried");
            let mut every = vec![0i32; usize::try_from(world.size()).expect("size")];
            world.all_gather_into(&i32::try_from(index).expect("small"), &mut every[..]);
            assert!(
                every.iter().all(|&i| i == every[0]),
                "ranks disagree: {every:?}"
            );
            if me == 0 {
                println!("measured: {measured:?}, kept {best:?}");
            }
            check(
                futures::executor::block_on(run_rank(&b, &Options::default().rounds(100))),
                "conformance",
            );
            // A way named outright is used as named, and nothing is measured.
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .transfer(Transfer::Ibcast)
                    .build(),
                "build",
            );
            assert_eq!(
                (b.transfer(), b.transfer_measured()),
                (Transfer::Ibcast, &[][..])
            );
            check(
                futures::executor::block_on(run_rank(&b, &Options::default().rounds(20))),
                "conformance",
            );
        }
        "settings_from_the_environment" => {
            let b = check(
                MpiBroadcasterBuilder::from_env(world.duplicate()).build(),
                "build",
            );
            assert_eq!((b.slab_size(), b.max_payload()), (64, 1000));
            assert!(!b.direct_sends(), "LENS_MPI_DIRECT_MAX=1 was read");
            assert!(!b.persistent_broadcasts(), "LENS_MPI_PERSISTENT=0 was read");
            // Over the 48-byte capacity: the remainder travels in a second collective.
            let want = pattern(0, 0, 900);
            let got = check(
                blocking::broadcast(&b, 0, (me == 0).then_some(want.as_slice())),
                "round",
            );
            assert_eq!(got, want);
            // Code overrides the environment.
            let b = check(
                MpiBroadcasterBuilder::from_env(world.duplicate())
                    .slab_size(256)
                    .persistent(true)
                    .build(),
                "build",
            );
            assert_eq!(b.slab_size(), 256);
            assert!(b.persistent_broadcasts());
            let b = check(
                MpiBroadcasterBuilder::from_env(world.duplicate())
                    .direct_up_to(2)
                    .build(),
                "build",
            );
            assert!(b.direct_sends());
            // Over the slab again, now through direct sends.
            let got = check(
                blocking::broadcast(&b, 1, (me == 1).then_some(want.as_slice())),
                "round",
            );
            assert_eq!(got, want);
            // The same settings from a lookup of its own instead of the process's variables.
            let vars = |k: &str| match k {
                lens_mpi::env::SLAB_SIZE => Some("128".to_owned()),
                lens_mpi::env::TRANSFER => Some("ibcast".to_owned()),
                _ => None,
            };
            let b = check(
                MpiBroadcasterBuilder::from_vars(world.duplicate(), vars).build(),
                "build",
            );
            assert_eq!(
                (b.slab_size(), b.max_payload()),
                (128, lens_core::DEFAULT_MAX_PAYLOAD)
            );
            assert_eq!(
                b.transfer(),
                lens_mpi::Transfer::Ibcast,
                "the lookup's way was read"
            );
        }
        "rank_that_never_builds_times_out" => {
            // Rank 1 takes part in the communicator's duplication but never builds a
            // broadcaster: rank 0's build must fail at its deadline, not hang.
            let comm = world.duplicate();
            if me == 1 {
                std::thread::sleep(Duration::from_secs(20));
                std::process::exit(0);
            }
            let started = Instant::now();
            match MpiBroadcaster::builder(comm)
                .timeout(Duration::from_secs(1))
                .build()
            {
                Err(Error::Timeout { .. }) if started.elapsed() < Duration::from_secs(5) => {
                    println!(
                        "rank 0 timed out as expected after {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                    // A barrier is pending: leave without finalising, the launcher ends the job.
                    std::process::exit(3);
                }
                other => panic!(
                    "rank 0: expected a timeout within 5 s, got {:?}",
                    other.map(|_| ())
                ),
            }
        }
        "absent_rank_is_named_by_every_rank" => {
            // Rank 3 stops taking part after the first round. The others time out (rank 0
            // and the rest in different rounds, maybe), and the roll call that follows
            // makes every one of them name rank 3: rank 0 itself, the others through it.
            use mpi::collective::SystemOperation;
            use mpi::topology::Color;
            let colour = if me == 3 {
                Color::undefined()
            } else {
                Color::with_value(0)
            };
            let live = world.split_by_color(colour);
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .timeout(Duration::from_secs(1))
                    .arrivals_every(1)
                    .build(),
                "build",
            );
            check(
                blocking::broadcast(&b, 0, (me == 0).then_some(&b"first"[..])),
                "first round",
            );
            if me == 3 {
                std::thread::sleep(Duration::from_secs(30));
                std::process::exit(0);
            }
            // Each report runs the flush hook once: one timeout, one report.
            let reports = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = std::sync::Arc::clone(&reports);
            lens_core::hang::set_flush(Box::new(move || {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }));
            let mut failed = None;
            for _ in 0..3 {
                if let Err(e) = blocking::broadcast(&b, 0, (me == 0).then_some(&b"step"[..])) {
                    failed = Some(e);
                    break;
                }
            }
            let path: Vec<usize> = if me == 0 { Vec::new() } else { vec![0] };
            let reported = reports.load(std::sync::atomic::Ordering::Relaxed);
            let named = reported == 1
                && matches!(
                    &failed,
                    Some(Error::Timeout { missing, via, .. }) if missing == &vec![3] && via == &path
                );
            println!(
                "rank {me}: {failed:?}; names rank 3 through {path:?}, {reported} hang report(s): {named}"
            );
            // The live ranks count how many named rank 3 as they should.
            let live = live.expect("ranks 0 to 2 have a colour");
            let mine = i32::from(named);
            if me == 0 {
                let mut all = 0i32;
                live.process_at_rank(0)
                    .reduce_into_root(&mine, &mut all, SystemOperation::sum());
                if all == 3 {
                    println!("every live rank timed out as expected, naming rank 3");
                }
            } else {
                live.process_at_rank(0)
                    .reduce_into(&mine, SystemOperation::sum());
            }
            // Rank 0 has printed its verdict before any live rank leaves (the launcher ends
            // the job at the first rank that exits non-zero, which could cut it off).
            use mpi::collective::CommunicatorCollectives as _;
            live.barrier();
            // Collectives are pending on the broadcaster's communicator: leave without
            // finalising, the launcher ends the job.
            std::process::exit(3);
        }
        "skipped_call_times_out" => {
            let b = check(
                MpiBroadcaster::builder(world.duplicate())
                    .timeout(Duration::from_secs(1))
                    .build(),
                "build",
            );
            check(
                blocking::broadcast(&b, 1, (me == 1).then_some(&b"first"[..])),
                "first round",
            );
            if me == 1 {
                // Rank 1 skips the next round and waits; rank 0 must not hang.
                std::thread::sleep(Duration::from_secs(20));
                std::process::exit(0);
            }
            let started = Instant::now();
            match blocking::broadcast(&b, 1, None) {
                Err(Error::Timeout { after, .. }) if after < Duration::from_secs(5) => {
                    // A second call is refused rather than reusing a broken communicator.
                    assert!(matches!(
                        blocking::broadcast(&b, 0, Some(b"x")),
                        Err(Error::Closed { .. })
                    ));
                    println!(
                        "rank 0 timed out as expected after {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                    // Exit without finalising (a collective is pending): the launcher ends the job.
                    std::process::exit(3);
                }
                other => {
                    eprintln!("lens-mpi case failed: expected a timeout, got {other:?}");
                    std::process::exit(2);
                }
            }
        }
        other => {
            eprintln!("unknown case {other}");
            std::process::exit(2);
        }
    }
    world.barrier();
    if me == 0 {
        println!("lens-mpi case ok: {case}");
    }
}
