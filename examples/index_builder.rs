//! An index builder that survives `kill -9`: four instances of a service run at once; the
//! leader builds an index in chunks and checkpoints its progress under its fencing token.
//! The leader is killed in the middle of the build; the next leader resumes from the
//! checkpoint (not from chunk 0), and a write from the dead leader's term is refused. The
//! new leader publishes the index, and the followers read it.
//!
//! ```text
//! cargo run --example index_builder
//! cargo run --example index_builder --features consul -- --backend consul://127.0.0.1:8500
//! PGUSER=postgres cargo run --example index_builder --features postgres -- --backend postgres://127.0.0.1:5432/postgres
//! ```
//!
//! The first command needs no server: the instances elect through a lock file in a temp
//! directory and keep the checkpoint in a file next to it. `--backend` takes any backend URL
//! that [`BackendUrl`] reads (`file:///dir`, `consul://host:port[/prefix]`,
//! `etcd://host:port` with `--features etcd`). The program prints a timeline and exits by
//! itself: in about three seconds on the file backend (the kernel frees a killed process's
//! lock at once); in 20 to 30 seconds on Consul, which frees a killed leader's lock only when
//! its session's ttl (10 s, Consul's smallest) runs out, and may stretch it to twice that.
//!
//! # What it shows
//!
//! - **Fencing tokens in a downstream store.** Every checkpoint is written with the term's
//!   [`fencing_token`](Term::fencing_token), and the store refuses, atomically, any write
//!   whose token is below the highest it has seen ([`fence`]). A new leader stamps the
//!   checkpoint with its token before it does anything else, so from that moment every
//!   write of an older term fails: the timeline replays one from the killed leader's term.
//! - **Resuming.** The checkpoint holds how many chunks are done and the partial index; the
//!   next leader carries on from there, and its final digest equals a build from scratch.
//! - **Where the checkpoint lives** is behind a small trait, [`Checkpoints`], with two
//!   implementations: [`FileCheckpoints`] (a JSON file in a shared directory, read, checked
//!   and replaced while holding an exclusive `flock` on a lock file next to it) and, with
//!   `--backend consul://…`, `ConsulCheckpoints` (a KV key next to the election's, written
//!   with `?cas=` the `ModifyIndex` just read, and read again on a conflict), and with
//!   `--backend postgres://…`, `PostgresCheckpoints`: a row of the application's own table,
//!   written in a transaction that [`PostgresBackend::guard`] first ties to the term (it
//!   checks the lease row's token and locks that row until the commit), so a deposed
//!   leader's write never commits, and no new term can begin before a write in flight has
//!   committed.
//!
//! [`PostgresBackend::guard`]: https://docs.rs/incumbent/latest/incumbent/postgres/type.PostgresBackend.html#method.guard
//!
//! Each instance is this same program, started as
//! `index_builder candidate NAME ELECTION BACKEND_URL CHECKPOINT_DIR`: it campaigns, builds
//! while it leads, reads the published index while it follows, and prints what happens as
//! JSON lines, which the parent turns into the timeline. It shuts down gracefully when its
//! stdin closes.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::url::{BackendUrl, WithBackend};
use incumbent::{Election, LeadershipEvent, Status, Term};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tokio::time::{sleep, timeout};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[path = "support/cluster.rs"]
mod cluster;

const INSTANCES: [&str; 4] = ["node-1", "node-2", "node-3", "node-4"];
/// The index is built in this many chunks...
const CHUNKS: u32 = 20;
/// ... of this much simulated work each.
const CHUNK_TIME: Duration = Duration::from_millis(150);
/// The first leader is killed once it has checkpointed this many chunks.
const KILL_AFTER: u32 = 8;
/// How often followers look for a published index.
const READ_INTERVAL: Duration = Duration::from_millis(200);
/// The instances' ttl, unless the store's smallest is longer (Consul: 10 s).
const TTL: Duration = Duration::from_secs(3);
/// The whole demo stops by itself after this long, whatever happens.
const DEMO_LIMIT: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["candidate", name, election, url, dir] => instance(name, election, url, dir).await,
        [] => run_demo("file:").await,
        ["--backend", url] => run_demo(url).await,
        _ => Err("usage: index_builder [--backend URL]".into()),
    };
    if let Err(e) = outcome {
        eprintln!("index_builder: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// The checkpoint store
// ---------------------------------------------------------------------------------------------

/// How far a build got: written by the leader after every chunk.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Checkpoint {
    /// The fencing token of the term that wrote it.
    token: u64,
    /// How many chunks are done.
    chunk: u32,
    /// The partial index: here, the running digest of the chunks done.
    partial: u64,
}

/// A finished index, as followers read it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Published {
    /// The fencing token of the term that published it.
    token: u64,
    /// A digest of the index's contents.
    digest: String,
}

