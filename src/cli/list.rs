//! `infer list`: the registry's models and where each is cached.

use clap::Args;

use crate::cli::output::print_line;
use crate::registry::{self, CacheState, Registry};

#[derive(Args, Debug)]
pub struct ListArgs {}

pub fn run(_args: ListArgs) -> anyhow::Result<()> {
    let registry = Registry::load()?;
    let home = registry::infer_home();
    let dir = registry::models_dir(&home);
    let default = registry.default_entry().name.clone();

    let header = ["NAME", "ARCH", "QUANT", "SIZE", "LICENSE", "CACHED"].map(String::from);
    let mut rows = vec![header];
    for entry in registry.entries() {
        let name = if entry.name == default { format!("{} (default)", entry.name) } else { entry.name.clone() };
        let path = dir.join(&entry.file);
        let cached = match registry::cache_state(entry, &dir) {
            CacheState::Verified => path.display().to_string(),
            CacheState::Unverified => format!("{} (not verified yet)", path.display()),
            CacheState::Missing => "not pulled".to_string(),
        };
        rows.push([
            name,
            entry.arch.clone(),
            entry.quant.clone(),
            registry::human_size(entry.size),
            entry.license.clone(),
            cached,
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        print_line(&line)?;
    }
    print_line(&format!("\ncache: {}", dir.display()))?;
    Ok(())
}
