//! `Hierarchical` groups report how the ranks came to a round: one entry per node, the
//! rank of that node that came last (the node-level straggler and the rank behind it), and
//! the root's own node in full.

use std::sync::Arc;
use std::time::Duration;

use lens_core::arrivals::Arrivals;
use lens_core::{Broadcaster, Hierarchical, NodeLayout, blocking};
use lens_testkit::{LocalBroadcaster, LocalCluster, on_each_rank};

/// Three nodes of three ranks: [0, 1, 2], [3, 4, 5], [6, 7, 8].
fn three_by_three() -> (NodeLayout, Vec<Arc<dyn Broadcaster>>) {
    let layout = NodeLayout::uniform(9, 3).expect("layout");
    let nodes = (0..3)
        .map(|_| LocalCluster::new(3).broadcasters())
        .collect();
    let ranks = Hierarchical::<LocalBroadcaster, LocalBroadcaster>::assemble(
        &layout,
        nodes,
        LocalCluster::new(3).broadcasters(),
    )
    .expect("ranks")
    .into_iter()
    .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
    .collect();
    (layout, ranks)
}

/// One round from `root` in which rank `late` enters `by` after the others; the root's
/// arrivals.
fn round_with_late(
    ranks: &[Arc<dyn Broadcaster>],
    root: usize,
    late: usize,
    by: Duration,
) -> Option<Arrivals> {
    on_each_rank(ranks, |b| {
        if b.rank() == late {
            std::thread::sleep(by);
        }
        let payload = (b.rank() == root).then_some(&b"step"[..]);
        let got = blocking::broadcast(b.as_ref(), root, payload).expect("round");
        assert_eq!(got, b"step");
        (b.rank() == root).then(|| b.take_arrivals()).flatten()
    })
    .into_iter()
    .flatten()
    .next()
}

const LATE: Duration = Duration::from_millis(60);

fn ranks_of(a: &Arrivals) -> Vec<usize> {
    let mut r: Vec<usize> = a.ranks.iter().map(|&(r, _)| r).collect();
    r.sort_unstable();
    r
}

#[test]
fn the_rank_behind_a_late_node_is_named() {
    let (_, ranks) = three_by_three();
    // Rank 7 is on node 2 behind its leader 6; then a leader, then a rank of the root's
    // own node, each late in turn.
    for late in [7, 3, 2] {
        let a = round_with_late(&ranks, 0, late, LATE).expect("arrivals on the root");
        assert_eq!(a.last_rank, late, "{a:?}");
        assert!(a.spread_ns >= 50_000_000, "{a:?}");
        // The root's node in full; each other node by the rank of it that came last.
        let others: Vec<usize> = ranks_of(&a).into_iter().filter(|&r| r > 2).collect();
        assert_eq!(others.len(), 2, "one entry per other node: {a:?}");
        if late > 2 {
            assert!(others.contains(&late), "{a:?}");
        }
        for r in 0..3 {
            assert!(
                ranks_of(&a).contains(&r),
                "rank {r} of the root's node: {a:?}"
            );
        }
        // Everyone else came together: only the late rank is far behind the first.
        for &(r, ns) in &a.ranks[1..] {
            assert!(ns < 40_000_000, "rank {r} at {ns} ns: {a:?}");
        }
    }
}

#[test]
fn a_root_on_another_node_names_it_too() {
    let (_, ranks) = three_by_three();
    // Root 3 leads node 1 (the leaders' round is not from node 0).
    let a = round_with_late(&ranks, 3, 8, LATE).expect("arrivals on the root");
    assert_eq!(a.last_rank, 8, "{a:?}");
    let all = ranks_of(&a);
    assert_eq!(
        all.len(),
        5,
        "node 1 in full, one rank of each other node: {a:?}"
    );
    assert!(
        all.contains(&3) && all.contains(&4) && all.contains(&5),
        "{a:?}"
    );
    assert_eq!(all.iter().filter(|&&r| r < 3).count(), 1, "{a:?}");
}

