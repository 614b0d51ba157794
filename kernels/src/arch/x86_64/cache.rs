//! The caches of this core, read once from CPUID, and where the quantized decode kernels' software prefetches
//! should land. Decode streams weights that are read once per token, and the best place for the stream depends
//! on the cache sizes, on the vendor, and on whether the weights come from the last-level cache or from DRAM:
//! - with a 32 KB L1D (Zen 4, and Intel cores before Ice Lake) a prefetch stream into L1 evicts the panel being
//!   read, so it goes to L2 there;
//! - on Intel cores, weights that stream from DRAM want a short stream into L2 ([`DecodeStream::L2Near`]).

use std::arch::x86_64::__cpuid_count;
use std::sync::OnceLock;

/// Bytes of the L1 data cache of the core running this, or `None` when CPUID does not say.
pub(crate) fn l1d_bytes() -> Option<usize> {
    static L1D: OnceLock<Option<usize>> = OnceLock::new();
    *L1D.get_or_init(|| detect(1))
}

/// Bytes of the last-level (L3) cache this core sees, or `None` when CPUID does not say.
pub(crate) fn l3_bytes() -> Option<usize> {
    static L3: OnceLock<Option<usize>> = OnceLock::new();
    *L3.get_or_init(|| detect(3))
}

/// Whether CPUID's vendor is "GenuineIntel".
fn intel() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
        let r = unsafe { __cpuid_count(0, 0) };
        // The vendor string is EBX, EDX, ECX: "Genu" "ineI" "ntel".
        (r.ebx, r.edx, r.ecx) == (0x756E_6547, 0x4965_6E69, 0x6C65_746E)
    })
}

/// Where a quantized decode tile's software prefetch puts the weight stream, and how far ahead of its reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecodeStream {
    /// The 512-bit kernel's `DECODE_AHEAD` bytes ahead into L1 (`prefetcht0`): its choice, measured on AMD cores
    /// (Zen 4 with the 32 KB L1D case below, Zen 5) and on Intel cores whose model sits in the L3.
    L1Far,
    /// The same distance into L2 (`prefetcht1`), where L1D holds 32 KB or less.
    L2Far,
    /// [`L2_NEAR_AHEAD`] bytes ahead into L2: Intel cores, when the weights stream from DRAM.
    L2Near,
}

/// How far ahead [`DecodeStream::L2Near`] fetches. On an Intel Xeon with AMX (2 vCPUs of a guest that reports
/// family 6 model 167; 48 KB L1D, 2 MB L2, 480 MB L3 shared with other guests), a 3.75 B-parameter llama of
/// random Q4_1 weights (2.18 GiB, so every token reads DRAM), tg16 t/s on 1 / 2 threads, AVX-512 kernel, two interleaved rounds: the
/// panel kernels' stream (8 KB into L1) 4.4 / 7.5; into L2 at 1 KB 5.2 / 10.0, 1.5 KB 5.5 / 10.3, 2 KB 6.1–6.5 /
/// 11.5–12.3, 2.5 KB 6.5–6.6 / 12.4–12.5, 3 KB 6.1–6.3 / 11.6–12.0, 4 KB 5.8 / 11.2–11.4, 8 KB 5.7 / –; `prefetcht2`
/// at 2 KB 6.1 / 11.5; 8 KB into L1 plus 16 KB into L2 – / 10.3–10.5; no software prefetch 4.4 / –;
/// `prefetchnta` 3.3 / –. After the change, the same file and its Q4_0 requant on 2 threads, two interleaved
/// rounds each: Q4_1 7.42–7.44 → 12.50–12.70 t/s, Q4_0 7.30–7.31 → 12.04–12.34.
///
/// Only the 512-bit kernel streams this way. The 256-bit kernel's decode tile fetches the next panel into L1, and
/// on the same host (forced AVX2, same files, 2 threads) that stayed faster than 2.5 KB into L2: Q4_1 11.8–11.9
/// against 10.8, Q4_0 11.7 against 10.5–10.6.
///
/// The reason, as far as cpu-clock samples show it: with the stream into L1, 70% of the AVX-512 tile's samples sat
/// on the instruction after a `prefetcht0`, so the core waited for a fill buffer (an Intel core has 16 for L1
/// misses, and a prefetch into L1 holds one until DRAM answers); a prefetch into L2 a short way ahead leaves the
/// L2 streamer to run further.
pub(crate) const L2_NEAR_AHEAD: usize = 2560;

/// The stream for a quantized decode tile of the 512-bit kernel now (read once per matrix product: models load
/// and unload).
///
/// [`DecodeStream::L2Near`] only where it was measured to win: on Intel cores, with more panel bytes alive than
/// a third of the L3. Below that the model's weights stay in the L3 from token to token, and there the L1 stream
/// was faster on the same Xeon (tg64 on 2 threads, two rounds: SmolLM2 Q4_1, 98 MB, 436–461 t/s against 373–388
/// into L2 at 2.5 KB; its Q8_0 requant, 145 MB, 230–233 against 205–213), while Gemma 3 Q4_K_M (239 MB of panels)
/// gained with it (101–104 against 118–121). AMD cores keep the stream they were tuned with: on Zen 4, distances
/// into L2 under 8 KB measured slower there (see the 512-bit kernel's `DECODE_AHEAD`).
pub(crate) fn decode_stream() -> DecodeStream {
    choose_stream(intel(), crate::packed::panel_bytes_alive(), l3_bytes(), small_l1d())
}

