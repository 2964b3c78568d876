//! Where the rank processes that `lens demo` and `lens bench --processes` start run: this
//! machine's loopback, or `--hosts H` simulated hosts (the test kit's network namespaces,
//! joined by a switch with `--link`'s delays), so that a job's ranks talk across a network.

use std::ffi::OsStr;
use std::process::Command;

use lens::testkit::hosts::{Link, Network};

use super::args::HostsArgs;

/// Rank 0's port on its simulated host: every host is a namespace of its own, so it is
/// free there.
const PORT: u16 = 29500;

/// Where the ranks of one job run.
pub(crate) struct Placement {
    net: Option<Network>,
    ranks: usize,
    link: String,
    port: u16,
}

impl Placement {
    /// The ranks of a job of `ranks`, on the hosts `args` asks for.
    pub(crate) fn new(args: &HostsArgs, ranks: usize) -> Result<Placement, String> {
        let Some(hosts) = args.hosts.map(|h| h as usize) else {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("no free loopback port: {e}"))?
                .port();
            return Ok(Placement {
                net: None,
                ranks,
                link: String::new(),
                port,
            });
        };
        if hosts > ranks {
            return Err(format!(
                "--hosts {hosts}: more hosts than the {ranks} ranks"
            ));
        }
        let text = args.link.clone().unwrap_or_default();
        let link = Link::parse(&text).map_err(|e| format!("--link: {e}"))?;
        let net = Network::builder()
            .hosts(hosts)
            .link(link)
            .build()
            .map_err(|e| format!("--hosts {hosts}: {e}"))?;
        Ok(Placement {
            net: Some(net),
            ranks,
            link: text,
            port: PORT,
        })
    }

    /// The simulated hosts, where the ranks run on them.
    pub(crate) fn network(&self) -> Option<&Network> {
        self.net.as_ref()
    }

    /// Rank `rank`'s host (0 on loopback).
    fn host_of(&self, rank: usize) -> usize {
        let hosts = self.net.as_ref().map_or(1, |n| n.hosts().len());
        rank * hosts / self.ranks.max(1)
    }

    /// The address of rank `rank`'s host.
    fn addr_of(&self, rank: usize) -> String {
        self.net.as_ref().map_or_else(
            || "127.0.0.1".to_owned(),
            |n| n.hosts()[self.host_of(rank)].addr().to_string(),
        )
    }

    /// Rank 0's rendezvous address, `HOST:PORT`.
    pub(crate) fn rendezvous(&self) -> String {
        format!("{}:{}", self.addr_of(0), self.port)
    }

    /// `program` as rank `rank`, on its host, told its host's address
    /// (`LENS_TCP_HOST`) and its local rank (its index among its host's ranks).
    pub(crate) fn command(&self, rank: usize, program: impl AsRef<OsStr>) -> Command {
        let mut c = match &self.net {
            Some(n) => n.hosts()[self.host_of(rank)].command(program),
            None => Command::new(program),
        };
        let host = self.host_of(rank);
        let first = (0..rank).find(|&r| self.host_of(r) == host).unwrap_or(rank);
        c.env(lens::tcp::env::HOST, self.addr_of(rank))
            .env("LOCAL_RANK", (rank - first).to_string());
        c
    }

    /// What the bench's title says of where the ranks ran, with the switch's cost.
    pub(crate) fn describe(&self) -> String {
        let Some(n) = &self.net else {
            return "loopback".to_owned();
        };
        let s = n.stats();
        let per_packet = s.cpu.as_secs_f64() * 1e6 / (s.forwarded.max(1) as f64);
        format!(
            "{} simulated hosts, link {:?}; the switch: {} packets, {:.0} µs late on average, \
             {per_packet:.1} µs CPU a packet",
            n.hosts().len(),
            self.link,
            s.forwarded,
            s.late_mean.as_secs_f64() * 1e6
        )
    }
}
