//! Which CPUs this process may run on, how they group into physical cores, and how many worker threads to start
//! when the user does not say.
//!
//! # Why not one thread per logical CPU
//!
//! The kernels keep a core's vector units busy, and a team's helpers spin between regions
//! (`infer_kernels::parallel`). Two threads on the two hardware threads (SMT siblings) of one core share those
//! units, so the second adds contention rather than throughput. On a hybrid CPU, an efficiency core runs the same
//! kernel at a fraction of a performance core's speed; work is claimed task by task, but a region still ends when
//! its slowest task does, and every region waits for the last one. Users of other runners meet both traps (more
//! threads slower than fewer; E-cores slowing everything, FEATURES §2.5), so the default is one thread per
//! physical core, performance cores only on a hybrid CPU, within the CPUs this process may use (its affinity mask
//! and its cgroup quota, as `std::thread::available_parallelism` reports).
//!
//! # Where the facts come from
//!
//! Linux's sysfs: `devices/system/cpu/cpuN/topology/core_cpus_list` (or the older `thread_siblings_list`) names
//! the logical CPUs of each core, `devices/cpu_core/cpus` and `devices/cpu_atom/cpus` list the performance and
//! efficiency cores of an Intel hybrid CPU, `devices/system/node/nodeN/cpulist` the NUMA nodes; the affinity mask
//! is `Cpus_allowed_list` in `/proc/self/status`. Anything missing (a container with a masked `/sys`, another OS)
//! leaves a CPU as a core of its own, so the fallback is the old default, never fewer threads than cores.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;

/// The class of a core on a hybrid CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreKind {
    /// Not a hybrid CPU (or sysfs does not say).
    Uniform,
    Performance,
    Efficiency,
}

/// One physical core, as far as this process can use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// The core's logical CPUs that this process may run on, ascending (never empty).
    pub cpus: Vec<usize>,
    pub kind: CoreKind,
}

/// The CPUs this process may run on, grouped by physical core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    /// Cores with at least one usable CPU, in order of their lowest CPU.
    pub cores: Vec<Core>,
    /// Logical CPUs online (as many as are usable when unknown).
    pub online: usize,
    /// NUMA nodes holding at least one usable CPU (1 when unknown).
    pub numa_nodes: usize,
    /// False when sysfs named no core's CPUs, so each CPU was taken as a core of its own.
    pub known: bool,
}

/// How many threads to start, and why that many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadChoice {
    pub threads: usize,
    pub reason: &'static str,
}

