//! The integration tests: one binary, one module per area.

mod bench;
mod chat;
mod common;
mod engine;
mod gguf;
mod kv_pool;
mod model;
mod quantize;
mod reference_dequant;
mod reference_quantize;
mod registry;
mod run;
mod serve;
mod sampling;
mod synthetic;
mod tokenizer;
