//! Fenced writes against a real PostgreSQL, with leases and fencing tokens
//! from a real redis-server.
//!
//! One PostgreSQL server for this binary (`PostgresServer::shared`), a
//! database per test, a redis-server per test. The verdicts are the
//! database's own rows and fence, read by `psql` on a connection of its
//! own, and for the paused holder the lease's value in Redis.

use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, ReleaseOutcome, Ttl,
};
use leasehold_postgres::tokio_postgres::{self, Client, NoTls};
use leasehold_postgres::{Fence, FenceState, FencingToken, PgFenceError};
use leasehold_redis::{KeyLayout, RedisBackend};
use leasehold_testkit::{PostgresServer, RedisServer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The resource every test writes: one row of `reports`.
const RESOURCE: &str = "reports:2024-06-01";
const DAY: &str = "2024-06-01";

/// A database of its own with the fence installed and a `reports` table,
/// and a redis-server that hands out the leases.
struct World {
    pg: &'static PostgresServer,
    url: String,
    redis: RedisServer,
    backend: RedisBackend,
    key: LeaseKey,
}

impl World {
    async fn new() -> Result<World, Box<dyn std::error::Error>> {
        let pg = PostgresServer::shared()?;
        let url = pg.create_database()?;
        let admin = connect(&url).await?;
        leasehold_postgres::install(&admin).await?;
        admin
            .batch_execute(
                "CREATE TABLE reports (day text PRIMARY KEY, body text NOT NULL);
                 CREATE TABLE chunks (day text, n int, body text NOT NULL, PRIMARY KEY (day, n));",
            )
            .await?;
        let redis = RedisServer::start()?;
        let backend = RedisBackend::connect(redis.url()).await?;
        Ok(World {
            pg,
            url,
            redis,
            backend,
            key: LeaseKey::new("reports:nightly")?,
        })
    }

    /// Acquires the lease, which must be free, for a new holder.
    async fn acquire(&self, ttl: &str) -> Result<(HolderId, Grant), Box<dyn std::error::Error>> {
        let holder = HolderId::generate()?;
        let request = AcquireRequest::new(self.key.clone(), holder, Ttl::parse(ttl)?);
        match self.backend.try_acquire(&request).await? {
            AcquireOutcome::Acquired(grant) => Ok((holder, grant)),
            AcquireOutcome::Held(info) => Err(format!("the lease is held: {info:?}").into()),
        }
    }

    /// Hands the lease from `holder` to a new one, whose token is higher.
    async fn hand_over(
        &self,
        holder: HolderId,
        before: &Grant,
    ) -> Result<(HolderId, Grant), Box<dyn std::error::Error>> {
        let released = self.backend.release(&self.key, &holder).await?;
        assert_eq!(released.outcome(), ReleaseOutcome::Released);
        let next = self.acquire("30s").await?;
        assert!(next.1.fencing_token > before.fencing_token);
        Ok(next)
    }

    fn fence(&self, grant: &Grant) -> Fence {
        Fence::new(RESOURCE, &self.key, grant.fencing_token)
    }

    /// What the database holds, read by psql.
    fn witness(&self, sql: &str) -> Result<String, Box<dyn std::error::Error>> {
        Ok(self.pg.psql(&self.url, sql)?)
    }

    /// The report's body as committed.
    fn body(&self) -> Result<String, Box<dyn std::error::Error>> {
        self.witness(&format!("SELECT body FROM reports WHERE day = '{DAY}'"))
    }

    /// The resource's fence as committed: `lease_key|token`.
    fn fence_row(&self) -> Result<String, Box<dyn std::error::Error>> {
        self.witness(&format!(
            "SELECT lease_key || '|' || token FROM leasehold_fence WHERE resource = '{RESOURCE}'"
        ))
    }

    fn fenced_at(&self, grant: &Grant) -> String {
        format!("{}|{}", self.key, grant.fencing_token)
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        // The connection ends with its client; an error shows in the client's calls.
        let _ = connection.await;
    });
    Ok(client)
}

const UPSERT: &str = "INSERT INTO reports (day, body) VALUES ($1, $2) \
                      ON CONFLICT (day) DO UPDATE SET body = excluded.body";

