# syntax=docker/dockerfile:1
# The study orchestrator with a CUDA build of PyTorch. The host needs only the NVIDIA driver and
# the NVIDIA Container Toolkit: the CUDA libraries come inside torch's Linux wheels.
#   docker build -t gpu-study-orchestrator:latest .
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

# The same torch as the README's; on Linux the default index serves its CUDA build.
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The largest layer first and alone: it changes only with TORCH_VERSION, never with our code.
RUN pip install torch==${TORCH_VERSION}

WORKDIR /app
# The other dependencies, read from pyproject.toml alone: rebuilt only when that list changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the code, installed the way the README installs it.
COPY README.md ./
COPY orchestrator ./orchestrator
COPY samplers ./samplers
COPY adapters ./adapters
COPY migrations ./migrations
RUN pip install -e .

# A non-root user; the GPU-claims directory is its own so a fresh compose volume inherits that.
RUN useradd --create-home --uid 10001 --user-group orchestrator \
 && mkdir -p /var/lib/orchestrator/gpu-claims /work \
 && chown -R orchestrator:orchestrator /var/lib/orchestrator /work
USER 10001:10001
WORKDIR /work

ENTRYPOINT ["python", "-m", "orchestrator"]
CMD ["--help"]
