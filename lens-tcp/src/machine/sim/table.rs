//! The failure table: one row per attack class and failure the threat model (docs/guide/tcp.md) names.

use super::{Event, Sim};
use crate::machine::Outcome;

/// One row per attack class and failure the threat model (docs/guide/tcp.md) names (a flood, strangers' frames, a
/// buggy insider, a peer that never reads, a rank that dies, a reset, a restart); each row
/// names what every live rank must end with.
#[test]
fn failure_table() {
    // (why, n, k, root, events before settling, what rank r ends with)
    type Want = fn(usize) -> Outcome;
    let delivered: Want = |_| Outcome::Delivered(b"p".to_vec());
    let rows: Vec<(&str, usize, Option<usize>, usize, Vec<Event>, Want)> = vec![
        ("nothing goes wrong, star", 4, None, 2, vec![], delivered),
        ("nothing goes wrong, tree", 7, Some(2), 5, vec![], delivered),
        (
            "rank 1's connection resets before anything is delivered, then comes back",
            3,
            None,
            0,
            vec![Event::Reset(0), Event::Reconnect(0)],
            delivered,
        ),
        (
            "the root's data is lost and its connection never comes back",
            3,
            None,
            2,
            vec![Event::Reset(1)],
            |r| match r {
                0 | 1 => Outcome::Missing(vec![2]),
                _ => Outcome::Missing(vec![0]),
            },
        ),
        (
            "a flood: every frame delivered three times (a replay within the round)",
            7,
            Some(2),
            6,
            (0..300).map(|i| Event::Duplicate(i, i % 3 == 0)).collect(),
            delivered,
        ),
        (
            "strangers' frames that claim other senders on every connection",
            5,
            None,
            3,
            (0..40).map(|i| Event::Forged(i, i * 7 + 1)).collect(),
            delivered,
        ),
        (
            "an insider acks early, naming every rank outside its subtree",
            5,
            None,
            0,
            vec![Event::RogueAck(1)],
            delivered,
        ),
        (
            "a rank that never reads (never reachable): it is named",
            4,
            None,
            0,
            vec![Event::Kill(2)],
            |r| match r {
                0 => Outcome::Missing(vec![3]),
                _ => Outcome::Delivered(b"p".to_vec()),
            },
        ),
        (
            "an interior rank of a tree dies: rank 0 names its subtree, its children their parent",
            7,
            Some(2),
            0,
            vec![Event::Kill(0)],
            |r| match r {
                0 => Outcome::Missing(vec![1, 3, 4]),
                3 | 4 => Outcome::Missing(vec![1]),
                _ => Outcome::Delivered(b"p".to_vec()),
            },
        ),
        (
            "a restarted rank (its connection made again) in the middle of a tree",
            7,
            Some(2),
            4,
            vec![
                Event::Reset(2),
                Event::Deliver(0, true),
                Event::Reconnect(2),
            ],
            delivered,
        ),
    ];
    for (why, n, k, root, events, want) in rows {
        let mut sim = Sim::new(n, k, root, b"p".to_vec());
        for e in &events {
            sim.apply(e);
        }
        sim.settle();
        for (r, o) in sim.outcomes.iter().enumerate() {
            if sim.dead[r] {
                continue;
            }
            assert_eq!(o.as_ref(), Some(&want(r)), "{why}: rank {r}");
        }
    }
}
