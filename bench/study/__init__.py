"""What a study is before it runs: the sweep composed from sweeps/ (compose.py) and expanded into its
planned runs, each with its predicted memory, time and cost (plan.py)."""
