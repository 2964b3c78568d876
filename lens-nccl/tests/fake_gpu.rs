//! The NCCL backend's real code path (probe, cudarc, device slab, events, abort, bench) on the
//! testkit's fake CUDA driver and NCCL. The loader reads `LD_LIBRARY_PATH` at start-up, so
//! the parent test builds the fake and runs this test binary again with it; the `in_fake_*`
//! tests are that child's work and are ignored when run on their own.
#![allow(clippy::print_stdout)]
// The raw-handle constructor is unsafe by nature; the tests call it as an application would.
#![allow(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use lens_core::{Broadcaster, Error, Hierarchical, NodeLayout, blocking};
use lens_nccl::cudarc::driver::{CudaContext, CudaStream};
use lens_nccl::cudarc::nccl::{Comm, result as nccl};
use lens_nccl::{NcclBroadcaster, NcclOptions, probe};
use lens_tcp::TcpBroadcaster;
use lens_testkit::conformance::{Options, pattern, run_threads};
use lens_testkit::fake_gpu::{DEVICES_VAR, FakeGpu, NCCL_VERSION};
use lens_testkit::process::Supervised;
use lens_testkit::{LocalCluster, on_each_rank as on_each};

#[test]
fn fake_gpu_driver() {
    let fake = FakeGpu::build(2).expect("build the fake CUDA/NCCL (needs a C compiler)");
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    fake.apply(&mut cmd)
        .args(["--ignored", "--test-threads=1", "--nocapture", "in_fake_"])
        .stdin(Stdio::null());
    let done = Supervised::spawn(&mut cmd, Duration::from_secs(120))
        .expect("start the child")
        .wait();
    let (stdout, stderr) = (&done.stdout, &done.stderr);
    assert!(
        !done.timed_out,
        "the fake-GPU child ran past its 120 s deadline:\n{stdout}\n{stderr}"
    );
    assert!(done.success(), "child failed:\n{stdout}\n{stderr}");
    // Every child test ran (none filtered away by a rename).
    assert!(
        stdout.contains("test result: ok. 9 passed"),
        "expected the 9 in_fake_ tests to pass:\n{stdout}"
    );
}

fn in_child() {
    assert!(
        std::env::var_os(DEVICES_VAR).is_some(),
        "run by fake_gpu_driver, not on its own"
    );
}

