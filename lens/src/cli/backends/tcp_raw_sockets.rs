//! The TCP bench's first baseline, `raw`: bare TCP sockets (std, blocking, no Nagle delay)
//! in lens's layout, the transport lens's group runs on with nothing of lens's: no framing
//! beyond a length, no authentication, no round numbers. Each parent writes the bytes to
//! its children and acknowledges up (one byte) once they all have; rank 0's round ends with
//! its children's acks, as lens's does. The same code runs the ranks as threads and as
//! processes. With `--processes` the bench's barrier is a tree of these sockets too
//! ([`SocketTree::barrier`]), so that nothing heavier than the baseline runs between rounds.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::tcp_raw::children;

/// Longest wait for a peer's bytes, while the sockets form or in a round.
const WAIT: Duration = Duration::from_secs(60);

fn err(what: &'static str) -> impl FnOnce(std::io::Error) -> String {
    move |e| format!("raw sockets: {what}: {e}")
}

/// One rank's sockets: to its parent, and to each of its children in rank order.
pub(crate) struct SocketTree {
    up: Option<TcpStream>,
    down: Vec<TcpStream>,
    frame: Vec<u8>,
}

/// A listening socket for this rank's children on an ephemeral port of `host`.
pub(crate) fn listen(host: &str) -> Result<(TcpListener, String), String> {
    let l = TcpListener::bind((host, 0)).map_err(err("bind"))?;
    let at = l.local_addr().map_err(err("bind"))?.to_string();
    Ok((l, at))
}

fn tune(s: &TcpStream) -> Result<(), String> {
    s.set_nodelay(true).map_err(err("set no delay"))?;
    s.set_read_timeout(Some(WAIT))
        .map_err(err("set a timeout"))?;
    s.set_write_timeout(Some(WAIT))
        .map_err(err("set a timeout"))
}

/// Rank `rank`'s connection to its parent listening at `at`, which learns the rank from
/// its first 8 bytes.
pub(crate) fn up_to(rank: usize, at: &str) -> Result<TcpStream, String> {
    let addr: SocketAddr = at
        .parse()
        .map_err(|_| format!("raw sockets: bad address {at}"))?;
    let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(err("connect"))?;
    tune(&s)?;
    s.write_all(&(rank as u64).to_le_bytes())
        .map_err(err("greet"))?;
    Ok(s)
}

/// Rank `rank`'s sockets (of `n`, fan-out `k`): its children accepted on `l`, and `up`.
pub(crate) fn tree(
    (rank, n, k): (usize, usize, usize),
    l: &TcpListener,
    up: Option<TcpStream>,
) -> Result<SocketTree, String> {
    Ok(SocketTree {
        up,
        down: accept_children((rank, n, k), l)?,
        frame: Vec::new(),
    })
}

/// Accepts `rank`'s children (of `n`, fan-out `k`) on `l`, in rank order.
fn accept_children(
    (rank, n, k): (usize, usize, usize),
    l: &TcpListener,
) -> Result<Vec<TcpStream>, String> {
    let kids: Vec<usize> = children(rank, n, k).collect();
    let mut down: Vec<Option<TcpStream>> = kids.iter().map(|_| None).collect();
    for _ in &kids {
        let (mut s, _) = l.accept().map_err(err("accept"))?;
        tune(&s)?;
        let mut who = [0u8; 8];
        s.read_exact(&mut who).map_err(err("read a greeting"))?;
        let who = usize::try_from(u64::from_le_bytes(who)).unwrap_or(usize::MAX);
        let slot = kids
            .iter()
            .position(|&c| c == who)
            .ok_or_else(|| format!("raw sockets: rank {who} is not a child of {rank}"))?;
        down[slot] = Some(s);
    }
    Ok(down.into_iter().flatten().collect())
}

