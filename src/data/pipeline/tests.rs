//! The pipeline's tests: its stages, epochs and splits on small sources.

use super::*;
use crate::data::digits;
use candle_core::{Device, Tensor};

/// Sample `i` is the number `i`.
struct Ids(usize);
impl Source for Ids {
    fn len(&self) -> usize {
        self.0
    }
    fn split(&self) -> &str {
        "all"
    }
    fn describe(&self) -> String {
        "ids".into()
    }
    fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let x: Vec<f32> = indices.iter().map(|&i| i as f32).collect();
        let y: Vec<u32> = indices.iter().map(|&i| i as u32).collect();
        Ok((Tensor::new(x, &Device::Cpu)?, Tensor::new(y, &Device::Cpu)?))
    }
}

fn all(p: &Pipeline, epoch: u64) -> Vec<usize> {
    p.epoch(epoch, 32, 0)
        .flat_map(|b| b.map(|b| b.indices).unwrap_or_default())
        .collect()
}

#[test]
fn variable_batch_sizes_cover_the_epoch_and_resume_by_sample() -> anyhow::Result<()> {
    let p = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(4)
        .batch(64, false);
    let mut e = p.epoch(1, 32, 0);
    let mut seen = Vec::new();
    let mut n = 10;
    while let Some(b) = e.next_sized(n) {
        let b = b?;
        assert!(b.len() == n || seen.len() + b.len() == 1437);
        seen.extend(b.indices);
        n += 7;
    }
    assert_eq!(seen, all(&p, 1));
    // Starting 100 samples in continues the same order.
    let rest: Vec<usize> = p
        .epoch(1, 32, 100)
        .flat_map(|b| b.map(|b| b.indices).unwrap_or_default())
        .collect();
    assert_eq!(rest, seen[100..].to_vec());
    // Prefetched data refuses another size, clearly.
    let mut q = p.clone().prefetch(2).epoch(1, 32, 0);
    let msg = q.next_sized(8).unwrap().unwrap_err().to_string();
    assert!(msg.contains("drop :prefetch()"), "{msg}");
    Ok(())
}

#[test]
fn take_skip_split_are_ranges() -> anyhow::Result<()> {
    let p = Pipeline::new(Arc::new(digits("train")?));
    assert_eq!(p.clone().skip(10).take(5).range(), 10..15);
    assert_eq!(p.clone().take(5).skip(10).range(), 5..5);
    let parts = p.clone().take(100).split(&[0.8, 0.2], None)?;
    assert_eq!((parts[0].range(), parts[1].range()), (0..80, 80..100));
    assert!(p.split(&[0.5, -1.0], None).is_err());
    // Seeded: disjoint parts drawn through a permutation of the range.
    let ids = Pipeline::new(Arc::new(Ids(200))).skip(10).take(100);
    let parts = ids.split(&[0.8, 0.2], Some(3))?;
    let values = |p: &Pipeline| -> anyhow::Result<Vec<usize>> {
        let (x, _) = p.source().gather(&p.indices(1))?;
        Ok(x.to_vec1::<f32>()?
            .into_iter()
            .map(|v| v as usize)
            .collect())
    };
    let (a, b) = (values(&parts[0])?, values(&parts[1])?);
    assert_eq!((a.len(), b.len()), (80, 20));
    let mut all: Vec<usize> = a.iter().chain(&b).copied().collect();
    all.sort();
    assert_eq!(all, (10..110).collect::<Vec<_>>());
    assert!(b.iter().any(|&v| v < 90), "not a contiguous tail: {b:?}");
    Ok(())
}

#[test]
fn prefetch_changes_neither_order_nor_content() -> anyhow::Result<()> {
    let p = Pipeline::new(Arc::new(digits("train")?))
        .shuffle(3)
        .batch(50, false);
    let q = p.clone().prefetch(4);
    assert_eq!(all(&p, 2), all(&q, 2));
    for (a, b) in p.epoch(1, 32, 0).zip(q.epoch(1, 32, 0)) {
        let (a, b) = (a?, b?);
        let d = (a.x - b.x)?.abs()?.sum_all()?.to_scalar::<f32>()?;
        assert_eq!(d, 0.0);
    }
    // Leaving an epoch early stops the producer thread (no hang, no leak).
    let mut e = q.epoch(3, 32, 0);
    e.next();
    drop(e);
    Ok(())
}

#[test]
fn epochs_cover_every_sample_once_in_new_orders() -> anyhow::Result<()> {
    let p = Pipeline::new(Arc::new(digits("train")?))
        .skip(7)
        .shuffle(1)
        .batch(64, false);
    let (e1, e2) = (all(&p, 1), all(&p, 2));
    let mut s = e1.clone();
    s.sort();
    assert_eq!(s, (7..1437).collect::<Vec<_>>());
    assert_ne!(e1, e2);
    assert_eq!(p.indices(1), e1);
    Ok(())
}
