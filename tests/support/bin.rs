//! Locating server binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The command that installs every server binary the tests need.
pub const INSTALL_HINT: &str = "scripts/install-test-deps";

/// The directory `scripts/install-test-deps` installs into:
/// `$INCUMBENT_TOOLS_DIR`, else `$HOME/.cache/incumbent-tools`.
pub fn tools_dir() -> PathBuf {
    match std::env::var_os("INCUMBENT_TOOLS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/incumbent-tools")
        }
    }
}

/// Returns the path of the executable `name`, searched on `PATH`, then in
/// `tools_dir()/bin`, then in `/usr/bin` and `/usr/sbin`. Panics, naming the install
/// command, when it is nowhere.
pub fn find_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push(tools_dir().join("bin"));
    dirs.push(PathBuf::from("/usr/bin"));
    // Debian's daemons (pgbouncer) live in /usr/sbin, which a user's PATH may lack.
    dirs.push(PathBuf::from("/usr/sbin"));
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found on PATH, in {}/bin, /usr/bin or /usr/sbin; \
                 install the test servers with `{INSTALL_HINT}`",
                tools_dir().display()
            )
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// `cargo`, as a test starts it for a nested build, without the variables cargo set for the
/// test process itself (its package's `CARGO_PKG_*`, `CARGO_MANIFEST_*`, `OUT_DIR`, …). Some
/// build scripts rerun when such a variable changes, so a nested build that inherited them
/// rebuilt ring, rustls and everything above them, and the next `cargo test` rebuilt them
/// again.
pub fn nested_cargo() -> std::process::Command {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_the_test = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || name.starts_with("CARGO_BIN_EXE_")
            || matches!(
                name,
                "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
                    | "LD_LIBRARY_PATH"
                    | "RUST_TEST_THREADS"
            );
        if set_for_the_test {
            cargo.env_remove(name);
        }
    }
    cargo
}

/// libfaketime for multithreaded programs, from Debian's faketime package.
pub fn libfaketime() -> String {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("faketime/libfaketimeMT.so.1"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfaketimeMT.so.1 not found in /usr/lib/*/faketime; install the test \
                 dependencies with `{}` (Debian's faketime)",
                INSTALL_HINT
            )
        })
        .display()
        .to_string()
}
