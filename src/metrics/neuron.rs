//! Neuron sensitivity (MindArmour's `NeuronMetric`; Zhang et al. 2021, "Interpreting and improving adversarial
//! robustness of deep neural networks with neuron sensitivity", IEEE TIP 30): how much each neuron's output
//! moves between clean and adversarial inputs, per layer, through the classifier's layer taps.

use crate::classifier::Classifier;
use crate::{no_grad, Error, Result, Tensor};

const OP: &str = "neuron_sensitivity";

/// The sensitivity of each neuron of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSensitivity {
    /// The layer's name (one of [`Classifier::layer_names`]).
    pub layer: String,
    /// One value per neuron: per channel of a `[N, C, …]` activation, per unit of a `[N, D]` one.
    pub sensitivity: Vec<f64>,
}

impl LayerSensitivity {
    /// The mean over the layer's neurons.
    pub fn mean(&self) -> f64 {
        if self.sensitivity.is_empty() {
            0.0
        } else {
            self.sensitivity.iter().sum::<f64>() / self.sensitivity.len() as f64
        }
    }
}

/// Neuron sensitivity of each of `layers` of `model` between the clean inputs `x` and the adversarial inputs
/// `x_adv` (same shape): σ_c = (1/N) Σᵢ mean over the neuron's positions of |F_c(xᵢ) − F_c(x_advᵢ)| (Zhang et
/// al.'s definition: a channel of a convolution is one neuron, its spatial positions averaged; a unit of a dense
/// layer is one neuron). One counted forward pass of each batch.
///
/// Errors: shapes that disagree, an unknown layer name (listing the valid ones), a classifier without taps, and
/// whatever the forward pass reports.
pub fn neuron_sensitivity(
    model: &dyn Classifier,
    x: &Tensor,
    x_adv: &Tensor,
    layers: &[&str],
) -> Result<Vec<LayerSensitivity>> {
    if x.shape() != x_adv.shape() {
        return Err(Error::ShapeMismatch { op: OP, expected: x.shape().to_vec(), got: x_adv.shape().to_vec() });
    }
    let (clean, adv) =
        no_grad(|| -> Result<_> { Ok((model.activations(x, layers)?, model.activations(x_adv, layers)?)) })?;
    clean
        .layers
        .iter()
        .zip(&adv.layers)
        .map(|((name, a), (_, b))| {
            Ok(LayerSensitivity { layer: name.clone(), sensitivity: activation_sensitivity(a, b)? })
        })
        .collect()
}

/// The per-neuron sensitivity of two activations `[N, C, …]` (rank ≥ 2, same shape) of clean and adversarial
/// inputs: (1/N) Σᵢ mean over positions |aᵢ,c − bᵢ,c| for each c — the formula of [`neuron_sensitivity`].
pub fn activation_sensitivity(clean: &Tensor, adv: &Tensor) -> Result<Vec<f64>> {
    if clean.shape() != adv.shape() {
        return Err(Error::ShapeMismatch { op: OP, expected: clean.shape().to_vec(), got: adv.shape().to_vec() });
    }
    if clean.rank() < 2 {
        return Err(clean.rank_error(OP, 2));
    }
    let (n, c) = (clean.shape()[0], clean.shape()[1]);
    let positions: usize = clean.shape()[2..].iter().product();
    if n == 0 || c == 0 || positions == 0 {
        return Err(Error::invalid(OP, format!("empty activation of shape {:?}", clean.shape())));
    }
    let (a, b) = (clean.value().as_standard_layout(), adv.value().as_standard_layout());
    let (a, b) = (a.as_slice().expect("standard layout"), b.as_slice().expect("standard layout"));
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return Err(Error::NonFinite { op: OP });
    }
    let mut out = vec![0.0f64; c];
    for i in 0..n {
        for (k, o) in out.iter_mut().enumerate() {
            let start = (i * c + k) * positions;
            let run = a[start..start + positions].iter().zip(&b[start..start + positions]);
            *o += run.map(|(&p, &q)| (p as f64 - q as f64).abs()).sum::<f64>() / positions as f64;
        }
    }
    out.iter_mut().for_each(|o| *o /= n as f64);
    Ok(out)
}
