//! Activation recomputation (gradient checkpointing, as PyTorch's
//! `torch.utils.checkpoint`): a block's forward keeps only its input; its
//! backward runs the block again with a graph and backpropagates through
//! that. Activations inside the block live during one block's backward
//! instead of from the forward to the end of the backward.
//!
//! candle has no hook for it, so [`checkpoint`] is a custom op over the
//! block's input whose backward recomputes. A custom op can only return
//! the gradient of its inputs; the gradients of the block's parameters
//! are kept aside on this thread and merged into the step's gradients by
//! [`merge_parameter_grads`] after the backward.

use std::cell::RefCell;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, Var};

/// A block's forward function.
pub type Block = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

thread_local! {
    /// Parameter gradients of recomputed blocks, since the last merge.
    static ASIDE: RefCell<Option<GradStore>> = const { RefCell::new(None) };
}

/// `block(x)`, recomputed in the backward: the result keeps no activation
/// of the block. `params` are the tensors the block reads whose gradients
/// the step needs (its weights, as the block holds them). Without a
/// gradient graph (evaluation) this is `block(x)`.
pub fn checkpoint(x: &Tensor, params: Vec<Tensor>, block: Block) -> Result<Tensor> {
    if !x.track_op() && !params.iter().any(|p| p.track_op() || p.is_variable()) {
        return block(x);
    }
    // Run on a detached input and detach the output: nothing of the
    // block's graph (its activations) outlives this call.
    let y = block(&x.detach())?.detach();
    // The op is recorded only when an input is tracked: below a frozen
    // embedding the first block's input is not, so it stands in as a
    // variable (a copy; its gradient goes nowhere).
    let x = if x.track_op() {
        x.clone()
    } else {
        Var::from_tensor(x)?.as_tensor().clone()
    };
    x.apply_op2(&y, Recompute { params, block })
}

/// Adds the parameter gradients that recomputed blocks set aside during
/// the backward that made `grads` (call once after each backward).
pub fn merge_parameter_grads(grads: &mut GradStore) -> Result<()> {
    if let Some(aside) = ASIDE.with(|a| a.borrow_mut().take()) {
        grads.extend(aside)?;
    }
    Ok(())
}

/// Drops what a failed backward set aside (an OOM mid-backward).
pub fn discard_parameter_grads() {
    ASIDE.with(|a| a.borrow_mut().take());
}

struct Recompute {
    params: Vec<Tensor>,
    block: Block,
}

impl CustomOp2 for Recompute {
    fn name(&self) -> &'static str {
        "taper-recompute"
    }

    /// The output was computed already: a copy of it.
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        y: &CpuStorage,
        l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        if !l.is_contiguous() || l.start_offset() != 0 {
            candle_core::bail!("recompute: the block's output is not contiguous");
        }
        Ok((y.try_clone(l)?, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        y: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        if !l.is_contiguous() || l.start_offset() != 0 {
            candle_core::bail!("recompute: the block's output is not contiguous");
        }
        Ok((y.try_clone(l)?, l.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        _y: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let xv = Var::from_tensor(&x.detach())?;
        let out = (self.block)(xv.as_tensor())?;
        let mut gs = (out * grad.detach())?.sum_all()?.backward()?;
        let gx = gs.remove(xv.as_tensor());
        let mut mine = GradStore::default();
        for p in &self.params {
            if let Some(g) = gs.remove(p) {
                mine.insert(p, g);
            }
        }
        drop(gs); // the block's intermediate gradients go now
        ASIDE.with(|a| -> Result<()> {
            let mut a = a.borrow_mut();
            match a.as_mut() {
                Some(store) => store.extend(mine),
                None => {
                    *a = Some(mine);
                    Ok(())
                }
            }
        })?;
        Ok((gx, None))
    }
}
