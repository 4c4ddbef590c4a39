//! The fuzzer (`armoury::fuzz`): mutations against hand-computed images, the configuration file and its errors,
//! DeepHunter's validity rule, and runs on the fixture cnn — consistency of the report, one affine or
//! adversarial step per lineage, valid failures that really fail before and after shrinking, the gain threshold,
//! adversarial mutations through `&dyn Attack`, and bit-identical runs on 1 and 2 threads.

use std::sync::Arc;

use armoury::coverage::{Bounds, Metric, NeuronTaps};
use armoury::fuzz::config::{MethodSpec, MutationConfig, ParamChoice};
use armoury::fuzz::mutate::{apply, Group, Method, Step};
use armoury::fuzz::{FuzzConfig, FuzzReport, Fuzzer, Validity};
use armoury::io::{load_module, SafetensorsFile};
use armoury::{Classifier, Module, ModuleClassifier, Tensor};
use armoury_attacks::registry::{by_name, AttackParams};

use crate::common::fixture;

fn step(method: Method, p0: f32, p1: f32) -> Step {
    Step { method, params: [p0, p1], attack: None, seed: 3 }
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}: element {i} = {g}, expected {w}");
    }
}

#[test]
fn fuzz_pixel_mutations_hand_computed() {
    let b = (0.0, 1.0);
    // Contrast α = 2 around the mean 0.5: 0.5 ± 2·0.5, clipped.
    close(&apply(&step(Method::Contrast, 2.0, 0.0), &[0.0, 0.5, 1.0], [1, 1, 3], b), &[0.0, 0.5, 1.0], 0.0, "contrast");
    close(
        &apply(&step(Method::Contrast, 0.5, 0.0), &[0.0, 0.5, 1.0], [1, 1, 3], b),
        &[0.25, 0.5, 0.75],
        1e-7,
        "contrast",
    );
    // Brightness β = 0.2 of the range 2 on bounds (−1, 1).
    close(
        &apply(&step(Method::Brightness, 0.2, 0.0), &[-1.0, 0.0, 0.9], [1, 1, 3], (-1.0, 1.0)),
        &[-0.6, 0.4, 1.0],
        1e-6,
        "brightness",
    );
    // Gaussian blur σ = 1 of a delta: the centre keeps 1/Σ exp(−i²/2) over i = −3..3 = 1/2.505936 (rows of one
    // pixel: the vertical pass repeats the edge and leaves it unchanged).
    let mut delta = vec![0.0f32; 9];
    delta[4] = 1.0;
    let g = apply(&step(Method::GaussianBlur, 1.0, 0.0), &delta, [1, 1, 9], b);
    assert!((g[4] - 1.0 / 2.505_936).abs() < 1e-5 && (g[5] - 0.606_531 / 2.505_936).abs() < 1e-5, "{g:?}");
    assert!((g.iter().sum::<f32>() - 1.0).abs() < 1e-5, "mass kept away from the edges");
    // Motion blur over 3 pixels at angle 0: the mean of the left neighbour, the pixel and the right neighbour.
    let mut d5 = vec![0.0f32; 5];
    d5[2] = 0.9;
    close(&apply(&step(Method::MotionBlur, 3.0, 0.0), &d5, [1, 1, 5], b), &[0.0, 0.3, 0.3, 0.3, 0.0], 1e-6, "motion");
    // Salt and pepper on every pixel: all channels of a pixel set together to 0 or 1.
    let sp = apply(&step(Method::SaltPepper, 1.0, 0.0), &[0.5; 8], [2, 2, 2], b);
    assert!(sp.iter().all(|&v| v == 0.0 || v == 1.0) && sp[..4] == sp[4..], "{sp:?}");
    assert_eq!(apply(&step(Method::SaltPepper, 0.0, 0.0), &[0.5; 8], [2, 2, 2], b), vec![0.5; 8]);
    // Noise stays within its amplitude, repeats for a seed and changes with it.
    let x = vec![0.5f32; 64];
    let u = apply(&step(Method::UniformNoise, 0.1, 0.0), &x, [1, 8, 8], b);
    assert!(u.iter().all(|v| (v - 0.5).abs() <= 0.1 + 1e-7) && u.iter().any(|&v| v != 0.5));
    assert_eq!(u, apply(&step(Method::UniformNoise, 0.1, 0.0), &x, [1, 8, 8], b));
    let other = Step { seed: 4, ..step(Method::UniformNoise, 0.1, 0.0) };
    assert_ne!(u, apply(&other, &x, [1, 8, 8], b));
    let z = apply(&step(Method::GaussianNoise, 0.05, 0.0), &x, [1, 8, 8], b);
    let sd = (z.iter().map(|v| (v - 0.5).powi(2)).sum::<f32>() / 64.0).sqrt();
    assert!(sd > 0.03 && sd < 0.07, "σ 0.05, measured {sd}");
}

