//! Stateful detection of query-based black-box attacks (Chen, Carlini & Wagner 2020, "Stateful detection of
//! black-box adversarial attacks"): every query is encoded, and a query whose mean distance to its k nearest
//! previous queries is below a threshold is flagged — the iterates of a query attack crowd together, benign
//! queries do not.
//!
//! The neighbour search is a locality-sensitive hash index (random hyperplanes through the benign queries'
//! mean, several tables), whose buckets keep their most recent entries up to a capacity: a query compares
//! itself with at most tables × capacity stored encodings, so its cost stays flat however long the history
//! grows — never a loop over the whole history. With one table of 0 bits and an unbounded capacity the search
//! is exact.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use armoury::classifier::{Classifier, Counters};
use armoury::nn::Module;
use armoury::seed::{derive, normal_vec, rng};
use armoury::train::{Method, StepContext, StepReport, TrainConfig};
use armoury::{calibrate_threshold, grad_enabled, no_grad, Detector, Error, Result, Tensor};
use ndarray::Array2;

use super::{check_batch, train_unlabelled};

/// Maps a batch of inputs to one encoding per row.
pub trait Encoder: Send + Sync {
    /// The encodings `[N, D]` of a batch `[N, C, H, W]`.
    fn encode(&self, x: &Tensor) -> Result<Array2<f32>>;
}

fn to_rows(t: &Tensor) -> Result<Array2<f32>> {
    let flat = t.flatten_from(1)?;
    let (n, d) = flat.dims2("Encoder")?;
    Array2::from_shape_vec((n, d), flat.value().as_standard_layout().iter().copied().collect())
        .map_err(|e| Error::invalid("Encoder", e.to_string()))
}

/// A classifier's activation of one layer (its layer taps), flattened: Chen et al.'s simplest encoder.
pub struct TapEncoder {
    classifier: Arc<dyn Classifier>,
    layer: String,
}

impl TapEncoder {
    /// `layer` of `classifier` (one of its [`Classifier::layer_names`]).
    pub fn new(classifier: Arc<dyn Classifier>, layer: &str) -> Result<TapEncoder> {
        if !classifier.layer_names().iter().any(|l| l == layer) {
            return Err(Error::invalid("TapEncoder", format!("unknown layer '{layer}'")));
        }
        Ok(TapEncoder { classifier, layer: layer.to_string() })
    }
}

impl Encoder for TapEncoder {
    fn encode(&self, x: &Tensor) -> Result<Array2<f32>> {
        let acts = no_grad(|| self.classifier.activations(x, &[&self.layer]))?;
        to_rows(acts.get(&self.layer).expect("asked for"))
    }
}

/// A network's output, flattened (a similarity encoder trained with [`train_similarity_encoder`]).
pub struct ModuleEncoder {
    module: Arc<dyn Module>,
}

impl ModuleEncoder {
    /// The encoder computing `module` in evaluation mode.
    pub fn new(module: Arc<dyn Module>) -> ModuleEncoder {
        ModuleEncoder { module }
    }
}

impl Encoder for ModuleEncoder {
    fn encode(&self, x: &Tensor) -> Result<Array2<f32>> {
        check_batch("ModuleEncoder", x)?;
        let n = x.shape()[0];
        let mut rows = Vec::new();
        for s in (0..n).step_by(256) {
            let part = no_grad(|| self.module.forward_t(&x.narrow(0, s, 256.min(n - s))?, false))?;
            rows.push(to_rows(&part)?);
        }
        let views: Vec<_> = rows.iter().map(|r| r.view()).collect();
        ndarray::concatenate(ndarray::Axis(0), &views).map_err(|e| Error::invalid("ModuleEncoder", e.to_string()))
    }
}

/// How [`train_similarity_encoder`] trains: a contrastive loss (Hadsell et al. 2006) on pairs — an image and a
/// copy with uniform noise of ±`noise` are pulled together, an image and another image of the batch pushed at
/// least `margin` apart: `‖f(x) − f(x′)‖² + max(0, margin − ‖f(x) − f(x″)‖)²`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimilarityTraining {
    /// Epochs.
    pub epochs: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Adam's learning rate.
    pub lr: f32,
    /// Half-width of the positive pairs' noise, input units.
    pub noise: f32,
    /// Margin of the negative pairs.
    pub margin: f32,
    /// Seed.
    pub seed: u64,
}

