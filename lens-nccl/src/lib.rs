//! NCCL backend for **lens**: trace-context broadcast on GPU (cudarc, loaded at run time).
//!
//! [`NcclBroadcaster`] keeps a persistent device slab (a 16-byte header and the payload);
//! a round is one `ncclBroadcast` of the slab, an event polled against a deadline, and a
//! device-to-host copy. Payloads over the slab send their remainder in a second broadcast.
//!
//! - It builds with no CUDA installed and never panics on a machine without CUDA or NCCL:
//!   [`probe`] checks the libraries and their symbols first (cudarc panics when one is
//!   missing) and everything returns [`Error::Unavailable`](lens_core::Error::Unavailable) with the reason.
//! - [`NcclBroadcaster::bootstrap`] creates the NCCL unique id on rank 0 and sends it over
//!   any other [`Broadcaster`](lens_core::Broadcaster) (TCP, MPI, local), then joins NCCL under a deadline
//!   ([`NcclOptions::init_timeout`]). A communicator the application already has works too:
//!   [`NcclBroadcaster::from_comm`] takes a cudarc `Comm` over,
//!   [`NcclBroadcaster::from_shared`] shares one the application keeps using, and
//!   [`NcclBroadcaster::from_raw`] takes raw NCCL and CUDA handles (from PyTorch, say).
//! - A round that does not complete by the deadline returns [`Error::Timeout`](lens_core::Error::Timeout) and aborts the
//!   communicator (`ncclCommAbort`) when lens owns it; a round that fails part-way does the
//!   same (the rank is out of step with its peers). Later rounds get [`Error::Closed`](lens_core::Error::Closed).
//! - The round (slab, spill, deadline, refusal after a failure) is `lens_core::backend::slab`,
//!   shared with the MPI backend; [`NcclOptions::from_env`] reads its settings from the
//!   variables of [`mod@env`]. The GPU side is written against a small device trait; this crate's tests run it,
//!   conformance suite included, on a simulated NCCL group, and the cudarc path runs on
//!   `lens_testkit::fake_gpu`, so both are checked without a GPU.
//! - NCCL failures keep the NCCL result code in the error.
//! - `broadcast` blocks its thread until the round is done (it polls a CUDA event).
//!
//! ```no_run
//! use lens_nccl::NcclBroadcaster;
//! use lens_tcp::{TcpBroadcaster, TcpConfig};
//!
//! # fn main() -> lens_core::Result<()> {
//! // Any broadcaster carries the NCCL id; here the job's TCP group (torchrun variables).
//! let tcp = TcpBroadcaster::connect(TcpConfig::from_env()?)?;
//! let local_rank = lens_core::RankInfo::from_env()?.local_rank.unwrap_or(0);
//! let gpu = futures::executor::block_on(NcclBroadcaster::bootstrap(&tcp, local_rank))?;
//! let carrier = lens_core::blocking::broadcast_trace_context(&gpu, 0)?;
//! # let _ = carrier;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// `unsafe` is allowed only in the modules that load CUDA and NCCL, hold device memory or
// move the communicator between threads (`probe`, `device`, `broadcaster`, `bootstrap`).

/// The cudarc this crate is built on, to name its types (`Comm`, `CudaStream`, raw handles)
/// at the same version.
pub use cudarc;

mod bootstrap;
mod broadcaster;
mod device;
mod error;
mod options;
mod probe;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use bootstrap::exchange_id;
pub use broadcaster::NcclBroadcaster;
pub use error::NcclResult;
pub use options::{DEFAULT_INIT_TIMEOUT, NcclOptions, env};
pub use probe::{Probe, probe};

use lens_core::backend::slab;

/// Bytes of the slab header: marker, slab size, payload length, format version.
pub const SLAB_HEADER: usize = slab::HEADER_LEN;
/// Default slab size in bytes.
pub const DEFAULT_SLAB_SIZE: usize = slab::DEFAULT_SLAB_SIZE;
/// Default deadline of a round.
pub const DEFAULT_ROUND_TIMEOUT: std::time::Duration = slab::DEFAULT_ROUND_TIMEOUT;
/// Bytes of an NCCL unique id.
pub const ID_LEN: usize = 128;
