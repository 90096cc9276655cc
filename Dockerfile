# syntax=docker/dockerfile:1
#
# One image for every part of Flotilla: `flotilla node` (the members), `flotilla operator` and
# the local tools. Build from the repository root:
#
#   docker build -t flotilla:0.1.0 .
#
# The pipeline's PySpark jobs are left out by default: pyspark is some 300 MB and needs a Java
# runtime, and neither the members nor the operator use it. To build an image that also runs
# the pipeline (the `pipeline` extra of pyproject.toml, plus a headless JRE):
#
#   docker build --build-arg FLOTILLA_EXTRAS=pipeline -t flotilla:0.1.0-pipeline .

ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: a wheel of the repository and wheels of everything it depends on -------------
FROM ${PYTHON_IMAGE} AS builder
ARG FLOTILLA_EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the distribution is built from (pyproject.toml's package-dir), so that editing
# tests or docs does not invalidate the wheel layer.
COPY pyproject.toml README.md ./
COPY flotilla/ flotilla/
COPY node/ node/
COPY operator/ operator/
COPY pipeline/ pipeline/
RUN pip wheel --wheel-dir /wheels ".${FLOTILLA_EXTRAS:+[${FLOTILLA_EXTRAS}]}"

# --- the image: a virtualenv with those wheels, run as an unprivileged user ----------------
FROM ${PYTHON_IMAGE}
# (re-declared: an ARG before the first FROM is only visible to FROM lines)
ARG PYTHON_IMAGE
ARG FLOTILLA_EXTRAS=""
ARG VERSION=0.1.0
ARG REVISION=unknown

LABEL org.opencontainers.image.title="flotilla" \
      org.opencontainers.image.description="Flotilla: Raft replicated-state-machine clusters on Kubernetes (node, operator and tools)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

ENV VIRTUAL_ENV=/opt/flotilla \
    PATH=/opt/flotilla/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The user the chart and the operator's pods run as (runAsUser/runAsGroup 10001), with the
# members' data directory (a volume is mounted there in Kubernetes) writable by it.
RUN groupadd --system --gid 10001 flotilla \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/flotilla --no-create-home \
        --shell /usr/sbin/nologin flotilla \
 && mkdir -p /var/lib/flotilla \
 && chown 10001:10001 /var/lib/flotilla

# The pipeline extra runs Spark, which needs a Java runtime (a runtime, not a build tool).
RUN case ",${FLOTILLA_EXTRAS}," in \
      *,pipeline,*) apt-get update \
        && apt-get install -y --no-install-recommends default-jre-headless \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac

# Installed from the builder's wheels only (--no-index): nothing is compiled here, and the
# wheels are bind-mounted, so they do not stay in a layer. The venv gets no pip of its own.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv --without-pip "$VIRTUAL_ENV" \
 && python -m pip --python "$VIRTUAL_ENV/bin/python" install --no-cache-dir \
        --disable-pip-version-check --no-index --find-links /wheels \
        "flotilla${FLOTILLA_EXTRAS:+[${FLOTILLA_EXTRAS}]}" \
 && flotilla --help > /dev/null

USER 10001:10001
WORKDIR /var/lib/flotilla
# client and admin API, Raft peers, the operator's liveness endpoint
EXPOSE 2379 2380 8080

ENTRYPOINT ["flotilla"]
CMD ["--help"]