/// Everything the store keeps for one election: one record, so that one atomic
/// read-check-write covers the checkpoint and the published index alike.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Record {
    checkpoint: Option<Checkpoint>,
    published: Option<Published>,
}

impl Record {
    /// The highest fencing token that has written this record.
    fn highest_token(&self) -> u64 {
        let checkpoint = self.checkpoint.as_ref().map_or(0, |c| c.token);
        let published = self.published.as_ref().map_or(0, |p| p.token);
        checkpoint.max(published)
    }
}

/// Why a write was not done.
#[derive(Debug)]
enum SaveError {
    /// The store has seen a newer term: the writer is a stale leader and must stop.
    Stale { ours: u64, highest: u64 },
    /// The store could not be read or written; worth retrying.
    Store(String),
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveError::Stale { ours, highest } => {
                write!(f, "stale token {ours}: the store has seen token {highest}")
            }
            SaveError::Store(e) => write!(f, "store error: {e}"),
        }
    }
}

/// The fencing rule, the same for every store: refuse a token below the highest seen, else
/// apply the change. Each store calls it inside its own atomic read-check-write.
fn fence(record: &mut Record, token: u64, change: impl Fn(&mut Record)) -> Result<(), SaveError> {
    let highest = record.highest_token();
    if token < highest {
        return Err(SaveError::Stale {
            ours: token,
            highest,
        });
    }
    change(record);
    Ok(())
}

/// Where checkpoints and the published index live. A store implements two operations: read
/// the record, and atomically read it, [`fence`] it and write it back.
trait Checkpoints: Send + Sync + 'static {
    /// The record as it is now.
    fn read(&self) -> impl Future<Output = Result<Record, String>> + Send;

    /// Atomically: reads the record, refuses `token` if it is below the highest seen, else
    /// writes `change(record)` back. `change` may run more than once (stores retry conflicts).
    fn write(
        &self,
        token: u64,
        change: impl Fn(&mut Record) + Send + Sync + 'static,
    ) -> impl Future<Output = Result<(), SaveError>> + Send;

    /// The last checkpoint, if a build has started.
    fn load(&self) -> impl Future<Output = Result<Option<Checkpoint>, String>> + Send {
        async { Ok(self.read().await?.checkpoint) }
    }

    /// Records progress; a stale token gets [`SaveError::Stale`].
    fn save(&self, checkpoint: Checkpoint) -> impl Future<Output = Result<(), SaveError>> + Send {
        self.write(checkpoint.token, move |record| {
            record.checkpoint = Some(checkpoint.clone());
        })
    }

    /// Publishes the finished index; a stale token gets [`SaveError::Stale`].
    fn publish(&self, index: Published) -> impl Future<Output = Result<(), SaveError>> + Send {
        self.write(index.token, move |record| {
            record.published = Some(index.clone());
        })
    }

    /// The published index, if any.
    fn published(&self) -> impl Future<Output = Result<Option<Published>, String>> + Send {
        async { Ok(self.read().await?.published) }
    }
}

/// The record as a JSON file in a directory every instance shares. Writers hold an exclusive
/// `flock` on a lock file next to it for the whole read-check-write (the kernel drops it if
/// the holder dies, even by `kill -9`), and replace the file by renaming, so readers (with
/// a shared lock) never see half a record.
struct FileCheckpoints {
    path: PathBuf,
    lock: PathBuf,
}

impl FileCheckpoints {
    fn new(dir: &Path, election: &str) -> Self {
        FileCheckpoints {
            path: dir.join(format!("{election}.checkpoint.json")),
            lock: dir.join(format!("{election}.checkpoint.lock")),
        }
    }

