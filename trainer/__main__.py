"""`python -m trainer`. The sleep test mode (`--fault sleep --fault-seconds N`, used by the scheduling
benchmark and tests) is served here, before torch is imported: the worker sleeps N seconds and exits 0
without training or a summary, so a run's duration is set by the test, not by this machine's cores."""
import argparse
import sys
import time

_test = argparse.ArgumentParser(add_help=False)
_test.add_argument("--fault", default="none")
_test.add_argument("--fault-seconds", type=float, default=0.0)
_known, _ = _test.parse_known_args(sys.argv[1:])
if _known.fault == "sleep":
    print(f"fsdpbench test mode: sleeping {_known.fault_seconds:g} s instead of training, "
          f"from {time.time():.3f}", flush=True)
    time.sleep(_known.fault_seconds)
    print(f"fsdpbench test mode: slept until {time.time():.3f}", flush=True)
    sys.exit(0)

from bench.core.warm import run_warm  # noqa: E402  (after the test mode: it must not wait for torch)

run_warm("trainer")  # in the local sweep's warm process, where it has one; it exits as the run did

from bench.core.records import exit_now  # noqa: E402
from trainer.main import main  # noqa: E402

exit_now(main())
