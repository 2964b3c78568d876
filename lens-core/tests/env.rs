//! Rank detection from launcher variables and the environment-variable carrier.

use lens_core::rank::resource_keys;
use lens_core::{Carrier, Error, Launcher, RankInfo};
use opentelemetry::{Key, Value};

fn from(vars: &[(&str, &str)]) -> Result<RankInfo, Error> {
    RankInfo::from_vars(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
}

#[test]
fn launcher_table() {
    type Want = Result<(usize, usize, Option<usize>, Launcher), &'static str>;
    let rows: Vec<(&str, Vec<(&str, &str)>, Want)> = vec![
        (
            "torchrun",
            vec![("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")],
            Ok((3, 8, Some(1), Launcher::Torchrun)),
        ),
        (
            "slurm",
            vec![
                ("SLURM_PROCID", "5"),
                ("SLURM_NTASKS", "16"),
                ("SLURM_LOCALID", "1"),
            ],
            Ok((5, 16, Some(1), Launcher::Slurm)),
        ),
        (
            "slurm, old NPROCS name",
            vec![("SLURM_PROCID", "1"), ("SLURM_NPROCS", "2")],
            Ok((1, 2, None, Launcher::Slurm)),
        ),
        (
            "open mpi",
            vec![
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ],
            Ok((2, 4, Some(0), Launcher::OpenMpi)),
        ),
        (
            "mpich hydra",
            vec![
                ("PMI_RANK", "1"),
                ("PMI_SIZE", "2"),
                ("MPI_LOCALRANKID", "1"),
            ],
            Ok((1, 2, Some(1), Launcher::MpichHydra)),
        ),
        (
            "pmix with slurm's task count",
            vec![("PMIX_RANK", "7"), ("SLURM_NTASKS", "8")],
            Ok((7, 8, None, Launcher::Pmix)),
        ),
        (
            "torchrun inside srun: torchrun wins (per-node srun task)",
            vec![
                ("RANK", "9"),
                ("WORLD_SIZE", "16"),
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
            ],
            Ok((9, 16, None, Launcher::Torchrun)),
        ),
        (
            "agreeing launchers",
            vec![
                ("RANK", "2"),
                ("WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
            ],
            Ok((2, 4, None, Launcher::Torchrun)),
        ),
        (
            "surrounding spaces are fine",
            vec![("RANK", " 1 "), ("WORLD_SIZE", "2")],
            Ok((1, 2, None, Launcher::Torchrun)),
        ),
        ("nothing set", vec![], Err("no launcher variables")),
        ("rank without size", vec![("RANK", "0")], Err("WORLD_SIZE")),
        (
            "pmix without any size",
            vec![("PMIX_RANK", "0")],
            Err("PMIX_RANK is set"),
        ),
        (
            "rank not below size",
            vec![("RANK", "4"), ("WORLD_SIZE", "4")],
            Err("not below"),
        ),
        (
            "local rank not below size",
            vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "4")],
            Err("local rank 4"),
        ),
        (
            "negative rank",
            vec![("RANK", "-1"), ("WORLD_SIZE", "4")],
            Err("RANK=\"-1\" is not"),
        ),
        (
            "non-numeric size",
            vec![("RANK", "0"), ("WORLD_SIZE", "four")],
            Err("WORLD_SIZE=\"four\""),
        ),
        (
            "malformed local rank",
            vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "x")],
            Err("LOCAL_RANK=\"x\""),
        ),
        (
            "conflict: same world, different ranks",
            vec![
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
            ],
            Err("conflicting ranks"),
        ),
        (
            "conflict: PMI vs PMIx",
            vec![("PMI_RANK", "1"), ("PMI_SIZE", "4"), ("PMIX_RANK", "3")],
            Err("conflicting ranks"),
        ),
        (
            "malformed outer launcher is still an error",
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SLURM_PROCID", "zero"),
                ("SLURM_NTASKS", "1"),
            ],
            Err("SLURM_PROCID"),
        ),
    ];
    for (why, vars, want) in rows {
        let got = from(&vars);
        match (&got, want) {
            (Ok(info), Ok((rank, size, local, launcher))) => {
                assert_eq!(
                    (info.rank, info.world_size, info.local_rank, info.launcher),
                    (rank, size, local, launcher),
                    "{why}"
                );
            }
            (Err(Error::Config { reason, .. }), Err(needle)) => {
                assert!(
                    reason.contains(needle),
                    "{why}: error {reason:?} should mention {needle:?}"
                );
            }
            _ => panic!("{why}: got {got:?}, expected {want:?}"),
        }
    }
}

