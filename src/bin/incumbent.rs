//! `incumbent`: run any command as a singleton, and see who leads.
//!
//! ```text
//! incumbent run     [--backend URL] --election NAME [--id ID] [--meta KEY=VALUE]…
//!                   [--ttl DUR] [--lock-delay DUR] [--grace DUR] [--exit-with-child]
//!                   [--fail-after DUR] [--pass-credentials] -- CMD [ARG]…
//! incumbent status  [--backend URL] --election NAME [--json] [--timeout DUR]
//! incumbent observe [--backend URL] --election NAME [--json] [--fail-after DUR]
//!                    [--shards N [--max-members M]]
//! incumbent resign  [--backend URL] --election NAME [--timeout DUR] [--yield DUR]
//! incumbent switchover [--backend URL] --election NAME --to ID [--window DUR] [--timeout DUR]
//! global options:   [--log-format text|json] [--quiet]
//! ```
//!
//! `run` campaigns for the election and runs `CMD` only while this process leads. The command
//! is started in a process group of its own, with its standard input closed. When the term
//! ends, the group gets SIGTERM at once, before anything is logged, and SIGKILL:
//! - after a voluntary end (SIGINT / SIGTERM / SIGHUP, SIGUSR1, the command's own exit), after
//!   `--grace`; the lock is kept (and renewed) until the command is gone, then released;
//! - after an involuntary loss (no renewal confirmed within the renew deadline, the session
//!   or the lock lost), at `--grace` or at the term's stop-by instant, whichever comes first:
//!   the last confirmed renewal's send time + ttl − ttl/10, or at once when the store has
//!   already taken the lock. From then on the store may hand the lock to another candidate,
//!   so on a missed renew deadline the command has 0.9 × ttl − renew deadline to stop, and a
//!   longer `--grace` is cut short. A watchdog thread, independent of the async runtime, kills the
//!   group at that instant even if the supervisor itself is stuck, and, while the term lasts
//!   and while the command is being stopped after a voluntary end, at "last confirmed
//!   renewal + ttl − ttl/10", pushed forward with each renewal. It stays armed until the
//!   command has exited: if the supervisor gets stuck during a voluntary stop, the renewals
//!   stop and a command that ignores SIGTERM is killed before the lease can expire, not when
//!   `--grace` ends.
//!
//! A second SIGINT / SIGTERM while stopping kills the group at once and exits within a second,
//! released or not. SIGHUP counts as SIGTERM.
//! When the command exits while leader, whatever is left of its process group is killed, and
//! this process resigns and campaigns again (the command runs again when it is re-elected;
//! after exits within 10 s of the start, only after a delay of 1 s, doubling up to 30 s, so
//! that a crashing command never runs in a hot loop), or with `--exit-with-child` releases
//! the lock and exits with the command's status. If this process dies, even by `kill -9`,
//! a guardian process it forked at start SIGKILLs the command's whole process group (and a
//! file lock is released at once); processes that leave the group (`setsid`, daemonizing)
//! are not covered: `exec` the worker from wrapper scripts.
//!
//! What no supervisor can prevent: when this whole process is frozen (a paused VM, SIGSTOP of
//! `incumbent`, a host swapping to a halt), nothing runs to stop the command, the lease
//! expires, and another candidate leads while the old command may still act once the host
//! thaws. Fencing tokens are the defence: pass `INCUMBENT_FENCING_TOKEN` with every write, and
//! have the store that receives the writes reject a token lower than the highest it has seen.
//!
//! Status lines and the library's log lines go to stderr through a bounded queue written by a
//! thread of its own: leading never waits on stderr. When nobody reads stderr fast enough,
//! lines are dropped and counted ("N log line(s) dropped"); a closed stderr is ignored.
//!
//! The command's environment gets `INCUMBENT_ELECTION`, `INCUMBENT_CANDIDATE` (this
//! candidate's id), `INCUMBENT_FENCING_TOKEN` (pass it with every write, so that stale leaders
//! are rejected) and `INCUMBENT_TERM_STARTED` (RFC 3339, UTC, with milliseconds). It does not
//! get the store's credentials (`INCUMBENT_ETCD_USER`, `INCUMBENT_ETCD_PASSWORD`,
//! `CONSUL_HTTP_TOKEN`, `CONSUL_HTTP_AUTH`, `ETCDCTL_USER`, `ETCDCTL_PASSWORD`, …) unless
//! `--pass-credentials` is given.
//! The candidate publishes `host` and `pid` in its metadata, with `resign=SIGUSR1`: SIGUSR1
//! makes it resign (the term ends, the command is stopped, the lock released, and it campaigns
//! again), which is what `incumbent resign`, run on the leader's host, sends, but only after
//! checking that the pid is an `incumbent run` of this election on this backend that was
//! started before the term began (Linux), since anyone who can write the store chooses it.
//! With `--yield DUR`, the signal carries DUR in milliseconds as its queued value
//! (`sigqueue`, through the pidfd): the leader resigns and does not campaign again for that
//! long (`CampaignHandle::resign_for`), so another candidate leads meanwhile.
//!
//! The backend comes from `--backend` or `INCUMBENT_BACKEND` (default `file:`, the default lock
//! directory): see `incumbent::url`. Credentials come only from the environment.
//! Failing fast or retrying is one rule for every backend: a permanent error (a lock
//! directory that cannot be made, credentials the store refuses, an invalid configuration)
//! ends the program at once with exit code 2 (`run` opens one session and reads the leader
//! once before campaigning, to find them); a store that cannot be reached (connection refused,
//! a host name that does not resolve, no answer in time) is retried with back-off, until
//! `--fail-after` (`run`, `observe`; default: for ever) or `--timeout` (`status`, `resign`),
//! then exit code 1, however long one attempt to connect would take.
//! Durations are written like `500ms`, `10s`, `2m`, `1h`, `1m30s` or `1h 30min` (see the
//! `humantime` crate), at most a year; a longer one is a usage error (exit code 2).
//!
//! Exit codes:
//! - `0`: success: `run` shut down gracefully (SIGINT, SIGTERM or SIGHUP); `status` printed
//!   the leader, or that nobody leads; `observe` was interrupted; `resign` saw the leader go;
//! - `1`: a run-time failure: the store could not be reached for longer than `--fail-after`
//!   (`run`, `observe`) or `--timeout` (`status`, `resign`), the command could not be started, the leader
//!   could not be asked to resign (or its pid did not check out), nobody leads; `run` ended
//!   by a second signal before the lock was released;
//! - `2`: a usage or configuration error: bad options, a malformed backend URL, a backend not
//!   compiled in, an invalid election name or timing, a command not found, a lock directory
//!   that cannot be made, credentials the store refuses;
//! - `3` (`switchover`): refused, nothing moved: the target is not a live candidate, another
//!   hand-over is under way (or moved leadership first), nobody leads;
//! - `4` (`switchover`): not finished: the target did not take office within the window (the
//!   reservation lapsed, an open election followed), or it did not lead within `--timeout`;
//!   the message says what was seen last;
//! - with `--exit-with-child`: the command's own exit status (128 + N if signal N killed it).
//!
//! `switchover --to ID` moves leadership to the candidate ID (`run --id ID`) from any host:
//! the request goes through the store (the election's request lock) to the leader, which
//! checks that ID is a live candidate, stops its command as for a resign, and keeps the next
//! term for ID for `--window` (default: the leader's `--hand-over-window`, its ttl); see
//! `incumbent::switchover`. `run --priority N` makes a preferred candidate: after following a
//! leader of lower priority for `--settle`, it asks for the lead the same way.

