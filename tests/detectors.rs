//! The detectors of `armoury_defenses::detectors` on hand-computed cases (ROC AUC, LID, Jensen–Shannon, the
//! SPD inverse, reconstruction errors, the kNN score, the ensemble policies) and on the fixture cnn with the
//! embedded Fashion-MNIST sample: the small-N threshold (fitted on 50 clean images at 1% FPR, at most 5% of
//! fresh clean images flagged), agreement of `score` and `score_tensor`, determinism, and the adaptive attack
//! doing at least as well as the non-adaptive one.

use std::sync::Arc;

use armoury::detector::{roc_auc, roc_curve, tpr_at_fpr};
use armoury::io::load_module;
use armoury::nn::{Conv2d, Flatten, Linear, Module, Param, ReLU, Sequential, Sigmoid};
use armoury::{Classifier, Conv2dParams, Detector, Guarded, ModuleClassifier, Tensor};
use armoury_defenses::detectors::{
    autoencoder, gaussian_encodings, jensen_shannon, local_intrinsic_dimensionality, measure_index, protected_accuracy,
    protected_correct, spd_inverse, train_autoencoder, train_similarity_encoder, AdaptivePgd, Architecture,
    Autoencoder, AutoencoderTraining, DetectionMetrics, DivergenceDetector, Ensemble, ErrorDetector, FeatureSqueezing,
    IndexConfig, Lid, Logistic, LogisticTraining, Mahalanobis, ModuleEncoder, Policy, QueryBlinding, RegionClassifier,
    SimilarityTraining, StatefulDetector, Upsample2x,
};
use ndarray::Array2;

use crate::common::fixture;

