//! Every attack of the crate by name — one table shared by the examples' `--attack` flag, evaluators, fuzzers
//! and the test table that runs each name through the property checks.
//!
//! ```
//! use armoury_attacks::registry::{by_name, names, AttackParams};
//! let pgd = by_name("pgd", &AttackParams { eps: 0.1, steps: Some(10), ..AttackParams::default() })?;
//! assert!(pgd.name().starts_with("PGD"));
//! assert!(names().contains(&"hsj"));
//! assert!(by_name("no-such-attack", &AttackParams::default()).is_err());
//! # Ok::<(), armoury::Error>(())
//! ```

use armoury::{Attack, Classifier, Error, Goal, Result, Tensor};

use crate::{
    Apgd, ApgdTargeted, BoundaryAttack, CarliniWagnerL2, DeepFool, ElasticNet, Epsilon, Fab, GenAttack, HopSkipJump,
    Jsma, LbfgsB, Llc, Loss, Nes, Norm, ParticleSwarm, Pgd, Pointwise, RFgsm, SaltAndPepper, SimBA, Spsa, SquareAttack,
    StepSearch, UniformNoise,
};

/// The settings a caller can give an attack by name; `None` keeps the attack's own default. Each attack reads
/// the settings it has and ignores the others (see [`table`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AttackParams {
    /// Perturbation budget ε in input units (fixed-budget attacks; also the size of Llc's and R-FGSM's step).
    pub eps: f32,
    /// The norm, for attacks that have several (default: L∞, or L2 for DeepFool and HopSkipJump).
    pub norm: Option<Norm>,
    /// Iterations (PGD family, APGD, CW, EAD; HopSkipJump's iterations).
    pub steps: Option<usize>,
    /// Step size in input units (PGD family; CW's Adam rate).
    pub step_size: Option<f32>,
    /// Random restarts (PGD family, APGD, FAB); `None` keeps the attack's own (5 for L1-APGD-CE, as AutoAttack).
    pub restarts: Option<usize>,
    /// Model queries per sample (black-box attacks).
    pub queries: Option<u64>,
    /// Target classes tried in turn (APGD-T, FAB-T; 9).
    pub targets: Option<usize>,
}

impl Default for AttackParams {
    /// ε = 0.1 (L∞ on [0, 1] images), one restart, every other setting the attack's own.
    fn default() -> Self {
        AttackParams {
            eps: 0.1,
            norm: None,
            steps: None,
            step_size: None,
            restarts: None,
            queries: None,
            targets: None,
        }
    }
}

