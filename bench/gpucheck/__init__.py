"""`python -m bench.gpucheck`: the GPU claims proven on a one-GPU machine (check.py runs the sweeps,
evidence.py holds the checks and writes the evidence files)."""