fn cnn() -> Arc<dyn Classifier> {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let m: Arc<dyn Module> = Arc::new(m);
    Arc::new(ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier"))
}

/// The first `n` test images of the embedded sample and their labels.
fn test_images(range: std::ops::Range<usize>) -> (Tensor, Vec<usize>) {
    let set = armoury::data::sample().expect("embedded sample");
    set.test.batch(range).expect("batch")
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn detectors_roc_hand_computed() {
    // scikit-learn's example: y = [0, 0, 1, 1], scores [0.1, 0.4, 0.35, 0.8] → AUC 0.75.
    let (neg, pos) = ([0.1f32, 0.4], [0.35f32, 0.8]);
    assert!(close(roc_auc(&neg, &pos).expect("auc"), 0.75, 1e-12));
    assert_eq!(roc_curve(&neg, &pos).expect("curve"), vec![(0.0, 0.0), (0.0, 0.5), (0.5, 0.5), (0.5, 1.0), (1.0, 1.0)]);
    // Ties count one half: pairs (2>1) 1, (2=2) ½, (3>1) 1, (3>2) 1 → 3.5 / 4.
    assert!(close(roc_auc(&[1.0, 2.0], &[2.0, 3.0]).expect("auc"), 0.875, 1e-12));
    assert!(close(roc_auc(&[5.0; 3], &[5.0; 2]).expect("auc"), 0.5, 1e-12), "all tied: chance");
    assert!(close(roc_auc(&[3.0, 4.0], &[1.0, 2.0]).expect("auc"), 0.0, 1e-12), "reversed");
    // TPR at a calibrated FPR: 100 clean scores 0..99; at 1% one may be above the threshold 98.
    let clean: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let adv = [97.5f32, 98.0, 98.5, 120.0];
    let (tpr, t) = tpr_at_fpr(&clean, &adv, 0.01).expect("tpr");
    assert_eq!(t, 98.0);
    assert!(close(tpr, 0.5, 1e-12), "98.5 and 120 are strictly above 98");
    assert!(roc_auc(&[], &[1.0]).is_err());
    assert!(roc_auc(&[f32::NAN], &[1.0]).is_err());
}

#[test]
fn detectors_lid_jsd_and_spd_inverse_hand_computed() {
    // d = 1, 2, 4: k / Σ log(d_k/d_i) = 3 / (ln 4 + ln 2) = 1/ln 2.
    let lid = local_intrinsic_dimensionality(&[1.0, 2.0, 4.0]);
    assert!(close(lid as f64, 1.0 / std::f64::consts::LN_2, 1e-6), "{lid}");
    // JSD((½, ½) ‖ (0.9, 0.1)) = 0.10174922507919676 nats (an independent float64 computation).
    let lp = Tensor::from_vec(vec![0.5f32.ln(), 0.5f32.ln()], &[1, 2]).expect("lp");
    let lq = Tensor::from_vec(vec![0.9f32.ln(), 0.1f32.ln()], &[1, 2]).expect("lq");
    let j = jensen_shannon(&lp, &lq).expect("jsd").to_vec()[0];
    assert!(close(j as f64, 0.101_749_225, 1e-6), "{j}");
    assert!(jensen_shannon(&lp, &lp).expect("jsd").to_vec()[0].abs() < 1e-7);
    // [[4, 2], [2, 3]]⁻¹ = ⅛ [[3, −2], [−2, 4]].
    let inv = spd_inverse(&[4.0, 2.0, 2.0, 3.0], 2).expect("positive definite");
    for (a, b) in inv.iter().zip([0.375, -0.25, -0.25, 0.5]) {
        assert!(close(*a, b, 1e-12), "{inv:?}");
    }
    assert!(spd_inverse(&[1.0, 2.0, 2.0, 1.0], 2).is_err(), "indefinite");
}

/// A constant "auto-encoder": a 3×3 convolution with zero weights and bias, then a sigmoid: 0.5 everywhere.
fn half_autoencoder() -> Autoencoder {
    let conv = Conv2d::new(1, 1, 3, Conv2dParams { padding: (1, 1), ..Default::default() }, true, 0).expect("conv");
    let seq = Sequential::new().add("conv", conv).add("sig", Sigmoid);
    armoury::nn::ModuleExt::parameters(&seq).iter().for_each(|p: &Param| {
        p.set(ndarray::ArrayD::zeros(ndarray::IxDyn(&p.shape()))).expect("zero");
    });
    Autoencoder::new(Arc::new(seq), (0.0, 1.0)).expect("autoencoder")
}

#[test]
fn detectors_magnet_errors_and_upsampling_hand_computed() {
    let x = Tensor::from_vec((0..2 * 16).map(|i| (i % 5) as f32 / 4.0).collect(), &[2, 1, 4, 4]).expect("x");
    let v = x.to_vec();
    for p in [1u32, 2] {
        let d = ErrorDetector::new(half_autoencoder(), p).expect("detector");
        let s = d.score(&x).expect("score");
        for (i, si) in s.iter().enumerate() {
            let want: f64 =
                v[i * 16..(i + 1) * 16].iter().map(|&a| (a as f64 - 0.5).abs().powi(p as i32)).sum::<f64>() / 16.0;
            assert!(close(*si as f64, want, 1e-6), "L{p} sample {i}: {si} vs {want}");
        }
        let st = d.score_tensor(&x).expect("differentiable").expect("runs").to_vec();
        assert_eq!(st, s, "score_tensor has score's values");
    }
    assert!(ErrorDetector::new(half_autoencoder(), 3).is_err());
    // Nearest-neighbour upsampling: [[1, 2], [3, 4]] → each value in a 2×2 block.
    let u = Upsample2x.forward_t(&Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]).expect("x"), false);
    assert_eq!(u.expect("up").to_vec(), vec![1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.]);
    // The paper's architectures keep the input shape.
    for arch in [Architecture::MnistI, Architecture::MnistII] {
        let ae = autoencoder(arch, 1, 0).expect("ae");
        let y = ae.forward_t(&Tensor::uniform(&[2, 1, 28, 28], 0.0, 1.0, 1), false).expect("forward");
        assert_eq!(y.shape(), &[2, 1, 28, 28]);
    }
    let cifar = autoencoder(Architecture::Cifar, 3, 0).expect("ae");
    assert_eq!(
        cifar.forward_t(&Tensor::uniform(&[1, 3, 32, 32], 0.0, 1.0, 1), false).expect("fwd").shape(),
        &[1, 3, 32, 32]
    );
}

/// A detector whose score is the sample's first value, with a fixed threshold.
struct First(f32);

