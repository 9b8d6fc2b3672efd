#!/usr/bin/env bash
# Start the local PostgreSQL cluster if it is not accepting connections (CI and fresh machines).
set -euo pipefail
if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  exit 0
fi
version=$(ls /etc/postgresql | sort -V | tail -1)
pg_ctlcluster --skip-systemctl-redirect "$version" main start
for _ in $(seq 1 30); do
  pg_isready -h 127.0.0.1 -p 5432 -q && exit 0
  sleep 1
done
echo "PostgreSQL did not start on 127.0.0.1:5432" >&2
exit 1