/// Writes the report in a transaction fenced by `check`, and commits.
async fn write_checked(client: &mut Client, fence: &Fence, body: &str) -> Result<(), PgFenceError> {
    let tx = client.transaction().await?;
    fence.check(&tx).await?;
    tx.execute(UPSERT, &[&DAY, &body]).await?;
    Ok(tx.commit().await?)
}

fn assert_stale(
    result: Result<impl std::fmt::Debug, PgFenceError>,
    token: FencingToken,
    newer: FencingToken,
) {
    match result {
        Err(PgFenceError::Stale {
            resource,
            token: t,
            newer: n,
            ..
        }) => {
            assert_eq!((resource.as_str(), t, n), (RESOURCE, token, newer));
        }
        other => panic!("expected a stale token refused (newer {newer}), got {other:?}"),
    }
}

#[tokio::test]
async fn a_stale_writer_is_refused_by_the_database() -> TestResult {
    let world = World::new().await?;
    let (mut a, mut b) = (connect(&world.url).await?, connect(&world.url).await?);

    let (holder_a, grant_a) = world.acquire("30s").await?;
    let fence_a = world.fence(&grant_a);
    write_checked(&mut a, &fence_a, "from A").await?;
    assert_eq!(world.body()?, "from A");

    let (_, grant_b) = world.hand_over(holder_a, &grant_a).await?;
    write_checked(&mut b, &world.fence(&grant_b), "from B").await?;

    // A comes back: its write goes in first, then the fence refuses.
    let tx = a.transaction().await?;
    tx.execute(UPSERT, &[&DAY, &"late A"]).await?;
    let refused = fence_a.check(&tx).await;
    assert_stale(refused, grant_a.fencing_token, grant_b.fencing_token);
    // The database aborted the transaction: nothing more runs in it, and
    // COMMIT rolls it back (PostgreSQL answers ROLLBACK, not an error).
    let next = tx.execute("SELECT 1", &[]).await;
    assert_eq!(
        next.err().and_then(|e| e.code().cloned()),
        Some(tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION)
    );
    tx.commit().await?;

    assert_eq!(world.body()?, "from B");
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    let state: FenceState = leasehold_postgres::inspect(&a, RESOURCE)
        .await?
        .ok_or("no fence")?;
    assert_eq!(
        (state.lease_key.as_str(), state.token),
        (world.key.as_str(), grant_b.fencing_token)
    );
    Ok(())
}

#[tokio::test]
async fn a_seal_refuses_the_previous_holders_late_write() -> TestResult {
    let world = World::new().await?;
    let (a, b) = (connect(&world.url).await?, connect(&world.url).await?);

    let (holder_a, grant_a) = world.acquire("30s").await?;
    let fence_a = world.fence(&grant_a);
    // One statement, no transaction: the fence and the write together.
    assert_eq!(fence_a.execute(&a, UPSERT, &[&DAY, &"from A"]).await?, 1);

    let (_, grant_b) = world.hand_over(holder_a, &grant_a).await?;
    // B raises the fence before any work; it writes nothing.
    world.fence(&grant_b).seal(&b).await?;
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));

    let late = fence_a.execute(&a, UPSERT, &[&DAY, &"late A"]).await;
    assert_stale(late, grant_a.fencing_token, grant_b.fencing_token);
    let late = fence_a
        .query(&a, &format!("{UPSERT} RETURNING body"), &[&DAY, &"late A"])
        .await;
    assert_stale(late, grant_a.fencing_token, grant_b.fencing_token);

    assert_eq!(world.body()?, "from A");
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    // A seal with an old token is refused too, and changes nothing.
    assert_stale(
        fence_a.seal(&a).await,
        grant_a.fencing_token,
        grant_b.fencing_token,
    );
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    Ok(())
}

