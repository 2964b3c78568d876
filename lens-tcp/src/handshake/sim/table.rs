//! The join's failure table: one row per attack class and failure the threat model (docs/guide/tcp.md) names, each
//! with what must hold after it.

use std::collections::VecDeque;

use super::{Client, Event, Frame, Link, Sim, earlier_job};
use crate::handshake::{Join, Up};
use crate::message::Message;
use crate::tree::Tree;

/// Delivers everything queued, with no faults, in rounds until nothing moves.
fn drain(sim: &mut Sim) {
    for _ in 0..1000 {
        let mut any = false;
        for l in 0..sim.net.links.len() {
            for d in [true, false] {
                if let Some(f) = sim.pop(l, d) {
                    sim.hand(l, d, f);
                    any = true;
                }
            }
        }
        if !any {
            return;
        }
    }
}

/// The first frame `sender` sent that `pick` selects, as a stranger would have recorded it.
fn recorded(sim: &Sim, sender: usize, pick: fn(&Message<'_>) -> bool) -> Frame {
    sim.net
        .heard
        .iter()
        .find(|f| f.sender == sender && pick(&f.msg))
        .cloned()
        .expect("the frame was sent")
}

fn stranger(sim: &mut Sim, to: usize, f: Frame) -> usize {
    sim.net.links.push(Link {
        client: Client::Stranger,
        server: to,
        open: true,
        to_server: VecDeque::from([f]),
        to_client: VecDeque::new(),
    });
    sim.net.links.len() - 1
}

fn formed(sim: &Sim) -> Result<(), String> {
    sim.check_safe().map_err(|e| e.to_string())?;
    sim.check_formed().map_err(|e| e.to_string())
}

/// One row per attack class and failure on the join the threat model names; each says what
/// happened and what must hold after it.
#[test]
fn join_table() {
    type Script = fn(&mut Sim) -> Result<(), String>;
    let rows: Vec<(&str, usize, Option<usize>, Script)> = vec![
        ("nothing goes wrong, star", 4, None, |sim| {
            drain(sim);
            formed(sim)
        }),
        ("nothing goes wrong, tree", 7, Some(2), |sim| {
            drain(sim);
            formed(sim)
        }),
        (
            "a stranger replays a rank's KNOCK and HELLO on a connection of its own",
            3,
            None,
            |sim| {
                drain(sim);
                let knock = recorded(sim, 1, |m| matches!(m, Message::Knock { .. }));
                let hello = recorded(sim, 1, |m| matches!(m, Message::Hello { .. }));
                let l = stranger(sim, 0, knock);
                sim.net.links[l].to_server.push_back(hello);
                drain(sim);
                if sim.nodes[0].join.rank_of(&l).is_some() {
                    return Err("the stranger was admitted".into());
                }
                formed(sim)
            },
        ),
        (
            "frames of an earlier job under the same key, to every listening rank",
            7,
            Some(2),
            |sim| {
                for f in earlier_job(7, Some(2)) {
                    for to in [0, 1, 2] {
                        stranger(sim, to, f.clone());
                    }
                }
                drain(sim);
                formed(sim)
            },
        ),
        (
            "a rank's connection resets after rank 0 WELCOMEd it and formed: welcomed again",
            3,
            None,
            |sim| {
                // Everything up to the WELCOMEs, then rank 1's connection goes.
                for _ in 0..40 {
                    if sim.nodes[0].joined {
                        break;
                    }
                    for l in 0..sim.net.links.len() {
                        if let Some(f) = sim.pop(l, true) {
                            sim.hand(l, true, f);
                        }
                        if !sim.nodes[0].joined {
                            if let Some(f) = sim.pop(l, false) {
                                sim.hand(l, false, f);
                            }
                        }
                    }
                }
                let l = sim.nodes[1].out[0].ok_or("rank 1 has a link")?;
                sim.reset(l);
                sim.heal();
                formed(sim)
            },
        ),
        (
            "a rank restarts after the group formed: turned away, and it says why",
            3,
            None,
            |sim| {
                drain(sim);
                formed(sim)?;
                // A new process: no nonce of the old one, no session.
                let tree = sim.tree;
                sim.nodes[2].join = Join::new(2, 3, tree, String::new());
                sim.nodes[2].joined = false;
                sim.connect(2, Up::Hub);
                drain(sim);
                match &sim.nodes[2].failed {
                    Some(why) if why.contains("restarted") => Ok(()),
                    other => Err(format!("rank 2 ended with {other:?}")),
                }
            },
        ),
        (
            "a rank with another world size is turned away and rank 0 notes it",
            3,
            None,
            |sim| {
                let tree = Tree::new(4, None);
                sim.nodes[2].join = Join::new(2, 4, tree, String::new());
                sim.connect(2, Up::Hub);
                drain(sim);
                let noted = sim.nodes[0]
                    .join
                    .diag
                    .notes
                    .iter()
                    .any(|n| n.contains("world size 4"));
                match &sim.nodes[2].failed {
                    Some(why) if why.contains("world size") && noted => Ok(()),
                    other => Err(format!("rank 2 ended with {other:?}, noted {noted}")),
                }
            },
        ),
        ("every frame handed over twice", 7, Some(2), |sim| {
            for _ in 0..200 {
                for l in 0..sim.net.links.len() {
                    for d in [true, false] {
                        sim.apply(&Event::Duplicate(l, d));
                    }
                }
            }
            sim.heal();
            formed(sim)
        }),
        (
            "connections that never prove the key are closed at the deadline; honest ranks knock again",
            5,
            Some(2),
            |sim| {
                for _ in 0..3 {
                    sim.apply(&Event::Replay(0, 0));
                    sim.apply(&Event::Expire);
                }
                sim.heal();
                formed(sim)
            },
        ),
    ];
    for (why, n, k, script) in rows {
        let mut sim = Sim::new(n, k, 1, Vec::new());
        if let Err(e) = script(&mut sim) {
            panic!("{why}: {e}");
        }
    }
}
