//! Reading neurons from layer taps, and the per-neuron training bounds.

use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{no_grad, Classifier, Error, Result, Tensor};

/// What a neuron of a convolutional tap ([N, C, H, W], or any rank above 2) is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvNeurons {
    /// One neuron per channel: the spatial mean of the channel (DeepGauge, MindArmour).
    #[default]
    ChannelMean,
    /// One neuron per (channel, position): every element of the tap.
    PerPosition,
}

/// A tapped layer's neurons: `len` columns from `start` of a [`NeuronBatch`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSpan {
    /// The tap's name.
    pub name: String,
    /// First neuron.
    pub start: usize,
    /// Number of neurons.
    pub len: usize,
}

/// Which taps of a classifier hold the neurons, and what a conv neuron is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeuronTaps {
    /// Tap names, each one of [`Classifier::layer_names`].
    pub layers: Vec<String>,
    /// Channel means (default) or every position.
    pub conv: ConvNeurons,
}

impl NeuronTaps {
    /// Channel-mean neurons of the named taps.
    pub fn new<S: AsRef<str>>(layers: &[S]) -> NeuronTaps {
        NeuronTaps { layers: layers.iter().map(|s| s.as_ref().to_string()).collect(), conv: ConvNeurons::ChannelMean }
    }

    /// The neurons and the logits of a batch, from one (counted) forward pass.
    pub fn read(&self, model: &dyn Classifier, x: &Tensor) -> Result<(NeuronBatch, Array2<f32>)> {
        if self.layers.is_empty() {
            return Err(Error::invalid("coverage", "no layer to read neurons from"));
        }
        let names: Vec<&str> = self.layers.iter().map(String::as_str).collect();
        let acts = no_grad(|| model.activations(x, &names))?;
        let n = x.shape()[0];
        let logits = acts.logits.value().to_owned().into_shape_with_order((n, model.num_classes())).map_err(|_| {
            Error::ShapeMismatch {
                op: "coverage logits",
                expected: vec![n, model.num_classes()],
                got: acts.logits.shape().to_vec(),
            }
        })?;
        let layers: Vec<(&str, &Tensor)> = acts.layers.iter().map(|(s, t)| (s.as_str(), t)).collect();
        Ok((NeuronBatch::from_taps(&layers, self.conv)?, logits))
    }
}

/// Neuron values of a batch of inputs, with each input's minimum and maximum over every element of each tapped
/// layer (what NC's min-max scaling needs).
#[derive(Clone, Debug, PartialEq)]
pub struct NeuronBatch {
    /// Neuron values [N, neurons].
    pub values: Array2<f32>,
    /// Per input and layer, the smallest raw element of the layer [N, layers].
    pub layer_min: Array2<f32>,
    /// Per input and layer, the largest raw element [N, layers].
    pub layer_max: Array2<f32>,
    /// Where each layer's neurons are.
    pub layers: Vec<LayerSpan>,
}

/// One input's neurons: a row of a [`NeuronBatch`].
#[derive(Clone, Copy, Debug)]
pub struct NeuronRow<'a> {
    /// Neuron values.
    pub values: &'a [f32],
    /// Per layer, the smallest raw element.
    pub layer_min: &'a [f32],
    /// Per layer, the largest raw element.
    pub layer_max: &'a [f32],
}

impl NeuronBatch {
    /// One dense layer named `dense` holding `values` [N, D] (for tests and hand-made activations): the layer's
    /// min and max are the row's.
    pub fn dense(values: Array2<f32>) -> NeuronBatch {
        let mins = values.map_axis(Axis(1), |r| r.iter().copied().fold(f32::INFINITY, f32::min));
        let maxs = values.map_axis(Axis(1), |r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        let n = values.nrows();
        let d = values.ncols();
        NeuronBatch {
            layer_min: mins.into_shape_with_order((n, 1)).expect("n values"),
            layer_max: maxs.into_shape_with_order((n, 1)).expect("n values"),
            values,
            layers: vec![LayerSpan { name: "dense".into(), start: 0, len: d }],
        }
    }

    /// The neurons of named tap outputs, each with the batch axis first (rank 2: one neuron per unit; rank ≥ 3:
    /// per `conv`). Errors: no tap, taps with different batch sizes, an empty layer, a non-finite value.
    pub fn from_taps(taps: &[(&str, &Tensor)], conv: ConvNeurons) -> Result<NeuronBatch> {
        let n = taps.first().map(|(_, t)| t.shape().first().copied().unwrap_or(0)).unwrap_or(0);
        let mut layers = Vec::with_capacity(taps.len());
        let mut start = 0;
        for (name, t) in taps {
            let shape = t.shape();
            if shape.len() < 2 || shape[0] != n || n == 0 {
                return Err(Error::invalid("coverage", format!("tap '{name}' has shape {shape:?}, not [{n}, …]")));
            }
            let len = match (conv, shape.len()) {
                (ConvNeurons::ChannelMean, r) if r >= 3 => shape[1],
                _ => shape[1..].iter().product(),
            };
            if len == 0 {
                return Err(Error::invalid("coverage", format!("tap '{name}' has no neurons")));
            }
            layers.push(LayerSpan { name: name.to_string(), start, len });
            start += len;
        }
        if layers.is_empty() {
            return Err(Error::invalid("coverage", "no tap"));
        }
        let mut values = Array2::<f32>::zeros((n, start));
        let mut layer_min = Array2::<f32>::zeros((n, layers.len()));
        let mut layer_max = Array2::<f32>::zeros((n, layers.len()));
        for (l, ((_, t), span)) in taps.iter().zip(&layers).enumerate() {
            let owned;
            let data = match t.value().as_slice() {
                Some(s) => s,
                None => {
                    owned = t.to_vec();
                    &owned[..]
                }
            };
            let per_row = data.len() / n;
            let group = per_row / span.len;
            let extremes: Vec<(f32, f32)> = values
                .axis_iter_mut(Axis(0))
                .into_par_iter()
                .enumerate()
                .map(|(i, mut row)| {
                    let src = &data[i * per_row..(i + 1) * per_row];
                    let dst = &mut row.as_slice_mut().expect("standard layout")[span.start..span.start + span.len];
                    for (d, g) in dst.iter_mut().zip(src.chunks_exact(group)) {
                        *d = (g.iter().map(|&v| f64::from(v)).sum::<f64>() / group as f64) as f32;
                    }
                    let lo = src.iter().copied().fold(f32::INFINITY, f32::min);
                    (lo, src.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                })
                .collect();
            for (i, (lo, hi)) in extremes.into_iter().enumerate() {
                layer_min[[i, l]] = lo;
                layer_max[[i, l]] = hi;
            }
        }
        if !values.iter().all(|v| v.is_finite()) {
            return Err(Error::NonFinite { op: "coverage" });
        }
        Ok(NeuronBatch { values, layer_min, layer_max, layers })
    }

    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.values.nrows()
    }

    /// True when there is no input.
    pub fn is_empty(&self) -> bool {
        self.values.nrows() == 0
    }

    /// Number of neurons.
    pub fn neurons(&self) -> usize {
        self.values.ncols()
    }

    /// Input `i`'s neurons.
    pub fn row(&self, i: usize) -> NeuronRow<'_> {
        NeuronRow {
            values: row_slice(&self.values, i),
            layer_min: row_slice(&self.layer_min, i),
            layer_max: row_slice(&self.layer_max, i),
        }
    }

