//! `armoury::metrics`: Wilson intervals, SSIM, and MindArmour's attack, defense, black-box defense and neuron
//! metrics and radar data.
//!
//! Reference values come from three sources: the golden values of MindArmour's own tests (recomputed by hand,
//! ±1e-4), hand-computed cases, and `tests/fixtures/scripts/metrics_reference.py`, an independent numpy
//! implementation run on the same inputs (made on both sides by the counter-based generator below); its
//! printed outputs are the `REF_*` constants. Its SSIM filters the whole image with reflected borders and crops
//! the border, as scikit-image does, and agrees with scikit-image 0.26's `structural_similarity` within 2e-16.
// The constants are the script's 17-significant-digit output, copied verbatim.
#![allow(clippy::excessive_precision)]

use std::sync::Arc;

use armoury::io::load_module;
use armoury::metrics::{
    activation_sensitivity, attack_metrics, attack_metrics_of, attack_radar, black_defense_metrics, defense_metrics,
    defense_radar, neuron_sensitivity, radar, ssim, ssim_batch, ssim_slices, wilson, BlackDefenseRecord, Z95,
};
use armoury::report::RadarSeries;
use armoury::{Attack, Classifier, Goal, Module, ModuleClassifier, Tensor};
use armoury_attacks::Pgd;
use ndarray::Array2;

use crate::common::fixture;

// ------------------------------------------------------------------------------------- the shared generator

/// SplitMix64, as in the script.
fn splitmix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The script's `uniform(seed, n)`: counter k = 0..n, top 53 bits as a float in [0, 1).
fn uniform(seed: u64, n: usize) -> Vec<f64> {
    (0..n as u64)
        .map(|k| (splitmix(seed.wrapping_mul(1_000_003).wrapping_add(k)) >> 11) as f64 / (1u64 << 53) as f64)
        .collect()
}

/// The script's `image_pair(seed, shape, lo, hi, eps, keep, zeros)`.
fn image_pair(seed: u64, shape: &[usize], lo: f64, hi: f64, eps: f64, keep: f64, zeros: f64) -> (Tensor, Tensor) {
    let n: usize = shape.iter().product();
    let (u, v, w, z) = (uniform(seed, n), uniform(seed + 1, n), uniform(seed + 2, n), uniform(seed + 3, n));
    let x: Vec<f32> = (0..n).map(|i| if z[i] < zeros { lo as f32 } else { (lo + (hi - lo) * u[i]) as f32 }).collect();
    let adv: Vec<f32> = (0..n)
        .map(|i| if w[i] >= keep { (x[i] as f64 + eps * (2.0 * v[i] - 1.0)).clamp(lo, hi) as f32 } else { x[i] })
        .collect();
    (Tensor::from_vec(x, shape).unwrap(), Tensor::from_vec(adv, shape).unwrap())
}

/// The script's `probabilities(seed, n, classes)`: float32 rows (u + 0.01) / Σ(u + 0.01).
fn probabilities(seed: u64, n: usize, classes: usize) -> Array2<f32> {
    let u = uniform(seed, n * classes);
    Array2::from_shape_fn((n, classes), |(i, j)| {
        let row: Vec<f64> = (0..classes).map(|k| u[i * classes + k] as f32 as f64 + 0.01).collect();
        (row[j] / row.iter().sum::<f64>()) as f32
    })
}

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want} (±{tol})");
}

// ------------------------------------------------------------------------------------- SSIM

/// The script's SSIM values (seed, shape, data range).
const REF_SSIM: [(u64, [usize; 3], f64, f64, f64); 3] = [
    (1, [1, 28, 28], 0.0, 1.0, 0.963_598_968_243_598_03),
    (2, [3, 16, 13], 0.0, 1.0, 0.951_695_488_753_346_2),
    (3, [2, 11, 12], -1.0, 1.0, 0.954_515_975_699_561_59),
];

