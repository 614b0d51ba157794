//! The prefix cache: KV blocks of earlier requests, indexed by their tokens, for later requests that start the same
//! way (a shared system prompt, the earlier turns of a conversation, a preempted request coming back).
//!
//! It is a radix tree over token blocks, as in SGLang's RadixAttention (Zheng et al., 2024): each node below the
//! root stands for one KV block, and the path from the root spells the tokens the block's keys and values were
//! computed from. A node holds the block (one per layer group, see [`BlockRef`]) by reference count in the
//! [`KvPool`], so a cached block outlives the request that computed it and any number of running requests can hold
//! it at once.
//!
//! - Full blocks go in as soon as they are computed ([`PrefixCache::insert`]), so requests arriving while the first
//!   one is still generating already share its prompt.
//! - When a request ends, its partly filled last block goes in as a *tail* (fewer than a block's tokens). Matching
//!   works at any token count, not only at block boundaries: a new prompt may share a tail, or the first tokens of
//!   any cached block, and the pool copies the block before the request writes into it (copy-on-write).
//! - A block nobody but the cache holds is evictable; [`PrefixCache::evict`] frees them least recently used first,
//!   leaves before their parents, until the pool has what the scheduler needs.
//! - Sliding-window layer groups (Gemma 3) only need the blocks within the window of where a request resumes, so a
//!   node may drop its sliding-window block on its own when that group runs short; a match is cut back to a length
//!   whose window is still all there.
//!
//! Each node also carries a stable 64-bit hash of its whole prefix ([`block_hash`]), the same in every process and
//! version, so a router in front of several replicas can send requests with equal prefixes to the same one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::model::KvPool;
use crate::model::kv_cache::{BlockRef, GroupCounts, MAX_GROUPS};

const ROOT: usize = 0;

/// The FNV-1a offset basis: the hash of the empty prefix.
pub const EMPTY_PREFIX_HASH: u64 = 0xcbf2_9ce4_8422_2325;

/// The hash of a prefix that extends the prefix hashed `parent` by `tokens`: 64-bit FNV-1a over the parent hash's
/// eight little-endian bytes, then each token id's four. Chained over full blocks from [`EMPTY_PREFIX_HASH`], it
/// names a prefix the same way in every process, which is what a prefix-affinity router needs.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = EMPTY_PREFIX_HASH;
    for b in parent.to_le_bytes().into_iter().chain(tokens.iter().flat_map(|t| t.to_le_bytes())) {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h
}

/// The chained hashes of every full block of `tokens` (see [`block_hash`]).
pub fn prefix_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut h = EMPTY_PREFIX_HASH;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            h = block_hash(h, block);
            h
        })
        .collect()
}

#[derive(Debug)]
struct Node {
    parent: usize,
    /// The block's tokens: a whole block, or fewer for a tail.
    tokens: Box<[u32]>,
    blocks: BlockRef,
    children: HashMap<Box<[u32]>, usize>,
    last_use: u64,
    hash: u64,
    live: bool,
}

/// What a prompt shares with the cache: the blocks of its first `len` positions.
#[derive(Debug, Clone, Default)]
pub struct PrefixMatch {
    pub blocks: Vec<BlockRef>,
    pub len: usize,
}

/// The tree, its nodes in a slab (index 0 is the root, which has no block).
#[derive(Debug)]
pub struct PrefixCache {
    block_size: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<usize>,
    /// Logical clock for least-recently-used order.
    tick: u64,
    /// Live nodes below the root.
    len: usize,
    /// Blocks given back to the pool by [`evict`](Self::evict) so far (a node's, or a sliding-window block).
    evicted: u64,
}

impl PrefixCache {
    pub fn new(block_size: usize) -> PrefixCache {
        let root = Node {
            parent: ROOT,
            tokens: Box::new([]),
            blocks: BlockRef::default(),
            children: HashMap::new(),
            last_use: 0,
            hash: EMPTY_PREFIX_HASH,
            live: true,
        };
        PrefixCache { block_size, nodes: vec![root], free_nodes: Vec::new(), tick: 0, len: 0, evicted: 0 }
    }

    /// Blocks (nodes) in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every hold the cache has on the pool, for [`KvPool::audit`].
    pub fn holds(&self) -> impl Iterator<Item = &BlockRef> {
        self.nodes.iter().skip(1).filter(|n| n.live).map(|n| &n.blocks)
    }

