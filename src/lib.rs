//! incumbent
#![deny(missing_docs)]

pub mod backend;
mod campaign;
pub mod config;
mod election;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod event;
#[cfg(all(feature = "file", unix))]
pub mod file;
pub mod memory;
pub mod metrics;
mod term;

pub use backend::{Candidate, FencingToken, Leader};
pub use campaign::{Campaign, CampaignHandle, Events};
pub use election::{Election, ElectionBuilder, OnWorkerExit, WorkerOutcome};
pub use error::{Error, Result};
pub use event::{DemotionReason, LeadershipEvent, Problem, Role, Status};
pub use term::{Term, TermGuard};
#[cfg(feature = "consul")]
pub mod consul;
