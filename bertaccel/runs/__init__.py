"""Runs and sweeps as processes: a configuration in a process of its own (launch, launchers: inline or process, forkserver,
preload, cuda_free_imports, bytecode), end to end (job), where its start-up goes (startup), the
sweep around it (progress, sweep_plan, sweep_jobs, claims), Ctrl-C (interrupt), the output folder
(run_dir), the hub probe (hub). What they write to MLflow is record/."""