#[test]
fn ssim_matches_the_numpy_reference() {
    for (seed, shape, lo, hi, want) in REF_SSIM {
        let (x, adv) = image_pair(seed, &shape, lo, hi, 0.2 * (hi - lo), 0.3, 0.2);
        close(ssim(&x, &adv, hi - lo).unwrap(), want, 1e-12, &format!("ssim seed {seed}"));
        // Symmetric in its arguments, and the same through every accepted shape.
        close(ssim(&adv, &x, hi - lo).unwrap(), want, 1e-12, "ssim swapped");
        let batch = |t: &Tensor| Tensor::from_vec(t.to_vec(), &[1, shape[0], shape[1], shape[2]]).unwrap();
        close(ssim(&batch(&x), &batch(&adv), hi - lo).unwrap(), want, 1e-12, "ssim [1,C,H,W]");
        close(ssim_batch(&batch(&x), &batch(&adv), hi - lo).unwrap()[0], want, 1e-12, "ssim_batch");
    }
}

#[test]
fn ssim_batch_scores_each_pair_and_the_data_range_matters() {
    let (x, adv) = image_pair(5, &[3, 1, 12, 12], 0.0, 1.0, 0.3, 0.3, 0.2);
    let scores = ssim_batch(&x, &adv, 1.0).unwrap();
    assert_eq!(scores.len(), 3);
    let (xv, av) = (x.to_vec(), adv.to_vec());
    for (i, s) in scores.iter().enumerate() {
        let r = i * 144..(i + 1) * 144;
        assert_eq!(*s, ssim_slices(&xv[r.clone()], &av[r], [1, 12, 12], 1.0).unwrap());
    }
    // A larger data range makes C1, C2 larger: differences weigh less, SSIM rises.
    let wide = ssim_batch(&x, &adv, 255.0).unwrap();
    assert!(wide.iter().zip(&scores).all(|(w, s)| w > s));
    // A 2-D image is one channel.
    let img = Tensor::from_vec(xv[..144].to_vec(), &[12, 12]).unwrap();
    let other = Tensor::from_vec(av[..144].to_vec(), &[12, 12]).unwrap();
    assert_eq!(ssim(&img, &other, 1.0).unwrap(), scores[0]);
    assert!(ssim(&img, &x, 1.0).is_err());
}

// ------------------------------------------------------------------------------------- Wilson

#[test]
fn wilson_matches_the_numpy_reference_and_rejects_misuse() {
    // (successes, n, value, lo, hi) from the script, z = Z95.
    let refs = [
        (0, 10, 0.0, 0.0, 0.277_532_799_862_889_2),
        (3, 10, 0.3, 0.107_791_267_406_300_99, 0.603_221_852_538_854_63),
        (80, 100, 0.8, 0.711_170_834_406_841_15, 0.866_633_066_668_967_56),
        (1000, 1000, 1.0, 0.996_173_241_514_444_97, 1.0),
        (1, 1, 1.0, 0.206_549_314_377_237_45, 1.0),
    ];
    for (k, n, v, lo, hi) in refs {
        let ci = wilson(k, n, Z95).unwrap();
        close(ci.value, v, 1e-15, "value");
        close(ci.lo, lo, 1e-12, &format!("lo {k}/{n}"));
        close(ci.hi, hi, 1e-12, &format!("hi {k}/{n}"));
    }
    // The textbook example: 80/100 at 95% is about [0.711, 0.867].
    let ci = wilson(80, 100, 1.96).unwrap();
    assert!((ci.lo - 0.7112).abs() < 1e-3 && (ci.hi - 0.8666).abs() < 1e-3, "{ci:?}");
    assert!(wilson(0, 0, Z95).is_err());
    assert!(wilson(3, 2, Z95).is_err());
    assert!(wilson(1, 2, 0.0).is_err());
    assert!(wilson(1, 2, f64::NAN).is_err());
}

// ------------------------------------------------------------------------------------- attack metrics