/// Every name [`by_name`] accepts, with what it builds.
const TABLE: &[(&str, &str)] = &[
    ("fgsm", "FGSM (Goodfellow et al. 2015): one signed-gradient step of ε"),
    ("fgm", "FGM: one steepest-ascent step of ε in the given norm"),
    ("rfgsm", "R-FGSM (Tramèr et al. 2018): a random sign step, then FGSM"),
    ("llc", "Iterative least-likely class method (Kurakin et al. 2017)"),
    ("rllc", "Least-likely class method with a random first step"),
    ("bim", "BIM (Kurakin et al. 2017): 10 signed steps of ε/10"),
    ("pgd", "PGD (Madry et al. 2018) in the given norm, random start"),
    ("mifgsm", "MI-FGSM (Dong et al. 2018): momentum iterative FGSM"),
    ("difgsm", "DI-FGSM (Xie et al. 2019): input diversity"),
    ("mdifgsm", "M-DI²-FGSM: momentum and input diversity"),
    ("vmifgsm", "VMI-FGSM (Wang & He 2021): variance tuning with momentum"),
    ("vnifgsm", "VNI-FGSM (Wang & He 2021): variance tuning with Nesterov momentum"),
    ("noise", "Uniform noise in the ε-ball (a baseline)"),
    ("apgd", "APGD-CE (Croce & Hein 2020)"),
    ("apgd-ce", "APGD with the cross-entropy loss"),
    ("apgd-dlr", "APGD with the DLR loss"),
    ("apgd-t", "Targeted APGD with the targeted DLR loss"),
    ("deepfool", "DeepFool (Moosavi-Dezfooli et al. 2016), minimum norm"),
    ("cw", "Carlini & Wagner L2 (2017), 5 binary-search steps × 100 Adam steps"),
    ("cw-torchattacks", "Carlini & Wagner L2 with torchattacks' defaults"),
    ("ead", "Elastic-net attack (Chen et al. 2018)"),
    ("fab", "FAB (Croce & Hein 2020), minimum norm, L∞/L2/L1, every class linearised"),
    ("fab-t", "FAB-T (AutoAttack): FAB against each of the top 9 other classes, restarts of radius ε"),
    ("lbfgs", "L-BFGS-B box-constrained attack (Szegedy et al. 2014)"),
    ("jsma", "JSMA (Papernot et al. 2016), increasing saliency"),
    ("square", "Square Attack (Andriushchenko et al. 2020) as AutoAttack runs it, L∞, L2 or L1, score-based"),
    ("simba", "SimBA (Guo et al. 2019), pixel basis, score-based"),
    ("simba-dct", "SimBA-DCT (Guo et al. 2019), low frequencies first, score-based"),
    ("nes", "NES, query-limited (Ilyas et al. 2018), score-based"),
    ("nes-topk", "NES, partial information (top-3 probabilities)"),
    ("nes-label", "NES, label-only"),
    ("spsa", "SPSA (Uesato et al. 2018) with Adam, score-based"),
    ("genattack", "GenAttack (Alzantot et al. 2019), genetic search, score-based"),
    ("pso", "Particle-swarm attack (Mosli et al. 2019), score-based"),
    ("hsj", "HopSkipJump (Chen et al. 2020), geometric step search, decision-based"),
    ("hsj-grid", "HopSkipJump with a grid step search, decision-based"),
    ("boundary", "Boundary attack (Brendel et al. 2018), L2, decision-based"),
    ("pointwise", "Pointwise attack (Schott et al. 2019), L0, decision-based"),
    ("saltpepper", "Salt-and-pepper noise with a search on the fraction, decision-based"),
];

/// Every `(name, description)` [`by_name`] accepts, in a stable order.
pub fn table() -> &'static [(&'static str, &'static str)] {
    TABLE
}

/// Every name [`by_name`] accepts, in the order of [`table`].
pub fn names() -> Vec<&'static str> {
    TABLE.iter().map(|(n, _)| *n).collect()
}

/// The attack called `name` (case-insensitive) with the settings of `params`; an unknown name is an error that
/// lists every valid one. With `params.norm` given, an attack whose budget is in another norm is an error that
/// lists the attacks that have that norm (FGSM is L∞ only: asked for L2 it would quietly answer another
/// question).
pub fn by_name(name: &str, params: &AttackParams) -> Result<Box<dyn Attack>> {
    let name = name.to_ascii_lowercase();
    let attack = build(&name, params).ok_or_else(|| {
        Error::invalid("attack name", format!("unknown attack '{name}'; known: {}", names().join(", ")))
    })?;
    match (params.norm, attack.budget_kind().and_then(|b| b.norm())) {
        (Some(asked), Some(has)) if asked != has => Err(wrong_norm(&name, asked)),
        _ => Ok(attack),
    }
}

fn build(name: &str, p: &AttackParams) -> Option<Box<dyn Attack>> {
    gradient(name, p).or_else(|| minimal(name, p)).or_else(|| score(name, p)).or_else(|| decision(name, p))
}

fn wrong_norm(name: &str, norm: Norm) -> Error {
    Error::invalid(
        "attack norm",
        format!("attack '{name}' cannot run in {norm:?}; the attacks that can: {}", names_for(norm).join(", ")),
    )
}

