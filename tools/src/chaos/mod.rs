//! The chaos checker (the program is `src/bin/chaos.rs`; RELIABILITY.md): [`run`] starts the
//! store and the candidates and injects the faults, [`worker`] is each leader's command and
//! its fence, [`candidate`] a candidate running a library campaign, [`inproc`] campaigns in
//! this process on the memory backend, and [`check`] judges the recorded history. [`sharded`]
//! is the sharded mode: members of one sharded election, and a check of every shard's terms;
//! [`set`] the set mode: members each running an `ElectionSet` over the same elections.

pub mod candidate;
pub mod check;
pub mod inproc;
pub mod processes;
pub mod run;
pub mod set;
pub mod sharded;
pub mod worker;
