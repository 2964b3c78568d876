//! The descriptor budget: how many connections that have not proven the key a rank may
//! hold, from what the process may open (`RLIMIT_NOFILE`) and already has open, so that a
//! stranger can never take the descriptors the application needs (checkpoints, data
//! loaders, NCCL's sockets) or the ones this rank needs for its own peers.
//!
//! Read from `/proc/self/limits` and `/proc/self/fd` (Linux). Where `/proc` is missing
//! the cap is [`MAX_UNPROVEN`] and nothing is checked.

use lens_core::{Error, Result};

use crate::tree::Tree;

/// The most unproven connections a rank holds, however many descriptors it may open.
pub(crate) const MAX_UNPROVEN: usize = 32;
/// The fewest: below this a burst of strangers could keep an honest joiner out.
pub(crate) const MIN_UNPROVEN: usize = 8;
/// Descriptors a rank uses beside its connections (its epoll instance and its keeper's,
/// the keeper's wake-up pair, the listening sockets), with room to spare.
pub(crate) const SOCKET_OVERHEAD: usize = 16;
/// Of the descriptors left over, strangers may hold at most one part in this many; the
/// rest stays free for the application.
const STRANGER_SHARE: usize = 4;

/// What the process may open and has open now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Descriptors {
    /// The soft `RLIMIT_NOFILE`.
    pub limit: usize,
    /// Descriptors open now.
    pub open: usize,
}

impl Descriptors {
    /// This process's, or `None` where `/proc` does not tell.
    pub(crate) fn of_this_process() -> Option<Descriptors> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let limit = soft_nofile(&limits)?;
        let open = std::fs::read_dir("/proc/self/fd").ok()?.count();
        Some(Descriptors { limit, open })
    }
}

/// The shortest listening queue, and the longest (the kernel also caps it at
/// `net.core.somaxconn`).
pub(crate) const MIN_BACKLOG: usize = 1024;
pub(crate) const MAX_BACKLOG: usize = 65_535;

/// The listening queue of a rank with cap `cap` on unproven connections that expects
/// `joiners` ranks to join at once: room for all of them and the strangers it holds, and
/// at least [`MIN_BACKLOG`]. A queued connection holds no descriptor of the process (lens
/// accepts one at a time and closes the oldest unproven one past the cap as it goes), and a
/// connection that finds the queue full waits a second or more for its SYN to be retried:
/// a long queue lets honest joiners in past a burst of strangers, also before anything
/// serves the port (between [`TcpBroadcaster::start`](crate::TcpBroadcaster::start) and
/// [`Rendezvous::finish`](crate::Rendezvous::finish)).
pub(crate) fn listen_queue(cap: usize, joiners: usize) -> usize {
    cap.saturating_add(joiners).clamp(MIN_BACKLOG, MAX_BACKLOG)
}

/// The soft limit from the text of `/proc/self/limits` (`unlimited` reads as `usize::MAX`).
fn soft_nofile(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        return Some(usize::MAX);
    }
    soft.parse().ok()
}

