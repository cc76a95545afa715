# syntax=docker/dockerfile:1
# The gateway (`llmroute serve`) as a small non-root image, built from this checkout:
#   docker build -t llmroute:0.1.0 .
# The build stage makes llmroute's wheel and the wheels of what the gateway needs; the runtime
# stage installs those wheels only (no compiler, no source tree). docs/deploy.md: how to run it,
# and the Helm chart in deploy/helm/llmroute/ that runs it on Kubernetes.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m pip install --no-cache-dir "build==1.2.2.post1"
COPY pyproject.toml README.md ./
COPY providers ./providers
COPY llmroute ./llmroute
# llmroute's wheel, then every wheel `llmroute[server,redis]` needs, in /wheels.
RUN python -m build --wheel --outdir /dist . \
    && python -m pip wheel --no-cache-dir --wheel-dir /wheels \
        "$(find /dist -name 'llmroute-*.whl')[server,redis]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmroute gateway" \
      org.opencontainers.image.description="llmroute serve: an OpenAI-compatible gateway with TTFT routing, hedging and a cache" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 llmroute \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/llmroute --create-home \
        --shell /usr/sbin/nologin llmroute
# The wheels from the build stage, bound for this step only (no layer keeps them).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --no-deps /wheels/*.whl
# Where things are (docs/deploy.md):
#   /etc/llmroute/config/llmroute.toml   the config, mounted read-only (LLMROUTE_CONFIG)
#   /etc/llmroute/keys/keys.toml         the gateway's keys_file, if the config names it
#   /home/llmroute/.cache                the disk cache ([cache] backend = "disk"), writable
# Keys come from the environment: LLMROUTE_GATEWAY_KEY (or the variables [gateway] keys names),
# the providers' API keys (OPENAI_API_KEY, ...), and LLMROUTE_REDIS_URL for [redis] url_env.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/llmroute \
    XDG_CACHE_HOME=/home/llmroute/.cache \
    LLMROUTE_CONFIG=/etc/llmroute/config/llmroute.toml \
    LLMROUTE_HEALTH_URL=http://127.0.0.1:8000/health
USER 10001:10001
WORKDIR /home/llmroute
EXPOSE 8000
# /health answers 200 without a key once the gateway listens (docs/gateway.md, Endpoints).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['LLMROUTE_HEALTH_URL'], timeout=4)"]
# SIGTERM (docker stop, Kubernetes) ends the streams in flight with an error event and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["llmroute", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
