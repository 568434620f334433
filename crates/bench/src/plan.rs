//! What the harness measures and in which order: the Redis round trip, then each target's
//! ready time and rows; or the target rows interleaved across targets (`--interleave`); or
//! only the soak; or only the memory of the answered marks.
//!
//! Every row starts its target afresh against a flushed Redis, so no row inherits another's
//! streams, groups or heap. A row that cannot start or gets no answer during warm-up
//! becomes an error row; the run goes on.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use redis::aio::MultiplexedConnection;

use crate::envelope::{REQUESTS_STREAM, RESULTS_STREAM, RequestKind};
use crate::load::{self, Generator, LoadResult, LoadSpec};
use crate::procfs::{self, MachineInfo, RssSampler};
use crate::redis_server::RedisServer;
use crate::report::{CommandCost, MarkMemory, ReadyTime, Report, Row, Settings, Soak};
use crate::target::{self, Launch, Worker};

/// The scenario name of the independent generator's rows.
pub const INDEPENDENT_SCENARIO: &str = "echo, independent generator";
/// Lanes of the independent generator (issue 27).
pub const INDEPENDENT_IN_FLIGHT: usize = 64;
/// The longest a run counted in requests (the independent generator's) may take.
const COUNTED_RUN_LIMIT: Duration = Duration::from_secs(600);
/// Sequential PINGs for the floor row.
const N_PINGS: u32 = 20_000;
/// The message size of the main echo rows.
const DEFAULT_PAYLOAD: usize = 100;
/// In-flight counts of the main echo rows.
const IN_FLIGHT: [usize; 4] = [1, 8, 64, 256];
/// In-flight counts of the interleaved rows: the issue's targets are set at 1 and 64.
pub const INTERLEAVED_IN_FLIGHT: [usize; 2] = [1, 64];
/// In flight while answered marks are being made for the memory measurement.
const MARKS_IN_FLIGHT: usize = 64;
/// Marks sampled with `MEMORY USAGE`.
const MARKS_SAMPLED: usize = 200;

/// What to run, as decided from the command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// Shorter run for a smoke test.
    pub quick: bool,
    /// Measure sequential Redis PINGs (the round-trip row).
    pub ping: bool,
    /// Workers to measure, in order.
    pub workers: Vec<Worker>,
    /// Length of one repetition.
    pub duration: Duration,
    /// Repetitions per row.
    pub reps: usize,
    /// Warm-up before the first repetition of a row.
    pub warmup: Duration,
    /// Starts for the ready-time median.
    pub ready_starts: usize,
    /// The `toolhost` executable.
    pub toolhost_bin: PathBuf,
    /// The `toolhost-refworker` executable.
    pub refworker_bin: PathBuf,
    /// A baseline `toolhost` executable, measured as `toolhost-base`.
    pub baseline_bin: Option<PathBuf>,
    /// Interleaved runs per row (0: off). Each run starts its target afresh and does one
    /// repetition; targets take turns in a rotating order, and each row reports the
    /// median of its runs.
    pub interleave: usize,
    /// In-flight counts of the echo rows, when not all of them.
    pub in_flight: Option<Vec<usize>>,
    /// The load generators of the interleaved rows: the harness's at every in-flight count,
    /// the independent one at [`INDEPENDENT_IN_FLIGHT`] (or the first `--in-flight`).
    pub generators: Vec<Generator>,
    /// Requests of one independent-generator run.
    pub independent_requests: u64,
    /// Warm-up requests before it.
    pub independent_warmup: u64,
    /// Only measure Redis memory per answered mark, after this many requests per target.
    pub marks: Option<u64>,
    /// Run only the soak, with this many requests.
    pub soak: Option<u64>,
    /// Where reports and target logs go.
    pub out_dir: PathBuf,
    /// Interleaved runs also measure toolhost with `require_signature` and a tenant policy
    /// (the `echo, signed + policy` row), beside plain echo.
    pub auth: bool,
    /// Interleaved runs also measure toolhost exporting spans (`[telemetry]`) at sampler ratio
    /// 0 and 1 to an OTLP receiver that does nothing, beside plain echo (telemetry off).
    pub telemetry: bool,
}

/// The key of the signed rows, handed to the daemon in [`SIGNING_ENV`].
const SIGNING_SECRET: &str = "bench-signing-secret-0123456789";
const SIGNING_ENV: &str = "BENCH_SIGNING_KEY";
/// The configuration of the signed rows: signatures required, a key bound to one tenant, and a
/// policy with allow and deny globs, a rate and an in-flight limit, all high enough never to
/// refuse, so the row measures their cost on every request.
const AUTH_CONFIG: &str = r#"
[auth]
require_signature = true

[[auth.keys]]
id = "bench"
secret_env = "BENCH_SIGNING_KEY"
tenants = ["bench"]

[[policy]]
tenant = "bench"
allow = ["echo", "time__*", "synthetic_*"]
deny = ["terminal_run", "chat_*"]
rate = "1000000/s"
max_in_flight = 4096

[[policy]]
tenant = "*"
allow = ["echo"]
"#;

