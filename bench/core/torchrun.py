"""`python -m bench.core.torchrun ARGS`: torchrun (`python -m torch.distributed.run ARGS`), as its agent runs
for a CPU run on this machine (the local launcher's, the local Slurm test cluster's). Where the environment
names a warm process (bench/core/warm.py) the agent runs in a child of it, which has torch imported already:
an agent otherwise spends a second or two importing torch before it starts a worker, and two simulated
nodes' agents import it side by side on the same cores. Its workers still ask the warm process for their
own children. Without one, torchrun runs here, as it always would. Standard library only until torchrun
itself runs."""
import runpy

from bench.core.warm import run_warm

TORCHRUN = "torch.distributed.run"

if __name__ == "__main__":
    run_warm(TORCHRUN, keep_socket=True)  # exits as the agent did, where a warm process ran it
    runpy.run_module(TORCHRUN, run_name="__main__", alter_sys=True)
