//! `infer-kernels`: the quantized block formats and the SIMD matmul kernels of `infer`.
//!
//! Everything hot and nearly all `unsafe` lives here, behind safe functions: the block formats (byte-compatible
//! with ggml, so real GGUF files load), scalar reference kernels that define each operation, hand-written AVX2 and
//! AVX-512 variants chosen once at run time, and the rayon-parallel matrix drivers.

pub mod budget;
pub mod clock;
pub mod dequant;
pub mod ggml_type;
pub mod quant;

mod arch;
pub mod dispatch;
pub mod matmul;
pub mod packed;
pub mod parallel;
pub mod peak;
pub mod signals;
pub mod vec_f32;

pub use dequant::{DequantError, dequantize};
pub use ggml_type::{GgmlType, TypeIdError};