    /// Runs `f` with the lock file locked (exclusively or shared), in a blocking thread.
    async fn locked<T: Send + 'static>(
        &self,
        exclusive: bool,
        f: impl FnOnce(&Path) -> Result<T, SaveError> + Send + 'static,
    ) -> Result<T, SaveError> {
        let (path, lock) = (self.path.clone(), self.lock.clone());
        let io = |e: std::io::Error| SaveError::Store(e.to_string());
        tokio::task::spawn_blocking(move || {
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(lock)
                .map_err(io)?;
            if exclusive {
                lock.lock().map_err(io)?;
            } else {
                lock.lock_shared().map_err(io)?;
            }
            f(&path) // the lock is released when `lock` is closed, after this
        })
        .await
        .map_err(|e| SaveError::Store(e.to_string()))?
    }
}

fn read_file(path: &Path) -> Result<Record, SaveError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| SaveError::Store(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
        Err(e) => Err(SaveError::Store(e.to_string())),
    }
}

impl Checkpoints for FileCheckpoints {
    async fn read(&self) -> Result<Record, String> {
        self.locked(false, read_file)
            .await
            .map_err(|e| e.to_string())
    }

    async fn write(
        &self,
        token: u64,
        change: impl Fn(&mut Record) + Send + Sync + 'static,
    ) -> Result<(), SaveError> {
        self.locked(true, move |path| {
            let mut record = read_file(path)?;
            fence(&mut record, token, change)?;
            let io = |e: std::io::Error| SaveError::Store(e.to_string());
            let json = serde_json::to_vec(&record).map_err(|e| SaveError::Store(e.to_string()))?;
            let tmp = path.with_extension("json.tmp");
            let mut file = std::fs::File::create(&tmp).map_err(io)?;
            std::io::Write::write_all(&mut file, &json).map_err(io)?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)
        })
        .await
    }
}

/// The record in Consul's KV store, at a key next to the election's. A write reads the key,
/// fences the record and writes it back with `?cas=<the ModifyIndex read>`: Consul refuses it
/// if anyone wrote in between, and then we read again and check again.
#[cfg(feature = "consul")]
struct ConsulCheckpoints {
    client: incumbent::consul::client::ConsulClient,
    key: String,
}

#[cfg(feature = "consul")]
impl ConsulCheckpoints {
    fn new(address: &str, key: String) -> Result<Self, BoxError> {
        use incumbent::consul::{ConsulConfig, client::ConsulClient};
        let mut config = ConsulConfig::new(address);
        if let Ok(token) = std::env::var("CONSUL_HTTP_TOKEN") {
            config = config.token(token);
        }
        Ok(ConsulCheckpoints {
            client: ConsulClient::new(config)?,
            key,
        })
    }

    /// The record and the key's `ModifyIndex` (0: no key yet, which `cas=0` expects).
    async fn get(&self) -> Result<(Record, u64), String> {
        let answer = self
            .client
            .kv_get(&self.key, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        match answer.entry {
            None => Ok((Record::default(), 0)),
            Some(entry) => {
                let record = serde_json::from_slice(&entry.value).map_err(|e| e.to_string())?;
                Ok((record, entry.modify_index))
            }
        }
    }
}

#[cfg(feature = "consul")]
impl Checkpoints for ConsulCheckpoints {
    async fn read(&self) -> Result<Record, String> {
        Ok(self.get().await?.0)
    }

