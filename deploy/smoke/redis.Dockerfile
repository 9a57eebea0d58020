# Redis for the compose smoke run (compose.sh) on a machine that cannot pull redis:7.4-alpine: Debian bookworm's
# redis-server (7.0) on the local Debian base. docker-compose.yml's command (AOF, --dir /data, --requirepass) and
# healthcheck (redis-cli with REDISCLI_AUTH) run unchanged on it.
#   docker build -f deploy/smoke/redis.Dockerfile -t cooper-redis:bookworm deploy/smoke
ARG BASE_IMAGE=cooper-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
# As the official image: not root, and /data owned by the server's user, so the named volume mounted there starts
# writable (Docker copies the image's ownership into a new, empty volume).
USER redis
WORKDIR /data
CMD ["redis-server"]
