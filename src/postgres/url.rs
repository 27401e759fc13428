//! PostgreSQL's URL form, `postgres[ql]://host[:port][,host[:port]…][/dbname]`, and its
//! settings from libpq's variables: `PGHOST`, `PGPORT`, `PGDATABASE`, `PGUSER`,
//! `PGPASSWORD`, `PGPASSFILE` (default `~/.pgpass`), `PGAPPNAME`, `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`; and incumbent's own `INCUMBENT_PG_TABLE` and
//! `INCUMBENT_PG_LISTEN`. See [`url`](crate::url).

use std::path::{Path, PathBuf};

use super::{NAME, PostgresBackend, PostgresBuilder, PostgresConfig, Tls};
use crate::secret::{CREDENTIALS_HINT, TlsFiles, bad, split_url, wrong_scheme};
use crate::{Error, Result};

/// The form, for messages.
pub(crate) const FORM: &str = "postgres://host[:port][,host[:port]][/dbname]";

/// `postgres:…`, after the scheme: the hosts (`host[:port]`, as given) and the database.
pub(crate) fn parse(shown: &str, rest: &str) -> Result<(Vec<String>, Option<String>)> {
    if rest.contains(['?', '#']) {
        return Err(bad(format!(
            "{shown:?}: '?' and '#' are not allowed (no query string, e.g. ?sslmode=… or \
             ?password=…): set PGSSLMODE, PGSSLROOTCERT and the other libpq variables \
             instead, and note that {CREDENTIALS_HINT}, PGPASSWORD or PGPASSFILE for \
             PostgreSQL"
        )));
    }
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (hosts, dbname) = match rest.split_once('/') {
        Some((hosts, db)) => (hosts, Some(db).filter(|d| !d.is_empty())),
        None => (rest, None),
    };
    if dbname.is_some_and(|d| d.contains('/')) {
        return Err(bad(format!("{shown:?}: write {FORM}")));
    }
    let hosts: Vec<String> = if hosts.is_empty() {
        Vec::new()
    } else {
        hosts.split(',').map(decode).collect()
    };
    for host in &hosts {
        split_port(host, None).map_err(|reason| bad(format!("{shown:?}: {reason}")))?;
    }
    Ok((hosts, dbname.map(decode)))
}

/// `%XX` escapes decoded (a Unix socket directory as a host: `%2Fvar%2Frun%2Fpostgresql`).
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `host[:port]` (or `[v6]:port`, or a socket directory) split, the port defaulting to
/// `default` or 5432.
fn split_port(host: &str, default: Option<u16>) -> std::result::Result<(String, u16), String> {
    let default = default.unwrap_or(5432);
    if host.starts_with('/') {
        return Ok((host.to_owned(), default));
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        match v6.split_once(']') {
            Some((name, "")) => (name, None),
            Some((name, port)) => match port.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return Err(format!("{host:?} is not [address]:port")),
            },
            None => return Err(format!("{host:?} is not [address]:port")),
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return Err(format!("{host:?} has no host name"));
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{host:?}: {port:?} is not a port"))?,
        None => default,
    };
    Ok((name.to_owned(), port))
}

impl PostgresBackend {
    /// A builder for the server a URL names (`postgres://host[:port][,host[:port]…][/dbname]`,
    /// or `postgresql://`; `postgres:` alone takes everything from the environment), with
    /// the user, password and TLS of the libpq variables, and the table and `LISTEN`
    /// setting of `INCUMBENT_PG_TABLE` and `INCUMBENT_PG_LISTEN` (`on` or `off`), as
    /// [`url`](crate::url) describes: set more with the builder, then
    /// [`connect`](PostgresBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL of another form (shown redacted), credentials or a
    /// query string in it, or a `PGSSLMODE` that asks for TLS without the `postgres-tls`
    /// feature.
    pub fn from_url(url: &str) -> Result<PostgresBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if !matches!(scheme, "postgres" | "postgresql") {
            return Err(wrong_scheme(&shown, FORM));
        }
        let (hosts, dbname) = parse(&shown, rest)?;
        builder(&hosts, dbname, &TlsFiles::default(), crate::secret::env)
    }
}

/// The builder for these hosts and database, with the TLS files of `tls` (each winning over
/// its libpq variable, and turning TLS on) and the settings of the environment read
/// through `var`.
pub(crate) fn builder(
    hosts: &[String],
    dbname: Option<String>,
    tls: &TlsFiles,
    var: impl Fn(&str) -> Option<String>,
) -> Result<PostgresBuilder> {
    let given = |name: &str| {
        let file = match name {
            "PGSSLROOTCERT" => &tls.ca,
            "PGSSLCERT" => &tls.cert,
            "PGSSLKEY" => &tls.key,
            "PGSSLMODE" if !tls.is_empty() => return Some("verify-full".to_owned()),
            _ => return var(name),
        };
        file.as_ref()
            .map(|path| path.display().to_string())
            .or_else(|| var(name))
    };
    let mut builder = PostgresBackend::builder(config(hosts, dbname, given)?);
    builder = builder.poll_interval_from(var(crate::backend::polled::POLL_INTERVAL_ENV), NAME)?;
    if let Some(table) = var("INCUMBENT_PG_TABLE") {
        builder = builder.table(table);
    }
    if let Some(listen) = var("INCUMBENT_PG_LISTEN") {
        builder = builder.listen(match listen.to_ascii_lowercase().as_str() {
            "on" | "true" | "1" | "yes" => true,
            "off" | "false" | "0" | "no" => false,
            _ => {
                return Err(Error::InvalidConfig {
                    backend: NAME,
                    reason: format!("INCUMBENT_PG_LISTEN={listen:?}: write on or off"),
                });
            }
        });
    }
    Ok(builder)
}

