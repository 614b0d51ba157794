//! The integration tests: one binary, one module per area.

mod common;
mod gguf;
mod sampling;
mod model;
mod synthetic;
mod reference_dequant;
mod reference_quantize;
mod registry;
mod tokenizer;
mod bench;
