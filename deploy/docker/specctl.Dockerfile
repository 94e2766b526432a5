# syntax=docker/dockerfile:1
# The specctl sidecar image: Python, gRPC, numpy, pyarrow and specctl's core
# dependencies; no vLLM and no torch. Build from the repository root:
#   docker build -f deploy/docker/specctl.Dockerfile -t specctl:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
# specctl and every core dependency as wheels; the vllm extra is not requested.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl \
    && rm -rf /wheels \
    && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('vllm', 'torch')))"
# grpc.health.v1 check over the unix socket, for the sidecar layout's probes.
COPY --chmod=0755 deploy/docker/grpc_health_check.py /usr/local/bin/specctl-health
USER 10001:10001
EXPOSE 50051 9400
ENTRYPOINT ["specctl"]
CMD ["serve", "--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9400"]