    async fn write(
        &self,
        token: u64,
        change: impl Fn(&mut Record) + Send + Sync + 'static,
    ) -> Result<(), SaveError> {
        use incumbent::consul::client::PutOptions;
        loop {
            let (mut record, modify_index) = self.get().await.map_err(SaveError::Store)?;
            fence(&mut record, token, &change)?;
            let json = serde_json::to_vec(&record).map_err(|e| SaveError::Store(e.to_string()))?;
            let options = PutOptions {
                cas: Some(modify_index),
                ..PutOptions::default()
            };
            match self.client.kv_put(&self.key, &json, &options).await {
                Ok(true) => return Ok(()),
                Ok(false) => continue, // someone wrote in between: read and check again
                Err(e) => return Err(SaveError::Store(e.to_string())),
            }
        }
    }
}

/// The record in a row of the application's own table, next to the lease table. A write is
/// one transaction: [`guard`](incumbent::postgres::PostgresBackend::guard) with the term's
/// token (refused once another term has begun, and holding the next one off until the
/// commit), then the row read `FOR UPDATE`, fenced and written back.
#[cfg(feature = "postgres")]
struct PostgresCheckpoints {
    /// For `guard` only: a second connection of the same backend, which does not campaign.
    backend: incumbent::postgres::PostgresBackend,
    client: tokio::sync::Mutex<incumbent::postgres::tokio_postgres::Client>,
    election: String,
}

#[cfg(feature = "postgres")]
impl PostgresCheckpoints {
    async fn new(url: &BackendUrl, election: &str) -> Result<Self, BoxError> {
        use incumbent::postgres::{PostgresBackend, tokio_postgres};
        let backend = PostgresBackend::from_url(&url.to_string())?
            .listen(false)
            .connect()
            .await?;
        // The application's own connection: the URL's host and database, libpq's user and
        // password variables, as the backend reads them.
        let mut config: tokio_postgres::Config = url.to_string().parse()?;
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER").or_else(|_| std::env::var("USER"))?;
            config.user(user);
        }
        if let Ok(password) = std::env::var("PGPASSWORD") {
            config.password(password);
        }
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS index_builder_checkpoints \
                 (election text PRIMARY KEY, record text NOT NULL)",
            )
            .await?;
        Ok(PostgresCheckpoints {
            backend,
            client: tokio::sync::Mutex::new(client),
            election: election.to_owned(),
        })
    }
}

#[cfg(feature = "postgres")]
impl Checkpoints for PostgresCheckpoints {
    async fn read(&self) -> Result<Record, String> {
        let client = self.client.lock().await;
        let row = client
            .query_opt(
                "SELECT record FROM index_builder_checkpoints WHERE election = $1",
                &[&self.election],
            )
            .await
            .map_err(|e| e.to_string())?;
        match row {
            Some(row) => serde_json::from_str(row.get(0)).map_err(|e| e.to_string()),
            None => Ok(Record::default()),
        }
    }

    async fn write(
        &self,
        token: u64,
        change: impl Fn(&mut Record) + Send + Sync + 'static,
    ) -> Result<(), SaveError> {
        let store = |e: &dyn std::fmt::Display| SaveError::Store(e.to_string());
        let mut client = self.client.lock().await;
        let tx = client.transaction().await.map_err(|e| store(&e))?;
        match self.backend.guard(&tx, &self.election, token).await {
            Ok(()) => {}
            Err(incumbent::Error::NotLeader) => {
                // Another term has begun: its token is the lease row's.
                let highest: i64 = tx
                    .query_one(
                        "SELECT token FROM incumbent_leases WHERE election = $1",
                        &[&self.election],
                    )
                    .await
                    .map_err(|e| store(&e))?
                    .get(0);
                let highest = u64::try_from(highest).unwrap_or(0);
                return Err(SaveError::Stale {
                    ours: token,
                    highest,
                });
            }
            Err(e) => return Err(store(&e)),
        }
        let row = tx
            .query_opt(
                "SELECT record FROM index_builder_checkpoints WHERE election = $1 FOR UPDATE",
                &[&self.election],
            )
            .await
            .map_err(|e| store(&e))?;
        let mut record = match row {
            Some(row) => serde_json::from_str(row.get(0)).map_err(|e| store(&e))?,
            None => Record::default(),
        };
        fence(&mut record, token, change)?;
        let json = serde_json::to_string(&record).map_err(|e| store(&e))?;
        tx.execute(
            "INSERT INTO index_builder_checkpoints VALUES ($1, $2) \
             ON CONFLICT (election) DO UPDATE SET record = EXCLUDED.record",
            &[&self.election, &json],
        )
        .await
        .map_err(|e| store(&e))?;
        tx.commit().await.map_err(|e| store(&e))
    }
}

