"""`python -m bench.gpucheck`: the GPU claims proven on a one-GPU machine (check.py runs the sweeps,
judge.py holds the checks, evidence.py writes the evidence files)."""