impl Default for SimilarityTraining {
    fn default() -> Self {
        SimilarityTraining { epochs: 3, batch_size: 128, lr: 1e-3, noise: 0.1, margin: 10.0, seed: 0 }
    }
}

struct Contrastive {
    cfg: SimilarityTraining,
    bounds: (f32, f32),
}

impl Method for Contrastive {
    fn kind(&self) -> &'static str {
        "contrastive"
    }
    fn name(&self) -> String {
        format!("contrastive(noise={}, margin={})", self.cfg.noise, self.cfg.margin)
    }
    fn step(&self, ctx: &mut StepContext<'_>, x: &Tensor, y: &[usize]) -> Result<StepReport> {
        let noise = Tensor::uniform(x.shape(), -self.cfg.noise, self.cfg.noise, ctx.seed);
        let positive = x.add(&noise)?.clamp(self.bounds.0, self.bounds.1);
        let (model, margin) = (ctx.model, self.cfg.margin);
        let (loss, _) = ctx.optimise_pieces(y.len(), |r| {
            let xs = x.narrow(0, r.start, r.len())?;
            let n = r.len();
            let f = model.forward_t(&xs, true)?.flatten_from(1)?;
            let fp = model.forward_t(&positive.narrow(0, r.start, n)?, true)?.flatten_from(1)?;
            // Negatives: each image paired with the next one of its piece.
            let roll: Vec<usize> = (0..n).map(|i| (i + 1) % n).collect();
            let fneg = f.index_select(0, &roll)?;
            let dp = f.sub(&fp)?;
            let pull = dp.mul(&dp)?.sum(&[1], false)?;
            let dn = f.sub(&fneg)?;
            let dist = dn.mul(&dn)?.sum(&[1], false)?.add_scalar(1e-12).sqrt();
            let push = dist.neg().add_scalar(margin).relu();
            let loss = pull.add(&push.mul(&push)?)?;
            Ok((if n > 1 { loss.sum_all() } else { pull.sum_all() }, 0))
        })?;
        Ok(StepReport::of(loss, 0, y.len()))
    }
}

/// Trains `encoder` (any module from images to encodings) as Chen et al.'s similarity encoder with the core's
/// [`Trainer`] and Adam; returns each epoch's mean loss.
pub fn train_similarity_encoder(
    encoder: &dyn Module,
    images: &Tensor,
    bounds: (f32, f32),
    cfg: &SimilarityTraining,
) -> Result<Vec<f32>> {
    let tc =
        TrainConfig { epochs: cfg.epochs, batch_size: cfg.batch_size, seed: cfg.seed, bounds, ..Default::default() };
    let method = Contrastive { cfg: *cfg, bounds };
    train_unlabelled(encoder, images, &method, tc, cfg.lr, 0.0)
}

/// The neighbour index of [`StatefulDetector`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexConfig {
    /// Hash tables (≥ 1).
    pub tables: usize,
    /// Hyperplanes per table (0..=63; 0: one bucket).
    pub bits: usize,
    /// Most recent entries a bucket keeps (≥ 1).
    pub bucket_capacity: usize,
    /// Seed of the hyperplanes.
    pub seed: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { tables: 8, bits: 10, bucket_capacity: 64, seed: 0 }
    }
}

impl IndexConfig {
    /// The exact search: one table, one bucket, unbounded.
    pub fn exact() -> IndexConfig {
        IndexConfig { tables: 1, bits: 0, bucket_capacity: usize::MAX, seed: 0 }
    }
}

