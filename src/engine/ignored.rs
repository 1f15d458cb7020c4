//! Positions a sequence's loss leaves out, as PyTorch's `ignore_index`
//! leaves them out: a conversation's prompt and padding, say, so that a
//! model fine-tuned on chats learns the replies only. A label of
//! [`IGNORE`] adds nothing to the loss, its gradient or its mean: the mean
//! is over the labelled positions, of the whole batch when a step runs in
//! micro-batches (each piece weighted by its labelled positions, not its
//! samples, so the optimizer sees the same gradient whatever the split).
//!
//! Only sequence targets (a label per position, rank 2 or more) carry
//! ignored positions: a classifier's one label per sample never does, and
//! is not read back from the device to look.

use candle_core::{DType, Device, Result, Tensor};

/// The label of a position the loss leaves out (PyTorch's `-100`).
pub const IGNORE: u32 = u32::MAX;

/// Whether `targets` can hold ignored positions: a sequence's labels.
fn sequence_labels(targets: &Tensor) -> bool {
    targets.dtype() == DType::U32 && targets.rank() >= 2
}

/// For sequence labels holding [`IGNORE`]: the labelled positions of each
/// sample (dim 0). None when no position is ignored, or the targets are not
/// a sequence's labels. Reads the targets, so give it the host batch's.
pub fn per_sample(targets: &Tensor) -> Result<Option<Vec<usize>>> {
    if !sequence_labels(targets) {
        return Ok(None);
    }
    let n = targets.dim(0)?;
    let labels = targets.flatten_all()?.to_vec1::<u32>()?;
    if !labels.contains(&IGNORE) || n == 0 {
        return Ok(None);
    }
    let per = labels.len() / n;
    Ok(Some(
        labels
            .chunks(per.max(1))
            .map(|s| s.iter().filter(|&&l| l != IGNORE).count())
            .collect(),
    ))
}

/// For a causal model's sequence labels (`[batch, t]`) holding
/// [`IGNORE`]: how many leading positions hold every labelled one (the
/// last labelled position of any sample, plus one; at least 1). None when
/// that is all `t`. A causal model's positions after it change neither
/// the loss nor its gradient, so a batch of conversations padded to the
/// context is computed only as far as its longest reply goes, as
/// transformers' collators pad a batch to its longest sample rather than
/// to the context.
pub fn labelled_width(targets: &Tensor) -> Result<Option<usize>> {
    if !sequence_labels(targets) || targets.rank() != 2 {
        return Ok(None);
    }
    let t = targets.dim(1)?;
    let labels = targets.flatten_all()?.to_vec1::<u32>()?;
    let width = labels
        .chunks(t.max(1))
        .filter_map(|s| s.iter().rposition(|&l| l != IGNORE))
        .max()
        .map_or(1, |last| last + 1);
    Ok((width < t).then_some(width))
}

/// The tokens of a batch's sequence labels, as a throughput counts them:
/// each sample's positions up to its last labelled one (a conversation's
/// padding after its reply is not a token; a sample with none labelled
/// counts none). Every position when none is ignored.
pub fn tokens(targets: &Tensor) -> Result<usize> {
    if !sequence_labels(targets) || targets.dim(0)? == 0 {
        return Ok(targets.elem_count());
    }
    let labels = targets.flatten_all()?.to_vec1::<u32>()?;
    let per = labels.len() / targets.dim(0)?;
    Ok(labels
        .chunks(per.max(1))
        .map(|s| {
            s.iter()
                .rposition(|&l| l != IGNORE)
                .map_or(0, |last| last + 1)
        })
        .sum())
}

/// The flat positions of `targets` that are labelled, as an index tensor
/// on `device`, when some are ignored; None when none is.
pub fn labelled_index(targets: &Tensor, device: &Device) -> Result<Option<Tensor>> {
    if !sequence_labels(targets) {
        return Ok(None);
    }
    let labels = targets.flatten_all()?.to_vec1::<u32>()?;
    if !labels.contains(&IGNORE) {
        return Ok(None);
    }
    let keep: Vec<u32> = (0..labels.len() as u32)
        .filter(|&i| labels[i as usize] != IGNORE)
        .collect();
    let n = keep.len();
    Tensor::from_vec(keep, n, device).map(Some)
}

/// The rows of `rows` (`[n, ..]`) and of the flat `targets` (`[n]`) at
/// `keep`.
pub fn keep_rows(rows: &Tensor, targets: &Tensor, keep: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((rows.index_select(keep, 0)?, targets.index_select(keep, 0)?))
}

/// A loss of 0 whose gradient is 0 everywhere `of` reaches: a piece of a
/// batch with no labelled position adds nothing, yet keeps the shape of a
/// step (every parameter gets a gradient).
/// In f32 (f64 for f64 values, as a loss of them is).
pub fn nothing(of: &Tensor) -> Result<Tensor> {
    let dtype = match of.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    of.to_dtype(dtype)?.sum_all()? * 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_say_which_positions_count_and_labels_per_sample_never_do() -> Result<()> {
        let dev = Device::Cpu;
        let y = Tensor::new(&[[IGNORE, 3, 4], [IGNORE, IGNORE, IGNORE]], &dev)?;
        assert_eq!(per_sample(&y)?, Some(vec![2, 0]));
        let keep = labelled_index(&y, &dev)?.unwrap();
        assert_eq!(keep.to_vec1::<u32>()?, vec![1, 2]);
        let plain = Tensor::new(&[[1u32, 3], [0, 2]], &dev)?;
        assert_eq!(per_sample(&plain)?, None);
        assert!(labelled_index(&plain, &dev)?.is_none());
        // A classifier's labels are not sequences: never looked into.
        let classes = Tensor::new(&[IGNORE, 1], &dev)?;
        assert_eq!(per_sample(&classes)?, None);
        assert_eq!(labelled_width(&classes)?, None);
        Ok(())
    }

    #[test]
    fn the_width_holds_the_last_labelled_position_of_any_sample() -> Result<()> {
        let dev = Device::Cpu;
        let y = Tensor::new(
            &[[IGNORE, 3, IGNORE, IGNORE], [5, IGNORE, IGNORE, IGNORE]],
            &dev,
        )?;
        assert_eq!(labelled_width(&y)?, Some(2));
        let none = Tensor::new(&[[IGNORE, IGNORE], [IGNORE, IGNORE]], &dev)?;
        assert_eq!(labelled_width(&none)?, Some(1));
        let last = Tensor::new(&[[IGNORE, 3], [IGNORE, IGNORE]], &dev)?;
        assert_eq!(labelled_width(&last)?, None);
        let plain = Tensor::new(&[[1u32, 3], [0, 2]], &dev)?;
        assert_eq!(labelled_width(&plain)?, None);
        assert_eq!(tokens(&y)?, 2 + 1);
        assert_eq!(tokens(&none)?, 0);
        assert_eq!(tokens(&plain)?, 4);
        Ok(())
    }
}