impl Detector for First {
    fn name(&self) -> &str {
        "first"
    }
    fn score(&self, x: &Tensor) -> armoury::Result<Vec<f32>> {
        let n = x.shape()[0];
        let d = x.numel() / n;
        Ok((0..n).map(|i| x.to_vec()[i * d]).collect())
    }
    fn threshold(&self) -> Option<f32> {
        Some(self.0)
    }
    fn set_threshold(&mut self, t: f32) {
        self.0 = t;
    }
}

#[test]
fn detectors_ensemble_policies_combine_members_by_member() {
    // Thresholds 0.2, 0.5, 0.8 on the first pixel: a value v is flagged by 0, 1, 2 or 3 members.
    let members =
        || -> Vec<Box<dyn Detector>> { vec![Box::new(First(0.2)), Box::new(First(0.5)), Box::new(First(0.8))] };
    let values = [0.1f32, 0.2, 0.3, 0.5, 0.6, 0.8, 0.9];
    let flagged_by = [0usize, 0, 1, 1, 2, 2, 3];
    let x = Tensor::from_vec(values.to_vec(), &[7, 1, 1, 1]).expect("x");
    for (policy, need) in [(Policy::Any, 1), (Policy::All, 3), (Policy::Vote, 2)] {
        let e = Ensemble::new(members(), policy).expect("ensemble");
        let got = e.detect(&x).expect("detect");
        let want: Vec<bool> = flagged_by.iter().map(|&k| k >= need).collect();
        assert_eq!(got, want, "{policy:?}");
    }
    // Vote of four members: a strict majority is three.
    let four: Vec<Box<dyn Detector>> =
        vec![Box::new(First(0.2)), Box::new(First(0.5)), Box::new(First(0.8)), Box::new(First(0.85))];
    let e = Ensemble::new(four, Policy::Vote).expect("ensemble");
    assert_eq!(e.detect(&x).expect("detect"), vec![false, false, false, false, false, false, true]);
    assert!(Ensemble::new(Vec::new(), Policy::Any).is_err());
}

#[test]
fn detectors_small_n_threshold_flags_at_most_five_percent() {
    let clf = cnn();
    let (fit_x, _) = test_images(0..50);
    let (fresh, _) = test_images(200..1000);
    let (reference, ref_y) = test_images(50..200);
    let mut ds: Vec<Box<dyn Detector>> = vec![
        Box::new(FeatureSqueezing::with_defaults(clf.clone(), 4).expect("squeeze")),
        Box::new(
            Mahalanobis::new(clf.clone(), &["conv2_relu", "fc1_relu"], &reference, &ref_y, 1e-3).expect("mahalanobis"),
        ),
        Box::new(Lid::new(clf.clone(), &["fc1_relu"], 10, &reference).expect("lid")),
    ];
    for d in &mut ds {
        d.fit(&fit_x, 0.01).expect("fits");
        let flagged = d.detect(&fresh).expect("detect").iter().filter(|&&f| f).count();
        let rate = flagged as f64 / 800.0;
        assert!(rate <= 0.05, "{}: {rate} of fresh clean images flagged", d.name());
        // The threshold is the largest of the 50 clean scores (50 · 0.01 < 1), not the smallest.
        let s = d.score(&fit_x).expect("score");
        assert_eq!(d.threshold(), Some(s.iter().copied().fold(f32::NEG_INFINITY, f32::max)), "{}", d.name());
    }
}

