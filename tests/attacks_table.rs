//! One row per attack: every name of `armoury_attacks::registry` through the shared property checks of
//! `attack_props` (feasibility, honest success flags, determinism across threads, batches and permutations, the
//! zero budget) on the tiny model, with budgets small enough that the whole table takes seconds. Adding an
//! attack is one file, one registry row and one row here; `the_table_covers_the_registry` fails until the row
//! is added.

use armoury::{Attack, Classifier, Goal, Tensor};
use armoury_attacks::registry::{by_name, names, AttackParams};

use crate::attack_props::*;

/// How an attack of the table is checked.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// White-box with a fixed L∞ budget ε: feasible within it, ε = 0 is the identity.
    Fixed,
    /// White-box, minimum-norm or unbounded: only the bounds hold; no zero budget.
    Minimal,
    /// Score-based with a fixed L∞ budget: also ε = 0 and `max_queries = 0` are the identity, and the queries
    /// are accounted for exactly.
    Scores,
    /// Decision-based (no norm budget): `max_queries = 0` is the identity; queries accounted for exactly.
    Labels,
}

/// A row: the registry name, the settings the table runs it with, how it is checked, and the goals it pursues.
struct Row {
    name: &'static str,
    params: AttackParams,
    kind: Kind,
    /// The goals it is run toward (untargeted and random targets, unless it pursues only one kind).
    goals: Vec<Goal>,
    /// Whether ε = 0 is accepted (FGSM, FGM and Llc refuse their step of ε = 0; label-only NES its noise radius
    /// μ = ε = 0), so that the zero-budget identity can be checked.
    zero_eps: bool,
}

const EPS: f32 = 0.3;

fn row(name: &'static str, kind: Kind, steps: Option<usize>, queries: Option<u64>) -> Row {
    let params = AttackParams { eps: EPS, steps, queries, ..AttackParams::default() };
    Row { name, params, kind, goals: vec![Goal::Untargeted, Goal::RandomTarget { seed: 3 }], zero_eps: true }
}

fn table() -> Vec<Row> {
    use Kind::*;
    let targeted = |mut r: Row| {
        r.goals = vec![Goal::RandomTarget { seed: 7 }];
        r
    };
    let untargeted = |mut r: Row| {
        r.goals = vec![Goal::Untargeted];
        r
    };
    let no_zero_eps = |mut r: Row| {
        r.zero_eps = false;
        r
    };
    vec![
        no_zero_eps(row("fgsm", Fixed, None, None)),
        no_zero_eps(row("fgm", Fixed, None, None)),
        row("rfgsm", Fixed, None, None),
        no_zero_eps(row("llc", Fixed, None, None)),
        row("rllc", Fixed, None, None),
        row("bim", Fixed, None, None),
        row("pgd", Fixed, Some(10), None),
        row("mifgsm", Fixed, Some(5), None),
        row("difgsm", Fixed, Some(5), None),
        row("mdifgsm", Fixed, Some(5), None),
        row("vmifgsm", Fixed, Some(3), None),
        row("vnifgsm", Fixed, Some(3), None),
        row("noise", Fixed, None, None),
        row("apgd", Fixed, Some(10), None),
        row("apgd-ce", Fixed, Some(10), None),
        row("apgd-dlr", Fixed, Some(10), None),
        targeted(row("apgd-t", Fixed, None, None)),
        untargeted(row("deepfool", Minimal, None, None)),
        row("cw", Minimal, Some(20), None),
        row("cw-torchattacks", Minimal, None, None),
        row("ead", Minimal, Some(20), None),
        row("fab", Minimal, Some(10), None),
        row("fab-t", Minimal, Some(10), None),
        row("lbfgs", Minimal, None, None),
        targeted(row("jsma", Minimal, None, None)),
        row("square", Scores, None, Some(100)),
        row("simba", Scores, None, Some(100)),
        row("simba-dct", Scores, None, Some(100)),
        row("nes", Scores, None, Some(150)),
        row("nes-topk", Scores, None, Some(150)),
        no_zero_eps(row("nes-label", Scores, None, Some(150))),
        row("spsa", Scores, None, Some(150)),
        row("genattack", Scores, None, Some(150)),
        row("pso", Scores, None, Some(150)),
        row("hsj", Labels, Some(20), Some(200)),
        row("hsj-grid", Labels, Some(20), Some(200)),
        row("boundary", Labels, None, Some(200)),
        row("pointwise", Labels, None, Some(150)),
        row("saltpepper", Labels, None, Some(60)),
    ]
}

