# harness/debian:bookworm — what foreign `debian:*` and `ubuntu:*` bases are built FROM offline
# (see harness/sandbox/basemap.py): the offline base, with apt able to run as root in a sandbox
# that has no CAP_SETUID (a Harbor task run as root), so it does not drop to the _apt user.
ARG BASE=harness/base:bookworm
FROM ${BASE}
RUN printf 'APT::Sandbox::User "root";\n' > /etc/apt/apt.conf.d/99harness-no-sandbox-user
ENV LANG=C.UTF-8
CMD ["/bin/bash"]
