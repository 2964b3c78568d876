//! The keeper: one thread per rank that serves the rank's connections while no round runs.
//!
//! The kernel queues connections whenever they come, but lens accepts them, closes
//! strangers and expires handshakes only when something reads the sockets. A training loop
//! calls `broadcast` once a step and a step takes seconds, so without the keeper every limit
//! on strangers would hold only during the few microseconds of a round, and a stranger
//! could fill the kernel's queue and the process with connections in between.
//!
//! The keeper sleeps in epoll, without the group's lock, on the listening sockets
//! ([`Net::listen_fds`](crate::net::Net::listen_fds)) and, while some connection has not
//! proven the key, on the rank's own epoll instance (every socket); also when the next
//! handshake deadline or reconnection is due, and at least every [`MAX_SLEEP`] (which is
//! also how soon a proven connection lost between rounds is noticed without a round). Then
//! it takes the lock, serves what is queued for at most [`SLICE`], and lets go. A round
//! takes the same lock, so the two never touch a socket at once.
//!
//! Cost: one thread per rank, asleep while nothing happens. Rounds between proven peers do
//! not wake it (their sockets are not watched); while strangers are connected, a round that
//! receives anything wakes it once, and a round drains the sockets before it returns so
//! that the epoll instance signals the keeper again.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lens_core::Result;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::error::setup_err;
use crate::state::RankState;

/// The longest the keeper holds the lock at a time: a round waits at most this long for it.
pub(crate) const SLICE: Duration = Duration::from_micros(500);
/// The keeper looks at the sockets at least this often, even when no descriptor signals.
const MAX_SLEEP: Duration = Duration::from_millis(250);

/// The keeper's tokens: its bell, the rank's whole epoll instance, the listening sockets.
const EAR: Token = Token(0);
const ALL: Token = Token(1);
const LISTENER: usize = 2;

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
        let (listeners, net_fd) = {
            let g = lock(&state);
            (g.net.listen_fds(), g.net.wake_fd())
        };
        let (bell, ear) =
            UnixStream::pair().map_err(setup_err("make the keeper's wake-up pair"))?;
        ear.set_nonblocking(true)
            .map_err(setup_err("make the keeper's wake-up pair"))?;
        bell.set_nonblocking(true)
            .map_err(setup_err("make the keeper's wake-up pair"))?;
        let thread = std::thread::Builder::new()
            .name(format!("lens-tcp-keeper-{rank}"))
            .spawn(move || run(&state, ear, &listeners, net_fd))
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

fn run(state: &Mutex<RankState>, mut ear: UnixStream, listeners: &[RawFd], net_fd: RawFd) {
    let mut poll = match Poll::new() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "the keeper has no epoll instance; it serves on a timer");
            return run_on_timer(state, &mut ear);
        }
    };
    for (i, fd) in listeners.iter().enumerate() {
        if let Err(e) =
            poll.registry()
                .register(&mut SourceFd(fd), Token(LISTENER + i), Interest::READABLE)
        {
            tracing::warn!(error = %e, "the keeper cannot watch a listening socket");
        }
    }
    let ear_fd = ear.as_raw_fd();
    if let Err(e) = poll
        .registry()
        .register(&mut SourceFd(&ear_fd), EAR, Interest::READABLE)
    {
        tracing::warn!(error = %e, "the keeper cannot watch its wake-up pair");
    }
    let mut events = Events::with_capacity(16);
    // Whether the rank's epoll instance is watched (while a connection is unproven).
    let mut watching_all = false;
    loop {
        let (unsettled, wake_at, drained) = {
            let mut g = lock(state);
            if let Err(e) = g.serve_idle(SLICE) {
                tracing::warn!(error = %e, "the keeper could not serve the connections");
            }
            let wake_at = match (g.net.next_expiry(), g.open_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            (g.net.unsettled(), wake_at, g.net.drained())
        };
        if !drained {
            // More is queued than one slice serves: let a round in, then go on.
            std::thread::yield_now();
            continue;
        }
        if unsettled != watching_all {
            let all = &mut SourceFd(&net_fd);
            let done = if unsettled {
                poll.registry().register(all, ALL, Interest::READABLE)
            } else {
                poll.registry().deregister(all)
            };
            match done {
                Ok(()) => watching_all = unsettled,
                Err(e) => tracing::warn!(error = %e, "the keeper cannot watch the sockets"),
            }
        }
        let sleep = wake_at
            .map_or(MAX_SLEEP, |t| t.saturating_duration_since(Instant::now()))
            .min(MAX_SLEEP);
        if let Err(e) = poll.poll(&mut events, Some(sleep)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!(error = %e, "the keeper's poll failed");
                std::thread::sleep(MAX_SLEEP);
            }
        }
        let rung = events.iter().any(|e| e.token() == EAR);
        if rung && !heard(&mut ear) {
            return; // the group is gone
        }
    }
}

/// Reads the bell's bytes; false once the group dropped its end.
fn heard(ear: &mut UnixStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match ear.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Without an epoll instance of its own the keeper still serves, every [`MAX_SLEEP`].
fn run_on_timer(state: &Mutex<RankState>, ear: &mut UnixStream) {
    loop {
        if let Err(e) = lock(state).serve_idle(SLICE) {
            tracing::warn!(error = %e, "the keeper could not serve the connections");
        }
        std::thread::sleep(MAX_SLEEP);
        if !heard(ear) {
            return;
        }
    }
}
