//! The PostgreSQL backend against real servers: what is particular to PostgreSQL, and a test
//! for each way the field's PostgreSQL leader election breaks (a terminated backend, a
//! failover that lost the last commit, a standby, a frozen server, an acquire whose answer
//! was lost, a write by a deposed leader). The behaviour every backend shares is in the
//! conformance suite; PgBouncer with `incumbent run` processes is in `cli_failover`.

use std::time::Duration;

use crate::support::events::{demoted, elected};
use crate::support::postgres::{backend, client_at};
use crate::support::{PgBouncer, PostgresServer};
use incumbent::backend::{Backend, Wakeup};
use incumbent::postgres::PostgresBackend;
use incumbent::{Election, Error};
use tokio::time::Instant;

/// The ttl of most tests.
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);
/// The poll interval of the tests that poll.
const POLL: Duration = Duration::from_millis(200);

async fn connect(addr: std::net::SocketAddr) -> PostgresBackend {
    backend(addr)
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to postgres")
}

fn election(backend: &PostgresBackend, name: &str, candidate: &str) -> Election<PostgresBackend> {
    Election::builder(backend.clone(), name)
        .candidate(candidate)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// The row of `election`: holder JSON (while held), token.
async fn row(
    client: &incumbent::postgres::tokio_postgres::Client,
    election: &str,
) -> Option<(Option<String>, i64)> {
    client
        .query_opt(
            "SELECT holder, token FROM incumbent_leases WHERE election = $1",
            &[&election],
        )
        .await
        .expect("read the lease row")
        .map(|row| (row.get(0), row.get(1)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_neither_frees_the_lock_nor_makes_a_second_leader() {
    // With a session advisory lock, pg_terminate_backend frees the lock at once while the
    // old holder still believes it leads. Here the lease is a row: terminating every
    // connection of both candidates, again and again, changes nobody's mind.
    let server = PostgresServer::start().await;
    let (a_backend, b_backend) = (connect(server.addr()).await, connect(server.addr()).await);
    let mut a = election(&a_backend, "terminated", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    let mut b = election(&b_backend, "terminated", "b").campaign();
    let admin = server.client().await;
    let until = Instant::now() + TTL * 2;
    let mut terminated = 0;
    while Instant::now() < until {
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                  WHERE application_name = 'incumbent' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("terminate");
        terminated += rows.len();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(terminated >= 4, "terminated only {terminated} connections");
    assert!(
        !term.is_cancelled(),
        "the leader lost its term to a terminated connection"
    );
    assert!(a.status().borrow().is_leader());
    assert!(!b.status().borrow().is_leader(), "two leaders");
    // The leader still holds the row, with the term's token, and hands it over on resign.
    let (holder, token) = row(&admin, "terminated").await.expect("the row");
    assert!(holder.is_some_and(|h| h.contains("\"id\":\"a\"")));
    assert_eq!(u64::try_from(token).ok(), Some(term.fencing_token()));
    a.resign().await.expect("resign");
    let next = elected(&mut b, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_ends_the_term_before_the_lease_can_run_out() {
    // SIGSTOP of the whole server (postmaster and backends): the leader's renewals go
    // unanswered, and its term ends by its own deadline, a renew interval before the lease
    // could run out. After the thaw one candidate leads again, with a greater token.
    let mut server = PostgresServer::start().await;
    let backend = backend(server.addr())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let mut a = election(&backend, "frozen", "a").campaign();
    let first = elected(&mut a, PATIENCE).await;
    server.process().pause();
    let frozen = Instant::now();
    demoted(&mut a, PATIENCE).await;
    let took = frozen.elapsed();
    assert!(first.is_cancelled());
    assert!(
        took < TTL,
        "the term ended {took:?} after the freeze: not before the lease could run out"
    );
    server.process().resume();
    let second = elected(&mut a, PATIENCE).await;
    assert!(second.fencing_token() > first.fencing_token());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_lost_is_adopted_not_leaked() {
    // sqlx's advisory lock leaks when its acquire future is dropped. Here the server freezes
    // while `a` takes a free row: the statement times out for `a` but commits at the thaw,
    // naming `a`. The next acquire adopts it (or the lease runs out): `a` leads soon after
    // the thaw, and nobody is locked out.
    let mut server = PostgresServer::start().await;
    let backend = backend(server.addr())
        .timeout(Duration::from_millis(300))
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect");
    let admin = server.client().await;
    let ttl = Duration::from_secs(4);
    // Someone else holds the row for another 400 ms; `a` retries at its expiry.
    admin
        .execute(
            "INSERT INTO incumbent_leases (election, holder, token, expires_at) \
             VALUES ('lost-answer', '{\"fencing_token\":1,\"id\":\"z\"}', 1, \
                     clock_timestamp() + interval '400 milliseconds')",
            &[],
        )
        .await
        .expect("insert");
    let mut a = Election::builder(backend.clone(), "lost-answer")
        .candidate("a")
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .expect("valid election")
        .campaign();
    tokio::time::sleep(Duration::from_millis(250)).await;
    server.process().pause();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.process().resume();
    let thawed = Instant::now();
    let term = elected(&mut a, PATIENCE).await;
    let took = thawed.elapsed();
    assert!(
        took < ttl / 2,
        "a leads {took:?} after the thaw: the row its lost acquire wrote was left to expire"
    );
    let (holder, token) = row(&admin, "lost-answer").await.expect("the row");
    assert!(holder.is_some_and(|h| h.contains("\"id\":\"a\"")));
    assert_eq!(u64::try_from(token).ok(), Some(term.fencing_token()));
    // Dropping acquires at every point leaks nothing: a shut-down campaign frees the row.
    a.shutdown().await.expect("shutdown");
    let (holder, _) = row(&admin, "lost-answer").await.expect("the row");
    assert_eq!(holder, None, "the row is free after the shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_acquires_at_any_point_leaks_no_lock() {
    // Drop the campaign's acquire futures at many points (each campaign shut down, or
    // dropped, a few ms after it started): afterwards another candidate takes the row at
    // once, or within one ttl where a dropped acquire had already committed.
    let server = PostgresServer::start().await;
    let admin = server.client().await;
    for delay_ms in [0u64, 1, 2, 3, 5, 8, 13, 21] {
        let backend = connect(server.addr()).await;
        let campaign = election(&backend, "dropped", "a").campaign();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        drop(campaign);
        drop(backend);
    }
    let other = connect(server.addr()).await;
    let mut b = election(&other, "dropped", "b").campaign();
    let started = Instant::now();
    let term = elected(&mut b, PATIENCE).await;
    assert!(
        started.elapsed() < TTL + Duration::from_secs(1),
        "a dropped acquire held the row for {:?}",
        started.elapsed()
    );
    let (holder, _) = row(&admin, "dropped").await.expect("the row");
    assert!(holder.is_some_and(|h| h.contains("\"id\":\"b\"")));
    assert!(term.fencing_token() > 0);
    b.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_that_missed_the_last_commit_still_hands_out_greater_tokens() {
    // An asynchronous failover: the standby misses the last term's commit (its replication
    // stream, through a proxy, is cut while the primary commits), the primary dies, the
    // standby is promoted. A process that
    // never saw the last token must still get a greater one. Before the promotion, the
    // standby refuses to campaign.
    let mut primary = PostgresServer::start().await;
    let stream = crate::support::Proxy::start(primary.addr());
    let replica = PostgresServer::replica_of(stream.addr()).await;
    let term = |addr: std::net::SocketAddr, id: &'static str| async move {
        let backend = connect(addr).await;
        let mut campaign = election(&backend, "failover", id).campaign();
        let token = elected(&mut campaign, PATIENCE).await.fencing_token();
        campaign.shutdown().await.expect("shutdown");
        token
    };
    let first = term(primary.addr(), "a").await;
    let standby = client_at(replica.addr()).await;
    let replicated = tokio::time::timeout(PATIENCE, async {
        // Until the standby has replayed the table's creation, the read fails.
        let token = "SELECT token FROM incumbent_leases WHERE election = 'failover'";
        while standby
            .query_opt(token, &[])
            .await
            .ok()
            .flatten()
            .map(|row| row.get::<_, i64>(0))
            != i64::try_from(first).ok()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        replicated.is_ok(),
        "the standby never caught up with token {first}"
    );
    match backend(replica.addr()).connect().await {
        Err(Error::ReadOnly { .. }) => {}
        other => panic!("a standby was not refused with ReadOnly: {other:?}"),
    }
    stream.blackhole(true);
    let second = term(primary.addr(), "b").await;
    assert!(second > first);
    primary.process().kill9();
    // The bytes the proxy withheld are lost with it.
    drop(stream);
    replica.promote().await;
    let standby = client_at(replica.addr()).await;
    assert_eq!(
        row(&standby, "failover").await.map(|(_, t)| t),
        i64::try_from(first).ok(),
        "the promoted standby missed the last term's commit"
    );
    let third = term(replica.addr(), "c").await;
    assert!(
        third > second,
        "after the failover the token went from {second} to {third}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_refused_with_a_typed_error() {
    // `default_transaction_read_only = on` (a server kept read-only for maintenance, or a
    // pooler that sends reads elsewhere): connecting is refused with ReadOnly, and a
    // campaign on a backend connected before says so in its status, and leads nowhere.
    let server = PostgresServer::start().await;
    let earlier = connect(server.addr()).await;
    let admin = server.client().await;
    admin
        .batch_execute("ALTER DATABASE postgres SET default_transaction_read_only = on")
        .await
        .expect("make the database read-only");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE application_name = 'incumbent'",
            &[],
        )
        .await
        .expect("end the backend's connections");
    match backend(server.addr()).table("other_leases").connect().await {
        Err(Error::ReadOnly { reason, .. }) => assert!(reason.contains("writes"), "{reason}"),
        other => panic!("a read-only server was not refused with ReadOnly: {other:?}"),
    }
    let a = election(&earlier, "read-only", "a").campaign();
    // Its first statement may meet the connection the server terminated ("terminating
    // connection due to administrator command"); the next one connects again, and is refused.
    let mut status = a.status();
    let said = tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| {
            s.problem
                .as_ref()
                .is_some_and(|p| p.message.contains("accepts no writes"))
        }),
    )
    .await
    // Not the status's guard: held, it would block the campaign's next update.
    .map(|seen| seen.is_ok());
    assert!(
        matches!(said, Ok(true)),
        "the campaign never said the server accepts no writes: {:?}",
        a.status().borrow().problem
    );
    assert!(!a.status().borrow().is_leader());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_renews_every_election_of_a_process() {
    // The server counts each statement's calls (pg_stat_statements): the renewal of four
    // elections held by one process is one statement per renew interval, on one connection,
    // covering each election's lease and the candidate's presence record in it (for
    // hand-overs).
    let server = PostgresServer::start_with(&["shared_preload_libraries=pg_stat_statements"]).await;
    let admin = server.client().await;
    admin
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("create the extension");
    let backend = backend(server.addr())
        .listen(false)
        .poll_interval(Duration::from_secs(60))
        .connect()
        .await
        .expect("connect");
    let mut campaigns = Vec::new();
    for name in ["shared/a", "shared/b", "shared/c", "shared/d"] {
        let mut campaign = election(&backend, name, "host-a").campaign();
        elected(&mut campaign, PATIENCE).await;
        campaigns.push(campaign);
    }
    assert_eq!(backend.session_ids().len(), 1, "one session for all four");
    let renewals = || async {
        admin
            .query_one(
                "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(rows), 0)::int8 \
                   FROM pg_stat_statements WHERE query LIKE '%unnest%'",
                &[],
            )
            .await
            .expect("pg_stat_statements")
    };
    let before = renewals().await;
    let since = Instant::now();
    tokio::time::sleep(TTL * 3).await;
    let after = renewals().await;
    let intervals = since.elapsed().as_secs_f64() / (TTL / 3).as_secs_f64();
    let calls = after.get::<_, i64>(0) - before.get::<_, i64>(0);
    let rows = after.get::<_, i64>(1) - before.get::<_, i64>(1);
    println!("{calls} renewal statements ({rows} rows) in {intervals:.1} renew intervals");
    assert!(
        (calls as f64) <= intervals + 1.0 && (calls as f64) >= intervals - 2.0,
        "{calls} renewal statements in {intervals:.1} renew intervals: not one per interval"
    );
    assert_eq!(
        rows,
        calls * 8,
        "each renewal covers the four elections and the four presence records"
    );
    let sessions = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'incumbent'",
            &[],
        )
        .await
        .expect("activity")
        .get::<_, i64>(0);
    assert_eq!(sessions, 1, "one connection for four elections");
    for campaign in campaigns {
        campaign.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_hands_off_without_a_poll_and_polling_works_through_pgbouncer() {
    let server = PostgresServer::start().await;
    // Direct: followers LISTEN; a release wakes them at once.
    let (a_backend, b_backend) = (connect(server.addr()).await, connect(server.addr()).await);
    assert!(b_backend.listening());
    assert_eq!(b_backend.info().wakeup, Wakeup::Push);
    let took = hand_off(&a_backend, &b_backend, "direct").await;
    println!("hand-off with LISTEN: {took:?}");
    assert!(took < Duration::from_secs(2), "hand-off took {took:?}");
    // Through PgBouncer in transaction mode, with two server connections for everyone:
    // no session state, so nothing strands; followers poll.
    let bouncer = PgBouncer::transaction_mode(server.addr(), 2).await;
    let pooled = || async {
        backend(bouncer.addr())
            .listen(false)
            .poll_interval(POLL)
            .connect()
            .await
            .expect("connect through pgbouncer")
    };
    let (a_backend, b_backend) = (pooled().await, pooled().await);
    assert_eq!(b_backend.info().wakeup, Wakeup::Poll(POLL));
    let took = hand_off(&a_backend, &b_backend, "pooled").await;
    println!("hand-off through pgbouncer, polling every {POLL:?}: {took:?}");
}

/// `a` leads on one backend, `b` follows on another; `a` resigns: how long until `b` leads.
async fn hand_off(
    a_backend: &PostgresBackend,
    b_backend: &PostgresBackend,
    name: &str,
) -> Duration {
    let mut a = election(a_backend, name, "a").campaign();
    elected(&mut a, PATIENCE).await;
    let mut b = election(b_backend, name, "b").campaign();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    a.resign().await.expect("resign");
    elected(&mut b, PATIENCE).await;
    let took = released.elapsed();
    b.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
    took
}

/// Writes `position` in a transaction guarded by `token`.
async fn guarded_write(
    backend: &PostgresBackend,
    app: &mut incumbent::postgres::tokio_postgres::Client,
    token: u64,
    position: i64,
) -> Result<(), Error> {
    let tx = app.transaction().await.expect("begin");
    backend.guard(&tx, "guarded", token).await?;
    tx.execute(
        "INSERT INTO checkpoints VALUES ('index', $1) \
         ON CONFLICT (job) DO UPDATE SET position = EXCLUDED.position",
        &[&position],
    )
    .await
    .expect("write");
    tx.commit().await.expect("commit");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_write_commits_only_while_the_term_holds() {
    // The leader writes in its own transaction, guarded by its token; the lock is taken
    // away (the row rewritten as an operator would); the old leader's next guarded write
    // is refused with NotLeader and changes nothing, and a new term's write commits.
    let server = PostgresServer::start().await;
    let backend = connect(server.addr()).await;
    let mut app = client_at(server.addr()).await;
    app.batch_execute("CREATE TABLE checkpoints (job text PRIMARY KEY, position int8 NOT NULL)")
        .await
        .expect("create the application's table");
    let mut a = election(&backend, "guarded", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    guarded_write(&backend, &mut app, term.fencing_token(), 1)
        .await
        .expect("the leader's write");
    // A write with a token the term never had is refused.
    assert!(matches!(
        guarded_write(&backend, &mut app, term.fencing_token() + 1, 99).await,
        Err(Error::NotLeader)
    ));
    let admin = server.client().await;
    admin
        .execute(
            "UPDATE incumbent_leases SET holder = NULL, expires_at = NULL WHERE election = 'guarded'",
            &[],
        )
        .await
        .expect("take the lock away");
    assert!(matches!(
        guarded_write(&backend, &mut app, term.fencing_token(), 2).await,
        Err(Error::NotLeader)
    ));
    let next = elected(&mut a, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
    guarded_write(&backend, &mut app, next.fencing_token(), 3)
        .await
        .expect("the new term's write");
    let position: i64 = admin
        .query_one("SELECT position FROM checkpoints WHERE job = 'index'", &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(position, 3, "only the terms' own writes committed");
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_transaction_holds_off_the_next_leader_until_it_ends() {
    // The guard's row lock: while the old leader's guarded transaction is open, a takeover
    // waits; the write commits before the next term begins, never after.
    let server = PostgresServer::start().await;
    let (a_backend, b_backend) = (connect(server.addr()).await, connect(server.addr()).await);
    let mut app = client_at(server.addr()).await;
    let mut a = election(&a_backend, "held-off", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    let mut b = election(&b_backend, "held-off", "b").campaign();
    let tx = app.transaction().await.expect("begin");
    a_backend
        .guard(&tx, "held-off", term.fencing_token())
        .await
        .expect("guard");
    // The lease runs out while the transaction is open (a stopped renewing: resigning
    // waits for the row lock too, so it is shut down without a release).
    drop(a);
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    assert!(
        !b.status().borrow().is_leader(),
        "b took the row while the guarded transaction was open"
    );
    let committed = Instant::now();
    tx.commit().await.expect("commit");
    let next = elected(&mut b, PATIENCE).await;
    println!("b led {:?} after the commit", committed.elapsed());
    assert!(next.fencing_token() > term.fencing_token());
    b.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_rows_are_refused_not_trusted() {
    let server = PostgresServer::start().await;
    let backend = connect(server.addr()).await;
    let admin = server.client().await;
    // A token beyond 2^53 - 1 (or negative) is refused, not rounded or wrapped.
    for token in [i64::MAX, -5] {
        admin
            .execute(
                "INSERT INTO incumbent_leases (election, holder, token, expires_at) \
                 VALUES ('hostile', NULL, $1, NULL) \
                 ON CONFLICT (election) DO UPDATE SET token = EXCLUDED.token",
                &[&token],
            )
            .await
            .expect("plant a token");
        let a = election(&backend, "hostile", "a").campaign();
        let refused = crate::support::events::problem(&a.status(), PATIENCE).await;
        assert!(refused.contains("hostile"), "{refused}");
        assert!(!a.status().borrow().is_leader());
        a.shutdown().await.expect("shutdown");
    }
    // A holder that is not JSON is shown as it is, and the lease still runs out.
    admin
        .execute(
            "UPDATE incumbent_leases SET token = 7, holder = 'not json', \
                    expires_at = clock_timestamp() + interval '300 milliseconds' \
              WHERE election = 'hostile'",
            &[],
        )
        .await
        .expect("plant a holder");
    let mut a = election(&backend, "hostile", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    assert!(term.fencing_token() > 7);
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_created_or_named_with_its_statement() {
    let server = PostgresServer::start().await;
    let refused = backend(server.addr())
        .table("ops.leases")
        .create_table(false)
        .connect()
        .await;
    match refused {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("CREATE TABLE"), "{reason}");
        }
        other => panic!("a missing table was not named: {other:?}"),
    }
    let admin = server.client().await;
    admin
        .batch_execute("CREATE SCHEMA ops")
        .await
        .expect("create schema");
    let backend = backend(server.addr())
        .table("ops.leases")
        .connect()
        .await
        .expect("created");
    assert_eq!(backend.table(), "ops.leases");
    let mut a = election(&backend, "in-schema", "a").campaign();
    elected(&mut a, PATIENCE).await;
    a.shutdown().await.expect("shutdown");
    assert!(matches!(
        crate::support::postgres::backend(server.addr())
            .table("x; DROP TABLE y")
            .connect()
            .await,
        Err(Error::InvalidConfig { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_connect_at_once_all_create_the_table_without_failing() {
    // `CREATE TABLE IF NOT EXISTS` from several sessions at once fails all but one on the
    // catalog's unique index: every backend must connect anyway. Eight rounds, each on a
    // table of its own, eight backends at once.
    let server = PostgresServer::start().await;
    for round in 0..8 {
        let table = format!("leases_{round}");
        let connects = (0..8).map(|_| {
            let table = table.clone();
            let addr = server.addr();
            tokio::spawn(async move { backend(addr).table(table).connect().await })
        });
        for connected in futures_util::future::join_all(connects).await {
            connected
                .expect("the task")
                .unwrap_or_else(|e| panic!("round {round}: a backend failed to connect: {e}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_backend_from_a_postgres_url_elects() {
    let server = PostgresServer::start().await;
    // The URL names host and database; the user would come from PGUSER: the builder names
    // it here, as the test cannot set the environment.
    let builder = PostgresBackend::from_url(&server.url()).expect("parse");
    drop(builder);
    let url: incumbent::url::BackendUrl = server.url().parse().expect("parse");
    assert_eq!(url.backend_name(), "postgres");
    assert_eq!(url.to_string(), server.url());
    for bad in [
        "postgres://user:secret@h/db",
        "postgres://h/db?password=secret",
        "postgresql://h:notaport/db",
    ] {
        let error = bad.parse::<incumbent::url::BackendUrl>().expect_err(bad);
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}

/// TLS to a real server whose certificate a CA made for the test signed: the backend checks
/// it against the CA file (and the host name), and elections work as over plain TCP,
/// `LISTEN` included; a CA that did not sign it is refused as a configuration error.
#[cfg(feature = "postgres-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_checks_the_server_against_the_ca_file() {
    use incumbent::postgres::PostgresConfig;
    let (server, certs) = PostgresServer::with_tls().await;
    let config = || PostgresConfig::from(crate::support::postgres::config_at(server.addr()));
    let backend = PostgresBackend::builder(config().ca_file(certs.join("ca.pem")))
        .connect()
        .await
        .expect("connect over TLS");
    assert!(backend.listening());
    let mut a = election(&backend, "tls", "a").campaign();
    elected(&mut a, PATIENCE).await;
    let admin = server.client().await;
    let encrypted: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
              WHERE application_name = 'incumbent' AND ssl",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert_eq!(
        encrypted, 2,
        "the statements' and LISTEN's connections are both TLS"
    );
    a.shutdown().await.expect("shutdown");
    let refused = PostgresBackend::builder(config().ca_file(certs.join("other-ca.pem")))
        .connect()
        .await;
    match refused {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("PGSSLROOTCERT"), "{reason}");
        }
        other => panic!("a server the CA did not sign was not refused: {other:?}"),
    }
}