// This file is the crate root of the binary: its modules live in `src/bin/incumbent/`.
#[path = "incumbent/duration.rs"]
mod duration;
#[path = "incumbent/inspect.rs"]
mod inspect;
#[path = "incumbent/log.rs"]
mod log;
#[path = "incumbent/messages.rs"]
mod messages;
#[path = "incumbent/process.rs"]
mod process;
#[path = "incumbent/report.rs"]
mod report;
#[path = "incumbent/retry.rs"]
mod retry;
#[path = "incumbent/run.rs"]
mod run;
#[path = "incumbent/watchdog.rs"]
mod watchdog;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};
use incumbent::url::{BackendUrl, TlsFiles};
use tokio::time::Instant;

use crate::report::{LogFormat, Reporter};

/// Every environment variable this program reads, for `--help`.
macro_rules! environment {
    () => {
        "\
Environment (credentials come only from here, never from flags or the backend URL: a flag's \
value shows in `ps`, in /proc and in shell histories; `run` removes them from the command's \
environment unless --pass-credentials):
  INCUMBENT_BACKEND         the backend URL when --backend is not given
  RUST_LOG                  which library log lines to write (default: warn; with --quiet: error)
  PATH                      where `run` looks for CMD when it has no '/'
  ETCDCTL_ENDPOINTS         etcd: the endpoints of --backend etcd: (or etcd:///prefix), e.g. \
https://10.0.0.1:2379,https://10.0.0.2:2379 [default: http://127.0.0.1:2379]
  ETCDCTL_USER              etcd: user:password (as etcdctl --user), or the user name
  ETCDCTL_PASSWORD          etcd: the password of ETCDCTL_USER
  INCUMBENT_ETCD_USER       etcd: the user name; when set, wins over ETCDCTL_USER
  INCUMBENT_ETCD_PASSWORD   etcd: the password of INCUMBENT_ETCD_USER
  ETCDCTL_CACERT            etcd over TLS: the CA certificate file, unless --ca-file
  ETCDCTL_CERT              etcd over TLS: the client certificate file, unless --cert-file
  ETCDCTL_KEY               etcd over TLS: the client key file, unless --key-file
  CONSUL_HTTP_ADDR          Consul: the agent of --backend consul: (or consul:///prefix), \
host:port or https://host:port [default: http://127.0.0.1:8500]
  CONSUL_HTTP_SSL           Consul: true makes a CONSUL_HTTP_ADDR without a scheme https://
  CONSUL_HTTP_TOKEN         Consul: the ACL token
  CONSUL_HTTP_TOKEN_FILE    Consul: a file holding the ACL token; wins over CONSUL_HTTP_TOKEN
  CONSUL_CACERT             Consul over HTTPS: the CA certificate file, unless --ca-file
  CONSUL_CLIENT_CERT        Consul over HTTPS: the client certificate file, unless --cert-file
  CONSUL_CLIENT_KEY         Consul over HTTPS: the client key file, unless --key-file
  INCUMBENT_ZK_AUTH         ZooKeeper: user:password for the digest scheme
  INCUMBENT_REDIS_USER      Redis: the ACL user name
  INCUMBENT_REDIS_PASSWORD  Redis: the password; when set, wins over REDISCLI_AUTH
  REDISCLI_AUTH             Redis: the password, as redis-cli reads it
  INCUMBENT_REDIS_CA_FILE   Redis over TLS (rediss://): the CA certificates (PEM) to trust
  PGHOST, PGPORT            PostgreSQL: the hosts (comma-separated) and port of --backend postgres:
  PGDATABASE                PostgreSQL: the database when the URL names none [default: the user]
  PGUSER                    PostgreSQL: the user [default: the OS user]
  PGPASSWORD                PostgreSQL: the password
  PGPASSFILE                PostgreSQL: the password file, when PGPASSWORD is unset [default: ~/.pgpass]
  PGSSLMODE                 PostgreSQL: require, verify-ca or verify-full turn TLS on (the \
certificate and host name always checked)
  PGSSLROOTCERT             PostgreSQL over TLS: the CA certificate file, unless --ca-file
  PGSSLCERT, PGSSLKEY       PostgreSQL over TLS: the client certificate and key, unless \
--cert-file and --key-file
  INCUMBENT_PG_TABLE        PostgreSQL: the lease table [default: incumbent_leases]
  INCUMBENT_PG_LISTEN       PostgreSQL: off behind a transaction pooler (PgBouncer), where \
LISTEN cannot work: followers poll
  INCUMBENT_POLL_INTERVAL   Redis, memcached, PostgreSQL: how often followers poll (e.g. \
100ms) [default: 500ms]; a hand-off takes about half of it, each poll is one request
  KUBECONFIG                Kubernetes: the kubeconfig (its current context and namespace); \
in a pod without one, the service account

Precedence: a flag wins over the backend URL, which wins over the environment. --ca-file, \
--cert-file and --key-file win over ETCDCTL_CACERT/CERT/KEY, CONSUL_CACERT/CLIENT_CERT/\
CLIENT_KEY and PGSSLROOTCERT/PGSSLCERT/PGSSLKEY (and turn TLS on for postgres://); a URL with a host (etcd://host:port) wins over ETCDCTL_ENDPOINTS and \
CONSUL_HTTP_ADDR, which only etcd: and consul: read. TLS is on for etcd+https:// and \
consul+https:// (and https:// addresses in those variables); a plain-HTTP URL ignores the \
TLS variables and refuses the TLS flags. A certificate that does not check out is a \
configuration error (exit code 2), not retried."
    };
}

/// The rule for failing fast or retrying, and the exit codes, for `--help`.
macro_rules! failing_and_exit_codes {
    () => {
        "\
Failing fast or retrying, the same on every backend: a permanent error (bad options, a lock \
directory that cannot be made, credentials the store refuses, an invalid configuration) \
ends the program at once, with exit code 2; a store that cannot be reached (connection \
refused, a host name that does not resolve, no answer in time) is tried again with \
back-off: by `run` and `observe` until --fail-after (by default for ever), by `status` and \
`resign` until --timeout, however long one attempt to connect would take; then exit code 1. \
A name that does not resolve counts as unreachable, not permanent: DNS may be down, or the \
name not yet published.

Exit codes: 0 after a graceful shutdown (SIGINT, SIGTERM); 1 for run-time failures (the \
store unreachable for longer than --fail-after or --timeout); 2 for usage and configuration \
errors; with `run --exit-with-child`, the command's own status."
    };
}

/// Run a command only while this process leads an election; see who leads.
#[derive(Debug, Parser)]
#[command(
    name = "incumbent",
    version,
    propagate_version = true,
    after_help = concat!(environment!(), "\n\n", failing_and_exit_codes!())
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How to write status lines and errors on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Write only errors.
    #[arg(long, short, global = true)]
    quiet: bool,
}

const RUN_HELP: &str = concat!(
    environment!(),
    "\n\n",
    "\
The command's environment: INCUMBENT_ELECTION, INCUMBENT_CANDIDATE (this candidate's id), \
INCUMBENT_FENCING_TOKEN (greater for every new term: send it with every write), \
INCUMBENT_TERM_STARTED (RFC 3339, UTC, milliseconds). Its standard input is closed. The \
store's credentials (INCUMBENT_ETCD_USER, INCUMBENT_ETCD_PASSWORD, CONSUL_HTTP_TOKEN, \
CONSUL_HTTP_AUTH, ETCDCTL_USER, ETCDCTL_PASSWORD, ...) are removed from it, unless \
--pass-credentials.

--grace and the ttl: after a voluntary end (a signal, SIGUSR1, the command's exit) the \
command gets the whole --grace while the lock is kept and renewed; should this process's \
main thread get stuck meanwhile, the renewals stop and a watchdog thread kills the command \
before the lease can expire. After an involuntary loss (no renewal \
confirmed within the renew deadline, the session or the lock lost) the store may hand the \
lock on soon: the command gets SIGTERM at once and SIGKILL at --grace or at the last \
confirmed renewal's send time + ttl - ttl/10 (at once if the lock is already gone), \
whichever is sooner. So when the loss is a missed renew deadline, the command has \
0.9 x ttl - renew deadline to stop, whatever --grace says: a longer --grace only matters for \
voluntary ends. A watchdog thread kills it by then even if this process's main thread is \
stuck.

What no supervisor can prevent: if this whole process is frozen (a paused VM, SIGSTOP, a \
host thrashing), nothing stops the command while the lease expires and another candidate \
leads; the old command may act again when the host thaws. Fencing tokens are the defence: \
send INCUMBENT_FENCING_TOKEN with every write and have the receiving store reject tokens \
lower than the highest it has seen.

Status and log lines never hold anything up: they go to stderr through a bounded queue; \
when stderr is not read fast enough, lines are dropped and counted; a closed stderr is \
ignored.

When the command exits while leader, the rest of its process group is killed and this process \
resigns; it runs the command again when re-elected (after repeated exits within 10s, only \
after a delay of 1s doubling up to 30s). If this process dies, even by SIGKILL, the command is \
killed too (Linux).

Failing fast or retrying: before campaigning, `run` opens one session and reads the leader \
once. A permanent error there (a lock directory that cannot be made, credentials the store \
refuses, an invalid configuration) exits at once with code 2. A store that cannot be \
reached is retried with back-off, then and while campaigning; with --fail-after DUR, `run` \
gives up (exit code 1) once the store has failed for DUR in a row while this process does \
not lead (a leader's term ends by itself when its renewals fail: see above).

Exit codes: 0 after SIGINT or SIGTERM; 1 for run-time failures (the store unreachable for \
longer than --fail-after; after a second SIGINT or SIGTERM, when the lock could not be \
released within 1s); 2 for usage and configuration errors (including a bad lock directory \
or refused credentials); with --exit-with-child, the command's own status (128+N after \
signal N)."
);

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD only while this process leads the election.
    ///
    /// The command starts when this process is elected, in a process group of its own. When
    /// leadership ends, the group gets SIGTERM at once, then SIGKILL after --grace (after an
    /// involuntary loss: sooner if the lease could expire sooner), and only then is the lock
    /// released. SIGINT, SIGTERM or SIGHUP stop the command the same way, release the lock
    /// and exit 0 (a second one kills the command at once and exits); SIGUSR1 makes this
    /// process resign and campaign again.
    #[command(after_long_help = RUN_HELP)]
    Run(RunArgs),
    /// Print the current leader of the election.
    Status(StatusArgs),
    /// Print the leader of the election each time it changes, until interrupted.
    Observe(ObserveArgs),
    /// Ask the leader (an `incumbent run` on this host) to step down, and wait until it has.
    ///
    /// The leader's pid is read from the store, so it is checked first: it must be an
    /// `incumbent run` of this election on this backend, started before its term (Linux);
    /// anything else is refused (exit 1) and nothing is signalled.
    Resign(ResignArgs),
    /// Hand leadership to the candidate ID, and wait until it leads.
    ///
    /// The target must be a live candidate of the election (else exit 3, nothing moved). The
    /// request goes through the store to the leader, from any host; the leader stops its
    /// command (as for a resign), keeps the next term for ID for --window, and ID takes
    /// over. Exit 0 once ID leads; 3 when refused (why is printed: ID is not a live
    /// candidate, another hand-over is under way, nobody leads); 4 when it did not finish
    /// within --timeout or ID did not take office within the window (the state it left is
    /// printed: an open election follows a lapsed window).
    Switchover(SwitchoverArgs),
}

#[derive(Debug, Args)]
struct Target {
    /// Where the election lives: file:///dir, file: (the default directory), memory:,
    /// etcd://host:port[,host:port…][/prefix], etcd+https://… (TLS), etcd: (endpoints from
    /// ETCDCTL_ENDPOINTS), consul://host:port[/prefix], consul+https://… (TLS), consul:
    /// (CONSUL_HTTP_ADDR), zk://host:port[,host:port…][/chroot], redis://host:port[/db] (rediss:// for TLS),
    /// memcached://host:port, postgres://host[:port][,host[:port]…][/dbname] (postgres: from
    /// PGHOST), k8s://[namespace] (a Lease per election; KUBECONFIG, else the pod's service
    /// account), kubernetes: (the service account only). Credentials come from the
    /// environment, never the URL.
    #[arg(
        long,
        env = "INCUMBENT_BACKEND",
        hide_env_values = true,
        default_value = "file:",
        value_name = "URL"
    )]
    backend: String,
    /// The election's name, e.g. jobs/index-builder.
    #[arg(long, value_name = "NAME")]
    election: String,
    /// The CA certificate (PEM) that signed the store's certificates, for etcd+https://,
    /// consul+https:// and postgres:// [default: ETCDCTL_CACERT, CONSUL_CACERT or
    /// PGSSLROOTCERT].
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// The client certificate (PEM), for an etcd with --client-cert-auth or a Consul agent
    /// with verify_incoming; with --key-file [default: ETCDCTL_CERT or CONSUL_CLIENT_CERT].
    #[arg(long, value_name = "FILE", requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM), a file: never a key as a flag's value
    /// [default: ETCDCTL_KEY or CONSUL_CLIENT_KEY].
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    key_file: Option<PathBuf>,
}

impl Target {
    /// The TLS files given as flags.
    fn tls(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca_file.clone(),
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// This candidate's identity, as others see it [default: host-pid-xxxx].
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// Metadata others can read with the leader (repeatable). `host`, `pid` and `resign` are
    /// set by incumbent.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = key_value)]
    metadata: Vec<(String, String)>,
    /// How long the store keeps the session without renewal [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    ttl: Option<Duration>,
    /// After a lost session, how long the store keeps the lock from everyone: Consul only, at
    /// most 60s (a longer one, or one on another backend, is an error) [default: Consul's,
    /// 15s].
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    lock_delay: Option<Duration>,
    /// How long the command gets to exit after SIGTERM before its group gets SIGKILL. After
    /// an involuntary loss, SIGKILL comes sooner if the lease could expire sooner (see below).
    #[arg(long, value_name = "DUR", value_parser = duration::parse, default_value = "10s")]
    grace: Duration,
    /// When the command exits while leader, release the lock and exit with its status
    /// (instead of resigning and running it again when re-elected).
    #[arg(long)]
    exit_with_child: bool,
    /// Give up (exit code 1) when the store has been unreachable this long in a row, while
    /// not leading [default: keep trying]. Permanent errors (a lock directory that cannot be
    /// made, refused credentials, an invalid configuration) end the program at once anyway.
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    fail_after: Option<Duration>,
    /// Make this a preferred candidate of this priority: once it has followed a leader of a
    /// lower one (0 without --priority) for --settle, it asks for a hand-over to itself
    /// (doubling --settle after each request that did not make it lead).
    #[arg(long, value_name = "N")]
    priority: Option<u32>,
    /// With --priority: how long to follow before asking for the lead.
    #[arg(long, value_name = "DUR", value_parser = duration::parse, default_value = "30s", requires = "priority")]
    settle: Duration,
    /// How long a hand-over by this candidate keeps the next term for its target before an
    /// open election follows [default: the ttl].
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    hand_over_window: Option<Duration>,
    /// Let the command inherit the store's credentials (INCUMBENT_ETCD_USER,
    /// INCUMBENT_ETCD_PASSWORD, CONSUL_HTTP_TOKEN, ETCDCTL_*, …), which it does not by default.
    #[arg(long)]
    pass_credentials: bool,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// How long to keep trying a store that cannot be reached (then exit code 1).
    #[arg(long, value_name = "DUR", value_parser = duration::parse, default_value = "10s")]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct ObserveArgs {
    #[command(flatten)]
    target: Target,
    /// Print one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Give up (exit code 1) when the store has been unreachable this long in a row
    /// [default: keep trying].
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    fail_after: Option<Duration>,
    /// The election is a sharded group of N shards (`ShardedElection`): show its map, the
    /// members and the shards each holds, at the start and at each change (read again every
    /// second).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    shards: Option<u32>,
    /// The group's number of member slots (its `max_members`), with --shards.
    #[arg(long, value_name = "M", default_value_t = 32, requires = "shards",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_members: u32,
}

#[derive(Debug, Args)]
struct ResignArgs {
    #[command(flatten)]
    target: Target,
    /// How long to wait for the leader to step down.
    #[arg(long, value_name = "DUR", value_parser = duration::parse, default_value = "10s")]
    timeout: Duration,
    /// Also keep the leader from campaigning again for this long (e.g. 5m), so that it
    /// cannot win straight back: another candidate leads meanwhile, and it follows again
    /// afterwards. At most 24h.
    #[arg(long = "yield", value_name = "DUR", value_parser = duration::parse)]
    yield_for: Option<Duration>,
}

#[derive(Debug, Args)]
struct SwitchoverArgs {
    #[command(flatten)]
    target: Target,
    /// The candidate to hand leadership to (its --id).
    #[arg(long, value_name = "ID")]
    to: String,
    /// How long the leader keeps the next term for ID before an open election follows
    /// [default: the leader's hand-over window, its ttl].
    #[arg(long, value_name = "DUR", value_parser = duration::parse)]
    window: Option<Duration>,
    /// How long to wait for ID to lead (then exit code 4).
    #[arg(long, value_name = "DUR", value_parser = duration::parse, default_value = "30s")]
    timeout: Duration,
}

/// Why the program failed, and so its exit code.
#[derive(Debug)]
pub enum Failure {
    /// Bad options or configuration: exit code 2.
    Usage(String),
    /// Anything else: exit code 1.
    Runtime(String),
    /// `switchover` was refused, nothing moved: exit code 3.
    Refused(String),
    /// `switchover` did not finish in time, or the target did not take office: exit code 4.
    Unfinished(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Runtime(_) => 1,
            Failure::Refused(_) => 3,
            Failure::Unfinished(_) => 4,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Usage(m)
            | Failure::Runtime(m)
            | Failure::Refused(m)
            | Failure::Unfinished(m) => m,
        }
    }
}

impl From<incumbent::Error> for Failure {
    fn from(error: incumbent::Error) -> Self {
        use incumbent::Error as E;
        if let E::Unavailable { .. } = &error {
            // The library's message promises a retry; this program gives up instead.
            return Failure::Runtime(retry::describe(&error));
        }
        // Configuration the operator must fix: options, the lock directory, the credentials.
        if matches!(
            error,
            E::InvalidElectionName { .. }
                | E::InvalidCandidate { .. }
                | E::InvalidTiming { .. }
                | E::InvalidConfig { .. }
                | E::Io { .. }
                | E::Unauthorized { .. }
                | E::ReadOnly { .. }
        ) {
            Failure::Usage(error.to_string())
        } else {
            Failure::Runtime(error.to_string())
        }
    }
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// The backend URL and the election name, checked before anything connects.
fn target(target: &Target) -> Result<(Store, String), Failure> {
    let url: BackendUrl = target.backend.parse()?;
    incumbent::config::validate_name(&target.election)?;
    log::set_election(&target.election);
    retry::name_store(&url);
    let store = Store {
        url,
        tls: target.tls(),
    };
    Ok((store, target.election.clone()))
}

/// Where the election lives: the backend URL and the TLS files given as flags.
struct Store {
    url: BackendUrl,
    tls: TlsFiles,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let out = Reporter::new(cli.log_format, cli.quiet);
    out.install_tracing();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            out.fatal(&format!("cannot start the async runtime: {e}"));
            log::flush(LAST_LINES_WAIT);
            return ExitCode::from(1);
        }
    };
    // Everything runs on this runtime, on the main thread, which lives as long as the process.
    let outcome = runtime.block_on(dispatch(cli.command, out.clone()));
    // Tasks still running (a follower blocked in `flock` on a blocking-pool thread, say) must
    // not hold the exit up: everything worth waiting for is done.
    runtime.shutdown_background();
    let code = match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            out.fatal(failure.message());
            ExitCode::from(failure.code())
        }
    };
    // The last lines, unless nobody reads stderr: then they are lost, not the exit.
    log::flush(LAST_LINES_WAIT);
    code
}

