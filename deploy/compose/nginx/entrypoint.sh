#!/bin/sh
# nginx for one site (deploy/compose/docker-compose.yml): renders deploy/nginx/'s
# templates for the nodes, makes a self-signed certificate at first start (kept in the
# TLS volume, so clients can pin it), then runs nginx in the foreground.
#
# Settings (environment), with the compose defaults:
#   UPSTREAM_SERVERS  server lines for the nodes; the compose service name resolves to
#                     every replica when nginx starts (restart nginx after scaling)
#   TLS_SERVER_NAME   the certificate's name (CN and subjectAltName), default localhost
#   LISTEN, TLS_LISTEN  80 and 443
#   TLS_DIR           cert.pem + key.pem; put your own there to replace the self-signed one
#   TEMPLATE_DIR, SITE_DIR, NGINX_DIR  where the templates are, where the two server
#                     files go, where edge-vision-locations.conf goes (nginx's conf prefix)
#   NGINX_GLOBALS     main-context directives (default: worker_shutdown_timeout 10s;)
# Arguments are passed to nginx (tests/integration/test_tls.py runs this script with -p/-c).
set -eu

template_dir="${TEMPLATE_DIR:-/etc/nginx/edge-vision}"
site_dir="${SITE_DIR:-/etc/nginx/conf.d}"
nginx_dir="${NGINX_DIR:-/etc/nginx}"
tls_dir="${TLS_DIR:-/etc/nginx/tls}"
listen="${LISTEN:-80}"
tls_listen="${TLS_LISTEN:-443}"
name="${TLS_SERVER_NAME:-localhost}"
upstreams="${UPSTREAM_SERVERS:-server edge-vision:8080 max_fails=1 fail_timeout=5s;}"

if [ ! -s "$tls_dir/cert.pem" ] || [ ! -s "$tls_dir/key.pem" ]; then
  echo "edge-vision nginx: no certificate in $tls_dir; making a self-signed one for $name"
  mkdir -p "$tls_dir"
  san="DNS:$name,DNS:localhost,IP:127.0.0.1"
  openssl req -x509 -newkey rsa:2048 -sha256 -days 825 -nodes \
    -keyout "$tls_dir/key.pem" -out "$tls_dir/cert.pem" \
    -subj "/CN=$name" -addext "subjectAltName=$san" 2>/dev/null
  chmod 600 "$tls_dir/key.pem"
fi

sed -e "s|@LISTEN@|$listen|" -e "s|@UPSTREAM_SERVERS@|$upstreams|" \
  "$template_dir/edge-vision.conf.template" > "$site_dir/edge-vision.conf"
sed -e "s|@TLS_LISTEN@|$tls_listen|" -e "s|@CERT@|$tls_dir/cert.pem|" \
  -e "s|@KEY@|$tls_dir/key.pem|" \
  "$template_dir/edge-vision-tls.conf.template" > "$site_dir/edge-vision-tls.conf"
cp "$template_dir/edge-vision-locations.conf" "$nginx_dir/edge-vision-locations.conf"

# Main-context directives; the default bounds a graceful stop, which otherwise waits for
# every open WebSocket (the nodes close theirs with 1001 meanwhile). A main nginx.conf
# that sets it already (deploy/nginx/nginx-local.conf) runs with NGINX_GLOBALS="".
exec nginx "$@" -g "daemon off; ${NGINX_GLOBALS-worker_shutdown_timeout 10s;}"
