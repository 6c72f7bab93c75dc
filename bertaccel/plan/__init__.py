"""Predict a sweep before it runs: `python -m bertaccel.plan` (the overrides of bertaccel.run -m).

Seams: grid.py expands the sweep as Hydra would; work.py counts each configuration's batches,
padded tokens, steps and FLOPs; calibrate.py finds the most similar finished runs (or the
hardware profile) for an achieved FLOP/s and a power; roofline.py moves a run's time to another
GPU by its GEMM, memory-bound and launch parts; pricing.py turns them into time, cost and
energy; output.py scores and prunes; hook.py makes every run log its own prediction.
"""
