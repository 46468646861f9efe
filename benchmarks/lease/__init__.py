"""The parts of `benchmarks/gpu_lease.py`, one module each, each run as a process of its own."""
