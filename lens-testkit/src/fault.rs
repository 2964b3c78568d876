//! Fault injection around any [`Broadcaster`].

use std::time::Duration;

use lens_core::{Broadcaster, Result};

/// How a [`Fault::Corrupt`] damages the bytes a rank receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// Keep only the first half (a truncated frame).
    Truncate,
    /// Replace every byte with `0xff` (never valid UTF-8).
    Garbage,
    /// Flip the first byte, so the JSON no longer starts with `{`.
    FlipFirstByte,
}

impl Corruption {
    /// Applies the damage to `bytes`.
    pub fn apply(self, bytes: &mut Vec<u8>) {
        match self {
            Corruption::Truncate => bytes.truncate(bytes.len() / 2),
            Corruption::Garbage => bytes.iter_mut().for_each(|b| *b = 0xff),
            Corruption::FlipFirstByte => {
                if let Some(b) = bytes.first_mut() {
                    *b ^= 0x80;
                }
            }
        }
    }
}

/// A fault for [`Faulty`] to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Sleep this long before every broadcast (a slow rank).
    Delay(Duration),
    /// Damage the bytes this rank receives when it is not the root.
    Corrupt(Corruption),
}

/// A broadcaster that injects [`Fault`]s around an inner one.
///
/// ```
/// use std::time::Duration;
/// use lens_testkit::{Fault, Faulty, LocalCluster};
///
/// let mut ranks = LocalCluster::new(2).broadcasters().into_iter();
/// // A cluster of two ranks yields two broadcasters.
/// let first = ranks.next().expect("a cluster of two has a rank 0");
/// let slow = Faulty::new(first, vec![Fault::Delay(Duration::from_millis(5))]);
/// # drop(slow);
/// ```
#[derive(Debug)]
pub struct Faulty<B> {
    inner: B,
    faults: Vec<Fault>,
}

impl<B: Broadcaster> Faulty<B> {
    /// Wraps `inner` with `faults`.
    pub fn new(inner: B, faults: Vec<Fault>) -> Self {
        Faulty { inner, faults }
    }

    /// The wrapped broadcaster.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<B: Broadcaster> Broadcaster for Faulty<B> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    fn local_rank(&self) -> Option<usize> {
        self.inner.local_rank()
    }

    fn take_arrivals(&self) -> Option<lens_core::arrivals::Arrivals> {
        self.inner.take_arrivals()
    }

    fn rounds_started(&self) -> Option<u64> {
        self.inner.rounds_started()
    }

    fn received_at(&self) -> Option<std::time::Instant> {
        self.inner.received_at()
    }

    fn stand_for(&self, rank: usize, came: std::time::Instant) -> bool {
        self.inner.stand_for(rank, came)
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        for fault in &self.faults {
            if let Fault::Delay(d) = fault {
                futures_timer::Delay::new(*d).await;
            }
        }
        let mut bytes = self.inner.broadcast(root, payload).await?;
        if self.inner.rank() != root {
            for fault in &self.faults {
                if let Fault::Corrupt(c) = fault {
                    c.apply(&mut bytes);
                }
            }
        }
        Ok(bytes)
    }
}