/// How long the program waits, when it exits, for its last log lines to be written.
const LAST_LINES_WAIT: Duration = Duration::from_millis(500);

/// Connects to the backend and runs `code`, retrying while the store cannot be reached (see
/// [`retry`]); the time spent counts from `since`.
async fn connect<V>(
    store: &Store,
    code: &V,
    patience: retry::Patience,
    since: Instant,
    out: &Reporter,
) -> Result<V::Output, Failure>
where
    V: incumbent::url::WithBackend + Clone,
{
    let limit = patience.fail_after.and_then(|d| since.checked_add(d));
    patience
        .run(since, out, || {
            let (connected, told) = tokio::sync::oneshot::channel();
            let code = Connected {
                code: code.clone(),
                connected,
            };
            let attempt = store.url.connect_with_tls(&store.tls, code);
            retry::until_connected(attempt, told, limit, store.url.backend_name())
        })
        .await
}

/// `code`, telling `connected` when it is handed the backend.
struct Connected<V> {
    code: V,
    connected: tokio::sync::oneshot::Sender<()>,
}

impl<V: incumbent::url::WithBackend> incumbent::url::WithBackend for Connected<V> {
    type Output = V::Output;

    async fn call<B: incumbent::backend::Backend>(self, backend: B) -> V::Output {
        let _ = self.connected.send(());
        self.code.call(backend).await
    }
}

