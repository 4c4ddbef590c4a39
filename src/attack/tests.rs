//! The template's own duties, checked with scripted algorithms whose outputs are known: budget enforcement,
//! honest success, sweeps that never lose a success, goal resolution by access, the rejection class, and the
//! tallies of work and gradient faults.

use ndarray::Array2;

use super::template::{Access, Algorithm, Budget, Problem};
use super::{Attack, Epsilon, Goal, Norm, Resolved};
use crate::classifier::{Classifier, Counters, ModuleClassifier};
use crate::nn::{Flatten, Linear, Sequential};
use crate::{Result, Tensor};

fn model() -> ModuleClassifier {
    model_seeded(11)
}

fn model_seeded(seed: u64) -> ModuleClassifier {
    let net = Sequential::new().add("flatten", Flatten).add("fc", Linear::new(4, 3, true, seed));
    ModuleClassifier::new(net, &[4], 3, (0.0, 1.0)).expect("model")
}

fn inputs() -> (Tensor, Vec<usize>) {
    let x = Tensor::uniform(&[6, 4], 0.2, 0.8, 3);
    let y = model().predict(&x).expect("predict");
    (x, y)
}

/// Adds `step · direction` to every input, whatever ε: the template must cut it to the budget and the box.
struct Push {
    direction: [f32; 4],
    step: f32,
    budget: Budget,
    access: Access,
}

impl Algorithm for Push {
    fn name(&self) -> String {
        "push".into()
    }
    fn access(&self) -> Access {
        self.access
    }
    fn budget(&self) -> Budget {
        self.budget.clone()
    }
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let mut a = p.rows();
        for mut r in a.rows_mut() {
            r.iter_mut().zip(self.direction).for_each(|(v, d)| *v += self.step * d);
        }
        Ok(p.unrows(a))
    }
}

fn push(budget: Budget) -> Push {
    Push { direction: [1.0, -1.0, 0.5, 0.0], step: 10.0, budget, access: Access::Gradients }
}

#[test]
fn the_budget_and_the_box_are_enforced_exactly() {
    let (x, y) = inputs();
    let m = model();
    for norm in [Norm::L1, Norm::L2, Norm::Linf] {
        let r = push(Budget::Fixed { norm, eps: Epsilon::Scalar(0.1) }).run(&m, &x, &y, &Goal::Untargeted, 0).unwrap();
        for (i, n) in r.norms.iter().enumerate() {
            let got = match norm {
                Norm::L1 => n.l1,
                Norm::L2 => n.l2,
                Norm::Linf => n.linf,
            };
            assert!(got <= 0.1 * (1.0 + 1e-6) && got > 0.09, "{norm:?} sample {i}: {got}");
        }
        assert!(r.adversarial.to_vec().iter().all(|v| (0.0..=1.0).contains(v)));
        // Success is what the model says of the returned inputs.
        assert_eq!(r.predictions, m.predict(&r.adversarial).unwrap());
    }
    // A minimum-norm attack gets the box only: the step of 10 is cut at 0 and 1, the perturbation kept.
    let r = push(Budget::Minimal { norm: Norm::L2 }).run(&m, &x, &y, &Goal::Untargeted, 0).unwrap();
    let a = r.adversarial.to_vec();
    assert!(a.chunks(4).all(|row| row == [1.0, 0.0, 1.0, row[3]]), "{a:?}");
}

/// Returns x itself at ε = 0.3 and the box corner `.0` at every other budget.
struct Fickle([f32; 4]);

impl Algorithm for Fickle {
    fn name(&self) -> String {
        "fickle".into()
    }
    fn access(&self) -> Access {
        Access::Gradients
    }
    fn budget(&self) -> Budget {
        Budget::Fixed { norm: Norm::Linf, eps: Epsilon::Scalar(1.0) }
    }
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let corner: Vec<f32> = (0..p.len()).flat_map(|_| self.0).collect();
        Ok(if p.eps[0] == 0.3 { p.x.clone() } else { Tensor::from_vec(corner, p.x.shape())? })
    }
}

