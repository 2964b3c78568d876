//! Rank 0 as the source learns, from the acknowledgements, which rank came last to a round
//! and how far apart the ranks came: in a star every rank, in a tree the latest few of each
//! subtree; the straggler is named whichever way the tree is cut.

mod common;

use std::time::Duration;

use lens_core::{Broadcaster as _, blocking};

/// Runs one round from rank 0 with each of `late` sleeping its time first; rank 0's
/// arrivals.
fn one_round(
    n: usize,
    k: Option<usize>,
    late: &[(usize, Duration)],
) -> lens_core::arrivals::Arrivals {
    let ranks = common::group_with(n, Duration::from_secs(10), k);
    // A first round, so that every connection is warm.
    lens_testkit::on_each_rank(&ranks, |b| {
        let mine = (b.rank() == 0).then_some(&b"warm"[..]);
        blocking::broadcast(b, 0, mine).expect("warm-up round")
    });
    let _ = ranks[0].take_arrivals();
    lens_testkit::on_each_rank(&ranks, |b| {
        if let Some(&(_, by)) = late.iter().find(|(r, _)| *r == b.rank()) {
            std::thread::sleep(by);
        }
        let mine = (b.rank() == 0).then_some(&b"step"[..]);
        blocking::broadcast(b, 0, mine).expect("round")
    });
    // The hang report names a round by this count.
    for b in &ranks {
        assert_eq!(
            b.rounds_started(),
            Some(2),
            "rank {} counts its rounds",
            b.rank()
        );
    }
    let got = ranks[0].take_arrivals().expect("rank 0 knows the arrivals");
    assert_eq!(ranks[0].take_arrivals(), None, "taken once");
    assert_eq!(ranks[1].take_arrivals(), None, "only the root knows");
    got
}

#[test]
fn the_source_learns_who_came_last() {
    let by = Duration::from_millis(80);
    // (why, ranks, fan-out, the late rank)
    let rows: Vec<(&str, usize, Option<usize>, usize)> = vec![
        ("star, a member late", 4, None, 2),
        ("star, the source late", 3, None, 0),
        ("tree, a leaf late", 7, Some(2), 5),
        ("tree, an interior rank late", 7, Some(2), 1),
        (
            "tree of 12 with fan-out 3, a deep leaf late",
            12,
            Some(3),
            11,
        ),
    ];
    for (why, n, k, late) in rows {
        let a = one_round(n, k, &[(late, by)]);
        assert_eq!(a.last_rank, late, "{why}: {a:?}");
        let spread = Duration::from_nanos(a.spread_ns);
        assert!(
            spread >= by - Duration::from_millis(5) && spread < Duration::from_secs(5),
            "{why}: spread {spread:?}"
        );
        if k.is_none() {
            assert_eq!(a.ranks.len(), n, "{why}: a star hears of every rank: {a:?}");
        }
    }
}

/// An ack carries the latest few of its subtree: three late ranks at the end of a chain of
/// 12 (whose acks pass through ten ranks, each adding its own) all reach rank 0, latest
/// first.
#[test]
fn the_latest_ranks_survive_a_long_path() {
    let ms = Duration::from_millis;
    let a = one_round(12, Some(1), &[(9, ms(120)), (10, ms(80)), (11, ms(40))]);
    let first: Vec<usize> = a.ranks.iter().take(3).map(|&(r, _)| r).collect();
    assert_eq!(first, vec![9, 10, 11], "{a:?}");
    assert!(
        a.ranks.len() <= 9,
        "an ack carries at most 8, plus rank 0: {a:?}"
    );
}

/// A root other than rank 0 hears from rank 0's DONE how the ranks came; the others,
/// rank 0 included, keep nothing.
#[test]
fn another_root_learns_them_from_rank_0() {
    let by = Duration::from_millis(60);
    // (why, ranks, fan-out, root, the late rank)
    let rows: Vec<(&str, usize, Option<usize>, usize, usize)> = vec![
        ("star", 3, None, 1, 2),
        ("star, rank 0 late", 4, None, 3, 0),
        (
            "tree, the root deep, another subtree late",
            7,
            Some(2),
            5,
            3,
        ),
    ];
    for (why, n, k, root, late) in rows {
        let ranks = common::group_with(n, Duration::from_secs(10), k);
        lens_testkit::on_each_rank(&ranks, |b| {
            if b.rank() == late {
                std::thread::sleep(by);
            }
            let mine = (b.rank() == root).then_some(&b"from a root"[..]);
            blocking::broadcast(b, root, mine).expect("round")
        });
        let a = ranks[root]
            .take_arrivals()
            .unwrap_or_else(|| panic!("{why}: none"));
        assert_eq!(a.last_rank, late, "{why}: {a:?}");
        assert!(
            Duration::from_nanos(a.spread_ns) >= by - Duration::from_millis(5),
            "{why}: {a:?}"
        );
        for b in ranks.iter().filter(|b| b.rank() != root) {
            assert_eq!(b.take_arrivals(), None, "{why}: rank {}", b.rank());
        }
    }
}
