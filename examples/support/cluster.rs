//! The examples' candidate processes: each example re-runs itself as `NAME candidate …`,
//! and the parent reads the JSON lines the candidates print.

use std::ffi::OsString;
use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// One candidate process.
pub struct Node {
    pub name: &'static str,
    pub child: Child,
    /// Closing it asks the candidate to shut down gracefully.
    pub stdin: Option<ChildStdin>,
}

/// Every candidate's JSON lines, with the name of the candidate that printed each.
pub type Lines = mpsc::UnboundedReceiver<(&'static str, Value)>;

/// Starts this program once per name, as `this-program candidate NAME ARGS…`.
pub fn spawn(names: &[&'static str], args: &[OsString]) -> std::io::Result<(Vec<Node>, Lines)> {
    let (tx, lines) = mpsc::unbounded_channel();
    let mut nodes = Vec::new();
    for &name in names {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["candidate", name])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("the candidate has no stdout"))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(value) = serde_json::from_str(&line) {
                    let _ = tx.send((name, value));
                }
            }
        });
        let stdin = child.stdin.take();
        nodes.push(Node { name, child, stdin });
    }
    Ok((nodes, lines))
}
