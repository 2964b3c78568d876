//! The slab round on simulated GPUs, the deadlines and the NCCL error mapping.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lens_core::{Broadcaster, Error, Result, blocking};
use lens_testkit::conformance::{Options, pattern, run_threads};
use lens_testkit::on_each_rank as on_each;

use crate::bootstrap::with_deadline;
use crate::error::nccl_err;
use crate::sim::{SimFault, SimGpu, SimLog, SimWorld};
use crate::*;

type Logs = Vec<Arc<Mutex<SimLog>>>;

/// A simulated group: one rank per slab size, each with its fault.
fn group(slabs: &[usize], faults: &[SimFault], timeout: Duration) -> (Vec<NcclBroadcaster>, Logs) {
    let world = SimWorld::new(slabs.len());
    slabs
        .iter()
        .enumerate()
        .map(|(rank, &slab)| {
            let fault = faults.get(rank).copied().unwrap_or(SimFault::None);
            let (gpu, log) = SimGpu::new(&world, rank, slab, fault);
            let opts = NcclOptions::default().slab_size(slab).timeout(timeout);
            let b = NcclBroadcaster::from_device(Box::new(gpu), rank, slabs.len(), &opts)
                .expect("a simulated rank");
            (b, log)
        })
        .unzip()
}

fn aborted(log: &Arc<Mutex<SimLog>>) -> bool {
    log.lock()
        .expect("no thread panicked holding the log")
        .aborted
}

#[test]
fn conformance_on_simulated_gpus() {
    // (why, slab size of every rank, ranks)
    let rows = [
        ("one rank, as on a single-GPU machine", DEFAULT_SLAB_SIZE, 1),
        ("two ranks, default slab", DEFAULT_SLAB_SIZE, 2),
        ("four ranks, default slab", DEFAULT_SLAB_SIZE, 4),
        (
            "one-byte slab: nearly every payload spills",
            SLAB_HEADER + 1,
            3,
        ),
        (
            "large slab: nothing spills below 4 KiB",
            SLAB_HEADER + 4096,
            2,
        ),
    ];
    for (why, slab, n) in rows {
        let (ranks, logs) = group(&vec![slab; n], &[], Duration::from_secs(20));
        if let Err(f) = run_threads(&ranks, &Options::default().rounds(200)) {
            panic!("{why}: {f:#?}");
        }
        assert!(!logs.iter().any(aborted), "{why}: nothing may abort");
    }
}

#[test]
fn spill_buffer_is_kept_between_rounds() {
    let (ranks, logs) = group(&[DEFAULT_SLAB_SIZE; 2], &[], Duration::from_secs(20));
    on_each(&ranks, |b| {
        let raw = pattern(0, 0, 1000);
        let big = pattern(1, 0, 5000);
        for _ in 0..50 {
            let got = b
                .raw_broadcast(0, (b.rank() == 0).then_some(&raw[..]), raw.len())
                .expect("the raw NCCL round succeeds");
            assert_eq!(got, raw);
            let got = blocking::broadcast(b, 0, (b.rank() == 0).then_some(&big[..]))
                .expect("the lens round succeeds");
            assert_eq!(got, big);
        }
    });
    for log in &logs {
        // One allocation for the raw 1,000 bytes, one when the 5,000-byte payload's
        // remainder outgrew it; none per round.
        assert_eq!(
            log.lock()
                .expect("no thread panicked holding the log")
                .allocations,
            2
        );
    }
}

#[test]
fn a_rank_that_never_calls_times_out_the_others_and_they_abort() {
    let timeout = Duration::from_millis(300);
    let (ranks, logs) = group(&[DEFAULT_SLAB_SIZE; 3], &[], timeout);
    let got = on_each(&ranks[..2], |b| {
        let t = Instant::now();
        let r = blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]));
        (r, t.elapsed())
    });
    for (rank, (r, took)) in got.into_iter().enumerate() {
        assert!(
            matches!(r, Err(Error::Timeout { .. })),
            "rank {rank}: {r:?}"
        );
        assert!(
            took >= timeout && took < timeout * 10,
            "rank {rank} took {took:?}"
        );
        assert!(
            aborted(&logs[rank]),
            "rank {rank} must abort its communicator"
        );
        let again = blocking::broadcast(&ranks[rank], 0, (rank == 0).then_some(&b"x"[..]));
        assert!(
            matches!(again, Err(Error::Closed { .. })),
            "rank {rank}: {again:?}"
        );
    }
    assert!(!aborted(&logs[2]));
}

#[test]
fn a_failed_upload_fails_the_root_and_closes_it() {
    let (ranks, logs) = group(
        &[DEFAULT_SLAB_SIZE; 2],
        &[SimFault::FailUpload(1)],
        Duration::from_millis(300),
    );
    let got = on_each(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]))
    });
    match &got[0] {
        Err(Error::Transport { message, .. }) => {
            assert!(message.contains("upload"), "{message}")
        }
        other => panic!("root: expected the upload's error, got {other:?}"),
    }
    assert!(matches!(got[1], Err(Error::Timeout { .. })), "{:?}", got[1]);
    assert!(aborted(&logs[0]) && aborted(&logs[1]));
    match blocking::broadcast(&ranks[0], 0, Some(b"again")) {
        Err(Error::Closed { reason, .. }) => assert!(reason.contains("upload"), "{reason}"),
        other => panic!("expected Closed naming the first failure, got {other:?}"),
    }
}

