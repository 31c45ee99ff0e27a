# The per-attempt PostgreSQL service of the `postgres` state kind: Debian's PostgreSQL 15 and
# psycopg2 (for the grader, which runs in this container) on the offline base.
# `harness images build` makes it; apt-get reaches the machine's configured Debian mirror.
ARG BASE=harness/base:bookworm
FROM ${BASE}
# a fixed uid, so the service's tmpfs can be made its own before it starts
RUN groupadd --gid 10100 postgres && useradd --uid 10100 --gid 10100 --home-dir /pg --no-create-home --shell /bin/sh postgres \
 && apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql-15 postgresql-client-15 python3-psycopg2 \
 && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15/main \
 && mkdir -p /pg /harness/in /harness/grade
COPY pg-start.sh /usr/local/bin/harness-pg
RUN chmod 0755 /usr/local/bin/harness-pg
ENV PATH=/usr/lib/postgresql/15/bin:$PATH LANG=C.UTF-8 PGDATA=/pg/data
USER 10100:10100
CMD ["harness-pg"]
