//! The configuration's tests: layering, validation, masking.

use super::redis::valid_cluster_node;
use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn file(text: &str) -> tempfile_path::TempPath {
    tempfile_path::TempPath::with(text)
}

mod tempfile_path {
    /// A file under the temp dir, removed on drop.
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn with(text: &str) -> TempPath {
            let path = std::env::temp_dir().join(format!("toolhost-config-{}.toml", uuid::Uuid::new_v4()));
            std::fs::write(&path, text).unwrap();
            TempPath(path)
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn defaults_load() {
    let config = Config::load(None, &env(&[])).unwrap();
    assert_eq!(config.raw.daemon.toolbox_id, "toolhost");
    assert_eq!(config.raw.streams.requests, "action-requests");
    assert_eq!(config.claim_idle, Duration::from_secs(30));
    assert_eq!(config.raw.tools.terminal.allowed_commands, Vec::<String>::new());
    assert_eq!(config.raw.tools.terminal.timeout_seconds, 5.0);
}

#[test]
fn environment_overrides_file_and_defaults() {
    let path = file("[dispatch]\nmax_in_flight = 8\nclaim_idle_ms = 1000\n");
    let config = Config::load(
        Some(&path.0),
        &env(&[
            ("TOOLHOST__DISPATCH__CLAIM_IDLE_MS", "2000"),
            ("TOOLHOST__DISPATCH__MAX_DELIVERIES", "3"),
            ("TOOLHOST__TOOLS__DISABLED", "echo,terminal_run"),
            ("REDIS_URL", "redis://:hunter2@127.0.0.1:7000/0"),
            ("AGENT_NAME", "Helper"),
            ("TERMINAL_ALLOWED_COMMANDS", "echo, ls"),
            ("TERMINAL_TIMEOUT_SECONDS", "2.5"),
        ]),
    )
    .unwrap();
    assert_eq!(config.raw.dispatch.max_in_flight, 8);
    assert_eq!(config.claim_idle, Duration::from_secs(2));
    assert_eq!(config.raw.dispatch.max_deliveries, 3);
    assert_eq!(config.raw.tools.disabled, ["echo", "terminal_run"]);
    assert_eq!(config.raw.daemon.agent_name, "Helper");
    assert_eq!(config.raw.tools.terminal.allowed_commands, ["echo", "ls"]);
    assert_eq!(config.raw.tools.terminal.timeout_seconds, 2.5);
    let printed = config.masked_toml();
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("redis://:***@127.0.0.1:7000/0"), "{printed}");
}

#[test]
fn unknown_keys_are_named() {
    let path = file("[dispatch]\nmax_inflight = 8\n");
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("max_inflight"), "{err}");
    let err = Config::load(None, &env(&[("TOOLHOST__DISPATCH__BOGUS", "1")])).unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn bad_values_are_named() {
    let path = file(
        "[dispatch]\nmax_in_flight = 0\n[log]\nformat = \"xml\"\n[http]\nlisten = \"nowhere\"\n\
         [streams]\nresponse_topics = [\"results:[\"]\n[tools.limits.\"terminal_run\"]\nmax_concurrent = 0\n",
    );
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
    let text = err.to_string();
    for key in [
        "dispatch.max_in_flight",
        "log.format",
        "http.listen",
        "streams.response_topics",
        "tools.limits.terminal_run.max_concurrent",
    ] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    let err = Config::load(None, &env(&[("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "lots")])).unwrap_err();
    assert!(err.to_string().contains("max_in_flight"), "{err}");
    let err = Config::load(None, &env(&[("TERMINAL_TIMEOUT_SECONDS", "soon")])).unwrap_err();
    assert!(err.to_string().contains("TERMINAL_TIMEOUT_SECONDS"), "{err}");
}

#[test]
fn progress_per_second_is_read_and_must_be_above_zero() {
    assert_eq!(Config::load(None, &env(&[])).unwrap().raw.dispatch.progress_per_second, 10);
    let three = file("[dispatch]\nprogress_per_second = 3\n");
    assert_eq!(Config::load(Some(&three.0), &env(&[])).unwrap().raw.dispatch.progress_per_second, 3);
    let zero = file("[dispatch]\nprogress_per_second = 0\n");
    let err = Config::load(Some(&zero.0), &env(&[])).unwrap_err();
    assert!(format!("{err:#}").contains("dispatch.progress_per_second"), "{err:#}");
}

#[test]
fn default_toml_writes_out_every_key_with_its_default() {
    let written: toml::Value = toml::from_str(DEFAULT_TOML).unwrap();
    let mut effective = toml::Value::try_from(&Config::load(None, &env(&[])).unwrap().raw).unwrap();
    // The tables with no entries by default are documented as commented-out examples.
    let tables = effective.as_table_mut().unwrap();
    assert_eq!(tables.remove("agents"), Some(toml::Value::Array(Vec::new())));
    assert_eq!(tables.remove("policy"), Some(toml::Value::Array(Vec::new())));
    let keys = tables["auth"].as_table_mut().unwrap().remove("keys");
    assert_eq!(keys, Some(toml::Value::Array(Vec::new())));
    let tokens = tables["mcp"].as_table_mut().unwrap().remove("tokens");
    assert_eq!(tokens, Some(toml::Value::Array(Vec::new())));
    let tools = tables["tools"].as_table_mut().unwrap();
    assert_eq!(tools.remove("limits"), Some(toml::Value::Table(toml::Table::new())));
    assert_eq!(written, effective);
}

#[test]
fn default_toml_examples_load_and_set_the_keys_left_unset() {
    // `# [table]` and `# key = value` lines are examples; the rest of the comments are prose.
    let example = |line: &str| {
        let Some(rest) = line.strip_prefix("# ") else { return false };
        let key = rest.split(" = ").next().unwrap_or_default();
        rest.starts_with('[')
            || (rest.contains(" = ") && key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    };
    let uncommented: String = DEFAULT_TOML
        .lines()
        .map(|line| if example(line) { &line[2..] } else { line })
        .map(|line| format!("{line}\n"))
        .collect();
    let path = file(&uncommented);
    let secrets = [
        ("ORDERS_TOKEN", "t"),
        ("TOOLHOST_KEY_AGENTS_1", "0123456789abcdef"),
        ("MCP_TOKEN_LAPTOP", "fedcba9876543210"),
    ];
    let config = Config::load(Some(&path.0), &env(&secrets)).unwrap();
    assert_eq!(config.raw.auth.auth.keys[0].tenants.as_deref(), Some(&["acme".to_owned()][..]));
    assert_eq!(config.raw.auth.policy[0].deny, ["terminal_run"]);
    assert_eq!(config.raw.doors.mcp.tokens[0].tenant, "acme");
    assert_eq!(config.raw.doors.mcp.oauth.as_ref().map(|oauth| oauth.tenant_claim.as_str()), Some("org"));
    assert!(config.secrets().contains(&"0123456789abcdef".to_owned()));
    let terminal = &config.raw.tools.terminal;
    assert!(terminal.sandbox_cwd.is_some());
    assert!(terminal.max_processes.is_some() && terminal.cpu_seconds.is_some());
    assert!(terminal.file_size_bytes.is_some());
    assert_eq!(config.raw.tools.limits["terminal_run"].max_concurrent, Some(2));
    assert_eq!(config.raw.sources.agents.len(), 1);
    assert_eq!(config.raw.sources.agents[0].name, "coder");
}

#[test]
fn one_unknown_key_does_not_hide_the_others() {
    let path = file(
        "bogus = 1\n[dispatch]\nmax_inflight = 8\nmax_deliveries = \"many\"\nread_batch = 0\n\
         [log]\nformat = \"xml\"\n[[agents]]\nname = \"coder\"\ndescription = \"d\"\ntimeout = 3\n",
    );
    let err = Config::load(Some(&path.0), &env(&[("TOOLHOST__HTTP__LISTENER", "x")])).unwrap_err();
    let keys: Vec<&str> = err.0.iter().map(|error| error.key.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "agents[0].timeout",
            "bogus",
            "dispatch.max_deliveries",
            "dispatch.max_inflight",
            "dispatch.read_batch",
            "http.listener",
            "log.format",
        ],
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("  dispatch.max_inflight: unknown field `max_inflight`\n"), "{text}");
}

#[test]
fn batching_under_load_is_on_by_default_and_reaches_the_bus_and_the_readers_when_off() {
    let config = |extra: &[(&str, &str)]| Config::load(None, &env(extra)).unwrap();
    let on = config(&[]);
    assert!(on.raw.dispatch.batch_under_load);
    assert!(on.redis_options().gather_batches);
    assert_eq!(on.read_hold(), READ_HOLD);
    let off = config(&[("TOOLHOST__DISPATCH__BATCH_UNDER_LOAD", "false")]);
    assert!(!off.redis_options().gather_batches);
    assert_eq!(off.read_hold(), Duration::ZERO);
}

#[test]
fn replica_acks_reach_the_bus_and_out_of_range_values_name_their_key() {
    let config = |extra: &[(&str, &str)]| Config::load(None, &env(extra));
    let default = config(&[]).unwrap().redis_options();
    assert_eq!((default.replica_acks, default.replica_ack_timeout), (0, Duration::from_secs(1)));
    let set =
        config(&[("TOOLHOST__REDIS__REPLICA_ACKS", "2"), ("TOOLHOST__REDIS__REPLICA_ACK_TIMEOUT_MS", "250")])
            .unwrap()
            .redis_options();
    assert_eq!((set.replica_acks, set.replica_ack_timeout), (2, Duration::from_millis(250)));
    for (var, value, key) in [
        ("TOOLHOST__REDIS__REPLICA_ACKS", "17", "redis.replica_acks: must be between 0 and 16"),
        ("TOOLHOST__REDIS__REPLICA_ACKS", "-1", "replica_acks"),
        ("TOOLHOST__REDIS__REPLICA_ACK_TIMEOUT_MS", "0", "redis.replica_ack_timeout_ms: must be between 1"),
        ("TOOLHOST__REDIS__REPLICA_ACK_TIMEOUT_MS", "60001", "redis.replica_ack_timeout_ms"),
    ] {
        let err = config(&[(var, value)]).unwrap_err();
        assert!(format!("{err:#}").contains(key), "{var}={value}: {err:#}");
    }
}

#[test]
fn toolhost_config_names_the_file_when_no_flag_does() {
    let named = file("[dispatch]\nmax_in_flight = 7\n");
    let flagged = file("[dispatch]\nmax_in_flight = 9\n");
    let vars = env(&[(ENV_CONFIG, named.0.to_str().unwrap())]);
    assert_eq!(Config::load(None, &vars).unwrap().raw.dispatch.max_in_flight, 7);
    assert_eq!(Config::load(Some(&flagged.0), &vars).unwrap().raw.dispatch.max_in_flight, 9);
    assert_eq!(Config::load(None, &env(&[(ENV_CONFIG, "")])).unwrap().raw.dispatch.max_in_flight, 256);
    let err = Config::load(None, &env(&[(ENV_CONFIG, "/nonexistent/toolhost.toml")])).unwrap_err();
    assert_eq!(err.0[0].key, ENV_CONFIG, "{err}");
}

#[test]
fn unknown_toolhost_variables_are_warned_about() {
    let config = Config::load(
        None,
        &env(&[
            ("TOOLHOST_DISPATCH__MAX_IN_FLIGHT", "8"),
            ("TOOLHOST_VERBOSE", "1"),
            ("TOOLHOST_CONFIG", ""),
            ("TOOLHOST_SOAK_REQUESTS", "10"),
            ("TOOLHOST__DISPATCH__MAX_IN_FLIGHT", "9"),
        ]),
    )
    .unwrap();
    assert_eq!(config.raw.dispatch.max_in_flight, 9);
    assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
    assert!(config.warnings[0].starts_with("TOOLHOST_DISPATCH__MAX_IN_FLIGHT is not a variable"));
    assert!(config.warnings[0].contains("did you mean TOOLHOST__DISPATCH__MAX_IN_FLIGHT?"));
    assert!(config.warnings[1].starts_with("TOOLHOST_VERBOSE is not a variable"));
    assert!(config.warnings[1].contains("TOOLHOST_CONFIG"), "{}", config.warnings[1]);
}

#[test]
fn log_format_auto_is_the_default() {
    assert_eq!(Config::load(None, &env(&[])).unwrap().raw.log.format, "auto");
    for format in LOG_FORMATS {
        let config = Config::load(None, &env(&[("TOOLHOST__LOG__FORMAT", format)])).unwrap();
        assert_eq!(config.raw.log.format, *format);
    }
}

#[test]
fn agents_need_tool_names() {
    let path = file(
        "[[agents]]\nname = \"coder\"\ndescription = \"Writes code.\"\n\n\
         [[agents]]\nname = \"dev.agent\"\ndescription = \"d\"\ntimeout_s = 0\n",
    );
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("agents[1].name: must be 1-64 of [a-zA-Z0-9_-]"), "{text}");
    assert!(text.contains("agents[1].timeout_s"), "{text}");
    assert!(!text.contains("agents[0]"), "{text}");
    let path = file("[[agents]]\nname = \"coder\"\ndescription = \"Writes code.\"\n");
    let config = Config::load(Some(&path.0), &env(&[])).unwrap();
    assert_eq!(config.raw.sources.agents[0].parameter, "message");
    assert_eq!(config.raw.sources.agents[0].timeout_s, 30.0);
}

#[test]
fn http_headers_are_expanded_and_masked() {
    let path = file(
        "[[http_tools]]\nname = \"lookup\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/orders/{id}\"\n\
         headers = { Authorization = \"Bearer ${ORDERS_TOKEN}\", X-Team = \"ops-literal\" }\n",
    );
    let config = Config::load(Some(&path.0), &env(&[("ORDERS_TOKEN", "s3cret-tok")])).unwrap();
    let headers = config.http_headers.of(0);
    assert!(headers.contains(&("Authorization".to_owned(), "Bearer s3cret-tok".to_owned())), "{headers:?}");
    assert!(config.secrets().contains(&"s3cret-tok".to_owned()));
    let printed = config.masked_toml();
    assert!(!printed.contains("s3cret") && !printed.contains("ops-literal"), "{printed}");
    assert!(printed.contains("Authorization = \"***\""), "{printed}");
    assert!(!format!("{config:?}").contains("s3cret"));
    // The method defaults to POST.
    assert_eq!(config.raw.sources.http_tools[0].method, "POST");
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
    assert!(
        err.contains("http_tools[0].headers.Authorization: the environment variable ORDERS_TOKEN is not set"),
        "{err}"
    );
}

#[test]
fn every_bad_source_key_is_named_together() {
    let dir = std::env::temp_dir().join(format!("toolhost-config-dir-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::write(
        dir.join("schemas/wc.json"),
        r#"{"type": "object", "properties": {"file": {"type": "string"}}}"#,
    )
    .unwrap();
    let path = dir.join("toolhost.toml");
    std::fs::write(
        &path,
        "[dispatch]\nmax_in_flight = 0\n\n\
         [[commands]]\nname = \"word_count\"\ndescription = \"d\"\nargv = [\"wc\", \"-w\", \"{file}\"]\nargument_schema_file = \"schemas/wc.json\"\n\n\
         [[commands]]\nname = \"broken\"\ndescription = \"d\"\nargv = [\"{prog}\"]\ntimeout_ms = 0\nbogus = 1\n",
    )
    .unwrap();
    let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("bogus"), "{err}");
    std::fs::write(&path, "[[commands]]\nname = \"nameless\"\nargv = [\"wc\"]\n").unwrap();
    let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("commands[0].description: missing configuration field"), "{err}");
    std::fs::write(
        &path,
        "[dispatch]\nmax_in_flight = 0\n\n\
         [[commands]]\nname = \"word_count\"\ndescription = \"d\"\nargv = [\"wc\", \"-w\", \"{file}\"]\nargument_schema_file = \"schemas/wc.json\"\n\n\
         [[commands]]\nname = \"broken\"\ndescription = \"d\"\nargv = [\"{prog}\"]\ntimeout_ms = 0\n\n\
         [[http_tools]]\nname = \"h\"\ndescription = \"d\"\nmethod = \"TRACE\"\nurl = \"http://{host}/x\"\n",
    )
    .unwrap();
    let err = Config::load(Some(&path), &env(&[])).unwrap_err().to_string();
    for key in [
        "dispatch.max_in_flight",
        "commands[1].timeout_ms",
        "commands[1].argv[0]: the program cannot be a placeholder",
        "http_tools[0].method",
        "http_tools[0].url: placeholders may fill the path and the query, never the host",
    ] {
        assert!(err.contains(key), "{key} missing from {err}");
    }
    assert!(!err.contains("commands[0]"), "the schema file is found beside the configuration: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn urls_are_masked() {
    // The rules are the settings crate's (`mask_url`); here, what the configuration prints.
    let config =
        Config::load(None, &env(&[("REDIS_URL", "unix:///run/redis.sock?db=1&password=s3cret")])).unwrap();
    assert_eq!(config.secrets(), ["s3cret"]);
    for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
        assert!(!printed.contains("s3cret"), "{printed}");
    }
}

#[test]
fn cluster_nodes_are_trimmed_and_bare_nodes_take_no_credentials() {
    let nodes = |value: &str| Config::load(None, &env(&[("TOOLHOST__REDIS__CLUSTER_NODES", value)]));
    // Unset (an empty compose variable): no cluster.
    let config = nodes("").unwrap();
    assert!(config.raw.redis.cluster_nodes.is_empty());
    assert!(!config.redis_options().topology.is_cluster());
    let config = nodes(" 10.0.0.1:7000, 10.0.0.2:7001 ,").unwrap();
    assert_eq!(config.raw.redis.cluster_nodes, ["10.0.0.1:7000", "10.0.0.2:7001"]);
    assert!(config.redis_options().topology.is_cluster());
    let err = nodes("ops:s3cret@10.0.0.1:7000,10.0.0.2:7001/2").unwrap_err().to_string();
    for key in ["redis.cluster_nodes[0]", "redis.cluster_nodes[1]"] {
        assert!(err.contains(key), "{key}: {err}");
    }
    assert!(err.contains("redis:// or rediss:// URL"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    assert!(!valid_cluster_node("ops:s3cret@10.0.0.1:7000") && !valid_cluster_node("h:1/2"));
    assert!(valid_cluster_node("redis://ops:s3cret@10.0.0.1:7000"));
}

#[test]
fn a_unix_sentinel_url_is_refused_as_not_tcp() {
    let err = Config::load(
        None,
        &env(&[
            ("TOOLHOST__REDIS__SENTINELS", "unix:///run/sentinel.sock"),
            ("TOOLHOST__REDIS__SENTINEL_MASTER", "orders"),
        ]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("redis.sentinels[0]") && err.contains("not unix://"), "{err}");
    assert!(!err.contains("database"), "{err}");
}

#[test]
fn secrets_are_the_url_password_as_written_and_decoded() {
    let secrets = |url: &str| Config::load(None, &env(&[("REDIS_URL", url)])).unwrap().secrets();
    assert_eq!(secrets("redis://:hunter2@127.0.0.1:6379/0"), ["hunter2"]);
    assert_eq!(secrets("redis://ops:p%40ss%2Fw@127.0.0.1"), ["p%40ss%2Fw", "p@ss/w"]);
    assert_eq!(secrets("redis://token@127.0.0.1"), ["token"]);
    assert_eq!(secrets("unix:///run/redis.sock?db=1&pass=s3cret"), ["s3cret"]);
    assert_eq!(secrets("redis://127.0.0.1:6379"), Vec::<String>::new());
    assert_eq!(percent_decode("%zz%4"), "%zz%4");
}

#[test]
fn unknown_run_as_users_are_named() {
    let err = Config::load(None, &env(&[("TOOLHOST__TOOLS__TERMINAL__RUN_AS", "toolhost-no-such-user")]))
        .unwrap_err();
    assert!(
        err.to_string().contains("tools.terminal.run_as: no user named 'toolhost-no-such-user'"),
        "{err}"
    );
    let path = file("[http]\nmax_connections = 0\nidle_timeout_ms = 0\n");
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
    assert!(err.contains("http.max_connections") && err.contains("http.idle_timeout_ms"), "{err}");
}

#[test]
fn sentinels_are_read_from_the_environment_and_become_the_topology() {
    let config = Config::load(
        None,
        &env(&[
            ("TOOLHOST__REDIS__SENTINELS", "redis://10.0.0.1:26379, rediss://:s3ntinel@10.0.0.2:26380"),
            ("TOOLHOST__REDIS__SENTINEL_MASTER", "orders"),
            ("TOOLHOST__REDIS__SENTINEL_PASSWORD", "hunter2"),
            ("REDIS_URL", "redis://:s3cret@ignored:6379/2"),
        ]),
    )
    .unwrap();
    assert_eq!(config.raw.redis.sentinels, ["redis://10.0.0.1:26379", "rediss://:s3ntinel@10.0.0.2:26380"]);
    let options = config.redis_options();
    let toolhost_bus::Topology::Sentinel(sentinels) = &options.topology else {
        panic!("{:?}", options.topology)
    };
    assert_eq!(sentinels.master_name, "orders");
    assert_eq!((sentinels.username.as_deref(), sentinels.password.as_deref()), (None, Some("hunter2")));
    assert_eq!(sentinels.check_interval, Some(Duration::from_secs(5)));
    assert_eq!(options.url, "redis://:s3cret@ignored:6379/2");
    for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
        for secret in ["s3ntinel", "hunter2", "s3cret"] {
            assert!(!printed.contains(secret), "{secret} in {printed}");
        }
    }
    assert!(config.masked_toml().contains("rediss://:***@10.0.0.2:26380"), "{}", config.masked_toml());
    assert!(config.raw.redis.describe().starts_with("master orders via sentinels redis://10.0.0.1:26379,"));
    assert_eq!(config.secrets(), ["hunter2", "s3cret", "s3ntinel"]);
    // Unset (an empty compose variable): no Sentinel.
    let config = Config::load(None, &env(&[("TOOLHOST__REDIS__SENTINELS", "")])).unwrap();
    assert!(config.raw.redis.sentinels.is_empty());
    assert_eq!(config.redis_options().topology, toolhost_bus::Topology::Single);
}

#[test]
fn bad_sentinel_settings_are_named_together() {
    let path = file(
        "[redis]\nurl = \"unix:///run/redis.sock\"\nsentinels = [\"http://x:1\", \"redis://:s3cret@h:26379/1\"]\n\
         sentinel_master = \"\"\n",
    );
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err();
    let text = err.to_string();
    for key in ["redis.sentinels[0]", "redis.sentinels[1]", "redis.url", "redis.sentinel_master"] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    assert!(!text.contains("s3cret"), "{text}");
}

#[test]
fn acl_users_and_tls_urls_are_accepted() {
    for url in [
        "redis://ops:s3cret@10.0.0.1:6379/2",
        "rediss://:s3cret@redis.example:6380",
        "unix:///run/redis.sock",
    ] {
        let config = Config::load(None, &env(&[("REDIS_URL", url)])).unwrap();
        assert_eq!(config.raw.redis.url, url);
        assert!(!config.masked_toml().contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));
    }
    let err = Config::load(None, &env(&[("REDIS_URL", "http://:s3cret@host")])).unwrap_err();
    assert!(err.to_string().contains("redis.url") && !err.to_string().contains("s3cret"), "{err}");
}

#[test]
fn cluster_nodes_choose_the_topology_and_are_masked() {
    let config = Config::load(
        None,
        &env(&[
            ("REDIS_URL", "rediss://app:s3cret@seed:6379"),
            ("TOOLHOST__REDIS__CLUSTER_NODES", "10.0.0.1:7000,redis://ops:n0de@10.0.0.2:7001"),
        ]),
    )
    .unwrap();
    assert_eq!(config.raw.redis.cluster_nodes, ["10.0.0.1:7000", "redis://ops:n0de@10.0.0.2:7001"]);
    let options = config.redis_options();
    assert!(options.topology.is_cluster());
    assert!(config.keys().is_cluster());
    for printed in [config.masked_toml(), format!("{config:?}"), config.raw.redis.describe()] {
        assert!(!printed.contains("s3cret") && !printed.contains("n0de"), "{printed}");
    }
    assert!(config.secrets().contains(&"n0de".to_owned()));
    // Without nodes: one server, as before.
    let single = Config::load(None, &env(&[])).unwrap();
    assert!(!single.redis_options().topology.is_cluster() && !single.keys().is_cluster());
    let path = file("[redis]\ncluster_nodes = [\"nope\", \"unix:///x.sock\"]\nkey_prefix = \"a{b}:\"\n");
    let err = Config::load(Some(&path.0), &env(&[])).unwrap_err().to_string();
    for key in ["redis.cluster_nodes[0]", "redis.cluster_nodes[1]", "redis.key_prefix"] {
        assert!(err.contains(key), "{key}: {err}");
    }
    let path = file("[redis]\ncluster_nodes = [\"127.0.0.1:7000\"]\nkey_prefix = \"{toolhost}:\"\n");
    assert!(Config::load(Some(&path.0), &env(&[])).is_ok());
    let err = Config::load(Some(&path.0), &env(&[("REDIS_URL", "redis://:s3cret@seed:6379/2")])).unwrap_err();
    assert!(err.to_string().contains("redis.url") && err.to_string().contains("database 0"), "{err}");
}

#[test]
fn shard_settings_are_read_from_files_and_the_environment_and_bad_ones_name_their_key() {
    let config = Config::load(None, &env(&[])).unwrap();
    assert_eq!((config.raw.streams.shards, config.raw.streams.previous_shards), (1, 0));
    assert!(config.raw.streams.read_shards.is_empty() && config.previous_shards().is_none());
    let config = Config::load(
        None,
        &env(&[
            ("TOOLHOST__STREAMS__SHARDS", "6"),
            ("TOOLHOST__STREAMS__READ_SHARDS", "0, 1,2"),
            ("TOOLHOST__STREAMS__PREVIOUS_SHARDS", "1"),
        ]),
    )
    .unwrap();
    assert_eq!(config.shards().count(), 6);
    assert_eq!(config.raw.streams.read_shards, [0, 1, 2]);
    assert_eq!(config.previous_shards().map(|shards| shards.count()), Some(1));
    // A blocking read per shard read and per previous shard, with room.
    assert!(config.redis_options().idle_blocking >= 8);
    // One shard alone, which the environment gives as a number rather than a list.
    let one = Config::load(
        None,
        &env(&[("TOOLHOST__STREAMS__SHARDS", "3"), ("TOOLHOST__STREAMS__READ_SHARDS", "1")]),
    )
    .unwrap();
    assert_eq!(one.raw.streams.read_shards, [1]);
    let listed = file("[streams]\nshards = 4\nread_shards = [3, 1]\n");
    assert_eq!(Config::load(Some(&listed.0), &env(&[])).unwrap().raw.streams.read_shards, [3, 1]);
    for (pairs, key, says) in [
        (vec![("TOOLHOST__STREAMS__SHARDS", "0")], "streams.shards", "must be 1 to 1024"),
        (vec![("TOOLHOST__STREAMS__SHARDS", "2000")], "streams.shards", "must be 1 to 1024"),
        (
            vec![("TOOLHOST__STREAMS__SHARDS", "3"), ("TOOLHOST__STREAMS__READ_SHARDS", "1,3")],
            "streams.read_shards",
            "shard 3 does not exist",
        ),
        (
            vec![("TOOLHOST__STREAMS__SHARDS", "3"), ("TOOLHOST__STREAMS__READ_SHARDS", "1,1")],
            "streams.read_shards",
            "names a shard twice",
        ),
        (vec![("TOOLHOST__STREAMS__READ_SHARDS", "first")], "read_shards", "not a shard number"),
        (
            vec![("TOOLHOST__STREAMS__SHARDS", "6"), ("TOOLHOST__STREAMS__PREVIOUS_SHARDS", "6")],
            "streams.previous_shards",
            "other than shards",
        ),
    ] {
        let err = format!("{:#}", Config::load(None, &env(&pairs)).unwrap_err());
        assert!(err.contains(key) && err.contains(says), "{pairs:?}: {err}");
    }
}

#[test]
fn the_ledger_format_rolls_from_1_to_2_and_2_to_3_and_bad_combinations_name_their_key() {
    use toolhost_bus::LedgerFormat;
    let format = |vars: &[(&str, &str)]| {
        Config::load(None, &env(vars)).map(|config| config.redis_options().ledger_format)
    };
    assert_eq!(format(&[]).unwrap(), LedgerFormat::One);
    let rolling =
        [("TOOLHOST__DISPATCH__LEDGER_FORMAT", "2"), ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", "1")];
    assert_eq!(format(&rolling).unwrap(), LedgerFormat::Rolling);
    assert_eq!(format(&[("TOOLHOST__DISPATCH__LEDGER_FORMAT", "2")]).unwrap(), LedgerFormat::Two);
    let rolling_to_three =
        [("TOOLHOST__DISPATCH__LEDGER_FORMAT", "3"), ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", "2")];
    assert_eq!(format(&rolling_to_three).unwrap(), LedgerFormat::RollingToThree);
    assert_eq!(format(&[("TOOLHOST__DISPATCH__LEDGER_FORMAT", "3")]).unwrap(), LedgerFormat::Three);
    for (vars, key) in [
        (&[("TOOLHOST__DISPATCH__LEDGER_FORMAT", "4")][..], "dispatch.ledger_format"),
        (
            &[
                ("TOOLHOST__DISPATCH__LEDGER_FORMAT", "3"),
                ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", "1"),
            ][..],
            "dispatch.previous_ledger_format",
        ),
        (&[("TOOLHOST__DISPATCH__LEDGER_FORMAT", "0")][..], "dispatch.ledger_format"),
        (&[("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", "1")][..], "dispatch.previous_ledger_format"),
        (
            &[
                ("TOOLHOST__DISPATCH__LEDGER_FORMAT", "2"),
                ("TOOLHOST__DISPATCH__PREVIOUS_LEDGER_FORMAT", "2"),
            ][..],
            "dispatch.previous_ledger_format",
        ),
    ] {
        let err = format(vars).unwrap_err().to_string();
        assert!(err.contains(key), "{vars:?}: {err}");
    }
}
