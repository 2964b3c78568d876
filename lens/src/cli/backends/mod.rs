//! One file per backend, each implementing [`super::backend::Backend`].

use super::args::BackendArg;
use super::backend::Backend;

mod local;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
#[cfg(feature = "tcp")]
mod tcp;

/// The backend the command line names.
pub(crate) fn select(arg: BackendArg) -> &'static dyn Backend {
    match arg {
        BackendArg::Local => &local::Local,
        #[cfg(feature = "tcp")]
        BackendArg::Tcp => &tcp::Tcp,
        #[cfg(feature = "mpi")]
        BackendArg::Mpi => &mpi::Mpi,
        #[cfg(feature = "nccl")]
        BackendArg::Nccl => &nccl::Nccl,
    }
}
