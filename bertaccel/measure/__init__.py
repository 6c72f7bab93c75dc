"""Measurement sources: every number a run reports that is not the loop's own (collectors on NVML,
GPM and RAPL; FLOPs and MFU; step clocks; the profiler; layer timing; memory; carbon; the
backprop-time estimator), each a Reading(value, source), null with a reason."""
