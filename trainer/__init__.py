"""The FSDP2 training worker, run under torchrun as `python -m trainer`."""
