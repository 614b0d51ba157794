//! The integration tests: one binary, one module per area.

mod bench;
mod chat;
mod common;
mod gguf;
mod model;
mod quantize;
mod reference_dequant;
mod reference_quantize;
mod registry;
mod run;
mod sampling;
mod synthetic;
mod tokenizer;
