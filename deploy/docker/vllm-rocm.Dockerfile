# syntax=docker/dockerfile:1
# vLLM's ROCm image with the specctl engine plugin (the scheduler subclass and
# its gRPC client) added. Build from the repository root:
#   docker build -f deploy/docker/vllm-rocm.Dockerfile -t specctl-vllm-rocm:0.1.0 .
# specctl supports vLLM 0.32 and 0.33: pick the ROCm image of one of those releases.
ARG VLLM_ROCM_IMAGE=vllm/vllm-openai-rocm:v0.32.0
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
# specctl is pure Python: one wheel for any interpreter of the ROCm image.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${VLLM_ROCM_IMAGE}
COPY --from=wheel /wheels /tmp/specctl-wheels
# Without the vllm extra, and with the image's own vLLM, torch and triton
# pinned, so that pip can add specctl's small dependencies (grpcio, protobuf,
# structlog, ...) but never replace the ROCm builds.
RUN pip freeze | grep -iE '^(vllm|torch|triton|pytorch-triton-rocm)==' > /tmp/rocm-pins.txt \
    && pip install --no-cache-dir --constraint /tmp/rocm-pins.txt /tmp/specctl-wheels/*.whl \
    && rm -rf /tmp/specctl-wheels /tmp/rocm-pins.txt \
    && python -c "import specctl.engine.config, grpc, structlog"
