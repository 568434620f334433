# toolhost tasks. `./x run` and `./x test` (this file through ./x, which installs just when it is
# missing) are the README's quickstart.

set shell := ["bash", "-euo", "pipefail", "-c"]

# The port of the local Redis `run` starts and serves against, e.g. `./x redis_port=6380 run`.
redis_port := "6379"
# The workspace version, the tag of the images.
version := `sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1`

# Build and serve with the default config against 127.0.0.1:redis_port, starting a Redis there if none answers.
run *ARGS: ensure-redis
    cargo build --release -p toolhost --bin toolhost
    REDIS_URL=redis://127.0.0.1:{{redis_port}} ./target/release/toolhost serve {{ARGS}}

# `run` builds the release profile, which builds fast. The dist profile (fat LTO, one codegen
# unit) takes twice the CPU and ends in a long single-threaded step, and costs about a quarter
# less CPU per request (docs/PERFORMANCE.md, "Build profiles").
# The binary to deploy, as the images, the systemd unit and the benchmarks use it: target/dist/toolhost.
dist:
    cargo build --profile dist --locked -p toolhost --bin toolhost

# Stop the Redis that `run` started on redis_port (a Redis it did not start is left alone).
stop:
    scripts/ensure-redis.sh stop {{redis_port}}

# The whole suite: unit tests, integration tests against real redis-server processes.
test: ensure-redis-installed
    cargo test --workspace --all-targets --exclude toolhost-e2e

# The debug target/debug/toolhost the suites below drive, built by `test`'s own command: the same
# packages, so the same features. `cargo build --bin toolhost` leaves out the dev-dependencies
# (tokio's test-util) and rebuilds most of the tree beside `test`'s build; this builds nothing
# after `test`, and on its own builds the suite's tests too.
[private]
debug-toolhost:
    cargo test --workspace --all-targets --exclude toolhost-e2e --no-run

# The end-to-end fleet suites (tests/): toolboxes sharing a stream, a toolbox started under load,
# the sharded requests stream, Redis Cluster, Sentinel (the Python client on both too), each
# against real servers the tests start, driving the built binary.
test-fleet: ensure-redis-installed debug-toolhost
    scripts/ensure-python-client-venv.sh >/dev/null
    cargo test -p toolhost-e2e --test harness --test fleet --test shards --test cluster --test sentinel --test failover

# The Kubernetes examples in deploy/ against the Kubernetes schemas (kubernetes-validate from
# PyPI, strict: unknown fields refused); `just test` checks them against the configuration.
check-deploy:
    "$(scripts/ensure-k8s-validate.sh)/bin/kubernetes-validate" --strict --quiet deploy/kubernetes.yaml deploy/kubernetes-cluster.yaml

# The security suites (tests/): TLS to Redis with a private CA and mutual TLS, the
# least-privilege Redis user `toolhost redis-acl` prints, the MCP door's bearer tokens and signed
# calls, `toolhost call --key-id`, and the docs' redis-cli + openssl signing example, against real
# servers the tests start (the daemon's own refusal, policy, rate-limit and audit tests run in
# `just test`).
test-security: ensure-redis-installed debug-toolhost
    cargo test -p toolhost-e2e --test redis_tls --test redis_acl --test auth

# Benchmarks: toolhost beside the at-least-once reference worker and the exactly-once floor on
# the same Redis (see docs/PERFORMANCE.md). Every bench recipe measures dist builds (target/dist/).
bench *ARGS: ensure-redis-installed
    cargo build --profile dist -p toolhost --bin toolhost
    cargo build --profile dist -p toolhost-bench
    ./target/dist/toolhost-bench {{ARGS}}
    ./target/dist/toolhost-bench --interleave 5 --in-flight 64 --only toolhost --auth --out-dir target/bench/auth
    ./target/dist/toolhost-bench --interleave 5 --in-flight 64 --only toolhost --telemetry --out-dir target/bench/telemetry
    {{just_executable()}} bench-instructions
    scripts/bench-large-entries.sh ./target/dist/toolhost
    PAUSED=1 scripts/bench-large-entries.sh ./target/dist/toolhost
    scripts/ensure-mcp-servers.sh >/dev/null
    ./target/dist/toolhost-bench-mcp
    ./target/dist/toolhost-bench-jwt
    ./target/dist/toolhost-bench-clients
    TOOLHOST_BIN="$PWD/target/dist/toolhost" "$(scripts/ensure-python-client-venv.sh)/bin/python" clients/python/bench/bench.py