/// Runs everything `options` asks for and returns the report (ratios included).
///
/// # Errors
///
/// Only when the harness itself cannot work: no redis-server, Redis unreachable. Failing
/// targets become error rows instead.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let redis = RedisServer::start()?;
    let client = redis::Client::open(redis.url())?;
    let admin_config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let admin = client
        .get_multiplexed_async_connection_with_config(&admin_config)
        .await
        .context("connecting to the harness's redis-server")?;
    let mut bench = Bench { options, redis, admin, ticks_per_second: procfs::ticks_per_second() };
    let mut report = Report {
        machine: MachineInfo::collect(),
        settings: Settings {
            quick: options.quick,
            reps: options.reps,
            duration_s: options.duration.as_secs_f64(),
            warmup_s: options.warmup.as_secs_f64(),
            ready_starts: options.ready_starts,
            interleave: options.interleave,
            independent_requests: options.independent_requests,
            independent_warmup: options.independent_warmup,
        },
        rows: Vec::new(),
        ready: Vec::new(),
        soak: Vec::new(),
        marks: Vec::new(),
    };
    if let Some(n_requests) = options.marks {
        for &worker in options.workers.iter().filter(|worker| **worker != Worker::Reference) {
            eprintln!("bench: answered marks of {} after {n_requests} requests", worker.name());
            report.marks.push(bench.mark_memory(worker, n_requests).await);
        }
        return Ok(report);
    }
    if let Some(n_requests) = options.soak {
        for &worker in &options.workers {
            eprintln!("bench: soak of {} with {n_requests} requests", worker.name());
            report.soak.push(bench.soak(worker, n_requests).await);
        }
        return Ok(report);
    }
    if options.ping {
        eprintln!("bench: redis PING round trip");
        report.rows.push(bench.ping().await?);
    }
    if options.interleave > 0 {
        bench.interleaved(&mut report).await;
        report.compute_ratios();
        return Ok(report);
    }
    for &worker in &options.workers {
        eprintln!("bench: {} ready time", worker.name());
        let ready = bench.ready_time(worker).await;
        // A target that never started once will not start for the rows either; saying so
        // beats waiting for the ready limit once per row.
        let start_error = ready.error.clone().filter(|_| ready.samples_ms.is_empty());
        report.ready.push(ready);
        for scenario in scenarios(worker, options.in_flight.as_deref()) {
            if let Some(error) = &start_error {
                report.rows.push(scenario.error_row(worker, format!("failed to start: {error}")));
                continue;
            }
            eprintln!(
                "bench: {} {} in-flight={} payload={}",
                worker.name(),
                scenario.name,
                scenario.in_flight,
                scenario.kind.payload_bytes()
            );
            let row = bench.measure(worker, &scenario, options.reps).await;
            if let Some(error) = &row.error {
                eprintln!("bench:   error: {error}");
            }
            report.rows.push(row);
        }
    }
    report.compute_ratios();
    Ok(report)
}

/// One row to measure: a request kind at an in-flight count, and how to start the daemon.
#[derive(Clone, Debug)]
struct Scenario {
    generator: Generator,
    name: String,
    baseline: Option<&'static str>,
    in_flight: usize,
    kind: RequestKind,
    serve_args: Vec<String>,
    env: Vec<(String, String)>,
    /// A configuration file's text, written under the logs and named in `TOOLHOST_CONFIG`.
    config: Option<&'static str>,
}

impl Scenario {
    fn echo(in_flight: usize, payload_bytes: usize) -> Self {
        Scenario {
            generator: Generator::Harness,
            name: "echo".to_owned(),
            baseline: Some("echo"),
            in_flight,
            kind: RequestKind::echo(payload_bytes),
            serve_args: Vec::new(),
            env: Vec::new(),
            config: None,
        }
    }

