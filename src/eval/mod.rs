//! Evaluation: how robust is a model, with numbers one can trust.
//!
//! - [`threat`]: the threat model as data (JSON), checked field by field and hashed into every result;
//! - [`cascade`]: AutoAttack's worst-case cascade over a list of attacks, re-attacking only the still-robust
//!   samples, with a per-sample ledger, a resumable state file, shards and their merge;
//! - [`shards`]: where each shard keeps its ledger, and the check that all have finished before a merge;
//! - [`identity`]: what a result measured (model and data hashes, kernel path, version), compared before a
//!   resume or a merge;
//! - [`summary`]: the figures of a ledger (Wilson intervals, per-attack robust accuracy, class flips,
//!   minimal norms);
//! - [`run`]: the evaluation as one call on tensors ([`Evaluator`], with defaults for everything but the threat
//!   model and the attack builder; `armoury_attacks::autoattack` is AutoAttack's standard evaluation in one call);
//! - [`audit`]: the gradient-masking audit, one pass/fail verdict with an explanation per check.
//!
//! The core takes attacks as `Box<dyn Attack>` from a [`cascade::Builder`]; `armoury_attacks::registry::from_spec`
//! builds them from the threat model's names. See docs/evaluation.md.

pub mod audit;
pub mod cascade;
pub mod identity;
pub mod run;
pub mod shards;
pub mod summary;
pub mod threat;

pub use audit::{announcing, audit, AuditConfig, Verdict};
pub use cascade::{
    merge, run_cascade, shard_range, step_name, AttackWork, Break, Builder, CascadeRun, Ledger, Progress, SampleRecord,
};
pub use identity::{kernel_path, Identity};
pub use run::{Evaluation, Evaluator};
pub use shards::{ledger_file, load_shards};
pub use summary::{proportion, summarise, worst_case_inputs, AttackLine, Summary};
pub use threat::{AttackSpec, ThreatModel};