/// [`decode_stream`]'s rule, given what it reads.
fn choose_stream(intel: bool, panel_bytes: usize, l3: Option<usize>, small_l1d: bool) -> DecodeStream {
    if intel && l3.is_some_and(|l3| panel_bytes > l3 / 3) {
        DecodeStream::L2Near
    } else if small_l1d {
        DecodeStream::L2Far
    } else {
        DecodeStream::L1Far
    }
}

/// Whether the L1 data cache holds at most 32 KB (or its size is unknown: the cautious choice, a stream into
/// L2, costs little where L1 is larger; see [`l1d_bytes`]).
pub(crate) fn small_l1d() -> bool {
    l1d_bytes().is_none_or(|b| b <= 32 * 1024)
}

/// The size of this core's data (or unified) cache of `level` (1 or 3), from CPUID.
fn detect(level: u32) -> Option<usize> {
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
            let kind = r.eax & 0x1F;
            ((kind == 1 || kind == 3) && (r.eax >> 5) & 0x7 == level).then(|| {
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
        // AMD's older leaves: 0x8000_0005 ECX[31:24] is the L1D size in KB, 0x8000_0006 EDX[31:18] the L3's in
        // 512 KB units.
        .or_else(|| match level {
            1 if max_ext >= 0x8000_0005 => Some((cpuid(0x8000_0005, 0).ecx >> 24) as usize * 1024),
            3 if max_ext >= 0x8000_0006 => Some((cpuid(0x8000_0006, 0).edx >> 18) as usize * 512 * 1024),
            _ => None,
        })
        .filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size sysfs gives for cpu0's cache of `level` and `kind` ("Data" or "Unified"), in bytes; `None`
    /// without sysfs (not Linux) or without that cache.
    fn sysfs_cache(level: &str, kind: &str) -> Option<usize> {
        let entries = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
        let read = |p: &std::path::Path, f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        entries.flatten().map(|e| e.path()).find_map(|p| {
            (read(&p, "level").trim() == level && read(&p, "type").trim() == kind).then(|| {
                let size = read(&p, "size");
                let size = size.trim();
                let (n, unit) = size.split_at(size.len().saturating_sub(1));
                let n: usize = n.parse().expect("sysfs cache size");
                n * match unit {
                    "K" => 1024,
                    "M" => 1024 * 1024,
                    other => panic!("sysfs cache size unit {other}"),
                }
            })
        })
    }

    /// CPUID's answer against the kernel's (Linux lists each cache of cpu0 under sysfs). The test may run on
    /// another core than cpu0, but the cores of one machine here share a model.
    #[test]
    fn l1d_matches_sysfs() {
        let b = l1d_bytes().expect("CPUID names no L1 data cache");
        eprintln!("L1D: {} KB (small: {})", b / 1024, small_l1d());
        assert!((8 * 1024..=256 * 1024).contains(&b), "implausible L1D size {b}");
        if let Some(sys) = sysfs_cache("1", "Data") {
            assert_eq!(b, sys, "CPUID and sysfs disagree on the L1D size");
        }
    }

    /// The L3 as [`l1d_matches_sysfs`] checks the L1D (a CPU without an L3 names none either way).
    #[test]
    fn l3_matches_sysfs() {
        let sys = sysfs_cache("3", "Unified");
        eprintln!("L3: {:?} MB by CPUID, {:?} MB by sysfs", l3_bytes().map(|b| b >> 20), sys.map(|b| b >> 20));
        if let Some(b) = l3_bytes() {
            assert!((1 << 20..=4 << 30).contains(&b), "implausible L3 size {b}");
        }
        if sys.is_some() {
            assert_eq!(l3_bytes(), sys, "CPUID and sysfs disagree on the L3 size");
        }
    }

    /// The rule: a short stream into L2 only on Intel with more panels than a third of the L3, else the cache
    /// sizes' choice.
    #[test]
    fn decode_streams_near_into_l2_only_on_intel_from_dram() {
        let l3 = Some(30 << 20);
        assert_eq!(choose_stream(true, 11 << 20, l3, false), DecodeStream::L2Near);
        assert_eq!(choose_stream(true, 9 << 20, l3, false), DecodeStream::L1Far);
        assert_eq!(choose_stream(true, 9 << 20, l3, true), DecodeStream::L2Far);
        assert_eq!(choose_stream(false, 4 << 30, l3, false), DecodeStream::L1Far);
        assert_eq!(choose_stream(false, 4 << 30, l3, true), DecodeStream::L2Far);
        // Without a known L3 there is no telling where the weights come from: the cache sizes' choice.
        assert_eq!(choose_stream(true, 4 << 30, None, false), DecodeStream::L1Far);
    }
}
