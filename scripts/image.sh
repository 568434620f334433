#!/usr/bin/env bash
# Builds and checks the toolhost container image.
#
#   image.sh build VERSION                  deploy/Dockerfile (multi-stage, from source) -> toolhost:VERSION
#   image.sh prebuilt VERSION [BASE_IMAGE]  deploy/Dockerfile.prebuilt from target/dist/toolhost
#   image.sh check VERSION [PROFILE]        the prebuilt image on a debootstrapped Debian 12 base,
#                                           run under chroot beside a throwaway Redis, one real call;
#                                           its binary is PROFILE's build (default dist; CI checks
#                                           the release build its quickstart check made)
#
# Images hold the dist profile's binary (fat LTO, one codegen unit), as deployed and measured.
#
# The engine is whichever of docker and podman answers `info` (a docker client without a daemon
# does not count). `check` needs root and podman: it imports a base image made with debootstrap
# (no registry needed), builds with COPY only, mounts the image (`podman image mount`) and runs
# its entrypoint as its user with `chroot --userspec`, because containers cannot be started on
# machines whose sandbox refuses to set RLIMIT_NOFILE. See docs/OPERATIONS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "image.sh: $*" >&2; exit 1; }

engine() {
    if docker info >/dev/null 2>&1; then echo docker; return; fi
    if podman info >/dev/null 2>&1; then echo podman; return; fi
    die "neither 'docker info' nor 'podman info' answers: install and start docker, or install podman"
}

