//! The size of this core's L1 data cache, read once from CPUID. The decode kernels stream weights that are read
//! once per token, and where their software prefetches should land depends on it: with a 32 KB L1D (Zen 4, and
//! Intel cores before Ice Lake) a prefetch stream into L1 evicts the panel being read, so it goes to L2 there.

use std::arch::x86_64::__cpuid_count;
use std::sync::OnceLock;

/// Bytes of the L1 data cache of the core running this, or `None` when CPUID does not say.
pub(crate) fn l1d_bytes() -> Option<usize> {
    static L1D: OnceLock<Option<usize>> = OnceLock::new();
    *L1D.get_or_init(detect)
}

/// Whether the L1 data cache holds at most 32 KB (or its size is unknown: the cautious choice, a stream into
/// L2, costs little where L1 is larger; see [`l1d_bytes`]).
pub(crate) fn small_l1d() -> bool {
    l1d_bytes().is_none_or(|b| b <= 32 * 1024)
}

fn detect() -> Option<usize> {
    let cpuid = |leaf: u32, sub: u32| {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on every x86-64 CPU; a leaf beyond the maximum returns data, not a fault.
        unsafe {
            __cpuid_count(leaf, sub)
        }
    };
    let max_basic = cpuid(0, 0).eax;
    let max_ext = cpuid(0x8000_0000, 0).eax;
    // The deterministic cache parameters: leaf 4 (Intel) and 0x8000_001D (AMD, with topology extensions) share
    // one layout. Sub-leaf by sub-leaf until the type is 0 (no more caches): EAX[4:0] type (1 data, 3 unified),
    // EAX[7:5] level, EBX[11:0] line size − 1, EBX[21:12] partitions − 1, EBX[31:22] ways − 1, ECX sets − 1.
    let from_leaf = |leaf: u32| {
        (0..16).map(|sub| cpuid(leaf, sub)).take_while(|r| r.eax & 0x1F != 0).find_map(|r| {
            let (kind, level) = (r.eax & 0x1F, (r.eax >> 5) & 0x7);
            ((kind == 1 || kind == 3) && level == 1).then(|| {
                let line = (r.ebx & 0xFFF) as usize + 1;
                let parts = ((r.ebx >> 12) & 0x3FF) as usize + 1;
                let ways = ((r.ebx >> 22) & 0x3FF) as usize + 1;
                let sets = r.ecx as usize + 1;
                line * parts * ways * sets
            })
        })
    };
    let amd = max_ext >= 0x8000_001D && cpuid(0x8000_0001, 0).ecx & (1 << 22) != 0;
    let found = if amd { from_leaf(0x8000_001D) } else { None };
    found
        .or_else(|| if max_basic >= 4 { from_leaf(4) } else { None })
        // AMD's older leaf: ECX[31:24] is the L1D size in KB.
        .or_else(|| (max_ext >= 0x8000_0005).then(|| (cpuid(0x8000_0005, 0).ecx >> 24) as usize * 1024))
        .filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPUID's answer against the kernel's (Linux lists each cache of cpu0 under sysfs). The test may run on
    /// another core than cpu0, but the cores of one machine here share a model.
    #[test]
    fn l1d_matches_sysfs() {
        let b = l1d_bytes().expect("CPUID names no L1 data cache");
        eprintln!("L1D: {} KB (small: {})", b / 1024, small_l1d());
        assert!((8 * 1024..=256 * 1024).contains(&b), "implausible L1D size {b}");
        let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return; // not Linux, or no sysfs: the plausibility check above is all there is
        };
        let read = |p: std::path::PathBuf, f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        for e in entries.flatten() {
            let p = e.path();
            if read(p.clone(), "level").trim() == "1" && read(p.clone(), "type").trim() == "Data" {
                let size = read(p, "size");
                let kb: usize = size.trim().trim_end_matches('K').parse().expect("sysfs cache size in KB");
                assert_eq!(b, kb * 1024, "CPUID and sysfs disagree on the L1D size");
            }
        }
    }
}
