//! Simulated hosts on one machine: each host a Linux network namespace of its own with an
//! address of its own, joined by a switch of the test kit's that delays, drops, cuts and
//! resets what crosses it, so that ranks on "different hosts" talk over a network with the
//! latency, asymmetry, loss and partitions of a real cluster.
//!
//! Each host's namespace has its loopback and one TUN device with the address
//! `198.18.0.<i + 1>/24` (host `i`). The range 198.18.0.0/15 is reserved for benchmarking
//! network devices (RFC 2544) and never routed; no namespace has any other interface or a
//! route out, so nothing a test sends can leave the machine. Traffic between the ranks of
//! one host stays on that host (its loopback); traffic between hosts goes through the
//! switch, a thread of the process that built the [`Network`]: it reads each packet from
//! the sender's TUN device and writes it into the receiver's once its [`Link`]s' delays
//! have passed. This kernel has no `netem` qdisc; the switch is what stands in for it, and
//! [`Network::stats`] says what it costs (how late it delivered, its CPU), so figures taken
//! through it can be trusted.
//!
//! Needs root, `/dev/net/tun` and the `ip` command (iproute2);
//! [`Network::available`] says which is missing. Dropping the network stops the switch
//! and deletes its namespaces; a network left behind by a killed process is deleted by the
//! next one built on the machine.
//!
//! ```no_run
//! use std::time::Duration;
//! use lens_testkit::hosts::{Link, Network};
//!
//! // Two hosts, 1 ms each way between them; host 1's uplink 2 ms slower.
//! let net = Network::builder()
//!     .hosts(2)
//!     .link(Link::new().delay(Duration::from_micros(500)))
//!     .link_of(1, Link::new().send(Duration::from_micros(2500)).recv(Duration::from_micros(500)))
//!     .build()?;
//! let mut server = net.hosts()[0].command("my-rank");
//! server.arg("--addr").arg(format!("{}:29500", net.hosts()[0].addr()));
//! // ... spawn it, and the others on host 1; cut host 1 off for 2 s:
//! net.cut(1);
//! std::thread::sleep(Duration::from_secs(2));
//! net.restore(1);
//! println!("{:?}", net.stats());
//! # Ok::<(), std::io::Error>(())
//! ```

mod link;
mod packet;
mod relay;
mod switch;
mod sys;

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub use link::Link;
pub use relay::Relay;
use switch::{Port, Shared, Switch};

/// The start of every namespace name a network makes: `lensnet-<pid>-<n>-<host>`.
const NAME_PREFIX: &str = "lensnet-";
/// Most hosts in one network (one /24 of addresses).
pub const MAX_HOSTS: usize = 250;

/// Networks built by this process so far, so that each has names of its own.
static BUILT: AtomicUsize = AtomicUsize::new(0);

/// Builds a [`Network`]: how many hosts, and their links.
#[derive(Debug, Clone)]
#[must_use]
pub struct NetworkBuilder {
    hosts: usize,
    link: Link,
    links: Vec<(usize, Link)>,
}

impl NetworkBuilder {
    /// How many hosts (1 to [`MAX_HOSTS`]; default 2).
    pub fn hosts(mut self, n: usize) -> Self {
        self.hosts = n;
        self
    }

    /// Every host's link (default [`Link::new`], nothing added).
    pub fn link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    /// Host `host`'s link, over the one [`NetworkBuilder::link`] gives every host.
    pub fn link_of(mut self, host: usize, link: Link) -> Self {
        self.links.push((host, link));
        self
    }

    /// Makes the namespaces and starts the switch.
    ///
    /// # Errors
    /// Where [`Network::available`] fails, a host out of range, or an `ip` command that
    /// fails (its words in the error).
    pub fn build(self) -> io::Result<Network> {
        Network::available()?;
        if !(1..=MAX_HOSTS).contains(&self.hosts) {
            return Err(invalid(format!(
                "{} hosts: a network has 1 to {MAX_HOSTS}",
                self.hosts
            )));
        }
        let mut ports = vec![
            Port {
                link: self.link,
                cut: false,
            };
            self.hosts
        ];
        for (host, link) in self.links {
            ports
                .get_mut(host)
                .ok_or_else(|| invalid(format!("link_of({host}): there are {} hosts", self.hosts)))?
                .link = link;
        }
        sweep_stale();
        let id = format!(
            "{NAME_PREFIX}{}-{}",
            std::process::id(),
            BUILT.fetch_add(1, Ordering::Relaxed)
        );
        // Deleted again when dropped, also when a later host fails.
        let mut made = Namespaces(Vec::with_capacity(self.hosts));
        let mut devices = Vec::with_capacity(self.hosts);
        let mut hosts = Vec::with_capacity(self.hosts);
        for i in 0..self.hosts {
            let name = format!("{id}-{i}");
            ip(&["netns", "add", &name])?;
            made.0.push(name.clone());
            let addr = host_addr(i);
            let (device, dev) = sys::open_tun("lensn%d")
                .map_err(|e| io::Error::new(e.kind(), format!("opening a TUN device: {e}")))?;
            ip(&["link", "set", &dev, "netns", &name])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &dev,
            ])?;
            ip(&["-n", &name, "link", "set", &dev, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            let ns = File::open(format!("/run/netns/{name}"))?;
            devices.push(device);
            hosts.push(Host {
                index: i,
                name,
                addr,
                ns,
            });
        }
        let shared = Arc::new(Shared::new(ports));
        let switch = Switch::new(
            devices,
            hosts.iter().map(|h| h.addr).collect(),
            Arc::clone(&shared),
        );
        let thread = std::thread::Builder::new()
            .name("lens-switch".into())
            .spawn(move || switch.run())?;
        Ok(Network {
            hosts,
            shared,
            switch: Some(thread),
            _namespaces: made,
        })
    }
}