#[test]
fn sweeps_carry_successes_forward_and_answer_in_the_given_order() {
    let x = Tensor::uniform(&[6, 4], 0.2, 0.8, 3);
    // A model and a box corner it classifies unlike some clean input (the first such of a few seeds); labels the
    // clean inputs all miss (x itself succeeds), and that the corner hits where it can.
    let corners: Vec<[f32; 4]> =
        (0..16).map(|b| [0, 1, 2, 3].map(|k| if b >> k & 1 == 1 { 1.0 } else { 0.0 })).collect();
    let at = |m: &ModuleClassifier, c: [f32; 4]| m.predict(&Tensor::from_vec(c.to_vec(), &[1, 4]).unwrap()).unwrap()[0];
    let (m, point) = (0..100)
        .find_map(|seed| {
            let m = model_seeded(seed);
            let clean = m.predict(&x).unwrap();
            let c = *corners.iter().find(|&&c| clean.iter().any(|&p| p != at(&m, c)))?;
            Some((m, c))
        })
        .expect("a model with a differing corner");
    let clean = m.predict(&x).unwrap();
    let corner = at(&m, point);
    let y: Vec<usize> = clean.iter().map(|&c| if c != corner { corner } else { (c + 1) % 3 }).collect();
    let hit = (0..6).filter(|&i| y[i] == corner).count();
    assert!(hit > 0, "the corner must fail some sample for this test to mean anything");
    let rs = Fickle(point).sweep(&m, &x, &y, &Goal::Untargeted, &[1.0, 0.3], 0).unwrap();
    assert!(rs[1].success.iter().all(|&s| s), "ε = 0.3 (the second result) returns x, which every label misses");
    assert!(rs[0].success.iter().all(|&s| s), "successes at 0.3 carry to 1.0");
    let (a, xv) = (rs[0].adversarial.to_vec(), x.to_vec());
    for i in 0..6 {
        let row = &a[4 * i..4 * i + 4];
        if y[i] == corner {
            assert_eq!(row, &xv[4 * i..4 * i + 4], "sample {i}: the carried input is the one that succeeded");
        } else {
            assert_eq!(row, point, "sample {i}: the corner succeeded and stays");
        }
    }
    let alone = Fickle(point).run(&m, &x, &y, &Goal::Untargeted, 0).unwrap();
    assert_eq!(alone.success.iter().filter(|&&s| !s).count(), hit, "alone, the corner fails those samples");
    // An attack with no budget cannot be swept.
    assert!(push(Budget::Unbounded).sweep(&m, &x, &y, &Goal::Untargeted, &[0.1], 0).is_err());
}

#[test]
fn a_minimum_norm_sweep_clips_the_perturbation_to_each_budget() {
    let (x, y) = inputs();
    let m = model();
    let a = Push { step: 0.05, ..push(Budget::Minimal { norm: Norm::L2 }) };
    let full = a.run(&m, &x, &y, &Goal::Untargeted, 0).unwrap();
    let rs = a.sweep(&m, &x, &y, &Goal::Untargeted, &[0.01, 1.0], 0).unwrap();
    assert!(rs[0].norms.iter().all(|n| n.l2 <= 0.01 * (1.0 + 1e-6) && n.l2 > 0.0099));
    assert_eq!(rs[1].adversarial.to_vec(), full.adversarial.to_vec(), "a budget above the norm changes nothing");
}

#[test]
fn least_likely_targets_need_the_scores() {
    let (x, y) = inputs();
    let m = model();
    let label_only = Push { access: Access::Labels, ..push(Budget::Fixed { norm: Norm::Linf, eps: 0.1.into() }) };
    assert!(label_only.run(&m, &x, &y, &Goal::LeastLikely, 0).is_err());
    assert!(label_only.run(&m, &x, &y, &Goal::Untargeted, 0).is_ok());
    let scores = Push { access: Access::Scores, ..label_only };
    let r = scores.run(&m, &x, &y, &Goal::LeastLikely, 0).unwrap();
    assert_eq!(r.queries, vec![1; 6], "the resolution's look at the scores is one counted query per sample");
    let z = m.logits(&x).unwrap();
    let least: Vec<usize> =
        z.rows().into_iter().map(|r| (0..3).min_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap()).collect();
    assert_eq!(r.goal, Resolved::Targeted(least));
}

