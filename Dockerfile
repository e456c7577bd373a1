# Worker image for launcher=kubernetes (PyTorchJob workers, MPIJob launcher and workers) and for pyxis/enroot
# on Slurm: NGC PyTorch (CUDA, NCCL, torch), AWS's EFA userspace (libfabric, Open MPI, aws-ofi-nccl),
# nccl-tests >= 2.17.3 (for -J) on PATH, an ssh server set up for the MPI operator, and this project.
#   docker build -t <registry>/fsdpbench:1.0 . && docker push <registry>/fsdpbench:1.0
# then set cluster.kubernetes.image=<registry>/fsdpbench:1.0 (or cluster.slurm.container_image).
FROM nvcr.io/nvidia/pytorch:25.01-py3

ARG EFA_INSTALLER_VERSION=1.38.0
ARG NCCL_TESTS_VERSION=v2.17.6

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# openssh: MPIJob workers run `sshd -De` (bench/launchers/k8s_manifests.py) and the launcher's mpirun reaches
# them over ssh with the keys the operator mounts in /root/.ssh. Host keys are made here; the launcher does
# not ask about unknown hosts (worker pods are new every job); sshd accepts the mounted keys' modes.
# The NGC base image's Ubuntu release fixes these packages' versions; pinning them here would break each bump.
# hadolint ignore=DL3008
RUN apt-get update && \
    apt-get install -y --no-install-recommends curl openssh-client openssh-server && \
    rm -rf /var/lib/apt/lists/* && \
    mkdir -p /var/run/sshd && ssh-keygen -A && \
    printf 'Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n' \
        >> /etc/ssh/ssh_config && \
    sed -i 's/^#\?StrictModes .*/StrictModes no/; s/^#\?PermitRootLogin .*/PermitRootLogin prohibit-password/' \
        /etc/ssh/sshd_config

# EFA userspace (libfabric, Open MPI) and the aws-ofi-nccl plugin, from AWS's installer.
WORKDIR /tmp/efa
RUN curl -fsSL -O "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" && \
    tar -xzf "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"
WORKDIR /tmp/efa/aws-efa-installer
RUN ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify && rm -rf /tmp/efa
# The installer's Open MPI, not the base image's HPC-X one: OPAL_PREFIX of the base image would point
# mpirun and orted at HPC-X's tree.
ENV OPAL_PREFIX="" \
    PATH=/opt/nccl-tests/build:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:$PATH \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib:$LD_LIBRARY_PATH

# nccl-tests with MPI; all_reduce_perf, all_gather_perf and reduce_scatter_perf are on PATH (Slurm scripts
# call them by name) and at the path the MPIJob names (k8s_manifests.NCCL_TESTS; the others beside it).
RUN git clone --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests /opt/nccl-tests && \
    make -C /opt/nccl-tests MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda -j"$(nproc)"

# This project; the image's own CUDA build of torch satisfies torch>=2.6. torchao is pinned to the release
# built against that torch (torchao's compatibility table: 0.9 <-> 2.6): a newer one needs a newer torch.
ARG TORCHAO_VERSION=0.9.0
WORKDIR /workspace/fsdpbench
COPY pyproject.toml README.md ./
COPY bench bench
COPY trainer trainer
COPY nccl nccl
COPY analysis analysis
COPY sweeps sweeps
RUN pip install --no-cache-dir "torchao==${TORCHAO_VERSION}" && pip install --no-cache-dir -e .