/// The names whose attack works to a budget in `norm` — a fixed budget or a minimum-norm search (what a threat
/// model in that norm may list).
pub fn names_for(norm: Norm) -> Vec<&'static str> {
    let p = AttackParams { norm: Some(norm), ..AttackParams::default() };
    names()
        .into_iter()
        .filter(|n| build(n, &p).and_then(|a| a.budget_kind()).and_then(|b| b.norm()) == Some(norm))
        .collect()
}

/// The settings a detector is evaluated against with attack `name` at budget `eps` (the `detect` example's
/// `--attack`): PGD-40 of step 0.01 for `pgd`, 200 queries per sample for the query attacks `hsj`, `nes` and
/// `square`, every other setting the attack's own.
pub fn detection_params(name: &str, eps: f32) -> AttackParams {
    let mut params = AttackParams { eps, ..AttackParams::default() };
    match name {
        "pgd" => {
            params.steps = Some(40);
            params.step_size = Some(0.01);
        }
        "hsj" | "nes" | "square" => params.queries = Some(200),
        _ => {}
    }
    params
}

/// The goal attack `name` is run for by default: JSMA is targeted by definition (a random target other than
/// the label, drawn from `seed`), every other attack untargeted.
pub fn default_goal(name: &str, seed: u64) -> Goal {
    if name.eq_ignore_ascii_case("jsma") {
        Goal::RandomTarget { seed }
    } else {
        Goal::Untargeted
    }
}

/// The adversarial inputs of `attack` on `x` (true labels `y`) against `model`, run on `batch` samples at a time
/// (bounding memory) with the same `goal` and `seed` for every batch, concatenated in sample order.
pub fn run_in_batches(
    attack: &dyn Attack,
    model: &dyn Classifier,
    (x, y): (&Tensor, &[usize]),
    goal: &Goal,
    seed: u64,
    batch: usize,
) -> Result<Tensor> {
    let (n, batch) = (y.len(), batch.max(1));
    let mut parts = Vec::new();
    for s in (0..n).step_by(batch) {
        let e = (s + batch).min(n);
        parts.push(attack.run(model, &x.narrow(0, s, e - s)?, &y[s..e], goal, seed)?.adversarial);
    }
    Tensor::concat(&parts, 0)
}

/// The attack of a threat model's entry at budget `eps` in `norm` (the evaluator's [`armoury::eval::Builder`]):
/// an attack without a budget in `norm` is an error listing those that have one.
pub fn from_spec(spec: &armoury::eval::AttackSpec, norm: Norm, eps: f32) -> Result<Box<dyn Attack>> {
    let params = AttackParams {
        eps,
        norm: Some(norm),
        steps: spec.steps,
        step_size: spec.step_size.map(|s| s as f32),
        restarts: spec.restarts,
        queries: spec.queries,
        targets: spec.targets,
    };
    let attack = by_name(&spec.name, &params)?;
    match attack.budget_kind().and_then(|b| b.norm()) {
        Some(n) if n == norm => Ok(attack),
        _ => Err(wrong_norm(&spec.name.to_ascii_lowercase(), norm)),
    }
}

/// The PGD family with the caller's steps, step size and restarts.
fn iterative(mut a: Pgd, p: &AttackParams) -> Pgd {
    if let Some(s) = p.steps {
        a.steps = s;
    }
    if let Some(s) = p.step_size {
        a.step_size = s;
    }
    a.restarts = p.restarts.unwrap_or(a.restarts).max(1);
    a
}

