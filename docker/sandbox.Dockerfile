# The generic sandbox image: the offline base plus an unprivileged user and a work dir.
# Offline (this project's default): BASE=harness/base:bookworm, built by docker/base-image.sh
# from apt's configured sources. With a registry: --build-arg BASE=python:3.11-slim-bookworm.
ARG BASE=harness/base:bookworm
FROM ${BASE}
# uid/gid 10001 is the profile default (`user = "10001:10001"`); never root.
RUN (getent group agent || groupadd --gid 10001 agent) \
 && (getent passwd agent || useradd --uid 10001 --gid 10001 --home-dir /work --no-create-home --shell /bin/sh agent) \
 && mkdir -p /work /harness/in /harness/grade && chown 10001:10001 /work
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
WORKDIR /work
USER 10001:10001
CMD ["sleep", "infinity"]