    /// Rows `idx` of this batch, in that order.
    pub fn select(&self, idx: &[usize]) -> NeuronBatch {
        NeuronBatch {
            values: self.values.select(Axis(0), idx),
            layer_min: self.layer_min.select(Axis(0), idx),
            layer_max: self.layer_max.select(Axis(0), idx),
            layers: self.layers.clone(),
        }
    }
}

/// Each neuron's training range: the smallest and largest value over the training inputs (DeepGauge's
/// `low_n`, `high_n`), gathered in one streaming pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// Where each layer's neurons are.
    pub layers: Vec<LayerSpan>,
    /// Per neuron, the training minimum.
    pub low: Vec<f32>,
    /// Per neuron, the training maximum.
    pub high: Vec<f32>,
    /// How many training inputs were seen.
    pub samples: usize,
}

impl Bounds {
    /// The bounds of one batch of neurons. Errors for an empty batch.
    pub fn from_batch(batch: &NeuronBatch) -> Result<Bounds> {
        if batch.is_empty() {
            return Err(Error::invalid("coverage bounds", "no training input"));
        }
        let d = batch.neurons();
        let mut b = Bounds {
            layers: batch.layers.clone(),
            low: vec![f32::INFINITY; d],
            high: vec![f32::NEG_INFINITY; d],
            samples: 0,
        };
        b.update(batch)?;
        Ok(b)
    }

    /// Widens the bounds with a batch (the streaming pass). Errors for a batch with other layers.
    pub fn update(&mut self, batch: &NeuronBatch) -> Result<()> {
        if batch.layers != self.layers {
            return Err(Error::invalid("coverage bounds", "batch has other layers than the bounds"));
        }
        update_bounds(&mut self.low, &mut self.high, batch.values.view());
        self.samples += batch.len();
        Ok(())
    }

    /// Bounds from `images` [N, C, H, W] read through `taps` in batches of `batch_size`: one streaming pass, no
    /// more than one batch of activations in memory.
    pub fn fit(model: &dyn Classifier, taps: &NeuronTaps, images: &Tensor, batch_size: usize) -> Result<Bounds> {
        let n = images.shape().first().copied().unwrap_or(0);
        if n == 0 || batch_size == 0 {
            return Err(Error::invalid("coverage bounds", "no training input, or batch_size 0"));
        }
        let mut bounds: Option<Bounds> = None;
        for s in (0..n).step_by(batch_size) {
            let (batch, _) = taps.read(model, &images.narrow(0, s, batch_size.min(n - s))?)?;
            match bounds.as_mut() {
                Some(b) => b.update(&batch)?,
                None => bounds = Some(Bounds::from_batch(&batch)?),
            }
        }
        Ok(bounds.expect("at least one batch"))
    }

    /// Number of neurons.
    pub fn neurons(&self) -> usize {
        self.low.len()
    }
}

fn row_slice(a: &Array2<f32>, i: usize) -> &[f32] {
    a.row(i).to_slice().expect("a row of a standard-layout array is contiguous")
}

fn update_bounds(low: &mut [f32], high: &mut [f32], values: ArrayView2<f32>) {
    for row in values.rows() {
        for ((lo, hi), &v) in low.iter_mut().zip(high.iter_mut()).zip(row) {
            *lo = lo.min(v);
            *hi = hi.max(v);
        }
    }
}