# Instructions per echo call of the dist build under callgrind, telemetry off and every call
# sampled (issue 36; docs/PERFORMANCE.md, telemetry round 7): steady where time per call moves with
# the machine's load. Installs valgrind when it is missing.
bench-instructions *ARGS: ensure-redis-installed
    command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind >/dev/null)
    cargo build --profile dist -p toolhost --bin toolhost
    scripts/bench-call-instructions.py {{ARGS}} current=target/dist/toolhost

# Redis's instructions per answered request summed over the nodes, every redis-server under
# callgrind and two release replicas serving it: one server with 1 and 6 shards, a cluster of 1
# and of 3 masters with 6 (issue 35; docs/PERFORMANCE.md, round 13). Installs valgrind when it
# is missing. Pass `--rows single-1,cluster3-6` for some rows, `--requests N` per window.
bench-redis-instructions *ARGS: ensure-redis-installed
    command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind >/dev/null)
    cargo build --release -p toolhost --bin toolhost
    scripts/bench-redis-instructions.py {{ARGS}} target/release/toolhost

# The issue-17 and issue-27 targets: echo at 1 and 64 in flight from the harness's generator and
# at 64 from issue 27's independent generator, the median of 5 interleaved runs of the
# at-least-once reference, the exactly-once floor and toolhost, then Redis bytes per answered
# mark. Pass `--baseline-bin OLD/toolhost` to measure an older build beside them.
bench-targets *ARGS: ensure-redis-installed
    cargo build --profile dist -p toolhost --bin toolhost
    cargo build --profile dist -p toolhost-bench
    ./target/dist/toolhost-bench --interleave 5 --out-dir target/bench/targets {{ARGS}}
    ./target/dist/toolhost-bench --marks 200000 --out-dir target/bench/marks {{ARGS}}

# The fleet rows of issue 16: 1, 2 and 4 replicas of toolhost against one Redis and against a
# 3-master Redis Cluster, with the CPU of every process (see docs/PERFORMANCE.md).
bench-fleet *ARGS: ensure-redis-installed
    cargo build --profile dist -p toolhost --bin toolhost
    cargo build --profile dist -p toolhost-bench
    ./target/dist/toolhost-bench --fleet --out-dir target/bench/fleet {{ARGS}}

# Formatting and lints, as CI checks them.
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings

# Format the code.
fmt:
    cargo fmt --all

# Install redis-server if it is missing.
ensure-redis-installed:
    scripts/ensure-redis.sh install

# Make sure a Redis answers on 127.0.0.1:{{redis_port}}, starting one if needed.
ensure-redis: ensure-redis-installed
    scripts/ensure-redis.sh start {{redis_port}}

# The image toolhost:<version> from source (deploy/Dockerfile, the dist profile), with docker or podman.
image:
    scripts/image.sh build {{version}}

# The image toolhost:<version> from this machine's dist build (deploy/Dockerfile.prebuilt), on `base`.
image-prebuilt base="docker.io/library/debian:bookworm-slim":
    scripts/image.sh prebuilt {{version}} {{base}}

# CI's image check: the prebuilt image on a debootstrapped base, its entrypoint run under chroot, one real call (root, podman).
# The image holds a `profile` build: dist, as deployed; CI passes release, the build quickstart-check made.
image-check profile="dist":
    scripts/image.sh check {{version}} {{profile}}

# CI's check of the first hour: `run` against a chosen port, the README's request, `stop`; the systemd unit.
quickstart-check:
    scripts/quickstart-check.sh

# CI's systemd check: deploy/toolhost.service under a real systemd in systemd-nspawn (root).
# The unit runs a `profile` build: dist, as deployed; CI passes release, the build quickstart-check made.
unit-check profile="dist":
    scripts/unit-check.sh {{profile}}

