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
    /// `layer` of `classifier` (one of its [`Classifier::layer_names`]); an unknown name is an error listing the
    /// valid ones.
    pub fn new(classifier: Arc<dyn Classifier>, layer: &str) -> Result<TapEncoder> {
        let layer = choose_tap(classifier.as_ref(), Some(layer))?;
        Ok(TapEncoder { classifier, layer })
    }

    /// The tap [`default_tap`] chooses for `classifier`.
    pub fn default_for(classifier: Arc<dyn Classifier>) -> Result<TapEncoder> {
        let layer = default_tap(classifier.as_ref())?;
        Ok(TapEncoder { classifier, layer })
    }

    /// The layer encoded.
    pub fn layer(&self) -> &str {
        &self.layer
    }
}

/// `name` when it is one of the classifier's [`Classifier::layer_names`] (an error listing them otherwise), or
/// with no name the tap [`default_tap`] chooses.
pub fn choose_tap(classifier: &dyn Classifier, name: Option<&str>) -> Result<String> {
    let Some(name) = name else { return default_tap(classifier) };
    let valid = classifier.layer_names();
    if valid.iter().any(|l| l == name) {
        return Ok(name.to_string());
    }
    Err(Error::invalid(
        "tap",
        if valid.is_empty() {
            format!("no layer '{name}': this classifier exposes no intermediate activations")
        } else {
            format!("unknown layer '{name}'; valid layers: {}", valid.join(", "))
        },
    ))
}