#[test]
fn arrivals_that_would_name_a_rank_wrongly_are_not_reported() {
    let (layout, ranks) = three_by_three();
    // A root that does not lead its node hears its own node only.
    assert!(round_with_late(&ranks, 4, 5, LATE).is_none());
    // Three in-process groups of 3, each with or without arrivals and `stand_for`.
    let groups = |tracked: bool| -> Vec<Vec<Arc<dyn Broadcaster>>> {
        (0..3)
            .map(|_| {
                LocalCluster::new(3)
                    .broadcasters()
                    .into_iter()
                    .map(|b| -> Arc<dyn Broadcaster> {
                        if tracked {
                            Arc::new(b)
                        } else {
                            Arc::new(Untracked(b))
                        }
                    })
                    .collect()
            })
            .collect()
    };
    // Nodes whose groups track no arrivals (a leader could only name itself), then leaders
    // that cannot stand for others (a leader would be named for its node).
    for (nodes, leaders) in [(groups(false), groups(true)), (groups(true), groups(false))] {
        let leaders = leaders.into_iter().next().expect("one group of 3 leaders");
        let ranks: Vec<Arc<dyn Broadcaster>> = Hierarchical::assemble(&layout, nodes, leaders)
            .expect("ranks")
            .into_iter()
            .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
            .collect();
        assert!(round_with_late(&ranks, 0, 7, LATE).is_none());
    }
}

/// The in-process backend without arrivals and without `stand_for`, as a collective
/// backend that does not gather them.
struct Untracked(LocalBroadcaster);

#[async_trait::async_trait]
impl Broadcaster for Untracked {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> lens_core::Result<Vec<u8>> {
        self.0.broadcast(root, payload).await
    }
}

#[test]
fn a_single_node_is_the_whole_job() {
    let layout = NodeLayout::uniform(3, 3).expect("layout");
    let ranks: Vec<Arc<dyn Broadcaster>> =
        Hierarchical::<LocalBroadcaster, LocalBroadcaster>::assemble(
            &layout,
            vec![LocalCluster::new(3).broadcasters()],
            LocalCluster::new(1).broadcasters(),
        )
        .expect("ranks")
        .into_iter()
        .map(|h| Arc::new(h) as Arc<dyn Broadcaster>)
        .collect();
    let a = round_with_late(&ranks, 0, 2, LATE).expect("arrivals on the root");
    assert_eq!(a.last_rank, 2, "{a:?}");
    assert_eq!(ranks_of(&a), [0, 1, 2], "{a:?}");
}

#[test]
fn only_the_root_hears_and_only_once() {
    let (_, ranks) = three_by_three();
    assert!(round_with_late(&ranks, 0, 1, Duration::ZERO).is_some());
    for r in &ranks {
        assert!(r.take_arrivals().is_none(), "rank {}", r.rank());
    }
}

/// What the user's exporter receives: the source's step span, ended after a broadcast over
/// the hierarchical group, carries the rank behind the late node.
#[test]
fn the_step_span_names_the_rank_behind_the_late_node() {
    use lens_core::arrivals::keys;
    use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
    use opentelemetry::{Context, Value};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    let (_, ranks) = three_by_three();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("step");
    on_each_rank(&ranks, |b| {
        if b.rank() == 7 {
            std::thread::sleep(LATE);
        }
        if b.rank() == 0 {
            let cx = Context::new().with_span(tracer.start("train_step"));
            blocking::broadcast_context(b.as_ref(), 0, &cx).expect("round");
            cx.span().end();
        } else {
            blocking::broadcast_context(b.as_ref(), 0, &Context::new()).expect("round");
        }
    });
    let spans = exporter.get_finished_spans().expect("spans");
    let step = spans
        .iter()
        .find(|s| s.name == "train_step")
        .expect("the step span");
    let attr = |k: &str| {
        step.attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(
        attr(keys::LAST_RANK),
        Some(Value::I64(7)),
        "{:?}",
        step.attributes
    );
    assert!(
        matches!(attr(keys::SPREAD_NS), Some(Value::I64(ns)) if ns >= 50_000_000),
        "{:?}",
        step.attributes
    );
}
