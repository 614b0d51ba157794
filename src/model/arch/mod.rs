//! Per-architecture quirks over the shared decoder: which keys and tensors exist and what they mean. Each file is a
//! few dozen lines; the forward pass itself lives once, in `model::forward`.

pub mod gemma3;
pub mod llama;