    /// Echo with spans exported over OTLP/HTTP to `endpoint` at sampler ratio `ratio` (through
    /// the standard variables), metrics too: the cost of `[telemetry]`.
    fn traced_echo(in_flight: usize, payload_bytes: usize, endpoint: &str, ratio: &str) -> Self {
        Scenario {
            generator: Generator::Harness,
            name: format!("echo, telemetry ratio {ratio}"),
            baseline: None,
            in_flight,
            kind: RequestKind::echo(payload_bytes),
            serve_args: Vec::new(),
            env: vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.to_owned()),
                ("OTEL_TRACES_SAMPLER".to_owned(), "parentbased_traceidratio".to_owned()),
                ("OTEL_TRACES_SAMPLER_ARG".to_owned(), ratio.to_owned()),
            ],
            config: None,
        }
    }

    /// Echo, signed, for a tenant with a policy: the cost of `[auth]` and `[[policy]]`.
    fn signed_echo(in_flight: usize, payload_bytes: usize) -> Self {
        Scenario {
            generator: Generator::Harness,
            name: "echo, signed + policy".to_owned(),
            baseline: None,
            in_flight,
            kind: RequestKind::SignedEcho {
                message: "x".repeat(payload_bytes),
                key_id: "bench".to_owned(),
                secret: SIGNING_SECRET.to_owned(),
                tenant: "bench".to_owned(),
            },
            serve_args: Vec::new(),
            env: vec![(SIGNING_ENV.to_owned(), SIGNING_SECRET.to_owned())],
            config: Some(AUTH_CONFIG),
        }
    }

    fn toolhost_only(name: &str, kind: RequestKind) -> Self {
        Scenario {
            generator: Generator::Harness,
            name: name.to_owned(),
            baseline: None,
            in_flight: 8,
            kind,
            serve_args: Vec::new(),
            env: Vec::new(),
            config: None,
        }
    }

    /// Echo `ping` at `in_flight` from the independent generator.
    fn independent(in_flight: usize) -> Self {
        Scenario {
            generator: Generator::Independent,
            name: INDEPENDENT_SCENARIO.to_owned(),
            baseline: Some(INDEPENDENT_SCENARIO),
            in_flight,
            kind: RequestKind::Echo { message: crate::envelope::INDEPENDENT_MESSAGE.to_owned() },
            serve_args: Vec::new(),
            env: Vec::new(),
            config: None,
        }
    }

    fn with_tools(mut self, n_tools: usize) -> Self {
        self.serve_args = vec!["--synthetic-tools".to_owned(), n_tools.to_string()];
        self
    }

    /// The load of its warm-up or of one repetition: the harness's generator for a duration,
    /// the independent one for a count of requests.
    fn load(&self, options: &Options, warmup: bool) -> LoadSpec {
        let (duration, max_requests) = match (self.generator, warmup) {
            (Generator::Harness, true) => (options.warmup, None),
            (Generator::Harness, false) => (options.duration, None),
            (Generator::Independent, true) => (COUNTED_RUN_LIMIT, Some(options.independent_warmup)),
            (Generator::Independent, false) => (COUNTED_RUN_LIMIT, Some(options.independent_requests)),
        };
        LoadSpec {
            generator: self.generator,
            in_flight: self.in_flight,
            kind: self.kind.clone(),
            duration,
            max_requests,
        }
    }

    /// An empty row for this scenario on `worker`.
    fn row(&self, worker: Worker) -> Row {
        Row {
            target: worker.name().to_owned(),
            scenario: self.name.clone(),
            baseline: self.baseline.map(str::to_owned),
            in_flight: self.in_flight,
            payload_bytes: self.kind.payload_bytes(),
            ..Row::default()
        }
    }

    fn error_row(&self, worker: Worker, error: String) -> Row {
        Row { error: Some(error), ..self.row(worker) }
    }

    fn log_name(&self, worker: Worker) -> String {
        let slug: String =
            self.name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        format!("{}-{slug}-{}-{}.log", worker.name(), self.in_flight, self.kind.payload_bytes())
    }
}

/// The rows of each worker. The reference workers only answer like echo, so they get the
/// echo rows. With `in_flight`, only the 100 B echo rows at those counts.
fn scenarios(worker: Worker, in_flight: Option<&[usize]>) -> Vec<Scenario> {
    if let Some(in_flight) = in_flight {
        return in_flight.iter().map(|&in_flight| Scenario::echo(in_flight, DEFAULT_PAYLOAD)).collect();
    }
    let mut res: Vec<Scenario> =
        IN_FLIGHT.iter().map(|&in_flight| Scenario::echo(in_flight, DEFAULT_PAYLOAD)).collect();
    res.push(Scenario::echo(8, 10 * 1024));
    res.push(Scenario::echo(8, 500 * 1024));
    if worker.is_toolhost() {
        let mut terminal = Scenario::toolhost_only("terminal_run", RequestKind::TerminalRun);
        terminal.env = vec![("TERMINAL_ALLOWED_COMMANDS".to_owned(), "echo".to_owned())];
        res.push(terminal);
        res.push(Scenario::toolhost_only("tools.discover", RequestKind::Discover));
        res.push(Scenario::toolhost_only("schema, 20 fields", RequestKind::synthetic()).with_tools(1));
        for n_tools in [3, 1000] {
            let mut count = Scenario::echo(64, DEFAULT_PAYLOAD).with_tools(n_tools);
            count.name = format!("echo, {n_tools} synthetic tools");
            res.push(count);
        }
    }
    res
}

/// The interleaved rows: the harness's echo at each in-flight count, then the independent
/// generator's at 64 (or the first `--in-flight`), as `options.generators` asks.
fn interleaved_scenarios(options: &Options) -> Vec<Scenario> {
    let in_flight = options.in_flight.clone().unwrap_or_else(|| INTERLEAVED_IN_FLIGHT.to_vec());
    let mut res = Vec::new();
    if options.generators.contains(&Generator::Harness) {
        res.extend(in_flight.iter().map(|&in_flight| Scenario::echo(in_flight, DEFAULT_PAYLOAD)));
    }
    if options.generators.contains(&Generator::Independent) {
        let lanes = options.in_flight.as_ref().and_then(|given| given.first().copied());
        res.push(Scenario::independent(lanes.unwrap_or(INDEPENDENT_IN_FLIGHT)));
    }
    res
}

/// Shared state of one harness run.
struct Bench<'a> {
    options: &'a Options,
    redis: RedisServer,
    admin: MultiplexedConnection,
    ticks_per_second: u64,
}

/// One repetition's numbers.
struct Rep {
    load: LoadResult,
    cpu_us_per_request: Option<f64>,
    redis_cpu_us_per_request: Option<f64>,
    harness_cpu_us_per_request: Option<f64>,
    rss_peak_kib: Option<u64>,
    redis_commands: Vec<CommandCost>,
}

