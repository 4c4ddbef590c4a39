//! Input-transformation defenses: each transform's value on hand-made inputs, per-image independence (the
//! MindArmour SpatialSmoothing bug), BPDA and EOT gradients, finite-difference checks of the differentiable
//! transforms, PGD through bit-depth reduction (BPDA defeats feature squeezing), randomized smoothing's PREDICT
//! and CERTIFY, and the statistics behind them.

use std::ops::Range;
use std::sync::Arc;

use armoury::nn::{cnn, Sequential};
use armoury::{io, Attack, Classifier, Counters, Error, Goal, ModuleClassifier, Result, Tensor};
use armoury_attacks::Pgd;
use armoury_defenses::transforms::stats::{beta_inc, binomial_test_half, clopper_pearson_lower, normal_ppf};
use armoury_defenses::transforms::{
    certified_accuracy, gaussian_weights, total_variation, BitDepth, Certification, Defended, GaussianFilter,
    GaussianNoise, Jpeg, MeanFilter, MedianFilter, RandomizedSmoothing, TotalVariation, Transform,
};

const UNIT: (f32, f32) = (0.0, 1.0);

fn fixture_cnn() -> ModuleClassifier {
    let net: Sequential = cnn(0);
    io::load_module(&net, crate::common::fixture("cnn.safetensors")).unwrap();
    ModuleClassifier::new(net, &[1, 28, 28], 10, UNIT).unwrap()
}

fn test_images(range: Range<usize>) -> (Tensor, Vec<usize>) {
    armoury::data::sample().unwrap().test.batch(range).unwrap()
}

fn grid3() -> Tensor {
    Tensor::from_vec((1..=9).map(|v| v as f32).collect(), &[1, 1, 3, 3]).unwrap()
}

fn all_transforms() -> Vec<Box<dyn Transform>> {
    vec![
        Box::new(BitDepth { bits: 3 }),
        Box::new(MedianFilter { size: 3 }),
        Box::new(MeanFilter { size: 3 }),
        Box::new(GaussianFilter::new(0.8)),
        Box::new(Jpeg { quality: 50 }),
        Box::new(TotalVariation::rof(0.05, 50)),
        Box::new(TotalVariation { iterations: 50, ..Default::default() }),
        Box::new(GaussianNoise { sigma: 0.1, clip: true }),
    ]
}

#[test]
fn bit_depth_values() {
    let x = Tensor::from_vec(vec![0.0, 0.2, 0.49, 0.5, 0.6, 1.0, -0.3, 1.4], &[1, 2, 2, 2]).unwrap();
    let one = BitDepth { bits: 1 }.apply(&x, UNIT, 0).unwrap().to_vec();
    assert_eq!(one, vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
    // 2 bits: levels {0, 1/3, 2/3, 1}.
    let two = BitDepth { bits: 2 }.apply(&x, UNIT, 0).unwrap().to_vec();
    let want = [0.0, 1.0 / 3.0, 1.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0, 1.0, 0.0, 1.0];
    two.iter().zip(want).for_each(|(a, b)| assert!((a - b).abs() < 1e-7, "{two:?}"));
    // Bounds (−1, 1) with 1 bit: {−1, 1}.
    let pm = BitDepth { bits: 1 }.apply(&x, (-1.0, 1.0), 0).unwrap().to_vec();
    assert_eq!(pm, vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0]); // 0 is the midpoint: rounds up
                                                                   // 16 bits is almost the identity on [0, 1].
    let many = BitDepth { bits: 16 }.apply(&x.clamp(0.0, 1.0), UNIT, 0).unwrap();
    let diff = many.to_vec().iter().zip(x.clamp(0.0, 1.0).to_vec()).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(diff <= 0.5 / 65535.0 + 1e-7);
}

#[test]
fn median_filter_values() {
    let x = grid3();
    let m = MedianFilter { size: 3 }.apply(&x, UNIT, 0).unwrap().to_vec();
    // Centre: median of 1..9 = 5. Corner (0,0) with reflect padding reads rows/cols (0,0,1):
    // [1,1,2, 1,1,2, 4,4,5] → sorted 1,1,1,1,2,2,4,4,5 → 2.
    assert_eq!(m[4], 5.0);
    assert_eq!(m[0], 2.0);
    // A single spike in a flat image disappears; size 1 is the identity.
    let mut v = vec![0.25f32; 25];
    v[12] = 1.0;
    let spike = Tensor::from_vec(v, &[1, 1, 5, 5]).unwrap();
    assert!(MedianFilter { size: 3 }.apply(&spike, UNIT, 0).unwrap().to_vec().iter().all(|&a| a == 0.25));
    assert_eq!(MedianFilter { size: 1 }.apply(&x, UNIT, 0).unwrap().to_vec(), x.to_vec());
}

