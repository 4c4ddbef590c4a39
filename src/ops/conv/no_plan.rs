//! The planners of `plan.rs` on CPUs without the vector kernels (any target but x86-64): no plan is ever made, so
//! each planner is an empty enum, `plan` returns `None` and `run` cannot be called. The signatures follow
//! `plan.rs`; callers take the unfolding path.

use std::mem::MaybeUninit;

use crate::ops::simd::Unfold;

/// No direct forward: see `plan.rs`.
pub(super) enum DirectConv {}

impl DirectConv {
    pub(super) fn plan(_: &Unfold) -> Option<DirectConv> {
        None
    }

    pub(super) fn plan_phased(_: &Unfold) -> Option<DirectConv> {
        None
    }

    pub(super) fn plane_len(&self) -> usize {
        match *self {}
    }

    pub(super) fn image<'a>(&self, _: &'a [f32], _: &super::Geom, _: &'a mut Vec<f32>) -> &'a [f32] {
        match *self {}
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_pooled(
        &self,
        _: &[f32],
        _: &[f32],
        _: usize,
        _: Option<&[f32]>,
        _: &mut [f32],
        _: &mut [u32],
        _: (bool, u32),
        _: bool,
    ) {
        match *self {}
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        _: &[f32],
        _: &[f32],
        _: usize,
        _: Option<&[f32]>,
        _: Option<super::Clamp>,
        _: &mut [MaybeUninit<f32>],
        _: bool,
    ) {
        match *self {}
    }
}

/// No implicit weight gradient: see `plan.rs`.
pub(super) enum WeightGrad {}

impl WeightGrad {
    pub(super) fn plan(_: &Unfold) -> Option<WeightGrad> {
        None
    }

    pub(super) fn run(&self, _: &[f32], _: &[f32], _: usize, _: &mut [f32]) {
        match *self {}
    }
}

/// No direct input gradient: see `plan.rs`.
pub(super) enum InputGrad {}

impl InputGrad {
    pub(super) fn plan(_: &Unfold, _: usize, _: &[f32]) -> Option<InputGrad> {
        None
    }

    pub(super) fn plan_phased(_: &Unfold, _: usize, _: &[f32]) -> Option<InputGrad> {
        None
    }

    pub(super) fn phased(&self) -> bool {
        match *self {}
    }

    pub(super) fn plane_len(&self) -> usize {
        match *self {}
    }

    pub(super) fn run(&self, _: usize, _: &[f32], _: &mut [f32], _: bool) {
        match *self {}
    }
}