fn build(name: &str, params: &AttackParams) -> Box<dyn Attack> {
    by_name(name, params).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The check this table adds to `attack_props`: for a black-box attack the per-sample queries add up to the
/// classifier's own count of forward passes (minus the evaluation pass) and none exceeds the budget.
fn check_queries(name: &str, a: &dyn Attack, model: &dyn Classifier, x: &Tensor, y: &[usize], goal: &Goal, max: u64) {
    let before = model.counters().snapshot().forward_samples;
    let r = a.run(model, x, y, goal, 0).unwrap();
    let spent = model.counters().snapshot().forward_samples - before;
    assert_eq!(r.queries.iter().sum::<u64>() + y.len() as u64, spent, "{name}: queries reported vs counted");
    assert!(r.queries.iter().all(|&q| q <= max), "{name}: budget {max} exceeded: {:?}", r.queries);
}

#[test]
fn the_table_covers_the_registry() {
    let mut rows: Vec<&str> = table().iter().map(|r| r.name).collect();
    let mut registered = names();
    rows.sort_unstable();
    registered.sort_unstable();
    assert_eq!(rows, registered, "one table row per registry name");
}

#[test]
fn every_attack_passes_the_property_checks() {
    let model = tiny_model(1);
    let n = 8;
    let (x, y) = batch(&model, n, 2);
    let x_before = x.to_vec();
    for r in table() {
        let attack = build(r.name, &r.params);
        let name = format!("{} ({})", r.name, attack.name());
        let eps = match r.kind {
            Kind::Fixed | Kind::Scores => [EPS; 8],
            Kind::Minimal | Kind::Labels => [f32::INFINITY; 8],
        };
        for goal in &r.goals {
            let res = attack.run(&model, &x, &y, goal, 0).unwrap_or_else(|e| panic!("{name} {goal:?}: {e}"));
            check_feasible(&name, &model, &x, &res, "Linf", &eps);
            check_honest(&name, &model, &y, &res);
            check_deterministic(&name, attack.as_ref(), &model, &x, &y, goal);
        }
        if let (Kind::Scores | Kind::Labels, Some(q)) = (r.kind, r.params.queries) {
            check_queries(&name, attack.as_ref(), &model, &x, &y, &r.goals[0], q);
        }
        if matches!(r.kind, Kind::Fixed | Kind::Scores) && r.zero_eps {
            // A step size of its own: the PGD family's default is a fraction of ε, and a step of 0 is refused.
            let zero = build(r.name, &AttackParams { eps: 0.0, step_size: Some(0.01), ..r.params.clone() });
            check_zero_budget(&format!("{name} at ε = 0"), zero.as_ref(), &model, &x, &y);
        }
        assert_eq!(x.to_vec(), x_before, "{name}: the caller's input must not change");
    }
}

/// `max_queries = 0`: every black-box attack returns x bit for bit and reports no query, and the classifier
/// counts none but the evaluation pass.
#[test]
fn no_queries_no_change() {
    let model = tiny_model(1);
    let (x, y) = batch(&model, 6, 4);
    for r in table().into_iter().filter(|r| matches!(r.kind, Kind::Scores | Kind::Labels)) {
        let attack = build(r.name, &AttackParams { queries: Some(0), ..r.params.clone() });
        let name = attack.name();
        check_zero_budget(&name, attack.as_ref(), &model, &x, &y);
        for goal in [Goal::Untargeted, Goal::RandomTarget { seed: 3 }] {
            let before = model.counters().snapshot().forward_samples;
            let res = attack.run(&model, &x, &y, &goal, 0).unwrap();
            assert_eq!(model.counters().snapshot().forward_samples - before, 6, "{name}: only the evaluation pass");
            assert_eq!(res.queries, vec![0; 6], "{name}");
            assert_eq!(res.adversarial.to_vec(), x.to_vec(), "{name}");
        }
    }
}