/// The connection settings: `hosts` (none: `PGHOST`, else `localhost`), `dbname` (none:
/// `PGDATABASE`, else the user), and the rest of the libpq variables read through `var`.
pub(crate) fn config(
    hosts: &[String],
    dbname: Option<String>,
    var: impl Fn(&str) -> Option<String>,
) -> Result<PostgresConfig> {
    let invalid = |reason: String| Error::InvalidConfig {
        backend: NAME,
        reason,
    };
    let hosts: Vec<String> = if hosts.is_empty() {
        match var("PGHOST") {
            Some(list) => list.split(',').map(str::to_owned).collect(),
            None => vec!["localhost".to_owned()],
        }
    } else {
        hosts.to_vec()
    };
    let default_port = match var("PGPORT") {
        Some(port) => Some(
            port.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| invalid(format!("PGPORT={port:?} is not a port")))?,
        ),
        None => None,
    };
    let mut pg = tokio_postgres::Config::new();
    let mut pairs = Vec::new();
    for host in &hosts {
        let (name, port) = split_port(host, default_port).map_err(invalid)?;
        if name.starts_with('/') {
            pg.host_path(&name);
        } else {
            pg.host(&name);
        }
        pg.port(port);
        pairs.push((name, port));
    }
    let user = var("PGUSER")
        .or_else(|| var("USER"))
        .or_else(|| var("LOGNAME"));
    let dbname = dbname
        .or_else(|| var("PGDATABASE"))
        .or_else(|| user.clone());
    if let Some(user) = &user {
        pg.user(user);
    }
    if let Some(db) = &dbname {
        pg.dbname(db);
    }
    if let Some(app) = var("PGAPPNAME") {
        pg.application_name(app);
    }
    let password = match var("PGPASSWORD") {
        Some(password) => Some(password),
        None => {
            let file = var("PGPASSFILE")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|home| Path::new(&home).join(".pgpass")));
            match file {
                Some(file) => pgpass(
                    &file,
                    &pairs,
                    dbname.as_deref().unwrap_or_default(),
                    user.as_deref().unwrap_or_default(),
                )?,
                None => None,
            }
        }
    };
    if let Some(password) = password {
        pg.password(password);
    }
    let tls = match var("PGSSLMODE").as_deref() {
        None | Some("disable" | "allow" | "prefer") => Tls::Off,
        Some("require" | "verify-ca" | "verify-full") => Tls::Verify {
            ca_file: var("PGSSLROOTCERT").map(PathBuf::from),
            client: match (var("PGSSLCERT"), var("PGSSLKEY")) {
                (Some(cert), Some(key)) => Some((cert.into(), key.into())),
                (None, None) => None,
                _ => {
                    return Err(invalid(
                        "set both PGSSLCERT and PGSSLKEY for a client certificate, or neither"
                            .into(),
                    ));
                }
            },
        },
        Some(other) => {
            return Err(invalid(format!(
                "PGSSLMODE={other:?}: write disable, require, verify-ca or verify-full"
            )));
        }
    };
    #[cfg(not(feature = "postgres-tls"))]
    if tls != Tls::Off {
        return Err(crate::secret::not_compiled("postgres-tls"));
    }
    Ok(PostgresConfig { pg, tls })
}

/// The password for the first of `hosts` that a line of the password file `file` matches
/// (`host:port:database:user:password`, `*` for any, `\:` and `\\` escaped), as libpq
/// reads it. A missing file is no password; a file that others may read is ignored with a
/// warning, as libpq does; one that cannot be read is an error.
fn pgpass(
    file: &Path,
    hosts: &[(String, u16)],
    dbname: &str,
    user: &str,
) -> Result<Option<String>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!("cannot read the password file {}: {error}", file.display()),
            });
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(file)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(file = %file.display(), "postgres: the password file has group or world access; ignoring it (chmod 0600 it), as libpq does");
            return Ok(None);
        }
    }
    for (host, port) in hosts {
        // libpq matches a Unix socket as `localhost`.
        let host = if host.starts_with('/') {
            "localhost"
        } else {
            host
        };
        let port = port.to_string();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let fields = fields(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                continue;
            };
            let matches = |field: &str, value: &str| field == "*" || field == value;
            if matches(h, host) && matches(p, &port) && matches(d, dbname) && matches(u, user) {
                return Ok(Some(password.clone()));
            }
        }
    }
    Ok(None)
}

