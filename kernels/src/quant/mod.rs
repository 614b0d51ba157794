//! One module per block format: the `#[repr(C)]` block struct (byte-identical to ggml's), its layout and formula,
//! quantize, dequantize, and the scalar `_ref` dot product that is the specification every SIMD variant is tested
//! against.

pub mod k_quants;
pub mod q2_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;

pub use k_quants::QK_K;
pub use q2_k::BlockQ2K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_k::BlockQ8K;