apt_install() {
    local missing=()
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "image.sh: installing ${missing[*]} with apt-get" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Builds the binary of a profile (default dist) and lays out the prebuilt build context; prints
# its path.
context() {
    local profile="${1:-dist}" ctx=target/image-context
    cargo build --profile "$profile" --locked -p toolhost --bin toolhost >&2
    rm -rf "$ctx" && mkdir -p "$ctx"
    strip -o "$ctx/toolhost" "target/$profile/toolhost"
    cp config/container.toml "$ctx/toolhost.toml"
    echo "$ctx"
}

build() {
    local version="$1" engine
    engine="$(engine)"
    local format=()
    [ "$engine" = podman ] && format=(--format docker)
    "$engine" build "${format[@]}" -f deploy/Dockerfile -t "toolhost:$version" .
    echo "built toolhost:$version with $engine from source" >&2
}

prebuilt() {
    local version="$1" base="${2:-docker.io/library/debian:bookworm-slim}" engine ctx
    engine="$(engine)"
    ctx="$(context)"
    # podman writes OCI images by default, which drop HEALTHCHECK; docker's format keeps it.
    local format=()
    [ "$engine" = podman ] && format=(--format docker)
    "$engine" build "${format[@]}" -f deploy/Dockerfile.prebuilt --build-arg "BASE_IMAGE=$base" \
        -t "toolhost:$version" "$ctx"
    echo "built toolhost:$version with $engine on $base from target/dist/toolhost" >&2
}

# A Debian 12 minbase, trimmed like debian:bookworm-slim (no docs, man pages, locales, apt
# lists), imported as a local podman image. Kept between runs: debootstrap takes about a minute.
base_image() {
    local base=localhost/toolhost-base:bookworm
    if podman image exists "$base"; then echo "$base"; return; fi
    local root
    root="$(mktemp -d /var/tmp/toolhost-base.XXXXXX)"
    echo "image.sh: debootstrap --variant=minbase bookworm (about a minute)" >&2
    debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
    rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
        "$root"/usr/share/locale/* "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
        "$root"/var/log/* "$root"/tmp/*
    tar -C "$root" --numeric-owner -c . | podman import --change 'CMD ["bash"]' - "$base" >&2
    rm -rf "$root"
    echo "$base"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

check() {
    local version="$1" profile="${2:-dist}"
    [ "$(id -u)" = 0 ] || die "check needs root (podman image mount, chroot)"
    apt_install podman:podman debootstrap:debootstrap redis-server:redis-server strip:binutils
    podman info >/dev/null 2>&1 || die "'podman info' fails"
    local started
    started=$(date +%s)
    # Globals, for the cleanup trap that runs after this function returns.
    image="localhost/toolhost:$version-check" mnt="" dir="" redis_pid="" serve_pid=""
    local base ctx
    base="$(base_image)"
    ctx="$(context "$profile")"
    podman build --quiet --format docker -f deploy/Dockerfile.prebuilt --build-arg "BASE_IMAGE=$base" \
        -t "$image" "$ctx" >/dev/null
    local size base_size binary_size
    size=$(podman image inspect --format '{{.Size}}' "$image")
    base_size=$(podman image inspect --format '{{.Size}}' "$base")
    binary_size=$(stat -c %s "$ctx/toolhost")
    echo "image $image: $((size / 1000000)) MB (base $((base_size / 1000000)) MB, stripped $profile binary $((binary_size / 1000000)) MB)"
    [ "$size" -lt 120000000 ] || die "the image is $((size / 1000000)) MB, over 120 MB"

    # What the image says to run, as a container runtime would read it.
    local user workdir entrypoint cmd health
    user=$(podman image inspect --format '{{.Config.User}}' "$image")
    workdir=$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")
    entrypoint=$(podman image inspect --format '{{range .Config.Entrypoint}}{{.}} {{end}}' "$image")
    cmd=$(podman image inspect --format '{{range .Config.Cmd}}{{.}} {{end}}' "$image")
    health=$(podman image inspect --format '{{range .Config.Healthcheck.Test}}{{.}} {{end}}' "$image")
    [ "$user" = "10001:10001" ] || die "the image runs as '$user', not 10001:10001"
    [ "${health%% *}" = CMD ] || die "no HEALTHCHECK CMD in the image: '$health'"
    health="${health#CMD }"
    local image_env=()
    mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | grep .)

    # Mount the image and give it what a runtime gives a container: /proc, /dev, a writable /tmp.
    dir="$(mktemp -d /var/tmp/toolhost-image-check.XXXXXX)"
    mnt=$(podman image mount "$image")
    cleanup() {
        [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
        [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
        wait 2>/dev/null || true
        if [ -n "$mnt" ]; then
            for sub in tmp dev proc; do umount "$mnt/$sub" 2>/dev/null || true; done
            podman image unmount "$image" >/dev/null 2>&1 || true
        fi
        [ -z "$dir" ] || rm -rf "$dir"
    }
    trap cleanup EXIT
    mount -t proc proc "$mnt/proc"
    mount --bind /dev "$mnt/dev"
    mount -t tmpfs -o mode=1777,size=64m tmpfs "$mnt/tmp"

    local redis_port http_port
    redis_port=$(free_port)
    http_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$dir" >"$dir/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

    # The image's environment, plus what `docker run -e` would add. The HTTP port is moved off
    # 9464 because the check shares the host's network. It ends in exec, so it is always called
    # in a subshell: `&`, `$(...)` or `(...)`; the background one's pid is then toolhost's own.
    in_image() {
        cd / && exec env -i "${image_env[@]}" HOSTNAME=image-check "REDIS_URL=redis://127.0.0.1:$redis_port" \
            "TOOLHOST__HTTP__LISTEN=127.0.0.1:$http_port" \
            chroot --userspec="$user" "$mnt" /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
    }
    # shellcheck disable=SC2086 # the entrypoint and command are words
    in_image $entrypoint $cmd >"$dir/serve.log" 2>&1 &
    serve_pid=$!
    local ready=""
    for _ in $(seq 100); do
        # shellcheck disable=SC2086
        if (in_image $health --path /readyz 2>/dev/null); then ready=1; break; fi
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.2
    done
    [ -n "$ready" ] || { cat "$dir/serve.log" >&2; die "the image's toolhost did not become ready"; }
    echo "serve in the image is ready (health check: $health --path /readyz)"

    local answer
    answer=$(in_image toolhost call echo --args '{"message":"hello from the image"}')
    [ "$answer" = '{"message":"hello from the image"}' ] || die "echo answered: $answer"
    echo "toolhost call echo in the image: $answer"
    answer=$(in_image toolhost call terminal_run --args '{"command":"uname -s"}')
    echo "$answer" | grep -q '"ok":true' || die "terminal_run uname answered: $answer"
    echo "toolhost call terminal_run 'uname -s' in the image: ok"
    answer=$(in_image toolhost check-config | grep -A3 '^\[http\]' | grep listen)
    echo "$answer" | grep -q "127.0.0.1:$http_port" || die "check-config in the image: $answer"
    echo "toolhost check-config in the image reads TOOLHOST_CONFIG and the environment: $answer"

    kill -TERM "$serve_pid"
    local code=0
    wait "$serve_pid" || code=$?
    serve_pid=""
    [ "$code" = 0 ] || { cat "$dir/serve.log" >&2; die "serve exited $code on SIGTERM"; }
    grep -q '"message":"ready"' "$dir/serve.log" || die "no JSON ready line in the image's log"
    echo "image check passed in $(( $(date +%s) - started )) s"
}

case "${1:-}" in
    build) build "${2:?version}" ;;
    prebuilt) prebuilt "${2:?version}" "${3:-}" ;;
    check) check "${2:?version}" "${3:-dist}" ;;
    base) base_image ;;
    *) echo "usage: $0 build VERSION | prebuilt VERSION [BASE_IMAGE] | check VERSION [PROFILE]" >&2; exit 2 ;;
esac
