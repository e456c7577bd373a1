#!/usr/bin/env bash
# Wheels for a GPU machine that has a CUDA build of torch and transformers but no package index: what the
# harness's GPU path needs beyond them (Hydra, OmegaConf and its ANTLR runtime, torchao for Float8), and what
# `python -m pytest -m gpu` needs to collect the test modules (the Kubernetes client, jsonschema).
#   scripts/offline_wheels.sh DIR [TORCHAO_VERSION]     (default 0.18.0, the release for torch 2.11)
# then on that machine, in this checkout (run from its root, the harness needs no install of its own):
#   python3 -m pip install --no-index --no-deps DIR/*.whl && python3 -m bench.gpucheck
set -euo pipefail
dir="${1:?usage: scripts/offline_wheels.sh DIR [TORCHAO_VERSION]}"
torchao="${2:-0.18.0}"
mkdir -p "$dir"
platform=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platform[@]}" -d "$dir" hydra-core==1.3.2 omegaconf==2.3.0 "torchao==$torchao"
python3 -m pip wheel -q --no-deps -w "$dir" antlr4-python3-runtime==4.9.3  # published as a source archive only
# `python -m pytest -m gpu` collects every test module, the Kubernetes ones too: the Kubernetes client and
# jsonschema, with what they need that a CUDA image of torch, transformers and requests lacks (the set that
# ran on the H200 of benchmarks/evidence/NVIDIA-H200_*_2026-11-27)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platform[@]}" -d "$dir" kubernetes==37.0.2 durationpy==0.11 oauthlib==4.0.1 requests-oauthlib==2.0.0 \
    websocket-client==1.9.2 aiohttp-retry==2.9.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 tzdata==2026.6 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
    referencing==0.37.0 rpds-py==2026.9.1
ls "$dir"