impl CpuTopology {
    /// This machine, read once.
    pub fn detect() -> &'static CpuTopology {
        static TOPOLOGY: OnceLock<CpuTopology> = OnceLock::new();
        TOPOLOGY.get_or_init(|| {
            let status = std::fs::read_to_string("/proc/self/status").ok();
            CpuTopology::read(Path::new("/sys"), status.as_deref(), cpu_quota())
        })
    }

    /// The topology under a sysfs root (`/sys`, or a tree a test wrote), for the CPUs that `proc_status` (the
    /// text of `/proc/self/status`) allows. With neither an affinity list nor sysfs's `online` list, CPUs
    /// `0..fallback_cpus` are taken.
    pub fn read(sys: &Path, proc_status: Option<&str>, fallback_cpus: usize) -> CpuTopology {
        let cpu_dir = sys.join("devices/system/cpu");
        let read_list = |path: &Path| std::fs::read_to_string(path).ok().and_then(|s| parse_cpu_list(s.trim()));
        let online = read_list(&cpu_dir.join("online"));
        let allowed = proc_status
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")))
            .and_then(|l| parse_cpu_list(l.trim()));
        let mut usable: Vec<usize> = match (&allowed, &online) {
            (Some(a), Some(o)) => a.intersection(o).copied().collect(),
            (Some(a), None) => a.iter().copied().collect(),
            (None, Some(o)) => o.iter().copied().collect(),
            (None, None) => (0..fallback_cpus.max(1)).collect(),
        };
        if usable.is_empty() {
            // An affinity list and an online list that do not meet cannot describe a running process.
            usable = (0..fallback_cpus.max(1)).collect();
        }
        let performance = read_list(&sys.join("devices/cpu_core/cpus"));
        let efficiency = read_list(&sys.join("devices/cpu_atom/cpus"));
        let hybrid = performance.is_some() && efficiency.is_some();

        let mut cores: Vec<(BTreeSet<usize>, Core)> = Vec::new();
        let mut known = false;
        for &cpu in &usable {
            let topology = cpu_dir.join(format!("cpu{cpu}/topology"));
            let siblings = read_list(&topology.join("core_cpus_list"))
                .or_else(|| read_list(&topology.join("thread_siblings_list")))
                .filter(|s| s.contains(&cpu));
            known |= siblings.is_some();
            // A CPU whose siblings are unknown is a core of its own: merging unknowns would guess SMT where
            // there may be none and halve the threads.
            let key = siblings.unwrap_or_else(|| BTreeSet::from([cpu]));
            match cores.iter_mut().find(|(k, _)| *k == key) {
                Some((_, core)) => core.cpus.push(cpu),
                None => {
                    let kind = match (&performance, &efficiency) {
                        (Some(p), _) if hybrid && p.contains(&cpu) => CoreKind::Performance,
                        (_, Some(e)) if hybrid && e.contains(&cpu) => CoreKind::Efficiency,
                        _ => CoreKind::Uniform,
                    };
                    cores.push((key, Core { cpus: vec![cpu], kind }));
                }
            }
        }

        let numa_nodes = std::fs::read_dir(sys.join("devices/system/node"))
            .map(|dir| {
                dir.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n.strip_prefix("node").is_some_and(is_number)))
                    .filter_map(|e| read_list(&e.path().join("cpulist")))
                    .filter(|cpus| usable.iter().any(|c| cpus.contains(c)))
                    .count()
            })
            .unwrap_or(0)
            .max(1);
        CpuTopology {
            online: online.map_or(usable.len(), |o| o.len().max(usable.len())),
            cores: cores.into_iter().map(|(_, core)| core).collect(),
            numa_nodes,
            known,
        }
    }

    /// Logical CPUs this process may run on.
    pub fn usable_cpus(&self) -> usize {
        self.cores.iter().map(|c| c.cpus.len()).sum()
    }

    /// Whether any core has more than one usable logical CPU.
    pub fn smt(&self) -> bool {
        self.cores.iter().any(|c| c.cpus.len() > 1)
    }

    fn count(&self, kind: CoreKind) -> usize {
        self.cores.iter().filter(|c| c.kind == kind).count()
    }

    /// The default thread count: one per usable physical core (performance cores only, on a hybrid CPU that
    /// lets this process use any), at most `quota` (the CPUs the scheduler grants, which a cgroup may cap below
    /// the affinity mask; `std::thread::available_parallelism`).
    pub fn default_threads(&self, quota: usize) -> ThreadChoice {
        let performance = self.count(CoreKind::Performance);
        let (cores, reason) = if performance > 0 && self.count(CoreKind::Efficiency) > 0 {
            (performance, "one per performance core")
        } else if self.smt() {
            (self.cores.len(), "one per physical core")
        } else {
            (self.cores.len(), "one per core")
        };
        if quota < cores {
            ThreadChoice { threads: quota.max(1), reason: "the CPU quota" }
        } else {
            ThreadChoice { threads: cores.max(1), reason }
        }
    }

    /// One line for people: `4 cores × 2 threads (SMT), 1 NUMA node`, `6 performance cores × 2 threads + 8
    /// efficiency cores, 1 NUMA node`, with the share of online CPUs when the process may use fewer.
    pub fn describe(&self) -> String {
        let group = |cores: &[&Core], noun: &str| {
            let n = cores.len();
            let plural = if n == 1 { "" } else { "s" };
            let threads: BTreeSet<usize> = cores.iter().map(|c| c.cpus.len()).collect();
            match threads.iter().copied().collect::<Vec<_>>()[..] {
                [1] | [] => format!("{n} {noun}{plural}"),
                [t] => format!("{n} {noun}{plural} × {t} threads"),
                _ => format!(
                    "{n} {noun}{plural} with {} logical CPUs",
                    cores.iter().map(|c| c.cpus.len()).sum::<usize>()
                ),
            }
        };
        let all: Vec<&Core> = self.cores.iter().collect();
        let of_kind = |kind| all.iter().copied().filter(|c| c.kind == kind).collect::<Vec<_>>();
        let (p, e) = (of_kind(CoreKind::Performance), of_kind(CoreKind::Efficiency));
        let mut text = if !self.known {
            format!("{} CPUs (sysfs does not say which share a core)", self.usable_cpus())
        } else if !p.is_empty() && !e.is_empty() {
            format!("{} + {}", group(&p, "performance core"), group(&e, "efficiency core"))
        } else {
            let mut t = group(&all, "core");
            if self.smt() {
                t.push_str(" (SMT)");
            }
            t
        };
        let nodes = self.numa_nodes;
        text.push_str(&format!(", {nodes} NUMA node{}", if nodes == 1 { "" } else { "s" }));
        if self.usable_cpus() < self.online {
            text.push_str(&format!("; this process may use {} of {} CPUs", self.usable_cpus(), self.online));
        }
        text
    }

    pub fn to_json(&self, quota: usize) -> serde_json::Value {
        let choice = self.default_threads(quota);
        let kind = |k: CoreKind| match k {
            CoreKind::Uniform => "uniform",
            CoreKind::Performance => "performance",
            CoreKind::Efficiency => "efficiency",
        };
        serde_json::json!({
            "cores": self.cores.iter().map(|c| serde_json::json!({"cpus": c.cpus, "kind": kind(c.kind)})).collect::<Vec<_>>(),
            "usable_cpus": self.usable_cpus(),
            "online_cpus": self.online,
            "numa_nodes": self.numa_nodes,
            "known": self.known,
            "quota": quota,
            "default_threads": choice.threads,
            "default_reason": choice.reason,
        })
    }
}