#[test]
fn detectors_magnet_trains_and_scores_like_its_tensor() {
    let clf = cnn();
    let (x, _) = test_images(0..256);
    let ae = autoencoder(Architecture::MnistII, 1, 0).expect("ae");
    let cfg = AutoencoderTraining { epochs: 3, batch_size: 64, ..Default::default() };
    let losses = train_autoencoder(&ae, &x, (0.0, 1.0), &cfg).expect("trains");
    assert!(losses[2] < losses[0], "the reconstruction loss falls: {losses:?}");
    let ae = Autoencoder::new(Arc::new(ae), (0.0, 1.0)).expect("ae");
    let jsd = DivergenceDetector::new(ae.clone(), clf.clone(), 10.0).expect("jsd");
    let probe = x.narrow(0, 0, 40).expect("probe");
    let s = jsd.score(&probe).expect("score");
    let st = jsd.score_tensor(&probe).expect("differentiable").expect("runs").to_vec();
    for (a, b) in s.iter().zip(&st) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1e-6), "{a} vs {b}");
    }
    assert!(s.iter().all(|v| (0.0..=std::f32::consts::LN_2 + 1e-6).contains(v)), "JSD in [0, ln 2]");
    // Same seed, same weights: training is reproducible.
    let again = autoencoder(Architecture::MnistII, 1, 0).expect("ae");
    assert_eq!(train_autoencoder(&again, &x, (0.0, 1.0), &cfg).expect("trains"), losses);
}

#[test]
fn detectors_region_classifier_votes_and_fits_its_radius() {
    let clf = cnn();
    let (x, y) = test_images(0..64);
    // Radius 0: every copy is the image itself, so the vote is the point prediction and nothing disagrees.
    let r0 = RegionClassifier::new(clf.clone(), 0.0, 5, 0).expect("region");
    assert_eq!(r0.predict(&x).expect("predict"), clf.predict(&x).expect("predict"));
    assert!(r0.score(&x).expect("score").iter().all(|&s| s == 0.0));
    // Batch independence: one image alone scores as in the batch.
    let r = RegionClassifier::new(clf.clone(), 0.3, 20, 7).expect("region");
    let all = r.score(&x).expect("score");
    let one = r.score(&x.narrow(0, 5, 1).expect("one")).expect("score");
    assert_eq!(one[0], all[5]);
    // As a classifier: the outputs are vote fractions (rows sum to 1), the same on the graph, and the EOT
    // gradient of the noisy copies' mean logits is not zero.
    let few = x.narrow(0, 0, 4).expect("few");
    let z = r.logits(&few).expect("logits");
    for row in z.rows() {
        assert!((row.sum() - 1.0).abs() < 1e-6 && row.iter().all(|v| (v * 20.0 - (v * 20.0).round()).abs() < 1e-4));
    }
    let labels = &y[0..4];
    let ce = |z: &Tensor, rows: std::ops::Range<usize>| z.cross_entropy(&labels[rows], armoury::Reduction::None);
    let (_, grad, tracked_z) = r.gradient(&few, &ce).expect("gradient");
    let grad = grad.to_vec();
    assert_eq!(tracked_z, z, "the value on the graph is the vote");
    assert!(grad.iter().any(|g| *g != 0.0), "EOT gradient");
    // Fitting: the largest radius within the tolerance; a huge radius costs accuracy.
    let mut fit = RegionClassifier::new(clf.clone(), 0.0, 20, 0).expect("region");
    let chosen = fit.fit_radius(&x, &y, &[0.0, 0.05, 0.1, 0.9], 0.02).expect("fits");
    assert!(chosen < 0.9, "r = 0.9 destroys the images, got {chosen}");
    assert_eq!(fit.radius(), chosen);
    assert!(RegionClassifier::new(clf, -0.1, 5, 0).is_err());
}

