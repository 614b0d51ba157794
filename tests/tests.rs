//! The integration tests: one binary, one module per area.

// The allocator the `infer` binary runs with, so that memory budgets (chat template rendering) hold here too.
#[global_allocator]
static ALLOC: infer::kernels::budget::BudgetAlloc = infer::kernels::budget::BudgetAlloc;

mod bench;
mod catalogue;
mod chat;
mod common;
mod doctor;
mod dry_xtc;
mod engine;
mod families;
mod faults;
mod gguf;
mod grammar;
mod json_schema;
mod kv_pool;
mod logprobs;
mod model;
mod parallel_sampling;
mod quantize;
mod reference_dequant;
mod reference_quantize;
mod registry;
mod run;
mod sampler_order;
mod sampling;
mod serve;
mod speculative;
mod structured;
mod synthetic;
mod tokenizer;
mod tools;
mod typical_mirostat;
