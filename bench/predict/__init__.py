"""What a planned run will need and deliver, before it runs: memory (memory.py), step time (perf.py, its
published rows in published.py, the study's own calibration in calibrate.py) and cost (cost.py)."""