#[test]
fn detectors_similarity_exact_knn_hand_computed_and_streams() {
    // Encoder: the 2 pixel values themselves.
    let enc = Arc::new(ModuleEncoder::new(Arc::new(Sequential::new().add("flatten", Flatten))));
    let mut d = StatefulDetector::new(enc.clone(), 1, IndexConfig::exact()).expect("detector");
    let q = Tensor::from_vec(vec![0.0, 0.0, 3.0, 4.0, 0.0, 1.0], &[3, 1, 1, 2]).expect("queries");
    assert!(d.observe(&q).expect("observe").iter().all(|f| !f), "no threshold: nothing flagged");
    // Read-only score of (0, 0.5) against the history {(0,0), (3,4), (0,1)}: nearest at 0.5.
    let probe = Tensor::from_vec(vec![0.0, 0.5], &[1, 1, 1, 2]).expect("probe");
    assert_eq!(d.score(&probe).expect("score"), vec![-0.5]);
    assert_eq!(d.history_len(), 3);
    // k = 2: mean of the two nearest of (0, 0.5): 0.5 and 0.5.
    let mut d2 = StatefulDetector::new(enc.clone(), 2, IndexConfig::exact()).expect("detector");
    d2.observe(&q).expect("observe");
    assert_eq!(d2.score(&probe).expect("score"), vec![-0.5]);
    // With threshold −0.6: a query within 0.6 of its neighbour is flagged, then the history is cleared.
    d.set_threshold(-0.6);
    let next = Tensor::from_vec(vec![0.0, 1.2, 9.0, 9.0, 9.0, 9.5], &[3, 1, 1, 2]).expect("next");
    assert_eq!(d.observe(&next).expect("observe"), vec![true, false, true]);
    assert_eq!(d.detections(), &[3, 5]);
    assert_eq!(d.intervals(), &[0..4, 4..6]);
    assert_eq!(d.history_len(), 0, "cleared after the detection");
    // The hashed index: a stream of near-duplicates is caught, spread-out benign streams are not.
    let mut lsh = StatefulDetector::new(enc, 3, IndexConfig { tables: 4, bits: 4, bucket_capacity: 32, seed: 1 })
        .expect("detector")
        .with_stream_len(20)
        .expect("len");
    let benign = Tensor::uniform(&[200, 1, 1, 2], 0.0, 100.0, 3);
    lsh.fit(&benign, 0.1).expect("calibrates");
    let attack: Vec<f32> = (0..40).flat_map(|i| [50.0 + 0.001 * i as f32, 50.0]).collect();
    let flags = lsh.observe(&Tensor::from_vec(attack, &[40, 1, 1, 2]).expect("attack")).expect("observe");
    assert!(flags.iter().any(|&f| f), "a crowd of queries is detected");
    assert!(!flags[0..3].iter().any(|&f| f), "not before k neighbours exist");
}

#[test]
fn detectors_logistic_separates_and_adaptive_attack_is_no_weaker() {
    let clean = Array2::from_shape_vec((4, 1), vec![0.0f32, 1.0, 0.5, 0.2]).expect("clean");
    let adv = Array2::from_shape_vec((4, 1), vec![3.0f32, 4.0, 3.5, 5.0]).expect("adv");
    let lr = Logistic::fit(&clean, &adv, &LogisticTraining::default()).expect("fits");
    let t = |v: f32| lr.apply(&Tensor::from_vec(vec![v], &[1, 1]).expect("f")).expect("apply").to_vec()[0];
    assert!(t(0.0) < 0.0 && t(5.0) > 0.0, "{lr:?}");
    assert!(lr.weights[0] > 0.0);

    // Feature squeezing in front of the cnn: PGD on the bare classifier vs the adaptive PGD with BPDA.
    let clf = cnn();
    let (fit_x, _) = test_images(100..300);
    let (x, y) = test_images(0..48);
    let mut sq = FeatureSqueezing::with_defaults(clf.clone(), 4).expect("squeeze");
    sq.fit(&fit_x, 0.05).expect("fits");
    let guarded = Guarded::new(clf.clone(), Arc::new(sq)).expect("guarded").with_scale(10.0).expect("scale");
    let clean_acc = protected_accuracy(&guarded, &x, &y, false).expect("accuracy");
    assert!(clean_acc > 0.7, "{clean_acc}");
    let pgd = AdaptivePgd { lambda: 0.0, ..AdaptivePgd::default() };
    let non_adaptive = pgd.run(clf.as_ref(), &x, &y, 0).expect("pgd");
    let adaptive = AdaptivePgd { lambda: 1.0, ..AdaptivePgd::default() }.run(&guarded, &x, &y, 0).expect("adaptive");
    let na = protected_accuracy(&guarded, &non_adaptive, &y, true).expect("na");
    let ad = protected_accuracy(&guarded, &adaptive, &y, true).expect("ad");
    assert!(ad <= na + 1e-9, "adaptive {ad} vs non-adaptive {na}");
    for (a, b) in adaptive.to_vec().iter().zip(x.to_vec()) {
        assert!((a - b).abs() <= 0.1 + 1e-6 && (0.0..=1.0).contains(a));
    }
}

