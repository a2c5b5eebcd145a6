#!/usr/bin/env bash
# Start the servers the tests use unless they already answer: PostgreSQL,
# MariaDB and Redis on 127.0.0.1. Idempotent. (moto, tansu and pgbouncer are
# started by the tests themselves, on free ports; pgbouncer is only installed
# here.) Chromium and chromedriver are installed for the browser tests when missing.
set -uo pipefail

need_apt=()
command -v pg_ctlcluster >/dev/null 2>&1 || need_apt+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "services: installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
    || echo "services: WARNING could not install ${need_apt[*]}" >&2
fi

if pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "postgres: already listening on 127.0.0.1:5432"
else
  PGV=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
  if [ -z "$PGV" ]; then
    PGV=$(ls /usr/lib/postgresql | sort -V | tail -1)
    pg_createcluster "$PGV" main >/dev/null
  fi
  CONF=/etc/postgresql/$PGV/main
  printf "listen_addresses = '127.0.0.1'\nport = 5432\n" > "$CONF/conf.d/90-local-test.conf"
  cat > "$CONF/pg_hba.conf" <<'HBA'
local   all             all                                     trust
host    all             all             127.0.0.1/32            trust
host    all             all             ::1/128                 trust
HBA
  chown postgres:postgres "$CONF/pg_hba.conf" "$CONF/conf.d/90-local-test.conf"
  pg_ctlcluster --skip-systemctl-redirect "$PGV" main start
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
fi
P="psql -w -h 127.0.0.1 -p 5432 -U postgres -v ON_ERROR_STOP=1 -qtA -d postgres"
[ "$($P -c "select 1 from pg_database where datname='test'" 2>/dev/null)" = 1 ] || $P -c "create database test" \
  || echo "postgres: WARNING could not create database test" >&2

if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; then
  echo "redis: already answering on 127.0.0.1:6379"
else
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 50); do [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ] && break; sleep 0.1; done
fi

if mariadb-admin -h 127.0.0.1 -u root ping >/dev/null 2>&1; then
  echo "mariadb: already answering on 127.0.0.1:3306"
elif [ -x /usr/sbin/mariadbd ]; then
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 50); do mariadb-admin -h 127.0.0.1 -u root ping >/dev/null 2>&1 && break; sleep 0.2; done
fi
mariadb -h 127.0.0.1 -u root -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null 2>&1 || true
exit 0
