"""Runs and sweeps: a configuration in a process of its own (launch), end to end (job), its MLflow
record (record, tracking, store), the sweep around it (sweep, progress, search, resume), interrupts."""