#[test]
fn detectors_similarity_index_recall_and_one_hash_per_query() {
    // The exact search finds every true neighbour; the default index most of them on clustered encodings (ten
    // tight clusters: a probe's 5 nearest are members of its cluster), comparing at most tables × capacity
    // entries however long the history.
    let clustered = |n: usize, seed: u64| {
        let centres = gaussian_encodings(10, 16, 99).mapv(|v| 10.0 * v);
        let jitter = gaussian_encodings(n, 16, seed).mapv(|v| 0.1 * v);
        Array2::from_shape_fn((n, 16), |(i, j)| centres[[i % 10, j]] + jitter[[i, j]])
    };
    let (history, probes) = (clustered(3000, 1), clustered(80, 2));
    let exact = measure_index(5, IndexConfig::exact(), &history, &probes, &[300]).expect("exact");
    assert_eq!(exact[0].recall, 1.0);
    assert_eq!(exact[0].candidates, 300.0);
    let config = IndexConfig::default();
    let lsh = measure_index(5, config, &history, &probes, &[300, 3000]).expect("index");
    let cap = (config.tables * config.bucket_capacity) as f64;
    assert!(lsh.iter().all(|m| m.candidates <= cap && m.candidates >= 5.0), "{lsh:?}");
    assert!(lsh[0].recall > 0.5 && lsh[0].recall <= 1.0, "{lsh:?}");
    // Structureless Gaussian encodings: the hash finds few of the true neighbours (stated, not hidden).
    let (gh, gp) = (gaussian_encodings(3000, 16, 3), gaussian_encodings(60, 16, 4));
    let g = measure_index(5, config, &gh, &gp, &[3000]).expect("gaussian");
    assert!(g[0].recall < lsh[0].recall, "{g:?} vs {lsh:?}");
    // score_and_insert is score_encoding then insert_encoding.
    let enc = Arc::new(ModuleEncoder::new(Arc::new(Sequential::new().add("flatten", Flatten))));
    let mut a = StatefulDetector::new(enc.clone(), 2, IndexConfig { tables: 3, bits: 3, bucket_capacity: 8, seed: 2 })
        .expect("detector");
    let mut b = StatefulDetector::new(enc, 2, IndexConfig { tables: 3, bits: 3, bucket_capacity: 8, seed: 2 })
        .expect("detector");
    let points = Tensor::uniform(&[60, 1, 1, 4], -1.0, 1.0, 5).to_vec();
    for e in points.chunks(4) {
        let s = a.score_and_insert(e).expect("score and insert");
        let t = b.score_encoding(e);
        b.insert_encoding(e).expect("insert");
        assert_eq!(s.to_bits(), t.to_bits());
    }
    assert_eq!(a.history_len(), 60);
    assert!(a.exact_neighbours(&points[..4]).contains(&0), "a stored point is its own nearest");
}

#[test]
fn detectors_similarity_encoder_training_pulls_noisy_copies_together() {
    let encoder = || {
        Sequential::new()
            .add("flatten", Flatten)
            .add("fc1", Linear::new(784, 64, true, 3))
            .add("relu", ReLU)
            .add("fc2", Linear::new(64, 16, true, 4))
    };
    let trained: Arc<dyn Module> = Arc::new(encoder());
    let untrained: Arc<dyn Module> = Arc::new(encoder());
    let (train, _) = test_images(0..600);
    let cfg = SimilarityTraining { epochs: 4, batch_size: 64, noise: 0.1, margin: 10.0, ..Default::default() };
    let losses = train_similarity_encoder(trained.as_ref(), &train, (0.0, 1.0), &cfg).expect("trains");
    assert_eq!(losses.len(), 4);
    assert!(losses[3] < 0.7 * losses[0], "the contrastive loss falls: {losses:?}");
    // Held-out images: the ratio of the distance to a noisy copy over the distance to another image falls well
    // below the untrained encoder's.
    let (held, _) = test_images(700..900);
    let noisy = held.add(&Tensor::uniform(held.shape(), -0.1, 0.1, 9)).expect("noise").clamp(0.0, 1.0);
    let ratio = |m: &Arc<dyn Module>| {
        let e = ModuleEncoder::new(m.clone());
        let (f, fp) = (e_rows(&e, &held), e_rows(&e, &noisy));
        let n = f.nrows();
        let (mut pos, mut neg) = (0.0f64, 0.0f64);
        for i in 0..n {
            pos += (&f.row(i) - &fp.row(i)).mapv(|v| f64::from(v * v)).sum().sqrt();
            neg += (&f.row(i) - &f.row((i + 1) % n)).mapv(|v| f64::from(v * v)).sum().sqrt();
        }
        pos / neg
    };
    let (r_trained, r_untrained) = (ratio(&trained), ratio(&untrained));
    assert!(r_trained < 0.5 * r_untrained, "trained {r_trained} vs untrained {r_untrained}");
}