/// A group of `n` ranks (threads) bootstrapped over the local backend, rank r on GPU r.
fn group(n: usize, opts: &NcclOptions) -> Vec<NcclBroadcaster> {
    let ranks = LocalCluster::new(n).broadcasters();
    on_each(&ranks, |b| {
        futures::executor::block_on(NcclBroadcaster::bootstrap_with(b, b.rank(), opts))
            .expect("bootstrap")
    })
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_probe_finds_the_fake() {
    in_child();
    let p = probe().expect("probe");
    assert_eq!((p.devices, p.nccl_version), (2, NCCL_VERSION), "{p:?}");
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_two_gpus_pass_conformance() {
    in_child();
    for slab in [lens_nccl::DEFAULT_SLAB_SIZE, lens_nccl::SLAB_HEADER + 1] {
        let ranks = group(2, &NcclOptions::default().slab_size(slab));
        if let Err(f) = run_threads(&ranks, &Options::default().rounds(300)) {
            panic!("slab {slab}: {f:#?}");
        }
        // The raw baseline moves the same bytes.
        let want = pattern(9, 1, 700);
        let got = on_each(&ranks, |b| {
            b.raw_broadcast(1, (b.rank() == 1).then_some(&want[..]), want.len())
        });
        for g in got {
            assert_eq!(g.expect("raw"), want);
        }
    }
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_gathered_arrivals_name_the_straggler() {
    in_child();
    let ranks = group(2, &NcclOptions::default().arrivals_every(1));
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(100)) {
        panic!("conformance with arrivals gathered: {f:#?}");
    }
    for root in [0, 1] {
        let late = 1 - root;
        let got = on_each(&ranks, |b| {
            if b.rank() == late {
                std::thread::sleep(Duration::from_millis(40));
            }
            blocking::broadcast(b, root, (b.rank() == root).then_some(&b"step"[..]))
        });
        for g in got {
            assert_eq!(g.expect("round"), b"step");
        }
        // One ncclAllGather per round carried both entry times to the root.
        let a = ranks[root].take_arrivals().expect("the root's arrivals");
        assert_eq!(a.last_rank, late, "root {root}: {a:?}");
        assert!(a.spread_ns >= 30_000_000, "root {root}: {a:?}");
    }
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_missing_rank_times_out_aborts_and_closes() {
    in_child();
    let timeout = Duration::from_millis(300);
    let ranks = group(2, &NcclOptions::default().timeout(timeout));
    // Each hang report runs the flush hook once: one timeout, one report.
    let reports = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&reports);
    let hook = lens_core::hang::set_flush(Box::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }));
    let t = Instant::now();
    let r = blocking::broadcast(&ranks[0], 0, Some(b"ctx"));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(
        reports.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one lens.hang for one timeout"
    );
    lens_core::hang::clear_flush(hook);
    assert!(
        t.elapsed() >= timeout && t.elapsed() < 10 * timeout,
        "{:?}",
        t.elapsed()
    );
    match blocking::broadcast(&ranks[0], 0, Some(b"ctx")) {
        Err(Error::Closed { reason, .. }) => assert!(reason.contains("timed out"), "{reason}"),
        other => panic!("expected Closed after the abort, got {other:?}"),
    }
    // Dropping the aborted rank and the idle one neither hangs nor panics.
    drop(ranks);
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_init_without_the_peers_times_out() {
    in_child();
    // World of 2 but only rank 0 ever joins NCCL: its init must give up at the deadline.
    let two = LocalCluster::new(2).broadcasters();
    let opts = NcclOptions::default().init_timeout(Duration::from_millis(500));
    let t = Instant::now();
    let got = std::thread::scope(|s| {
        let root = s.spawn(|| {
            futures::executor::block_on(NcclBroadcaster::bootstrap_with(&two[0], 0, &opts))
        });
        // Rank 1 takes the id but never initialises NCCL.
        let id = futures::executor::block_on(lens_nccl::exchange_id(&two[1], || {
            unreachable!("rank 1 does not make the id")
        }));
        assert!(id.is_ok(), "{id:?}");
        root.join().expect("rank 0")
    });
    assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_bench_runs_on_every_gpu() {
    in_child();
    // The bench's group: one rank per GPU in this process, raw and lens rounds interleaved.
    let ranks = NcclBroadcaster::on_every_device(&NcclOptions::default()).expect("every GPU");
    assert_eq!(ranks.len(), 2);
    let carrier = lens_core::Carrier::from_context(&lens_testkit::conformance::sample_context());
    let bytes = carrier.encode();
    let got = lens_testkit::on_each_rank(&ranks, |b| {
        let root = b.rank() == 0;
        for _ in 0..50 {
            let raw = b
                .raw_broadcast(0, root.then_some(&bytes[..]), bytes.len())
                .expect("raw");
            assert_eq!(raw, bytes);
            let cx = if root {
                lens_testkit::conformance::sample_context()
            } else {
                opentelemetry::Context::new()
            };
            let lens = lens_core::blocking::broadcast_context(b, 0, &cx).expect("lens");
            assert_eq!(lens.as_ref(), Some(&carrier));
        }
        b.rank()
    });
    assert_eq!(got, [0, 1]);
    // A device that does not exist is an error, not a panic.
    let one = LocalCluster::new(1).broadcasters();
    let r = futures::executor::block_on(NcclBroadcaster::bootstrap(&one[0], 5));
    assert!(r.is_err(), "device 5 of 2 must fail");
}

/// Two TCP ranks on loopback (the node leaders).
fn tcp_pair() -> Vec<TcpBroadcaster> {
    lens_tcp::loopback_group(2, |b| {
        b.key("fake-gpu-test-key-0123456789")
            .timeout(Duration::from_secs(10))
    })
    .expect("two TCP ranks")
    .ranks
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_hierarchical_nccl_nodes_with_tcp_leaders() {
    in_child();
    // Two nodes of two GPUs: NCCL inside each node, TCP between the node leaders.
    let layout = NodeLayout::uniform(4, 2).expect("layout");
    let nodes = (0..2).map(|_| group(2, &NcclOptions::default())).collect();
    let ranks: Vec<Arc<dyn Broadcaster>> = Hierarchical::assemble(&layout, nodes, tcp_pair())
        .expect("hierarchical")
        .into_iter()
        .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
        .collect();
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(200)) {
        panic!("{f:#?}");
    }
}

/// One stream per fake GPU and an NCCL group over them, as an application would make them.
fn app_group(n: usize) -> (Vec<Arc<CudaStream>>, Vec<Comm>) {
    let streams: Vec<_> = (0..n)
        .map(|d| {
            CudaContext::new(d)
                .and_then(|c| c.new_stream())
                .expect("stream")
        })
        .collect();
    let comms = Comm::from_devices(streams.clone()).expect("ncclCommInitAll");
    (streams, comms)
}

/// The application's own broadcast from rank 0 queues on every one of `comms` (none was
/// aborted by lens). Buffers are dropped only once every rank has queued.
fn app_broadcast_works(comms: &[&Comm]) -> Vec<bool> {
    let mut bufs: Vec<_> = comms
        .iter()
        .map(|c| c.stream().alloc_zeros::<u8>(8).expect("alloc"))
        .collect();
    comms
        .iter()
        .zip(&mut bufs)
        .map(|(c, b)| c.broadcast_in_place(b, 0).is_ok())
        .collect()
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_shared_communicator_stays_the_applications() {
    in_child();
    let (_streams, comms) = app_group(2);
    let comms: Vec<Arc<Comm>> = comms.into_iter().map(Arc::new).collect();
    let ranks: Vec<_> = comms
        .iter()
        .map(|c| {
            // SAFETY: this test calls NCCL on the communicators only while no round runs.
            unsafe { NcclBroadcaster::from_shared(c.clone(), &NcclOptions::default()) }
                .expect("wrap")
        })
        .collect();
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(100)) {
        panic!("{f:#?}");
    }
    drop(ranks);
    // Both ranks queue the application's next collective (the fake queues without blocking,
    // so one thread can do both): neither communicator was aborted.
    let ok = app_broadcast_works(&[&comms[0], &comms[1]]);
    assert_eq!(ok, [true, true]);

    // A timed-out round leaves the shared communicator to the application, not aborted.
    // SAFETY: as above.
    let lone = unsafe {
        NcclBroadcaster::from_shared(
            comms[0].clone(),
            &NcclOptions::default().timeout(Duration::from_millis(200)),
        )
    }
    .expect("wrap");
    let r = blocking::broadcast(&lone, 0, Some(b"ctx"));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(matches!(
        blocking::broadcast(&lone, 0, Some(b"ctx")),
        Err(Error::Closed { .. })
    ));
    drop(lone);
    assert_eq!(
        app_broadcast_works(&[&comms[0]]),
        [true],
        "lens must not abort a shared communicator"
    );
}

#[test]
#[ignore = "runs inside fake_gpu_driver's child process, with the fake on its loader path"]
fn in_fake_raw_handles_from_another_runtime() {
    in_child();
    // Raw handles, as PyTorch would hand them over: a communicator and a stream per GPU.
    let streams: Vec<_> = (0..2)
        .map(|d| {
            CudaContext::new(d)
                .and_then(|c| c.new_stream())
                .expect("stream")
        })
        .collect();
    let mut raw = vec![std::ptr::null_mut(); 2];
    // SAFETY: two slots for two communicators, devices 0 and 1 exist in the fake.
    unsafe { nccl::comm_init_all(raw.as_mut_ptr(), 2, [0, 1].as_ptr()) }.expect("init");
    let ranks: Vec<_> = raw
        .iter()
        .zip(&streams)
        .map(|(&c, s)| {
            // SAFETY: valid handles that outlive the broadcasters; used from one thread at a
            // time.
            unsafe { NcclBroadcaster::from_raw(c, s.cu_stream(), &NcclOptions::default()) }
                .expect("wrap")
        })
        .collect();
    assert_eq!(
        ranks
            .iter()
            .map(|b| (b.rank(), b.world_size()))
            .collect::<Vec<_>>(),
        [(0, 2), (1, 2)],
        "rank and world size come from the communicator"
    );
    if let Err(f) = run_threads(&ranks, &Options::default().rounds(100)) {
        panic!("{f:#?}");
    }
    drop(ranks);
    for c in raw {
        // SAFETY: the handle is still valid: lens neither aborted nor destroyed it.
        let n = unsafe { nccl::comm_count(c) }.expect("the communicator is still alive");
        assert_eq!(n, 2);
        // SAFETY: the application ends what it made.
        unsafe { nccl::comm_abort(c) }.expect("abort");
    }
}