fn gradient(name: &str, p: &AttackParams) -> Option<Box<dyn Attack>> {
    let (eps, norm) = (p.eps, p.norm.unwrap_or(Norm::Linf));
    Some(match name {
        "fgsm" => Box::new(Pgd::fgsm(eps)),
        "fgm" => Box::new(Pgd::fgm(norm, eps)),
        "rfgsm" => Box::new(RFgsm::new(eps)),
        "llc" => Box::new(Llc { eps, random: false }),
        "rllc" => Box::new(Llc { eps, random: true }),
        "bim" => Box::new(iterative(Pgd::bim(eps, eps / 10.0, 10), p)),
        "pgd" => Box::new(iterative(Pgd { norm, eps: Epsilon::Scalar(eps), ..Pgd::linf(eps) }, p)),
        "mifgsm" => Box::new(iterative(Pgd::mi_fgsm(eps), p)),
        "difgsm" => Box::new(iterative(Pgd::di_fgsm(eps), p)),
        "mdifgsm" => Box::new(iterative(Pgd::m_di_fgsm(eps), p)),
        "vmifgsm" => Box::new(iterative(Pgd::vmi_fgsm(eps), p)),
        "vnifgsm" => Box::new(iterative(Pgd::vni_fgsm(eps), p)),
        "noise" => Box::new(UniformNoise { norm, eps: Epsilon::Scalar(eps) }),
        "apgd" | "apgd-ce" | "apgd-dlr" => {
            let mut a = match norm {
                Norm::Linf => Apgd::linf(eps),
                Norm::L2 => Apgd::l2(eps),
                Norm::L1 => Apgd::l1(eps),
            };
            if name == "apgd-dlr" {
                a.loss = Loss::Dlr;
            }
            if let Some(s) = p.steps {
                a.steps = s;
            }
            a.restarts = p.restarts.unwrap_or(a.restarts).max(1);
            Box::new(a)
        }
        "apgd-t" => {
            let mut a = match norm {
                Norm::Linf => ApgdTargeted::linf(eps),
                Norm::L2 => ApgdTargeted::l2(eps),
                Norm::L1 => ApgdTargeted::l1(eps),
            };
            if let Some(s) = p.steps {
                a.base.steps = s;
            }
            a.base.restarts = p.restarts.unwrap_or(a.base.restarts).max(1);
            a.target_classes = p.targets.unwrap_or(a.target_classes);
            Box::new(a)
        }
        _ => return None,
    })
}

fn minimal(name: &str, p: &AttackParams) -> Option<Box<dyn Attack>> {
    Some(match name {
        "deepfool" => Box::new(if p.norm == Some(Norm::Linf) { DeepFool::linf() } else { DeepFool::default() }),
        // The searched configuration the tests hold to success 1.0 on the fixture cnn (5 × 100 Adam steps of
        // 0.05 from c = 1); longer runs at the paper's rate: steps 1000, step size 0.01.
        "cw" => Box::new(CarliniWagnerL2 {
            c: 1.0,
            steps: p.steps.unwrap_or(100),
            lr: p.step_size.unwrap_or(0.05),
            binary_search_steps: 5,
            ..CarliniWagnerL2::default()
        }),
        "cw-torchattacks" => Box::new(CarliniWagnerL2::torchattacks()),
        "ead" => Box::new(ElasticNet {
            steps: p.steps.unwrap_or(100),
            c: 10.0,
            binary_search_steps: 3,
            ..ElasticNet::default()
        }),
        "fab" | "fab-t" => {
            let plain = match p.norm.unwrap_or(Norm::Linf) {
                Norm::Linf => Fab::linf(),
                Norm::L2 => Fab::l2(),
                Norm::L1 => Fab::l1(),
            };
            let radius = if p.eps > 0.0 { p.eps } else { plain.restart_radius };
            let mut a = Fab { restart_radius: radius, ..plain };
            if name == "fab-t" {
                // AutoAttack's FAB-T: 9 targets, no further target once broken within ε.
                (a.target_classes, a.stop_at) = (p.targets.unwrap_or(9), Some(p.eps));
            }
            if let Some(s) = p.steps {
                a.steps = s;
            }
            a.restarts = p.restarts.unwrap_or(a.restarts).max(1);
            Box::new(a)
        }
        "lbfgs" => Box::new(LbfgsB::default()),
        "jsma" => Box::new(Jsma::increase()),
        _ => return None,
    })
}