/// The script's attack-metric values on `image_pair(10, [6,1,14,14])`, labels [0,1,2,3,4,0] and
/// `probabilities(20, 6, 5)` (predictions [0,4,2,1,2,4]): MR, ACAC, ACTC, L0, L2, L∞, ASS, NTE.
const REF_UNTARGETED: [f64; 8] = [
    0.666_666_666_666_666_63,
    0.354_742_474_853_992_46,
    0.125_391_434_878_110_89,
    0.823_481_581_337_184_08,
    0.092_907_506_530_844_119,
    0.100_521_264_669_613_47,
    0.988_957_706_664_584_82,
    0.054_580_301_046_371_46,
];
/// The same with targets [1,4,2,2,2,4].
const REF_TARGETED: [f64; 8] = [
    0.666_666_666_666_666_63,
    0.354_021_027_684_211_73,
    0.132_226_880_639_791_49,
    0.823_254_064_169_979_7,
    0.091_441_326_897_035_935,
    0.100_419_740_400_349_03,
    0.988_982_340_933_470_37,
    0.064_929_511_398_077_011,
];

#[test]
fn attack_metrics_match_the_numpy_reference() {
    let (x, adv) = image_pair(10, &[6, 1, 14, 14], 0.0, 1.0, 0.1, 0.3, 0.2);
    let labels = [0, 1, 2, 3, 4, 0];
    let probs = probabilities(20, 6, 5);
    assert_eq!(armoury::classifier::argmax_rows(&probs), vec![0, 4, 2, 1, 2, 4]);
    let targets = [1, 4, 2, 2, 2, 4];
    for (t, want) in [(None, REF_UNTARGETED), (Some(&targets[..]), REF_TARGETED)] {
        let m = attack_metrics(&x, &adv, &labels, &probs, t, 1.0).unwrap();
        assert_eq!((m.samples, m.successes), (6, 4));
        let got = [
            m.misclassification_rate,
            m.avg_confidence_adversarial,
            m.avg_confidence_true,
            m.avg_relative_l0,
            m.avg_relative_l2,
            m.avg_relative_linf,
            m.avg_ssim.unwrap(),
            m.nte,
        ];
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            close(*g, w, 1e-12, &format!("metric {k}, targeted {}", t.is_some()));
        }
    }
}

/// MindArmour's `test_attack_eval` recomputed: one-hot labels [3, 1, 0], adversarial probabilities whose
/// predictions are [3, 2, 1], every pixel moved by 0.001 from an image with no zero: MR 2/3, ACAC (0.8 + 0.9)/2,
/// ACTC (0 + 0)/2, relative L0 1 (every pixel changed), NTE ((0.8 − 0.1) + (0.9 − 0.1))/2 = 0.75.
#[test]
fn attack_metrics_reproduce_mindarmours_test() {
    let n = 3 * 3 * 16 * 16;
    let x: Vec<f32> = uniform(7, n).iter().map(|u| (0.5 + 0.4 * u) as f32).collect();
    let adv: Vec<f32> = x.iter().map(|v| v + 0.001).collect();
    let (xt, at) = (
        Tensor::from_vec(x.clone(), &[3, 3, 16, 16]).unwrap(),
        Tensor::from_vec(adv.clone(), &[3, 3, 16, 16]).unwrap(),
    );
    let probs =
        Array2::from_shape_vec((3, 4), vec![0.1, 0.1, 0.2, 0.6, 0.1, 0.0, 0.8, 0.1, 0.0, 0.9, 0.1, 0.0]).unwrap();
    let m = attack_metrics(&xt, &at, &[3, 1, 0], &probs, None, 1.0).unwrap();
    close(m.misclassification_rate, 2.0 / 3.0, 1e-12, "MR");
    close(m.avg_confidence_adversarial, 0.85, 1e-7, "ACAC");
    close(m.avg_confidence_true, 0.0, 1e-12, "ACTC");
    close(m.avg_relative_l0, 1.0, 1e-12, "L0");
    close(m.nte, 0.75, 1e-7, "NTE");
    // Relative L2 and L∞ of sample 1 and 2 by hand, in f64 on the f32 values.
    let (mut l2, mut linf) = (0.0, 0.0);
    for i in 1..3 {
        let r = i * 768..(i + 1) * 768;
        let d: Vec<f64> = x[r.clone()].iter().zip(&adv[r.clone()]).map(|(a, b)| *b as f64 - *a as f64).collect();
        let xn = x[r.clone()].iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        l2 += d.iter().map(|v| v * v).sum::<f64>().sqrt() / xn / 2.0;
        let xm = x[r].iter().fold(0.0f64, |a, v| a.max(*v as f64));
        linf += d.iter().fold(0.0f64, |a, v| a.max(v.abs())) / xm / 2.0;
    }
    close(m.avg_relative_l2, l2, 1e-12, "L2");
    close(m.avg_relative_linf, linf, 1e-12, "Linf");
    // A shift of 0.001 barely changes the structure: SSIM near 1.
    assert!(m.avg_ssim.unwrap() > 0.999, "{:?}", m.avg_ssim);
}

