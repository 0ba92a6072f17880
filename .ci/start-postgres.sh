#!/usr/bin/env bash
# Start a throwaway PostgreSQL on localhost:5432 and export its URL for the tests.
set -euo pipefail
command -v pg_ctlcluster >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || exit 1
ver=$(ls /usr/lib/postgresql | sort -V | tail -1)
pg_ctlcluster "$ver" main start 2>/dev/null || service postgresql start
for _ in $(seq 30); do su postgres -c "pg_isready -q" && break; sleep 1; done
su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'tunekit';\"" 
su postgres -c "psql -q -tc \"SELECT 1 FROM pg_database WHERE datname='tunekit'\" | grep -q 1 || psql -q -c 'CREATE DATABASE tunekit;'"
echo "postgresql://postgres:tunekit@127.0.0.1:5432/tunekit" > .ci/postgres-url
