//! Inspect a GGUF file through the library API, the way an embedding application would.
//!
//! ```text
//! cargo run --example inspect_gguf -- model.gguf
//! ```

use infer::gguf::GgufFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: inspect_gguf MODEL.gguf")?;
    let file = GgufFile::open(&path)?;
    let meta = file.metadata();
    println!("{path}: GGUF v{}, {} metadata keys, {} tensors", file.version(), meta.len(), file.tensors().len());
    println!("architecture: {}", meta.architecture().unwrap_or("unknown"));
    println!("parameters:   {}", file.parameter_count());
    // Tensor data is a zero-copy slice of the memory map.
    let biggest = file.tensors().iter().max_by_key(|t| t.n_bytes).ok_or("no tensors")?;
    let data = file.tensor_data(biggest);
    println!(
        "largest tensor: {} {} {:?}, {} bytes, first bytes {:02x?}",
        biggest.name,
        biggest.ty,
        biggest.dims,
        data.len(),
        &data[..data.len().min(8)]
    );
    Ok(())
}