#[test]
fn attack_metrics_are_defined_without_success_and_on_small_images() {
    let (x, adv) = image_pair(11, &[4, 1, 12, 12], 0.0, 1.0, 0.1, 0.3, 0.2);
    let probs = probabilities(21, 4, 3);
    let labels = armoury::classifier::argmax_rows(&probs); // every prediction is the label: no success
    let m = attack_metrics(&x, &adv, &labels, &probs, None, 1.0).unwrap();
    assert_eq!(m.successes, 0);
    let values = [m.misclassification_rate, m.avg_confidence_adversarial, m.avg_confidence_true, m.avg_relative_l0];
    assert!(values.iter().chain(&[m.avg_relative_l2, m.avg_relative_linf, m.nte]).all(|v| *v == 0.0));
    assert_eq!(m.avg_ssim, Some(0.0));
    // 4×4 images are below the SSIM window: no SSIM, everything else computed.
    let (x, adv) = image_pair(12, &[4, 1, 4, 4], 0.0, 1.0, 0.1, 0.0, 0.0);
    let m = attack_metrics(&x, &adv, &[1, 1, 1, 1], &probs, None, 1.0).unwrap();
    assert_eq!(m.avg_ssim, None);
    assert!(m.successes > 0 && m.avg_relative_l2 > 0.0);
    // Misuse.
    assert!(attack_metrics(&x, &adv, &[1, 1, 1], &probs, None, 1.0).is_err());
    assert!(attack_metrics(&x, &adv, &[1, 1, 1, 3], &probs, None, 1.0).is_err());
    assert!(attack_metrics(&x, &adv, &[1, 1, 1, 1], &probs, Some(&[0, 0, 0, 9]), 1.0).is_err());
    assert!(attack_metrics(&x, &adv, &[1, 1, 1, 1], &probs, None, 0.0).is_err());
    assert!(attack_metrics(&x, &x.narrow(0, 0, 2).unwrap(), &[1, 1, 1, 1], &probs, None, 1.0).is_err());
}

fn cnn() -> ModuleClassifier {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let m: Arc<dyn Module> = Arc::new(m);
    ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier")
}

#[test]
fn attack_metrics_of_an_attack_result_agree_with_its_success_flags() {
    let model = cnn();
    let set = armoury::data::sample().unwrap();
    let (x, y) = set.test.batch(0..32).unwrap();
    let result = Pgd::fgsm(0.1).run(&model, &x, &y, &Goal::Untargeted, 0).unwrap();
    let m = attack_metrics_of(&model, &x, &y, &result).unwrap();
    let successes = result.success.iter().filter(|s| **s).count();
    assert_eq!(m.successes, successes);
    assert!(successes > 0);
    assert!(m.avg_relative_linf > 0.0);
    let probs = model.probabilities(&result.adversarial).unwrap();
    assert_eq!(m, attack_metrics(&x, &result.adversarial, &y, &probs, None, 1.0).unwrap());
}

// ------------------------------------------------------------------------------------- defense metrics

/// MindArmour's DefenseEvaluate test inputs (raw and defended probabilities; labels [3, 1, 0]).
pub(crate) fn golden_probabilities() -> (Array2<f32>, Array2<f32>) {
    let raw = Array2::from_shape_vec((3, 4), vec![0.1, 0.1, 0.2, 0.6, 0.1, 0.7, 0.0, 0.2, 0.8, 0.1, 0.0, 0.1]).unwrap();
    let def = Array2::from_shape_vec((3, 4), vec![0.1, 0.1, 0.1, 0.7, 0.1, 0.6, 0.2, 0.1, 0.1, 0.2, 0.1, 0.6]).unwrap();
    (raw, def)
}

