"""The collective probes' harness side: nccl-tests' command lines and environment (command), their output
and the torch probe's parsed (parse) into what one run states (result), a probe run's records from its
logs (records). The probe itself, the worker a launcher starts, is `python -m nccl.probe`."""