/// Chen, Carlini & Wagner's stateful detector: the score of a query is minus the mean Euclidean distance of its
/// encoding to its `k` nearest previous queries (higher = more suspicious; −∞ until k are known); a query
/// is flagged when its score is above the threshold, i.e. its neighbours are closer than −threshold.
///
/// [`StatefulDetector::observe`] processes a stream of queries in order (each is scored against the history,
/// then added to it), records the indices of the detected queries and the interval of queries since the last
/// detection or clearing that led to each, and clears the history after a detection (Chen et al.'s policy:
/// an attacker must start again). As a [`Detector`] its `score` is read-only against the current history, and
/// `fit` calibrates the threshold on benign query streams ([`StatefulDetector::calibrate`]).
pub struct StatefulDetector {
    encoder: Arc<dyn Encoder>,
    k: usize,
    config: IndexConfig,
    stream_len: usize,
    clear_on_detect: bool,
    planes: Vec<f32>,
    center: Option<Vec<f32>>,
    dim: usize,
    store: Vec<f32>,
    buckets: Vec<HashMap<u64, VecDeque<u32>>>,
    queries: usize,
    episode_start: usize,
    detections: Vec<usize>,
    intervals: Vec<Range<usize>>,
    threshold: Option<f32>,
}

impl StatefulDetector {
    /// The detector over `encoder` with `k` ≥ 1 neighbours and the index `config`. Benign streams for `fit` are
    /// 100 queries long and the history is cleared after each detection, until changed.
    pub fn new(encoder: Arc<dyn Encoder>, k: usize, config: IndexConfig) -> Result<StatefulDetector> {
        if k == 0 || config.tables == 0 || config.bits > 63 || config.bucket_capacity == 0 {
            return Err(Error::invalid("StatefulDetector::new", format!("k = {k}, {config:?}")));
        }
        Ok(StatefulDetector {
            encoder,
            k,
            config,
            stream_len: 100,
            clear_on_detect: true,
            planes: Vec::new(),
            center: None,
            dim: 0,
            store: Vec::new(),
            buckets: vec![HashMap::new(); config.tables],
            queries: 0,
            episode_start: 0,
            detections: Vec::new(),
            intervals: Vec::new(),
            threshold: None,
        })
    }

    /// Sets the length of the benign streams [`Detector::fit`] cuts its clean images into (≥ k + 1).
    pub fn with_stream_len(mut self, len: usize) -> Result<StatefulDetector> {
        if len <= self.k {
            return Err(Error::invalid("StatefulDetector", format!("streams of {len} ≤ k = {} queries", self.k)));
        }
        self.stream_len = len;
        Ok(self)
    }

    /// Whether a detection clears the history (default true).
    pub fn with_clear_on_detect(mut self, clear: bool) -> StatefulDetector {
        self.clear_on_detect = clear;
        self
    }

    /// Queries in the history.
    pub fn history_len(&self) -> usize {
        self.store.len() / self.dim.max(1)
    }

    /// Queries observed since creation or [`StatefulDetector::reset`] (the index of the next query).
    pub fn queries(&self) -> usize {
        self.queries
    }

    /// The indices of the detected queries, in order.
    pub fn detections(&self) -> &[usize] {
        &self.detections
    }

    /// For each detection, the queries from the last clearing (or the start) up to and including it.
    pub fn intervals(&self) -> &[Range<usize>] {
        &self.intervals
    }

    /// Empties the history (the query count and the detections are kept).
    pub fn clear(&mut self) {
        self.store.clear();
        self.buckets.iter_mut().for_each(HashMap::clear);
        self.episode_start = self.queries;
    }

    /// Empties the history and forgets the queries and detections.
    pub fn reset(&mut self) {
        self.clear();
        self.queries = 0;
        self.episode_start = 0;
        self.detections.clear();
        self.intervals.clear();
    }

    fn prepare(&mut self, dim: usize) -> Result<()> {
        if self.dim == 0 {
            self.dim = dim;
            let mut r = rng(derive(self.config.seed, 0x5717));
            self.planes = normal_vec(&mut r, self.config.tables * self.config.bits * dim);
        } else if dim != self.dim {
            return Err(Error::invalid("StatefulDetector", format!("encodings of {dim}, not {}, values", self.dim)));
        }
        if dim == 0 {
            return Err(Error::invalid("StatefulDetector", "empty encodings"));
        }
        Ok(())
    }