fn score(name: &str, p: &AttackParams) -> Option<Box<dyn Attack>> {
    let eps = p.eps;
    let q = |default: u64| p.queries.unwrap_or(default);
    Some(match name {
        "square" => {
            let base = match p.norm {
                Some(Norm::L2) => SquareAttack::l2(eps),
                Some(Norm::L1) => SquareAttack::l1(eps),
                _ => SquareAttack::linf(eps),
            };
            Box::new(SquareAttack { max_queries: q(1_000), ..base })
        }
        "simba" => Box::new(SimBA { max_queries: q(10_000), ..SimBA::pixel(eps) }),
        "simba-dct" => Box::new(SimBA { max_queries: q(10_000), ..SimBA::dct(eps) }),
        "nes" => Box::new(Nes { max_queries: q(10_000), ..Nes::query_limited(eps) }),
        "nes-topk" => Box::new(Nes { max_queries: q(10_000), ..Nes::partial_info(eps, 3, None) }),
        "nes-label" => Box::new(Nes { max_queries: q(10_000), ..Nes::label_only(eps, None) }),
        "spsa" => Box::new(Spsa { max_queries: q(10_000), ..Spsa::new(eps) }),
        "genattack" => Box::new(GenAttack { max_queries: q(10_000), ..GenAttack::new(eps) }),
        "pso" => Box::new(ParticleSwarm { max_queries: q(10_000), ..ParticleSwarm::new(eps) }),
        _ => return None,
    })
}

fn decision(name: &str, p: &AttackParams) -> Option<Box<dyn Attack>> {
    let q = |default: usize| p.queries.map_or(default, |q| usize::try_from(q).unwrap_or(usize::MAX));
    Some(match name {
        "hsj" | "hsj-grid" => Box::new(HopSkipJump {
            norm: p.norm.unwrap_or(Norm::L2),
            max_queries: q(5_000),
            max_iter: p.steps.unwrap_or(1_000),
            step_search: if name == "hsj" { StepSearch::Geometric } else { StepSearch::Grid },
            ..HopSkipJump::default()
        }),
        "boundary" => Box::new(BoundaryAttack { max_queries: q(10_000), ..BoundaryAttack::default() }),
        "pointwise" => Box::new(Pointwise { max_queries: q(5_000), ..Pointwise::default() }),
        "saltpepper" => Box::new(SaltAndPepper { max_queries: q(1_000), ..SaltAndPepper::default() }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_builds_and_names_are_unique() {
        let p = AttackParams::default();
        for name in names() {
            assert!(by_name(name, &p).is_ok(), "{name}");
            assert!(by_name(&name.to_ascii_uppercase(), &p).is_ok(), "{name} in capitals");
        }
        let mut sorted = names();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), TABLE.len());
    }

    #[test]
    fn an_unknown_name_lists_every_valid_one() {
        let Err(e) = by_name("pgdd", &AttackParams::default()) else { panic!("pgdd is not an attack") };
        let msg = e.to_string();
        assert!(names().iter().all(|n| msg.contains(n)), "{msg}");
    }

    #[test]
    fn params_reach_the_attack() {
        let p = AttackParams { queries: Some(77), norm: Some(Norm::L2), ..AttackParams::default() };
        for (name, want) in [("square", "Square-L2"), ("hsj", "HopSkipJump-L2(queries=77"), ("simba", "queries=77")] {
            // SimBA's budget is L∞ (a step of ε on one coordinate at a time): asked for L2 it is refused.
            let p = if name == "simba" { AttackParams { norm: None, ..p.clone() } } else { p.clone() };
            let got = by_name(name, &p).map(|a| a.name()).unwrap_or_default();
            assert!(got.contains(want), "{name}: {got}");
        }
    }

    #[test]
    fn an_attack_asked_for_a_norm_it_lacks_is_refused_with_the_attacks_that_have_it() {
        let l2 = AttackParams { norm: Some(Norm::L2), ..AttackParams::default() };
        let Err(e) = by_name("simba", &l2) else { panic!("SimBA has no L2 budget") };
        let msg = e.to_string();
        assert!(msg.contains("cannot run in L2") && msg.contains("pgd") && msg.contains("cw"), "{msg}");
        assert!(!names_for(Norm::L2).contains(&"simba") && names_for(Norm::Linf).contains(&"simba"));
    }
}
