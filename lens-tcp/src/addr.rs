//! Addresses: what a `host:port` resolves to, and whether a host is this machine's own.

use std::net::{SocketAddr, ToSocketAddrs as _};

use lens_core::{Error, Result};

use crate::config::split_host_port;
use crate::error::TcpError;

/// Every address `host:port` resolves to (IPv4 and IPv6), in the resolver's order.
pub(crate) fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    let (host, port) = split_host_port(addr)
        .ok_or_else(|| Error::config(format!("address {addr:?} is not host:port")))?;
    let mut out: Vec<SocketAddr> = Vec::new();
    let found = (host, port).to_socket_addrs().map_err(|io| {
        TcpError::Resolve {
            host: host.to_owned(),
            io,
        }
        .into_error(format!("cannot resolve {host}"))
    })?;
    for a in found {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err(Error::config(format!("{host} resolves to no address")));
    }
    Ok(out)
}

pub(crate) fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