impl Bench<'_> {
    async fn ping(&mut self) -> anyhow::Result<Row> {
        let mut histogram = load::new_histogram();
        let cpu_before = self.redis_cpu_us().await;
        let started = Instant::now();
        for _ in 0..N_PINGS {
            let sent_at = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut self.admin).await.context("PING")?;
            let micros = u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX);
            histogram.saturating_record(micros.max(1));
        }
        let elapsed = started.elapsed();
        let cpu_after = self.redis_cpu_us().await;
        Ok(Row {
            target: "redis".to_owned(),
            scenario: "PING (round trip)".to_owned(),
            in_flight: 1,
            rps: f64::from(N_PINGS) / elapsed.as_secs_f64(),
            p50_us: histogram.value_at_quantile(0.5),
            p90_us: histogram.value_at_quantile(0.9),
            p99_us: histogram.value_at_quantile(0.99),
            max_us: histogram.max(),
            redis_cpu_us_per_request: us_per_request(cpu_before, cpu_after, u64::from(N_PINGS)),
            n_answered: u64::from(N_PINGS),
            ..Row::default()
        })
    }

    async fn ready_time(&mut self, worker: Worker) -> ReadyTime {
        let mut samples_ms = Vec::new();
        let mut error = None;
        for start_idx in 0..self.options.ready_starts {
            let launch = self.launch(worker, &[], &[], format!("{}-ready-{start_idx}.log", worker.name()));
            match self.start(&launch).await {
                Ok(running) => {
                    samples_ms.push(running.ready_after.as_secs_f64() * 1000.0);
                    running.stop().await;
                }
                Err(err) => {
                    error = Some(format!("{err:#}"));
                    break;
                }
            }
        }
        ReadyTime { target: worker.name().to_owned(), median_ms: median(&samples_ms), samples_ms, error }
    }

    /// The echo rows at [`INTERLEAVED_IN_FLIGHT`] (or `--in-flight`), each run
    /// `options.interleave` times with the targets taking turns, so slow drifts of a shared
    /// machine spread over all of them; each row holds the medians of its runs.
    async fn interleaved(&mut self, report: &mut Report) {
        // The collector of the telemetry rows: answers every export, keeps nothing.
        let collector = match self.options.telemetry {
            true => match crate::otlp_sink::start().await {
                Ok(endpoint) => Some(endpoint),
                Err(err) => {
                    eprintln!("bench: no OTLP receiver for the telemetry rows: {err}");
                    None
                }
            },
            false => None,
        };
        for scenario in interleaved_scenarios(self.options) {
            let in_flight = scenario.in_flight;
            let mut turns: Vec<(Worker, Scenario)> =
                self.options.workers.iter().map(|&worker| (worker, scenario.clone())).collect();
            // The cost of signatures and policy, beside plain echo (harness rows only).
            if self.options.auth && scenario.name.starts_with("echo") {
                turns.push((Worker::Toolhost, Scenario::signed_echo(in_flight, DEFAULT_PAYLOAD)));
            }
            // The cost of spans: off (plain echo), on and sampling nothing, on and sampling all;
            // for the baseline build too, when one is measured, so two builds compare in one run.
            if let Some(endpoint) = collector.as_deref().filter(|_| scenario.name.starts_with("echo")) {
                for &worker in self.options.workers.iter().filter(|worker| worker.is_toolhost()) {
                    for ratio in ["0", "1"] {
                        turns.push((
                            worker,
                            Scenario::traced_echo(in_flight, DEFAULT_PAYLOAD, endpoint, ratio),
                        ));
                    }
                }
            }
            let mut runs: Vec<Vec<Row>> = vec![Vec::new(); turns.len()];
            for round in 0..self.options.interleave {
                for turn in 0..turns.len() {
                    // Rotate who goes first, so no target always follows the same one.
                    let idx = (turn + round) % turns.len();
                    let (worker, scenario) = &turns[idx];
                    let worker = *worker;
                    eprintln!(
                        "bench: run {}/{} {} {} in-flight={in_flight}",
                        round + 1,
                        self.options.interleave,
                        worker.name(),
                        scenario.name,
                    );
                    let row = self.measure(worker, scenario, 1).await;
                    if let Some(error) = &row.error {
                        eprintln!("bench:   error: {error}");
                    }
                    runs[idx].push(row);
                }
            }
            for rows in runs {
                if let Some(row) = median_row(rows) {
                    report.rows.push(row);
                }
            }
        }
    }

    /// Sends `n_requests` echo requests through `worker`, stops it, and weighs the answered
    /// marks it left: `used_memory` with them and after deleting them, and `MEMORY USAGE`
    /// of a sample.
    async fn mark_memory(&mut self, worker: Worker, n_requests: u64) -> MarkMemory {
        let mut marks =
            MarkMemory { target: worker.name().to_owned(), requests: n_requests, ..MarkMemory::default() };
        if let Err(err) = self.weigh_marks(worker, &mut marks).await {
            marks.error = Some(format!("{err:#}"));
        }
        marks
    }

    async fn weigh_marks(&mut self, worker: Worker, marks: &mut MarkMemory) -> anyhow::Result<()> {
        let launch = self.launch(worker, &[], &[], format!("{}-marks.log", worker.name()));
        let running = self.start(&launch).await?;
        let spec = LoadSpec {
            generator: Generator::Harness,
            in_flight: MARKS_IN_FLIGHT,
            kind: RequestKind::echo(DEFAULT_PAYLOAD),
            duration: Duration::from_secs(3600),
            max_requests: Some(marks.requests),
        };
        let load = load::run(&self.redis.url(), &spec).await;
        running.stop().await;
        let load = load?;
        anyhow::ensure!(
            load.n_answered() == marks.requests,
            "{} of {} requests answered: {}",
            load.n_answered(),
            marks.requests,
            load.first_error.unwrap_or_default()
        );
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("*:answered:*")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.admin)
                .await
                .context("SCAN")?;
            keys.extend(page);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        marks.marks = keys.len() as u64;
        let dbsize: u64 = redis::cmd("DBSIZE").query_async(&mut self.admin).await.context("DBSIZE")?;
        marks.other_keys = dbsize.saturating_sub(marks.marks);
        if let Some(key) = keys.first() {
            let value: Vec<u8> =
                redis::cmd("GET").arg(key).query_async(&mut self.admin).await.context("GET")?;
            let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut self.admin).await.context("PTTL")?;
            marks.sample_key = Some(key.clone());
            marks.sample_value_len = Some(value.len());
            marks.sample_pttl_ms = Some(pttl);
        }
        let mut usage_total = 0u64;
        let sampled = &keys[..keys.len().min(MARKS_SAMPLED)];
        for key in sampled {
            let usage: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut self.admin)
                .await
                .context("MEMORY USAGE")?;
            usage_total += usage;
        }
        if !sampled.is_empty() {
            marks.memory_usage_mean = Some(usage_total as f64 / sampled.len() as f64);
        }
        // Give serverCron a moment (the scans' reply buffers are freed, rehashing done).
        tokio::time::sleep(Duration::from_secs(1)).await;
        marks.used_memory_with_marks = self.used_memory().await?;
        for chunk in keys.chunks(1000) {
            let _: u64 = redis::cmd("DEL").arg(chunk).query_async(&mut self.admin).await.context("DEL")?;
        }
        // serverCron shrinks the key tables once they are mostly empty; that memory was the
        // marks' too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        marks.used_memory_without_marks = self.used_memory().await?;
        if marks.marks > 0 {
            marks.bytes_per_mark = Some(
                marks.used_memory_with_marks.saturating_sub(marks.used_memory_without_marks) as f64
                    / marks.marks as f64,
            );
        }
        Ok(())
    }

    async fn used_memory(&mut self) -> anyhow::Result<u64> {
        let info: String =
            redis::cmd("INFO").arg("memory").query_async(&mut self.admin).await.context("INFO memory")?;
        info_field(&info, "used_memory")
            .and_then(|value| value.parse().ok())
            .context("no used_memory in INFO memory")
    }

    /// Redis's own CPU time so far, user plus system (`INFO cpu`), in µs; from `/proc` when
    /// INFO fails.
    async fn redis_cpu_us(&mut self) -> Option<f64> {
        let info: redis::RedisResult<String> =
            redis::cmd("INFO").arg("cpu").query_async(&mut self.admin).await;
        let from_info = info.ok().and_then(|info| {
            let sys: f64 = info_field(&info, "used_cpu_sys")?.parse().ok()?;
            let user: f64 = info_field(&info, "used_cpu_user")?.parse().ok()?;
            Some((sys + user) * 1e6)
        });
        from_info.or_else(|| {
            let ticks = procfs::cpu_ticks(self.redis.pid()).ok()?;
            Some(ticks as f64 * 1e6 / self.ticks_per_second as f64)
        })
    }

    async fn measure(&mut self, worker: Worker, scenario: &Scenario, reps: usize) -> Row {
        let mut row = scenario.row(worker);
        let mut env = scenario.env.clone();
        if let Some(config) = scenario.config {
            let path = self.options.out_dir.join("logs").join(format!("{}.toml", scenario.log_name(worker)));
            let written = std::fs::create_dir_all(self.options.out_dir.join("logs"))
                .and_then(|()| std::fs::write(&path, config));
            if let Err(err) = written {
                row.error = Some(format!("cannot write {}: {err}", path.display()));
                return row;
            }
            env.push(("TOOLHOST_CONFIG".to_owned(), path.display().to_string()));
        }
        let launch = self.launch(worker, &scenario.serve_args, &env, scenario.log_name(worker));
        let mut running = match self.start(&launch).await {
            Ok(running) => running,
            Err(err) => {
                row.error = Some(format!("failed to start: {err:#}"));
                return row;
            }
        };
        // Give the process a moment to finish whatever it does right after registering.
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(memory) = procfs::memory(running.pid()) {
            row.rss_idle_kib = Some(memory.rss_kib);
            row.anon_idle_kib = Some(memory.anon_kib);
            row.pss_idle_kib = memory.pss_kib;
        }
        let url = self.redis.url();
        let warmup = scenario.load(self.options, true);
        match load::run(&url, &warmup).await {
            Ok(res) if res.n_answered() > 0 => {}
            Ok(res) => {
                row.n_timeouts = res.n_timeouts + res.n_send_errors;
                row.error = Some(format!(
                    "no answer during warm-up: {}; log tail: {}",
                    res.first_error.unwrap_or_default(),
                    running.log_tail()
                ));
                running.stop().await;
                return row;
            }
            Err(err) => {
                row.error = Some(format!("warm-up failed: {err:#}"));
                running.stop().await;
                return row;
            }
        }
        let n_reps = reps;
        let mut reps = Vec::new();
        for _ in 0..n_reps {
            match self.rep(&url, running.pid(), scenario).await {
                Ok(rep) => reps.push(rep),
                Err(err) => {
                    row.error = Some(format!("repetition failed: {err:#}"));
                    break;
                }
            }
            if !running.is_alive() {
                row.error = Some(format!("the target died; log tail: {}", running.log_tail()));
                break;
            }
        }
        running.stop().await;
        reps.sort_by(|a, b| a.load.rps().total_cmp(&b.load.rps()));
        let Some(rep) = reps.get(reps.len() / 2) else { return row };
        let histogram = &rep.load.histogram;
        row.rps = rep.load.rps();
        row.p50_us = histogram.value_at_quantile(0.5);
        row.p90_us = histogram.value_at_quantile(0.9);
        row.p99_us = histogram.value_at_quantile(0.99);
        row.max_us = histogram.max();
        row.cpu_us_per_request = rep.cpu_us_per_request;
        row.redis_cpu_us_per_request = rep.redis_cpu_us_per_request;
        row.harness_cpu_us_per_request = rep.harness_cpu_us_per_request;
        row.rss_peak_kib = rep.rss_peak_kib;
        row.redis_commands = rep.redis_commands.clone();
        row.n_answered = rep.load.n_answered();
        row.n_failed = rep.load.n_failed;
        row.n_timeouts = rep.load.n_timeouts + rep.load.n_send_errors;
        if row.error.is_none() {
            row.error = rep.load.first_error.clone();
        }
        row
    }

    async fn rep(&mut self, url: &str, pid: u32, scenario: &Scenario) -> anyhow::Result<Rep> {
        // The independent generator trims nothing: its streams keep the warm-up's entries and
        // grow by every request.
        if scenario.generator == Generator::Harness {
            self.trim_streams().await?;
        }
        let spec = scenario.load(self.options, false);
        // Command statistics count from here; a failure only leaves the row without them.
        let reset: redis::RedisResult<()> =
            redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut self.admin).await;
        let target_before = procfs::cpu_ticks(pid).ok();
        let redis_before = self.redis_cpu_us().await;
        let harness_before = procfs::cpu_ticks(std::process::id()).ok();
        let sampler = RssSampler::start(pid, Duration::from_millis(100));
        let load = load::run(url, &spec).await?;
        let samples = sampler.finish().await;
        let target_after = procfs::cpu_ticks(pid).ok();
        let redis_after = self.redis_cpu_us().await;
        let harness_after = procfs::cpu_ticks(std::process::id()).ok();
        let n_answered = load.n_answered();
        let commandstats: redis::RedisResult<String> =
            redis::cmd("INFO").arg("commandstats").query_async(&mut self.admin).await;
        let redis_commands = match (reset, commandstats) {
            (Ok(()), Ok(info)) => command_costs(&info, n_answered),
            _ => Vec::new(),
        };
        Ok(Rep {
            redis_commands,
            cpu_us_per_request: self.cpu_per_request(target_before, target_after, n_answered),
            redis_cpu_us_per_request: us_per_request(redis_before, redis_after, n_answered),
            harness_cpu_us_per_request: self.cpu_per_request(harness_before, harness_after, n_answered),
            rss_peak_kib: samples.iter().map(|&(_, kib)| kib).max(),
            load,
        })
    }

    async fn soak(&mut self, worker: Worker, n_requests: u64) -> Soak {
        let mut soak = Soak {
            target: worker.name().to_owned(),
            requests: n_requests,
            n_answered: 0,
            n_timeouts: 0,
            rps: 0.0,
            rss_first_kib: 0,
            rss_last_kib: 0,
            rss_max_kib: 0,
            rss_samples: Vec::new(),
            error: None,
        };
        let launch = self.launch(worker, &[], &[], format!("{}-soak.log", worker.name()));
        let running = match self.start(&launch).await {
            Ok(running) => running,
            Err(err) => {
                soak.error = Some(format!("failed to start: {err:#}"));
                return soak;
            }
        };
        let spec = LoadSpec {
            generator: Generator::Harness,
            in_flight: 64,
            kind: RequestKind::echo(DEFAULT_PAYLOAD),
            duration: Duration::from_secs(7 * 24 * 3600),
            max_requests: Some(n_requests),
        };
        let sampler = RssSampler::start(running.pid(), Duration::from_secs(1));
        let res = load::run(&self.redis.url(), &spec).await;
        let samples = sampler.finish().await;
        running.stop().await;
        match res {
            Ok(load) => {
                soak.n_answered = load.n_answered();
                soak.n_timeouts = load.n_timeouts + load.n_send_errors;
                soak.rps = load.rps();
                soak.error = load.first_error;
            }
            Err(err) => soak.error = Some(format!("{err:#}")),
        }
        soak.rss_first_kib = samples.first().map_or(0, |&(_, kib)| kib);
        soak.rss_last_kib = samples.last().map_or(0, |&(_, kib)| kib);
        soak.rss_max_kib = samples.iter().map(|&(_, kib)| kib).max().unwrap_or(0);
        soak.rss_samples = samples.iter().map(|&(at, kib)| (at.as_secs_f64(), kib)).collect();
        soak
    }

    fn launch(&self, worker: Worker, args: &[String], env: &[(String, String)], log_name: String) -> Launch {
        let program = match worker {
            Worker::Reference | Worker::Floor => &self.options.refworker_bin,
            Worker::Toolhost => &self.options.toolhost_bin,
            Worker::Baseline => self.options.baseline_bin.as_ref().unwrap_or(&self.options.toolhost_bin),
        };
        let log_path = self.options.out_dir.join("logs").join(log_name);
        Launch::new(worker, program, &self.redis.url(), args, env, log_path)
    }

    /// Flushes Redis and starts the target, so it begins from an empty database.
    async fn start(&mut self, launch: &Launch) -> anyhow::Result<target::Running> {
        let () = redis::cmd("FLUSHALL").query_async(&mut self.admin).await.context("FLUSHALL")?;
        target::start(launch, &mut self.admin).await
    }

    /// Empties both streams between repetitions; the consumer group stays.
    async fn trim_streams(&mut self) -> anyhow::Result<()> {
        let mut pipeline = redis::pipe();
        for stream in [REQUESTS_STREAM, RESULTS_STREAM] {
            pipeline.cmd("XTRIM").arg(stream).arg("MAXLEN").arg(0).ignore();
        }
        pipeline.exec_async(&mut self.admin).await.context("trimming streams")?;
        Ok(())
    }

    fn cpu_per_request(&self, before: Option<u64>, after: Option<u64>, n_requests: u64) -> Option<f64> {
        let ticks = after?.checked_sub(before?)?;
        if n_requests == 0 {
            return None;
        }
        Some(ticks as f64 * 1e6 / self.ticks_per_second as f64 / n_requests as f64)
    }
}

