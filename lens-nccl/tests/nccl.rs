//! NCCL backend: what runs everywhere (no panic without CUDA, the id exchange) and what
//! needs a GPU (ignored here; `scripts/gpu-check.sh` runs those with `--ignored`).
// The GPU tests print what they measured for gpu-check.sh.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use lens_core::{Broadcaster, Error, blocking};
use lens_nccl::{ID_LEN, NcclBroadcaster, exchange_id, probe};
use lens_testkit::conformance::{Options, pattern, run_rank, run_threads};
use lens_testkit::{LocalCluster, on_each_rank as on_each};

#[test]
fn id_reaches_every_rank() {
    let ranks = LocalCluster::new(4).broadcasters();
    let id: [u8; ID_LEN] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    let got = on_each(&ranks, |b| {
        futures::executor::block_on(exchange_id(b, || Ok(id)))
    });
    for g in got {
        assert_eq!(g.expect("id"), id);
    }
}

#[test]
fn rank_zero_failure_reaches_every_rank() {
    let ranks = LocalCluster::new(3).broadcasters();
    let got = on_each(&ranks, |b| {
        futures::executor::block_on(exchange_id(b, || {
            Err(Error::Unavailable {
                backend: "nccl",
                reason: "no GPU in this test".into(),
            })
        }))
    });
    assert!(matches!(&got[0], Err(Error::Unavailable { .. })));
    for g in &got[1..] {
        match g {
            Err(Error::Unavailable { reason, .. }) => assert!(
                reason.contains("rank 0") && reason.contains("no GPU in this test"),
                "{reason}"
            ),
            other => panic!("expected rank 0's reason, got {other:?}"),
        }
    }
}

#[test]
fn malformed_id_message_is_corrupt() {
    let ranks = LocalCluster::new(2).broadcasters();
    let got = on_each(&ranks, |b| {
        if b.rank() == 0 {
            // Not an id message: a stray broadcast of the wrong shape.
            blocking::broadcast(b, 0, Some(&[1, 2, 3])).map(|_| [0u8; ID_LEN])
        } else {
            futures::executor::block_on(exchange_id(b, || unreachable!("only rank 0 makes the id")))
        }
    });
    assert!(matches!(got[1], Err(Error::Corrupt { .. })), "{:?}", got[1]);
}

#[test]
fn bootstrap_never_panics() {
    let ranks = LocalCluster::new(2).broadcasters();
    // Without CUDA every rank is told why; with a GPU, a device index that does not exist
    // must be an error too.
    let device = probe().map_or(0, |p| p.devices + 7);
    let got = on_each(&ranks, |b| {
        futures::executor::block_on(NcclBroadcaster::bootstrap(b, device))
    });
    for (rank, g) in got.iter().enumerate() {
        match (probe(), g) {
            (Err(_), Err(Error::Unavailable { reason, .. })) => {
                assert!(!reason.is_empty(), "rank {rank}");
            }
            (Ok(_), Err(_)) => {}
            (_, other) => panic!("rank {rank}: expected an error, got {other:?}"),
        }
    }
}

/// Joins a one-rank NCCL group on GPU 0 (NCCL refuses two ranks on one GPU).
fn single_gpu() -> NcclBroadcaster {
    let p = probe().expect("CUDA and NCCL");
    println!(
        "gpu-check: {} device(s), NCCL {}, {} / {}",
        p.devices, p.nccl_version, p.cuda_library, p.nccl_library
    );
    let one = LocalCluster::new(1).broadcasters();
    futures::executor::block_on(NcclBroadcaster::bootstrap(&one[0], 0)).expect("bootstrap on GPU 0")
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL: run by scripts/gpu-check.sh"]
fn gpu_single_rank_conformance() {
    let b = single_gpu();
    futures::executor::block_on(run_rank(&b, &Options::default())).expect("conformance on one GPU");
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL: run by scripts/gpu-check.sh"]
fn gpu_every_local_gpu_conformance() {
    // One rank per GPU, each on its own thread, NCCL's id sent over the local backend.
    let n = probe().expect("CUDA and NCCL").devices;
    let ids = LocalCluster::new(n).broadcasters();
    let ranks = on_each(&ids, |b| {
        futures::executor::block_on(NcclBroadcaster::bootstrap(b, b.rank()))
            .expect("bootstrap on this rank's GPU")
    });
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
        panic!("{n} GPU(s): {f:#?}");
    }
    println!("gpu-check: conformance passed on {n} GPU(s), one rank each");
}

#[test]
#[ignore = "needs a CUDA GPU and NCCL: run by scripts/gpu-check.sh"]
fn gpu_slab_boundaries_and_timings() {
    let b = single_gpu();
    let cap = b.slab_capacity();
    for (i, len) in [0, 1, cap - 1, cap, cap + 1, 3 * cap, 40_000]
        .into_iter()
        .enumerate()
    {
        let want = pattern(i, 0, len);
        assert_eq!(
            blocking::broadcast(&b, 0, Some(&want)).expect("round"),
            want,
            "{len} bytes"
        );
    }
    let cx = lens_testkit::conformance::sample_context();
    let bytes = lens_core::Carrier::from_context(&cx).encode();
    let mut raw = Vec::new();
    let mut lens = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        b.raw_broadcast(0, Some(&bytes), bytes.len()).expect("raw");
        raw.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        blocking::broadcast_context(&b, 0, &cx).expect("lens");
        lens.push(t.elapsed().as_secs_f64() * 1e6);
    }
    raw.sort_by(f64::total_cmp);
    lens.sort_by(f64::total_cmp);
    println!(
        "gpu-check: one rank, {} carrier bytes: raw ncclBroadcast median {:.1} us, broadcast_trace_context median {:.1} us",
        bytes.len(),
        raw[raw.len() / 2],
        lens[lens.len() / 2]
    );
}
