"""The config groups' meanings: one module per option (its check, what this machine can run, its
effect on the run). The schema Hydra composes is config/'s; `checks.validate` asks every option."""
