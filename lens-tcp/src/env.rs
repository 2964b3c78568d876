//! Names of the environment variables [`TcpConfigBuilder::from_env`](crate::TcpConfigBuilder::from_env) reads.

/// The rendezvous address, `host:port` (rank 0 binds it). Overrides the two below.
pub const ADDR: &str = "LENS_TCP_ADDR";
/// torchrun's rendezvous host.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// torchrun's rendezvous port.
pub const MASTER_PORT: &str = "MASTER_PORT";
/// The job key: UTF-8 text taken as its bytes, or `hex:…` / `base64:…` for a binary key.
/// Child processes inherit it: prefer [`KEY_FILE`].
pub const KEY: &str = "LENS_TCP_KEY";
/// A file holding the job key (read when [`KEY`] is not set); see the crate docs.
pub const KEY_FILE: &str = "LENS_TCP_KEY_FILE";
/// Deadline of each collective, in seconds.
pub const TIMEOUT: &str = "LENS_TCP_TIMEOUT";
/// How long joining may take, in seconds.
pub const JOIN_TIMEOUT: &str = "LENS_TCP_JOIN_TIMEOUT";
/// Tree fan-out (a whole number of at least 1).
pub const FAN_OUT: &str = "LENS_TCP_FAN_OUT";
/// The host other ranks reach this rank at, for its tree children.
pub const HOST: &str = "LENS_TCP_HOST";
/// When the source's broadcast returns: `delivered` (the default) or `queued`; see
/// [`SourceReturns`](crate::SourceReturns).
pub const SOURCE_RETURNS: &str = "LENS_TCP_SOURCE_RETURNS";
/// How long a round's wait polls before it sleeps, in microseconds (`0`: never); see
/// [`TcpConfigBuilder::spin`](crate::TcpConfigBuilder::spin).
pub const SPIN_US: &str = "LENS_TCP_SPIN_US";
/// The group's ranks on this host, as launchers set it, in the order read: torchrun's,
/// Open MPI's, MPICH's (Hydra), Slurm's (with `--ntasks-per-node`). See
/// [`TcpConfigBuilder::local_world_size`](crate::TcpConfigBuilder::local_world_size).
pub const LOCAL_WORLD_SIZE: [&str; 4] = [
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];
