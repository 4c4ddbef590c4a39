//! Feature squeezing as a detector (Xu, Evans & Qi 2018, "Feature squeezing: detecting adversarial examples
//! in deep neural networks"): the classifier's probability vector on the input and on each squeezed copy; the
//! score is the largest L1 distance between them.

use std::sync::Arc;

use armoury::{no_grad, Classifier, Detector, Error, Result, Tensor};

use super::in_pieces;
use crate::transforms::{bpda, BitDepth, MedianFilter, Transform};

/// `score(x) = max_k ‖softmax(z(x)) − softmax(z(T_k(x)))‖₁` over the squeezers `T_k` (bit-depth reduction and
/// the median filter, each per image). The squeezers are not differentiable: [`Detector::score_tensor`] passes
/// the gradient straight through them (BPDA, Athalye et al. 2018), which is what an adaptive attack uses.
pub struct FeatureSqueezing {
    classifier: Arc<dyn Classifier>,
    squeezers: Vec<Arc<dyn Transform>>,
    threshold: Option<f32>,
}

impl FeatureSqueezing {
    /// The detector over `classifier` with `squeezers` (at least one; each validated).
    pub fn new(classifier: Arc<dyn Classifier>, squeezers: Vec<Arc<dyn Transform>>) -> Result<FeatureSqueezing> {
        if squeezers.is_empty() {
            return Err(Error::invalid("FeatureSqueezing::new", "at least one squeezer is needed"));
        }
        for s in &squeezers {
            s.validate()?;
            if s.is_random() {
                return Err(Error::invalid(
                    "FeatureSqueezing::new",
                    format!("{} is random: a squeezer is not", s.name()),
                ));
            }
        }
        Ok(FeatureSqueezing { classifier, squeezers, threshold: None })
    }

    /// Xu et al.'s MNIST configuration with an odd median window: bit depth `bits` and a 3×3 median filter
    /// (the paper's 1-bit depth suits MNIST's near-binary digits; greyscale textures such as Fashion-MNIST's
    /// need more bits).
    pub fn with_defaults(classifier: Arc<dyn Classifier>, bits: u32) -> Result<FeatureSqueezing> {
        FeatureSqueezing::new(classifier, vec![Arc::new(BitDepth { bits }), Arc::new(MedianFilter { size: 3 })])
    }

    /// The squeezers' names.
    pub fn squeezer_names(&self) -> Vec<String> {
        self.squeezers.iter().map(|s| s.name()).collect()
    }

    fn distances(&self, x: &Tensor, tracked: bool) -> Result<Tensor> {
        self.classifier.check_input(x)?;
        let bounds = self.classifier.bounds();
        let p = self.classifier.forward(x)?.softmax(1)?;
        let mut best: Option<Tensor> = None;
        for s in &self.squeezers {
            let sx = no_grad(|| s.apply(&x.detach(), bounds, 0))?;
            let input = if tracked { bpda(x, &sx)? } else { sx };
            let q = self.classifier.forward(&input)?.softmax(1)?;
            let d = p.sub(&q)?.abs().sum(&[1], false)?;
            best = Some(match best {
                None => d,
                Some(b) => b.maximum(&d)?,
            });
        }
        Ok(best.expect("at least one squeezer"))
    }
}

impl Detector for FeatureSqueezing {
    fn name(&self) -> &str {
        "feature-squeezing"
    }
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        in_pieces(x, |xc| no_grad(|| self.distances(xc, false)).map(|t| t.to_vec()))
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    fn score_tensor(&self, x: &Tensor) -> Option<Result<Tensor>> {
        Some(self.distances(x, true))
    }
}