fn e_rows(e: &ModuleEncoder, x: &Tensor) -> Array2<f32> {
    use armoury_defenses::detectors::Encoder;
    e.encode(x).expect("encodes")
}

/// A classifier whose logits are its input's first two pixels, so a blinded query can be read back from them.
struct FirstPixels {
    shape: [usize; 3],
    counters: armoury::Counters,
}

impl Classifier for FirstPixels {
    fn input_shape(&self) -> &[usize] {
        &self.shape
    }
    fn num_classes(&self) -> usize {
        2
    }
    fn bounds(&self) -> (f32, f32) {
        (0.0, 1.0)
    }
    fn counters(&self) -> &armoury::Counters {
        &self.counters
    }
    fn forward(&self, x: &Tensor) -> armoury::Result<Tensor> {
        let n = x.shape()[0];
        x.reshape(&[n, 4])?.narrow(1, 0, 2)
    }
}

#[test]
fn detectors_query_blinding_adds_bounded_per_query_noise_and_metrics_from_scores() {
    let inner: Arc<dyn Classifier> = Arc::new(FirstPixels { shape: [1, 2, 2], counters: Default::default() });
    let q = Tensor::from_vec(vec![0.0, 1.0, 0.5, 0.5, 0.3, 0.3, 0.3, 0.3], &[2, 1, 2, 2]).expect("queries");
    let blind = QueryBlinding::new(inner.clone(), 0.2, 7).expect("blinding");
    let sent = blind.blind(&q).expect("blinded").to_vec();
    let orig = q.to_vec();
    for (s, o) in sent.iter().zip(&orig) {
        assert!((s - o).abs() <= 0.2 + 1e-6 && (0.0..=1.0).contains(s), "{s} from {o}");
    }
    assert!(sent.iter().zip(&orig).filter(|(s, o)| s != o).count() >= 5, "noise on most pixels: {sent:?}");
    // Pixel 0 of query 0 is 0: its noise is clipped from below, so it can only go up; pixel 1 (1.0) only down.
    assert!(sent[0] >= 0.0 && sent[1] <= 1.0);
    // The model answers the blinded query: its logits are the blinded first two pixels.
    let z = blind.logits(&q).expect("logits");
    assert_eq!(z.iter().copied().collect::<Vec<f32>>(), vec![sent[0], sent[1], sent[4], sent[5]]);
    // Per query from its own values: the second query alone is blinded as in the batch; another seed differs.
    let alone = blind.blind(&q.narrow(0, 1, 1).expect("one")).expect("blinded").to_vec();
    assert_eq!(alone, sent[4..].to_vec());
    let other = QueryBlinding::new(inner.clone(), 0.2, 8).expect("blinding").blind(&q).expect("b").to_vec();
    assert_ne!(other, sent);
    assert_eq!(QueryBlinding::new(inner.clone(), 0.0, 7).expect("r = 0").blind(&q).expect("b").to_vec(), orig);
    assert!(QueryBlinding::new(inner, f32::NAN, 0).is_err());

    // DetectionMetrics of scores: the hand-computed AUC of detectors_roc_hand_computed, TPR at 1% FPR.
    let m = DetectionMetrics::from_scores(&[0.1, 0.4], &[0.35, 0.8]).expect("metrics");
    assert!(close(m.auc, 0.75, 1e-12) && close(m.tpr_at_1fpr, 0.5, 1e-12), "{m:?}");
    // protected_correct: right, or rejected when rejection defends; its share is protected_accuracy.
    let clf = cnn();
    let (x, y) = test_images(0..20);
    let pred = clf.predict(&x).expect("pred");
    let ok = protected_correct(clf.as_ref(), &x, &y, true).expect("ok");
    assert_eq!(ok, pred.iter().zip(&y).map(|(p, l)| p == l).collect::<Vec<_>>());
    let share = ok.iter().filter(|&&c| c).count() as f64 / 20.0;
    assert_eq!(protected_accuracy(clf.as_ref(), &x, &y, true).expect("acc"), share);
}

