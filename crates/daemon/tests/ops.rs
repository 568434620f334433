//! Issue 7's promise: health, readiness, metrics, configuration errors, secrets, the dead-letter
//! commands and the deployment files, against the real binary and real redis-server processes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolhost::config::{
    Config, ENV_AGENT_NAME, ENV_CHAT_CONVERSATION_ID, ENV_CONFIG, ENV_PREFIX, ENV_REDIS_URL, ENV_RESERVED,
    ENV_TERMINAL,
};

use crate::support::{
    Daemon, RedisServer, answers_to, http_addr, http_get, request, temp_dir, wait_for, wait_http, xadd,
};

const WAIT: Duration = Duration::from_secs(10);

/// Runs the `toolhost` binary to completion with only `env` (and PATH) set.
fn toolhost(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolhost"));
    command.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run toolhost")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// A `toolhost serve` that is not expected to become ready; killed on drop.
struct Unready {
    child: Child,
    log: PathBuf,
}

impl Unready {
    fn start(env: &[(&str, &str)]) -> Unready {
        let log = temp_dir("unready").join("toolhost.log");
        let stdout = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolhost"));
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TOOLHOST__HTTP__LISTEN", "127.0.0.1:0")
            .stdout(stdout.try_clone().unwrap())
            .stderr(stdout);
        for (name, value) in env {
            command.env(name, value);
        }
        Unready { child: command.spawn().unwrap(), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("toolhost did not log {needle}; log:\n{}", self.log());
    }
}

impl Drop for Unready {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_redis_while_healthz_stays_up() {
    let mut redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &[]);
    let addr = http_addr(&daemon.log());
    assert_eq!(wait_http(addr, "/readyz", WAIT, |status, _| status == 200).0, 200);
    assert_eq!(http_get(addr, "/healthz"), (200, "{\"status\":\"ok\"}\n".to_owned()));

    redis.kill();
    let (status, body) = wait_http(addr, "/readyz", WAIT, |status, _| status == 503);
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["ready"], false);
    assert!(body["reasons"].as_array().unwrap().contains(&json!("redis does not answer")), "{body}");
    assert_eq!(http_get(addr, "/healthz").0, 200);
    let (status, metrics) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("toolhost_redis_up 0"), "{metrics}");

    // The restarted server has no data: ready again only once the group was created again.
    redis.restart();
    let (status, body) = wait_http(addr, "/readyz", Duration::from_secs(20), |status, _| status == 200);
    assert_eq!(status, 200, "{body}\n{}", daemon.log());
    assert_eq!(http_get(addr, "/healthz").0, 200);
    let metrics = http_get(addr, "/metrics").1;
    assert!(metrics.contains("toolhost_redis_reconnects_total 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_calls_by_tool_and_outcome() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(&redis, &[]);
    let addr = http_addr(&daemon.log());
    let mut connection = redis.connection().await;
    let ok = request("tool.invoke", "m-ok", json!({"tool": "echo", "arguments": {"message": "hi"}}));
    xadd(&mut connection, "action-requests", &ok.to_string()).await;
    let bad = request("tool.invoke", "m-bad", json!({"tool": "echo", "arguments": {"text": "no message"}}));
    xadd(&mut connection, "action-requests", &bad.to_string()).await;
    let results = wait_for(&mut connection, "action-results", 2, WAIT).await;
    assert_eq!(answers_to(&results, "m-bad")[0]["data"]["error_code"], "invalid_arguments");

    let expected = [
        r#"toolhost_invocations_total{tool="echo",outcome="success"} 1"#,
        r#"toolhost_invocations_total{tool="echo",outcome="invalid_arguments"} 1"#,
        r#"toolhost_invocation_duration_seconds_bucket{tool="echo",le="+Inf"} 2"#,
        r#"toolhost_invocation_duration_seconds_count{tool="echo"} 2"#,
        r#"toolhost_group_pending{stream="action-requests",group="toolhost"} 0"#,
        r#"toolhost_group_lag{stream="action-requests",group="toolhost"} 0"#,
        "toolhost_in_flight 0",
        "toolhost_dead_letters_total 0",
        "toolhost_reclaims_total 0",
        "toolhost_redeliveries_total 0",
        "toolhost_redis_reconnects_total 0",
        "# TYPE toolhost_invocation_duration_seconds histogram",
    ];
    let (status, metrics) =
        wait_http(addr, "/metrics", WAIT, |_, body| expected.iter().all(|line| body.contains(line)));
    assert_eq!(status, 200);
    for line in expected {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    let buckets = metrics
        .lines()
        .filter(|line| line.starts_with("toolhost_invocation_duration_seconds_bucket"))
        .count();
    assert!(buckets >= 10, "{metrics}");
    assert!(
        metrics.contains(&format!(r#"toolhost_build_info{{version="{}"}} 1"#, env!("CARGO_PKG_VERSION")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_while_every_tool_slot_is_busy() {
    let redis = RedisServer::start();
    let env = [
        ("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "1"),
        ("TERMINAL_ALLOWED_COMMANDS", "sleep"),
        ("TERMINAL_TIMEOUT_SECONDS", "10"),
    ];
    let daemon = Daemon::start(&redis, &env);
    let addr = http_addr(&daemon.log());
    let mut connection = redis.connection().await;
    let slow =
        request("tool.invoke", "slow", json!({"tool": "terminal_run", "arguments": {"command": "sleep 4"}}));
    xadd(&mut connection, "action-requests", &slow.to_string()).await;
    let (_, metrics) = wait_http(addr, "/metrics", WAIT, |_, body| body.contains("toolhost_in_flight 1"));
    assert!(metrics.contains("toolhost_in_flight 1"), "{metrics}");
    assert_eq!(http_get(addr, "/healthz").0, 200);
    assert_eq!(http_get(addr, "/readyz").0, 200);
    // Both answered while the only slot was still taken: the call has not been answered yet.
    let answered_meanwhile = wait_for(&mut connection, "action-results", 1, Duration::ZERO).await;
    assert!(
        answered_meanwhile.is_empty(),
        "the slow call finished before HTTP answered: {answered_meanwhile:?}"
    );
    let results = wait_for(&mut connection, "action-results", 1, WAIT).await;
    assert_eq!(answers_to(&results, "slow")[0]["data"]["success"], true, "{results:?}");
}

#[test]
fn bad_keys_and_values_exit_64_naming_the_key() {
    let dir = temp_dir("config");
    let cases = [
        ("[dispatch]\nmax_inflight = 8\n", "dispatch.max_inflight"),
        ("[http]\nlisten = \"nowhere\"\n", "http.listen"),
        ("[dispatch]\nmax_in_flight = \"lots\"\n", "dispatch.max_in_flight"),
        ("[tools]\ndisabled = [\"no_such_tool\"]\n", "tools.disabled"),
    ];
    for (case_idx, (toml, key)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{case_idx}.toml"));
        std::fs::write(&path, toml).unwrap();
        let path = path.to_str().unwrap();
        for command in ["check-config", "serve"] {
            // No Redis anywhere: configuration is refused before anything is contacted.
            let output = toolhost(&[command, "--config", path], &[("REDIS_URL", "redis://127.0.0.1:1")]);
            assert_eq!(output.status.code(), Some(64), "{command} {toml}: {}", text(&output));
            assert!(
                String::from_utf8_lossy(&output.stderr).contains(key),
                "{command} {toml}: {}",
                text(&output)
            );
        }
    }
    let output = toolhost(&["serve"], &[("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "0")]);
    assert_eq!(output.status.code(), Some(64));
    assert!(text(&output).contains("dispatch.max_in_flight"), "{}", text(&output));
    let output = toolhost(&["check-config", "--config", "/nonexistent/toolhost.toml"], &[]);
    assert_eq!(output.status.code(), Some(64), "a missing file is bad configuration too");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_logs_or_check_config() {
    const USER_PASSWORD: &str = "s3cret-user-pw";
    const DEFAULT_PASSWORD: &str = "s3cret-default-pw";
    let redis = RedisServer::start();
    let mut connection = redis.connection().await;
    let password_rule = format!(">{USER_PASSWORD}");
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "ops", "on", password_rule.as_str(), "~*", "&*", "+@all"][..])
        .query_async(&mut connection)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", DEFAULT_PASSWORD][..])
        .query_async(&mut connection)
        .await
        .unwrap();
    let port = redis.port();
    let user_url = format!("redis://ops:{USER_PASSWORD}@127.0.0.1:{port}/0");

    for url in [
        user_url.clone(),
        format!("redis://:{DEFAULT_PASSWORD}@127.0.0.1:{port}"),
        format!("rediss://:{DEFAULT_PASSWORD}@127.0.0.1:{port}"),
    ] {
        let output = toolhost(&["check-config"], &[("REDIS_URL", &url)]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        assert!(!text(&output).contains("s3cret"), "{}", text(&output));
        assert!(String::from_utf8_lossy(&output.stdout).contains(":***@127.0.0.1"), "{}", text(&output));
    }

    let mut daemon = Daemon::start(&redis, &[("REDIS_URL", &user_url), ("TOOLHOST__LOG__LEVEL", "debug")]);
    let mut authed =
        redis::Client::open(user_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let call = request("echo.requested", "p-1", json!({"message": "hi"}));
    xadd(&mut authed, "action-requests", &call.to_string()).await;
    assert_eq!(wait_for(&mut authed, "action-results", 1, WAIT).await.len(), 1);
    assert_eq!(daemon.terminate(Duration::from_secs(15)), Some(0));
    let log = daemon.log();
    assert!(log.contains("redis://ops:***@127.0.0.1"), "{log}");
    assert!(!log.contains("s3cret"), "{log}");

    // A wrong password: the daemon keeps retrying and says why, once, still without the secret.
    let wrong = Unready::start(&[("REDIS_URL", &format!("redis://ops:s3cret-wrong@127.0.0.1:{port}"))]);
    let log = wrong.wait_for_log("redis does not answer");
    assert!(log.contains("redis://ops:***@127.0.0.1"), "{log}");
    assert!(!log.contains("s3cret"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_urls_fail_cleanly_and_the_daemon_stays_up_unready() {
    let redis = RedisServer::start();
    let url = format!("rediss://:s3cret-tls@127.0.0.1:{}", redis.port());
    let mut unready = Unready::start(&[("REDIS_URL", &url)]);
    let log = unready.wait_for_log("redis does not answer");
    assert!(!log.contains("panicked") && !log.contains("s3cret"), "{log}");
    let addr = http_addr(&log);
    assert_eq!(http_get(addr, "/healthz").0, 200);
    let (status, body) = http_get(addr, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(unready.child.try_wait().unwrap().is_none(), "toolhost exited:\n{}", unready.log());
    let output = toolhost(
        &["call", "echo", "--args", "{\"message\":\"x\"}", "--timeout", "1s"],
        &[("REDIS_URL", &url)],
    );
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(!text(&output).contains("panicked") && !text(&output).contains("s3cret"), "{}", text(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_requeues_a_dead_letter_that_then_gets_answered() {
    let redis = RedisServer::start();
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str())];
    let mut strict = Daemon::start(&redis, &[("TOOLHOST__STREAMS__MAX_PAYLOAD_BYTES", "1024")]);
    let mut connection = redis.connection().await;
    let big = request("echo.requested", "big", json!({"message": "x".repeat(4096)}));
    xadd(&mut connection, "action-requests", &big.to_string()).await;
    xadd(&mut connection, "action-requests", "not json").await;
    assert_eq!(wait_for(&mut connection, "dlq:toolhost", 2, WAIT).await.len(), 2);
    assert_eq!(strict.terminate(Duration::from_secs(15)), Some(0));

    let output = toolhost(&["dlq", "list"], &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let letters: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(letters.len(), 2, "{letters:?}");
    // Entries are handled concurrently, so the letters may come in either order.
    let big_letter = letters.iter().find(|letter| letter["request_id"] == "big").expect("the big request");
    assert!(big_letter["error"].as_str().unwrap().contains("exceeds the limit of 1024 bytes"));
    assert_eq!(big_letter["payload_bytes"], big.to_string().len());
    let junk_letter =
        letters.iter().find(|letter| letter["payload_excerpt"] == "not json").expect("the junk");
    let big_letter = big_letter["dlq_id"].as_str().unwrap();
    let junk_letter = junk_letter["dlq_id"].as_str().unwrap();

    let output = toolhost(&["dlq", "purge", junk_letter], &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let output = toolhost(&["dlq", "replay", "1-0"], &env);
    assert_eq!(output.status.code(), Some(1), "an unknown id: {}", text(&output));

    let _lenient = Daemon::start(&redis, &[]);
    let output = toolhost(&["dlq", "replay", big_letter], &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let replayed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(replayed["request_id"], "big");
    let results = wait_for(&mut connection, "action-results", 1, WAIT).await;
    let answer = answers_to(&results, "big");
    assert_eq!(answer.len(), 1, "{results:?}");
    assert_eq!(answer[0]["data"]["success"], true);
    assert_eq!(answer[0]["data"]["result"]["message"].as_str().unwrap().len(), 4096);
    let output = toolhost(&["dlq", "list"], &env);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "", "{}", text(&output));
}

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap_or_else(|err| panic!("{path}: {err}"));
    serde_norway::Deserializer::from_str(&text)
        .map(|document| {
            serde::Deserialize::deserialize(document).unwrap_or_else(|err| panic!("{path}: {err}"))
        })
        .filter(|document: &Value| !document.is_null())
        .collect()
}

/// Checks that every variable is one toolhost reads, and that together they load.
fn check_env(context: &str, vars: &HashMap<String, String>, file: Option<&Path>) {
    let known = [ENV_REDIS_URL, ENV_AGENT_NAME, ENV_CHAT_CONVERSATION_ID, "RUST_LOG"];
    for name in vars.keys() {
        let known = known.contains(&name.as_str())
            || ENV_RESERVED.contains(&name.as_str())
            || ENV_TERMINAL.iter().any(|(variable, _)| variable == name)
            || name.starts_with(&format!("{ENV_PREFIX}__"));
        assert!(known, "{context}: toolhost reads no variable {name}");
    }
    match Config::load(file, vars) {
        Ok(config) => assert!(config.warnings.is_empty(), "{context}: {:?}", config.warnings),
        Err(err) => panic!("{context}: {err}"),
    }
}

/// The file `TOOLHOST_CONFIG` names inside the container, as found in the repository through the
/// read-only mounts `container path -> repository path`.
fn mounted_config(
    context: &str,
    env: &HashMap<String, String>,
    mounts: &HashMap<String, PathBuf>,
) -> PathBuf {
    let config = env.get(ENV_CONFIG).unwrap_or_else(|| panic!("{context}: no {ENV_CONFIG}"));
    let (dir, file) = config.rsplit_once('/').unwrap();
    let local = mounts.get(dir).unwrap_or_else(|| panic!("{context}: {dir} is not mounted")).join(file);
    assert!(local.is_file(), "{context}: {config} is not in the repository");
    local
}

/// The port `[http] listen` defaults to.
fn default_http_port() -> u16 {
    Config::load(None, &HashMap::new()).unwrap().http_listen.port()
}

#[test]
fn compose_file_matches_the_configuration() {
    let compose = yaml_documents("docker-compose.yml").remove(0);
    let services = &compose["services"];
    for name in ["redis", "toolhost", "worker"] {
        assert!(services[name].is_object(), "service {name} missing");
    }
    let redis = &services["redis"];
    assert!(redis["command"].to_string().contains("appendonly"), "{redis}");
    let data = redis["volumes"][0].as_str().unwrap().split(':').next().unwrap();
    assert!(compose["volumes"].get(data).is_some(), "redis data must be a named volume");
    assert!(redis["healthcheck"]["test"].to_string().contains("ping"));

    let toolhost = &services["toolhost"];
    assert!(repo().join(toolhost["build"]["dockerfile"].as_str().unwrap()).is_file());
    assert_eq!(toolhost["restart"], "unless-stopped");
    assert_eq!(toolhost["depends_on"]["redis"]["condition"], "service_healthy");
    assert!(toolhost["healthcheck"]["test"].to_string().contains("healthcheck"));
    let port = default_http_port();
    let ports: Vec<&str> = toolhost["ports"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(ports.iter().any(|mapping| mapping.ends_with(&format!(":{port}:{port}"))), "{ports:?}");
    let env: HashMap<String, String> = serde_json::from_value(toolhost["environment"].clone()).unwrap();
    assert_eq!(env["TOOLHOST__HTTP__LISTEN"], format!("0.0.0.0:{port}"));
    assert_eq!(env["REDIS_URL"], "redis://redis:6379");

    // Mounted directories exist in the repository, and the --config file is one of them.
    let mut mounts = HashMap::new();
    for volume in toolhost["volumes"].as_array().unwrap() {
        let parts: Vec<&str> = volume.as_str().unwrap().split(':').collect();
        assert!(repo().join(parts[0]).is_dir(), "{volume} mounts a missing directory");
        assert_eq!(parts.get(2), Some(&"ro"), "{volume} must be read-only");
        mounts.insert(parts[1].to_owned(), repo().join(parts[0]));
    }
    // No --config: TOOLHOST_CONFIG names the file, so `docker compose exec` commands read it too.
    assert_eq!(toolhost["command"], json!(["serve"]));
    assert_eq!(
        toolhost["healthcheck"]["test"],
        json!(["CMD", "toolhost", "healthcheck", "--path", "/readyz"])
    );
    let local = mounted_config("docker-compose.yml toolhost", &env, &mounts);
    check_env("docker-compose.yml toolhost", &env, Some(&local));

    let worker = &services["worker"];
    assert_eq!(worker["depends_on"]["toolhost"]["condition"], "service_healthy");
    let script = worker["volumes"][0].as_str().unwrap().split(':').next().unwrap();
    assert!(repo().join(script).join("worker.py").is_file());
    assert!(worker["command"].to_string().contains("worker.py"));
}

/// The Kubernetes example for a Redis Cluster with a sharded requests stream: the shard count
/// is one value (the ConfigMap `toolhost-fleet`, read by every replica through `envFrom`), and
/// what the pods get is a configuration that loads, in cluster mode, with that many shards.
#[test]
fn kubernetes_cluster_example_has_the_shard_count_as_one_value() {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes-cluster.yaml")).unwrap();
    assert_eq!(text.matches("TOOLHOST__STREAMS__SHARDS:").count(), 1, "the shard count is one value");
    let documents = yaml_documents("deploy/kubernetes-cluster.yaml");
    let named = |kind: &str, name: &str| {
        documents
            .iter()
            .find(|doc| doc["kind"] == kind && doc["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let fleet = &named("ConfigMap", "toolhost-fleet")["data"];
    let deployment = named("Deployment", "toolhost");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2, "several replicas");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], format!("toolhost:{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(documents.iter().all(|doc| doc["kind"] != "Secret"), "ship no Secret");
    let mut env = HashMap::new();
    for source in container["envFrom"].as_array().unwrap() {
        assert_eq!(source["configMapRef"]["name"], "toolhost-fleet");
        assert_eq!(source["configMapRef"]["optional"], false);
        for (name, value) in fleet.as_object().unwrap() {
            env.insert(name.clone(), value.as_str().unwrap().to_owned());
        }
    }
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = match var["value"].as_str() {
            Some(value) => value.to_owned(),
            None => {
                assert_eq!(var["valueFrom"]["secretKeyRef"]["optional"], false, "{name} must be required");
                "redis://:stand-in@redis-cluster:6379/0".to_owned()
            }
        };
        env.insert(name, value);
    }
    let config = temp_dir("k8s-cluster").join("toolhost.toml");
    let file = named("ConfigMap", "toolhost-config")["data"]["toolhost.toml"].as_str().unwrap();
    std::fs::write(&config, file).unwrap();
    check_env("deploy/kubernetes-cluster.yaml", &env, Some(&config));
    let loaded = Config::load(Some(&config), &env).unwrap();
    assert_eq!(loaded.raw.streams.shards, 6);
    assert!(loaded.redis_options().topology.is_cluster(), "cluster mode");
    let budget = named("PodDisruptionBudget", "toolhost");
    assert_eq!(budget["spec"]["selector"], deployment["spec"]["selector"]);
}

#[test]
fn kubernetes_and_dockerfile_match_the_configuration() {
    let documents = yaml_documents("deploy/kubernetes.yaml");
    let kind =
        |kind: &str| documents.iter().find(|doc| doc["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    let port = default_http_port();
    let container = &kind("Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], port);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for resource in ["cpu", "memory"] {
        assert!(container["resources"]["limits"][resource].is_string(), "limits.{resource}");
        assert!(container["resources"]["requests"][resource].is_string(), "requests.{resource}");
    }
    assert_eq!(kind("Service")["spec"]["ports"][0]["port"], port);

    // The image `./x image` builds, and no Secret with a placeholder password: the Redis URL
    // comes from a Secret the operator creates, and the pod does not start without it.
    assert_eq!(container["image"], format!("toolhost:{}", env!("CARGO_PKG_VERSION")));
    assert!(documents.iter().all(|doc| doc["kind"] != "Secret"), "ship no Secret");
    let mut env = HashMap::new();
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = match var["value"].as_str() {
            Some(value) => value.to_owned(),
            None => {
                let secret = &var["valueFrom"]["secretKeyRef"];
                assert_eq!(secret["optional"], false, "{name} must be required");
                "redis://:stand-in@redis:6379/0".to_owned()
            }
        };
        env.insert(name, value);
    }
    assert_eq!(env["TOOLHOST__HTTP__LISTEN"], format!("0.0.0.0:{port}"));
    let config = temp_dir("k8s").join("toolhost.toml");
    std::fs::write(&config, kind("ConfigMap")["data"]["toolhost.toml"].as_str().unwrap()).unwrap();
    assert_eq!(env[ENV_CONFIG], "/etc/toolhost/toolhost.toml");
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/toolhost");
    check_env("deploy/kubernetes.yaml", &env, Some(&config));
    let budget = kind("PodDisruptionBudget");
    assert_eq!(budget["spec"]["selector"], kind("Deployment")["spec"]["selector"]);
    assert_eq!(budget["spec"]["minAvailable"], 1);

    // Both Dockerfiles end in the same runtime stage, and it needs nothing but COPY.
    let runtime = |path: &str| {
        let text = std::fs::read_to_string(repo().join(path)).unwrap();
        let start =
            text.rfind("\nFROM ${BASE_IMAGE}\n").unwrap_or_else(|| panic!("{path}: no runtime stage"));
        text[start..].to_owned()
    };
    let stage = runtime("deploy/Dockerfile");
    assert_eq!(stage, runtime("deploy/Dockerfile.prebuilt"), "the runtime stages differ");
    assert!(!stage.contains("\nRUN "), "{stage}");
    assert!(
        stage.contains("\nUSER 10001:10001\n") && stage.contains(&format!("\nEXPOSE {port}\n")),
        "{stage}"
    );
    let unit = std::fs::read_to_string(repo().join("deploy/toolhost.service")).unwrap();
    let settings: Vec<&str> = unit.lines().filter(|line| !line.starts_with('#')).collect();
    assert!(settings.contains(&"RestartPreventExitStatus=64"), "{unit}");
    assert!(
        !settings.iter().any(|line| line.starts_with("ExecStartPre=")),
        "a failing ExecStartPre= is restarted forever, whatever RestartPreventExitStatus= says"
    );
}

/// A root daemon runs commands as `nobody`: a working directory or program that user cannot
/// reach is refused by `check-config` and `serve` at start, naming the path, the user and the fix,
/// and one it can reach passes without a word.
#[test]
fn paths_the_commands_user_cannot_reach_are_refused_at_start_with_the_fix() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let dir = temp_dir("host-access");
    chmod(&dir, 0o755);
    let (closed, open) = (dir.join("closed"), dir.join("open"));
    let work = closed.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&open).unwrap();
    for place in [&closed, &open] {
        std::fs::write(place.join("tool.sh"), "#!/bin/sh\necho hi\n").unwrap();
        chmod(&place.join("tool.sh"), 0o755);
    }
    chmod(&work, 0o755);
    chmod(&open, 0o755);
    chmod(&closed, 0o700);
    let config = |place: &Path, cwd: &Path| {
        format!(
            "[tools.terminal]\nsandbox_cwd = \"{cwd}\"\n\n[[commands]]\nname = \"hello\"\ndescription = \"says hi\"\n\
             argv = [\"{program}\"]\ncwd = \"{cwd}\"\n\n[[mcp_servers]]\nname = \"files\"\ncommand = \"{program}\"\n",
            cwd = cwd.display(),
            program = place.join("tool.sh").display()
        )
    };
    let closed_toml = dir.join("closed.toml");
    std::fs::write(&closed_toml, config(&closed, &work)).unwrap();
    let open_toml = dir.join("open.toml");
    std::fs::write(&open_toml, config(&open, &open)).unwrap();
    let env = [("REDIS_URL", "redis://127.0.0.1:1")];

    // Only a root daemon switches user; /proc/self belongs to this process's effective user.
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    for command in ["check-config", "serve"] {
        let output = toolhost(&[command, "--config", closed_toml.to_str().unwrap()], &env);
        let out = text(&output);
        if !root {
            // Commands run as the daemon's own user, which is the operator's to check.
            assert!(!out.contains("cannot enter"), "{out}");
            continue;
        }
        assert_eq!(output.status.code(), Some(64), "{command}: {out}");
        for expected in [
            format!(
                "tools.terminal.sandbox_cwd: nobody (uid 65534, gid 65534) cannot enter {}",
                work.display()
            ),
            format!("cannot pass through {}", closed.display()),
            format!("`chmod o+x {}`", closed.display()),
            format!("commands[0].cwd: nobody (uid 65534, gid 65534) cannot enter {}", work.display()),
            format!(
                "commands[0].argv[0]: nobody (uid 65534, gid 65534) cannot run {}",
                closed.join("tool.sh").display()
            ),
            format!(
                "mcp_servers[0].command: nobody (uid 65534, gid 65534) cannot run {}",
                closed.join("tool.sh").display()
            ),
        ] {
            assert!(out.contains(&expected), "{command}: {expected} missing from {out}");
        }
    }
    let output = toolhost(&["check-config", "--config", open_toml.to_str().unwrap()], &env);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(!text(&output).contains("cannot"), "{}", text(&output));
    chmod(&closed, 0o755);
    let _ = std::fs::remove_dir_all(dir);
}
