//! Batches of samples of like lengths, as transformers' `group_by_length`
//! (its `LengthGroupedSampler`) draws them: the epoch's shuffled order is
//! cut into groups of [`GROUP_BATCHES`] batches, and each group is sorted
//! longest first. A causal model computes a batch only as far as its
//! longest sample's last label (`engine::ignored`), so a batch of
//! conversations of like lengths wastes little on padding, and the epoch
//! still visits every sample once, in an order that changes every epoch.

/// Batches per group, as transformers' megabatches.
pub(super) const GROUP_BATCHES: usize = 50;

/// `shuffled` (positions `0..lengths.len()`, in the epoch's order)
/// regrouped: each run of `group` positions sorted by `lengths[position]`,
/// longest first (ties keep the shuffled order).
pub(super) fn grouped(
    shuffled: impl Iterator<Item = usize>,
    lengths: &[usize],
    group: usize,
) -> Vec<usize> {
    let mut order: Vec<usize> = shuffled.collect();
    for run in order.chunks_mut(group.max(1)) {
        run.sort_by_key(|&p| std::cmp::Reverse(lengths[p]));
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_is_sorted_longest_first_and_keeps_its_samples() {
        let lengths = [5, 1, 9, 3, 3, 7, 2];
        let order = grouped([6, 2, 0, 4, 3, 1, 5].into_iter(), &lengths, 3);
        assert_eq!(order, vec![2, 0, 6, 4, 3, 1, 5]);
        assert_eq!(&order[3..6], &[4, 3, 1], "ties keep the shuffled order");
    }
}
