# Worker image for launcher=kubernetes (and pyxis/enroot on Slurm): CUDA, NCCL, EFA + aws-ofi-nccl,
# Open MPI, nccl-tests and this project. Build on a machine with Docker:
#   docker build -t <registry>/fsdpbench:1.0 . && docker push <registry>/fsdpbench:1.0
# then set cluster.kubernetes.image=<registry>/fsdpbench:1.0 (or cluster.slurm.container_image).
FROM nvcr.io/nvidia/pytorch:25.01-py3

ARG EFA_INSTALLER_VERSION=1.38.0
ARG NCCL_TESTS_VERSION=v2.14.1

# EFA userspace (libfabric, Open MPI) and the aws-ofi-nccl plugin, from AWS's installer.
RUN apt-get update && apt-get install -y --no-install-recommends curl && \
    curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz && \
    tar -xzf aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz && \
    cd aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify && \
    cd .. && rm -rf aws-efa-installer* && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:$PATH \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib:$LD_LIBRARY_PATH

# nccl-tests with MPI, at the path the MPIJob uses (bench/launchers/k8s_manifests.py: NCCL_TESTS).
RUN git clone --depth 1 --branch ${NCCL_TESTS_VERSION} https://github.com/NVIDIA/nccl-tests /opt/nccl-tests && \
    make -C /opt/nccl-tests MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda -j

# This project; the image's own CUDA build of torch satisfies torch>=2.6.
WORKDIR /workspace/fsdpbench
COPY pyproject.toml README.md ./
COPY bench bench
COPY trainer trainer
COPY nccl nccl
COPY analysis analysis
COPY sweeps sweeps
RUN pip install --no-cache-dir -e .
