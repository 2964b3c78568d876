//! Clock offsets measured over a group's broadcasts: ranks of one clock agree within the
//! bound; simulated offsets are found within the bound; bad arguments are refused.

use std::time::Duration;

use lens_core::Error;
use lens_core::clock::{
    ClockOffset, measure_clock_offsets, measure_clock_offsets_with, system_now_ns,
};
use lens_testkit::LocalCluster;

fn on_threads<T: Send>(n: usize, f: impl Fn(&dyn lens_core::Broadcaster) -> T + Sync) -> Vec<T> {
    let ranks = LocalCluster::new(n)
        .timeout(Duration::from_secs(10))
        .broadcasters();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|b| s.spawn(|| f(b))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

fn within(got: ClockOffset, truth: i64) -> bool {
    got.offset_ns.abs_diff(truth) <= got.error_ns + 1
}

#[test]
fn ranks_of_one_clock_agree_within_the_bound_and_every_rank_gets_the_table() {
    let tables = on_threads(4, |b| measure_clock_offsets(b, 0, 5).expect("measured"));
    for t in &tables {
        assert_eq!(t, &tables[0], "every rank has the same table");
    }
    let t = &tables[0];
    assert_eq!(
        t[0],
        ClockOffset {
            offset_ns: 0,
            error_ns: 0
        },
        "the reference itself"
    );
    for (r, c) in t.iter().enumerate().skip(1) {
        assert!(within(*c, 0), "rank {r}: {c:?}");
        assert!(
            c.error_ns < 1_000_000_000,
            "rank {r}: a bound was measured: {c:?}"
        );
    }
}

#[test]
fn simulated_offsets_are_found_within_the_bound() {
    // (why, reference rank) — each rank's clock is 1.5 s × rank ahead, and a few ns more.
    for (why, reference) in [("reference 0", 0), ("reference 2", 2)] {
        let tables = on_threads(4, |b| {
            let ahead = 1_500_000_000_i128 * b.rank() as i128 + 7 * b.rank() as i128;
            let now = move || system_now_ns() + ahead;
            measure_clock_offsets_with(b, reference, 3, &now).expect("measured")
        });
        let t = &tables[0];
        for (r, c) in t.iter().enumerate() {
            let truth = 1_500_000_007_i64 * (r as i64 - reference as i64);
            assert!(within(*c, truth), "{why}: rank {r}: {c:?} against {truth}");
        }
    }
}

#[test]
fn bad_arguments_are_refused_on_every_rank() {
    for (reference, reps) in [(4, 1), (0, 0)] {
        let got = on_threads(2, |b| measure_clock_offsets(b, reference, reps));
        for g in got {
            assert!(
                matches!(g, Err(Error::Config { .. })),
                "{reference}, {reps}: {g:?}"
            );
        }
    }
}

/// Through `Hierarchical` (two nodes of three ranks): the same table, simulated offsets
/// found within the bound, whichever node the reference is on.
#[test]
fn offsets_are_measured_through_a_hierarchical_group() {
    let layout = lens_core::NodeLayout::uniform(6, 3).expect("layout");
    let ranks = LocalCluster::new(6)
        .timeout(Duration::from_secs(10))
        .hierarchical(&layout)
        .expect("hierarchical");
    let tables: Vec<Vec<ClockOffset>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|b| {
                s.spawn(move || {
                    let ahead = 1_000_000_i128 * lens_core::Broadcaster::rank(b) as i128;
                    let now = move || system_now_ns() + ahead;
                    measure_clock_offsets_with(b, 4, 2, &now).expect("measured")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for t in &tables {
        assert_eq!(t, &tables[0]);
    }
    for (r, c) in tables[0].iter().enumerate() {
        let truth = 1_000_000_i64 * (r as i64 - 4);
        assert!(within(*c, truth), "rank {r}: {c:?} against {truth}");
    }
}

/// Clocks that drift apart (ranks 1 and 2 run half again as fast as rank 0's, a drift no
/// real clock has, so that it dwarfs the delays): each rank's offset lies within its bound
/// of a value the true offset took while that rank's own exchanges ran (the reference reads
/// its clock three times an exchange, and the exchanges go rank by rank).
#[test]
fn drifting_clocks_get_an_offset_the_truth_took_within_its_bound() {
    const REPS: usize = 20;
    let start = system_now_ns();
    let reads = std::sync::Mutex::new(Vec::new());
    let tables = on_threads(3, |b| {
        let (ahead, rate) = if b.rank() == 0 {
            (0, 0)
        } else {
            (2_000_000, 1)
        };
        let reference = b.rank() == 0;
        let reads = &reads;
        // This rank's clock: real + ahead + rate × (real − start) / 2.
        let now = move || {
            let real = system_now_ns();
            if reference {
                reads.lock().expect("reads").push(real);
            }
            real + ahead + rate * (real - start) / 2
        };
        measure_clock_offsets_with(b, 0, REPS, &now).expect("measured")
    });
    let reads = reads.into_inner().expect("reads");
    assert!(reads.len() >= 2 * 3 * REPS, "{} reads", reads.len());
    let truth = |t: i128| i64::try_from(2_000_000 + (t - start) / 2).expect("small");
    for (r, c) in tables[0].iter().enumerate().skip(1) {
        let window = &reads[(r - 1) * 3 * REPS..r * 3 * REPS];
        let (first, last) = (truth(window[0]), truth(window[window.len() - 1]));
        let outside = if c.offset_ns < first {
            first - c.offset_ns
        } else {
            c.offset_ns.saturating_sub(last).max(0)
        };
        assert!(
            outside.unsigned_abs() <= c.error_ns + 1,
            "rank {r}: {c:?} is {outside} ns from the truth's range [{first}, {last}] \
             while its exchanges ran"
        );
    }
}

/// Each rank's exchanges run one after another, so clocks that drift apart move its
/// offset only over `2 × repetitions` broadcasts: the roots of the rounds, in order.
#[test]
fn each_ranks_exchanges_run_one_after_another() {
    struct Roots<'a> {
        group: &'a dyn lens_core::Broadcaster,
        roots: std::sync::Mutex<Vec<usize>>,
    }
    #[async_trait::async_trait]
    impl lens_core::Broadcaster for Roots<'_> {
        fn rank(&self) -> usize {
            self.group.rank()
        }
        fn world_size(&self) -> usize {
            self.group.world_size()
        }
        async fn broadcast(
            &self,
            root: usize,
            payload: Option<&[u8]>,
        ) -> lens_core::Result<Vec<u8>> {
            self.roots.lock().expect("roots").push(root);
            self.group.broadcast(root, payload).await
        }
    }
    let roots = on_threads(3, |b| {
        let recorded = Roots {
            group: b,
            roots: std::sync::Mutex::new(Vec::new()),
        };
        measure_clock_offsets(&recorded, 0, 3).expect("measured");
        recorded.roots.into_inner().expect("roots")
    });
    let want = vec![0, 1, 0, 1, 0, 1, 0, 2, 0, 2, 0, 2, 0];
    for (r, got) in roots.iter().enumerate() {
        assert_eq!(got, &want, "rank {r}: the rounds' roots in order");
    }
}