#[test]
fn fuzz_affine_mutations_hand_computed() {
    let b = (0.0, 1.0);
    let x: Vec<f32> = (1..=9).map(|v| v as f32 / 10.0).collect(); // 3×3: rows [.1 .2 .3] [.4 .5 .6] [.7 .8 .9]
                                                                  // Translation by one pixel right: the left column is the background (the lower bound).
    let t = apply(&step(Method::Translate, 1.0, 0.0), &x, [1, 3, 3], b);
    close(&t, &[0.0, 0.1, 0.2, 0.0, 0.4, 0.5, 0.0, 0.7, 0.8], 1e-6, "translate");
    // Half a pixel down: bilinear halfway between rows (the top row half background).
    let h = apply(&step(Method::Translate, 0.0, 0.5), &x, [1, 3, 3], b);
    close(&h, &[0.05, 0.1, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75], 1e-6, "half-pixel translate");
    // Rotation by 90° (y down): output (y, x) samples the source at (x, 2 − y).
    let r = apply(&step(Method::Rotate, 90.0, 0.0), &x, [1, 3, 3], b);
    close(&r, &[0.7, 0.4, 0.1, 0.8, 0.5, 0.2, 0.9, 0.6, 0.3], 1e-5, "rotate");
    // Zoom ×2 about the centre: the centre stays, its neighbours sample halfway to the centre.
    let s = apply(&step(Method::Scale, 2.0, 0.0), &x, [1, 3, 3], b);
    close(&s[3..6], &[0.45, 0.5, 0.55], 1e-6, "scale");
    // Shear sx = 1: output (y, x) samples x − (y − 1) in row y.
    let sh = apply(&step(Method::Shear, 1.0, 0.0), &x, [1, 3, 3], b);
    close(&sh, &[0.2, 0.3, 0.0, 0.4, 0.5, 0.6, 0.0, 0.7, 0.8], 1e-6, "shear");
    // Every method at its identity parameters leaves the image unchanged.
    for m in Method::IMAGE {
        let id = m.identity();
        close(&apply(&step(m, id[0], id[1]), &x, [1, 3, 3], b), &x, 1e-6, m.name());
    }
    // Scaling a step moves its parameters towards the identity.
    assert_eq!(step(Method::Contrast, 2.0, 0.0).scaled(0.25).params, [1.25, 0.0]);
    assert_eq!(step(Method::Rotate, 10.0, 0.0).scaled(0.5).params, [5.0, 0.0]);
}

