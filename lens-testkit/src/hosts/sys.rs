//! The three system calls the simulated network needs that std does not offer: attaching a
//! TUN device, waiting on several descriptors with a nanosecond timeout, and a thread's own
//! CPU time.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::time::Duration;

/// `TUNSETIFF` = `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// `struct ifreq` as `TUNSETIFF` reads it: the name, the flags, and the rest of the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// Opens a new TUN device (layer 3, no packet information header), non-blocking, named by
/// the kernel after `pattern` (such as `lenst%d`); returns it and its name.
pub(super) fn open_tun(pattern: &str) -> io::Result<(File, String)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _rest: [0; 22],
    };
    let bytes = pattern.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the interface name {pattern:?} is too long"),
        ));
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: the descriptor is open and `req` is a valid `struct ifreq` that the kernel
    // reads and writes (it returns the name it chose) within its size.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &raw mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = req
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(req.name.len());
    Ok((file, String::from_utf8_lossy(&req.name[..len]).into_owned()))
}

/// Waits until one of `files` is readable or `timeout` has passed; returns which are.
pub(super) fn wait_readable(
    files: &[File],
    timeout: Duration,
    ready: &mut Vec<bool>,
) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = files
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(i32::try_from(timeout.subsec_nanos()).unwrap_or(0)),
    };
    let n = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
    // SAFETY: `fds` holds `n` valid pollfd entries for open descriptors, `ts` is a valid
    // timespec, and no signal mask is passed.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), n, &raw const ts, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    ready.clear();
    ready.extend(fds.iter().map(|p| p.revents & libc::POLLIN != 0));
    Ok(())
}

/// Asks the kernel to wake this thread's timed waits within 1 µs of their deadline (the
/// default slack is 50 µs, which would add to every simulated delay).
pub(super) fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

/// Moves the calling thread into the network namespace that `ns` (a file under
/// `/run/netns`) names.
pub(super) fn enter_netns(ns: &File) -> io::Result<()> {
    // SAFETY: the descriptor is open; setns changes only the calling thread's namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the calling thread in the real-time FIFO class at a low priority, so that the
/// switch runs as soon as a packet is due even with every core busy with ranks (a switch
/// has hardware of its own; this one shares the machine's cores). Root may; others get an
/// error, and the switch runs at the normal priority.
pub(super) fn real_time() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