#[tokio::test]
async fn the_writes_of_one_transaction_are_fenced_together() -> TestResult {
    let world = World::new().await?;
    let (mut a, mut b) = (connect(&world.url).await?, connect(&world.url).await?);
    let insert = "INSERT INTO chunks (day, n, body) VALUES ($1, $2, $3)";

    let (holder_a, grant_a) = world.acquire("30s").await?;
    let (holder_b, grant_b) = world.hand_over(holder_a, &grant_a).await?;
    world.fence(&grant_b).seal(&b).await?;

    // A's two chunks, then its check: refused, and neither chunk stays.
    let tx = a.transaction().await?;
    for n in 1..=2_i32 {
        tx.execute(insert, &[&DAY, &n, &"A"]).await?;
    }
    assert_stale(
        world.fence(&grant_a).check(&tx).await,
        grant_a.fencing_token,
        grant_b.fencing_token,
    );
    assert!(tx.execute(insert, &[&DAY, &3_i32, &"A"]).await.is_err());
    tx.commit().await?;
    assert_eq!(world.witness("SELECT count(*) FROM chunks")?, "0");

    // B's check, then three chunks: all committed.
    let tx = b.transaction().await?;
    world.fence(&grant_b).check(&tx).await?;
    for n in 1..=3_i32 {
        tx.execute(insert, &[&DAY, &n, &"B"]).await?;
    }
    tx.commit().await?;
    assert_eq!(
        world.witness("SELECT string_agg(n || body, ',' ORDER BY n) FROM chunks")?,
        "1B,2B,3B"
    );

    // A newer holder whose transaction fails after its check: the fence
    // rolls back with the writes, and stays at B's token.
    let (_, grant_c) = world.hand_over(holder_b, &grant_b).await?;
    let tx = b.transaction().await?;
    world.fence(&grant_c).check(&tx).await?;
    tx.execute(insert, &[&DAY, &4_i32, &"C"]).await?;
    let duplicate = tx.execute(insert, &[&DAY, &1_i32, &"C"]).await;
    assert!(duplicate.is_err(), "chunk 1 exists");
    drop(tx);
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    assert_eq!(world.witness("SELECT count(*) FROM chunks")?, "3");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lower_of_two_racing_tokens_waits_for_the_higher_and_is_refused() -> TestResult {
    let world = World::new().await?;
    let (a, mut b) = (connect(&world.url).await?, connect(&world.url).await?);

    // A passed the fence while it held the lease: the fence's row exists.
    let (holder_a, grant_a) = world.acquire("30s").await?;
    world.fence(&grant_a).seal(&a).await?;
    let (_, grant_b) = world.hand_over(holder_a, &grant_a).await?;

    // B passes the fence first and holds its row lock, uncommitted.
    let tx_b = b.transaction().await?;
    world.fence(&grant_b).check(&tx_b).await?;
    tx_b.execute(UPSERT, &[&DAY, &"from B"]).await?;

    // A's transaction checks first: it waits on B's lock.
    let a_pid: i32 = a.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let fence_a = world.fence(&grant_a);
    let racer = tokio::spawn(async move {
        let mut a = a;
        let tx = a.transaction().await?;
        let checked = fence_a.check(&tx).await;
        if checked.is_ok() {
            tx.execute(UPSERT, &[&DAY, &"from A"]).await?;
            tx.commit().await?;
        }
        Ok::<_, tokio_postgres::Error>(checked)
    });
    let waiting = format!(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = {a_pid} \
         AND query LIKE 'INSERT INTO leasehold_fence%'"
    );
    let started = tokio::time::Instant::now();
    while world.witness(&waiting)? != "Lock" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "A's check never waited on the fence's lock"
        );
        assert!(
            !racer.is_finished(),
            "A's check returned while B held the fence"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still waiting a moment later.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!racer.is_finished());

    tx_b.commit().await?;
    let checked = tokio::time::timeout(Duration::from_secs(10), racer).await???;
    assert_stale(checked, grant_a.fencing_token, grant_b.fencing_token);

    assert_eq!(world.body()?, "from B");
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    Ok(())
}

/// The environment variable that makes [`paused_holder_process`] the
/// holder process of [`a_paused_holder_is_refused_after_another_took_over`]:
/// Redis URL, database URL, lease key and ttl, one per line.
const HOLDER_ENV: &str = "LEASEHOLD_POSTGRES_TEST_HOLDER";