#[test]
fn ranks_with_different_slabs_are_told_and_stop() {
    let (ranks, logs) = group(
        &[DEFAULT_SLAB_SIZE, 2 * DEFAULT_SLAB_SIZE],
        &[],
        Duration::from_secs(5),
    );
    let got = on_each(&ranks, |b| {
        blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"ctx"[..]))
    });
    assert_eq!(got[0].as_deref().ok(), Some(&b"ctx"[..]));
    assert!(
        matches!(got[1], Err(Error::Mismatch { .. })),
        "{:?}",
        got[1]
    );
    assert!(aborted(&logs[1]));
    assert!(matches!(
        blocking::broadcast(&ranks[1], 0, None),
        Err(Error::Closed { .. })
    ));
}

#[test]
fn nccl_failures_keep_their_result_code() {
    use cudarc::nccl::sys::ncclResult_t;
    use std::error::Error as _;
    let e = nccl_err(
        "ncclBroadcast",
        cudarc::nccl::result::NcclError(ncclResult_t::ncclInternalError),
    );
    let kept = e
        .source()
        .and_then(|s| s.downcast_ref::<NcclResult>())
        .expect("the NCCL result is the source");
    assert_eq!(kept.code, 3);
    // The printed chain (as Python and `{:#}` reports show it) says the call and the
    // result once each.
    let chain = format!("{e}: {kept}");
    assert_eq!(chain.matches("ncclBroadcast").count(), 1, "{chain}");
    assert_eq!(
        chain.matches("ncclInternalError (code 3)").count(),
        1,
        "{chain}"
    );
}

#[test]
fn a_stuck_init_is_a_timeout_not_a_hang() {
    let t = Instant::now();
    let r: Result<()> = with_deadline("stuck", Duration::from_millis(200), || {
        std::thread::sleep(Duration::from_secs(30));
        Ok(())
    });
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(
        with_deadline("quick", Duration::from_secs(5), || Ok(7)).ok(),
        Some(7)
    );
    let r: Result<()> = with_deadline("failing", Duration::from_secs(5), || {
        Err(Error::config("no device"))
    });
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
    let r: Result<()> = with_deadline("panicking", Duration::from_secs(5), || {
        panic!("as cudarc does without a library")
    });
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
}

#[test]
fn bad_arguments_are_errors_before_any_work() {
    let rows = [
        (
            "slab no larger than the header",
            NcclOptions::default().slab_size(SLAB_HEADER),
        ),
        ("empty slab", NcclOptions::default().slab_size(0)),
        (
            "zero timeout",
            NcclOptions::default().timeout(Duration::ZERO),
        ),
        (
            "zero init timeout",
            NcclOptions::default().init_timeout(Duration::ZERO),
        ),
    ];
    for (why, opts) in rows {
        assert!(matches!(opts.check(), Err(Error::Config { .. })), "{why}");
    }
    assert!(NcclOptions::default().check().is_ok());
    // Bad options are refused before the id exchange, so no rank waits on this one.
    let one = lens_testkit::LocalCluster::new(1).broadcasters();
    let r = futures::executor::block_on(NcclBroadcaster::bootstrap_with(
        &one[0],
        0,
        &NcclOptions::default().slab_size(1),
    ));
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
    let (ranks, logs) = group(&[DEFAULT_SLAB_SIZE], &[], Duration::from_secs(1));
    let r = ranks[0].raw_broadcast(0, Some(b"four"), 3);
    assert!(matches!(r, Err(Error::Config { .. })), "{r:?}");
    let r = ranks[0].raw_broadcast(1, Some(b"four"), 4);
    assert!(matches!(r, Err(Error::InvalidRoot { .. })), "{r:?}");
    assert!(
        !aborted(&logs[0]),
        "a rejected call must not break the group"
    );
    assert_eq!(
        ranks[0]
            .raw_broadcast(0, Some(b"four"), 4)
            .expect("the raw NCCL round succeeds"),
        b"four"
    );
}

#[test]
fn gathered_arrivals_name_the_straggler_on_any_root() {
    let world = SimWorld::new(3);
    let ranks: Vec<NcclBroadcaster> = (0..3)
        .map(|rank| {
            let (gpu, _) = SimGpu::new(&world, rank, DEFAULT_SLAB_SIZE, SimFault::None);
            let opts = NcclOptions::default()
                .timeout(Duration::from_secs(20))
                .arrivals_every(2);
            NcclBroadcaster::from_device(Box::new(gpu), rank, 3, &opts).expect("a simulated rank")
        })
        .collect();
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(50)) {
        panic!("conformance with arrivals gathered: {f:#?}");
    }
    // (why, root, late rank)
    let rows = [("rank 0 the root", 0, 2), ("rank 1 the root", 1, 0)];
    for (why, root, late) in rows {
        for b in &ranks {
            let _ = b.take_arrivals(); // what earlier rounds left
        }
        // Two rounds, so one of them gathers whatever the count so far.
        for _ in 0..2 {
            let got = on_each(&ranks, |b| {
                if b.rank() == late {
                    std::thread::sleep(Duration::from_millis(40));
                }
                blocking::broadcast(b, root, (b.rank() == root).then_some(&b"step"[..]))
            });
            for g in got {
                assert_eq!(g.expect(why), b"step", "{why}");
            }
        }
        let a = ranks[root].take_arrivals().expect(why);
        assert_eq!(a.last_rank, late, "{why}: {a:?}");
        assert!(a.spread_ns >= 30_000_000, "{why}: {a:?}");
        for (rank, b) in ranks.iter().enumerate() {
            if rank != root {
                assert!(
                    b.take_arrivals().is_none(),
                    "{why}: only the root holds them"
                );
            }
        }
    }
}