#[test]
fn defense_metrics_match_the_golden_values() {
    let (raw, def) = golden_probabilities();
    let m = defense_metrics(&raw, &def, &[3, 1, 0]).unwrap();
    close(m.cav, -0.3333, 1e-4, "CAV");
    close(m.crr, 0.0, 1e-4, "CRR");
    close(m.csr, 0.3333, 1e-4, "CSR");
    close(m.ccv.unwrap(), 0.0999, 1e-4, "CCV");
    close(m.cos.unwrap(), 0.0450, 1e-4, "COS");
    // The script's values, tighter.
    close(m.ccv.unwrap(), 0.099_999_964_237_213_135, 1e-12, "CCV (script)");
    close(m.cos.unwrap(), 0.045_077_287_847_707_96, 1e-12, "COS (script)");
}

#[test]
fn defense_radar_maps_the_golden_metrics_to_larger_is_better() {
    let (raw, def) = golden_probabilities();
    let golden = defense_metrics(&raw, &def, &[3, 1, 0]).unwrap();
    // By hand from CAV −1/3, CRR 0, CSR 1/3, CCV 0.1, COS 0.045077: (1 − 1/3)/2, 0, 1 − 1/3, 0.9, 1 − COS/ln 2.
    let r = defense_radar(&[("golden".into(), golden.clone())]).unwrap();
    assert_eq!(r.axes.len(), 5);
    let want = [1.0 / 3.0, 0.0, 2.0 / 3.0, 0.9, 1.0 - 0.045_077_287_847_707_96 / std::f64::consts::LN_2];
    for (k, (got, want)) in r.series[0].values.iter().zip(want).enumerate() {
        close(*got, want, 1e-6, &format!("axis {k}"));
    }
    // Without a sample both models get right, CCV's and COS's axes are 0, not NaN; a perfect defense is all 1.
    let none = armoury::metrics::DefenseMetrics { cav: 1.0, crr: 1.0, csr: 0.0, ccv: None, cos: None };
    let perfect = armoury::metrics::DefenseMetrics { ccv: Some(0.0), cos: Some(0.0), ..none.clone() };
    let r = defense_radar(&[("none".into(), none), ("perfect".into(), perfect)]).unwrap();
    assert_eq!(r.series[0].values, vec![1.0, 1.0, 1.0, 0.0, 0.0]);
    assert_eq!(r.series[1].values, vec![1.0; 5]);
    assert!(defense_radar(&[]).is_err());
}

#[test]
fn defense_metrics_match_the_numpy_reference_and_reject_misuse() {
    let (raw, def) = (probabilities(30, 8, 4), probabilities(31, 8, 4));
    let labels = [0, 3, 0, 1, 2, 0, 3, 2];
    let m = defense_metrics(&raw, &def, &labels).unwrap();
    close(m.cav, -0.125, 1e-15, "CAV");
    close(m.crr, 0.25, 1e-15, "CRR");
    close(m.csr, 0.375, 1e-15, "CSR");
    close(m.ccv.unwrap(), 0.096_691_489_219_665_527, 1e-12, "CCV");
    close(m.cos.unwrap(), 0.063_815_517_019_728_277, 1e-12, "COS");
    // No sample right on both: CCV and COS are undefined, not NaN.
    let m = defense_metrics(&raw, &def, &[1, 1, 1, 0, 0, 2, 2, 3]).unwrap();
    assert_eq!((m.ccv, m.cos), (None, None));
    assert!(defense_metrics(&raw, &def, &labels[..7]).is_err());
    assert!(defense_metrics(&raw, &def, &[0, 0, 0, 0, 0, 0, 0, 4]).is_err());
    assert!(defense_metrics(&raw, &raw.slice(ndarray::s![..7, ..]).to_owned(), &labels[..7]).is_err());
    let mut bad = raw.clone();
    bad[[0, 0]] = f32::NAN;
    assert!(defense_metrics(&bad, &def, &labels).is_err());
}

