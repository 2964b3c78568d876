//! The limits on connections that have not proven the key: the handshake deadline and the
//! cap on how many may be open at once.

use std::time::{Duration, Instant};

use super::{ConnId, Net};

/// Limits on connections, most of them for peers that have not proven the key.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Largest frame from a peer that proved the key.
    pub max_frame: usize,
    /// How long an accepted connection may take to prove the key.
    pub handshake: Duration,
    /// Accepted connections not yet proven; past this the oldest is closed.
    pub max_unproven: usize,
    /// Frames an accepted connection may send before it proves the key.
    pub unproven_frames: u32,
    /// What a connection may hold queued to send beyond what the kernel took, in 64 KiB
    /// units; a send past it fails as full.
    pub queue: usize,
    /// Connections the kernel holds that lens has not accepted yet (`listen(2)`'s backlog;
    /// [`crate::budget::listen_queue`]).
    pub backlog: usize,
}

impl Net {
    /// Closes accepted connections past their handshake deadline; returns when the next
    /// one expires.
    pub(super) fn expire(&mut self, now: Instant) -> Instant {
        let handshake = self.limits.handshake;
        while let Some((opened, id)) = self.unproven.front() {
            if !self.is_unproven(id) {
                self.unproven.pop_front();
            } else if now >= *opened + handshake {
                let id = id.clone();
                self.unproven.pop_front();
                tracing::debug!(addr = ?self.addr(&id), "closed a connection that did not prove the key in time");
                self.close(&id);
            } else {
                return *opened + handshake;
            }
        }
        now + Duration::from_secs(3600)
    }

    pub(super) fn is_unproven(&self, id: &ConnId) -> bool {
        self.conns.get(id).is_some_and(|c| c.verified.is_none())
    }

    /// Past the cap of unproven connections, the oldest go: an attacker that opens
    /// connections fast can then delay a join, but never exhaust descriptors or memory.
    pub(super) fn evict_unproven(&mut self) {
        if self.unproven.len() <= self.limits.max_unproven {
            return;
        }
        let mut unproven = std::mem::take(&mut self.unproven);
        unproven.retain(|(_, id)| self.is_unproven(id));
        while unproven.len() > self.limits.max_unproven {
            if let Some((_, id)) = unproven.pop_front() {
                tracing::debug!("closed the oldest unproven connection (too many)");
                self.close(&id);
            }
        }
        self.unproven = unproven;
    }
}
