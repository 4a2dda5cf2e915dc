# syntax=docker/dockerfile:1
# Keel's image: `keel worker` and `keel api` (docker-compose.yml runs both; docs/deploy.md).
# It installs exactly what uv.lock pins (`uv sync --frozen --no-dev`): no dev tools and no
# `local-model` extra, so the embedded SmolLM2 server is not in the image; point
# KEEL_MODELS_CONFIG at hosted models or vLLM servers instead.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE}

COPY --from=uv /uv /uvx /usr/local/bin/

# Use the image's Python, never a downloaded one; compile bytecode at build time because
# the runtime user cannot write to /app.
ENV UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /app

# Dependencies first: this layer is rebuilt only when the lockfile or pyproject.toml change.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project

# Then Keel itself. The project stays an editable install of /app (uv's default) because
# Keel reads configs/ and store/migrations/ next to its packages.
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev

# Non-root at run time: /app stays root-owned and read-only; state goes to KEEL_DATA_DIR.
RUN groupadd --system --gid 10001 keel \
    && useradd --system --uid 10001 --gid keel --home-dir /home/keel --create-home keel \
    && mkdir -p /data \
    && chown keel:keel /data

ENV PATH="/app/.venv/bin:${PATH}" \
    KEEL_DATA_DIR=/data

USER keel

EXPOSE 8088

ENTRYPOINT ["keel"]
CMD ["--help"]
