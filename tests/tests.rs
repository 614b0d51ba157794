//! The integration tests: one binary, one module per area.

mod common;
mod gguf;
mod sampling;
mod model;
mod synthetic;
mod registry;
mod reference_dequant;
mod reference_quantize;
mod tokenizer;
mod bench;
mod run;