/// Refuses, before connecting, a `--lock-delay` that the store cannot have (the library
/// refuses it too, once connected).
fn check_lock_delay(url: &BackendUrl, delay: Option<Duration>) -> Result<(), Failure> {
    let Some(delay) = delay.filter(|d| !d.is_zero()) else {
        return Ok(());
    };
    let backend = url.backend_name();
    match url.max_lock_delay() {
        None => Err(Failure::Usage(format!(
            "invalid timing: --lock-delay {}: {backend} has no lock-delay (Consul has one); \
             remove --lock-delay, or set it to 0s",
            report::human(delay)
        ))),
        Some(max) if delay > max => Err(Failure::Usage(format!(
            "invalid timing: --lock-delay {} is longer than {backend} allows ({}); set \
             --lock-delay to at most that",
            report::human(delay),
            report::human(max)
        ))),
        Some(_) => Ok(()),
    }
}

async fn dispatch(command: Command, out: Reporter) -> Result<u8, Failure> {
    let began = Instant::now();
    match command {
        Command::Run(args) => {
            let (url, election) = target(&args.target)?;
            check_lock_delay(&url.url, args.lock_delay)?;
            let program = process::resolve(&args.command).map_err(Failure::Usage)?;
            let run = run::Run {
                election,
                backend: url.url.to_string(),
                id: args.id,
                metadata: args.metadata,
                ttl: args.ttl,
                lock_delay: args.lock_delay,
                grace: args.grace,
                exit_with_child: args.exit_with_child,
                priority: args.priority.map(|level| (level, args.settle)),
                hand_over_window: args.hand_over_window,
                pass_credentials: args.pass_credentials,
                program,
                args: args.command.into_iter().skip(1).collect(),
                patience: retry::Patience {
                    fail_after: args.fail_after,
                    option: "--fail-after",
                },
                began,
                out: out.clone(),
            };
            connect(&url, &run, run.patience, began, &out).await?
        }
        Command::Status(args) => {
            let (url, election) = target(&args.target)?;
            let patience = retry::Patience {
                fail_after: Some(args.timeout),
                option: "--timeout",
            };
            let status = inspect::Status {
                query: inspect::Query {
                    election,
                    timeout: args.timeout,
                    began,
                    out: out.clone(),
                },
                json: args.json,
            };
            connect(&url, &status, patience, began, &out).await?
        }
        Command::Observe(args) => {
            let (url, election) = target(&args.target)?;
            let patience = retry::Patience {
                fail_after: args.fail_after,
                option: "--fail-after",
            };
            if let Some(shards) = args.shards {
                let observe = inspect::ObserveShards {
                    group: election,
                    shards,
                    slots: args.max_members,
                    json: args.json,
                    patience,
                    began,
                    out: out.clone(),
                };
                return connect(&url, &observe, patience, began, &out).await?;
            }
            let observe = inspect::Observe {
                election,
                json: args.json,
                patience,
                began,
                out: out.clone(),
            };
            connect(&url, &observe, patience, began, &out).await?
        }
        Command::Resign(args) => {
            let (url, election) = target(&args.target)?;
            let patience = retry::Patience {
                fail_after: Some(args.timeout),
                option: "--timeout",
            };
            let resign = inspect::Resign {
                query: inspect::Query {
                    election,
                    timeout: args.timeout,
                    began,
                    out: out.clone(),
                },
                backend: url.url.clone(),
                yield_for: args.yield_for,
            };
            if args.yield_for.is_some_and(|y| y > run::MAX_YIELD) {
                return Err(Failure::Usage(format!(
                    "--yield is at most {}",
                    humantime::format_duration(run::MAX_YIELD)
                )));
            }
            connect(&url, &resign, patience, began, &out).await?
        }
        Command::Switchover(args) => {
            let (url, election) = target(&args.target)?;
            let patience = retry::Patience {
                fail_after: Some(args.timeout),
                option: "--timeout",
            };
            let switchover = inspect::Switchover {
                query: inspect::Query {
                    election,
                    timeout: args.timeout,
                    began,
                    out: out.clone(),
                },
                to: args.to,
                window: args.window,
            };
            connect(&url, &switchover, patience, began, &out).await?
        }
    }
}

/// Prints a command-line error as one line and returns exit code 2 (help and version: 0).
fn usage_error(error: &clap::Error) -> ExitCode {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            return ExitCode::from(2);
        }
        _ => {}
    }
    // clap's message is the first paragraph (some list arguments on lines of their own);
    // usage and tips follow after a blank line.
    let rendered = error.render().to_string();
    let paragraph: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let joined = paragraph.join(" ");
    let message = joined.strip_prefix("error: ").unwrap_or(&joined);
    let running = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .is_some_and(|a| a == "run");
    let hint = match error.kind() {
        ErrorKind::MissingRequiredArgument if message.contains("<CMD>") => {
            "; give the command after `--`, as in: incumbent run --election NAME -- ./worker --flag"
        }
        ErrorKind::UnknownArgument if running => {
            "; put the command to run after `--`, as in: incumbent run --election NAME -- ./worker --flag"
        }
        _ => "; see incumbent --help",
    };
    // Not `eprintln!`, which panics when stderr is a closed pipe.
    let _ = writeln!(std::io::stderr(), "incumbent: {message}{hint}");
    ExitCode::from(2)
}
