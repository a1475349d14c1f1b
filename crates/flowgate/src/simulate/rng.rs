//! A small seeded random number generator for the built-in scenarios, so that a scenario and
//! a seed always give the same traffic, on every platform and with every version of every
//! dependency (there is none).

/// SplitMix64 (Steele, Lea and Flood, 2014): 64 bits of state, one multiply-xorshift chain
/// per draw; passes BigCrush, which is more than jittering arrival times needs.
#[derive(Debug, Clone)]
pub(super) struct SplitMix64 {
    /// The state: advanced by a fixed odd constant per draw.
    state: u64,
}

impl SplitMix64 {
    pub(super) fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2⁻⁶⁴·n).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_seeded_and_reproducible() {
        // The published reference outputs for seed 0.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..100 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            assert!(x < 10);
        }
    }
}
