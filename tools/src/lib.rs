//! incumbent's proof tools, shared by the `chaos` and `sim` programs and this crate's tests:
//! the chaos checker ([`chaos`], RELIABILITY.md), the deterministic simulation ([`sim`],
//! SIMULATION.md) and the server harness ([`support`]). The harness stays in incumbent's
//! `tests/support/`, where its tests and benches include it too; it is included here by path,
//! not made a crate, so that it sees the one `incumbent` these tools link.

pub mod chaos;
pub mod sim;
#[path = "../../tests/support/mod.rs"]
pub mod support;
