//! GGUF files: reading (memory-mapped, zero-copy, validated) and writing.