fn golden_record() -> BlackDefenseRecord {
    let labels = vec![0, 1, 2, 3, 0, 1, 2, 3, 0, 1];
    let raw_predictions = vec![0, 1, 2, 3, 0, 2, 3, 0, 1, 2];
    BlackDefenseRecord {
        defended_predictions: raw_predictions.clone(),
        raw_predictions,
        raw_queries: vec![0, 0, 0, 0, 0, 10, 10, 20, 20, 30],
        defended_queries: vec![0, 0, 0, 0, 0, 30, 30, 40, 40, 50],
        raw_seconds: vec![0.1, 0.1, 0.1, 0.1, 0.1, 2.0, 2.0, 4.0, 4.0, 6.0],
        defended_seconds: vec![0.3, 0.3, 0.3, 0.3, 0.3, 4.0, 4.0, 8.0, 8.0, 12.0],
        detections: vec![1, 0, 0, 0, 1, 5, 5, 5, 10, 20],
        labels,
        max_queries: 100,
    }
}

#[test]
fn black_defense_metrics_match_the_golden_values() {
    let m = black_defense_metrics(&golden_record()).unwrap();
    close(m.qcv, 0.2, 1e-4, "QCV");
    close(m.asv, 0.0, 1e-4, "ASV");
    close(m.fpr.unwrap(), 0.4, 1e-4, "FPR");
    close(m.qrv.unwrap(), 2.0, 1e-4, "QRV");
    // The script's case with flips: the defense stops 3 of the 5 attacked samples' successes.
    let mut r = golden_record();
    r.defended_predictions = vec![0, 1, 2, 3, 0, 1, 3, 3, 0, 2];
    let m = black_defense_metrics(&r).unwrap();
    close(m.asv, 0.599_999_999_999_999_98, 1e-15, "ASV (script)");
    close(m.qcv, 0.2, 1e-15, "QCV (script)");
    close(m.qrv.unwrap(), 1.999_999_999_999_999_8, 1e-12, "QRV (script)");
    // The defended mean at the budget and the raw one below it: QCV is 1.
    let mut r = golden_record();
    r.defended_queries = vec![0, 0, 0, 0, 0, 100, 100, 100, 100, 100];
    close(black_defense_metrics(&r).unwrap().qcv, 1.0, 0.0, "QCV at the budget");
}

#[test]
fn black_defense_metrics_reject_misuse() {
    let mut r = golden_record();
    r.detections.pop();
    assert!(black_defense_metrics(&r).is_err());
    let mut r = golden_record();
    r.defended_queries[5] = 0; // attacked on the raw model, benign on the defended one
    assert!(black_defense_metrics(&r).is_err());
    let mut r = golden_record();
    r.raw_queries = vec![0; 10];
    r.defended_queries = vec![0; 10];
    assert!(black_defense_metrics(&r).is_err());
    let mut r = golden_record();
    r.max_queries = 0;
    assert!(black_defense_metrics(&r).is_err());
    let mut r = golden_record();
    r.raw_seconds[0] = f64::NAN;
    assert!(black_defense_metrics(&r).is_err());
    // No benign sample: FPR and QRV undefined.
    let mut r = golden_record();
    r.raw_queries = vec![5; 10];
    r.defended_queries = vec![9; 10];
    let m = black_defense_metrics(&r).unwrap();
    assert_eq!((m.fpr, m.qrv), (None, None));
}

// ------------------------------------------------------------------------------------- neurons and radar

#[test]
fn neuron_sensitivity_matches_the_numpy_reference() {
    let (a, b) = image_pair(40, &[5, 3, 4, 4], 0.0, 1.0, 0.5, 0.5, 0.0);
    let want = [0.116_508_615_552_447_74, 0.092_542_789_597_064_259, 0.087_291_469_261_981_544];
    for (g, w) in activation_sensitivity(&a, &b).unwrap().iter().zip(want) {
        close(*g, w, 1e-12, "conv sensitivity");
    }
    let (a, b) = image_pair(41, &[5, 6], 0.0, 1.0, 0.5, 0.5, 0.0);
    let want = [
        0.199_729_937_314_987_17,
        0.101_066_005_229_949_95,
        0.044_946_929_812_431_334,
        0.045_322_819_054_126_738,
        0.100_676_912_069_320_68,
        0.052_050_554_752_349_855,
    ];
    let got = activation_sensitivity(&a, &b).unwrap();
    assert_eq!(got.len(), 6);
    for (g, w) in got.iter().zip(want) {
        close(*g, w, 1e-12, "dense sensitivity");
    }
    assert!(activation_sensitivity(&a, &a.narrow(0, 0, 2).unwrap()).is_err());
    assert!(activation_sensitivity(&Tensor::zeros(&[3]), &Tensor::zeros(&[3])).is_err());
}