#[tokio::test]
async fn a_paused_holder_is_refused_after_another_took_over() -> TestResult {
    let world = World::new().await?;
    let b = connect(&world.url).await?;

    // A, a process of its own: this test binary running only
    // `paused_holder_process`, as the holder.
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "paused_holder_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            HOLDER_ENV,
            format!("{}\n{}\n{}\n1s", world.redis.url(), world.url, world.key),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = Pid::from_raw(i32::try_from(child.id().ok_or("A exited")?)?);
    let mut stdin = child.stdin.take().ok_or("A's stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("A's stdout")?).lines();
    let mut said = async |prefix: &str| -> Result<String, Box<dyn std::error::Error>> {
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                // libtest may print the test's name on the same line first.
                if let Some((_, rest)) = line.split_once(prefix) {
                    return Ok(rest.to_owned());
                }
            }
            Err::<String, Box<dyn std::error::Error>>(format!("A ended before {prefix:?}").into())
        };
        tokio::time::timeout(Duration::from_secs(30), wait).await?
    };

    // A holds the lease (ttl 1 s) and has written; then it is frozen.
    let token_a = FencingToken(said("holder: wrote with token ").await?.parse()?);
    kill(pid, Signal::SIGSTOP)?;
    assert_eq!(world.body()?, "from A");

    // A's lease expires in Redis while A is stopped; B takes it and writes.
    let started = tokio::time::Instant::now();
    let (holder_b, grant_b) = loop {
        match world.acquire("30s").await {
            Ok(acquired) => break acquired,
            Err(_) if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error),
        }
    };
    assert!(grant_b.fencing_token > token_a);
    let fence_b = world.fence(&grant_b);
    assert_eq!(fence_b.execute(&b, UPSERT, &[&DAY, &"from B"]).await?, 1);

    // A resumes, still believing it holds the lease, and writes.
    stdin.write_all(b"write\n").await?;
    stdin.flush().await?;
    kill(pid, Signal::SIGCONT)?;
    let outcome = said("holder: after the pause: ").await?;
    assert_eq!(outcome, format!("refused, newer {}", grant_b.fencing_token));
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await??;
    assert!(status.success(), "the holder process failed: {status}");

    // The database's rows and the lease's value in Redis agree: B.
    assert_eq!(world.body()?, "from B");
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    let lease_value = world
        .redis
        .cli(&["GET", &KeyLayout::default().lease(&world.key)])?;
    assert!(
        lease_value.starts_with(&holder_b.to_hex()),
        "the lease is not B's: {lease_value}"
    );
    Ok(())
}

/// Not a test: the holder process of
/// [`a_paused_holder_is_refused_after_another_took_over`], which runs this
/// binary with [`HOLDER_ENV`] set. Without it, it does nothing.
///
/// It acquires the lease, writes through its fence, says so, waits for a
/// line on its standard input (the parent stops it meanwhile, and writes
/// the line once another holder has written), writes again with the same
/// token, and says what the database answered.
#[tokio::test]
async fn paused_holder_process() -> TestResult {
    let Ok(spec) = std::env::var(HOLDER_ENV) else {
        return Ok(());
    };
    let [redis_url, url, key, ttl]: [&str; 4] = spec
        .lines()
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|_| format!("{HOLDER_ENV}: {spec:?}"))?;
    let backend = RedisBackend::connect(redis_url).await?;
    let key = LeaseKey::new(key)?;
    let request = AcquireRequest::new(key.clone(), HolderId::generate()?, Ttl::parse(ttl)?);
    let AcquireOutcome::Acquired(grant) = backend.try_acquire(&request).await? else {
        return Err("the holder process found the lease held".into());
    };
    let client = connect(url).await?;
    let fence = Fence::new(RESOURCE, &key, grant.fencing_token);
    fence.execute(&client, UPSERT, &[&DAY, &"from A"]).await?;
    println!("holder: wrote with token {}", grant.fencing_token);

    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    match fence.execute(&client, UPSERT, &[&DAY, &"late A"]).await {
        Ok(rows) => println!("holder: after the pause: written ({rows} rows)"),
        Err(PgFenceError::Stale { newer, .. }) => {
            println!("holder: after the pause: refused, newer {newer}")
        }
        Err(other) => println!("holder: after the pause: failed: {other}"),
    }
    Ok(())
}

