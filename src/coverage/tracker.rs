//! Incremental coverage: the covered sets of the five criteria, updated one input at a time.

use super::neurons::{Bounds, LayerSpan, NeuronBatch, NeuronRow};
use super::{CoverageConfig, CoverageValues, Metric};
use crate::{Error, Result};

/// What one input adds (or would add) to each criterion's covered set, in neurons (KMNC: in sections).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gains {
    /// Newly NC-covered neurons.
    pub nc: usize,
    /// Newly top-k neurons.
    pub tknc: usize,
    /// Neurons newly above their training maximum.
    pub upper: usize,
    /// Neurons newly below their training minimum.
    pub lower: usize,
    /// Newly covered KMNC sections.
    pub kmnc: usize,
}

/// The covered sets of NC, TKNC, NBC, SNAC and KMNC over every input added so far; each input costs O(neurons),
/// whatever came before.
#[derive(Clone, Debug)]
pub struct Tracker {
    config: CoverageConfig,
    layers: Vec<LayerSpan>,
    low: Vec<f32>,
    high: Vec<f32>,
    nc: Vec<bool>,
    tknc: Vec<bool>,
    upper: Vec<bool>,
    lower: Vec<bool>,
    kmnc: Vec<bool>,
    counts: Gains,
    inputs: usize,
    scratch: Vec<f32>,
}

impl Tracker {
    /// An empty tracker over the neurons of `bounds`.
    pub fn new(bounds: &Bounds, config: CoverageConfig) -> Result<Tracker> {
        config.validate()?;
        let d = bounds.neurons();
        if d == 0 || bounds.high.len() != d {
            return Err(Error::invalid("coverage", "bounds with no neurons, or low and high of different lengths"));
        }
        Ok(Tracker {
            config,
            layers: bounds.layers.clone(),
            low: bounds.low.clone(),
            high: bounds.high.clone(),
            nc: vec![false; d],
            tknc: vec![false; d],
            upper: vec![false; d],
            lower: vec![false; d],
            kmnc: vec![false; d * config.kmnc_k],
            counts: Gains::default(),
            inputs: 0,
            scratch: Vec::new(),
        })
    }

    /// Adds every input of `batch`, in order; returns what each added.
    pub fn add(&mut self, batch: &NeuronBatch) -> Result<Vec<Gains>> {
        self.check(batch)?;
        Ok((0..batch.len()).map(|i| self.visit(batch.row(i), true)).collect())
    }

    /// What input `i` of `batch` would add, without adding it.
    pub fn gain(&mut self, batch: &NeuronBatch, i: usize) -> Result<Gains> {
        self.check(batch)?;
        Ok(self.visit(self.row_of(batch, i)?, false))
    }

    /// Adds input `i` of `batch`; returns what it added.
    pub fn commit(&mut self, batch: &NeuronBatch, i: usize) -> Result<Gains> {
        self.check(batch)?;
        Ok(self.visit(self.row_of(batch, i)?, true))
    }

    /// The five values over every input added.
    pub fn values(&self) -> CoverageValues {
        counts_to_values(&self.counts, self.low.len(), self.config.kmnc_k)
    }

    /// The value of one metric.
    pub fn value(&self, m: Metric) -> f64 {
        self.values().get(m)
    }

    /// How much `g` raises metric `m`, in that metric's units (a fraction of its neurons or sections).
    pub fn delta(&self, g: &Gains, m: Metric) -> f64 {
        counts_to_values(g, self.low.len(), self.config.kmnc_k).get(m)
    }

    /// Inputs added so far.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Number of neurons.
    pub fn neurons(&self) -> usize {
        self.low.len()
    }

    /// The criteria's parameters.
    pub fn config(&self) -> CoverageConfig {
        self.config
    }

    fn check(&self, batch: &NeuronBatch) -> Result<()> {
        if batch.layers != self.layers {
            return Err(Error::invalid("coverage", "neurons of other layers than the tracker's bounds"));
        }
        Ok(())
    }

