"""Running a plan: which runs start when (schedule.py), each run's path through its launcher (runner.py,
watch.py), live progress, and what a finished run's records become (collect.py, classify.py, straggler.py)."""
