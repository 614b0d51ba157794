//! `infer`: run GGUF language models on ordinary CPUs.
//!
//! The library is the engine; the `infer` binary is a thin CLI over it. The engine knows nothing of terminals or
//! HTTP: it loads a model, tokenizes, runs batches of sequences through the shared decoder and samples.
#![deny(unsafe_code)]

pub mod chat;
#[cfg(feature = "cli")]
pub mod cli;
pub mod cpu_topology;
pub mod doctor;
pub mod engine;
pub mod eval;
pub mod gguf;
pub mod memory;
pub mod model;
pub mod quantize;
pub mod registry;
pub mod sampling;
pub mod server;
pub mod session;
pub mod speculative;
pub mod stop;
pub mod structured;
pub mod timeline;
pub mod tokenizer;
pub mod tools;

pub use infer_kernels as kernels;