#[test]
fn resource_has_nemo_lens_attributes() {
    let info = from(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("SLURM_JOB_ID", "4242"),
    ])
    .expect("info");
    let resource = info.resource();
    let get = |k: &str| resource.get(&Key::from(k.to_owned()));
    assert_eq!(get(resource_keys::RANK), Some(Value::I64(3)));
    assert_eq!(get(resource_keys::WORLD_SIZE), Some(Value::I64(8)));
    assert_eq!(get(resource_keys::LOCAL_RANK), Some(Value::I64(1)));
    assert_eq!(
        get(resource_keys::SERVICE_INSTANCE_ID),
        Some(Value::from("4242/rank-3"))
    );
    let single = RankInfo::single();
    assert_eq!(single.service_instance_id(), "rank-0");
    assert!(RankInfo::new(2, 2).is_err());
}

#[test]
fn carrier_env_round_trip() {
    let vars = [
        (
            "TRACEPARENT",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",
        ),
        ("TRACESTATE", "rojo=00f067aa0ba902b7"),
        ("BAGGAGE", "job.id=job-42"),
    ];
    let carrier = Carrier::from_env_with(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    });
    assert_eq!(carrier.get("traceparent"), Some(vars[0].1));
    let sc = carrier.span_context().expect("valid");
    assert_eq!(sc.trace_flags().to_u8(), 3);
    let env = carrier.to_env();
    assert_eq!(
        env,
        vars.iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect::<Vec<_>>()
    );

    let partial = Carrier::from_env_with(|k| (k == "TRACEPARENT").then(|| vars[0].1.to_owned()));
    assert_eq!(partial.to_env().len(), 1);
    assert!(Carrier::from_env_with(|_| None).is_empty());
}

#[test]
fn launcher_passes_context_to_a_child_process() {
    // A real child process: the launcher's carrier arrives in its environment.
    let carrier: Carrier = [(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )]
    .into_iter()
    .collect();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf %s \"$TRACEPARENT\"")
        .envs(carrier.to_env())
        .output()
        .expect("sh runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        carrier.get("traceparent").unwrap_or_default()
    );
}

/// The job id stays across requeues and elastic restarts; the run id changes with each.
#[test]
fn job_and_run_ids_from_the_launchers() {
    // (variables, job id, run id, why)
    let rows: &[(&[(&str, &str)], Option<&str>, Option<&str>, &str)] = &[
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2")],
            None,
            None,
            "no launcher id",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("TORCHELASTIC_RUN_ID", "job-7"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
            ],
            Some("job-7"),
            Some("job-7/restart-2"),
            "torchrun: an elastic restart is a new run",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("TORCHELASTIC_RUN_ID", "none"),
                ("TORCHELASTIC_RESTART_COUNT", "0"),
            ],
            None,
            None,
            "torchrun's default rendezvous id 'none' is no id",
        ),
        (
            &[
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_JOB_ID", "4242"),
            ],
            Some("4242"),
            Some("4242/restart-0"),
            "Slurm before any requeue",
        ),
        (
            &[
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_STEP_ID", "3"),
                ("SLURM_RESTART_COUNT", "1"),
            ],
            Some("4242"),
            Some("4242.3/restart-1"),
            "Slurm: the step and the requeue tell runs apart",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("TORCHELASTIC_RUN_ID", "rdzv-1"),
                ("TORCHELASTIC_RESTART_COUNT", "0"),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_RESTART_COUNT", "5"),
            ],
            Some("rdzv-1"),
            Some("rdzv-1/restart-0"),
            "torchrun inside Slurm: torchrun's ids win",
        ),
    ];
    for (vars, job, run, why) in rows {
        let info = from(vars).expect(why);
        assert_eq!(info.job_id.as_deref(), *job, "{why}");
        assert_eq!(info.run_id.as_deref(), *run, "{why}");
    }
}

/// A configuration error wrapped with the setting it is about reads "invalid configuration"
/// once.
#[test]
fn configuration_errors_do_not_nest() {
    let inner = Error::config("\"10s\" is not a whole number of milliseconds");
    let outer = Error::config_of("OTEL_EXPORTER_OTLP_TIMEOUT", inner);
    let text = outer.to_string();
    assert_eq!(text.matches("invalid configuration").count(), 1, "{text}");
    assert!(
        text.contains("OTEL_EXPORTER_OTLP_TIMEOUT: \"10s\""),
        "{text}"
    );
    let twice = Error::config_of("rank 3", outer);
    assert_eq!(
        twice.to_string().matches("invalid configuration").count(),
        1
    );
}