# The reliability soak with the issue's 100,000 requests (CI runs 30,000; see docs/RELIABILITY.md).
soak requests="100000": ensure-redis-installed
    TOOLHOST_SOAK_REQUESTS={{requests}} cargo test -p toolhost --test tests reliability::soak -- --nocapture

# The MCP door with real clients (the official MCP Python SDK and the OpenAI Agents SDK, pinned
# into a venv; the official TypeScript SDK clients, 1.x and 2.x, pinned into an npm cache), in
# the `initialize` generations and in 2026-07-28, against toolhost processes and a real Redis
# (tests/tests/mcp_door.rs).
test-mcp-door: ensure-redis-installed debug-toolhost
    scripts/ensure-mcp-door-venv.sh >/dev/null
    scripts/ensure-mcp-ts-clients.sh >/dev/null
    scripts/ensure-mcp-oauth-venv.sh >/dev/null
    cargo test -p toolhost-e2e --test mcp_door

# The official MCP conformance suite's server scenarios (@modelcontextprotocol/conformance, pinned,
# on a pinned Node 22) against its reference server directly (every check passes) and hosted
# behind a toolbox through the MCP door, where only tests/mcp_fidelity/expected-failures.yml may
# fail; images from a hosted stdio and HTTP server through Redis to the Python client and the
# Agents SDK adapter, and through the door to the MCP Python SDK; a hosted server's own tasks and
# 2026-07-28 questions, from a test server on rmcp (tests/tests/mcp_fidelity.rs).
test-mcp-fidelity: ensure-redis-installed debug-toolhost
    scripts/ensure-mcp-conformance.sh >/dev/null
    scripts/ensure-mcp-servers.sh >/dev/null
    scripts/ensure-python-client-venv.sh >/dev/null
    scripts/ensure-mcp-door-venv.sh >/dev/null
    cargo test -p toolhost-e2e --test mcp_fidelity

# The OpenVoiceOS door and source against the real bus (ovos-messagebus), personas on
# ovos-bus-client and reference ToolBoxes of ovos-plugin-manager 3.1.0a1, pinned into a venv,
# with toolhost processes and a real Redis (tests/tests/ovos.rs).
test-ovos: ensure-redis-installed debug-toolhost
    scripts/ensure-ovos-venv.sh >/dev/null
    cargo test -p toolhost-e2e --test ovos

# The web console in a real headless Chromium (Debian's chromium and chromium-driver, installed
# when missing, driven by Selenium pinned into a venv) against two toolboxes, a hosted MCP server
# and a real Redis (tests/tests/console.rs); screenshots go to target/console-artifacts/.
test-console: ensure-redis-installed debug-toolhost
    scripts/ensure-console-deps.sh >/dev/null
    scripts/ensure-mcp-servers.sh >/dev/null
    cargo test -p toolhost-e2e --test console

# Telemetry end to end (tests/tests/telemetry.rs): W3C trace context and OTLP spans from callers
# with the OpenTelemetry SDK (the MCP Python SDK's client through the MCP door, the Python client
# over Redis) through two toolboxes to a hosted MCP server and an HTTP tool, collected by an OTLP
# receiver on the official opentelemetry-proto (pinned into a venv); the collector stopped
# mid-run; garbage trace context.
test-telemetry: ensure-redis-installed debug-toolhost
    scripts/ensure-telemetry-venv.sh >/dev/null
    scripts/ensure-ovos-venv.sh >/dev/null
    cargo test -p toolhost-e2e --test telemetry

# The Python client (clients/python) against a real daemon and redis-server: pytest, mypy
# --strict, and the wheel built and checked with twine (the venv is made once, pinned).
test-python: ensure-redis-installed debug-toolhost
    scripts/test-python-client.sh

# The MCP tool-source tests against real MCP servers (installed pinned into ~/.cache/toolhost):
# the suite's ignored tests (crates/mcp/tests, crates/daemon/tests/mcp_hosted.rs), built as
# `test` builds them, so after `test` nothing is rebuilt; the rest of those crates runs in `test`.
test-mcp:
    scripts/ensure-mcp-servers.sh >/dev/null
    cargo test --workspace --all-targets --exclude toolhost-e2e -- --ignored
