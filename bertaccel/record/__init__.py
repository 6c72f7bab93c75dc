"""What lands in the MLflow store, and how it is read back: a run's identity and record
(run_record: names, config hashes, params and tags, the outcomes recorded without training), the
client (tracking), a finished run's readings (readings), its splits as MLflow inputs (datasets),
a sweep's parent run and resume by config_hash (sweep), and a store that fails under a sweep
(store_failure). Nothing here starts a process or handles a signal: that is runs/."""
