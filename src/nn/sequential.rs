//! [`Sequential`]: named children run in order, as the fuser ([`plan`]) groups them.

use std::sync::atomic::{AtomicBool, Ordering};

use super::plan::{self, Fused, Fusion, Kind, Layer, Output, Step};
use super::{unknown_layer, Module, Param};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Children run in order; parameter names are `child.param` as in a PyTorch `nn.Sequential` with named children.
#[derive(Default)]
pub struct Sequential {
    children: Vec<(String, Box<dyn Module>)>,
    training: AtomicBool,
}

impl Sequential {
    /// An empty container.
    pub fn new() -> Self {
        Sequential::default()
    }

    /// Appends a named child.
    pub fn add(mut self, name: impl Into<String>, m: impl Module + 'static) -> Self {
        self.children.push((name.into(), Box::new(m)));
        self
    }

    /// The children with their names.
    pub fn children(&self) -> impl Iterator<Item = (&str, &dyn Module)> {
        self.children.iter().map(|(n, m)| (n.as_str(), m.as_ref()))
    }

    /// Runs every child on its own, without fusing any, and returns each child's output with its name: the
    /// layer-by-layer reference computation that `forward_t` and [`Module::forward_taps`] agree with.
    pub fn forward_collect(&self, x: &Tensor, train: bool) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(self.children.len());
        let mut h = x.clone();
        for (name, m) in &self.children {
            h = m.forward_t(&h, train)?;
            out.push((name.clone(), h.clone()));
        }
        Ok(out)
    }

    /// The fuser's plan for a forward pass in this mode that taps nothing: the children by name, grouped into the
    /// steps that run as one kernel ([`Fused::Single`] for a child on its own). A nested container is one
    /// [`Layer::Opaque`] step here (it plans its own children).
    pub fn plan(&self, train: bool) -> Vec<Fusion> {
        let (_, steps) = self.planned(train, None);
        let name = |i: usize| self.children[i].0.clone();
        steps.iter().map(|s| Fusion { fused: s.fused, layers: s.layers().map(name).collect() }).collect()
    }

    /// The children's descriptions and the plan over them: a child asked for taps inside it is opaque (it runs
    /// through its own `forward_taps`), and a child whose output is asked for ends a step.
    fn planned(&self, train: bool, taps: Option<&TapPlan>) -> (Vec<Layer>, Vec<Step>) {
        let len = self.children.len();
        let own = |i: usize| taps.is_some_and(|p| p.own.get(i).copied().unwrap_or(false));
        let deep = |i: usize| taps.and_then(|p| p.inner.get(i)).is_some_and(|v| !v.is_empty());
        let describe =
            |(i, (_, m)): (usize, &(String, Box<dyn Module>))| if deep(i) { Layer::Opaque } else { m.describe() };
        let layers: Vec<Layer> = self.children.iter().enumerate().map(describe).collect();
        let kinds: Vec<Kind> = layers.iter().map(Layer::kind).collect();
        let outputs: Vec<Output> = (0..len)
            .map(|i| match i {
                _ if own(i) => Output::Tapped,
                _ if i + 1 == len => Output::Kept,
                _ => Output::Open,
            })
            .collect();
        let steps = plan::plan(&kinds, &outputs, train);
        (layers, steps)
    }

    /// Runs the children in order as the fuser plans them. Returns the output, the kept outputs of the children
    /// `taps` asks for, and what each child asked for by a nested name returned.
    fn run(&self, x: &Tensor, train: bool, taps: Option<&TapPlan>) -> Result<Tapped> {
        let len = self.children.len();
        let (mut kept, mut nested) = match taps {
            Some(_) => (vec![None; len], vec![Vec::new(); len]),
            None => (Vec::new(), Vec::new()),
        };
        let (layers, steps) = self.planned(train, taps);
        let mut h = x.clone();
        for step in steps {
            let i = step.start;
            let inner = taps.and_then(|p| p.inner.get(i)).filter(|v| !v.is_empty());
            h = match (step.fused, inner) {
                (Fused::Single, Some(names)) => {
                    let (y, values) = self.children[i].1.forward_taps(&h, train, names)?;
                    nested[i] = values;
                    y
                }
                (Fused::Single, None) => self.children[i].1.forward_t(&h, train)?,
                (fused, _) => fused.run(&h, &layers[step.layers()])?,
            };
            if taps.is_some_and(|p| p.own.get(step.last()).copied().unwrap_or(false)) {
                kept[step.last()] = Some(h.clone());
            }
        }
        Ok(Tapped { output: h, kept, nested })
    }
}

