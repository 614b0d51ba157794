//! The transformer: configuration from metadata, weights from the file, a paged KV cache and one shared decoder
//! forward pass with thin per-architecture files.

pub mod arch;
pub mod config;
pub mod forward;
pub mod free_blocks;
pub mod kv_cache;
pub mod ops;
pub mod stats;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use forward::{ForwardError, ForwardScratch, Logits, Model, SeqStep};
pub use kv_cache::{BlockRef, KvDtype, KvPool, SeqKv};
pub use stats::ActivationStats;
