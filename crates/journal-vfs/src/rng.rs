//! A small deterministic generator for seeded simulations.

/// SplitMix64: tiny, fast, and good enough to drive crash images and random
/// workloads reproducibly from one `u64` seed. Not for cryptography.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// `true` with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&v[..rest.len()]);
        }
    }
    /// A value a hostile or damaged file would hold in a `width`-byte
    /// field (1, 2, 4 or 8) whose honest value is `old`: 0, 1, the
    /// maximum and just under it, 2^62, powers of two and their
    /// neighbours, `old` nudged, scaled or with a bit flipped, or random —
    /// truncated to the width. For the hostile-input campaigns.
    pub fn hostile(&mut self, old: u64, width: usize) -> u64 {
        let v = match self.below(12) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::MAX - self.below(4096),
            4 => 1 << 62,
            5 => (1u64 << self.below(64))
                .wrapping_add(self.below(3))
                .wrapping_sub(1),
            6 => old.wrapping_add(1 + self.below(4096)),
            7 => old.wrapping_sub(1 + self.below(4096)),
            8 => old.wrapping_mul(2 + self.below(7)),
            9 => old / (2 + self.below(7)),
            10 => old ^ (1 << self.below(64)),
            _ => self.next_u64(),
        };
        if width >= 8 {
            v
        } else {
            v & ((1u64 << (8 * width)) - 1)
        }
    }
}
