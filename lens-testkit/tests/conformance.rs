//! The conformance suite on the local backend and on `Hierarchical`.

use std::sync::Arc;

use lens_core::{Broadcaster, NodeLayout};
use lens_testkit::conformance::{Options, run_group, run_threads};
use lens_testkit::{Corruption, Fault, Faulty, LocalCluster};

fn as_dyn<B: Broadcaster + 'static>(v: Vec<B>) -> Vec<Arc<dyn Broadcaster>> {
    v.into_iter()
        .map(|b| Arc::new(b) as Arc<dyn Broadcaster>)
        .collect()
}

async fn check(group: Vec<Arc<dyn Broadcaster>>, opts: Options, what: &str) {
    if let Err(failures) = run_group(group, &opts).await {
        panic!(
            "{what}: {} rank(s) failed; first: {}",
            failures.len(),
            failures[0]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend_passes() {
    for n in [1, 2, 3, 8] {
        check(
            as_dyn(LocalCluster::new(n).broadcasters()),
            Options::default(),
            &format!("local n={n}"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend_passes_at_64_ranks() {
    check(
        as_dyn(LocalCluster::new(64).broadcasters()),
        Options::default().rounds(200),
        "local n=64",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hierarchical_passes_for_every_layout() {
    let layouts = [
        NodeLayout::uniform(4, 2).expect("layout"),
        NodeLayout::uniform(1, 1).expect("layout"),
        NodeLayout::uniform(5, 5).expect("layout"),
        NodeLayout::uniform(6, 1).expect("layout"),
        // Uneven and interleaved: node 0 = {0, 3, 5}, node 1 = {4}, node 2 = {1, 2}.
        NodeLayout::new(vec![vec![0, 3, 5], vec![4], vec![1, 2]]).expect("layout"),
    ];
    for layout in layouts {
        let group = LocalCluster::new(1).hierarchical(&layout).expect("group");
        for (rank, b) in group.iter().enumerate() {
            assert_eq!(b.rank(), rank);
            assert_eq!(b.world_size(), layout.world_size());
        }
        check(
            as_dyn(group),
            Options::default(),
            &format!("hierarchical {layout:?}"),
        )
        .await;
    }
}

#[test]
fn hierarchical_rejects_mismatched_groups() {
    use lens_core::{Error, Hierarchical};
    let layout = NodeLayout::uniform(4, 2).expect("layout");
    let mk = |n| LocalCluster::new(n).broadcasters();
    // Local group of the wrong size.
    let r = Hierarchical::new(layout.clone(), 0, mk(3).remove(0), Some(mk(2).remove(0)));
    assert!(matches!(r, Err(Error::Config { .. })));
    // Leader without the leaders group.
    let r = Hierarchical::<_, lens_testkit::LocalBroadcaster>::new(
        layout.clone(),
        0,
        mk(2).remove(0),
        None,
    );
    assert!(matches!(r, Err(Error::Config { .. })));
    // Non-leader with it.
    let r = Hierarchical::new(layout.clone(), 0, mk(2).remove(1), Some(mk(2).remove(0)));
    assert!(matches!(r, Err(Error::Config { .. })));
    // Leaders group rank not the node index.
    let r = Hierarchical::new(layout.clone(), 1, mk(2).remove(0), Some(mk(2).remove(0)));
    assert!(matches!(r, Err(Error::Config { .. })));
    // Bad layouts.
    assert!(NodeLayout::new(vec![vec![0, 1], vec![1]]).is_err());
    assert!(NodeLayout::new(vec![vec![0, 2]]).is_err());
    assert!(NodeLayout::new(vec![vec![0], vec![]]).is_err());
    assert!(NodeLayout::uniform(0, 1).is_err());
}

#[test]
fn run_threads_passes_a_sound_group_and_names_a_broken_rank() {
    let sound = LocalCluster::new(3).broadcasters();
    if let Err(f) = run_threads(&sound, &Options::default().rounds(100)) {
        panic!("a sound local group must pass: {f:#?}");
    }
    // Rank 1 damages every payload it receives: it reports the damage and stops, and the
    // others time out waiting for it in the next round, naming it.
    let ranks: Vec<_> = LocalCluster::new(3)
        .timeout(std::time::Duration::from_millis(300))
        .broadcasters()
        .into_iter()
        .map(|b| {
            let faults = if b.rank() == 1 {
                vec![Fault::Corrupt(Corruption::FlipFirstByte)]
            } else {
                Vec::new()
            };
            Faulty::new(b, faults)
        })
        .collect();
    let failures = run_threads(&ranks, &Options::default().rounds(10)).expect_err("rank 1 fails");
    let by_rank = |r: usize| {
        failures
            .iter()
            .find(|f| f.rank == r)
            .map(|f| f.detail.clone())
            .unwrap_or_default()
    };
    assert!(by_rank(1).contains("different content"), "{failures:#?}");
    for r in [0, 2] {
        assert!(by_rank(r).contains("[1]"), "rank {r}: {failures:#?}");
    }
}
