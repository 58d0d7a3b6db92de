# The edgedyn host toolchain: Debian bookworm, Python 3.11, torch 2.14.1, apache-tvm 0.27, the aarch64
# cross compiler and qemu-user for the emulated board. Installed by the same script as CI and the README.
FROM python:3.11-slim-bookworm

RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends ca-certificates git \
    && rm -rf /var/lib/apt/lists/*

# torch==2.14.1 from PyPI on Linux x86-64 is the CUDA build (several GB of NVIDIA wheels). For a small image,
# pass the CPU wheel index of your choice: docker build --build-arg PIP_EXTRA_INDEX_URL=... .
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}

WORKDIR /opt/edgedyn
COPY . .
RUN bash scripts/install.sh && rm -rf /var/lib/apt/lists/* /root/.cache/pip

WORKDIR /work
ENTRYPOINT []
CMD ["edgedyn", "--help"]