/// The store a run uses: in Consul with a `consul://` backend, in PostgreSQL with a
/// `postgres://` one, else in a shared directory.
enum Store {
    File(FileCheckpoints),
    #[cfg(feature = "consul")]
    Consul(ConsulCheckpoints),
    #[cfg(feature = "postgres")]
    Postgres(PostgresCheckpoints),
}

async fn open_store(url: &BackendUrl, dir: &Path, election: &str) -> Result<Store, BoxError> {
    match url {
        #[cfg(feature = "postgres")]
        BackendUrl::Postgres { .. } => Ok(Store::Postgres(
            PostgresCheckpoints::new(url, election).await?,
        )),
        #[cfg(feature = "consul")]
        BackendUrl::Consul { address, prefix } => {
            let prefix = prefix
                .as_deref()
                .unwrap_or(incumbent::consul::DEFAULT_PREFIX);
            let key = format!("{prefix}{election}.checkpoint");
            Ok(Store::Consul(ConsulCheckpoints::new(address, key)?))
        }
        _ => Ok(Store::File(FileCheckpoints::new(dir, election))),
    }
}

impl Store {
    /// Where the record lives, for the timeline.
    fn location(&self) -> String {
        match self {
            Store::File(s) => format!("the file {} (flock)", s.path.display()),
            #[cfg(feature = "consul")]
            Store::Consul(s) => format!("the Consul key {} (cas)", s.key),
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => format!(
                "a row of index_builder_checkpoints (guarded by the lease of {})",
                s.election
            ),
        }
    }

    /// Removes the record once the demo is over (and, in Consul, the election's key: each
    /// run uses an election of its own).
    async fn remove(&self) {
        match self {
            Store::File(s) => {
                let _ = std::fs::remove_file(&s.path);
                let _ = std::fs::remove_file(&s.lock);
            }
            #[cfg(feature = "consul")]
            Store::Consul(s) => {
                let _ = s.client.kv_delete(&s.key, None).await;
                if let Some(election_key) = s.key.strip_suffix(".checkpoint") {
                    let _ = s.client.kv_delete(election_key, None).await;
                }
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => {
                let client = s.client.lock().await;
                let _ = client
                    .execute(
                        "DELETE FROM index_builder_checkpoints WHERE election = $1",
                        &[&s.election],
                    )
                    .await;
            }
        }
    }
}

impl Checkpoints for Store {
    async fn read(&self) -> Result<Record, String> {
        match self {
            Store::File(s) => s.read().await,
            #[cfg(feature = "consul")]
            Store::Consul(s) => s.read().await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.read().await,
        }
    }

