//! A seeded permutation of `0..n` with O(1) memory and random access: a
//! 4-round Feistel network over the smallest power-of-two domain that holds
//! `n`, with cycle walking back into range. Shuffling a data set of any size
//! costs no buffer, and the position of any epoch can be recomputed.

use crate::engine::rng::Rng;

#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    pub fn new(n: usize, seed: u64, stream: &str) -> Self {
        let n = n as u64;
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut rng = Rng::stream(seed, stream);
        let keys = [
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        ];
        Permutation { n, half_bits, keys }
    }

    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round(x: u64, key: u64, mask: u64) -> u64 {
        let mut z = x.wrapping_add(key).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (z ^ (z >> 32)) & mask
    }

    fn encrypt(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let t = l ^ Self::round(r, k, mask);
            l = r;
            r = t;
        }
        (l << self.half_bits) | r
    }

    /// The element at position `i` (< n).
    pub fn get(&self, i: usize) -> usize {
        debug_assert!((i as u64) < self.n);
        // Cycle walking: the domain is at most 4n, so few steps are needed.
        let mut x = self.encrypt(i as u64);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_for_awkward_sizes() {
        for n in [1usize, 2, 3, 5, 17, 100, 1000, 4096, 4097] {
            let p = Permutation::new(n, 7, "t");
            let mut seen = vec![false; n];
            for i in 0..n {
                let j = p.get(i);
                assert!(!seen[j], "n {n}: {j} twice");
                seen[j] = true;
            }
        }
    }

    #[test]
    fn seeded_and_shuffled() {
        let n = 1000;
        let a: Vec<usize> = (0..n)
            .map(|i| Permutation::new(n, 1, "e1").get(i))
            .collect();
        let b: Vec<usize> = (0..n)
            .map(|i| Permutation::new(n, 1, "e1").get(i))
            .collect();
        let c: Vec<usize> = (0..n)
            .map(|i| Permutation::new(n, 1, "e2").get(i))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Not close to the identity: few fixed points, and a large mean displacement.
        let fixed = a.iter().enumerate().filter(|(i, j)| i == *j).count();
        assert!(fixed < 10, "{fixed} fixed points");
        let disp: f64 = a
            .iter()
            .enumerate()
            .map(|(i, &j)| (i as f64 - j as f64).abs())
            .sum::<f64>()
            / n as f64;
        assert!(disp > 250.0, "mean displacement {disp}"); // uniform: n / 3
    }
}