/// The `:`-separated fields of a password file line, with `\` escapes undone.
fn fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next()
                    && let Some(field) = fields.last_mut()
                {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn urls_name_hosts_and_a_database() {
        let (hosts, db) = parse("x", "//a:5433,b/app").unwrap();
        assert_eq!(hosts, ["a:5433", "b"]);
        assert_eq!(db.as_deref(), Some("app"));
        let (hosts, db) = parse("x", "").unwrap();
        assert!(hosts.is_empty() && db.is_none());
        let (hosts, _) = parse("x", "//%2Ftmp%2Fpg").unwrap();
        assert_eq!(hosts, ["/tmp/pg"]);
        for bad in ["//a?sslmode=require", "//a:x/db", "//a/b/c", "//a#f"] {
            assert!(parse("x", bad).is_err(), "{bad}");
        }
        assert_eq!(split_port("[::1]:7", None).unwrap(), ("::1".into(), 7));
        assert_eq!(split_port("h", Some(6)).unwrap(), ("h".into(), 6));
    }

    #[test]
    fn the_environment_fills_in_the_rest() {
        let config = config(
            &[],
            None,
            vars(&[
                ("PGHOST", "db1,db2"),
                ("PGPORT", "6000"),
                ("PGUSER", "u"),
                ("PGPASSWORD", "pw"),
            ]),
        )
        .unwrap();
        assert_eq!(config.pg.get_ports(), [6000, 6000]);
        assert_eq!(config.pg.get_user(), Some("u"));
        assert_eq!(config.pg.get_dbname(), Some("u"));
        assert_eq!(config.pg.get_password(), Some(&b"pw"[..]));
        let shown = format!("{config:?}");
        assert!(!shown.contains("pw\""), "{shown}");
        assert!(config_err(&[("PGSSLMODE", "bogus")]).contains("PGSSLMODE"));
        assert!(config_err(&[("PGPORT", "x")]).contains("PGPORT"));
        assert!(config_err(&[("PGSSLMODE", "require"), ("PGSSLCERT", "c")]).contains("PGSSLKEY"));
    }

    #[test]
    fn tls_files_given_directly_win_over_the_variables_and_turn_tls_on() {
        let files = TlsFiles {
            ca: Some("/given/ca.pem".into()),
            ..TlsFiles::default()
        };
        let built = builder(
            &["h".into()],
            None,
            &files,
            vars(&[("PGSSLROOTCERT", "/env/ca.pem"), ("PGUSER", "u")]),
        );
        #[cfg(feature = "postgres-tls")]
        {
            let shown = format!("{:?}", built.expect("builder"));
            assert!(shown.contains("/given/ca.pem"), "{shown}");
            assert!(!shown.contains("/env/ca.pem"), "{shown}");
        }
        #[cfg(not(feature = "postgres-tls"))]
        assert!(built.is_err());
    }

    #[test]
    fn the_poll_interval_comes_from_the_environment() {
        let poll = |value: &str| {
            builder(
                &["h".into()],
                None,
                &TlsFiles::default(),
                vars(&[("PGUSER", "u"), ("INCUMBENT_POLL_INTERVAL", value)]),
            )
            .map(|b| b.poll_interval)
        };
        assert_eq!(
            poll("100ms").expect("ms"),
            std::time::Duration::from_millis(100)
        );
        assert_eq!(poll(" 2s ").expect("s"), std::time::Duration::from_secs(2));
        let err = poll("fast").unwrap_err().to_string();
        assert!(
            err.contains("INCUMBENT_POLL_INTERVAL") && err.contains("250ms"),
            "{err}"
        );
        let unset = builder(
            &["h".into()],
            None,
            &TlsFiles::default(),
            vars(&[("PGUSER", "u")]),
        )
        .expect("builder");
        assert_eq!(
            unset.poll_interval,
            crate::backend::polled::DEFAULT_POLL_INTERVAL
        );
    }

    fn config_err(pairs: &[(&str, &str)]) -> String {
        config(&["h".into()], None, vars(pairs))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_password_file_is_read_as_libpq_reads_it() {
        let dir = std::env::temp_dir().join(format!("incumbent-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:*:*:*:no\nh:5432:app:u:p\\:w\\\\d\n*:*:*:*:fallback\n",
        )
        .unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let hosts = [("h".to_owned(), 5432)];
        assert_eq!(
            pgpass(&file, &hosts, "app", "u").unwrap().as_deref(),
            Some("p:w\\d")
        );
        assert_eq!(
            pgpass(&file, &hosts, "x", "u").unwrap().as_deref(),
            Some("fallback")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            assert_eq!(pgpass(&file, &hosts, "app", "u").unwrap(), None);
        }
        assert_eq!(pgpass(&dir.join("none"), &hosts, "app", "u").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
