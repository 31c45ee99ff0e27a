# harness/gateway:latest — the run's model gateway and egress proxy (the harness's own code,
# put in at start; see harness/sandbox/gateway_server.py), and the helper that keeps a
# `bridge` attempt away from the host (iptables). Built offline FROM the base; apt reaches
# the package mirror through the build's CA store.
ARG BASE=harness/base:bookworm
FROM ${BASE}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iptables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN mkdir -p /opt/harness-gateway
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65534:65534
CMD ["python3", "-I", "/opt/harness-gateway/gateway_server.py"]