    fn hash(&self, table: usize, e: &[f32]) -> u64 {
        let (b, d) = (self.config.bits, self.dim);
        let mut h = 0u64;
        for bit in 0..b {
            let p = &self.planes[(table * b + bit) * d..(table * b + bit + 1) * d];
            let dot: f32 = match &self.center {
                Some(c) => p.iter().zip(e).zip(c).map(|((a, x), m)| a * (x - m)).sum(),
                None => p.iter().zip(e).map(|(a, x)| a * x).sum(),
            };
            h = (h << 1) | u64::from(dot > 0.0);
        }
        h
    }

    /// The score of encoding `e` against the history (see [`StatefulDetector`]).
    pub fn score_encoding(&self, e: &[f32]) -> f32 {
        if e.len() != self.dim {
            return f32::NEG_INFINITY;
        }
        let mut candidates: Vec<u32> = Vec::new();
        for (t, table) in self.buckets.iter().enumerate() {
            if let Some(b) = table.get(&self.hash(t, e)) {
                candidates.extend(b.iter().copied());
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.len() < self.k {
            return f32::NEG_INFINITY;
        }
        let d = self.dim;
        let mut dist: Vec<f32> = candidates
            .iter()
            .map(|&i| {
                let s = &self.store[i as usize * d..(i as usize + 1) * d];
                s.iter().zip(e).map(|(a, b)| (a - b) * (a - b)).sum::<f32>()
            })
            .collect();
        let k = self.k;
        if dist.len() > k {
            dist.select_nth_unstable_by(k - 1, f32::total_cmp);
        }
        let mean = dist[..k].iter().map(|&q| (q as f64).sqrt()).sum::<f64>() / k as f64;
        -(mean as f32)
    }

    /// Adds encoding `e` to the history.
    pub fn insert_encoding(&mut self, e: &[f32]) -> Result<()> {
        self.prepare(e.len())?;
        let id = u32::try_from(self.history_len())
            .map_err(|_| Error::invalid("StatefulDetector", "history beyond 2³² queries: clear it"))?;
        self.store.extend_from_slice(e);
        let cap = self.config.bucket_capacity;
        for t in 0..self.config.tables {
            let h = self.hash(t, e);
            let b = self.buckets[t].entry(h).or_default();
            b.push_back(id);
            if b.len() > cap {
                b.pop_front();
            }
        }
        Ok(())
    }

    /// Processes the queries `x` in order: scores each against the history, adds it, and on a detection records
    /// it and clears the history (if so configured). Returns whether each query was flagged; every query is only
    /// scored (−∞: never flagged) while no threshold is set.
    pub fn observe(&mut self, x: &Tensor) -> Result<Vec<bool>> {
        Ok(self.observe_scores(x)?.into_iter().map(|(_, f)| f).collect())
    }

    fn observe_scores(&mut self, x: &Tensor) -> Result<Vec<(f32, bool)>> {
        let enc = self.encoder.encode(x)?;
        if let Some(e) = enc.rows().into_iter().next() {
            self.prepare(e.len())?;
        }
        let mut out = Vec::with_capacity(enc.nrows());
        for row in enc.rows() {
            let e: Vec<f32> = row.iter().copied().collect();
            let s = self.score_encoding(&e);
            let flagged = self.threshold.is_some_and(|t| s > t);
            self.insert_encoding(&e)?;
            let index = self.queries;
            self.queries += 1;
            if flagged {
                self.detections.push(index);
                self.intervals.push(self.episode_start..index + 1);
                if self.clear_on_detect {
                    self.clear();
                }
            }
            out.push((s, flagged));
        }
        Ok(out)
    }

    /// Calibrates the threshold on benign query streams: each stream is run from an empty history, its score
    /// is the highest of its queries', and the threshold is [`calibrate_threshold`] of those at `target_fpr`, so
    /// at most that fraction of the benign streams would have been flagged at all. The hyperplanes are centred
    /// on the benign encodings' mean first (unless already centred). The history is empty afterwards.
    pub fn calibrate(&mut self, streams: &[Tensor], target_fpr: f32) -> Result<f32> {
        if streams.is_empty() {
            return Err(Error::invalid("StatefulDetector::calibrate", "no benign streams"));
        }
        if self.center.is_none() {
            let mut sum: Vec<f64> = Vec::new();
            let mut count = 0usize;
            for s in streams {
                let enc = self.encoder.encode(s)?;
                if sum.is_empty() {
                    sum = vec![0.0; enc.ncols()];
                }
                for row in enc.rows() {
                    sum.iter_mut().zip(row).for_each(|(a, &v)| *a += v as f64);
                    count += 1;
                }
            }
            self.center = Some(sum.iter().map(|&s| (s / count.max(1) as f64) as f32).collect());
        }
        let saved = self.threshold.take();
        let mut maxima = Vec::with_capacity(streams.len());
        for s in streams {
            self.clear();
            let scores = self.observe_scores(s);
            let scores = match scores {
                Ok(v) => v,
                Err(e) => {
                    self.threshold = saved;
                    return Err(e);
                }
            };
            maxima.push(scores.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max));
        }
        self.reset();
        let t = calibrate_threshold(&maxima, target_fpr)?;
        self.threshold = Some(t);
        Ok(t)
    }
}

impl Detector for StatefulDetector {
    fn name(&self) -> &str {
        "similarity"
    }
    /// Each row's score against the current history, without adding it.
    fn score(&self, x: &Tensor) -> Result<Vec<f32>> {
        let enc = self.encoder.encode(x)?;
        Ok(enc.rows().into_iter().map(|r| self.score_encoding(&r.to_vec())).collect())
    }
    fn threshold(&self) -> Option<f32> {
        self.threshold
    }
    fn set_threshold(&mut self, threshold: f32) {
        self.threshold = Some(threshold);
    }
    /// Cuts `clean` into benign streams of the configured length and [`StatefulDetector::calibrate`]s on them.
    fn fit(&mut self, clean: &Tensor, target_fpr: f32) -> Result<f32> {
        let n = check_batch("StatefulDetector::fit", clean)?.0;
        let streams: Vec<Tensor> = (0..n / self.stream_len)
            .map(|s| clean.narrow(0, s * self.stream_len, self.stream_len))
            .collect::<Result<_>>()?;
        if streams.is_empty() {
            return Err(Error::invalid("StatefulDetector::fit", format!("fewer than {} images", self.stream_len)));
        }
        self.calibrate(&streams, target_fpr)
    }
}

/// A classifier whose every query passes through a [`StatefulDetector`] first (in row order; batches are never
/// split), as a deployed model with stateful detection answers: run a query attack against it and read the
/// detections from [`Monitored::with_detector`]. Gradient (tracked) passes are not queries and are not observed.
pub struct Monitored {
    inner: Arc<dyn Classifier>,
    detector: Mutex<StatefulDetector>,
    counters: Counters,
}

impl Monitored {
    /// `inner` watched by `detector`.
    pub fn new(inner: Arc<dyn Classifier>, detector: StatefulDetector) -> Monitored {
        Monitored { inner, detector: Mutex::new(detector), counters: Counters::default() }
    }

    /// Runs `f` on the detector.
    pub fn with_detector<T>(&self, f: impl FnOnce(&mut StatefulDetector) -> T) -> Result<T> {
        let mut d = self.detector.lock().map_err(|_| Error::invalid("Monitored", "detector lock poisoned"))?;
        Ok(f(&mut d))
    }

    /// The detector back.
    pub fn into_detector(self) -> Result<StatefulDetector> {
        self.detector.into_inner().map_err(|_| Error::invalid("Monitored", "detector lock poisoned"))
    }
}

impl Classifier for Monitored {
    fn input_shape(&self) -> &[usize] {
        self.inner.input_shape()
    }
    fn num_classes(&self) -> usize {
        self.inner.num_classes()
    }
    fn bounds(&self) -> (f32, f32) {
        self.inner.bounds()
    }
    fn counters(&self) -> &Counters {
        &self.counters
    }
    fn chunk_size(&self) -> Option<usize> {
        None
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !(grad_enabled() && x.is_tracked()) {
            self.with_detector(|d| d.observe(&x.detach()))??;
        }
        self.inner.forward(x)
    }
}
