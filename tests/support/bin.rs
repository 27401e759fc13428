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
/// `tools_dir()/bin`, then in `/usr/bin`. Panics, naming the install
/// command, when it is nowhere.
pub fn find_binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.push(tools_dir().join("bin"));
    dirs.push(PathBuf::from("/usr/bin"));
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found on PATH, in {}/bin or in /usr/bin; \
                 install the test servers with `{INSTALL_HINT}`",
                tools_dir().display()
            )
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
