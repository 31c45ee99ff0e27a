#!/bin/sh
# The per-attempt PostgreSQL service: a fresh cluster in /pg (a tmpfs), seeded from
# /harness/in/fixture.sql as the role `agent`, copied to a database `fixture` the agent's role
# cannot reach (the grader compares the two), then served on the attempt's private network.
#   harness-pg          start (the container's command)
#   harness-pg health   exit 0 once it is seeded and accepts connections
set -eu
RUN=/pg/run
if [ "${1:-}" = health ]; then
  [ -f /pg/ready ] && pg_isready -q -h "$RUN" -d app -U agent
  exit $?
fi
mkdir -p "$RUN" /pg/data
initdb -D /pg/data -U postgres -A trust -E UTF8 --locale=C --no-sync >/pg/initdb.log 2>&1 || { cat /pg/initdb.log >&2; exit 3; }
cat >> /pg/data/postgresql.conf <<CONF
listen_addresses = '*'
unix_socket_directories = '$RUN'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 30
shared_buffers = 16MB
log_min_messages = warning
CONF
# over the network only the agent's role, only to its database; everything else is refused
cat > /pg/data/pg_hba.conf <<HBA
local all all trust
host app agent all trust
host all all all reject
HBA
pg_ctl -D /pg/data -o "-c listen_addresses=''" -w -s start >/pg/start.log 2>&1 || { cat /pg/start.log >&2; exit 3; }
psql -q -X -h "$RUN" -U postgres -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE agent LOGIN" -c "CREATE DATABASE app OWNER agent" >/dev/null
if ! psql -q -X -h "$RUN" -U agent -d app -v ON_ERROR_STOP=1 -f /harness/in/fixture.sql >/pg/seed.log 2>&1; then
  echo "harness-pg: the fixture SQL failed: $(grep -m1 ERROR /pg/seed.log || tail -1 /pg/seed.log)" >&2
  exit 4
fi
psql -q -X -h "$RUN" -U postgres -d postgres -v ON_ERROR_STOP=1 \
  -c "CREATE DATABASE fixture TEMPLATE app" -c "REVOKE CONNECT ON DATABASE fixture FROM PUBLIC" >/dev/null
pg_ctl -D /pg/data -m fast -w -s stop >/dev/null
touch /pg/ready
exec postgres -D /pg/data