#[test]
fn mean_and_gaussian_filter_values() {
    let x = grid3();
    let m = MeanFilter { size: 3 }.apply(&x, UNIT, 0).unwrap().to_vec();
    assert!((m[4] - 5.0).abs() < 1e-6);
    assert!((m[0] - 21.0 / 9.0).abs() < 1e-6, "reflect-padded corner mean {}", m[0]);
    let flat = Tensor::full(&[2, 3, 7, 6], 0.3);
    for t in [&MeanFilter { size: 5 } as &dyn Transform, &GaussianFilter::new(1.5), &MedianFilter { size: 5 }] {
        let y = t.apply(&flat, UNIT, 0).unwrap();
        assert!(y.to_vec().iter().all(|&v| (v - 0.3).abs() < 1e-6), "{} keeps a constant image", t.name());
    }
    for (sigma, size) in [(0.5, 3), (1.0, 7), (2.0, 13)] {
        let g = gaussian_weights(sigma, size);
        assert!((g.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(g.iter().zip(g.iter().rev()).all(|(a, b)| a == b), "symmetric");
        let k = GaussianFilter { sigma, size }.kernel();
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(k.len(), size * size);
    }
    // σ = 1, 3 taps: weights ∝ (e^{-1/2}, 1, e^{-1/2}).
    let g = gaussian_weights(1.0, 3);
    let e = (-0.5f32).exp();
    assert!((g[1] - 1.0 / (1.0 + 2.0 * e)).abs() < 1e-6);
    assert_eq!(GaussianFilter::new(1.0).size, 7);
}

#[test]
fn jpeg_quality_controls_the_distortion() {
    let (x, _) = test_images(0..8);
    let err = |q: u8| {
        let y = Jpeg { quality: q }.apply(&x, UNIT, 0).unwrap();
        assert_eq!(y.shape(), x.shape());
        let v = y.to_vec();
        assert!(v.iter().all(|&a| (0.0..=1.0).contains(&a)));
        v.iter().zip(x.to_vec()).map(|(a, b)| (a - b).abs()).sum::<f32>() / v.len() as f32
    };
    let (e100, e10) = (err(100), err(10));
    assert!(e100 < 0.01, "quality 100 mean abs error {e100}");
    assert!(e10 > 3.0 * e100 && e10 > 0.01, "quality 10 error {e10} vs quality 100 {e100}");
    // RGB works, 2 channels do not.
    let rgb = Tensor::uniform(&[2, 3, 16, 16], 0.0, 1.0, 3);
    assert_eq!(Jpeg { quality: 90 }.apply(&rgb, UNIT, 0).unwrap().shape(), &[2, 3, 16, 16]);
    let two = Tensor::uniform(&[1, 2, 8, 8], 0.0, 1.0, 3);
    assert!(matches!(Jpeg { quality: 90 }.apply(&two, UNIT, 0), Err(Error::InvalidArgument { .. })));
}

#[test]
fn total_variation_solves_the_rof_model() {
    // A vertical step (left 4 columns 0.2, right 4 columns 0.8) has the exact ROF solution
    // z_left = a + λ/n_left, z_right = b − λ/n_right (∂/∂z_left of ½·H·n_left·(z−a)² + λ·H·(z_right − z_left)).
    let (h, w, lambda) = (8, 8, 0.4);
    let v: Vec<f32> = (0..h * w).map(|k| if k % w < 4 { 0.2 } else { 0.8 }).collect();
    let x = Tensor::from_vec(v, &[1, 1, h, w]).unwrap();
    let tv = TotalVariation { weight: lambda, iterations: 500, keep_prob: 1.0 };
    let z = tv.apply(&x, UNIT, 0).unwrap().to_vec();
    for (k, &zv) in z.iter().enumerate() {
        let want = if k % w < 4 { 0.3 } else { 0.7 };
        assert!((zv - want).abs() < 1e-3, "pixel {k}: {zv} vs {want}");
    }
    // A piecewise-constant image plus small noise: the pieces come back, TV drops, the result stays close.
    let clean: Vec<f32> = (0..28 * 28).map(|k| if (k / 28 < 14) ^ (k % 28 < 10) { 0.8 } else { 0.2 }).collect();
    let noise = Tensor::normal(&[28 * 28], 0.0, 0.05, 11).to_vec();
    let noisy: Vec<f32> = clean.iter().zip(&noise).map(|(a, b)| a + b).collect();
    let xn = Tensor::from_vec(noisy.clone(), &[1, 1, 28, 28]).unwrap();
    let z = TotalVariation { weight: 0.08, iterations: 300, keep_prob: 1.0 }.apply(&xn, UNIT, 0).unwrap();
    let rmse =
        |a: &[f32], b: &[f32]| (a.iter().zip(b).map(|(p, q)| (p - q).powi(2)).sum::<f32>() / a.len() as f32).sqrt();
    let (before, after) = (rmse(&noisy, &clean), rmse(&z.to_vec(), &clean));
    assert!(after < 0.5 * before, "denoising error {after} vs noise {before}");
    assert!(total_variation(&z).unwrap()[0] < 0.5 * total_variation(&xn).unwrap()[0]);
    assert!(rmse(&z.to_vec(), &noisy) < 0.1);
    // Pixel dropout: random, deterministic per draw, different across draws, fills the dropped pixels.
    let masked = TotalVariation { weight: 0.05, iterations: 300, keep_prob: 0.5 };
    assert!(masked.is_random());
    let (a, b, c) =
        (masked.apply(&xn, UNIT, 1).unwrap(), masked.apply(&xn, UNIT, 1).unwrap(), masked.apply(&xn, UNIT, 2).unwrap());
    assert_eq!(a.to_vec(), b.to_vec());
    assert_ne!(a.to_vec(), c.to_vec());
    assert!(rmse(&a.to_vec(), &clean) < before, "in-painted error {}", rmse(&a.to_vec(), &clean));
    // λ = 0 is the identity.
    let id = TotalVariation::rof(0.0, 200).apply(&xn, UNIT, 0).unwrap();
    assert_eq!(id.to_vec(), xn.clamp(0.0, 1.0).to_vec());
}

/// The result for image i must not depend on the other images in the batch (MindArmour's SpatialSmoothing
/// filters across the batch; docs/conventions.md, MindArmour differences), nor on its position.
#[test]
fn every_transform_works_per_image() {
    let x = Tensor::uniform(&[5, 1, 12, 10], 0.0, 1.0, 21);
    for t in all_transforms() {
        let all = t.apply(&x, UNIT, 7).unwrap();
        assert_eq!(all.shape(), x.shape());
        let per = 120;
        for i in 0..5 {
            let xi = x.narrow(0, i, 1).unwrap();
            let yi = t.apply(&xi, UNIT, 7).unwrap().to_vec();
            assert_eq!(yi, all.to_vec()[i * per..(i + 1) * per], "{}: image {i}", t.name());
        }
        let rev = x.index_select(0, &[4, 3, 2, 1, 0]).unwrap();
        let yr = t.apply(&rev, UNIT, 7).unwrap().to_vec();
        assert_eq!(yr[..per], all.to_vec()[4 * per..], "{}: permuted batch", t.name());
    }
}

#[test]
fn defended_is_a_classifier_with_bpda_gradients() {
    let (x, y) = test_images(0..70);
    for t in [
        Arc::new(BitDepth { bits: 3 }) as Arc<dyn Transform>,
        Arc::new(MedianFilter { size: 3 }),
        Arc::new(Jpeg { quality: 60 }),
        Arc::new(TotalVariation::rof(0.05, 30)),
    ] {
        let inner: Arc<dyn Classifier> = Arc::new(fixture_cnn());
        let d = Defended::shared(inner.clone(), t.clone()).unwrap();
        assert_eq!(
            (d.input_shape(), d.num_classes(), d.bounds(), d.chunk_size()),
            (&[1, 28, 28][..], 10, UNIT, inner.chunk_size())
        );
        let tx = t.apply(&x, UNIT, d.draw_seed(0)).unwrap();
        // The value is exactly the inner model on T(x) …
        assert_eq!(d.logits(&x).unwrap(), inner.logits(&tx).unwrap(), "{}", t.name());
        // … and the gradient is the inner model's gradient at T(x), passed straight through (BPDA).
        let (loss_d, grad_d) = d.loss_gradient(&x, &y).unwrap();
        let (loss_i, grad_i) = inner.loss_gradient(&tx, &y).unwrap();
        assert_eq!(loss_d, loss_i, "{}", t.name());
        assert_eq!(grad_d.to_vec(), grad_i.to_vec(), "{}", t.name());
        assert!(grad_d.to_vec().iter().any(|&g| g != 0.0));
    }
}

/// ∂/∂x Σ w ⊙ T(x) against central differences; T is linear (mean, Gaussian) or affine (noise), so f32
/// differences with a large step are exact up to rounding.
#[test]
fn differentiable_transforms_pass_finite_differences() {
    let x = Tensor::uniform(&[2, 2, 6, 5], 0.0, 1.0, 5);
    let wts = Tensor::uniform(&[2, 2, 6, 5], -1.0, 1.0, 6);
    for t in [
        &MeanFilter { size: 3 } as &dyn Transform,
        &GaussianFilter::new(0.7),
        &MeanFilter { size: 5 },
        &GaussianNoise { sigma: 0.2, clip: false },
    ] {
        let xv = x.variable();
        let f = t.differentiable(&xv, UNIT, 3).unwrap().unwrap().mul(&wts).unwrap().sum_all();
        let g = f.grad_wrt(&[&xv]).unwrap().pop().unwrap().to_vec();
        let val = |v: Vec<f32>| -> f64 {
            let xt = Tensor::from_vec(v, x.shape()).unwrap();
            let y = t.differentiable(&xt, UNIT, 3).unwrap().unwrap();
            y.to_vec().iter().zip(wts.to_vec()).map(|(a, b)| *a as f64 * b as f64).sum()
        };
        for k in (0..x.numel()).step_by(7) {
            let h = 0.05f32;
            let (mut p, mut m) = (x.to_vec(), x.to_vec());
            p[k] += h;
            m[k] -= h;
            if t.is_random() {
                // Noise is seeded by the sample's values, so perturbing one changes the draw: differentiate
                // the noise-free part instead (the noise is an additive constant on the graph).
                continue;
            }
            let fd = (val(p) - val(m)) / (2.0 * h as f64);
            assert!((fd - g[k] as f64).abs() < 1e-4, "{} at {k}: fd {fd} vs autodiff {}", t.name(), g[k]);
        }
        if t.is_random() {
            assert!(g.iter().zip(wts.to_vec()).all(|(a, b)| a == &b), "noise has identity Jacobian");
        }
        // apply and differentiable agree.
        assert_eq!(t.apply(&x, UNIT, 3).unwrap().to_vec(), t.differentiable(&x, UNIT, 3).unwrap().unwrap().to_vec());
    }
    // Through Defended with the cnn: the chain rule — ∇ = Tᵀ ∇inner(T(x)).
    let (xb, yb) = test_images(0..6);
    let d = Defended::new(fixture_cnn(), GaussianFilter::new(1.0)).unwrap();
    let tx = d.transform_input(&xb, 0).unwrap();
    let (_, gi) = d.inner().loss_gradient(&tx, &yb).unwrap();
    let xv = xb.variable();
    let s = d.through(&xv, 0).unwrap().mul(&gi).unwrap().sum_all();
    let want = s.grad_wrt(&[&xv]).unwrap().pop().unwrap().to_vec();
    let (_, got) = d.loss_gradient(&xb, &yb).unwrap();
    got.to_vec().iter().zip(&want).for_each(|(a, b)| assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{a} vs {b}"));
}

#[test]
fn eot_gradient_is_the_mean_over_draws() {
    let (x, y) = test_images(0..10);
    let k = 4;
    let d = Defended::new(fixture_cnn(), GaussianNoise { sigma: 0.1, clip: false }).unwrap().with_eot(k, 9).unwrap();
    assert_eq!(d.draws(), k);
    let f = |z: &Tensor, r: Range<usize>| z.pick(&y[r]);
    let (val, grad, logits) = d.gradient(&x, &f).unwrap();
    let (mut gsum, mut vsum, mut lsum) = (vec![0.0f64; x.numel()], vec![0.0f64; 10], vec![0.0f64; 100]);
    for j in 0..k {
        let xj = d.transform_input(&x, j).unwrap();
        let (v, g, l) = d.inner().gradient(&xj, &f).unwrap();
        g.to_vec().iter().zip(gsum.iter_mut()).for_each(|(a, s)| *s += *a as f64 / k as f64);
        v.iter().zip(vsum.iter_mut()).for_each(|(a, s)| *s += *a as f64 / k as f64);
        l.iter().zip(lsum.iter_mut()).for_each(|(a, s)| *s += *a as f64 / k as f64);
    }
    grad.to_vec().iter().zip(&gsum).for_each(|(a, b)| assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}"));
    val.iter().zip(&vsum).for_each(|(a, b)| assert!((*a as f64 - b).abs() < 1e-4));
    logits.iter().zip(&lsum).for_each(|(a, b)| assert!((*a as f64 - b).abs() < 1e-4));
    // Draws differ, and the defended model is deterministic for a fixed seed and any batch split.
    assert_ne!(d.transform_input(&x, 0).unwrap().to_vec(), d.transform_input(&x, 1).unwrap().to_vec());
    let (g2, l2) = (
        d.gradient(&x.narrow(0, 3, 4).unwrap(), &|z: &Tensor, r: Range<usize>| z.pick(&y[3 + r.start..3 + r.end]))
            .unwrap()
            .1,
        d.logits(&x.narrow(0, 3, 4).unwrap()).unwrap(),
    );
    assert_eq!(g2.to_vec(), grad.to_vec()[3 * 784..7 * 784]);
    assert_eq!(l2, logits.slice(ndarray::s![3..7, ..]));
}

/// Athalye, Carlini & Wagner (2018): feature squeezing gives no robustness once gradients are approximated by
/// BPDA. PGD through a 4-bit BitDepth defense drives robust accuracy near zero on the fixture cnn.
#[test]
fn pgd_with_bpda_defeats_bit_depth_reduction() {
    let (x, y) = test_images(0..100);
    let d = Defended::new(fixture_cnn(), BitDepth { bits: 4 }).unwrap();
    let clean = d.predict(&x).unwrap().iter().zip(&y).filter(|(p, l)| p == l).count() as f32 / 100.0;
    let r = Pgd { steps: 20, step_size: 0.02, ..Pgd::linf(0.15) }.run(&d, &x, &y, &Goal::Untargeted, 0).unwrap();
    let robust = r.robust_accuracy(&y);
    eprintln!("4-bit squeezing: clean {clean}, BPDA PGD-20 (ε = 0.15) robust {robust}");
    assert!(clean > 0.75, "clean accuracy through 4-bit squeezing {clean}");
    assert!(robust < 0.1, "BPDA PGD robust accuracy {robust} (clean {clean})");
    assert!(r.norms.iter().all(|n| n.linf <= 0.15 * (1.0 + 1e-6)));
}

/// A two-class model on [1, 2, 2] inputs: class 0 iff the first value exceeds 0.5. Under Gaussian noise the
/// smoothed classifier's top-class probability is Φ((x₀ − ½)/σ), so its exact certified radius is |x₀ − ½|.
struct Threshold(Counters);

impl Classifier for Threshold {
    fn input_shape(&self) -> &[usize] {
        &[1, 2, 2]
    }
    fn num_classes(&self) -> usize {
        2
    }
    fn bounds(&self) -> (f32, f32) {
        UNIT
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // logits = [x₀ − ½, 0] as a matmul (a standard-layout result).
        let w = Tensor::from_vec(vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], &[4, 2])?;
        x.reshape(&[x.shape()[0], 4])?.matmul(&w)?.add(&Tensor::from_vec(vec![-0.5, 0.0], &[2])?)
    }
    fn counters(&self) -> &Counters {
        &self.0
    }
}

fn point(x0: f32) -> Tensor {
    Tensor::from_vec(vec![x0, 0.0, 0.0, 0.0], &[1, 1, 2, 2]).unwrap()
}

#[test]
fn randomized_smoothing_on_an_analytic_model() {
    let model = Threshold(Counters::default());
    let rs = RandomizedSmoothing { sigma: 0.25, n0: 100, n: 10_000, alpha: 0.001, batch: 4096, seed: 1 };
    // Far from the boundary every draw is class 0: p̲ = α^{1/n} exactly, radius σ·Φ⁻¹(α^{1/n}).
    let far = rs.certify(&model, &point(0.5 + 10.0 * 0.25)).unwrap()[0];
    let p = 0.001f64.powf(1.0 / 10_000.0);
    assert_eq!((far.class, far.count), (Some(0), 10_000));
    assert!((far.p_lower - p).abs() < 1e-9, "{} vs {p}", far.p_lower);
    assert!((far.radius as f64 - 0.25 * normal_ppf(p)).abs() < 1e-5);
    // At 0.1 from the boundary the certified radius is close to, and below, the true radius 0.1.
    let near = rs.certify(&model, &point(0.6)).unwrap()[0];
    assert_eq!(near.class, Some(0));
    assert!(near.radius > 0.07 && near.radius < 0.1, "radius {}", near.radius);
    let below = rs.certify(&model, &point(0.35)).unwrap()[0];
    assert_eq!(below.class, Some(1));
    assert!(below.radius > 0.12 && below.radius < 0.15, "radius {}", below.radius);
    // On the boundary the counts are close: PREDICT and CERTIFY abstain.
    let on = point(0.5);
    assert_eq!(rs.predict(&model, &on).unwrap(), vec![None]);
    let c = rs.certify(&model, &on).unwrap()[0];
    assert_eq!((c.class, c.radius), (None, 0.0));
    assert_eq!(rs.predict(&model, &point(0.9)).unwrap(), vec![Some(0)]);
    // Independent of the noise batch size and of the batch composition.
    let xs = Tensor::concat(&[point(0.6), point(0.45), point(0.9)], 0).unwrap();
    let a = RandomizedSmoothing { n: 3000, batch: 7, ..rs }.certify(&model, &xs).unwrap();
    let b = RandomizedSmoothing { n: 3000, batch: 1000, ..rs }.certify(&model, &xs).unwrap();
    assert_eq!(a, b);
    assert_eq!(a[1], RandomizedSmoothing { n: 3000, ..rs }.certify(&model, &point(0.45)).unwrap()[0]);
    // Certified accuracy counts the right class with a large-enough radius.
    let certs = [
        Certification { class: Some(0), radius: 0.3, count: 0, p_lower: 0.9 },
        Certification { class: Some(1), radius: 0.6, count: 0, p_lower: 0.9 },
        Certification { class: None, radius: 0.0, count: 0, p_lower: 0.4 },
        Certification { class: Some(2), radius: 0.1, count: 0, p_lower: 0.7 },
    ];
    assert_eq!(certified_accuracy(&[0.0, 0.25, 0.5, 1.0], &certs, &[0, 1, 2, 1]).unwrap(), vec![0.5, 0.5, 0.25, 0.0]);
    assert!(certified_accuracy(&[0.0], &certs, &[0, 1]).is_err());
}

#[test]
fn randomized_smoothing_on_the_fixture_cnn() {
    let model = fixture_cnn();
    let (x, y) = test_images(0..6);
    let rs = RandomizedSmoothing { n0: 50, n: 1000, batch: 500, ..Default::default() };
    let certs = rs.certify(&model, &x).unwrap();
    assert_eq!(certs.len(), 6);
    for c in &certs {
        assert!(c.radius >= 0.0 && c.radius.is_finite());
        assert!(c.class.is_some() == (c.p_lower >= 0.5));
        if let Some(k) = c.class {
            assert!(k < 10 && c.radius <= 0.25 * normal_ppf(0.001f64.powf(1e-3)) as f32 + 1e-6);
        }
    }
    let acc = certified_accuracy(&[0.0, 0.25, 0.5], &certs, &y).unwrap();
    assert!(acc[0] >= acc[1] && acc[1] >= acc[2]);
    let pred = rs.predict(&model, &x).unwrap();
    assert_eq!(pred.len(), 6);
    // The soft smoothed classifier is a classifier of log-probabilities with EOT gradients.
    let soft = rs.classifier(Arc::new(model), 8).unwrap();
    let z = soft.logits(&x).unwrap();
    for row in z.rows() {
        let total: f32 = row.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "probabilities sum to {total}");
    }
    let (_, g) = soft.loss_gradient(&x, &y).unwrap();
    assert!(g.all_finite() && g.to_vec().iter().any(|&v| v != 0.0));
}

#[test]
fn statistics_match_reference_values() {
    // Φ⁻¹ against known values (scipy.stats.norm.ppf), one per branch of AS241.
    for (p, want) in [
        (0.5, 0.0),
        (0.6, 0.253_347_103_135_799_7),
        (0.9, 1.281_551_565_544_600_5),
        (0.975, 1.959_963_984_540_054),
        (0.999, 3.090_232_306_167_813_5),
        (1e-10, -6.361_340_902_404_056),
        (1e-20, -9.262_340_089_798_408),
    ] {
        assert!((normal_ppf(p) - want).abs() < 1e-9 * (1.0 + want.abs()), "Φ⁻¹({p}) = {} vs {want}", normal_ppf(p));
    }
    assert!((normal_ppf(0.025) + normal_ppf(0.975)).abs() < 1e-12);
    // I_x(a, b) = 1 − I_{1−x}(b, a); I_x(1, 1) = x; I_x(a, 1) = x^a.
    assert!((beta_inc(2.5, 4.0, 0.3) + beta_inc(4.0, 2.5, 0.7) - 1.0).abs() < 1e-12);
    assert!((beta_inc(1.0, 1.0, 0.37) - 0.37).abs() < 1e-12);
    assert!((beta_inc(7.0, 1.0, 0.8) - 0.8f64.powi(7)).abs() < 1e-12);
    // Two-sided binomial test at ½: 9 of 10 gives 2·(1 + 10)/1024.
    assert!((binomial_test_half(9, 10) - 22.0 / 1024.0).abs() < 1e-12);
    assert_eq!(binomial_test_half(5, 10), 1.0);
    // Clopper–Pearson against bisection on the binomial tail P(X ≥ k; n, p) = α (summed in log space).
    let tail = |k: u64, n: u64, p: f64| -> f64 {
        let mut log_c = 0.0f64; // ln C(n, j)
        let mut s = 0.0f64;
        for j in 0..=n {
            if j > 0 {
                log_c += ((n - j + 1) as f64).ln() - (j as f64).ln();
            }
            if j >= k {
                s += (log_c + j as f64 * p.ln() + (n - j) as f64 * (1.0 - p).ln()).exp();
            }
        }
        s
    };
    for (k, n, alpha) in [(9990u64, 10_000u64, 0.001), (5200, 10_000, 0.001), (60, 100, 0.05), (1000, 1000, 0.001)] {
        let (mut lo, mut hi) = (1e-9f64, 1.0 - 1e-12);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if tail(k, n, mid) < alpha {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let got = clopper_pearson_lower(k, n, alpha);
        assert!((got - lo).abs() < 1e-8, "CP({k}/{n}, α={alpha}) = {got} vs bisection {lo}");
    }
    assert_eq!(clopper_pearson_lower(0, 10, 0.05), 0.0);
}

#[test]
fn bad_settings_and_inputs_are_errors() {
    let x = Tensor::uniform(&[1, 1, 8, 8], 0.0, 1.0, 0);
    let bad: Vec<Box<dyn Transform>> = vec![
        Box::new(BitDepth { bits: 0 }),
        Box::new(BitDepth { bits: 17 }),
        Box::new(MedianFilter { size: 0 }),
        Box::new(MedianFilter { size: 2 }),
        Box::new(MeanFilter { size: 4 }),
        Box::new(GaussianFilter { sigma: 0.0, size: 3 }),
        Box::new(GaussianFilter { sigma: f32::NAN, size: 3 }),
        Box::new(GaussianFilter { sigma: 1.0, size: 2 }),
        Box::new(Jpeg { quality: 0 }),
        Box::new(Jpeg { quality: 101 }),
        Box::new(TotalVariation { weight: -1.0, ..Default::default() }),
        Box::new(TotalVariation { iterations: 0, ..Default::default() }),
        Box::new(TotalVariation { keep_prob: 0.0, ..Default::default() }),
        Box::new(GaussianNoise { sigma: -0.1, clip: false }),
    ];
    for t in bad {
        assert!(matches!(t.validate(), Err(Error::InvalidArgument { .. })), "{}", t.name());
        assert!(matches!(t.apply(&x, UNIT, 0), Err(Error::InvalidArgument { .. })), "{}", t.name());
    }
    assert!(Defended::new(fixture_cnn(), BitDepth { bits: 0 }).is_err());
    assert!(Defended::new(fixture_cnn(), BitDepth { bits: 2 }).unwrap().with_eot(0, 0).is_err());
    let nan = Tensor::full(&[1, 1, 8, 8], f32::NAN);
    let flat = Tensor::zeros(&[64]);
    for t in all_transforms() {
        assert!(matches!(t.apply(&nan, UNIT, 0), Err(Error::NonFinite { .. })), "{}", t.name());
        assert!(matches!(t.apply(&flat, UNIT, 0), Err(Error::RankMismatch { .. })), "{}", t.name());
    }
    assert!(BitDepth { bits: 2 }.apply(&x, (1.0, 0.0), 0).is_err());
    let d = Defended::new(fixture_cnn(), MedianFilter { size: 3 }).unwrap();
    assert!(matches!(d.logits(&x), Err(Error::ShapeMismatch { .. })));
    let model = Threshold(Counters::default());
    for rs in [
        RandomizedSmoothing { sigma: 0.0, ..Default::default() },
        RandomizedSmoothing { n: 0, ..Default::default() },
        RandomizedSmoothing { n0: 0, ..Default::default() },
        RandomizedSmoothing { alpha: 0.0, ..Default::default() },
        RandomizedSmoothing { alpha: 1.0, ..Default::default() },
        RandomizedSmoothing { batch: 0, ..Default::default() },
    ] {
        assert!(matches!(rs.certify(&model, &point(0.7)), Err(Error::InvalidArgument { .. })));
    }
    let rs = RandomizedSmoothing { n: 10, n0: 10, ..Default::default() };
    assert!(matches!(rs.certify(&model, &Tensor::zeros(&[1, 1, 3, 3])), Err(Error::ShapeMismatch { .. })));
}

/// Guo et al. (2018) drop half the pixels at every draw: that is the default, a random transform; `rof` is the
/// deterministic variant.
#[test]
fn total_variation_defaults_to_the_papers_pixel_dropout() {
    let tv = TotalVariation::default();
    assert_eq!(tv.keep_prob, 0.5);
    assert!(tv.is_random());
    assert!(!TotalVariation::rof(0.05, 50).is_random());
}

/// A randomised defense is scored on fresh single draws, as it answers when deployed: the average over draws of
/// the single-draw accuracies, each draw seeded apart; for a deterministic transform, the plain accuracy.
#[test]
fn randomised_defenses_are_scored_on_fresh_single_draws() {
    let (x, y) = test_images(0..40);
    let noisy = Defended::new(fixture_cnn(), GaussianNoise { sigma: 0.5, clip: true }).unwrap().with_eot(8, 3).unwrap();
    let (a, b) = (noisy.single_draw(1).logits(&x).unwrap(), noisy.single_draw(2).logits(&x).unwrap());
    assert_ne!(a, b, "single draws of different seeds differ");
    let acc = |d: &Defended| d.predict(&x).unwrap().iter().zip(&y).filter(|(p, l)| p == l).count() as f32 / 40.0;
    let by_hand: f32 = (0..5).map(|k| acc(&noisy.single_draw(armoury::seed::derive(7, k)))).sum::<f32>() / 5.0;
    let fresh = noisy.fresh_draw_accuracy(&x, &y, 5, 7).unwrap();
    assert!((fresh - by_hand).abs() < 1e-6, "{fresh} vs {by_hand}");
    assert_eq!(fresh, noisy.fresh_draw_accuracy(&x, &y, 5, 7).unwrap(), "seeded");
    let plain = Defended::new(fixture_cnn(), BitDepth { bits: 3 }).unwrap();
    assert_eq!(plain.fresh_draw_accuracy(&x, &y, 4, 0).unwrap(), acc(&plain));
    assert!(noisy.fresh_draw_accuracy(&x, &y, 0, 0).is_err());
    assert!(noisy.fresh_draw_accuracy(&x, &y[..3], 1, 0).is_err());
}
