"""The MLflow store itself, apart from the runs in it (record/ holds those): one package, three parts.

- check.py: whether a tracking URI can be used at all (store_problem, store_refusal), one line
  saying why not, before any work;
- lock.py: one writer at a time (store_lock), a SQLite store created whole or not at all;
- file.py: where a `sqlite:///` store's file is and what it holds, read without writing;
- keep.py: the store a sweep writes to stays that file (StoreLost otherwise).

It sits at the base of the layers, not under record/, because an option's own check asks it:
`tracking.check_store` (options/tracking.py) refuses an unusable store as bad input during
validation, and options/ is below record/. What the rest of the package asks is named here.
"""
from bertaccel.store.check import check_store, exit_if_store_unusable, server_problem, store_problem, store_refusal
from bertaccel.store.file import sqlite_file, sqlite_state
from bertaccel.store.keep import StoreLost, keep_store
from bertaccel.store.lock import repair_store, store_lock

__all__ = ["StoreLost", "check_store", "exit_if_store_unusable", "keep_store", "repair_store", "server_problem",
           "sqlite_file", "sqlite_state", "store_lock", "store_problem", "store_refusal"]
