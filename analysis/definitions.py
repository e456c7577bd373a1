"""How the report's numbers are defined: its Definitions section, as the page shows it."""

DEFINITIONS = """\
- **tokens/s**: global tokens per second of the whole job, from the median step time of the steady-state
  window (warm-up steps excluded); spread = min/max over repeats and the std of step times.
- **TFLOPS/GPU** (model): training FLOPs per token 6*N + 12*L*H*Q*T (N = parameters without the input
  embedding, L layers, H heads, Q head dim, T sequence length; the torchtitan / llm-foundry convention)
  times tokens/s, divided by the GPUs.
- **MFU** = model TFLOPS/GPU / the GPU's dense peak for the compute dtype (bench/core/hardware.py, no
  sparsity).
  **HFU** also counts the forward recompute of activation checkpointing. CPU runs have no MFU.
  fp8_tensorwise runs (torchao Float8 linears) are divided by the BF16 peak too, so MFU compares
  precisions on one denominator; against the FP8 peak (twice the BF16 one) it would be about half.
- **compile time**: with compile=true (each transformer block through torch.compile), the warm-up steps'
  time beyond steady-state steps: compilation, kept out of the timed window. Inductor caches compiled
  graphs on the node (/tmp): a node that compiled the same blocks before takes seconds, a cold one longer.
- **Scaling efficiency** at n nodes = (tokens/s at n / n) / (tokens/s at base / base), base = the smallest
  node count with an ok run of the same configuration. A weak-scaling study (no global batch) keeps each
  GPU's micro batch, so the global batch grows with the nodes. A strong-scaling study (global batch "gb N":
  N sequences per optimizer step at every node count, micro batch x accumulation steps x GPUs = N) compares
  the same work: the same number is (step time at base / step time at n) x base / n, and the timed unit is
  the optimizer step, all its micro-batches included. "next node count": how much faster (or slower) a
  step is at the next planned node count, and the share it buys of the step time linear scaling would save
  by going there (its `next_share` in strong.csv; measured, or predicted); the knee is the first node count
  whose next step buys less than study.knee_share.
- **straggler**: the node whose own compute per step (each rank's forward and backward of its blocks and
  output layer, without the time it waited in FSDP's collectives: CUDA events on a GPU, wall time on a CPU)
  was more than preflight.tolerance above the median of the other nodes'; in brackets, by how much, and the
  seconds a step the others waited for it. Every rank waits for the slowest, so such a run's efficiency is
  that node's, not FSDP's.
- **busbw** (all-reduce) = algbw * 2(n-1)/n with algbw = bytes / time (nccl-tests' definition);
  avg busbw = mean over message sizes (and placements), as nccl-tests' "Avg bus bandwidth" line.
- Memory: peak allocated/reserved by torch per GPU (max over ranks), NVML memory used (max over GPUs and
  samples); on CPU, the host RSS peak per process. **Predicted** memory is what the plan judged the run
  by: rank 0's peak of one steady training step of the run's own model, parallelization and optimizer on
  fake tensors (FSDPMemTracker), else the lower bound of its state (studies planned before: the analytic
  estimate); error = (predicted - measured peak allocated) / measured. The plan adds headroom for what
  the allocator's peak does not hold: reserved / allocated and NVML used - reserved show what each GPU run
  really needed.
- **Predicted** throughput (bench/predict/perf.py, made when the run was planned): step = matmuls at a
  calibrated fraction of the dense peak + elementwise and optimizer memory traffic at HBM bandwidth + the
  FSDP communication prefetch cannot hide (network: the study's probe, else the instance's published
  nccl-tests figure) + contention; error = measured / predicted - 1. The constants, their sources and every
  published row's error: `python benchmarks/perf_model.py`.
- **Communication model**: the bus bytes FSDP moves per GPU and step for the strategy (analysis/comm.py)
  divided by the all-reduce busbw measured at the same node and EFA count, as if nothing overlapped. A
  point is communication-bound when that time is >= 90% of the step, or when the growth of it explains at
  least half of the step time lost against the base node count.
- **Cost**: measured wall time (start-up included) x nodes x the cluster's on-demand price per
  instance-hour; per million tokens and time to train use the steady-state tokens/s.
- **Loss parity**: runs equal in everything but strategy, AC and wrapping must share a loss curve
  (max relative deviation within 0.1% in fp32, 2% in mixed precision, 5% in pure bf16).
- **MFU's denominator** is named beside every MFU ("989.4 dense bf16 (H100-SXM)"): the datasheet's dense
  peak, never the 2:4-sparse figure twice as large.
- **GPU energy**: every GPU's joules over the timed steps, from NVML's energy counter (millijoules since the
  driver loaded) read as the first timed step begins and after the last one's sync, else its power samples
  integrated (the run's energy_source says which), over the tokens the run trained in them; the board's
  energy only (hosts, network and cooling are not in it). kWh to train = tokens x J/token / 3.6e6; its cost
  at cluster.energy_price (USD per kWh). A CPU run: not measured.
- **System**: each node's facts as its worker read them at start (bench/core/system.py: GPU, driver, CUDA,
  NCCL, libfabric, aws-ofi-nccl, RDMA devices, topology, instance type, image, versions, git); a study whose
  nodes are not one system says so first, because its efficiency then mixes machines.
"""