#[test]
fn fuzz_config_reads_json_and_names_bad_fields() {
    let ok = r#"{"methods": [
        {"method": "brightness", "params": {"beta": [-0.2, 0.1]}},
        {"method": "motion_blur", "params": {"angle": [0, 90]}},
        {"method": "rotate"},
        {"method": "adversarial", "attack": "fgsm"}]}"#;
    let c = MutationConfig::from_json(ok).expect("parses");
    assert_eq!(c.methods.len(), 4);
    assert_eq!(c.methods[0].params[0], ParamChoice::Values(vec![-0.2, 0.1]));
    assert_eq!(c.methods[1].params[0], ParamChoice::Range(2.0, 5.0), "length left out: automatic");
    assert_eq!(c.methods[2], MethodSpec::auto(Method::Rotate));
    assert_eq!(c.attack_names(), vec!["fgsm".to_string()]);
    let cases = [
        (r#"{"methods": [{"method": "blur"}]}"#, "methods[0].method"),
        (r#"{"methods": [{"method": "rotate", "params": {"angle": [1]}}]}"#, "methods[0].params.angle"),
        (r#"{"methods": [{"method": "noise"}]}"#, "methods[0].method"),
        (
            r#"{"methods": [{"method": "contrast"}, {"method": "scale", "params": {"factor": [1, 50]}}]}"#,
            "methods[1].params.factor[1]",
        ),
        (r#"{"methods": [{"method": "adversarial"}]}"#, "methods[0].attack"),
        (r#"{"methods": [{"method": "rotate", "attack": "pgd"}]}"#, "methods[0].attack"),
        (r#"{"methods": [{"method": "rotate", "weight": 2}]}"#, "methods[0].weight"),
        (r#"{"method": []}"#, "method"),
        (r#"{"methods": []}"#, "methods"),
        (r#"{"methods": [{"method": "rotate", "params": {"degrees": ["x"]}}]}"#, "methods[0].params.degrees[0]"),
        ("{", "(file)"),
    ];
    for (text, field) in cases {
        let e = MutationConfig::from_json(text).expect_err(text).to_string();
        assert!(e.contains(&format!("{field}:")), "{text}: error '{e}' does not name {field}");
    }
    let dir = std::env::temp_dir().join(format!("armoury-fuzz-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.json");
    std::fs::write(&path, r#"{"methods": [{"method": "rotate", "params": {"degrees": [400]}}]}"#).expect("write");
    let e = MutationConfig::load(&path).expect_err("out of range").to_string();
    assert!(e.contains("bad.json") && e.contains("methods[0].params.degrees[0]"), "{e}");
}

/// DeepHunter's rule with the defaults (α = 0.02, β = 0.2 of the range): few changed elements pass whatever
/// the change, small changes pass everywhere, and a large change of many elements is rejected on [0, 1] images.
#[test]
fn fuzz_validity_rejects_with_the_defaults() {
    let v = Validity::default();
    let seed = vec![0.5f32; 784];
    let bright = |d: f32| seed.iter().map(|x| x + d).collect::<Vec<f32>>();
    assert!(v.check(&seed, &bright(0.19), 1.0), "L∞ 0.19 ≤ 0.2");
    assert!(!v.check(&seed, &bright(0.3), 1.0), "L∞ 0.3 on every pixel");
    let mut few = seed.clone();
    few[..15].iter_mut().for_each(|x| *x = 1.0); // 15 ≤ 0.02 · 784 = 15.68
    assert!(v.check(&seed, &few, 1.0));
    few[15] = 1.0;
    assert!(!v.check(&seed, &few, 1.0), "16 pixels changed by 0.5");
    assert!(v.check(&seed, &bright(30.0), 255.0), "β is relative to the range: 30 ≤ 0.2 · 255");
    // The optional SSIM floor: uniform noise of amplitude 0.15 on a flat image passes L∞ but has SSIM
    // C2 / (σ² + C2) = 0.0009 / (0.0075 + 0.0009) ≈ 0.11; a brightness shift of 0.1 keeps SSIM ≈ 0.98.
    let shape = [1, 28, 28];
    let noisy = apply(&step(Method::UniformNoise, 0.15, 0.0), &seed, shape, (0.0, 1.0));
    let strict = Validity { min_ssim: Some(0.9), ..Validity::default() };
    assert!(v.check_image(&seed, &noisy, 1.0, shape) && !strict.check_image(&seed, &noisy, 1.0, shape));
    assert!(strict.check_image(&seed, &bright(0.1), 1.0, shape));
}

/// With an SSIM floor the fuzzer keeps fewer mutants valid; a floor on images SSIM cannot score is refused.
#[test]
fn fuzz_ssim_validity_rejects_more() {
    let model = cnn();
    let valid = |r: &FuzzReport| r.groups.values().map(|g| g.valid).sum::<usize>();
    let plain = run(&model, MutationConfig::default(), Vec::new(), small(4));
    let strict = FuzzConfig { validity: Validity { min_ssim: Some(0.8), ..Validity::default() }, ..small(4) };
    let with_ssim = run(&model, MutationConfig::default(), Vec::new(), strict.clone());
    assert!(valid(&with_ssim) < valid(&plain), "{} vs {}", valid(&with_ssim), valid(&plain));
    for f in &with_ssim.failures {
        let seed = seeds().0.narrow(0, f.seed, 1).expect("seed").to_vec();
        if non_pixel(&f.chain) == 0 {
            let s = armoury::metrics::ssim_slices(&seed, &f.image, [1, 28, 28], 1.0).expect("ssim");
            assert!(s >= 0.8, "a failure below the SSIM floor: {s}");
        }
    }
    // 2 × 5 images: SSIM's 11 × 11 window does not fit.
    let net: Arc<dyn Module> = Arc::new(armoury::nn::Sequential::new().add("flat", armoury::nn::Flatten));
    let tiny = ModuleClassifier::new(net, &[1, 2, 5], 10, (0.0, 1.0)).expect("classifier");
    let taps = NeuronTaps::new(&["flat"]);
    let x = Tensor::zeros(&[2, 1, 2, 5]);
    let b = Bounds::fit(&tiny, &taps, &x, 2).expect("bounds");
    assert!(Fuzzer::new(&tiny, taps, b, MutationConfig::default(), Vec::new(), strict).is_err(), "2×5 images");
}

fn cnn() -> ModuleClassifier {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let m: Arc<dyn Module> = Arc::new(m);
    ModuleClassifier::new(m, &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier")
}

const TAPS: [&str; 6] = ["conv1_relu", "pool1", "conv2_relu", "pool2", "fc1_relu", "fc2"];

/// The fixture images: the first 16 Fashion-MNIST test images and labels.
fn seeds() -> (Tensor, Vec<usize>) {
    let file = SafetensorsFile::open(fixture("reference.safetensors")).expect("reference");
    let x = Tensor::new(file.f32("x").expect("x"));
    let y = file.i64("y").expect("y").iter().map(|&v| v as usize).collect();
    (x, y)
}

fn run(
    model: &dyn Classifier,
    mutations: MutationConfig,
    attacks: Vec<(String, Box<dyn armoury::Attack>)>,
    cfg: FuzzConfig,
) -> FuzzReport {
    let (x, y) = seeds();
    let taps = NeuronTaps::new(&TAPS);
    let bounds = Bounds::fit(model, &taps, &x, 8).expect("bounds");
    let f = Fuzzer::new(model, taps, bounds, mutations, attacks, cfg).expect("fuzzer");
    f.run(&x, &y, &mut |_| {}).expect("run")
}

fn small(seed: u64) -> FuzzConfig {
    FuzzConfig { max_iterations: Some(48), seeds_per_round: 16, mutants_per_seed: 10, seed, ..FuzzConfig::default() }
}

fn non_pixel(chain: &[Step]) -> usize {
    chain.iter().filter(|s| s.method.group() != Group::Pixel).count()
}

/// A run's report is consistent, and every failure is a valid mutant of a correctly classified seed that the
/// model misclassifies, before and after shrinking, with at most one affine step in its lineage.
#[test]
fn fuzz_run_on_the_fixture_cnn() {
    let model = cnn();
    let r = run(&model, MutationConfig::default(), Vec::new(), small(1));
    let (x, y) = seeds();
    assert_eq!((r.seeds, r.iterations, r.rounds, r.mutants), (16, 48, 3, 480));
    assert_eq!(r.curve.len(), 4);
    assert!(r.curve.windows(2).all(|w| w[1].1 >= w[0].1 && w[1].0 > w[0].0), "coverage never falls");
    assert_eq!(r.curve[0].1, r.seed_coverage.kmnc);
    assert_eq!(r.curve[3].1, r.final_coverage.kmnc);
    assert!(r.final_coverage.kmnc > r.seed_coverage.kmnc && r.kept > 0 && r.corpus == 16 + r.kept);
    let groups: usize = r.groups.values().map(|g| g.mutants).sum();
    assert_eq!(groups, r.mutants);
    assert!(r.groups.values().all(|g| g.valid <= g.mutants && g.valid_from_correct <= g.valid));
    assert!(r.groups.values().any(|g| g.valid < g.mutants), "the validity rule rejected something");
    assert!(!r.failures.is_empty(), "the fixture cnn fails on some mutants");
    assert_eq!(r.failures.len(), r.groups.values().map(|g| g.failures).sum::<usize>());
    assert!((r.accuracy() + r.success_rate() - 1.0).abs() < 1e-12);
    let fails = |img: &[f32]| model.predict(&Tensor::from_slice(img, &[1, 1, 28, 28]).expect("t")).expect("p")[0];
    let correct = model.predict(&x).expect("predict");
    for f in &r.failures {
        assert_eq!(correct[f.seed], y[f.seed], "failures come from correctly classified seeds");
        assert_eq!(fails(&f.image), f.prediction);
        assert_ne!(f.prediction, f.label);
        assert!(non_pixel(&f.chain) <= 1, "{:?}", f.chain);
        let s = f.shrunk.as_ref().expect("shrunk");
        assert_eq!(fails(&s.image), s.prediction);
        assert_ne!(s.prediction, f.label, "the shrunk mutant still fails");
        assert!(s.chain.len() <= f.chain.len() && non_pixel(&s.chain) <= non_pixel(&f.chain));
        assert!((0.0..=1.0).contains(&s.interpolation));
    }
    let mean = |v: Vec<f32>| v.iter().sum::<f32>() / v.len() as f32;
    let before = mean(r.failures.iter().map(|f| f.linf).collect());
    let after = mean(r.failures.iter().map(|f| f.shrunk.as_ref().expect("shrunk").linf).collect());
    assert!(after < before, "shrinking moves failures towards their seeds: mean L∞ {before} → {after}");
}

/// The same seed gives the same report, bit for bit, on one thread and on two.
#[test]
fn fuzz_is_bit_identical_whatever_the_thread_count() {
    let model = cnn();
    let with_threads = |n: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("pool");
        let mut cfg = small(5);
        cfg.max_iterations = Some(32);
        let mutations = MutationConfig::with_attacks(&["fgsm"]);
        let fgsm = by_name("fgsm", &AttackParams { eps: 0.05, ..AttackParams::default() }).expect("fgsm");
        let mut r = pool.install(|| run(&model, mutations, vec![("fgsm".into(), fgsm)], cfg));
        (r.seconds, r.shrink_seconds) = (0.0, 0.0);
        serde_json::to_string(&r).expect("json")
    };
    let one = with_threads(1);
    assert_eq!(one, with_threads(2));
    assert!(one.contains("adversarial"));
}

/// A positive gain threshold rejects mutants that a zero threshold keeps: fewer join the corpus.
#[test]
fn fuzz_gain_threshold_is_applied() {
    let model = cnn();
    let zero = run(&model, MutationConfig::default(), Vec::new(), small(2));
    // 20 of the 234 · 100 KMNC sections.
    let cfg = FuzzConfig { gain_threshold: 20.0 / 23_400.0, ..small(2) };
    let positive = run(&model, MutationConfig::default(), Vec::new(), cfg);
    assert!(
        zero.kept > 0 && positive.kept < zero.kept,
        "kept {} with 0, {} with 20 sections",
        zero.kept,
        positive.kept
    );
    assert!(positive.final_coverage.kmnc < zero.final_coverage.kmnc);
    let nc = run(&model, MutationConfig::default(), Vec::new(), FuzzConfig { metric: Metric::Nbc, ..small(2) });
    assert_eq!(nc.metric, Metric::Nbc);
}

/// Adversarial mutations run the attack given as `&dyn Attack`; lineages with one never get another or an
/// affine step; an unknown attack name or bad settings are errors.
#[test]
fn fuzz_adversarial_mutations_and_errors() {
    let model = cnn();
    let mutations = MutationConfig {
        methods: vec![
            MethodSpec::adversarial("pgd"),
            MethodSpec::auto(Method::Rotate),
            MethodSpec::auto(Method::Brightness),
        ],
    };
    let pgd = by_name("pgd", &AttackParams { eps: 0.1, steps: Some(5), ..AttackParams::default() }).expect("pgd");
    let r = run(&model, mutations.clone(), vec![("pgd".into(), pgd)], small(3));
    assert_eq!(r.attacks, vec!["pgd".to_string()]);
    let adv = r.groups[&Group::Adversarial];
    assert!(adv.failures > 0 && adv.valid > 0, "PGD at ε 0.1 breaks the cnn: {adv:?}");
    for f in r.failures.iter().filter(|f| f.group == Group::Adversarial) {
        assert_eq!(f.chain.last().expect("step").attack, Some(0));
        // Valid against the seed (no affine step before an attack): L∞ ≤ 0.2 or at most 2% of the pixels.
        assert!(f.linf <= 0.2 + 1e-6 || f.l0 <= 15, "{} {}", f.linf, f.l0);
        if f.chain.len() == 1 {
            assert!(f.linf <= 0.1 + 1e-6, "PGD alone stays in its ε-ball");
        }
    }
    assert!(r.failures.iter().all(|f| non_pixel(&f.chain) <= 1));
    let (x, y) = seeds();
    let taps = NeuronTaps::new(&TAPS);
    let bounds = Bounds::fit(&model, &taps, &x, 16).expect("bounds");
    let new = |m: MutationConfig, c: FuzzConfig| {
        Fuzzer::new(&model, taps.clone(), bounds.clone(), m, Vec::new(), c).map(|_| ())
    };
    assert!(new(mutations.clone(), small(0)).is_err(), "pgd named but not given");
    assert!(new(MutationConfig::default(), FuzzConfig { mutants_per_seed: 0, ..small(0) }).is_err());
    assert!(new(MutationConfig::default(), FuzzConfig { gain_threshold: -1.0, ..small(0) }).is_err());
    let none = FuzzConfig { max_iterations: None, ..small(0) };
    assert!(new(MutationConfig::default(), none).is_err(), "no budget");
    let f = Fuzzer::new(&model, taps, bounds, MutationConfig::default(), Vec::new(), small(0)).expect("fuzzer");
    assert!(f.run(&x, &y[..3], &mut |_| {}).is_err(), "labels do not match the seeds");
}

/// A run stopped after 32 iterations, saved, and resumed to 64 reports exactly what one run to 64 does; a
/// checkpoint of another run is refused.
#[test]
fn fuzz_resumes_from_a_saved_corpus() {
    let model = cnn();
    let (x, y) = seeds();
    let taps = NeuronTaps::new(&TAPS);
    let bounds = Bounds::fit(&model, &taps, &x, 8).expect("bounds");
    let mutations = MutationConfig::with_attacks(&["fgsm"]);
    let fgsm = || {
        vec![(
            "fgsm".to_string(),
            by_name("fgsm", &AttackParams { eps: 0.05, ..AttackParams::default() }).expect("fgsm"),
        )]
    };
    let fuzzer = |iterations: usize, seed: u64| {
        let cfg = FuzzConfig { max_iterations: Some(iterations), ..small(seed) };
        Fuzzer::new(&model, taps.clone(), bounds.clone(), mutations.clone(), fgsm(), cfg).expect("fuzzer")
    };
    let clean = |mut r: FuzzReport| {
        (r.seconds, r.shrink_seconds) = (0.0, 0.0);
        serde_json::to_string(&r).expect("json")
    };
    let (whole, _) = fuzzer(64, 9).run_from(&x, &y, None, &mut |_| {}).expect("whole run");
    let (_, cp) = fuzzer(32, 9).run_from(&x, &y, None, &mut |_| {}).expect("first half");
    let path = std::env::temp_dir().join(format!("armoury-fuzz-checkpoint-{}.json", std::process::id()));
    cp.save(&path).expect("save");
    let cp = armoury::fuzz::Checkpoint::load(&path).expect("load");
    assert_eq!(cp.tally.iterations, 32);
    let (resumed, _) = fuzzer(64, 9).run_from(&x, &y, Some(&cp), &mut |_| {}).expect("resumed");
    assert_eq!(clean(resumed), clean(whole));
    assert!(fuzzer(64, 10).run_from(&x, &y, Some(&cp), &mut |_| {}).is_err(), "another seed");
    std::fs::write(&path, "{").expect("write");
    assert!(armoury::fuzz::Checkpoint::load(&path).is_err());
    let _ = std::fs::remove_file(&path);
}

/// Each budget stops a run: mutants (the last round is cut to fit), time, and a coverage target.
#[test]
fn fuzz_stops_at_each_budget() {
    let model = cnn();
    let none = FuzzConfig { max_iterations: None, ..small(6) };
    let by_mutants =
        run(&model, MutationConfig::default(), Vec::new(), FuzzConfig { max_mutants: Some(250), ..none.clone() });
    assert_eq!((by_mutants.mutants, by_mutants.rounds), (250, 2), "16 draws of 10, then 9");
    let by_time =
        run(&model, MutationConfig::default(), Vec::new(), FuzzConfig { max_seconds: Some(0.0), ..none.clone() });
    assert_eq!(by_time.rounds, 0);
    let target = by_mutants.curve[1].1;
    let by_target =
        run(&model, MutationConfig::default(), Vec::new(), FuzzConfig { target_coverage: Some(target), ..none });
    assert_eq!(by_target.rounds, 1, "the first round reaches the first round's coverage");
    assert!(by_target.final_coverage.kmnc >= target);
}

/// Retraining on the failures of the even seeds (`armoury::fuzz::retrain`): it trains on those and their
/// shrunk versions, measures the odd seeds' failures and the clean images after the seeds, and changes the
/// model it was given.
#[test]
fn fuzz_retrain_on_failures() {
    let m = armoury::nn::cnn(0);
    load_module(&m, fixture("cnn.safetensors")).expect("fixture weights load");
    let module: Arc<dyn Module> = Arc::new(m);
    let model = ModuleClassifier::new(module.clone(), &[1, 28, 28], 10, (0.0, 1.0)).expect("classifier");
    let r = run(&model, MutationConfig::default(), Vec::new(), small(1));
    let even = r.failures.iter().filter(|f| f.seed % 2 == 0);
    let trained = even.clone().count() + even.filter(|f| f.shrunk.is_some()).count();
    let held = r.failures.iter().filter(|f| f.seed % 2 == 1).count();
    assert!(trained > 0 && held > 0, "the fixture run fails on even and odd seeds");
    let mut set = armoury::data::sample().expect("sample");
    set.train = set.train.take(256).expect("take");
    let before = model.logits(&set.test.batch(0..4).expect("batch").0).expect("logits");
    let cfg = armoury::fuzz::RetrainConfig { epochs: 1, seed: 3, ..Default::default() };
    let t = armoury::fuzz::retrain(&module, &model, &r, &set, 16, &cfg).expect("retrain");
    assert_eq!((t.train_fuzzed, t.held_out), (trained, held));
    for v in [t.fuzzed_before, t.fuzzed_after, t.clean_before, t.clean_after] {
        assert!((0.0..=1.0).contains(&v), "{t:?}");
    }
    assert_eq!(t.fuzzed_before, 0.0, "every held-out failure fooled the model before");
    let after = model.logits(&set.test.batch(0..4).expect("batch").0).expect("logits");
    assert_ne!(before, after, "the model was trained");
}
