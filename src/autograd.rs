//! Reverse-mode differentiation: gradients are returned in a store, never written onto tensors.
//!
//! `backward` walks every path to trainable parameters; `grad_wrt` walks only the paths to the tensors named, and
//! each op computes only the input gradients that lie on such a path — an attack asking for ∂L/∂x pays for no
//! weight gradient, and training (whose inputs are constants) pays for no input gradient.

use std::collections::{HashMap, HashSet};

use ndarray::ArrayD;

use crate::tensor::{Role, Tensor, TensorId};
use crate::{Error, Result};

/// Gradients keyed by tensor id.
#[derive(Default)]
pub struct Gradients {
    map: HashMap<TensorId, ArrayD<f32>>,
}

impl Gradients {
    /// The gradient of `t`, if it was computed.
    pub fn get(&self, t: &Tensor) -> Option<&ArrayD<f32>> {
        self.map.get(&t.id())
    }

    /// The gradient with a given id.
    pub fn get_id(&self, id: TensorId) -> Option<&ArrayD<f32>> {
        self.map.get(&id)
    }

    /// The gradient with a given id, mutable (for clipping).
    pub fn get_id_mut(&mut self, id: TensorId) -> Option<&mut ArrayD<f32>> {
        self.map.get_mut(&id)
    }

    /// How many gradients the store holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds `other`'s gradients into this store (elementwise for tensors in both, moved in otherwise).
    pub fn accumulate(&mut self, other: Gradients) {
        for (id, g) in other.map {
            match self.map.get_mut(&id) {
                Some(acc) => *acc += &g,
                None => {
                    self.map.insert(id, g);
                }
            }
        }
    }
}

/// Nodes reachable from `root` through tracked ops, inputs before the nodes that use them.
fn topo_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !t.is_tracked() || !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(op) = &t.0.op {
            for input in op.inputs() {
                if input.is_tracked() && !seen.contains(&input.id()) {
                    stack.push((input.clone(), false));
                }
            }
        }
    }
    order
}

fn run(root: &Tensor, is_target: impl Fn(&Tensor) -> bool) -> Result<Gradients> {
    let order = topo_order(root);
    // A node is needed when it is a target or some input of it is needed (inputs come first in `order`).
    let mut needed: HashSet<TensorId> = HashSet::new();
    for t in &order {
        let on_path =
            is_target(t) || t.0.op.as_ref().is_some_and(|op| op.inputs().iter().any(|i| needed.contains(&i.id())));
        if on_path {
            needed.insert(t.id());
        }
    }
    let mut grads: HashMap<TensorId, ArrayD<f32>> = HashMap::new();
    let mut out = Gradients::default();
    if !needed.contains(&root.id()) {
        return Ok(out);
    }
    grads.insert(root.id(), ArrayD::ones(root.shape()));
    for t in order.iter().rev() {
        let Some(g) = grads.remove(&t.id()) else { continue };
        if is_target(t) {
            if t.0.op.is_none() {
                out.map.insert(t.id(), g);
                continue;
            }
            out.map.insert(t.id(), g.clone());
        }
        let Some(op) = &t.0.op else { continue };
        crate::ops::warm::poke(g.len());
        if let Some((x, axis, start)) = op.narrowed() {
            // Into its slice of the input's gradient, in place: a transformer's q, k and v are three narrows of one
            // projection, and an input-sized zero-filled gradient per narrow, then their sums, were 3% of ViT-B/16's
            // forward + ∂x.
            if needed.contains(&x.id()) {
                let describe = || ("narrow".to_string(), x.shape().to_vec());
                crate::profile::time(
                    crate::profile::Phase::Backward,
                    describe,
                    |_| t.shape().to_vec(),
                    || match grads.get_mut(&x.id()) {
                        Some(acc) => crate::ops::shape::narrow_add_into(acc, axis, start, &g),
                        None => {
                            grads.insert(x.id(), crate::ops::shape::narrow_backward(x.shape(), axis, start, &g));
                        }
                    },
                );
            }
            continue;
        }
        let inputs = op.inputs();
        let need: Vec<bool> = inputs.iter().map(|i| needed.contains(&i.id())).collect();
        let input_grads = crate::profile::time(
            crate::profile::Phase::Backward,
            || (op.name().to_string(), inputs.first().map(|i| i.shape().to_vec()).unwrap_or_default()),
            |_| t.shape().to_vec(),
            || op.backward(t.value(), g, &need),
        )?;
        for ((input, ig), n) in inputs.iter().zip(input_grads).zip(need) {
            let (Some(ig), true) = (ig, n) else { continue };
            if ig.shape() != input.shape() {
                return Err(Error::Autograd {
                    op: op.name(),
                    msg: format!("backward produced shape {:?} for input {:?}", ig.shape(), input.shape()),
                });
            }
            match grads.get_mut(&input.id()) {
                Some(acc) => crate::ops::elementwise::add_into(acc, &ig),
                None => {
                    grads.insert(input.id(), ig);
                }
            }
        }
    }
    Ok(out)
}

/// Differentiation.
impl Tensor {
    /// Gradients of this tensor (summed, if it is not a scalar) with respect to every trainable parameter it
    /// depends on.
    pub fn backward(&self) -> Result<Gradients> {
        run(self, |t| t.0.role == Role::Parameter)
    }

    /// Gradients with respect to every trainable parameter and also `extra` tensors, in one backward pass (free
    /// adversarial training updates the weights and the perturbation from the same gradient).
    pub fn backward_with(&self, extra: &[&Tensor]) -> Result<Gradients> {
        let ids: HashSet<TensorId> = extra.iter().map(|t| t.id()).collect();
        run(self, |t| t.0.role == Role::Parameter || ids.contains(&t.id()))
    }

    /// Gradients of this tensor (summed, if not a scalar) with respect to `targets` only, in their order.
    /// A target the tensor does not depend on gets a zero gradient.
    pub fn grad_wrt(&self, targets: &[&Tensor]) -> Result<Vec<Tensor>> {
        let ids: HashSet<TensorId> = targets.iter().map(|t| t.id()).collect();
        let grads = run(self, |t| ids.contains(&t.id()))?;
        Ok(targets
            .iter()
            .map(|t| match grads.get(t) {
                Some(g) => Tensor::new(g.clone()),
                None => Tensor::zeros(t.shape()),
            })
            .collect())
    }
}
