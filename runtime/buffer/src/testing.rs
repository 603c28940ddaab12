//! Throwaway PostgreSQL servers for tests (feature `test-support`; always on in this crate's own tests).
//!
//! [`PgServer::start`] runs `initdb` and `pg_ctl start` on a fresh temporary directory: trust authentication,
//! listening on 127.0.0.1 at a free port and on a unix socket inside the directory, durability switched off
//! (fsync, full-page writes) because the data dies with the test. Dropping the server stops it
//! (`pg_ctl stop -m immediate`) and removes the directory. [`PgServer::shared`] hands tests of one binary the
//! same server while any of them holds it; give each test its own buffer name (a schema of its own).
//!
//! The binaries are Debian's PostgreSQL packages': `initdb` on `PATH`, else the newest
//! `/usr/lib/postgresql/*/bin`. `cargo xtask setup` installs them. When they are missing, starting fails with an
//! error that says so: a test that needs PostgreSQL fails rather than being skipped. PostgreSQL refuses to run
//! as root, so as root the server runs as the `postgres` user (`runuser`), owning its directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, Weak};

/// Why a throwaway server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PgServerError {
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin: run \
         `cargo xtask setup` (it installs Debian's postgresql package)"
    )]
    Missing,
    #[error("cannot prepare the PostgreSQL test directory `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {output}")]
    Command { command: String, status: String, output: String },
}

/// A running throwaway server; stopped and deleted on drop.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    as_postgres: bool,
    port: u16,
    data: PathBuf,
    // Last field: removed after `drop` stopped the server.
    dir: tempfile::TempDir,
}

impl PgServer {
    /// Initialises and starts a server of its own.
    pub fn start() -> Result<PgServer, PgServerError> {
        let bin = server_binaries().ok_or(PgServerError::Missing)?;
        let dir = tempfile::Builder::new()
            .prefix("trinity-pg-")
            .tempdir()
            .map_err(|source| PgServerError::Io { path: std::env::temp_dir(), source })?;
        let io = |source| PgServerError::Io { path: dir.path().to_owned(), source };
        let as_postgres = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(dir.path()).map_err(io)?) == 0;
        if as_postgres {
            run(Command::new("chown").arg("postgres:postgres").arg(dir.path()))?;
        }
        let data = dir.path().join("data");
        let mut server = PgServer { bin, as_postgres, port: 0, data, dir };
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(&server.data).args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]);
        run(&mut initdb)?;
        // A port found free may be taken by another test before the server binds it; try again on another.
        let mut attempt = 0;
        loop {
            server.port = free_port().map_err(|source| PgServerError::Io { path: server.dir.path().into(), source })?;
            match server.pg_ctl_start() {
                Ok(()) => return Ok(server),
                Err(e) if attempt < 3 => {
                    tracing::debug!("throwaway PostgreSQL did not start on port {}: {e}", server.port);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The server the tests of this process share while any of them holds it (the last one to let go stops it).
    pub fn shared() -> Result<Arc<PgServer>, PgServerError> {
        static SHARED: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());
        // A test that panicked while starting the server poisons the lock; the `Weak` inside is still valid.
        let mut shared = SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(server) = shared.upgrade() {
            return Ok(server);
        }
        let server = Arc::new(PgServer::start()?);
        *shared = Arc::downgrade(&server);
        Ok(server)
    }

    /// `postgresql://postgres@127.0.0.1:PORT/postgres`: the superuser, no password (trust), TCP on loopback.
    pub fn url(&self) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the server's unix socket (`.s.PGSQL.PORT`) and its log (`server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn pg_ctl_start(&self) -> Result<(), PgServerError> {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories='{}' -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let mut start = self.command("pg_ctl");
        start.arg("-D").arg(&self.data).arg("-l").arg(self.dir.path().join("server.log"));
        start.args(["-w", "-t", "60", "-o", &options, "start"]);
        run(&mut start).map_err(|e| match e {
            PgServerError::Command { command, status, output } => {
                let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                PgServerError::Command { command, status, output: format!("{output}\nserver log:\n{log}") }
            }
            other => other,
        })
    }

    /// A command for one of the server binaries, run as `postgres` when we are root.
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let mut stop = self.command("pg_ctl");
        stop.arg("-D").arg(&self.data).args(["-m", "immediate", "-w", "stop"]);
        if let Err(e) = run(&mut stop) {
            eprintln!("throwaway PostgreSQL in {}: {e}", self.dir.path().display());
        }
    }
}

/// The directory of `initdb` and `pg_ctl`: `PATH` first (resolving links, so that `pg_ctl` finds `postgres`
/// beside it), then the newest Debian install.
fn server_binaries() -> Option<PathBuf> {
    find_server_binaries(std::env::var_os("PATH"), Path::new("/usr/lib/postgresql"))
}

fn find_server_binaries(path: Option<std::ffi::OsString>, debian: &Path) -> Option<PathBuf> {
    let on_path = path
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join("initdb")).find(|initdb| initdb.is_file()));
    if let Some(initdb) = on_path {
        let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
        if let Some(dir) = real.parent().filter(|dir| dir.join("pg_ctl").is_file()) {
            return Some(dir.to_owned());
        }
    }
    let mut installed: Vec<(u32, PathBuf)> = std::fs::read_dir(debian)
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((version, bin))
        })
        .collect();
    installed.sort();
    installed.pop().map(|(_, bin)| bin)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run(command: &mut Command) -> Result<(), PgServerError> {
    let shown = format!("{command:?}");
    let Output { status, stdout, stderr } = command.output().map_err(|e| PgServerError::Command {
        command: shown.clone(),
        status: "not started".into(),
        output: e.to_string(),
    })?;
    if status.success() {
        return Ok(());
    }
    let output = format!("{}{}", String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&stderr));
    Err(PgServerError::Command { command: shown, status: status.to_string(), output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_say_how_to_install_them() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(find_server_binaries(Some(empty.path().into()), empty.path()), None);
        assert!(PgServerError::Missing.to_string().contains("run `cargo xtask setup`"));
        // Debian's layout, off PATH: the newest version wins.
        for version in ["13", "15"] {
            let bin = empty.path().join(version).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("initdb"), "").unwrap();
            std::fs::write(bin.join("pg_ctl"), "").unwrap();
        }
        assert_eq!(find_server_binaries(None, empty.path()), Some(empty.path().join("15/bin")));
    }

    #[tokio::test]
    async fn a_server_starts_answers_and_is_removed() {
        let server = PgServer::start().unwrap();
        let dir = server.dir().to_owned();
        assert!(dir.join(format!(".s.PGSQL.{}", server.port())).exists(), "unix socket in the directory");
        let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let row = client.query_one("SELECT 1 + 1", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 2);
        drop(client);
        drop(server);
        assert!(!dir.exists());
    }
}
