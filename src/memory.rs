//! Refusing, up front and with the numbers, a buffer that would not fit in memory.
//!
//! The KV cache is sized by flags (`-c`, a batch), not by the model file, and Rust aborts the process when an
//! allocation fails; an over-large `-c` would either abort or push the machine into swap and the OOM killer. So the
//! commands compute what they are about to allocate with checked arithmetic and compare it with the memory the
//! system can give (Linux's `MemAvailable`, lowered by a cgroup's limit when the process runs in one) before
//! allocating anything.

use std::path::Path;

/// A buffer that does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("{what} needs {needed} but only {available} of memory is available{hint}", needed = bytes(*needed),
        available = bytes(*available))]
    TooLarge { what: String, needed: u64, available: u64, hint: String },
    #[error("{what} is too large to compute (its size overflows 64 bits){hint}")]
    Overflow { what: String, hint: String },
}

/// Memory the system can give this process now, in bytes, if the platform says (Linux: `MemAvailable` from
/// `/proc/meminfo`, capped by the cgroup v2 limit minus current use).
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mem = meminfo.as_deref().and_then(|m| meminfo_field(m, "MemAvailable:"));
    let cgroup = cgroup_room(Path::new("/sys/fs/cgroup"));
    match (mem, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable:   123456 kB` → bytes.
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.get(field.len()..)?.split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `memory.max - memory.current` of this process's cgroup (v2), if it has a limit.
fn cgroup_room(root: &Path) -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // v2: a single line `0::/path`.
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/');
    let dir = root.join(rel);
    let max: u64 = std::fs::read_to_string(dir.join("memory.max")).ok()?.trim().parse().ok()?;
    let current: u64 = std::fs::read_to_string(dir.join("memory.current")).ok()?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Refuses `needed` bytes (`None`: the size overflowed) for `what` when the system cannot give them. When the
/// platform does not say how much memory is free, only an overflowing size is refused.
pub fn check_fits(what: &str, needed: Option<u64>, hint: &str) -> Result<(), MemoryError> {
    check_fits_in(what, needed, hint, available())
}

/// [`check_fits`] against a given amount of available memory.
pub fn check_fits_in(what: &str, needed: Option<u64>, hint: &str, available: Option<u64>) -> Result<(), MemoryError> {
    let hint = if hint.is_empty() { String::new() } else { format!(": {hint}") };
    let Some(needed) = needed else {
        return Err(MemoryError::Overflow { what: what.to_string(), hint });
    };
    match available {
        Some(available) if needed > available => {
            Err(MemoryError::TooLarge { what: what.to_string(), needed, available, hint })
        }
        _ => Ok(()),
    }
}

/// This process's resident set now and at its peak (Linux's `VmRSS` and `VmHWM`), in bytes.
pub fn resident() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some((meminfo_field(&status, "VmRSS:")?, meminfo_field(&status, "VmHWM:")?))
}

/// Resident bytes of this process's mappings of the file at `path` (the `Rss` of its entries in
/// `/proc/self/smaps`), if the platform says.
pub fn mapped_resident(path: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let path = std::fs::canonicalize(path).ok()?;
    Some(smaps_rss(&smaps, &path.to_string_lossy()))
}

/// The sum of the `Rss:` fields of the `smaps` entries that map `path`.
fn smaps_rss(smaps: &str, path: &str) -> u64 {
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        // An entry starts with its address range (`start-end perms offset dev inode [path]`); its fields follow.
        let header = line.split_whitespace().next().is_some_and(|a| a.contains('-') && !a.ends_with(':'));
        if header {
            inside = line.ends_with(path) && line.split_whitespace().nth(5).is_some();
        } else if inside && line.starts_with("Rss:") {
            total += meminfo_field(line, "Rss:").unwrap_or(0);
        }
    }
    total
}

/// `1.5 GiB`: a byte count for people (binary units, as memory is counted).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// "134.5M", "1.2B": a count (of parameters, say) as people write it.
pub fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_field(text, "MemAvailable:"), Some(20_000_000 * 1024));
        assert_eq!(meminfo_field(text, "SwapFree:"), None);
    }

    #[test]
    fn smaps_rss_sums_the_file_s_entries_only() {
        let smaps = "\
7f00-7f10 r--p 00000000 fd:01 123 /models/a.gguf
Size:                 64 kB
Rss:                  12 kB
7f10-7f20 rw-p 00000000 00:00 0
Rss:                 100 kB
7f20-7f30 r--p 00010000 fd:01 123 /models/a.gguf
Rss:                   4 kB
7f30-7f40 r--p 00000000 fd:01 124 /models/b.gguf
Rss:                   8 kB
";
        assert_eq!(smaps_rss(smaps, "/models/a.gguf"), 16 * 1024);
        assert_eq!(smaps_rss(smaps, "/models/c.gguf"), 0);
    }

    #[test]
    fn too_large_names_both_numbers() {
        let e = check_fits_in("the KV cache for -c 100000000", Some(3 << 40), "lower -c", Some(20 << 30)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the KV cache for -c 100000000 needs 3.0 TiB but only 20.0 GiB of memory is available: lower -c"
        );
        assert!(check_fits_in("x", None, "", Some(1)).unwrap_err().to_string().contains("overflows"));
        assert!(check_fits_in("x", Some(10), "", Some(10)).is_ok());
        assert!(check_fits_in("x", Some(1 << 50), "", None).is_ok());
    }
}