/// What a tapped forward pass of a [`Sequential`] keeps: per child, whether its own output is asked for and the
/// names asked for inside it.
struct TapPlan<'a> {
    own: Vec<bool>,
    inner: Vec<Vec<&'a str>>,
}

/// What a tapped forward pass of a [`Sequential`] returns: the output, the kept outputs of the children (by
/// child), and the values each child returned for the names asked inside it (by child).
struct Tapped {
    output: Tensor,
    kept: Vec<Option<Tensor>>,
    nested: Vec<Vec<Tensor>>,
}

impl Module for Sequential {
    /// Runs the children in order as the fuser plans them ([`Sequential::plan`]): the same function and
    /// gradients as the layer-by-layer computation ([`Sequential::forward_collect`]), to rounding.
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        Ok(self.run(x, train, None)?.output)
    }

    /// Every child's name, each followed by the names inside it prefixed with `child.` (a nested container's).
    fn tap_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, m) in &self.children {
            out.push(name.clone());
            out.extend(m.tap_names().into_iter().map(|inner| format!("{name}.{inner}")));
        }
        out
    }

    /// A child's name is its output; `child.inner` asks the child for its tap `inner`. The fuser never runs
    /// through an output asked for (a fused step ends there) and never folds a BatchNorm whose output is asked
    /// for; everything else runs as in `forward_t`.
    fn forward_taps(&self, x: &Tensor, train: bool, names: &[&str]) -> Result<(Tensor, Vec<Tensor>)> {
        let len = self.children.len();
        let mut plan = TapPlan { own: vec![false; len], inner: vec![Vec::new(); len] };
        // Per request: the child, and the position of its nested name in `plan.inner[child]`.
        let mut wanted: Vec<(usize, Option<usize>)> = Vec::with_capacity(names.len());
        for &name in names {
            if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
                plan.own[i] = true;
                wanted.push((i, None));
                continue;
            }
            let nested = self.children.iter().enumerate().find_map(|(i, (n, m))| {
                let rest = name.strip_prefix(n.as_str())?.strip_prefix('.')?;
                m.tap_names().iter().any(|t| t == rest).then_some((i, rest))
            });
            let Some((i, rest)) = nested else {
                return Err(unknown_layer("Sequential::forward_taps", name, &self.tap_names()));
            };
            wanted.push((i, Some(plan.inner[i].len())));
            plan.inner[i].push(rest);
        }
        let Tapped { output: y, kept, nested } = self.run(x, train, Some(&plan))?;
        let taps = wanted
            .into_iter()
            .map(|(i, k)| match k {
                None => kept[i].clone(),
                Some(k) => nested[i].get(k).cloned(),
            })
            .map(|t| {
                t.ok_or_else(|| Error::invalid("Sequential::forward_taps", "a child returned fewer taps than asked"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((y, taps))
    }

    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (name, m) in &self.children {
            m.visit(&format!("{prefix}{name}."), f);
        }
    }

    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
        for (_, m) in &self.children {
            m.set_training(training);
        }
    }

    fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    fn batch_independent(&self, train: bool) -> bool {
        self.children.iter().all(|(_, m)| m.batch_independent(train))
    }

    fn mode_independent(&self) -> bool {
        self.children.iter().all(|(_, m)| m.mode_independent())
    }
}
