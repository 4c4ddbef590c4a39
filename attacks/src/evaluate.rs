//! AutoAttack's standard evaluation in one call on tensors (torchattacks' `AutoAttack(model, eps=…)(x, y)`,
//! the authors' `AutoAttack(model, norm, eps).run_standard_evaluation(x, y)`), and an [`armoury::eval::Evaluator`]
//! with this crate's attacks for any other threat model.

use armoury::attack::Norm;
use armoury::eval::{Evaluation, Evaluator, ThreatModel};
use armoury::{Classifier, Result, Tensor};

use crate::registry::from_spec;

/// AutoAttack's standard evaluation of `model` on images `x` (N×C×H×W inside the model's bounds, e.g. [0, 1])
/// with labels `y`, in `norm` at budget `eps` (input units): the cascade of
/// [`ThreatModel::autoattack_linf`] / [`ThreatModel::autoattack_l2`] / [`ThreatModel::autoattack_l1`] (APGD-CE,
/// APGD-T, FAB-T, Square at the authors' budgets), each attack on the samples every earlier one left robust, then
/// the minimal perturbations (DeepFool; FAB in L1). The result's [`Evaluation::robust_accuracy`] is the
/// per-sample worst case; its ledger holds every sample's first break and adversarial input.
///
/// ```
/// use armoury::{attack::Norm, data, nn, ModuleClassifier};
/// let model = ModuleClassifier::new(nn::mlp(0), &[1, 28, 28], 10, (0.0, 1.0))?;
/// let (x, y) = data::sample()?.test.batch(0..2)?;
/// let result = armoury_attacks::autoattack(&model, &x, &y, Norm::Linf, 0.1)?;
/// println!("robust accuracy {:.3} (clean {:.3})", result.robust_accuracy(), result.clean_accuracy());
/// assert!(result.robust_accuracy() <= result.clean_accuracy());
/// # Ok::<(), armoury::Error>(())
/// ```
///
/// Errors: shapes or labels that do not fit the model, data outside its bounds, `eps` not finite and > 0.
pub fn autoattack(model: &dyn Classifier, x: &Tensor, y: &[usize], norm: Norm, eps: f32) -> Result<Evaluation> {
    evaluator(standard(norm, eps as f64)).run(model, x, y)
}

/// AutoAttack's standard threat model in `norm` at `eps`.
pub fn standard(norm: Norm, eps: f64) -> ThreatModel {
    match norm {
        Norm::Linf => ThreatModel::autoattack_linf(eps),
        Norm::L2 => ThreatModel::autoattack_l2(eps),
        Norm::L1 => ThreatModel::autoattack_l1(eps),
    }
}

/// An evaluation under `threat` with this crate's attacks ([`from_spec`]); set a state file, shard, chunk,
/// progress or identity on it, then [`Evaluator::run`] it.
pub fn evaluator(threat: ThreatModel) -> Evaluator<'static> {
    Evaluator::new(threat, &from_spec)
}
