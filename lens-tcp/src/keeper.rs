//! The keeper: one thread per rank that serves the rank's connections while no round runs.
//!
//! libzmq's I/O thread accepts connections whenever they come, but lens reads their
//! notices, closes strangers and expires handshakes only when something reads the sockets.
//! A training loop calls `broadcast` once a step and a step takes seconds, so without the
//! keeper every limit on strangers would hold only during the few microseconds of a round,
//! and a stranger could fill the process with connections in between.
//!
//! The keeper sleeps in `poll(2)`, without the group's lock, on libzmq's reports of
//! connections accepted, made or lost ([`Net::watch`](crate::net::Net::watch)) and, while
//! some connection has not proven the key, on the sockets themselves (`ZMQ_FD`); also when
//! the next handshake deadline passes, and at least every [`MAX_SLEEP`]. Then it takes the
//! lock, serves what is queued for at most [`SLICE`], and lets go. A round takes the same
//! lock, so the two never touch a socket at once.
//!
//! Cost: one thread per rank, asleep while nothing happens. Rounds between proven peers do
//! not wake it (messages are not reported); while strangers are connected, a round that
//! receives anything wakes it once, and a round drains the sockets before it returns so
//! that their descriptors signal the keeper again.

use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lens_core::Result;

use crate::error::setup_err;
use crate::state::RankState;

/// The longest the keeper holds the lock at a time: a round waits at most this long for it.
pub(crate) const SLICE: Duration = Duration::from_micros(500);
/// The keeper looks at the sockets at least this often, even when no descriptor signals.
const MAX_SLEEP: Duration = Duration::from_millis(250);

pub(crate) fn lock(state: &Mutex<RankState>) -> MutexGuard<'_, RankState> {
    // A panic elsewhere while holding the lock leaves the group as consistent as any
    // failed round does: the next round starts over.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The keeper of one rank; stops (and is joined) when dropped.
#[derive(Debug)]
pub(crate) struct Keeper {
    /// Writing a byte wakes the keeper; dropping it stops the keeper.
    bell: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Keeper {
    pub(crate) fn start(state: Arc<Mutex<RankState>>, rank: usize) -> Result<Keeper> {
        let watchers = lock(&state).net.watch()?;
        let (bell, ear) =
            UnixStream::pair().map_err(setup_err("make the keeper's wake-up pair"))?;
        ear.set_nonblocking(true)
            .map_err(setup_err("make the keeper's wake-up pair"))?;
        bell.set_nonblocking(true)
            .map_err(setup_err("make the keeper's wake-up pair"))?;
        let thread = std::thread::Builder::new()
            .name(format!("lens-tcp-keeper-{rank}"))
            .spawn(move || run(&state, ear, &watchers))
            .map_err(setup_err("start the keeper thread"))?;
        Ok(Keeper {
            bell: Some(bell),
            thread: Some(thread),
        })
    }

    /// Asks the keeper to serve the sockets now (a round left something queued).
    pub(crate) fn poke(&self) {
        if let Some(mut bell) = self.bell.as_ref() {
            // A full pipe already holds a wake-up: nothing is lost.
            let _ = bell.write(&[1]);
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        drop(self.bell.take()); // the keeper sees the end of its stream and returns
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(state: &Mutex<RankState>, mut ear: UnixStream, watchers: &[zmq::Socket]) {
    loop {
        let (fds, wake_at, drained) = {
            let mut g = lock(state);
            if let Err(e) = g.serve_idle(SLICE) {
                tracing::warn!(error = %e, "the keeper could not serve the connections");
            }
            let fds = if g.net.unsettled() {
                g.net.wait_fds()
            } else {
                Vec::new()
            };
            let wake_at = match (g.net.next_expiry(), g.open_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            (fds, wake_at, g.net.drained())
        };
        if !drained {
            // More is queued than one slice serves: let a round in, then go on.
            std::thread::yield_now();
            continue;
        }
        let sleep = wake_at
            .map_or(MAX_SLEEP, |t| t.saturating_duration_since(Instant::now()))
            .min(MAX_SLEEP);
        let ms = i64::try_from(sleep.as_millis().max(1)).unwrap_or(1);
        let mut items: Vec<zmq::PollItem<'_>> = watchers
            .iter()
            .map(|w| w.as_poll_item(zmq::POLLIN))
            .chain(
                fds.iter()
                    .map(|&fd| zmq::PollItem::from_fd(fd, zmq::POLLIN)),
            )
            .collect();
        items.push(zmq::PollItem::from_fd(ear.as_raw_fd(), zmq::POLLIN));
        if let Err(e) = zmq::poll(&mut items, ms) {
            if e != zmq::Error::EINTR {
                tracing::warn!(error = %e, "the keeper's poll failed");
                std::thread::sleep(MAX_SLEEP);
            }
        }
        let stop = items.last().is_some_and(zmq::PollItem::is_readable);
        drop(items);
        // The reports only wake the keeper; what happened is read from the sockets.
        for w in watchers {
            while w.recv_bytes(zmq::DONTWAIT).is_ok() {}
        }
        if stop {
            let mut buf = [0u8; 64];
            match ear.read(&mut buf) {
                Ok(0) => return, // the group is gone
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}
