"""python -m bertaccel.doctor: what bertaccel sees on this machine, one line per item: the GPUs,
torch, Triton, xFormers, NVML, RAPL, then each option of the config groups with a machine check
(and each preset): whether a run of it goes ahead here, or is recorded skipped and why. Every
line that says something is missing is followed by one `fix:` line, unless it names its fix itself.

It reads; it changes nothing. Exit status 0 when every check could be made (a machine without a
GPU is an answer, not a failure), 1 when one could not (its line says why), 2 on bad arguments."""
