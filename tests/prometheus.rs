//! A real Prometheus server, with the shipped alert rules loaded, scrapes a
//! process (this test) that holds leases on a real `redis-server` and
//! exports its metrics with `metrics-exporter-prometheus`.
//!
//! The scenario, in order: a baseline of a few leases (an election's leader,
//! per-item `jobs` leases, one released, one dropped, one refused as Busy);
//! a side connection overwrites the leader's lease and a `jobs` lease, so
//! both holders learn that they lost them; a `jobs` lease bound to
//! progress gets none and stalls; a burst of 150 `burst` leases;
//! and a delay on the link to Redis that slows renewals past half the
//! safety margin. Then, through Prometheus's HTTP API:
//!
//! - the loss fires `LeaseholdLeaseLost` for exactly the two lost leases
//!   (`name`, `reason="lost"`), and, once the election has been without a
//!   leader for its ttl plus the rule's `for`, `LeaseholdElectionLeaderless`
//!   for it; the stall fires `LeaseholdJobStalled` for `jobs` alone; the
//!   Busy refusal fires `LeaseholdAcquireBusy` for `jobs` only;
//!   the burst and the delay make `LeaseholdLeasesHeldUnusual` and
//!   `LeaseholdRenewalLatencyNearSafetyMargin` pending (both have a `for` of
//!   5 minutes; promtool's tests check the firing);
//! - the age of what is held: the steady `jobs` lease's age, read from
//!   Prometheus while it is held, is its time since acquisition (within
//!   a scrape and a renew interval), and `LeaseholdLeaseHeldLong` fires
//!   for `jobs` alone: held over ten ttls and four times the name's usual
//!   (released) hold;
//! - every query of deploy/grafana/leasehold.json (Grafana's variables
//!   replaced by fixed values) and every alert expression of
//!   deploy/prometheus/leasehold-rules.yml, evaluated over the test's time
//!   range, returns series, each carrying the labels its legend or its
//!   alert's summary names; every dashboard variable has values.
//!
//! The exporter's buckets are leasehold's own, set in one call
//! (`leasehold::metrics::install_prometheus_buckets`): the shipped rules
//! and dashboard work with the defaults.
//!
//! Every wait has a timeout. It takes about a minute, most of it the
//! leaderless alert's ttl and `for`; the second (Valkey) pass of
//! scripts/test.sh skips it. Skipped, with a message, when the `prometheus`
//! binary is not on PATH outside CI: scripts/test.sh installs it.
//!
//! ```sh
//! cargo test --test prometheus -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::metrics::install_prometheus_buckets;
use leasehold::redis::RedisBackend;
use leasehold::{
    Election, Every, LeaseError, LeaseManager, LeaseOptions, LossReason, TickGrid, TickJob,
    TickOutcome, Ttl,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer, free_port};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Labels = BTreeMap<String, String>;

/// Values put in place of Grafana's own variables; the dashboard's own
/// variables get their `allValue`.
const GRAFANA_BUILTINS: [(&str, &str); 3] = [
    ("$__rate_interval", "1m"),
    ("$__interval", "1s"),
    ("$__range", "5m"),
];

/// The dashboard shows this; the rules need it: the scenario's leases.
const TTL: &str = "3s";

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