    async fn write(
        &self,
        token: u64,
        change: impl Fn(&mut Record) + Send + Sync + 'static,
    ) -> Result<(), SaveError> {
        match self {
            Store::File(s) => s.write(token, change).await,
            #[cfg(feature = "consul")]
            Store::Consul(s) => s.write(token, change).await,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.write(token, change).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One instance of the service
// ---------------------------------------------------------------------------------------------

/// The simulated work: indexes chunk `chunk` into the running digest `partial` (FNV-1a over
/// the chunk's "documents"). A build resumed from a checkpoint ends with the same digest as
/// a build from scratch.
fn index_chunk(partial: u64, chunk: u32) -> u64 {
    let documents = format!("documents {} to {}", chunk * 100, chunk * 100 + 99);
    documents.bytes().fold(partial, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The digest of an empty index.
const EMPTY_INDEX: u64 = 0xcbf2_9ce4_8422_2325;

fn report(line: Value) {
    println!("{line}");
}

/// Runs one instance of the service, as `index_builder candidate ...` (started by the demo).
async fn instance(name: &str, election: &str, url: &str, dir: &str) -> Result<(), BoxError> {
    let url: BackendUrl = url.parse()?;
    let store = open_store(&url, Path::new(dir), election).await?;
    let instance = Instance {
        name: name.to_owned(),
        election: election.to_owned(),
        store,
    };
    url.connect(instance).await?
}

/// One instance: campaigns, builds while it leads, reads the published index while it follows.
struct Instance {
    name: String,
    election: String,
    store: Store,
}

impl WithBackend for Instance {
    type Output = Result<(), BoxError>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let ttl = TTL.max(backend.info().min_ttl);
        let election = Election::builder(backend, &self.election)
            .candidate(&self.name)
            .metadata("pid", std::process::id().to_string())
            // 3 s, or the store's smallest (Consul's is 10 s).
            .ttl(ttl)
            .lock_delay(Duration::ZERO) // no extra wait after a leader dies (Consul)
            .grace(Duration::from_secs(2))
            .build()?;
        let store = Arc::new(self.store);
        let mut campaign = election.campaign();
        tokio::spawn(follow(store.clone(), campaign.status()));
        let mut stdin = BufReader::new(tokio::io::stdin()).lines();
        loop {
            tokio::select! {
                event = campaign.recv() => match event {
                    Some(LeadershipEvent::Elected(term)) => {
                        report(json!({"event": "elected", "token": term.fencing_token()}));
                        tokio::spawn(build(term, store.clone()));
                    }
                    Some(LeadershipEvent::Demoted { fencing_token, reason, .. }) => {
                        report(json!({"event": "demoted", "token": fencing_token, "reason": reason.as_str()}));
                    }
                    Some(LeadershipEvent::LeaderChanged(_)) => {}
                    None => return Ok(()),
                },
                line = stdin.next_line() => match line? {
                    Some(_) => {}
                    None => return Ok(campaign.shutdown().await?),
                },
            }
        }
    }
}

/// The leader's job: resume from the checkpoint, index the remaining chunks, publish.
async fn build<C: Checkpoints>(term: Term, store: Arc<C>) {
    let _guard = term.hold(); // the lock is released only after this returns
    let token = term.fencing_token();

    // Where did the last leader get to? Then stamp the checkpoint with our token at once:
    // from here on, the store refuses every write from an older term.
    let Some(start) = retry(&term, || store.load()).await else {
        return;
    };
    let (mut chunk, mut partial) = start
        .as_ref()
        .map_or((0, EMPTY_INDEX), |c| (c.chunk, c.partial));
    let claim = Checkpoint {
        token,
        chunk,
        partial,
    };
    if !fenced(&term, || store.save(claim.clone())).await {
        return;
    }
    report(json!({
        "event": "start", "token": token, "from": chunk,
        "checkpoint_token": start.map(|c| c.token),
    }));

    while chunk < CHUNKS {
        tokio::select! {
            biased;
            () = term.cancelled() => return, // leadership lost: stop at once
            () = sleep(CHUNK_TIME) => {}     // the simulated work of one chunk
        }
        let next = Checkpoint {
            token,
            chunk: chunk + 1,
            partial: index_chunk(partial, chunk),
        };
        if !fenced(&term, || store.save(next.clone())).await {
            return;
        }
        (chunk, partial) = (next.chunk, next.partial);
        report(json!({"event": "chunk", "token": token, "chunk": chunk}));
    }

    let index = Published {
        token,
        digest: format!("{partial:016x}"),
    };
    if fenced(&term, || store.publish(index.clone())).await {
        report(json!({"event": "published", "token": token, "digest": index.digest}));
    }
    term.cancelled().await; // nothing more to do: lead until shut down
}

/// Runs a fenced write, retrying store errors while the term lasts. `false`: stop working
/// (the term ended, or the store refused our token).
async fn fenced<F, Fut>(term: &Term, write: F) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), SaveError>>,
{
    let outcome = retry(term, || async {
        match write().await {
            Err(SaveError::Store(e)) => Err(e),
            other => Ok(other),
        }
    })
    .await;
    match outcome {
        Some(Ok(())) => true,
        Some(Err(refused)) => {
            report(
                json!({"event": "fenced", "token": term.fencing_token(), "error": refused.to_string()}),
            );
            false
        }
        None => false,
    }
}

/// Runs `op` until it succeeds, every half second while the term lasts (`None`: it ended).
async fn retry<T, F, Fut>(term: &Term, op: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    loop {
        match op().await {
            Ok(value) => return Some(value),
            Err(e) => report(json!({"event": "error", "error": e})),
        }
        tokio::select! {
            () = term.cancelled() => return None,
            () = sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Every instance looks for a published index; while it follows, it reads each new one.
async fn follow<C: Checkpoints>(store: Arc<C>, status: watch::Receiver<Status>) {
    let mut read = None;
    loop {
        sleep(READ_INTERVAL).await;
        if status.borrow().is_leader() {
            continue;
        }
        if let Ok(Some(index)) = store.published().await
            && read != Some(index.token)
        {
            read = Some(index.token);
            report(json!({"event": "read", "token": index.token, "digest": index.digest}));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The demo: start the instances, kill the leader mid-build, replay a stale write, watch
// ---------------------------------------------------------------------------------------------

/// Checks the URL, picks the directories, and runs the demo with a time limit.
async fn run_demo(url: &str) -> Result<(), BoxError> {
    let mut url: BackendUrl = url.parse()?;
    let election = format!("index-builder-{}", std::process::id());
    let temp = std::env::temp_dir().join(format!("incumbent-{election}"));
    let dir = match &url {
        BackendUrl::Memory => {
            return Err("memory: lives in one process; this demo runs several".into());
        }
        BackendUrl::File { dir: Some(dir) } => dir.clone(),
        BackendUrl::File { dir: None } => {
            url = BackendUrl::File {
                dir: Some(temp.clone()),
            };
            temp.clone()
        }
        _ => temp.clone(), // elections elsewhere, checkpoints here (or in Consul)
    };
    let backend = url.connect(BackendName).await?; // fails early on a missing feature
    std::fs::create_dir_all(&dir)?;
    let store = open_store(&url, &dir, &election).await?;
    let location = store.location();
    let run = demo(&url, backend, &election, &dir, &location, &store);
    let outcome = match timeout(DEMO_LIMIT, run).await {
        Ok(outcome) => outcome,
        Err(_) => Err("the demo did not finish in time".into()),
    };
    store.remove().await;
    let _ = std::fs::remove_dir_all(&temp);
    outcome
}

struct BackendName;

impl WithBackend for BackendName {
    type Output = &'static str;

    async fn call<B: Backend>(self, backend: B) -> &'static str {
        backend.info().name
    }
}

/// The leader that was killed: its term, and how far it had got.
struct Killed {
    name: &'static str,
    token: u64,
    chunk: u32,
    at: Instant,
}

async fn demo<C: Checkpoints>(
    url: &BackendUrl,
    backend: &str,
    election: &str,
    dir: &Path,
    location: &str,
    store: &C,
) -> Result<(), BoxError> {
    let start = Instant::now();
    let args = [
        election.into(),
        url.to_string().into(),
        dir.as_os_str().to_owned(),
    ];
    let (mut nodes, mut events) = cluster::spawn(&INSTANCES, &args)?;
    println!(
        "{} instances elect on {url}; the checkpoint lives in {location}\n",
        INSTANCES.len()
    );

    let say = |what: String| println!("[{:>7.3}s] {what}", start.elapsed().as_secs_f64());
    let scratch = format!("{:016x}", (0..CHUNKS).fold(EMPTY_INDEX, index_chunk));
    let mut first: Option<u64> = None;
    let mut leader: Option<&'static str> = None;
    let mut killed: Option<Killed> = None;
    let mut resumed_from: Option<u64> = None;
    let mut stale_rejected: Option<bool> = None;
    let mut published: Option<(u64, String)> = None;
    let mut readers: Vec<(&'static str, u64)> = Vec::new();

    while let Some((name, event)) = events.recv().await {
        let token = event["token"].as_u64().unwrap_or(0);
        match event["event"].as_str() {
            Some("elected") => {
                say(format!("{name} is elected leader (fencing token {token})"));
                first.get_or_insert(token);
                leader = Some(name);
                if let Some(k) = &killed
                    && token > k.token
                {
                    say(format!(
                        "failover after kill -9 took {} ms",
                        k.at.elapsed().as_millis()
                    ));
                }
            }
            Some("demoted") => say(format!(
                "{name} stepped down from term {token} ({})",
                event["reason"].as_str().unwrap_or("?")
            )),
            Some("start") => {
                let from = event["from"].as_u64().unwrap_or(0);
                match event["checkpoint_token"].as_u64() {
                    None => say(format!(
                        "{name} finds no checkpoint: builds from chunk 0 under token {token}"
                    )),
                    Some(previous) => say(format!(
                        "{name} RESUMES from chunk {from} (checkpointed under token {previous}), \
                         and stamps the checkpoint with its token {token}"
                    )),
                }
                // The killed leader's term comes back from the dead: it replays a write.
                if let Some(k) = &killed
                    && resumed_from.is_none()
                {
                    resumed_from = Some(from);
                    say(format!(
                        "zombie: a write from {}'s dead term (token {}) tries to checkpoint chunk {}",
                        k.name,
                        k.token,
                        k.chunk + 1
                    ));
                    let zombie = Checkpoint {
                        token: k.token,
                        chunk: k.chunk + 1,
                        partial: 0,
                    };
                    match store.save(zombie).await {
                        Err(SaveError::Stale { ours, highest }) => {
                            say(format!(
                                "stale write REJECTED: token {ours} < {highest}, the highest the store has seen"
                            ));
                            stale_rejected = Some(true);
                        }
                        Ok(()) => {
                            say("stale write ACCEPTED: fencing failed".into());
                            stale_rejected = Some(false);
                        }
                        Err(e) => return Err(e.to_string().into()),
                    }
                }
            }
            Some("chunk") => {
                let chunk = event["chunk"].as_u64().unwrap_or(0) as u32;
                say(format!(
                    "{name} indexed chunk {chunk}/{CHUNKS}, checkpointed under token {token}"
                ));
                if killed.is_none() && chunk == KILL_AFTER {
                    say(format!(
                        "kill -9 {name}, the leader, in the middle of the build ({})",
                        failover_note(backend)
                    ));
                    let index = nodes
                        .iter()
                        .position(|n| n.name == name)
                        .ok_or("unknown node")?;
                    let mut node = nodes.remove(index);
                    node.child.start_kill()?;
                    killed = Some(Killed {
                        name,
                        token,
                        chunk,
                        at: Instant::now(),
                    });
                    node.child.wait().await?;
                }
            }
            Some("published") => {
                let digest = event["digest"].as_str().unwrap_or("?").to_owned();
                let same = if digest == scratch {
                    "the same"
                } else {
                    "NOT the same"
                };
                say(format!(
                    "{name} publishes the index under token {token}: digest {digest}, \
                     {same} as a build from scratch"
                ));
                published = Some((token, digest));
            }
            Some("read") => {
                say(format!("{name} read index built under token {token}"));
                readers.push((name, token));
            }
            Some("fenced") | Some("error") => say(format!(
                "{name}: {}",
                event["error"].as_str().unwrap_or("?")
            )),
            _ => {}
        }
        // Done when every follower has read the published index.
        if let Some((token, _)) = &published {
            let mut followers = nodes.iter().filter(|n| Some(n.name) != leader);
            if followers.all(|n| readers.contains(&(n.name, *token))) {
                break;
            }
        }
    }

    say("shutting down: every instance releases and exits".into());
    for node in &mut nodes {
        node.stdin = None; // closing stdin asks for a graceful shutdown
    }
    for node in &mut nodes {
        let _ = timeout(Duration::from_secs(5), node.child.wait()).await;
    }

    let (published_token, digest) = published.ok_or("nothing was published")?;
    let readers: Vec<&str> = readers
        .iter()
        .filter(|(_, t)| *t == published_token)
        .map(|(name, _)| *name)
        .collect();
    let summary = json!({
        "first_token": first,
        "killed": killed.as_ref().map(|k| k.name),
        "killed_token": killed.as_ref().map(|k| k.token),
        "killed_after_chunk": killed.as_ref().map(|k| k.chunk),
        "resumed_from": resumed_from,
        "stale_write_rejected": stale_rejected,
        "published_token": published_token,
        "digest_matches_scratch": digest == scratch,
        "readers": readers,
    });
    println!("\nsummary {summary}");
    Ok(())
}

/// How the backend notices a leader that died without a word.
fn failover_note(backend: &str) -> &'static str {
    match backend {
        "file" => "the kernel releases a dead process's flock at once",
        "consul" => "Consul frees the lock when the session's ttl runs out: 10 to 20 s",
        "postgres" => "PostgreSQL's lease row runs out a ttl (3 s) after the last renewal",
        _ => "the store frees the lock when the leader's session expires",
    }
}