impl SocketTree {
    /// A barrier over these sockets: a byte from each child, one up; then one from the
    /// parent, one to each child.
    pub(crate) fn barrier(&mut self) -> Result<(), String> {
        let mut b = [0u8; 1];
        for s in &mut self.down {
            s.read_exact(&mut b).map_err(err("barrier: read"))?;
        }
        if let Some(up) = &mut self.up {
            up.write_all(&[1]).map_err(err("barrier: write"))?;
            up.read_exact(&mut b).map_err(err("barrier: read"))?;
        }
        for s in &mut self.down {
            s.write_all(&[2]).map_err(err("barrier: write"))?;
        }
        Ok(())
    }

    /// One raw round from rank 0: down the tree, acknowledged up it.
    pub(crate) fn round(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.frame.clear();
        match &mut self.up {
            Some(up) => {
                let mut len = [0u8; 4];
                up.read_exact(&mut len).map_err(err("read"))?;
                self.frame.extend_from_slice(&len);
                self.frame.resize(4 + u32::from_le_bytes(len) as usize, 0);
                up.read_exact(&mut self.frame[4..]).map_err(err("read"))?;
            }
            None => {
                let len = u32::try_from(bytes.len()).map_err(|_| "raw sockets: too long")?;
                self.frame.extend_from_slice(&len.to_le_bytes());
                self.frame.extend_from_slice(bytes);
            }
        }
        for s in &mut self.down {
            s.write_all(&self.frame).map_err(err("write"))?;
        }
        let mut ack = [0u8; 1];
        for s in &mut self.down {
            s.read_exact(&mut ack).map_err(err("read an ack"))?;
        }
        if let Some(up) = &mut self.up {
            up.write_all(&[1]).map_err(err("acknowledge"))?;
        }
        std::hint::black_box(&self.frame);
        Ok(())
    }
}

/// The group of `n` ranks of one process (fan-out `k`) on loopback.
pub(crate) fn in_process(n: usize, k: usize) -> Result<Vec<SocketTree>, String> {
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        listeners.push(listen("127.0.0.1")?);
    }
    // The children connect on one thread while this one accepts: a listener's queue holds
    // only so many connections that nothing accepted.
    let at: Vec<String> = listeners.iter().map(|(_, a)| a.clone()).collect();
    std::thread::scope(|s| {
        let connecting = s.spawn(|| {
            (1..n)
                .map(|r| up_to(r, &at[(r - 1) / k.max(1)]))
                .collect::<Result<Vec<_>, String>>()
        });
        let downs: Result<Vec<Vec<TcpStream>>, String> = listeners
            .iter()
            .enumerate()
            .map(|(r, (l, _))| accept_children((r, n, k), l))
            .collect();
        let ups = connecting
            .join()
            .map_err(|_| "raw sockets: the connecting thread panicked".to_string())??;
        Ok(downs?
            .into_iter()
            .zip(std::iter::once(None).chain(ups.into_iter().map(Some)))
            .map(|(down, up)| SocketTree {
                up,
                down,
                frame: Vec::new(),
            })
            .collect())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::in_process;

    #[test]
    fn no_rank_leaves_the_barrier_before_the_last_comes() {
        // 20 ranks, fan-out 8: three levels. Each round one rank (a leaf, an interior
        // rank, rank 0 in turn) comes late; every rank must see all 20 arrivals on leaving.
        let n = 20;
        let mut trees = in_process(n, 8).expect("the sockets");
        let arrived = AtomicUsize::new(0);
        for (round, late) in [19usize, 1, 0].into_iter().enumerate() {
            std::thread::scope(|s| {
                for (rank, t) in trees.iter_mut().enumerate() {
                    let arrived = &arrived;
                    s.spawn(move || {
                        if rank == late {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        arrived.fetch_add(1, Ordering::SeqCst);
                        t.barrier().expect("the barrier");
                        let seen = arrived.load(Ordering::SeqCst);
                        assert!(
                            seen >= (round + 1) * n,
                            "round {round}: rank {rank} left having seen {seen} of {} arrivals (rank {late} late)",
                            (round + 1) * n
                        );
                    });
                }
            });
        }
    }
}
