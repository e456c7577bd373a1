"""The C scanner of the nccl-tests parser (nccl/_fastscan.c), built where a C compiler is present; the
parser falls back to pyarrow kernels where it is not (optional=True: a failed build is not an error)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("nccl._fastscan", ["nccl/_fastscan.c"], optional=True,
                             extra_compile_args=["-O3"])])
