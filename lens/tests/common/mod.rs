//! Runs the `lens` program as a user would, with a deadline; killed if it outlives it.
#![allow(dead_code)]

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `lens args` with `env` set (and no `LENS_TCP_KEY` inherited), killed past `deadline`.
pub fn lens_with_env(args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lens"))
        .args(args)
        .env_remove("LENS_TCP_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lens starts");
    // Read while it runs, so that a full pipe cannot stall it.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o);
        let _ = err.read_to_string(&mut e);
        (o, e)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lens {args:?} ran past its {deadline:?} deadline and was killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (stdout, stderr) = reader.join().expect("reader");
    Run {
        ok: status.success(),
        stdout,
        stderr,
    }
}

/// `lens args`, killed past `deadline`.
pub fn lens(args: &[&str], deadline: Duration) -> Run {
    lens_with_env(args, &[], deadline)
}