#[test]
fn neuron_sensitivity_reads_the_layer_taps() {
    let model = cnn();
    let set = armoury::data::sample().unwrap();
    let (x, y) = set.test.batch(0..16).unwrap();
    let adv = Pgd::fgsm(0.1).run(&model, &x, &y, &Goal::Untargeted, 0).unwrap().adversarial;
    let layers = ["conv1_relu", "pool2", "fc1_relu"];
    let s = neuron_sensitivity(&model, &x, &adv, &layers).unwrap();
    assert_eq!(s.iter().map(|l| l.layer.as_str()).collect::<Vec<_>>(), layers);
    assert_eq!(s.iter().map(|l| l.sensitivity.len()).collect::<Vec<_>>(), vec![16, 32, 128]);
    let (ca, aa) = (model.activations(&x, &layers).unwrap(), model.activations(&adv, &layers).unwrap());
    for (k, l) in s.iter().enumerate() {
        assert_eq!(l.sensitivity, activation_sensitivity(&ca.layers[k].1, &aa.layers[k].1).unwrap());
        assert!(l.mean() > 0.0, "{}: an FGSM step moves every layer", l.layer);
    }
    // The same inputs: nothing moves.
    let same = neuron_sensitivity(&model, &x, &x, &layers).unwrap();
    assert!(same.iter().all(|l| l.sensitivity.iter().all(|v| *v == 0.0)));
    assert!(neuron_sensitivity(&model, &x, &adv, &["no_such_layer"]).is_err());
}

#[test]
fn radar_data_is_validated_and_attack_radar_orients_every_axis() {
    let axes = || vec!["MR".to_string(), "ACAC".into(), "ASS".into(), "NTE".into(), "RGB".into()];
    let series = |name: &str, values: Vec<f64>| RadarSeries { name: name.into(), values };
    // MindArmour's test_radar_metric data.
    let r = radar(
        axes(),
        vec![series("before", vec![0.9, 0.85, 0.6, 0.7, 0.8]), series("after", vec![0.5, 0.3, 0.55, 0.65, 0.7])],
    )
    .unwrap();
    assert_eq!(r.series.len(), 2);
    assert!(radar(axes()[..3].to_vec(), vec![series("a", vec![0.9, 0.85, 0.6, 0.7, 0.8])]).is_err());
    assert!(radar(axes()[..2].to_vec(), vec![series("a", vec![0.9, 0.85])]).is_err());
    assert!(radar(axes(), vec![]).is_err());
    assert!(radar(axes(), vec![series("a", vec![0.9, 0.85, 1.6, 0.7, 0.8])]).is_err());
    assert!(radar(axes(), vec![series("a", vec![0.9, 0.85, f64::NAN, 0.7, 0.8])]).is_err());

    let (x, adv) = image_pair(10, &[6, 1, 14, 14], 0.0, 1.0, 0.1, 0.3, 0.2);
    let m = attack_metrics(&x, &adv, &[0, 1, 2, 3, 4, 0], &probabilities(20, 6, 5), None, 1.0).unwrap();
    let r = attack_radar(&[("fgsm".into(), m.clone())]).unwrap();
    assert_eq!(r.axes, vec!["MR", "ACAC", "1 − ACTC", "ASS", "NTE"]);
    let v = &r.series[0].values;
    assert_eq!(
        v,
        &vec![
            m.misclassification_rate,
            m.avg_confidence_adversarial,
            1.0 - m.avg_confidence_true,
            m.avg_ssim.unwrap(),
            m.nte
        ]
    );
    let small = armoury::metrics::AttackMetrics { avg_ssim: None, ..m };
    assert_eq!(attack_radar(&[("small".into(), small)]).unwrap().axes.len(), 4);
    assert!(attack_radar(&[]).is_err());
}
