//! Ensemble adversarial training (Tramèr et al. 2018): adversarial inputs made, in rotation, on the model being
//! trained and on fixed pre-trained models, so the defense does not overfit to its own gradients.

use std::sync::Arc;

use armoury::train::{correct, Method, StepContext, StepReport};
use armoury::{Attack, Classifier, Goal, Reduction, Result, Tensor};

use super::methods::{check_ratio, replace_with_adversarial};

/// Ensemble adversarial training. Batch `b` takes its adversarial inputs from source `b mod (k + 1)`: the model
/// being trained (source 0) or static model `source − 1` of the `k`.
///
/// The paper's recipe, the default ([`EnsembleAdversarialDefense::new`]): the attack (FGSM in the paper) runs on
/// every sample of the batch; on a static model it ascends the loss of that model's *predicted* labels rather
/// than the true ones (to avoid label leaking: Kurakin et al. 2017 found that adversarial inputs made from the
/// true label carry it, and the model learns to read it off); the loss is 0.5·(CE(x) + CE(x_adv)).
///
/// [`EnsembleAdversarialDefense::mixed`] keeps Armoury's earlier recipe, as in MindArmour's defenses: a ratio of
/// the batch replaced by adversarial inputs made from the true labels, cross-entropy on the mix.
pub struct EnsembleAdversarialDefense {
    /// The fixed models adversarial inputs are also made on.
    pub static_models: Vec<Arc<dyn Classifier>>,
    /// The attack (FGSM in the paper; R+FGSM works too). It gets the step's fresh seed.
    pub attack: Box<dyn Attack>,
    /// Attack a static model with its predicted labels (the paper) rather than the true labels.
    pub predicted_labels: bool,
    /// `None`: the paper's loss, 0.5·(CE(x) + CE(x_adv)) over the whole batch. `Some(r)`: replace the fraction
    /// `r` of the batch by adversarial inputs and train cross-entropy on the mix.
    pub replace_ratio: Option<f32>,
}

impl EnsembleAdversarialDefense {
    /// The paper's recipe: predicted labels on static models, loss 0.5·(CE(x) + CE(x_adv)).
    pub fn new(static_models: Vec<Arc<dyn Classifier>>, attack: Box<dyn Attack>) -> Self {
        EnsembleAdversarialDefense { static_models, attack, predicted_labels: true, replace_ratio: None }
    }

    /// The earlier recipe: true labels, a fraction `replace_ratio` of each batch replaced, cross-entropy on the
    /// mix.
    pub fn mixed(static_models: Vec<Arc<dyn Classifier>>, attack: Box<dyn Attack>, replace_ratio: f32) -> Self {
        EnsembleAdversarialDefense {
            static_models,
            attack,
            predicted_labels: false,
            replace_ratio: Some(replace_ratio),
        }
    }
}

impl Method for EnsembleAdversarialDefense {
    fn kind(&self) -> &'static str {
        "ensemble"
    }

    fn name(&self) -> String {
        let labels = if self.predicted_labels { "predicted" } else { "true" };
        let recipe = match self.replace_ratio {
            Some(r) => format!("ratio {r}"),
            None => "0.5 clean + 0.5 adversarial".to_string(),
        };
        format!(
            "ensemble({} + {} static models, {labels} labels, {recipe})",
            self.attack.name(),
            self.static_models.len()
        )
    }

    fn validate(&self) -> Result<()> {
        self.replace_ratio.map_or(Ok(()), check_ratio)
    }

    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let source = ctx.batch % (self.static_models.len() + 1);
        let clf: &dyn Classifier = if source == 0 { ctx.classifier } else { self.static_models[source - 1].as_ref() };
        let labels = if source > 0 && self.predicted_labels { clf.predict(x)? } else { y.to_vec() };
        if let Some(ratio) = self.replace_ratio {
            let mixed = replace_with_adversarial(clf, &[self.attack.as_ref()], ratio, x, &labels, ctx.seed)?;
            return ctx.cross_entropy_step(&mixed, y);
        }
        let x_adv = self.attack.generate(clf, x, &labels, &Goal::Untargeted, ctx.seed)?;
        let model = ctx.model;
        let (loss, correct) = ctx.optimise_pieces(y.len(), |r| {
            let z_clean = model.forward_t(&x.narrow(0, r.start, r.len())?, true)?;
            let z_adv = model.forward_t(&x_adv.narrow(0, r.start, r.len())?, true)?;
            let y = &y[r];
            let both = z_clean.cross_entropy(y, Reduction::Sum)?.add(&z_adv.cross_entropy(y, Reduction::Sum)?)?;
            Ok((both.mul_scalar(0.5), correct(&z_adv, y)))
        })?;
        Ok(StepReport::of(loss, correct, y.len()))
    }
}
