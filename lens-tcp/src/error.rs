//! lens-tcp's own error: what the system answered when a socket, thread or randomness call
//! failed, kept as the source of the [`lens_core::Error::Transport`] it caused.

use std::io;
use std::net::SocketAddr;

use lens_core::Error;

/// The backend's name in lens errors.
pub(crate) const BACKEND: &str = "tcp";

/// What the system answered when one of lens-tcp's calls failed, kept as the `source` of
/// the [`lens_core::Error::Transport`] it caused.
///
/// The transport error's message says what lens was doing ("cannot bind 127.0.0.1:29500");
/// this error's text is the system's answer ("Address already in use"), so a printed chain
/// says each once. The variant says which kind of call failed and the fields what it was
/// about, so code can act on it without reading text:
///
/// ```
/// use std::error::Error as _;
/// use lens_tcp::TcpError;
///
/// /// Rank 0 could not bind the rendezvous: another program holds the port.
/// fn port_taken(e: &lens_core::Error) -> bool {
///     matches!(
///         e.source().and_then(|s| s.downcast_ref::<TcpError>()),
///         Some(TcpError::Bind { io, .. }) if io.kind() == std::io::ErrorKind::AddrInUse
///     )
/// }
/// # let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
/// # let config = lens_tcp::TcpConfig::builder()
/// #     .rank(0)
/// #     .world_size(2)
/// #     .addr(taken.local_addr()?.to_string())
/// #     .key([7u8; 32])
/// #     .build()?;
/// # // The assertion of this example: binding a taken port fails.
/// # let e = lens_tcp::TcpBroadcaster::start(config).err().expect("the port is taken");
/// # assert!(port_taken(&e), "{e:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// A host name did not resolve.
    #[error("{io}")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's answer.
        io: io::Error,
    },
    /// No address the rendezvous resolves to could be bound (the last one's answer).
    #[error("{io}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The system's answer.
        io: io::Error,
    },
    /// A connection to a peer could not be started.
    #[error("{io}")]
    Connect {
        /// The peer's address.
        addr: SocketAddr,
        /// The system's answer.
        io: io::Error,
    },
    /// A call on a socket failed: making it, setting an option, polling, receiving.
    #[error("{io}")]
    Socket {
        /// The call, in words ("poll", "set linger").
        call: &'static str,
        /// The system's answer.
        io: io::Error,
    },
    /// This rank could not set itself up: its keeper thread, the keeper's wake-up pair, or
    /// randomness for a nonce.
    #[error("{io}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// The system's answer.
        io: io::Error,
    },
}

impl TcpError {
    /// The system's answer, whatever the call.
    pub fn io(&self) -> &io::Error {
        match self {
            TcpError::Resolve { io, .. }
            | TcpError::Bind { io, .. }
            | TcpError::Connect { io, .. }
            | TcpError::Socket { io, .. }
            | TcpError::Setup { io, .. } => io,
        }
    }

    /// `self` as the [`lens_core::Error::Transport`] of lens-tcp that says `doing` (what
    /// lens was doing) and keeps `self` as its source.
    pub(crate) fn into_error(self, doing: impl Into<String>) -> Error {
        Error::transport(BACKEND, doing, self)
    }
}

/// Maps a failed call on a socket to the error that keeps it.
pub(crate) fn socket_err(call: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |io| TcpError::Socket { call, io }.into_error(format!("cannot {call}"))
}

/// Maps a failed call while this rank sets itself up to the error that keeps it.
pub(crate) fn setup_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |io| TcpError::Setup { what, io }.into_error(format!("cannot {what}"))
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// The printed chain, as Python's exceptions and `{:#}`-style reports show it.
    fn chain(e: &Error) -> String {
        let mut text = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            text.push_str(": ");
            text.push_str(&s.to_string());
            next = s.source();
        }
        text
    }

    #[test]
    fn each_part_of_a_socket_failure_is_printed_once() {
        let rows: Vec<(&str, Error, &str, &str)> = vec![
            (
                "a socket call names the call in the message, the system's answer in the source",
                socket_err("poll")(io::Error::from(io::ErrorKind::Interrupted)),
                "cannot poll",
                "operation interrupted",
            ),
            (
                "a setup failure names what was set up",
                setup_err("start the keeper thread")(io::Error::from(io::ErrorKind::OutOfMemory)),
                "cannot start the keeper thread",
                "out of memory",
            ),
            (
                "a bind names the address in the message",
                TcpError::Bind {
                    addr: SocketAddr::from(([127, 0, 0, 1], 9)),
                    io: io::Error::from(io::ErrorKind::AddrInUse),
                }
                .into_error("cannot bind 127.0.0.1:9"),
                "cannot bind 127.0.0.1:9",
                "address in use",
            ),
        ];
        for (why, e, doing, answer) in rows {
            let text = chain(&e);
            assert_eq!(text.matches(doing).count(), 1, "{why}: {text}");
            assert_eq!(text.matches(answer).count(), 1, "{why}: {text}");
            let kept = e
                .source()
                .and_then(|s| s.downcast_ref::<TcpError>())
                .unwrap_or_else(|| panic!("{why}: the TcpError is the source: {e:?}"));
            assert!(kept.io().to_string().contains(answer), "{why}: {kept:?}");
        }
    }
}