/// MagNet assembled from a configuration (`detectors::magnet_pipeline`): the auto-encoders are trained once,
/// reported to the progress hook (every epoch, and each auto-encoder trained), cached, and loaded from the
/// cache by the next run with the same settings, which scores the same; a bad part is an error naming it.
#[test]
fn magnet_pipeline_trains_caches_and_reports() {
    use armoury_defenses::detectors::{magnet_pipeline, MagnetConfig, MagnetProgress};
    use std::sync::Mutex;
    let model: std::sync::Arc<dyn armoury::Classifier> = std::sync::Arc::new(crate::attack_props::fixture_cnn());
    let set = armoury::data::sample().unwrap();
    let dir = std::env::temp_dir().join(format!("armoury-magnet-pipeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = MagnetConfig {
        ae1: (64, 1),
        ae2: (64, 2),
        parts: vec!["l1-ii".into(), "jsd10-ii".into()],
        cache: dir.clone(),
        ..MagnetConfig::default()
    };
    let events = Mutex::new(Vec::new());
    let hook = |p: &MagnetProgress<'_>| {
        let kind = match p {
            MagnetProgress::Loaded { .. } => "loaded",
            MagnetProgress::Step(_) => "step",
            MagnetProgress::Epoch(_) => "epoch",
            MagnetProgress::Trained { .. } => "trained",
        };
        events.lock().unwrap().push((kind, p.to_string()));
    };
    let mut first = magnet_pipeline(&cfg, &model, &set, &hook).unwrap();
    let seen = std::mem::take(&mut *events.lock().unwrap());
    let count = |v: &[(&str, String)], k: &str| v.iter().filter(|e| e.0 == k).count();
    assert_eq!(count(&seen, "trained"), 2, "II for the parts, I for the reformer: {seen:?}");
    assert_eq!(count(&seen, "epoch"), 3, "2 epochs of II, 1 of I");
    assert!(count(&seen, "step") >= 3 && count(&seen, "loaded") == 0);
    assert!(
        seen.iter().any(|e| e.1.starts_with("trained MagNet auto-encoder MnistII: 2 epochs on 64 images")),
        "{seen:?}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "both auto-encoders cached");

    let mut second = magnet_pipeline(&cfg, &model, &set, &hook).unwrap();
    let seen = std::mem::take(&mut *events.lock().unwrap());
    assert_eq!((count(&seen, "loaded"), count(&seen, "trained")), (2, 0), "{seen:?}");
    use armoury::Detector;
    let (fit_x, _) = set.train.batch(0..100).unwrap();
    assert_eq!(first.fit(&fit_x, 0.05).unwrap(), second.fit(&fit_x, 0.05).unwrap(), "the same threshold");
    let (x, _) = set.test.batch(0..8).unwrap();
    assert_eq!(first.score(&x).unwrap(), second.score(&x).unwrap(), "the cached auto-encoders score the same");

    let bad = MagnetConfig { parts: vec!["l3-ii".into()], ..cfg.clone() };
    let err = magnet_pipeline(&bad, &model, &set, &hook).err().expect("l3").to_string();
    assert!(err.contains("l3-ii") && err.contains("l1, l2, jsd10 or jsd40"), "{err}");
    let bad = MagnetConfig { parts: vec!["l1-iii".into()], ..cfg };
    assert!(magnet_pipeline(&bad, &model, &set, &hook).is_err(), "auto-encoder iii");
    let _ = std::fs::remove_dir_all(&dir);
}