/// The CPUs the scheduler grants this process: its affinity mask, capped by a cgroup CPU quota. Read once: the
/// commands ask for it several times at start-up (the count, its reason, the `-t` warning), and each reading
/// opens the cgroup's files.
pub fn cpu_quota() -> usize {
    static QUOTA: OnceLock<usize> = OnceLock::new();
    *QUOTA.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The thread count used when `-t` is not given, for this machine.
pub fn default_threads() -> ThreadChoice {
    CpuTopology::detect().default_threads(cpu_quota())
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Sysfs's CPU list format, `0-3,8,10-11`; `None` for anything else (an empty list is `Some` of nothing).
/// Lists longer than 65,536 CPUs are refused rather than allocated.
pub fn parse_cpu_list(text: &str) -> Option<BTreeSet<usize>> {
    const MOST_CPUS: usize = 1 << 16;
    let mut cpus = BTreeSet::new();
    if text.is_empty() {
        return Some(cpus);
    }
    for part in text.split(',') {
        let part = part.trim();
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let n = part.parse::<usize>().ok()?;
                (n, n)
            }
        };
        if first > last || last >= MOST_CPUS {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs tree: `cores` lists each core's logical CPUs; hybrid lists go to cpu_core/cpu_atom when given.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new(cores: &[&[usize]]) -> Tree {
            let tree = Tree { dir: tempfile::tempdir().unwrap() };
            let all: Vec<usize> = cores.iter().flat_map(|c| c.iter().copied()).collect();
            tree.write("devices/system/cpu/online", &list(&all));
            for core in cores {
                for cpu in *core {
                    tree.write(&format!("devices/system/cpu/cpu{cpu}/topology/core_cpus_list"), &list(core));
                }
            }
            tree.write("devices/system/node/node0/cpulist", &list(&all));
            tree
        }

        fn write(&self, rel: &str, text: &str) {
            let path = self.dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{text}\n")).unwrap();
        }

        fn read(&self, allowed: Option<&str>) -> CpuTopology {
            let status = allowed
                .map(|a| format!("Name:\tinfer\nCpus_allowed:\tff\nCpus_allowed_list:\t{a}\nMems_allowed:\t1\n"));
            CpuTopology::read(self.dir.path(), status.as_deref(), 64)
        }
    }

    fn list(cpus: &[usize]) -> String {
        cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
    }

    #[test]
    fn cpu_lists_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(BTreeSet::from([0, 1, 2, 3, 8, 10, 11])));
        assert_eq!(parse_cpu_list("5"), Some(BTreeSet::from([5])));
        assert_eq!(parse_cpu_list(""), Some(BTreeSet::new()));
        for bad in ["3-1", "a", "0-", "1,,2", "0-99999999", "-1", "0-7:2"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
    }

    proptest::proptest! {
        /// Any set of CPUs, written as sysfs writes it (runs of consecutive ids as ranges), reads back as itself.
        #[test]
        fn cpu_lists_read_back_what_sysfs_would_write(cpus in proptest::collection::btree_set(0usize..300, 0..40)) {
            let mut parts = Vec::new();
            let ids: Vec<usize> = cpus.iter().copied().collect();
            let mut i = 0;
            while i < ids.len() {
                let mut j = i;
                while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
                    j += 1;
                }
                parts.push(if i == j { ids[i].to_string() } else { format!("{}-{}", ids[i], ids[j]) });
                i = j + 1;
            }
            proptest::prop_assert_eq!(parse_cpu_list(&parts.join(",")), Some(cpus));
        }

        /// Arbitrary text never panics, and whatever parses holds only ids below the bound.
        #[test]
        fn cpu_lists_of_any_text_parse_or_refuse(text in "[0-9,\\- a:]{0,24}") {
            if let Some(cpus) = parse_cpu_list(&text) {
                proptest::prop_assert!(cpus.iter().all(|&c| c < 1 << 16));
            }
        }
    }

    #[test]
    fn smt_siblings_count_as_one_core() {
        // Linux numbers the second thread of each core after all first threads: core i = CPUs {i, i + 4}.
        let tree = Tree::new(&[&[0, 4], &[1, 5], &[2, 6], &[3, 7]]);
        let t = tree.read(Some("0-7"));
        assert_eq!(t.cores.len(), 4);
        assert!(t.known && t.smt());
        assert_eq!(t.cores[1].cpus, vec![1, 5]);
        assert_eq!(t.default_threads(8), ThreadChoice { threads: 4, reason: "one per physical core" });
        assert_eq!(t.describe(), "4 cores × 2 threads (SMT), 1 NUMA node");
        // A cgroup quota below the cores wins.
        assert_eq!(t.default_threads(2), ThreadChoice { threads: 2, reason: "the CPU quota" });
    }

    #[test]
    fn the_affinity_mask_limits_the_cores() {
        let tree = Tree::new(&[&[0, 4], &[1, 5], &[2, 6], &[3, 7]]);
        // taskset -c 0,4,1: two cores, one of them with both its threads.
        let t = tree.read(Some("0-1,4"));
        assert_eq!(t.cores.iter().map(|c| c.cpus.clone()).collect::<Vec<_>>(), vec![vec![0, 4], vec![1]]);
        assert_eq!(t.default_threads(3).threads, 2);
        assert_eq!(t.describe(), "2 cores with 3 logical CPUs (SMT), 1 NUMA node; this process may use 3 of 8 CPUs");
        // Affinity naming CPUs that are offline keeps only the online ones.
        let t = tree.read(Some("0-15"));
        assert_eq!(t.usable_cpus(), 8);
    }

    #[test]
    fn hybrid_cpus_default_to_their_performance_cores() {
        // Two P-cores with SMT (0-3) and four E-cores (4-7), as Intel's hybrid parts number them.
        let tree = Tree::new(&[&[0, 1], &[2, 3], &[4], &[5], &[6], &[7]]);
        tree.write("devices/cpu_core/cpus", "0-3");
        tree.write("devices/cpu_atom/cpus", "4-7");
        let t = tree.read(Some("0-7"));
        assert_eq!(t.cores[0].kind, CoreKind::Performance);
        assert_eq!(t.cores[5].kind, CoreKind::Efficiency);
        assert_eq!(t.default_threads(8), ThreadChoice { threads: 2, reason: "one per performance core" });
        assert_eq!(t.describe(), "2 performance cores × 2 threads + 4 efficiency cores, 1 NUMA node");
        // Pinned to the E-cores alone, they are the cores to use.
        let t = tree.read(Some("4-7"));
        assert_eq!(t.default_threads(4), ThreadChoice { threads: 4, reason: "one per core" });
    }

    #[test]
    fn numa_nodes_count_where_usable_cpus_are() {
        let tree = Tree::new(&[&[0], &[1], &[2], &[3]]);
        tree.write("devices/system/node/node0/cpulist", "0-1");
        tree.write("devices/system/node/node1/cpulist", "2-3");
        tree.write("devices/system/node/node2/cpulist", ""); // a memory-only node
        tree.write("devices/system/node/possible", "0-2");
        assert_eq!(tree.read(Some("0-3")).numa_nodes, 2);
        let t = tree.read(Some("2-3"));
        assert_eq!((t.numa_nodes, t.default_threads(2).threads), (1, 2));
        assert_eq!(t.describe(), "2 cores, 1 NUMA node; this process may use 2 of 4 CPUs");
    }

    #[test]
    fn without_sysfs_every_cpu_is_a_core() {
        let empty = tempfile::tempdir().unwrap();
        let t = CpuTopology::read(empty.path(), Some("Cpus_allowed_list:\t0-5\n"), 2);
        assert!(!t.known);
        assert_eq!((t.cores.len(), t.numa_nodes), (6, 1));
        assert_eq!(t.default_threads(6), ThreadChoice { threads: 6, reason: "one per core" });
        assert_eq!(t.describe(), "6 CPUs (sysfs does not say which share a core), 1 NUMA node");
        // Nothing at all: the fallback count.
        let t = CpuTopology::read(empty.path(), None, 3);
        assert_eq!(t.usable_cpus(), 3);
    }

    #[test]
    fn damaged_files_fall_back_without_merging_cores() {
        let tree = Tree::new(&[&[0, 1], &[2, 3]]);
        tree.write("devices/system/cpu/cpu2/topology/core_cpus_list", "garbage");
        // cpu3's list does not name cpu3 itself: not believed.
        tree.write("devices/system/cpu/cpu3/topology/core_cpus_list", "0-1");
        tree.write("devices/system/cpu/online", "0-3,x");
        let t = tree.read(Some("0-3"));
        assert_eq!(t.cores.iter().map(|c| c.cpus.clone()).collect::<Vec<_>>(), vec![vec![0, 1], vec![2], vec![3]]);
        // An older kernel's thread_siblings_list serves when core_cpus_list is missing.
        let old = Tree::new(&[&[0], &[1]]);
        std::fs::remove_file(old.dir.path().join("devices/system/cpu/cpu0/topology/core_cpus_list")).unwrap();
        old.write("devices/system/cpu/cpu0/topology/thread_siblings_list", "0-1");
        old.write("devices/system/cpu/cpu1/topology/core_cpus_list", "0-1");
        assert_eq!(old.read(None).cores.len(), 1);
    }

    #[test]
    fn this_machine_reads_without_surprises() {
        let t = CpuTopology::detect();
        let choice = t.default_threads(cpu_quota());
        assert!(choice.threads >= 1 && choice.threads <= t.usable_cpus().max(cpu_quota()), "{t:?} {choice:?}");
        assert!(t.cores.iter().all(|c| !c.cpus.is_empty()));
        eprintln!("this machine: {}; {} threads ({})", t.describe(), choice.threads, choice.reason);
    }
}