    /// The longest cached prefix of `tokens`, at most `max_len` positions, whose sliding-window blocks (if the pool
    /// has such groups) are all there for a request resuming at its end. Marks the path as just used.
    pub fn lookup(&mut self, tokens: &[u32], max_len: usize, pool: &KvPool) -> PrefixMatch {
        let bs = self.block_size;
        let mut path = Vec::new();
        let mut node = ROOT;
        let mut matched = 0;
        for block in tokens.chunks_exact(bs) {
            match self.nodes[node].children.get(block) {
                Some(&child) => {
                    path.push(child);
                    node = child;
                    matched += bs;
                }
                None => break,
            }
        }
        // Then the child (whole block or tail) sharing the most leading tokens with what is left.
        let rest = &tokens[matched..];
        let best = self.nodes[node]
            .children
            .values()
            .map(|&c| (common_prefix(&self.nodes[c].tokens, rest), c))
            .max_by_key(|&(m, c)| (m, Reverse(c)));
        if let Some((m, child)) = best.filter(|&(m, _)| m > 0) {
            path.push(child);
            matched += m;
        }
        let mut len = matched.min(max_len);
        while len > 0 && !self.window_present(&path, len, pool) {
            len = if len % bs != 0 { len - len % bs } else { len - bs };
        }
        path.truncate(len.div_ceil(bs));
        self.tick += 1;
        for &n in &path {
            self.nodes[n].last_use = self.tick;
        }
        PrefixMatch { blocks: path.iter().map(|&n| self.nodes[n].blocks).collect(), len }
    }

    /// Whether every sliding-window group has the blocks a request resuming at position `len` can see.
    fn window_present(&self, path: &[usize], len: usize, pool: &KvPool) -> bool {
        let bs = self.block_size;
        (0..pool.n_groups()).all(|g| {
            let Some(w) = pool.group_window(g) else { return true };
            let first = (len + 1).saturating_sub(w) / bs;
            path[first.min(path.len())..len.div_ceil(bs)].iter().all(|&n| self.nodes[n].blocks.ids[g].is_some())
        })
    }

    /// Adds the full blocks of a sequence whose first `tokens.len()` positions are computed and held in `blocks`
    /// (one per block the positions touch), and, with `tail`, its partly filled last block. Blocks the cache already has for
    /// the same tokens are kept (a request that computed them again holds equal copies); a sliding-window block the
    /// cache had dropped is taken from the sequence if it still has it.
    pub fn insert(&mut self, tokens: &[u32], blocks: &[BlockRef], tail: bool, pool: &mut KvPool) {
        let bs = self.block_size;
        self.tick += 1;
        let mut node = ROOT;
        let n_full = tokens.len() / bs;
        for (i, block) in tokens.chunks_exact(bs).enumerate() {
            node = match self.nodes[node].children.get(block) {
                Some(&child) => {
                    let own = blocks[i];
                    let held = &mut self.nodes[child].blocks;
                    for g in 0..MAX_GROUPS {
                        if held.ids[g].is_none() && own.ids[g].is_some() {
                            held.ids[g] = own.ids[g];
                            pool.retain(&BlockRef { ids: one(g, own.ids[g]) });
                        }
                    }
                    child
                }
                None => {
                    self.drop_tails_covered_by(node, block, pool);
                    self.add_child(node, block, blocks[i], pool)
                }
            };
            self.nodes[node].last_use = self.tick;
        }
        let rest = &tokens[n_full * bs..];
        if tail && !rest.is_empty() {
            let covered = self.nodes[node].children.keys().any(|k| k.starts_with(rest));
            if !covered {
                self.drop_tails_covered_by(node, rest, pool);
                let child = self.add_child(node, rest, blocks[n_full], pool);
                self.nodes[child].last_use = self.tick;
            }
        }
    }

    /// Removes `node`'s tails whose tokens the new child `tokens` starts with: it serves every match they did.
    fn drop_tails_covered_by(&mut self, node: usize, tokens: &[u32], pool: &mut KvPool) {
        let bs = self.block_size;
        let covered: Vec<usize> = self.nodes[node]
            .children
            .iter()
            .filter(|(k, _)| k.len() < bs && tokens.starts_with(k) && k.len() < tokens.len())
            .map(|(_, &c)| c)
            .collect();
        for c in covered {
            self.remove_leaf(c, pool);
        }
    }

