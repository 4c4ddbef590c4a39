//! Neuron coverage (DeepGauge, Ma et al. 2018; DeepXplore, Pei et al. 2017): how much of a network's activation
//! space a set of inputs exercises, read through the layer taps ([`Classifier::activations`]) of native and ONNX
//! models alike.
//!
//! **Neurons.** A unit of a dense layer (a tap of shape [N, D]) is a neuron. A convolutional tap [N, C, H, W] gives
//! one neuron per channel, the channel's *spatial mean* ([`ConvNeurons::ChannelMean`], DeepGauge's and MindArmour's
//! convention), or, with [`ConvNeurons::PerPosition`], one neuron per (channel, position). Any other rank is
//! flattened (one neuron per element).
//!
//! **Criteria** ([`CoverageConfig`], [`CoverageValues`]):
//!
//! | criterion | a neuron (or cell) is covered when some input … | value |
//! |---|---|---|
//! | NC (threshold t) | has a min-max-scaled activation > t | covered / neurons |
//! | TKNC (k) | puts it among the k largest of its layer (value ≥ the layer's k-th largest; ties all count) | covered / neurons |
//! | NBC | drives it above its training maximum or below its training minimum | (upper + lower) / (2 · neurons) |
//! | SNAC | drives it above its training maximum | upper / neurons |
//! | KMNC (k) | lands in one of the k equal sections of its training range [low, high] | covered sections / (k · neurons) |
//!
//! NC's scaling is DeepXplore's: for each input and each tapped layer, the layer's raw output is min-max scaled
//! over all its elements, and a conv neuron's scaled value is the mean of its channel's scaled elements, i.e.
//! `(neuron − layer min) / (layer max − layer min)`; a layer whose output is constant scales to 0. (MindArmour
//! 2.0 compares the raw channel mean with the threshold, which makes the threshold depend on the activation
//! scale of each layer.) KMNC's last section is closed, so the training maximum itself is covered (MindArmour
//! drops it: `floor((high − low) / ((high − low) / k)) = k` is out of range); a neuron with `high == low` has
//! sections of zero width, and no input covers them. Bounds come from training data in one streaming pass
//! ([`Bounds::fit`]).
//!
//! **Incremental.** [`Tracker`] keeps the covered sets and updates them with each new input in O(neurons) (TKNC:
//! O(neurons) expected, a selection per layer); it never revisits earlier inputs, and its values equal a
//! from-scratch computation over all inputs ([`from_scratch`]), which the tests check.
//!
//! ```
//! use armoury::coverage::{Bounds, CoverageConfig, NeuronBatch, Tracker};
//! use ndarray::array;
//! // Two neurons in one layer; training range [0, 1] for both.
//! let train = NeuronBatch::dense(array![[0.0f32, 0.0], [1.0, 1.0]]);
//! let bounds = Bounds::from_batch(&train)?;
//! let mut t = Tracker::new(&bounds, CoverageConfig::default())?;
//! t.add(&NeuronBatch::dense(array![[1.5f32, 0.5]]))?;
//! let v = t.values();
//! assert_eq!(v.snac, 0.5); // neuron 0 went above its training maximum
//! assert_eq!(v.kmnc, 1.0 / 200.0); // neuron 1 covered one of its 100 sections
//! # Ok::<(), armoury::Error>(())
//! ```

mod neurons;
mod tracker;

pub use neurons::{Bounds, ConvNeurons, LayerSpan, NeuronBatch, NeuronRow, NeuronTaps};
pub use tracker::{from_scratch, Gains, Tracker};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One of the five coverage criteria.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Neuron coverage (threshold on min-max-scaled activations).
    Nc,
    /// Top-k neuron coverage.
    Tknc,
    /// Neuron boundary coverage.
    Nbc,
    /// Strong neuron activation coverage.
    Snac,
    /// k-multisection neuron coverage.
    Kmnc,
}

impl Metric {
    /// Every metric, in the order NC, TKNC, NBC, SNAC, KMNC.
    pub const ALL: [Metric; 5] = [Metric::Nc, Metric::Tknc, Metric::Nbc, Metric::Snac, Metric::Kmnc];

    /// The lowercase name (`nc`, `tknc`, `nbc`, `snac`, `kmnc`).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Nc => "nc",
            Metric::Tknc => "tknc",
            Metric::Nbc => "nbc",
            Metric::Snac => "snac",
            Metric::Kmnc => "kmnc",
        }
    }
}

impl std::str::FromStr for Metric {
    type Err = Error;
    fn from_str(s: &str) -> Result<Metric> {
        Metric::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::invalid("coverage metric", format!("'{s}' is not one of nc, tknc, nbc, snac, kmnc")))
    }
}

/// The criteria's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoverageConfig {
    /// NC's threshold on scaled activations, in [0, 1) (default 0.1, MindArmour's default).
    pub nc_threshold: f32,
    /// TKNC's k, at least 1 (default 3).
    pub tknc_k: usize,
    /// KMNC's number of sections k, at least 1 (default 100).
    pub kmnc_k: usize,
}

impl Default for CoverageConfig {
    fn default() -> Self {
        CoverageConfig { nc_threshold: 0.1, tknc_k: 3, kmnc_k: 100 }
    }
}

impl CoverageConfig {
    /// Errors for a threshold outside [0, 1), or k = 0, or more KMNC sections than the tracker will allocate
    /// (2^16).
    pub fn validate(&self) -> Result<()> {
        if !(0.0..1.0).contains(&self.nc_threshold) {
            return Err(Error::invalid("coverage", format!("nc_threshold {} is not in [0, 1)", self.nc_threshold)));
        }
        if self.tknc_k == 0 || self.kmnc_k == 0 {
            return Err(Error::invalid("coverage", "tknc_k and kmnc_k must be at least 1"));
        }
        if self.kmnc_k > 1 << 16 {
            return Err(Error::invalid("coverage", format!("kmnc_k {} is more than 65536 sections", self.kmnc_k)));
        }
        Ok(())
    }
}

/// The five coverage values, each in [0, 1].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CoverageValues {
    /// Neuron coverage.
    pub nc: f64,
    /// Top-k neuron coverage.
    pub tknc: f64,
    /// Neuron boundary coverage.
    pub nbc: f64,
    /// Strong neuron activation coverage.
    pub snac: f64,
    /// k-multisection neuron coverage.
    pub kmnc: f64,
}

impl CoverageValues {
    /// The value of one metric.
    pub fn get(&self, m: Metric) -> f64 {
        match m {
            Metric::Nc => self.nc,
            Metric::Tknc => self.tknc,
            Metric::Nbc => self.nbc,
            Metric::Snac => self.snac,
            Metric::Kmnc => self.kmnc,
        }
    }
}
