"""`python -m bench.gpucheck`: see check.py."""
from bench.gpucheck.check import main

raise SystemExit(main())
