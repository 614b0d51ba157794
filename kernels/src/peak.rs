//! Compute-peak probes: how fast one thread can issue the multiply-add its level's matrix kernels are built on,
//! with nothing else in the loop. A prompt's matrix products cannot run faster than this rate (times the threads),
//! so it is to prefill what the memory read rate is to decode: `infer bench --peak` states each pp result as a
//! share of it.

use std::hint::black_box;

use crate::dispatch::Isa;

/// Which multiply-add a probe ran, and how much arithmetic one round of it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The instruction, as a person would look it up ("vfmadd 512-bit", "vpdpbusd 512-bit", ...).
    pub instruction: &'static str,
    /// Multiply-adds per round (over all chains and lanes).
    pub macs_per_round: u64,
}

/// The f32 fused multiply-add at `isa`: runs `rounds` rounds and returns what the probe did.
pub fn fma(isa: Isa, rounds: usize) -> Probe {
    // Operands the compiler cannot see, so the chains are really computed.
    let (x, y) = (black_box(0.999_9f32), black_box(1e-5f32));
    let (instruction, lanes) = match isa.vectors() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() => {
            // SAFETY: the level's features were just checked.
            black_box(unsafe { crate::arch::peak::fma512(rounds, x, y) });
            ("vfmadd 512-bit", 16)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: as above.
            black_box(unsafe { crate::arch::peak::fma256(rounds, x, y) });
            ("vfmadd 256-bit", 8)
        }
        _ => {
            black_box(scalar_fma(rounds, x, y));
            ("f32 mul_add", 1)
        }
    };
    Probe { instruction, macs_per_round: (CHAINS * lanes) as u64 }
}

/// The integer multiply-add of `isa`'s quantized kernels (AVX-512: 8-bit `vpdpbusd`; AVX2: 16-bit `vpmaddwd`).
pub fn int_dot(isa: Isa, rounds: usize) -> Probe {
    let (x, y) = (black_box(0x0102_0304i32), black_box(0x0101_0101i32));
    let (instruction, lanes) = match isa.vectors() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() => {
            // SAFETY: the level's features were just checked.
            black_box(unsafe { crate::arch::peak::dpbusd512(rounds, x, y) });
            ("vpdpbusd 512-bit", 64)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_supported() => {
            // SAFETY: as above.
            black_box(unsafe { crate::arch::peak::madd256(rounds, y) });
            ("vpmaddwd 256-bit", 16)
        }
        _ => {
            black_box(scalar_int(rounds, x, y));
            ("i32 multiply-add", 1)
        }
    };
    Probe { instruction, macs_per_round: (CHAINS * lanes) as u64 }
}

/// Chains per probe, at every level.
#[cfg(target_arch = "x86_64")]
use crate::arch::peak::CHAINS;
#[cfg(not(target_arch = "x86_64"))]
const CHAINS: usize = 12;

fn scalar_fma(rounds: usize, x: f32, y: f32) -> f32 {
    let mut acc = [1f32; CHAINS];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = a.mul_add(x, y);
        }
        // Keeps the compiler from turning the chains into vectors: this probe is for the scalar level.
        black_box(&mut acc);
    }
    acc.iter().sum()
}

fn scalar_int(rounds: usize, x: i32, y: i32) -> i32 {
    let mut acc = [1i32; CHAINS];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = a.wrapping_mul(x).wrapping_add(y);
        }
        black_box(&mut acc);
    }
    acc.iter().fold(0, |s, &a| s.wrapping_add(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_reports_its_instruction() {
        for isa in Isa::available() {
            let f = fma(isa, 1000);
            let i = int_dot(isa, 1000);
            println!("{isa}: {} × {}, {} × {}", f.instruction, f.macs_per_round, i.instruction, i.macs_per_round);
            let lanes = match isa.vectors() {
                Isa::Scalar => (1, 1),
                Isa::Avx2 => (8, 16),
                _ => (16, 64),
            };
            assert_eq!(f.macs_per_round, (CHAINS * lanes.0) as u64, "{isa}");
            assert_eq!(i.macs_per_round, (CHAINS * lanes.1) as u64, "{isa}");
        }
    }
}