/// The cap on unproven connections for a rank that keeps `peers` connections of its own
/// (its tree children, rank 0, its tree parent).
///
/// # Errors
/// [`Error::Config`] when the process cannot open enough descriptors for its peers, its
/// sockets and [`MIN_UNPROVEN`] strangers with room to spare for the application, naming
/// the limit and what the rank needs.
pub(crate) fn unproven_cap(
    fds: Option<Descriptors>,
    rank: usize,
    tree: Tree,
    peers: usize,
) -> Result<usize> {
    let Some(Descriptors { limit, open }) = fds else {
        return Ok(MAX_UNPROVEN);
    };
    let needed = open + SOCKET_OVERHEAD + peers;
    let spare = limit.saturating_sub(needed);
    let cap = (spare / STRANGER_SHARE).min(MAX_UNPROVEN);
    if cap < MIN_UNPROVEN {
        let want = needed + MIN_UNPROVEN * STRANGER_SHARE;
        let world = tree.n;
        let hint = match (rank, tree.is_star()) {
            (0, true) if peers > 64 => {
                ", or use a tree (fan_out, LENS_TCP_FAN_OUT) so that no other rank serves the whole group"
            }
            // Rank 0 of a tree still keeps a connection to every rank (joins and verdicts
            // travel over it): only the limit helps.
            _ => "",
        };
        return Err(Error::config(format!(
            "rank {rank} of {world} keeps {peers} connection(s) to its peers and {SOCKET_OVERHEAD} descriptors for its sockets, \
             and this process has {open} open already, but it may open only {limit} (RLIMIT_NOFILE): \
             raise the limit to at least {want} (ulimit -n {want}){hint}"
        )));
    }
    Ok(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_follows_the_limit() {
        // (why, limit, open, peers, the cap or None for an error)
        let rows: Vec<(&str, usize, usize, usize, Option<usize>)> = vec![
            (
                "a roomy limit gives the full cap",
                20_000,
                30,
                3,
                Some(MAX_UNPROVEN),
            ),
            ("unlimited", usize::MAX, 30, 3, Some(MAX_UNPROVEN)),
            ("64 descriptors, 15 open, one peer", 64, 15, 1, Some(8)),
            ("96 descriptors, 20 open, two peers", 96, 20, 2, Some(14)),
            ("1,024 and a star of 1,000 ranks", 1024, 20, 999, None),
            ("too few for the peers at all", 64, 30, 40, None),
            ("just enough", 16 + 5 + 2 + 32, 5, 2, Some(8)),
            ("one short", 16 + 5 + 2 + 31, 5, 2, None),
        ];
        for (why, limit, open, peers, want) in rows {
            let got = unproven_cap(
                Some(Descriptors { limit, open }),
                0,
                Tree::new(peers + 1, None),
                peers,
            )
            .ok();
            assert_eq!(got, want, "{why}");
        }
        assert_eq!(
            unproven_cap(None, 0, Tree::new(2, None), 1).ok(),
            Some(MAX_UNPROVEN),
            "no /proc"
        );
    }

    #[test]
    fn a_limit_too_low_names_the_limit_and_the_need() {
        let fds = Some(Descriptors {
            limit: 1024,
            open: 20,
        });
        let err = unproven_cap(fds, 0, Tree::new(1000, None), 999).expect_err("too low");
        let text = err.to_string();
        assert!(
            text.contains("RLIMIT_NOFILE")
                && text.contains("1024")
                && text.contains("ulimit -n 1067"),
            "{text}"
        );
        assert!(
            text.contains("fan_out"),
            "a star is told about trees: {text}"
        );
        // Rank 0 of a tree keeps a connection per rank too: a tree is no way out for it.
        let err = unproven_cap(fds, 0, Tree::new(1000, Some(4)), 999).expect_err("too low");
        assert!(!err.to_string().contains("fan_out"), "{err}");
    }

    #[test]
    fn the_listening_queue_holds_every_joiner_and_the_strangers() {
        // (why, cap, joiners, queue)
        let rows = [
            ("a pair: the shortest queue", 32, 1, MIN_BACKLOG),
            (
                "a star of 100: the shortest queue holds them all",
                32,
                99,
                MIN_BACKLOG,
            ),
            ("a star of 1,000: every joiner and the cap", 32, 999, 1_031),
            (
                "a star of 10,000: every joiner and the cap",
                32,
                9_999,
                10_031,
            ),
            (
                "a star of 100,000: no longer than the longest",
                32,
                99_999,
                MAX_BACKLOG,
            ),
        ];
        for (why, cap, joiners, want) in rows {
            assert_eq!(listen_queue(cap, joiners), want, "{why}");
        }
    }

    #[test]
    fn limits_file_table() {
        let rows: Vec<(&str, &str, Option<usize>)> = vec![
            (
                "soft and hard",
                "Max cpu time              unlimited            unlimited            seconds\nMax open files            1024                 524288               files\n",
                Some(1024),
            ),
            (
                "unlimited",
                "Max open files            unlimited            unlimited            files\n",
                Some(usize::MAX),
            ),
            ("missing", "Max processes 10 10 processes\n", None),
        ];
        for (why, text, want) in rows {
            assert_eq!(soft_nofile(text), want, "{why}");
        }
        assert!(Descriptors::of_this_process().is_some_and(|d| d.open > 0 && d.limit > 0));
    }
}
