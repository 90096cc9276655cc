# syntax=docker/dockerfile:1
#
# One image for every part of Flotilla: `flotilla node` (the members), `flotilla operator`, the
# pipeline (`flotilla pipeline`, which the operator runs as the Job of a point-in-time restore)
# and the local tools. Build from the repository root:
#
#   docker build -t flotilla:0.1.0 .
#
# The pipeline is the `pipeline` extra of pyproject.toml (PySpark, pyarrow, pandas: some 800 MB
# installed) plus a headless Java 17 runtime (some 230 MB with its libraries). Members and the
# operator never use it; an image for them alone, without point-in-time restores (their Job
# would fail at once, saying PySpark is missing), leaves both out:
#
#   docker build --build-arg FLOTILLA_EXTRAS= -t flotilla:0.1.0-slim .

# Debian 12 (bookworm): the Debian release that packages Java 17, which Spark 4 runs on.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: a wheel of the repository and wheels of everything it depends on -------------
FROM ${PYTHON_IMAGE} AS builder
ARG FLOTILLA_EXTRAS="pipeline"
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
ARG FLOTILLA_EXTRAS="pipeline"
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
# (The JRE's install scripts link its man pages into a folder the slim image does not have.)
RUN case ",${FLOTILLA_EXTRAS}," in \
      *,pipeline,*) mkdir -p /usr/share/man/man1 \
        && apt-get update \
        && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
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