#[tokio::test]
async fn refusals_and_a_missing_install_say_what_to_do() -> TestResult {
    let world = World::new().await?;
    let client = connect(&world.url).await?;
    let (_, grant) = world.acquire("30s").await?;
    world.fence(&grant).seal(&client).await?;

    // Another lease key's token does not compare: refused, whatever its value.
    let other = LeaseKey::new("reports:weekly")?;
    let refused = Fence::new(RESOURCE, &other, FencingToken(u64::MAX))
        .seal(&client)
        .await;
    match refused {
        Err(PgFenceError::OtherKey {
            ref lease_key,
            ref fenced_by,
            ..
        }) => assert_eq!(
            (lease_key.as_str(), fenced_by.as_str()),
            ("reports:weekly", "reports:nightly")
        ),
        ref other => panic!("expected another key refused, got {other:?}"),
    }
    assert!(refused.as_ref().is_err_and(PgFenceError::is_refused));
    assert_eq!(world.fence_row()?, world.fenced_at(&grant));

    // Installing again (twice at once) changes nothing.
    let again = connect(&world.url).await?;
    let (first, second) = tokio::join!(
        leasehold_postgres::install(&client),
        leasehold_postgres::install(&again)
    );
    first?;
    second?;
    assert_eq!(world.fence_row()?, world.fenced_at(&grant));

    // A caller's statement naming a missing table is the caller's error.
    let missing = world
        .fence(&grant)
        .execute(&client, "UPDATE no_such_table SET x = 1", &[])
        .await;
    assert!(
        matches!(missing, Err(PgFenceError::Postgres { .. })),
        "{missing:?}"
    );

    // A database without the fence: every call says to install it.
    let bare = connect(&world.pg.create_database()?).await?;
    let fence = world.fence(&grant);
    let errors = [
        fence.seal(&bare).await.err(),
        fence.execute(&bare, "SELECT 1", &[]).await.err(),
        leasehold_postgres::inspect(&bare, RESOURCE).await.err(),
    ];
    for error in errors {
        let error = error.ok_or("a call succeeded without the fence")?;
        assert!(
            matches!(error, PgFenceError::NotInstalled { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("install(&client)"), "{error}");
    }
    Ok(())
}

#[tokio::test]
async fn tokens_compare_exactly_up_to_u64_max() -> TestResult {
    let world = World::new().await?;
    let client = connect(&world.url).await?;
    let fence = |token| Fence::new(RESOURCE, &world.key, FencingToken(token));

    // Above a bigint's range, and one apart: compared as numbers, not floats.
    fence(u64::MAX - 1).seal(&client).await?;
    fence(u64::MAX)
        .execute(&client, UPSERT, &[&DAY, &"max"])
        .await?;
    fence(u64::MAX).seal(&client).await?; // an equal token passes again
    assert_stale(
        fence(u64::MAX - 1).seal(&client).await,
        FencingToken(u64::MAX - 1),
        FencingToken(u64::MAX),
    );
    assert_stale(
        fence(1 << 63)
            .execute(&client, UPSERT, &[&DAY, &"low"])
            .await,
        FencingToken(1 << 63),
        FencingToken(u64::MAX),
    );
    assert_eq!(world.body()?, "max");
    assert_eq!(world.fence_row()?, format!("{}|{}", world.key, u64::MAX));
    Ok(())
}

#[tokio::test]
async fn under_repeatable_read_a_fence_raised_meanwhile_is_retryable_then_refused() -> TestResult {
    let world = World::new().await?;
    let (mut a, b) = (connect(&world.url).await?, connect(&world.url).await?);
    let (holder_a, grant_a) = world.acquire("30s").await?;
    world.fence(&grant_a).seal(&a).await?;
    let (_, grant_b) = world.hand_over(holder_a, &grant_a).await?;
    let fence_a = world.fence(&grant_a);

    // A's snapshot is taken before B raises the fence.
    let tx = a
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.query_one("SELECT 1", &[]).await?;
    world.fence(&grant_b).seal(&b).await?;
    let raced = fence_a.check(&tx).await;
    assert!(
        raced.as_ref().is_err_and(PgFenceError::is_retryable),
        "{raced:?}"
    );
    drop(tx);

    // Run again, A is refused.
    let tx = a
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    assert_stale(
        fence_a.check(&tx).await,
        grant_a.fencing_token,
        grant_b.fencing_token,
    );
    assert_eq!(world.fence_row()?, world.fenced_at(&grant_b));
    Ok(())
}
