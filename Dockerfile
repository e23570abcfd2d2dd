# decisiond and decisionctl on Debian 12, built by the project's own scripts.
#
#   docker build -t decisiond .
#   docker run -d --name decisiond -p 127.0.0.1:50051:50051 -p 127.0.0.1:9464:9464 \
#       -v decisiond-data:/data decisiond --insecure_plaintext --allow_unauthenticated
#   docker exec decisiond decisionctl list-problems
#
# Extra arguments go to decisiond, e.g. `docker run ... decisiond --sync_writes`. Inside the
# container it listens on 0.0.0.0, where it refuses to start without TLS and a tokens file
# unless told --insecure_plaintext --allow_unauthenticated, as above: that is for ports
# published on the host's loopback only (README.md, "Security").
# deploy/compose/docker-compose.yml runs it next to Prometheus and Grafana; deploy/README.md
# says how to operate it.

# ---- build: the same two scripts as a developer machine and CI (one source of truth) ----
FROM debian:12 AS build
WORKDIR /src
# The dependency layer only changes when the package list does.
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# deploy/build.sh runs install-deps.sh again (a no-op now) and the project's cmake commands.
# Tests and benchmarks are not needed in the image; JOBS sets the parallelism.
ARG JOBS=2
RUN JOBS=${JOBS} deploy/build.sh -DDECISION_BUILD_TESTS=OFF -DDECISION_BUILD_BENCH=OFF \
 && strip build/server/decisiond build/server/decision_model_probe build/client/decisionctl

# ---- runtime: the shared libraries only ----
FROM debian:12-slim AS runtime
COPY deploy/install-deps.sh /usr/local/lib/decisiond/install-deps.sh
RUN /usr/local/lib/decisiond/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/*
# decision_model_probe sits next to decisiond, where decisiond looks for it (--model_probe).
COPY --from=build /src/build/server/decisiond /src/build/server/decision_model_probe \
     /src/build/client/decisionctl /usr/local/bin/
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it and fsGroup can match.
RUN groupadd --system --gid 10001 decisiond \
 && useradd --system --uid 10001 --gid decisiond --home-dir /data --shell /usr/sbin/nologin decisiond \
 && mkdir -p /data && chown decisiond:decisiond /data && chmod 0750 /data
# Fail the build, not the first start, if a shared library is missing from the runtime list.
RUN if ldd /usr/local/bin/decisiond /usr/local/bin/decision_model_probe /usr/local/bin/decisionctl \
      | grep 'not found'; then exit 1; fi
# A new named volume is initialised from the image, so it starts owned by decisiond.
VOLUME ["/data"]
USER 10001:10001
WORKDIR /data
# 50051: gRPC (decision.v1.DecisionService, grpc.health.v1.Health, reflection).
# 9464: Prometheus metrics at /metrics.
EXPOSE 50051 9464
# decisionctl health asks grpc.health.v1.Health, which needs no token. With TLS on the port,
# add --tls and --tls_ca (and --tls_cert/--tls_key for mutual TLS) here.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD decisionctl health --server=127.0.0.1:50051 --deadline_ms=2000 >/dev/null || exit 1
# SIGTERM: stop accepting, drain (--shutdown_grace_ms, 5 s), checkpoint every problem, exit 0.
# Give `docker stop` more than that (compose sets stop_grace_period: 30s).
STOPSIGNAL SIGTERM
# On 0.0.0.0 decisiond refuses to start without TLS (--tls_cert, --tls_key) and a
# --tokens_file, unless told --insecure_plaintext and --allow_unauthenticated: mount the
# files and pass their flags (README, "Security").
# A container is a cgroup of its own, so the learner and the trainer can run at SCHED_IDLE
# (--background_priority=idle: they yield the CPU to the request threads).
ENTRYPOINT ["decisiond", "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--data_dir=/data", "--background_priority=idle"]
CMD []