/// Simulated hosts joined by a switch (see [the module](self)). Dropping it stops the
/// switch and deletes the hosts' namespaces.
#[derive(Debug)]
pub struct Network {
    hosts: Vec<Host>,
    shared: Arc<Shared>,
    switch: Option<JoinHandle<()>>,
    // Last: deleted after the switch has stopped.
    _namespaces: Namespaces,
}

impl Network {
    /// A builder: 2 hosts, links that add nothing.
    pub fn builder() -> NetworkBuilder {
        NetworkBuilder {
            hosts: 2,
            link: Link::new(),
            links: Vec::new(),
        }
    }

    /// Whether this machine can make simulated hosts: root, `/dev/net/tun` and `ip`. The
    /// error says which is missing, for a test to report itself skipped with it.
    ///
    /// # Errors
    /// [`io::ErrorKind::Unsupported`] naming what is missing.
    pub fn available() -> io::Result<()> {
        let missing = |what: &str| {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("simulated hosts need {what}"),
            ))
        };
        if !is_root() {
            return missing("root (network namespaces and TUN devices)");
        }
        if !std::path::Path::new("/dev/net/tun").exists() {
            return missing("/dev/net/tun (the tun kernel module)");
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return missing("the ip command (Debian package iproute2)");
        }
        Ok(())
    }

    /// The hosts, host `i` at index `i`.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Sets host `host`'s link from now on (packets already held keep their delay).
    pub fn set_link(&self, host: usize, link: Link) {
        self.shared.change(|ports| {
            if let Some(p) = ports.get_mut(host) {
                p.link = link;
            }
        });
    }

    /// Cuts host `host` off: every packet from it or to it is dropped until
    /// [`Network::restore`], as when its cable is pulled (its connections stay open and
    /// retransmit, as TCP does).
    pub fn cut(&self, host: usize) {
        self.set_cut(host, true);
    }

    /// Joins host `host` to the switch again after [`Network::cut`].
    pub fn restore(&self, host: usize) {
        self.set_cut(host, false);
    }

    fn set_cut(&self, host: usize, cut: bool) {
        self.shared.change(|ports| {
            if let Some(p) = ports.get_mut(host) {
                p.cut = cut;
            }
        });
    }

    /// What the switch has done so far.
    pub fn stats(&self) -> SwitchStats {
        let c = &self.shared.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let forwarded = get(&c.forwarded);
        SwitchStats {
            forwarded,
            lost: get(&c.lost),
            cut: get(&c.cut),
            resets: get(&c.resets),
            late_mean: Duration::from_nanos(
                get(&c.late_sum_ns).checked_div(forwarded).unwrap_or(0),
            ),
            late_max: Duration::from_nanos(get(&c.late_max_ns)),
            cpu: Duration::from_nanos(get(&c.cpu_ns)),
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.switch.take() {
            let _ = t.join();
        }
    }
}

/// What the switch has done: packets forwarded and dropped, and its own cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SwitchStats {
    /// Packets delivered to their host.
    pub forwarded: u64,
    /// Packets dropped by a link's loss.
    pub lost: u64,
    /// Packets dropped because their sender or receiver was cut off.
    pub cut: u64,
    /// TCP connections reset by a link's reset chance.
    pub resets: u64,
    /// How late after its due time a packet was written, on average: the switch's own delay
    /// (waking up, writing), on top of the links'.
    pub late_mean: Duration,
    /// The latest a packet was written after its due time.
    pub late_max: Duration,
    /// The switch thread's CPU time so far.
    pub cpu: Duration,
}

/// One simulated host: a network namespace with an address.
#[derive(Debug)]
pub struct Host {
    index: usize,
    name: String,
    addr: Ipv4Addr,
    ns: File,
}

impl Host {
    /// Its index in the network.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its namespace's name (`ip netns exec NAME ...` runs a command there).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address, which the other hosts reach it at.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// `program` to be run on this host (through `ip netns exec`); add its arguments and
    /// environment as for any command.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Moves the calling thread onto this host: the sockets it opens afterwards, and the
    /// threads it starts (a ZeroMQ context's, say), are this host's. For a thread of its
    /// own, which never goes back.
    ///
    /// # Errors
    /// The system's, when the thread cannot change its namespace.
    pub fn enter(&self) -> io::Result<()> {
        sys::enter_netns(&self.ns)
    }
}

/// Host `i`'s address.
fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, u8::try_from(i + 1).unwrap_or(u8::MAX))
}

/// Namespaces this process made, deleted when dropped.
#[derive(Debug)]
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.0 {
            if let Err(e) = ip(&["netns", "delete", name]) {
                tracing::warn!(namespace = %name, error = %e, "a simulated host was left behind");
            }
        }
    }
}

/// Deletes the namespaces of networks whose process is gone (killed before it could).
fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix(NAME_PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

/// Runs `ip ARGS`; its stderr is the error when it fails.
fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn is_root() -> bool {
    // The effective user id, as the kernel checks it; std has no call for it.
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}
