# syntax=docker/dockerfile:1
# Interchange in a container: the embedded default's listeners on all
# interfaces, durable data on a volume, a health check on the admin API.
#
#   docker build -t interchange .
#   docker run -d --name interchange \
#     -p 5044:5044 -p 7070:7070 -p 7071:7071 -p 7072:7072 -p 7073:7073 -p 12345:12345 -p 9464:9464 -p 9465:9465 \
#     -v interchange-data:/var/lib/interchange interchange
#
# Another config: mount it over /etc/interchange/interchange.toml. Reload it
# with `docker kill --signal HUP interchange`. See docs/deployment.md.

ARG PYTHON_VERSION=3.11

# Stage 1: build the wheels of the gateway, its bundled ndjson plugin and
# every dependency, so the runtime image needs no compiler and no source tree.
# gcc builds the optional C speedups of Micromessage2's framing (setup.py).
FROM python:${PYTHON_VERSION}-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY gateway ./gateway
COPY protocols ./protocols
COPY plugins/ndjson ./plugins/ndjson
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels . ./plugins/ndjson

# Stage 2: a slim runtime with the wheels installed, run by a user of its own.
FROM python:${PYTHON_VERSION}-slim AS runtime
RUN groupadd --system interchange \
    && useradd --system --gid interchange --home-dir /var/lib/interchange \
       --shell /usr/sbin/nologin interchange \
    && install -d -o interchange -g interchange -m 0750 /var/lib/interchange
COPY --from=build /wheels /tmp/wheels
RUN python -m pip install --no-cache-dir --no-index --find-links /tmp/wheels \
       /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
COPY examples/docker/interchange.toml /etc/interchange/interchange.toml
COPY LICENSE /usr/share/doc/interchange/LICENSE

USER interchange
WORKDIR /var/lib/interchange
VOLUME ["/var/lib/interchange"]
# lumberjack, ndjson, ttrpc, segment-append, metrics, admin (status page, /healthz)
EXPOSE 5044 7070 7071 7072 7073 12345 9464 9465
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9465/healthz', timeout=4).status == 200 else 1)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["gateway"]
CMD ["run", "/etc/interchange/interchange.toml"]