/// The tiny model with one class declared the rejection class (as if a detector stood in front of it).
struct Rejecting(ModuleClassifier, usize);

impl Classifier for Rejecting {
    fn input_shape(&self) -> &[usize] {
        self.0.input_shape()
    }
    fn num_classes(&self) -> usize {
        3
    }
    fn bounds(&self) -> (f32, f32) {
        self.0.bounds()
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
    fn counters(&self) -> &Counters {
        self.0.counters()
    }
    fn rejection_class(&self) -> Option<usize> {
        Some(self.1)
    }
}

#[test]
fn the_rejection_class_is_never_a_success_nor_a_target() {
    let (x, clean) = inputs();
    let y: Vec<usize> = clean.iter().map(|c| (c + 1) % 3).collect(); // labels the model misses
                                                                     // The rejection class: one that the pushed inputs reach without it being their label.
    let plain = push(Budget::Unbounded).run(&model(), &x, &y, &Goal::Untargeted, 0).unwrap();
    let i = plain.success.iter().position(|&s| s).expect("the push must break a sample for this test");
    let reject = plain.predictions[i];
    let m = Rejecting(model(), reject);
    let r = push(Budget::Unbounded).run(&m, &x, &y, &Goal::Untargeted, 0).unwrap();
    assert_eq!(r.predictions, plain.predictions);
    assert!(!r.success[i], "reaching the rejection class is no success");
    for (i, (&p, &l)) in r.predictions.iter().zip(&y).enumerate() {
        assert_eq!(r.success[i], p != l && p != reject, "sample {i}");
    }
    let r = push(Budget::Unbounded).run(&m, &x, &y, &Goal::RandomTarget { seed: 9 }, 0).unwrap();
    let Resolved::Targeted(t) = &r.goal else { panic!("targeted") };
    assert!(t.iter().zip(&y).all(|(&t, &l)| t != reject && t != l), "{t:?}");
    assert!(push(Budget::Unbounded).run(&m, &x, &y, &Goal::Targeted(vec![reject; 6]), 0).is_err());
    // Without a rejection class the random targets are the draws they always were: one of the two other classes.
    let r = push(Budget::Unbounded).run(&model(), &x, &y, &Goal::RandomTarget { seed: 9 }, 0).unwrap();
    let Resolved::Targeted(t) = &r.goal else { panic!("targeted") };
    assert!(t.iter().zip(&y).all(|(&t, &l)| t != l && t < 3));
}

/// Reports three gradients per call: one zero row, one with a NaN, and a normal one.
struct Faulty;

impl Algorithm for Faulty {
    fn name(&self) -> String {
        "faulty".into()
    }
    fn access(&self) -> Access {
        Access::Gradients
    }
    fn budget(&self) -> Budget {
        Budget::Unbounded
    }
    fn search(&self, p: &Problem<'_>) -> Result<Tensor> {
        let g = Array2::from_shape_vec((3, 2), vec![0.0, 0.0, 1.0, f32::NAN, 0.5, -0.5]).expect("3×2");
        p.note_gradient(g.view(), Some(&[4, 1, 0]));
        p.note_gradient(g.view(), None);
        Ok(p.x.clone())
    }
}

#[test]
fn work_and_gradient_faults_are_tallied_per_sample() {
    let (x, y) = inputs();
    let r = Faulty.run(&model(), &x, &y, &Goal::Untargeted, 0).unwrap();
    assert_eq!(r.gradients, vec![2, 2, 1, 0, 1, 0]);
    assert_eq!(r.queries, r.gradients);
    let zero: Vec<u64> = r.gradient_faults.iter().map(|f| f.zero).collect();
    let nan: Vec<u64> = r.gradient_faults.iter().map(|f| f.non_finite).collect();
    assert_eq!(zero, vec![1, 0, 0, 0, 1, 0]);
    assert_eq!(nan, vec![0, 2, 0, 0, 0, 0]);
}
