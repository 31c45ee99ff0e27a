# harness/debian:bookworm — what foreign `debian:*` and `ubuntu:*` bases are built FROM offline
# (see harness/sandbox/basemap.py): the offline base, with apt able to run as root in a sandbox
# that has no CAP_SETUID (a Harbor task run as root), so it does not drop to the _apt user.
#
# It also carries what Harbor verifiers usually fetch at test time and cannot offline:
# curl, and uv (from PyPI) behind the shims in verifier-tools/ (uvx -p 3.13 runs on this
# image's python3; astral.sh's installer is answered locally; ~/.local/bin/env exists; packages a verifier names are prefetched into /opt/harness/wheels).
ARG BASE=harness/base:bookworm
FROM ${BASE}
RUN printf 'APT::Sandbox::User "root";\n' > /etc/apt/apt.conf.d/99harness-no-sandbox-user
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends curl ca-certificates python3-pip \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m pip install -q --no-cache-dir --break-system-packages --target /usr/local/lib/harness-uv uv==0.9.7 \
 && test -x /usr/local/lib/harness-uv/bin/uv
COPY verifier-tools/uvshim.py /usr/local/lib/harness-uv/uvshim.py
COPY verifier-tools/curl verifier-tools/harness-uv-prewarm /usr/local/bin/
COPY verifier-tools/env /root/.local/bin/env
RUN chmod 0755 /usr/local/lib/harness-uv/uvshim.py /usr/local/bin/curl /usr/local/bin/harness-uv-prewarm \
 && for t in uv uvx; do ln -s /usr/local/lib/harness-uv/uvshim.py /usr/local/bin/$t; ln -s /usr/local/bin/$t /root/.local/bin/$t; done \
 && mkdir -p /root/.cargo/bin /opt/harness/wheels && ln -s /usr/local/bin/uv /root/.cargo/bin/uv
ENV LANG=C.UTF-8
CMD ["/bin/bash"]