fn on_path(binary: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A `prometheus` server on a free loopback port, scraping one target every
/// second and evaluating the shipped rules every second; killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(binary: &Path, target: SocketAddr) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let rules = repo_file("deploy/prometheus/leasehold-rules.yml");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules:?}\n\
                 scrape_configs:\n  - job_name: leasehold\n    static_configs:\n      \
                 - targets: ['{target}']\n",
            ),
        )?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Self { child, addr, dir })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET `path` on the server: the status code and the body.
    async fn get(&self, path: String) -> Result<(u16, String), std::io::Error> {
        let addr = self.addr;
        tokio::task::spawn_blocking(move || http_get(addr, &path)).await?
    }

    /// The `data` of an API answer whose status is `success`.
    async fn api(&self, path: String) -> Value {
        let (code, body) = self
            .get(path.clone())
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.log()));
        let answer: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: {code}, not JSON ({e}): {body}"));
        assert_eq!(answer["status"], "success", "GET {path}: {code} {body}");
        answer["data"].clone()
    }

    async fn alerts(&self) -> Vec<Alert> {
        let data = self.api("/api/v1/alerts".to_owned()).await;
        data["alerts"]
            .as_array()
            .expect("an array of alerts")
            .iter()
            .map(|alert| Alert {
                labels: labels(&alert["labels"]),
                state: alert["state"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    }

    /// Polls the active alerts until `alertname` is active (pending, or
    /// firing when `firing`) with labels including `with`.
    async fn until_alert(&self, alertname: &str, with: &[(&str, &str)], firing: bool) {
        let what = format!("{alertname} {with:?} active (firing: {firing})");
        within(Duration::from_secs(90), &what, async {
            loop {
                let alerts = self.alerts().await;
                if alerts.iter().any(|alert| {
                    alert.labels["alertname"] == alertname
                        && (!firing || alert.state == "firing")
                        && with
                            .iter()
                            .all(|(k, v)| alert.labels.get(*k).map(String::as_str) == Some(v))
                }) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
    }

    /// Evaluates `query` every second from `from` to now: the series found.
    async fn query_range(&self, query: &str, from: SystemTime) -> Vec<Labels> {
        let secs = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_secs_f64()
        };
        let data = self
            .api(format!(
                "/api/v1/query_range?query={}&start={:.3}&end={:.3}&step=1",
                encode(query),
                secs(from),
                secs(SystemTime::now()),
            ))
            .await;
        data["result"]
            .as_array()
            .expect("a matrix")
            .iter()
            .map(|series| labels(&series["metric"]))
            .collect()
    }

    /// The value of a query that returns one number.
    async fn scalar(&self, query: &str) -> f64 {
        let data = self
            .api(format!("/api/v1/query?query={}", encode(query)))
            .await;
        data["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Alert {
    labels: Labels,
    state: String,
}

fn labels(object: &Value) -> Labels {
    object
        .as_object()
        .map(|map| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// A minimal HTTP/1.0 GET: the server closes the connection after the
/// body, so the body is whatever follows the headers.
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), std::io::Error> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let bad = || std::io::Error::other(format!("not an HTTP response: {response:?}"));
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(bad)?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    Ok((code, body.to_owned()))
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The labels a text template names: `{{name}}` in a legend,
/// `{{ $labels.name }}` in an alert's summary.
fn named_labels(template: &str) -> Vec<String> {
    template
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(inner, _)| inner.trim().trim_start_matches("$labels.").to_owned())
        .filter(|label| !label.is_empty() && !label.starts_with('$') && !label.contains(' '))
        .collect()
}

/// Every PromQL query of a Grafana dashboard, with the labels its legend
/// names.
fn dashboard_queries(node: &Value, out: &mut Vec<(String, Vec<String>)>) {
    match node {
        Value::Object(map) => {
            if let Some(expr) = map.get("expr").and_then(Value::as_str) {
                let legend = ["legendFormat", "titleFormat"]
                    .iter()
                    .find_map(|k| map.get(*k).and_then(Value::as_str))
                    .unwrap_or_default();
                out.push((expr.to_owned(), named_labels(legend)));
            }
            map.values().for_each(|v| dashboard_queries(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

/// Replaces the dashboard's variables (`$job`, `${job}`) with their
/// `allValue`, and Grafana's own with [`GRAFANA_BUILTINS`].
fn substitute(query: &str, dashboard: &Value) -> String {
    let mut query = query.to_owned();
    for (name, value) in GRAFANA_BUILTINS {
        query = query.replace(name, value);
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let (Some(name), Some(all)) = (variable["name"].as_str(), variable["allValue"].as_str())
        else {
            continue;
        };
        query = query
            .replace(&format!("${{{name}}}"), all)
            .replace(&format!("${name}"), all);
    }
    assert!(!query.contains('$'), "a variable left in {query}");
    query
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_evaluates_the_dashboard_and_fires_the_alerts() -> TestResult {
    // The metrics, the rules and the dashboard are the subject, not the
    // server family: the Valkey pass need not wait out the alerts again.
    if leasehold_testkit::skip_on_second_pass("prometheus_evaluates_the_dashboard") {
        return Ok(());
    }
    let Some(binary) = on_path("prometheus") else {
        // In CI a missing server is a broken setup, not a reason to pass.
        assert!(
            std::env::var_os("CI").is_none(),
            "no `prometheus` binary on PATH in CI: scripts/test.sh installs Debian's `prometheus` package"
        );
        eprintln!(
            "SKIPPED: no `prometheus` binary on PATH (scripts/test.sh installs Debian's \
             `prometheus` package, which has it)"
        );
        return Ok(());
    };
    let started = Instant::now();
    let from = SystemTime::now();
    let server = RedisServer::start()?;
    let link = Proxy::start(server.addr()).await?;
    let exporter = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    // The shipped defaults: leasehold's buckets, nothing else.
    install_prometheus_buckets(PrometheusBuilder::new().with_http_listener(exporter))?.install()?;
    let prometheus = Prometheus::start(&binary, exporter)?;
    within(Duration::from_secs(30), "Prometheus ready", async {
        while !matches!(prometheus.get("/-/ready".to_owned()).await, Ok((200, _))) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    // The baseline: an election's leader and a few `jobs` leases, all
    // through the link that is slowed below.
    let ttl = Ttl::parse(TTL)?;
    let backend = RedisBackend::connect(link.url().as_str()).await?;
    let manager = LeaseManager::new(backend.clone())?;
    let jobs = LeaseOptions::builder().ttl(ttl).name("jobs").build()?;
    let scheduler = LeaseOptions::builder()
        .ttl(ttl)
        .name("scheduler")
        .label("test-0")
        .build()?;
    let election = Election::new(manager.clone(), "scheduler", scheduler)?;
    let leader = within(Duration::from_secs(10), "the campaign", election.campaign()).await?;
    let victim = manager.acquire("jobs:victim", &jobs).await?;
    let steady = manager.acquire("jobs:steady", &jobs).await?;
    // The oldest `jobs` lease held from the loss of `victim` on.
    let steady_since = Instant::now();
    drop(manager.acquire("jobs:dropped", &jobs).await?);
    manager.acquire("jobs:done", &jobs).await?.release().await?;

    // A manager that lets one task wait per key: a second is refused as
    // Busy while the first waits for a key the first manager holds.
    let blocker = manager.acquire("jobs:queue", &jobs).await?;
    let queued = LeaseManager::builder(backend.clone())
        .max_waiters(1)
        .start()?;
    let patient = LeaseOptions::builder()
        .ttl(ttl)
        .name("jobs")
        .wait(Duration::from_secs(30))
        .build()?;
    let mut waiter = Box::pin(queued.acquire("jobs:queue", &patient));
    // The waiter's first attempt, made before it queues, is refused; then
    // it takes the queue's only place and, at its head, subscribes to the
    // key's release notices: driven until the server counts it there.
    within(Duration::from_secs(10), "the waiter in the queue", async {
        loop {
            tokio::select! {
                biased;
                result = &mut waiter => panic!("the waiter did not wait: {:?}", result.map(|_| ())),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            let reply = server
                .cli(&["PUBSUB", "NUMSUB", "leasehold:{jobs:queue}:released"])
                .unwrap_or_default();
            if reply.lines().nth(1).is_some_and(|n| n.trim() != "0") {
                break;
            }
        }
    })
    .await;
    let refused = queued.acquire("jobs:queue", &patient).await;
    assert!(
        matches!(refused, Err(LeaseError::Busy { .. })),
        "{:?}",
        refused.map(|_| ())
    );
    blocker.release().await?;
    within(Duration::from_secs(10), "the waiter's turn", waiter)
        .await?
        .release()
        .await?;

    // A scheduled job's ticks, decided on the server's clock: an old tick
    // asked for late is missed, the current one runs here, and the same
    // tick asked for again is found decided.
    let hourly = Every::new(Duration::from_secs(3_600))?;
    let report = TickJob::builder("report", hourly)
        .start_deadline(Duration::from_secs(3_600))
        .lease(LeaseOptions::builder().ttl(Ttl::parse("10s")?))
        .build()?;
    let now = hourly.tick_at(SystemTime::now()).ok_or("no tick")?;
    let old = now - Duration::from_secs(2 * 3_600);
    let missed = manager.run_tick(&report, old, |_| async {}).await?;
    assert!(matches!(missed, TickOutcome::Missed { .. }), "{missed:?}");
    let ran = manager.run_tick(&report, now, |_| async {}).await?;
    assert!(ran.ran(), "{ran:?}");
    let decided = manager.run_tick(&report, now, |_| async {}).await?;
    assert!(
        matches!(decided, TickOutcome::Decided { .. }),
        "{decided:?}"
    );

    // Runs abandoned twice: a job every 2 s whose run's lease is deleted
    // under it on the server (an operator, a failover that lost it): the
    // run's token fires, its completion is refused, and the run counts as
    // abandoned. Twice within the hour fires LeaseholdTickAbandoned.
    let every_2s = Every::new(Duration::from_secs(2))?;
    let flaky = TickJob::builder("flaky", every_2s)
        .start_deadline(Duration::from_secs(2))
        .lease(LeaseOptions::builder().ttl(Ttl::parse("10s")?))
        .build()?;
    let operator = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let mut asked = None;
    for _ in 0..2 {
        // The next tick of the grid, when the clock reaches it.
        let now = SystemTime::now();
        let tick = every_2s.tick_at(now).ok_or("no tick")?;
        let tick = if asked == Some(tick) {
            let next = every_2s.next_after(tick).ok_or("no next tick")?;
            tokio::time::sleep(next.duration_since(now).unwrap_or_default()).await;
            next
        } else {
            tick
        };
        asked = Some(tick);
        let operator = operator.clone();
        let abandoned = within(
            Duration::from_secs(10),
            "the flaky run's end",
            manager.run_tick(&flaky, tick, |run| async move {
                let mut operator = operator;
                let _: Result<i64, _> = redis::cmd("DEL")
                    .arg("leasehold:job:{flaky}:run")
                    .query_async(&mut operator)
                    .await;
                run.cancelled().await;
            }),
        )
        .await;
        assert!(
            matches!(abandoned, Err(LeaseError::LeaseEnded { .. })),
            "{abandoned:?}"
        );
    }

    // A baseline of 15 evaluations before the burst, so that the burst is
    // far above the average.
    within(Duration::from_secs(60), "15 evaluations", async {
        while prometheus
            .scalar("count_over_time(leasehold:leases_held:sum[5m])")
            .await
            < 15.0
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;

    // The usual `jobs` lease, seen by Prometheus: short holds released
    // while it scrapes (a counter's first value is no increase), against
    // which the steady lease is held far longer than usual.
    for _ in 0..3 {
        manager.acquire("jobs:done", &jobs).await?.release().await?;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }

    // The scripted loss: the leader's and a worker's keys overwritten on a
    // side connection to the server itself.
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    for key in ["leasehold:{scheduler}", "leasehold:{jobs:victim}"] {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("intruder")
            .query_async(&mut side)
            .await?;
    }
    for lease in [&leader, &victim] {
        let reason = within(Duration::from_secs(10), "the loss", lease.lost()).await;
        assert_eq!(reason, LossReason::Lost);
    }

    // The scripted stall: a job bound to progress that never reports.
    let watched = LeaseOptions::builder()
        .ttl(ttl)
        .name("jobs")
        .progress_window(Duration::from_secs(1))
        .build()?;
    let stuck = manager.acquire("jobs:stuck", &watched).await?;
    let reason = within(Duration::from_secs(10), "the stall", stuck.lost()).await;
    assert_eq!(reason, LossReason::Stalled);
    drop(stuck);

    // The burst: far more leases than this process held so far.
    let burst = LeaseOptions::builder().ttl(ttl).name("burst").build()?;
    let mut burst_leases = Vec::new();
    for i in 0..150 {
        burst_leases.push(manager.acquire(format!("burst:{i}"), &burst).await?);
    }
    prometheus
        .until_alert("LeaseholdLeasesHeldUnusual", &[("job", "leasehold")], false)
        .await;
    for lease in burst_leases {
        lease.release().await?;
    }

    // Renewals slowed to 300 ms a round trip, over half the 300 ms margin.
    link.set_mode(ProxyMode::Delay(Duration::from_millis(150)));
    prometheus
        .until_alert("LeaseholdRenewalLatencyNearSafetyMargin", &[], false)
        .await;
    link.set_mode(ProxyMode::Pass);

    for (name, reason) in [("jobs", "lost"), ("scheduler", "lost")] {
        prometheus
            .until_alert(
                "LeaseholdLeaseLost",
                &[("name", name), ("reason", reason)],
                true,
            )
            .await;
    }
    prometheus
        .until_alert("LeaseholdAcquireBusy", &[("name", "jobs")], true)
        .await;
    prometheus
        .until_alert("LeaseholdJobStalled", &[("name", "jobs")], true)
        .await;
    prometheus
        .until_alert("LeaseholdTickMissed", &[("name", "report")], true)
        .await;
    prometheus
        .until_alert("LeaseholdTickAbandoned", &[("name", "flaky")], true)
        .await;
    prometheus
        .until_alert(
            "LeaseholdElectionLeaderless",
            &[("name", "scheduler")],
            true,
        )
        .await;
    prometheus
        .until_alert(
            "LeaseholdLeaseHeldLong",
            &[("name", "jobs"), ("kind", "exclusive")],
            true,
        )
        .await;

    // The age of what is held, while it is held: the steady lease's,
    // as of its last renewal (every second) and the last scrape (every
    // second), so at most about 2 s behind its true age.
    let age = prometheus
        .scalar(r#"leasehold_lease_oldest_age_seconds{name="jobs", kind="exclusive"}"#)
        .await;
    let held_for = steady_since.elapsed().as_secs_f64();
    println!("the steady lease: {age:.2} s old in Prometheus, {held_for:.2} s held");
    assert!(held_for > 30.0, "held only {held_for:.1} s");
    assert!(
        age > held_for - 3.0 && age < held_for + 0.5,
        "age {age:.2} s in Prometheus, held for {held_for:.2} s"
    );
    println!("alerts active after {:.1?}", started.elapsed());

    // Only the scripted faults: no other lease lost, nothing else busy.
    let alerts = prometheus.alerts().await;
    let of = |alertname: &str, label: &str| {
        let mut found: Vec<String> = alerts
            .iter()
            .filter(|a| a.labels["alertname"] == alertname)
            .map(|a| format!("{}/{}", a.labels["name"], a.labels[label]))
            .collect();
        found.sort();
        found
    };
    assert_eq!(
        of("LeaseholdLeaseLost", "reason"),
        ["flaky/lost", "jobs/lost", "scheduler/lost"]
    );
    assert_eq!(of("LeaseholdTickAbandoned", "name"), ["flaky/flaky"]);
    assert_eq!(of("LeaseholdAcquireBusy", "outcome"), ["jobs/busy"]);
    assert_eq!(of("LeaseholdLeaseHeldLong", "kind"), ["jobs/exclusive"]);
    assert_eq!(of("LeaseholdJobStalled", "reason"), ["jobs/stalled"]);
    assert_eq!(of("LeaseholdTickMissed", "reason"), ["report/missed"]);
    assert_eq!(
        of("LeaseholdElectionLeaderless", "name"),
        ["scheduler/scheduler"]
    );
    assert!(steady.loss_reason().is_none(), "the steady lease was lost");

    // Every alert expression returns series with the labels its summary
    // names.
    let rules = prometheus.api("/api/v1/rules".to_owned()).await;
    let mut alerting = 0;
    for rule in rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().into_iter().flatten())
        .filter(|rule| rule["type"] == "alerting")
    {
        alerting += 1;
        let query = rule["query"].as_str().expect("a query");
        let promised = named_labels(rule["annotations"]["summary"].as_str().unwrap_or_default());
        let series = prometheus.query_range(query, from).await;
        assert!(!series.is_empty(), "{}: no series\n{query}", rule["name"]);
        for labels in &series {
            for label in &promised {
                assert!(
                    labels.contains_key(label),
                    "{}: no {label} in {labels:?}",
                    rule["name"]
                );
            }
        }
    }
    // Every alert of the shipped rules was evaluated.
    let shipped = std::fs::read_to_string(repo_file("deploy/prometheus/leasehold-rules.yml"))?
        .lines()
        .filter(|line| line.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(alerting, shipped, "{rules}");

    // Every dashboard query returns series with the labels its legend
    // names, and every variable has values.
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(repo_file(
        "deploy/grafana/leasehold.json",
    ))?)?;
    let mut queries = Vec::new();
    dashboard_queries(&dashboard["panels"], &mut queries);
    dashboard_queries(&dashboard["annotations"], &mut queries);
    assert!(queries.len() >= 15, "{} queries", queries.len());
    for (query, promised) in &queries {
        let query = substitute(query, &dashboard);
        let series = prometheus.query_range(&query, from).await;
        assert!(!series.is_empty(), "no series for {query}");
        for labels in &series {
            for label in promised {
                assert!(
                    labels.contains_key(label),
                    "no {label} in {labels:?} for {query}"
                );
            }
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        // label_values(SELECTOR, LABEL)
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("not label_values: {definition}"));
        let (selector, label) = inner.rsplit_once(',').expect("a selector and a label");
        let selector = substitute(selector.trim(), &dashboard);
        let values = prometheus
            .api(format!(
                "/api/v1/label/{}/values?match[]={}",
                label.trim(),
                encode(&selector)
            ))
            .await;
        assert!(
            values.as_array().is_some_and(|v| !v.is_empty()),
            "no values for {definition}"
        );
    }
    println!(
        "{} dashboard queries and {alerting} alert expressions checked after {:.1?}",
        queries.len(),
        started.elapsed()
    );

    drop(election);
    steady.release().await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    tokio::time::timeout(std::time::Duration::from_secs(10), queued.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}
