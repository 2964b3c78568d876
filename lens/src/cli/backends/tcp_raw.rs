//! The TCP bench's second baseline, `raw_zmq`: bare ZeroMQ ROUTER/DEALER sockets in lens's
//! layout (the star, or the tree of `--fan-out`), no framing, no authentication: what lens's
//! group ran on until December 2026 (STREAM sockets then), kept to compare with. Each parent sends the
//! bytes to its children and acknowledges up once they all have; rank 0's round ends with
//! its children's acks, as lens's does. The same code runs the ranks as threads and as
//! processes.

use lens::Broadcaster;
use lens::tcp::TcpBroadcaster;
use opentelemetry::Context;

use super::super::measure::BenchRank;
use super::tcp_raw_sockets::SocketTree;

/// One rank of the TCP bench: lens's broadcaster, and the baselines in the same layout.
pub(crate) struct TcpRank {
    pub(crate) lens: TcpBroadcaster,
    /// `raw`: bare TCP sockets.
    pub(crate) raw: SocketTree,
    /// `raw_zmq`: bare ZeroMQ sockets.
    pub(crate) raw_zmq: RawTree,
}

/// The TCP bench's baselines, in the order [`TcpRank::baseline`] numbers them.
pub(crate) const BASELINES: &[&str] = &["raw", "raw_zmq"];

impl BenchRank for TcpRank {
    fn group(&self) -> &dyn Broadcaster {
        &self.lens
    }

    fn baseline(&mut self, i: usize, bytes: &[u8], _: &Context) -> Result<(), String> {
        match i {
            0 => self.raw.round(bytes),
            _ => self.raw_zmq.round(bytes),
        }
    }
}

/// Longest wait for a peer's message while the sockets form, at a barrier or in a round.
pub(crate) const WAIT_MS: i64 = 60_000;

pub(crate) fn zerr(e: zmq::Error) -> String {
    format!("zmq: {e}")
}

/// Rank `r`'s children in lens's tree of `n` ranks with fan-out `k` (`k·r+1 ..= k·r+k`).
pub(crate) fn children(r: usize, n: usize, k: usize) -> std::ops::Range<usize> {
    let first = (k * r + 1).min(n);
    first..(k * r + k + 1).min(n)
}

pub(crate) fn id(r: usize) -> Vec<u8> {
    format!("r{r}").into_bytes()
}

pub(crate) fn rank_of(identity: &[u8]) -> Option<usize> {
    std::str::from_utf8(identity)
        .ok()?
        .strip_prefix('r')?
        .parse()
        .ok()
}

pub(crate) fn wait_in(socket: &zmq::Socket, what: &str) -> Result<(), String> {
    match socket.poll(zmq::POLLIN, WAIT_MS).map_err(zerr)? {
        0 => Err(format!("{what}: nothing in {} s", WAIT_MS / 1000)),
        _ => Ok(()),
    }
}

pub(crate) fn socket(ctx: &zmq::Context, kind: zmq::SocketType) -> Result<zmq::Socket, String> {
    let s = ctx.socket(kind).map_err(zerr)?;
    s.set_linger(0).map_err(zerr)?;
    Ok(s)
}

/// Binds `s` to an ephemeral port of `host` (this rank's address) and returns its endpoint.
pub(crate) fn bound(s: &zmq::Socket, host: &str) -> Result<String, String> {
    s.bind(&format!("tcp://{host}:0")).map_err(zerr)?;
    s.get_last_endpoint()
        .map_err(zerr)?
        .map_err(|_| "no endpoint".to_string())
}

/// One rank's raw sockets: the DEALER to its parent and the ROUTER its children reach.
pub(crate) struct RawTree {
    pub(crate) up: Option<zmq::Socket>,
    pub(crate) down: zmq::Socket,
    pub(crate) children: Vec<usize>,
}

impl RawTree {
    /// One raw round from rank 0: down the tree, acknowledged up it.
    pub(crate) fn round(&self, bytes: &[u8]) -> Result<(), String> {
        let data = match &self.up {
            Some(up) => {
                wait_in(up, "raw round")?;
                up.recv_bytes(0).map_err(zerr)?
            }
            None => bytes.to_vec(),
        };
        for &c in &self.children {
            self.down
                .send_multipart([id(c), data.clone()], 0)
                .map_err(zerr)?;
        }
        for _ in &self.children {
            wait_in(&self.down, "raw acks")?;
            self.down.recv_multipart(0).map_err(zerr)?;
        }
        if let Some(up) = &self.up {
            up.send(&b"ack"[..], 0).map_err(zerr)?;
        }
        std::hint::black_box(data);
        Ok(())
    }
}

/// The parent of rank `r > 0` in lens's tree of fan-out `k`.
pub(crate) fn parent(r: usize, k: usize) -> usize {
    (r - 1) / k.max(1)
}

/// Rank `rank`'s DEALER to its parent at `endpoint`, greeted so the parent knows it.
pub(crate) fn up_to(
    ctx: &zmq::Context,
    rank: usize,
    endpoint: &str,
) -> Result<zmq::Socket, String> {
    let up = socket(ctx, zmq::DEALER)?;
    up.set_identity(&id(rank)).map_err(zerr)?;
    up.connect(endpoint).map_err(zerr)?;
    up.send(&b"hi"[..], 0).map_err(zerr)?;
    Ok(up)
}

/// Waits for the greeting of each of `kids` on `down`.
pub(crate) fn greeted(down: &zmq::Socket, kids: &[usize]) -> Result<(), String> {
    for _ in kids {
        wait_in(down, "the raw tree")?;
        down.recv_multipart(0).map_err(zerr)?;
    }
    Ok(())
}

/// The raw group of `n` ranks of one process (fan-out `k`), each with its own context
/// (and so its own I/O thread), as separate processes have.
pub(crate) fn in_process(n: usize, k: usize) -> Result<Vec<RawTree>, String> {
    let ctxs: Vec<zmq::Context> = (0..n).map(|_| zmq::Context::new()).collect();
    let mut downs = Vec::with_capacity(n);
    let mut endpoints = Vec::with_capacity(n);
    for ctx in &ctxs {
        let down = socket(ctx, zmq::ROUTER)?;
        endpoints.push(bound(&down, "127.0.0.1")?);
        downs.push(down);
    }
    let mut ups = vec![None];
    for (r, ctx) in ctxs.iter().enumerate().skip(1) {
        ups.push(Some(up_to(ctx, r, &endpoints[parent(r, k)])?));
    }
    let mut ranks = Vec::with_capacity(n);
    for (r, (down, up)) in downs.into_iter().zip(ups).enumerate() {
        let kids: Vec<usize> = children(r, n, k).collect();
        greeted(&down, &kids)?;
        ranks.push(RawTree {
            up,
            down,
            children: kids,
        });
    }
    Ok(ranks)
}