/// µs per request between two CPU readings in µs.
fn us_per_request(before: Option<f64>, after: Option<f64>, n_requests: u64) -> Option<f64> {
    let spent = after? - before?;
    (n_requests > 0 && spent >= 0.0).then(|| spent / n_requests as f64)
}

/// Calls and time per request of every command in an `INFO commandstats` reply
/// (`cmdstat_xadd:calls=3,usec=12,...`), most time first; the admin connection's `INFO` and
/// `CONFIG` left out.
fn command_costs(info: &str, n_requests: u64) -> Vec<CommandCost> {
    if n_requests == 0 {
        return Vec::new();
    }
    let per_request = |value: &str| value.parse::<f64>().ok().map(|value| value / n_requests as f64);
    let mut costs: Vec<CommandCost> = info
        .lines()
        .filter_map(|line| {
            let (command, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field =
                |name: &str| fields.split(',').find_map(|field| field.strip_prefix(name)?.strip_prefix('='));
            Some(CommandCost {
                command: command.to_owned(),
                calls_per_request: per_request(field("calls")?)?,
                us_per_request: per_request(field("usec")?)?,
            })
        })
        .filter(|cost| !matches!(cost.command.as_str(), "info" | "config|resetstat" | "config"))
        .collect();
    costs.sort_by(|a, b| b.us_per_request.total_cmp(&a.us_per_request));
    costs
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

/// One row from the interleaved runs of a target: the median of every measured figure
/// (the maximum of the maxima and peaks), counts summed, the first error kept.
fn median_row(rows: Vec<Row>) -> Option<Row> {
    let measured: Vec<&Row> = rows.iter().filter(|row| row.n_answered > 0).collect();
    let first = rows.first()?;
    let mut res = Row {
        runs_rps: measured.iter().map(|row| row.rps).collect(),
        runs_cpu_us: measured.iter().filter_map(|row| row.cpu_us_per_request).collect(),
        runs_redis_cpu_us: measured.iter().filter_map(|row| row.redis_cpu_us_per_request).collect(),
        runs_generator_cpu_us: measured.iter().filter_map(|row| row.harness_cpu_us_per_request).collect(),
        ..first.clone()
    };
    let median_of = |pick: &dyn Fn(&Row) -> Option<f64>| -> Option<f64> {
        median(&measured.iter().filter_map(|row| pick(row)).collect::<Vec<f64>>())
    };
    res.rps = median_of(&|row| Some(row.rps)).unwrap_or(0.0);
    res.redis_commands = measured
        .iter()
        .find(|row| row.rps == res.rps)
        .map(|row| row.redis_commands.clone())
        .unwrap_or_default();
    res.p50_us = median_of(&|row| Some(row.p50_us as f64)).unwrap_or(0.0) as u64;
    res.p90_us = median_of(&|row| Some(row.p90_us as f64)).unwrap_or(0.0) as u64;
    res.p99_us = median_of(&|row| Some(row.p99_us as f64)).unwrap_or(0.0) as u64;
    res.max_us = measured.iter().map(|row| row.max_us).max().unwrap_or(0);
    res.cpu_us_per_request = median_of(&|row| row.cpu_us_per_request);
    res.redis_cpu_us_per_request = median_of(&|row| row.redis_cpu_us_per_request);
    res.harness_cpu_us_per_request = median_of(&|row| row.harness_cpu_us_per_request);
    res.rss_idle_kib = median_of(&|row| row.rss_idle_kib.map(|kib| kib as f64)).map(|kib| kib as u64);
    res.anon_idle_kib = median_of(&|row| row.anon_idle_kib.map(|kib| kib as f64)).map(|kib| kib as u64);
    res.pss_idle_kib = median_of(&|row| row.pss_idle_kib.map(|kib| kib as f64)).map(|kib| kib as u64);
    res.rss_peak_kib = measured.iter().filter_map(|row| row.rss_peak_kib).max();
    res.n_answered = rows.iter().map(|row| row.n_answered).sum();
    res.n_failed = rows.iter().map(|row| row.n_failed).sum();
    res.n_timeouts = rows.iter().map(|row| row.n_timeouts).sum();
    res.error = rows.iter().find_map(|row| row.error.clone());
    Some(res)
}

/// The median of `values` (the upper of the two middle ones for an even count); `None` when empty.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use super::*;

    #[test]
    fn command_costs_are_per_request_and_most_time_first() {
        let info = "# Commandstats\r\ncmdstat_xadd:calls=200,usec=400,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_evalsha:calls=10,usec=1000,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_info:calls=1,usec=50,usec_per_call=50.00\r\n";
        let costs = command_costs(info, 100);
        assert_eq!(
            costs,
            vec![
                CommandCost { command: "evalsha".to_owned(), calls_per_request: 0.1, us_per_request: 10.0 },
                CommandCost { command: "xadd".to_owned(), calls_per_request: 2.0, us_per_request: 4.0 },
            ]
        );
        assert!(command_costs(info, 0).is_empty());
    }

    #[test]
    fn toolhost_has_every_extra_row_and_the_reference_only_echo() {
        for worker in [Worker::Reference, Worker::Floor] {
            let reference = scenarios(worker, None);
            assert!(reference.iter().all(|scenario| scenario.name == "echo"));
            assert_eq!(reference.len(), 6);
        }
        assert_eq!(scenarios(Worker::Baseline, None).len(), scenarios(Worker::Toolhost, None).len());
        let toolhost = scenarios(Worker::Toolhost, None);
        let names: Vec<&str> = toolhost.iter().map(|scenario| scenario.name.as_str()).collect();
        for name in ["terminal_run", "tools.discover", "schema, 20 fields", "echo, 1000 synthetic tools"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }

    #[test]
    fn in_flight_picks_the_echo_rows() {
        let picked = scenarios(Worker::Toolhost, Some(&[1, 64]));
        let in_flight: Vec<usize> = picked.iter().map(|scenario| scenario.in_flight).collect();
        assert_eq!(in_flight, [1, 64]);
        assert!(picked.iter().all(|scenario| scenario.kind.payload_bytes() == DEFAULT_PAYLOAD));
    }

    #[test]
    fn interleaved_runs_report_medians() {
        let run = |rps: f64, p99_us: u64, cpu: f64, error: Option<&str>| Row {
            target: "floor".to_owned(),
            rps,
            p99_us,
            max_us: p99_us * 2,
            cpu_us_per_request: Some(cpu),
            n_answered: 100,
            n_timeouts: u64::from(error.is_some()),
            error: error.map(str::to_owned),
            ..Row::default()
        };
        let row = median_row(vec![
            run(300.0, 9, 3.0, None),
            run(100.0, 7, 1.0, Some("no answer")),
            run(200.0, 8, 5.0, None),
        ])
        .unwrap();
        assert_eq!(row.rps, 200.0);
        assert_eq!(row.p99_us, 8);
        assert_eq!(row.max_us, 18);
        assert_eq!(row.cpu_us_per_request, Some(3.0));
        assert_eq!(row.runs_rps, [300.0, 100.0, 200.0]);
        assert_eq!(row.runs_cpu_us, [3.0, 1.0, 5.0], "the spread of the CPU medians");
        assert_eq!(row.n_answered, 300);
        assert_eq!(row.n_timeouts, 1);
        assert_eq!(row.error.as_deref(), Some("no answer"), "a failed run shows");
    }

    #[test]
    fn info_fields_are_found_by_name() {
        let info = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.25\r\nused_cpu_sys_children:9\r\n";
        assert_eq!(info_field(info, "used_cpu_sys"), Some("1.500000"));
        assert_eq!(info_field(info, "used_cpu_user"), Some("2.25"));
        assert_eq!(info_field(info, "used_cpu"), None);
        assert_eq!(us_per_request(Some(1.0), Some(11.0), 5), Some(2.0));
        assert_eq!(us_per_request(Some(1.0), Some(11.0), 0), None);
    }

    #[test]
    fn median_takes_the_middle() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }
}
