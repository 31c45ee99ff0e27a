# harness/python:bookworm — what foreign `python:*` bases are built FROM offline (see
# harness/sandbox/basemap.py): Debian bookworm's Python 3.11 with pip, venv and `python`, and
# pip allowed to install system-wide (as in the python images), whatever 3.x was asked for.
ARG BASE=harness/debian:bookworm
FROM ${BASE}
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip python3-venv python-is-python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED
ENV LANG=C.UTF-8 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