    fn add_child(&mut self, parent: usize, tokens: &[u32], blocks: BlockRef, pool: &mut KvPool) -> usize {
        pool.retain(&blocks);
        let hash = block_hash(self.nodes[parent].hash, tokens);
        let node = Node {
            parent,
            tokens: tokens.into(),
            blocks,
            children: HashMap::new(),
            last_use: self.tick,
            hash,
            live: true,
        };
        let id = match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.nodes[parent].children.insert(tokens.into(), id);
        self.len += 1;
        id
    }

    fn remove_leaf(&mut self, id: usize, pool: &mut KvPool) {
        debug_assert!(self.nodes[id].children.is_empty() && id != ROOT);
        let parent = self.nodes[id].parent;
        let key = std::mem::take(&mut self.nodes[id].tokens);
        self.nodes[parent].children.remove(&key);
        pool.release_ref(&self.nodes[id].blocks);
        self.nodes[id].live = false;
        self.free_nodes.push(id);
        self.len -= 1;
    }

    /// Whether the pool's only holder of `id`'s full-attention blocks is the cache.
    fn unused(&self, id: usize, pool: &KvPool) -> bool {
        let n = &self.nodes[id];
        (0..pool.n_groups())
            .filter(|&g| pool.group_window(g).is_none())
            .all(|g| n.blocks.ids[g].is_none_or(|b| pool.refcount(g, b) == 1))
    }

    /// Frees blocks only the cache holds, least recently used first, until every group `g` has `want[g]` free
    /// blocks. Returns whether it got there.
    pub fn evict(&mut self, pool: &mut KvPool, want: &GroupCounts) -> bool {
        let enough = |pool: &KvPool| (0..pool.n_groups()).all(|g| pool.blocks_free(g) >= want[g]);
        if enough(pool) {
            return true;
        }
        // Sliding-window groups first: their blocks can go from any node, without losing the node.
        for (g, &want_g) in want.iter().enumerate().take(pool.n_groups()) {
            if pool.group_window(g).is_none() || pool.blocks_free(g) >= want_g {
                continue;
            }
            let mut cands: Vec<(u64, usize)> = (1..self.nodes.len())
                .filter(|&i| self.nodes[i].live)
                .filter(|&i| self.nodes[i].blocks.ids[g].is_some_and(|b| pool.refcount(g, b) == 1))
                .map(|i| (self.nodes[i].last_use, i))
                .collect();
            cands.sort_unstable();
            for (_, i) in cands {
                if pool.blocks_free(g) >= want_g {
                    break;
                }
                let id = self.nodes[i].blocks.ids[g].take();
                pool.release_ref(&BlockRef { ids: one(g, id) });
                self.evicted += 1;
            }
        }
        if enough(pool) {
            return true;
        }
        // Then whole nodes, leaves first; a parent whose last child goes becomes a candidate.
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (1..self.nodes.len())
            .filter(|&i| self.nodes[i].live && self.nodes[i].children.is_empty() && self.unused(i, pool))
            .map(|i| Reverse((self.nodes[i].last_use, i)))
            .collect();
        while let Some(Reverse((_, id))) = heap.pop() {
            if enough(pool) {
                break;
            }
            let parent = self.nodes[id].parent;
            self.remove_leaf(id, pool);
            self.evicted += 1;
            if parent != ROOT && self.nodes[parent].children.is_empty() && self.unused(parent, pool) {
                heap.push(Reverse((self.nodes[parent].last_use, parent)));
            }
        }
        enough(pool)
    }

    /// Blocks evicted since the cache was made.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Drops every block the cache holds.
    pub fn clear(&mut self, pool: &mut KvPool) {
        for n in self.nodes.iter().skip(1).filter(|n| n.live) {
            pool.release_ref(&n.blocks);
        }
        self.nodes.truncate(1);
        self.nodes[ROOT].children.clear();
        self.free_nodes.clear();
        self.len = 0;
    }

    /// The hashes of the cached prefixes of `tokens`, one per full block the cache has (for tests and routers:
    /// they equal [`prefix_hashes`] of the same tokens).
    pub fn cached_hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut node = ROOT;
        for block in tokens.chunks_exact(self.block_size) {
            let Some(&child) = self.nodes[node].children.get(block) else { break };
            out.push(self.nodes[child].hash);
            node = child;
        }
        out
    }
}

fn one(g: usize, id: Option<u32>) -> [Option<u32>; MAX_GROUPS] {
    let mut ids = [None; MAX_GROUPS];
    ids[g] = id;
    ids
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