/// The tap a feature encoder uses when none is named: the input of the classifier's head, found from the model
/// itself so it works for any classifier that taps (a native [`armoury::Sequential`]'s child names, an ONNX
/// graph's value names). Walking [`Classifier::layer_names`] back from the output, it is the last activation
/// (one row per sample) whose size differs from the class count — for the fixture cnn `fc1_relu`, for its ONNX
/// export `/Relu_2_output_0`, for a ResNet the pooled features before the final Gemm. Taps the size of the logits
/// (the output, a bias Add after a MatMul) and values without a batch axis (shape arithmetic) are skipped; the
/// input itself is the answer only for a model with no hidden layer. One forward pass of one input per tap
/// looked at. An error when the classifier has no taps or none qualifies.
pub fn default_tap(classifier: &dyn Classifier) -> Result<String> {
    let names = classifier.layer_names();
    if names.is_empty() {
        return Err(Error::invalid("tap", "the classifier exposes no intermediate activations to encode"));
    }
    let (lo, hi) = classifier.bounds();
    let mut shape = vec![1];
    shape.extend_from_slice(classifier.input_shape());
    let probe = Tensor::full(&shape, lo + (hi - lo) / 2.0);
    let classes = classifier.num_classes();
    for name in names.iter().rev() {
        let Ok(acts) = no_grad(|| classifier.activations(&probe, &[name.as_str()])) else { continue };
        let Some(a) = acts.get(name) else { continue };
        if a.numel() != classes {
            return Ok(name.clone());
        }
    }
    Err(Error::invalid(
        "tap",
        format!(
            "no activation of the classifier differs in size from its {classes} logits; valid layers: {}",
            names.join(", ")
        ),
    ))
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
    train_unlabelled(encoder, images, &method, tc, cfg.lr, 0.0, &mut ())
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
        IndexConfig { tables: 8, bits: 6, bucket_capacity: 32, seed: 0 }
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
    offsets: Option<Vec<f32>>,
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
            offsets: None,
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

    /// Centres the hyperplanes on `center` (an encoding; [`StatefulDetector::calibrate`] uses the benign
    /// queries' mean), so that they split the encodings rather than all pass on one side of them.
    pub fn set_center(&mut self, center: Vec<f32>) -> Result<()> {
        self.prepare(center.len())?;
        let d = self.dim;
        self.offsets = Some(self.planes.chunks_exact(d).map(|p| dot(p, &center)).collect());
        Ok(())
    }

    /// The bucket key of `e` in every table: one bit per hyperplane, the sign of `plane · (e − centre)`
    /// (`plane · centre` is precomputed in `offsets`).
    fn hashes(&self, e: &[f32]) -> Vec<u64> {
        let (b, d) = (self.config.bits, self.dim);
        (0..self.config.tables)
            .map(|t| {
                (0..b).fold(0u64, |h, bit| {
                    let i = t * b + bit;
                    let dot = dot(&self.planes[i * d..(i + 1) * d], e) - self.offsets.as_ref().map_or(0.0, |o| o[i]);
                    (h << 1) | u64::from(dot > 0.0)
                })
            })
            .collect()
    }

    /// The score of encoding `e` against the history (see [`StatefulDetector`]).
    pub fn score_encoding(&self, e: &[f32]) -> f32 {
        if e.len() != self.dim {
            return f32::NEG_INFINITY;
        }
        self.score_hashed(e, &self.hashes(e))
    }

    /// The distinct history entries in the buckets `keys` (ascending ids).
    fn candidates(&self, keys: &[u64]) -> Vec<u32> {
        let mut c: Vec<u32> = self.buckets.iter().zip(keys).filter_map(|(t, k)| t.get(k)).flatten().copied().collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// How many distinct history entries a query with encoding `e` is compared with (at most tables × capacity).
    pub fn candidate_count(&self, e: &[f32]) -> usize {
        if e.len() != self.dim {
            return 0;
        }
        self.candidates(&self.hashes(e)).len()
    }

    /// The score of `e` whose bucket keys are `keys`: its candidates are the entries of its buckets (at most
    /// tables × capacity, the most recent ones), the mean of the k smallest distances among them.
    fn score_hashed(&self, e: &[f32], keys: &[u64]) -> f32 {
        let candidates = self.candidates(keys);
        if candidates.len() < self.k {
            return f32::NEG_INFINITY;
        }
        let d = self.dim;
        let mut dist: Vec<f32> = candidates
            .iter()
            .map(|&i| squared_distance(&self.store[i as usize * d..(i as usize + 1) * d], e))
            .collect();
        let k = self.k;
        if dist.len() > k {
            dist.select_nth_unstable_by(k - 1, f32::total_cmp);
        }
        let mean = dist[..k].iter().map(|&q| f64::from(q.max(0.0)).sqrt()).sum::<f64>() / k as f64;
        -(mean as f32)
    }

    /// Adds encoding `e` to the history.
    pub fn insert_encoding(&mut self, e: &[f32]) -> Result<()> {
        self.prepare(e.len())?;
        let keys = self.hashes(e);
        self.insert_hashed(e, &keys)
    }

    fn insert_hashed(&mut self, e: &[f32], keys: &[u64]) -> Result<()> {
        let id = u32::try_from(self.history_len())
            .map_err(|_| Error::invalid("StatefulDetector", "history beyond 2³² queries: clear it"))?;
        self.store.extend_from_slice(e);
        let cap = self.config.bucket_capacity;
        for (table, &key) in self.buckets.iter_mut().zip(keys) {
            let b = table.entry(key).or_default();
            b.push_back(id);
            if b.len() > cap {
                b.pop_front();
            }
        }
        Ok(())
    }

    /// Scores encoding `e` against the history, then adds it (hashing it once): what [`StatefulDetector::observe`]
    /// does for each query, without the encoder and the detection bookkeeping.
    pub fn score_and_insert(&mut self, e: &[f32]) -> Result<f32> {
        self.prepare(e.len())?;
        let keys = self.hashes(e);
        let s = self.score_hashed(e, &keys);
        self.insert_hashed(e, &keys)?;
        Ok(s)
    }

    /// The k nearest entries of the history to `e` by exhaustive search (ids into the history, nearest first):
    /// the reference against which the index's recall is measured.
    pub fn exact_neighbours(&self, e: &[f32]) -> Vec<u32> {
        if e.len() != self.dim {
            return Vec::new();
        }
        let d = self.dim;
        let mut all: Vec<(f32, u32)> =
            self.store.chunks_exact(d).zip(0u32..).map(|(s, i)| (squared_distance(s, e), i)).collect();
        let k = self.k.min(all.len());
        if all.len() > k && k > 0 {
            all.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
        }
        all.truncate(k);
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all.into_iter().map(|p| p.1).collect()
    }

    /// The k nearest entries among the index's candidates for `e` (ids, nearest first): the neighbours the
    /// score averages over. Their overlap with [`StatefulDetector::exact_neighbours`] is the index's recall.
    pub fn indexed_neighbours(&self, e: &[f32]) -> Vec<u32> {
        if e.len() != self.dim {
            return Vec::new();
        }
        let d = self.dim;
        let mut all: Vec<(f32, u32)> = self
            .candidates(&self.hashes(e))
            .into_iter()
            .map(|i| (squared_distance(&self.store[i as usize * d..(i as usize + 1) * d], e), i))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all.truncate(self.k);
        all.into_iter().map(|p| p.1).collect()
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
            let s = self.score_and_insert(&e)?;
            let flagged = self.threshold.is_some_and(|t| s > t);
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
        if self.offsets.is_none() {
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
            let center: Vec<f32> = sum.iter().map(|&s| (s / count.max(1) as f64) as f32).collect();
            self.set_center(center)?;
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

/// `a · b`, in eight independent lanes so that it vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `‖a − b‖²`, in eight independent lanes.
fn squared_distance(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| (x - y) * (x - y)).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            let t = x[l] - y[l];
            acc[l] += t * t;
        }
    }
    acc.iter().sum::<f32>() + tail
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
    armoury::delegate_classifier!(inner, counters);
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

/// The cost and recall of a [`StatefulDetector`]'s index at one history size (from [`measure_index`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexMeasurement {
    /// Encodings in the history before the probes.
    pub history: usize,
    /// Mean wall time of one query's score and insert (hashing, candidates, distances), µs.
    pub micros_per_query: f64,
    /// Mean number of candidates (distinct history entries compared) per query.
    pub candidates: f64,
    /// Mean fraction of the exact k nearest neighbours that the index returns among its k.
    pub recall: f64,
}

/// Measures a detector with `k` neighbours and the index `config` as its history fills with the rows of
/// `history` (in order) up to each of `sizes` (ascending, at most its rows; the hyperplanes centred on its
/// mean): there, the recall of the index's k nearest against the exhaustive search for the first 50 rows of
/// `probes` (read-only), and the wall time of the remaining probes each scored and inserted in turn (so they
/// join the history). Timings are wall time on whatever else the machine runs.
pub fn measure_index(
    k: usize,
    config: IndexConfig,
    history: &Array2<f32>,
    probes: &Array2<f32>,
    sizes: &[usize],
) -> Result<Vec<IndexMeasurement>> {
    struct Unused;
    impl Encoder for Unused {
        fn encode(&self, _: &Tensor) -> Result<Array2<f32>> {
            Err(Error::invalid("measure_index", "encodings are inserted directly"))
        }
    }
    let bad_sizes = sizes.windows(2).any(|w| w[0] > w[1]) || sizes.iter().any(|&s| s > history.nrows());
    if history.ncols() == 0 || probes.ncols() != history.ncols() || probes.nrows() <= 50 || bad_sizes {
        return Err(Error::invalid(
            "measure_index",
            format!("history {:?}, probes {:?} (more than 50), sizes {sizes:?}", history.dim(), probes.dim()),
        ));
    }
    let mut d = StatefulDetector::new(Arc::new(Unused), k, config)?;
    let mean = history.mean_axis(ndarray::Axis(0)).expect("non-empty");
    d.set_center(mean.to_vec())?;
    let (recall_probes, cost_probes) = probes.view().split_at(ndarray::Axis(0), 50);
    let cost_probes: Vec<Vec<f32>> = cost_probes.rows().into_iter().map(|r| r.to_vec()).collect();
    let mut out = Vec::with_capacity(sizes.len());
    let mut next = 0;
    for &size in sizes {
        while next < size {
            d.insert_encoding(&history.row(next).to_vec())?;
            next += 1;
        }
        let history_len = d.history_len();
        let (mut recall, mut candidates) = (0.0, 0.0);
        for e in recall_probes.rows() {
            let e = e.to_vec();
            let exact = d.exact_neighbours(&e);
            let found = d.indexed_neighbours(&e);
            recall += found.iter().filter(|i| exact.contains(i)).count() as f64 / exact.len().max(1) as f64;
            candidates += d.candidate_count(&e) as f64;
        }
        let start = std::time::Instant::now();
        let mut sink = 0.0f32;
        for e in &cost_probes {
            sink += d.score_and_insert(e)?.max(-1e9);
        }
        let micros_per_query = start.elapsed().as_secs_f64() * 1e6 / cost_probes.len() as f64;
        std::hint::black_box(sink);
        out.push(IndexMeasurement {
            history: history_len,
            micros_per_query,
            candidates: candidates / 50.0,
            recall: recall / 50.0,
        });
    }
    Ok(out)
}

/// `n` rows of `dim` standard Gaussian values from `seed`: structureless encodings, the hardest case for the
/// hash, for [`measure_index`].
pub fn gaussian_encodings(n: usize, dim: usize, seed: u64) -> Array2<f32> {
    let mut r = rng(derive(seed, 0x1d8));
    Array2::from_shape_vec((n, dim), normal_vec(&mut r, n * dim)).expect("n × dim values")
}
