//! Knowledge distillation's loss: a frozen teacher's softened outputs as
//! soft targets beside the labels.

use std::rc::Rc;

use candle_core::{DType, Module, Result, Tensor, D};

use super::ignored;
use super::loss::CrossEntropy;

/// Knowledge distillation (Hinton et al. 2015): the loss is
/// `alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) +
/// (1 - alpha) * cross_entropy(student, labels)`, the KL term averaged
/// over positions (PyTorch's `kl_div(..., reduction="batchmean")`). The
/// teacher is a frozen model: its logits carry no gradient.
#[derive(Clone)]
pub struct Distill {
    pub teacher: Rc<dyn Module>,
    pub teacher_name: String,
    pub temperature: f64,
    pub alpha: f64,
    pub base: CrossEntropy,
}

impl Distill {
    pub fn loss(&self, x: &Tensor, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let hard = self.base.loss(logits, targets)?;
        if self.alpha == 0.0 {
            return Ok(hard);
        }
        // The teacher runs in f32 whatever the student's precision.
        let tx = if x.dtype().is_float() {
            x.to_dtype(DType::F32)?
        } else {
            x.clone()
        };
        let teacher = self.teacher.forward(&tx)?.detach();
        if teacher.dims() != logits.dims() {
            candle_core::bail!(
                "distill: the teacher ({}) gives logits of shape {:?}, the student {:?}",
                self.teacher_name,
                teacher.dims(),
                logits.dims()
            );
        }
        let student = logits.to_dtype(DType::F32)?;
        // A sequence's ignored positions (a prompt's) are left out of the
        // soft term too: both are means over the labelled positions.
        let (teacher, student) = match ignored::labelled_index(targets, targets.device())? {
            Some(keep) if keep.elem_count() > 0 => {
                let c = student.dim(D::Minus1)?;
                let (t, s) = (teacher.reshape(((), c))?, student.reshape(((), c))?);
                (t.index_select(&keep, 0)?, s.index_select(&keep, 0)?)
            }
            _ => (teacher, student),
        };
        let soft = kl_soft(&teacher, &student, self.temperature)?;
        let soft = soft.to_dtype(hard.dtype())?;
        (soft * self.alpha)? + (hard * (1.0 - self.alpha))?
    }
}

/// `T^2 * KL(softmax(t / T) || softmax(s / T))`, mean over positions.
fn kl_soft(teacher: &Tensor, student: &Tensor, t: f64) -> Result<Tensor> {
    let classes = student.dim(D::Minus1)?;
    let s = (student.reshape(((), classes))? / t)?;
    let tt = (teacher.reshape(((), classes))? / t)?;
    let log_q = candle_nn::ops::log_softmax(&s, D::Minus1)?;
    let log_p = candle_nn::ops::log_softmax(&tt, D::Minus1)?;
    let p = log_p.exp()?;
    let kl = (p * (log_p - log_q)?)?.sum(D::Minus1)?.mean_all()?;
    kl * (t * t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::loss::IGNORE;
    use candle_core::Device;

    /// A "teacher" that returns fixed logits whatever its input.
    struct Fixed(Tensor);
    impl Module for Fixed {
        fn forward(&self, _: &Tensor) -> Result<Tensor> {
            Ok(self.0.clone())
        }
    }

    // Reference, torch 2.15 in float64:
    //   s = [[1.0, 2.0, 0.5], [0.1, -1.0, 3.0]]; t = [[0.3, 2.5, -1.0], [1.0, 0.0, 2.0]]
    //   y = [1, 0]; T = 2.0; alpha = 0.7
    //   soft = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1),
    //                   reduction="batchmean") * T * T
    //   loss = alpha * soft + (1 - alpha) * F.cross_entropy(s, y)
    const SOFT: f64 = 0.373_369_299_938_113_46;
    const LOSS: f64 = 0.776_629_960_416_944_9;

    #[test]
    fn distillation_matches_pytorch() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let s = Tensor::new(&[[1.0f64, 2.0, 0.5], [0.1, -1.0, 3.0]], &dev)?;
        let t = Tensor::new(&[[0.3f64, 2.5, -1.0], [1.0, 0.0, 2.0]], &dev)?;
        let y = Tensor::new(&[1u32, 0], &dev)?;
        let soft = kl_soft(&t, &s, 2.0)?.to_scalar::<f64>()?;
        assert!((soft - SOFT).abs() < 1e-12, "{soft}");
        let d = Distill {
            teacher: Rc::new(Fixed(t.to_dtype(DType::F32)?)),
            teacher_name: "fixed".into(),
            temperature: 2.0,
            alpha: 0.7,
            base: CrossEntropy::default(),
        };
        let x = Tensor::zeros((2, 1), DType::F32, &dev)?;
        let l = d
            .loss(&x, &s.to_dtype(DType::F32)?, &y)?
            .to_scalar::<f32>()?;
        assert!((l as f64 - LOSS).abs() < 1e-6, "{l}");
        Ok(())
    }

    /// With ignored positions, both terms are over the labelled ones: the
    /// same loss as the labelled rows alone give.
    #[test]
    fn distillation_leaves_ignored_positions_out_of_both_terms() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let s = Tensor::new(
            &[[[1.0f32, 2.0, 0.5], [0.1, -1.0, 3.0], [0.3, 0.3, 0.1]]],
            &dev,
        )?;
        let t = Tensor::new(
            &[[[0.3f32, 2.5, -1.0], [1.0, 0.0, 2.0], [4.0, -2.0, 0.0]]],
            &dev,
        )?;
        let y = Tensor::new(&[[1u32, IGNORE, 2]], &dev)?;
        let d = |teacher: &Tensor| Distill {
            teacher: Rc::new(Fixed(teacher.clone())),
            teacher_name: "fixed".into(),
            temperature: 2.0,
            alpha: 0.7,
            base: CrossEntropy::default(),
        };
        let x = Tensor::zeros((1, 3), DType::U32, &dev)?;
        let masked = d(&t).loss(&x, &s, &y)?.to_scalar::<f32>()?;
        let rows = Tensor::new(&[0u32, 2], &dev)?;
        let pick = |v: &Tensor| v.squeeze(0)?.index_select(&rows, 0);
        let kept = d(&pick(&t)?)
            .loss(&x, &pick(&s)?, &Tensor::new(&[1u32, 2], &dev)?)?
            .to_scalar::<f32>()?;
        assert!((masked - kept).abs() < 1e-6, "{masked} vs {kept}");
        Ok(())
    }
}
