//! A group with its step sampler is a group: [`Sampled`] forwards every call to the group
//! it wraps, and gives its sampler to the broadcasts that end and begin steps.

use std::time::Instant;

use super::Broadcaster;
use crate::arrivals::Arrivals;
use crate::error::Result;
use crate::sample::{Sampled, StepSampler};

#[async_trait::async_trait]
impl<B: Broadcaster> Broadcaster for Sampled<B> {
    fn rank(&self) -> usize {
        self.inner().rank()
    }

    fn world_size(&self) -> usize {
        self.inner().world_size()
    }

    fn max_payload(&self) -> usize {
        self.inner().max_payload()
    }

    fn local_rank(&self) -> Option<usize> {
        self.inner().local_rank()
    }

    async fn broadcast(&self, root: usize, payload: Option<&[u8]>) -> Result<Vec<u8>> {
        self.inner().broadcast(root, payload).await
    }

    fn broadcast_sync(&self, root: usize, payload: Option<&[u8]>) -> Option<Result<Vec<u8>>> {
        self.inner().broadcast_sync(root, payload)
    }

    /// Those the sampler took for a round whose span did not record them (a caller in
    /// another language), else the group's.
    fn take_arrivals(&self) -> Option<Arrivals> {
        self.take_stashed().or_else(|| self.inner().take_arrivals())
    }

    fn rounds_started(&self) -> Option<u64> {
        self.inner().rounds_started()
    }

    fn received_at(&self) -> Option<Instant> {
        self.inner().received_at()
    }

    fn carry_vote(&self, vote: bool) -> bool {
        self.inner().carry_vote(vote)
    }

    fn stand_for(&self, rank: usize, came: Instant) -> bool {
        self.inner().stand_for(rank, came)
    }

    fn step_sampler(&self) -> Option<&StepSampler> {
        Some(self.sampler())
    }
}