    fn row_of<'a>(&self, batch: &'a NeuronBatch, i: usize) -> Result<NeuronRow<'a>> {
        if i >= batch.len() {
            return Err(Error::invalid("coverage", format!("input {i} of a batch of {}", batch.len())));
        }
        Ok(batch.row(i))
    }

    fn visit(&mut self, row: NeuronRow<'_>, commit: bool) -> Gains {
        let mut g = Gains::default();
        let t = f64::from(self.config.nc_threshold);
        let k = self.config.kmnc_k;
        for (l, span) in self.layers.iter().enumerate() {
            let values = &row.values[span.start..span.start + span.len];
            let (lo, range) = (f64::from(row.layer_min[l]), f64::from(row.layer_max[l]) - f64::from(row.layer_min[l]));
            let kth = kth_largest(values, self.config.tknc_k, &mut self.scratch);
            for (o, &v) in values.iter().enumerate() {
                let j = span.start + o;
                let scaled = if range > 0.0 { (f64::from(v) - lo) / range } else { 0.0 };
                mark(&mut self.nc[j], scaled > t, commit, &mut g.nc);
                mark(&mut self.tknc[j], v >= kth, commit, &mut g.tknc);
                mark(&mut self.upper[j], v > self.high[j], commit, &mut g.upper);
                mark(&mut self.lower[j], v < self.low[j], commit, &mut g.lower);
                if let Some(s) = section(v, self.low[j], self.high[j], k) {
                    mark(&mut self.kmnc[j * k + s], true, commit, &mut g.kmnc);
                }
            }
        }
        if commit {
            self.inputs += 1;
            self.counts.nc += g.nc;
            self.counts.tknc += g.tknc;
            self.counts.upper += g.upper;
            self.counts.lower += g.lower;
            self.counts.kmnc += g.kmnc;
        }
        g
    }
}

fn mark(cell: &mut bool, hit: bool, commit: bool, gain: &mut usize) {
    if hit && !*cell {
        *gain += 1;
        if commit {
            *cell = true;
        }
    }
}

/// The k-th largest of `values` (all of them count when there are at most k), by a selection in `scratch`.
fn kth_largest(values: &[f32], k: usize, scratch: &mut Vec<f32>) -> f32 {
    if values.len() <= k {
        return f32::NEG_INFINITY;
    }
    scratch.clear();
    scratch.extend_from_slice(values);
    let at = values.len() - k;
    *scratch.select_nth_unstable_by(at, f32::total_cmp).1
}

/// The KMNC section of `v` in [low, high] cut into k equal parts (the last one closed), or `None` outside the
/// range or for a neuron whose range has zero width.
fn section(v: f32, low: f32, high: f32, k: usize) -> Option<usize> {
    if high <= low || v < low || v > high {
        return None;
    }
    let (v, low, high) = (f64::from(v), f64::from(low), f64::from(high));
    let s = ((v - low) / (high - low) * k as f64).floor() as usize;
    Some(s.min(k - 1))
}

fn counts_to_values(c: &Gains, neurons: usize, k: usize) -> CoverageValues {
    let d = neurons as f64;
    CoverageValues {
        nc: c.nc as f64 / d,
        tknc: c.tknc as f64 / d,
        nbc: (c.upper + c.lower) as f64 / (2.0 * d),
        snac: c.upper as f64 / d,
        kmnc: c.kmnc as f64 / (d * k as f64),
    }
}

/// The five values over every input of `batch`, computed directly from the definitions one neuron at a time over
/// all inputs (no incremental state): the oracle the [`Tracker`] is tested against.
pub fn from_scratch(batch: &NeuronBatch, bounds: &Bounds, config: CoverageConfig) -> Result<CoverageValues> {
    config.validate()?;
    if batch.layers != bounds.layers {
        return Err(Error::invalid("coverage", "neurons of other layers than the bounds"));
    }
    let (n, d, k) = (batch.len(), batch.neurons(), config.kmnc_k);
    let mut c = Gains::default();
    for (l, span) in batch.layers.iter().enumerate() {
        // The k-th largest of the layer for every input, by a full sort (descending).
        let kth: Vec<f32> = (0..n)
            .map(|i| {
                let mut v: Vec<f32> = batch.values.row(i).iter().skip(span.start).take(span.len).copied().collect();
                v.sort_by(|a, b| b.total_cmp(a));
                if v.len() <= config.tknc_k {
                    f32::NEG_INFINITY
                } else {
                    v[config.tknc_k - 1]
                }
            })
            .collect();
        for j in span.start..span.start + span.len {
            let col = batch.values.column(j);
            let scaled = (0..n).map(|i| {
                let (lo, hi) = (f64::from(batch.layer_min[[i, l]]), f64::from(batch.layer_max[[i, l]]));
                if hi > lo {
                    (f64::from(col[i]) - lo) / (hi - lo)
                } else {
                    0.0
                }
            });
            c.nc += usize::from(scaled.fold(f64::NEG_INFINITY, f64::max) > f64::from(config.nc_threshold));
            c.tknc += usize::from((0..n).any(|i| col[i] >= kth[i]));
            let (max, min) = col.iter().fold((f32::NEG_INFINITY, f32::INFINITY), |(a, b), &v| (a.max(v), b.min(v)));
            c.upper += usize::from(max > bounds.high[j]);
            c.lower += usize::from(min < bounds.low[j]);
            let mut hit = vec![false; k];
            for &v in col {
                if let Some(s) = section(v, bounds.low[j], bounds.high[j], k) {
                    hit[s] = true;
                }
            }
            c.kmnc += hit.iter().filter(|&&h| h).count();
        }
    }
    Ok(counts_to_values(&c, d, k))
}
