//! The KV cache, in fixed-size blocks (PagedAttention, Kwon et al., SOSP 2023).
//!
//! Keys and values live in a pool of blocks of `block_size` positions. Each sequence owns a block table that maps
//! its positions to blocks, so sequences of any length share one pool without fragmentation, a finished sequence
//! returns its blocks at once, and (later) sequences with a common prefix can share blocks.
//!
//! Layers are split into groups with their own block tables. A group of sliding-window layers (gemma3) frees a
//! sequence's blocks once every position in them has left the window (and an optional rewind margin behind it), so
//! those layers keep a cache bounded by the window rather than by the context.
//!
//! Storage per group, f32 or f16, one tile per (block, layer):
//! - keys `[n_blocks][n_layers_in_group][k_row][block_size]`: each tile transposed, so one key dimension's values
//!   for the block's positions are contiguous and attention scores come out as column sums
//!   ([`infer_kernels::vec_f32::dot_cols`]), with no horizontal additions;
//! - values `[n_blocks][n_layers_in_group][block_size][v_row]`: rows, as the weighted sum streams them.
//!
//! Rows hold `n_head_kv · head_dim` values.

use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use infer_kernels::vec_f32::prefetch;

use super::config::ModelConfig;

/// Element type of cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    pub fn parse(s: &str) -> Option<KvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(KvDtype::F32),
            "f16" => Some(KvDtype::F16),
            _ => None,
        }
    }
}

/// Storage of keys or values for one layer group.
#[derive(Debug)]
pub enum KvStore {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A borrowed row of cached keys or values.
#[derive(Clone, Copy)]
pub enum KvRow<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRow<'_> {
    /// Asks the CPU to fetch elements `range` (see [`infer_kernels::vec_f32::prefetch`]).
    fn prefetch(&self, range: Range<usize>) {
        match self {
            KvRow::F32(s) => prefetch(&s[range]),
            KvRow::F16(s) => prefetch(&s[range]),
        }
    }
}

impl KvStore {
    fn new(dtype: KvDtype, len: usize) -> KvStore {
        match dtype {
            KvDtype::F32 => KvStore::F32(vec![0.0; len]),
            KvDtype::F16 => KvStore::F16(vec![f16::ZERO; len]),
        }
    }

    fn slice(&self, at: usize, len: usize) -> KvRow<'_> {
        match self {
            KvStore::F32(s) => KvRow::F32(&s[at..at + len]),
            KvStore::F16(s) => KvRow::F16(&s[at..at + len]),
        }
    }
}

/// An element type of cached keys and values: how one position's new key and value rows go into their tiles.
pub trait KvElem: Copy + Send + Sync {
    /// Writes `src`, converted, to `dst[0]`, `dst[stride]`, `dst[2·stride]`, … (`dst` long enough).
    fn put_strided(dst: &mut [Self], stride: usize, src: &[f32]);
    /// Writes `src`, converted, to `dst` (of the same length).
    fn put_row(dst: &mut [Self], src: &[f32]);

    /// Stores one position of a block: its key `k` down lane `lane` of the transposed key tile (`k.len()` rows of
    /// `bs` lanes) and its value `v` as row `lane` of the value tile (`bs` rows of `v.len()`).
    fn store(k_tile: &mut [Self], v_tile: &mut [Self], lane: usize, bs: usize, k: &[f32], v: &[f32]) {
        assert!(
            lane < bs && k_tile.len() == k.len() * bs && v_tile.len() == v.len() * bs,
            "a key of {} and a value of {} do not fit tiles of {} and {} at lane {lane} of {bs}",
            k.len(),
            v.len(),
            k_tile.len(),
            v_tile.len()
        );
        Self::put_strided(&mut k_tile[lane..], bs, k);
        Self::put_row(&mut v_tile[lane * v.len()..(lane + 1) * v.len()], v);
    }
}

impl KvElem for f32 {
    fn put_strided(dst: &mut [f32], stride: usize, src: &[f32]) {
        for (&x, d) in src.iter().zip(dst.iter_mut().step_by(stride)) {
            *d = x;
        }
    }
    fn put_row(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    fn put_strided(dst: &mut [f16], stride: usize, src: &[f32]) {
        // Convert in runs with F16C (`half`'s slice conversion), then scatter: one value at a time would go through
        // the portable conversion.
        const RUN: usize = 64;
        let mut buf = [f16::ZERO; RUN];
        let mut column = dst.iter_mut().step_by(stride);
        for chunk in src.chunks(RUN) {
            let buf = &mut buf[..chunk.len()];
            buf.convert_from_f32_slice(chunk);
            // `buf` leads the zip: when it runs out, the column is not advanced past the next chunk's first lane.
            for (&h, d) in buf.iter().zip(column.by_ref()) {
                *d = h;
            }
        }
    }
    fn put_row(dst: &mut [f16], src: &[f32]) {
        // Whole rows convert with F16C too (one value at a time was 3% of a batched step).
        dst.convert_from_f32_slice(src);
    }
}

/// The key and value tiles of one layer group, mutable, for writers of many positions at once: tile `i` of the
/// keys is `k[i·k_tile..][..k_tile]`, of the values `v[i·v_tile..][..v_tile]` (see [`KvPool::tile_of`]).
pub enum TilesMut<'a> {
    F32 { k: &'a mut [f32], v: &'a mut [f32] },
    F16 { k: &'a mut [f16], v: &'a mut [f16] },
}

/// Layers sharing one block table.
#[derive(Debug)]
pub struct LayerGroup {
    /// Sliding window of these layers, if they have one.
    pub window: Option<usize>,
    /// Positions kept behind the window (sliding-window groups only), so that a sequence can be truncated back by
    /// this many and still find the window its next position needs.
    rewind: usize,
    n_layers: usize,
    n_blocks: usize,
    k: KvStore,
    v: KvStore,
    k_row: usize,
    v_row: usize,
    free: Vec<u32>,
}

/// Why the cache could not take more positions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks of {block_size} positions needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize, block_size: usize },
}

/// The pool of KV blocks shared by all sequences.
#[derive(Debug)]
pub struct KvPool {
    pub block_size: usize,
    pub dtype: KvDtype,
    groups: Vec<LayerGroup>,
    /// For each model layer: (group index, index within the group).
    layer_slot: Vec<(usize, usize)>,
}

/// One sequence's view of the cache: its length and, per layer group, its block table.
#[derive(Debug, Default, Clone)]
pub struct SeqKv {
    len: usize,
    /// Per group: block ids by block index; `None` where a sliding-window block has been freed.
    tables: Vec<Vec<Option<u32>>>,
}

impl SeqKv {
    pub fn new() -> SeqKv {
        SeqKv::default()
    }

    /// Positions cached so far (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Blocks of a layer group: enough for `capacity` positions, or for sliding-window layers, for the window's
/// `swa_capacity` plus `rewind` (a batch that starts part-way into a block spans one block more than it fills).
fn group_blocks(swa: bool, capacity: usize, swa_capacity: usize, rewind: usize, block_size: usize) -> usize {
    let mut n_blocks = capacity.div_ceil(block_size);
    if swa {
        n_blocks = n_blocks.min(swa_capacity.saturating_add(rewind).div_ceil(block_size).saturating_add(1));
    }
    n_blocks.max(1)
}

/// Tokens per block. Small enough that a short request wastes little, large enough that a block's rows form a
/// long contiguous run for attention.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

impl KvPool {
    /// A pool with room for `capacity` positions in total across sequences (sliding-window groups get room for
    /// `swa_capacity`, since they hold at most a window plus one batch per sequence).
    pub fn new(config: &ModelConfig, dtype: KvDtype, capacity: usize, swa_capacity: usize) -> KvPool {
        KvPool::with_rewind(config, dtype, capacity, swa_capacity, 0)
    }

    /// As [`KvPool::new`], with sliding-window groups that also keep `rewind` positions behind the window (and room
    /// for them on top of `swa_capacity`), so that [`KvPool::truncate`] can take a sequence back that far.
    pub fn with_rewind(
        config: &ModelConfig,
        dtype: KvDtype,
        capacity: usize,
        swa_capacity: usize,
        rewind: usize,
    ) -> KvPool {
        let block_size = DEFAULT_BLOCK_SIZE;
        let mut groups = Vec::new();
        let mut layer_slot = vec![(0, 0); config.n_layer];
        for swa in [false, true] {
            let layers: Vec<usize> = (0..config.n_layer).filter(|&il| config.layer_is_swa[il] == swa).collect();
            if layers.is_empty() {
                continue;
            }
            let n_blocks = group_blocks(swa, capacity, swa_capacity, rewind, block_size);
            let gi = groups.len();
            for (slot, &il) in layers.iter().enumerate() {
                layer_slot[il] = (gi, slot);
            }
            let (k_row, v_row) = (config.k_dim(), config.v_dim());
            let per_block = layers.len() * block_size;
            groups.push(LayerGroup {
                window: if swa { config.sliding_window } else { None },
                rewind: if swa { rewind } else { 0 },
                n_layers: layers.len(),
                n_blocks,
                k: KvStore::new(dtype, n_blocks * per_block * k_row),
                v: KvStore::new(dtype, n_blocks * per_block * v_row),
                k_row,
                v_row,
                free: (0..n_blocks as u32).rev().collect(),
            });
        }
        KvPool { block_size, dtype, groups, layer_slot }
    }

    /// Bytes a pool made by [`KvPool::with_rewind`] with these arguments holds, computed without overflow (`None`:
    /// more than 64 bits can count), so that a size nobody can allocate is refused before it is tried.
    pub fn bytes_for(
        config: &ModelConfig,
        dtype: KvDtype,
        capacity: usize,
        swa_capacity: usize,
        rewind: usize,
    ) -> Option<u64> {
        let block_size = DEFAULT_BLOCK_SIZE;
        let row = (config.k_dim() as u64).checked_add(config.v_dim() as u64)?;
        let mut total = 0u64;
        for swa in [false, true] {
            let layers = config.layer_is_swa.iter().filter(|&&s| s == swa).count() as u64;
            if layers == 0 {
                continue;
            }
            let n_blocks = group_blocks(swa, capacity, swa_capacity, rewind, block_size) as u64;
            let group = n_blocks.checked_mul(layers)?.checked_mul(block_size as u64)?.checked_mul(row)?;
            total = total.checked_add(group)?;
        }
        total.checked_mul(dtype.size() as u64)
    }

    /// Bytes held by the pool.
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.n_blocks * g.n_layers * self.block_size * (g.k_row + g.v_row)).sum::<usize>()
            * self.dtype.size()
    }

    /// Positions one sequence can still add before the pool runs out (ignoring other sequences' future needs).
    pub fn free_positions(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| g.window.is_none())
            .map(|g| g.free.len() * self.block_size)
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Makes room for positions `seq.len() .. seq.len() + n` in every group, allocating blocks as needed.
    pub fn reserve(&mut self, seq: &mut SeqKv, n: usize) -> Result<(), KvError> {
        if seq.tables.len() < self.groups.len() {
            seq.tables.resize(self.groups.len(), Vec::new());
        }
        let blocks_needed = (seq.len + n).div_ceil(self.block_size);
        // Check every group first so that a failure allocates nothing.
        for (g, table) in self.groups.iter().zip(&seq.tables) {
            let needed = blocks_needed.saturating_sub(table.len());
            if needed > g.free.len() {
                return Err(KvError::OutOfBlocks { needed, free: g.free.len(), block_size: self.block_size });
            }
        }
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            while table.len() < blocks_needed {
                table.push(Some(g.free.pop().expect("checked above")));
            }
        }
        Ok(())
    }

    /// Records that `n` positions were written (after a forward pass) and frees sliding-window blocks that no
    /// future query can see.
    pub fn advance(&mut self, seq: &mut SeqKv, n: usize) {
        seq.len += n;
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            let Some(window) = g.window else { continue };
            // The next query sits at position `len` and sees positions > len - window; `rewind` more are kept.
            let first_kept = (seq.len + 1).saturating_sub(window + g.rewind);
            let dead_blocks = first_kept / self.block_size;
            for entry in table.iter_mut().take(dead_blocks) {
                if let Some(b) = entry.take() {
                    g.free.push(b);
                }
            }
        }
    }

    /// Returns all of a sequence's blocks to the pool and empties it.
    pub fn release(&mut self, seq: &mut SeqKv) {
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            g.free.extend(table.drain(..).flatten());
        }
        seq.len = 0;
    }

    /// Whether `seq` can be truncated to `new_len` and go on from there: every sliding-window group still holds
    /// the window that a query at position `new_len` sees. (Freed blocks are always a prefix of a table, so the
    /// block of the window's first position decides.)
    pub fn can_truncate(&self, seq: &SeqKv, new_len: usize) -> bool {
        if new_len >= seq.len {
            return new_len == seq.len;
        }
        self.groups.iter().zip(&seq.tables).all(|(g, table)| {
            let Some(window) = g.window else { return true };
            let first_visible = (new_len + 1).saturating_sub(window);
            table.get(first_visible / self.block_size).is_some_and(Option::is_some)
        })
    }

    /// Drops positions from `new_len` on (chat rewind, regenerate); blocks past the end return to the pool.
    /// Sliding-window blocks already freed cannot come back: callers check [`KvPool::can_truncate`] first, and
    /// otherwise start the sequence over.
    pub fn truncate(&mut self, seq: &mut SeqKv, new_len: usize) {
        if new_len >= seq.len {
            return;
        }
        debug_assert!(self.can_truncate(seq, new_len), "truncating to {new_len} loses the window it needs");
        let keep = new_len.div_ceil(self.block_size);
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            if table.len() > keep {
                g.free.extend(table.drain(keep..).flatten());
            }
        }
        seq.len = new_len;
    }

    /// Where position `pos` of `layer` lives: (group, tile index = block · layers in group + slot, lane).
    fn locate(&self, seq: &SeqKv, layer: usize, pos: usize) -> (usize, usize, usize) {
        let (gi, slot) = self.layer_slot[layer];
        let block = seq.tables[gi][pos / self.block_size].expect("position within the live window");
        (gi, block as usize * self.groups[gi].n_layers + slot, pos % self.block_size)
    }

    /// Stores the key and value rows of position `pos` (reserved beforehand) for `layer`.
    pub fn write(&mut self, seq: &SeqKv, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (tile, lane) = self.tile_of(seq, layer, pos);
        let (bs, (kn, vn)) = (self.block_size, self.tile_sizes(layer));
        match self.tiles_mut(layer) {
            TilesMut::F32 { k: kt, v: vt } => {
                f32::store(&mut kt[tile * kn..][..kn], &mut vt[tile * vn..][..vn], lane, bs, k, v)
            }
            TilesMut::F16 { k: kt, v: vt } => {
                f16::store(&mut kt[tile * kn..][..kn], &mut vt[tile * vn..][..vn], lane, bs, k, v)
            }
        }
    }

    /// The tile (index into [`KvPool::tiles_mut`]'s tiles for `layer`) and lane of position `pos` (reserved).
    pub fn tile_of(&self, seq: &SeqKv, layer: usize, pos: usize) -> (usize, usize) {
        let (_, tile, lane) = self.locate(seq, layer, pos);
        (tile, lane)
    }

    /// Elements per key tile and per value tile of `layer`'s group.
    pub fn tile_sizes(&self, layer: usize) -> (usize, usize) {
        let g = &self.groups[self.layer_slot[layer].0];
        (g.k_row * self.block_size, g.v_row * self.block_size)
    }

    /// The whole storage of `layer`'s group, as tiles.
    pub fn tiles_mut(&mut self, layer: usize) -> TilesMut<'_> {
        let g = &mut self.groups[self.layer_slot[layer].0];
        match (&mut g.k, &mut g.v) {
            (KvStore::F32(k), KvStore::F32(v)) => TilesMut::F32 { k, v },
            (KvStore::F16(k), KvStore::F16(v)) => TilesMut::F16 { k, v },
            _ => unreachable!("keys and values of a group share one dtype"),
        }
    }

    /// The block holding position `pos` of `layer`: its whole key tile (`k_row × block_size`, transposed) and
    /// value tile (`block_size × v_row`), and the position's lane in them. Lanes the sequence has not written hold
    /// stale values; callers read only the lanes of their positions.
    pub fn block(&self, seq: &SeqKv, layer: usize, pos: usize) -> (KvRow<'_>, KvRow<'_>, usize) {
        let (gi, tile, lane) = self.locate(seq, layer, pos);
        let g = &self.groups[gi];
        let bs = self.block_size;
        (g.k.slice(tile * bs * g.k_row, bs * g.k_row), g.v.slice(tile * bs * g.v_row, bs * g.v_row), lane)
    }

    /// Asks the CPU to fetch part of the block holding position `pos` of `layer`: key rows `keys` of its
    /// transposed key tile and columns `values` of each row of its value tile (one key head's share). A
    /// sequence's blocks lie scattered in the pool, where the hardware prefetcher does not follow, so attention
    /// asks for the blocks it will read next.
    pub fn prefetch(&self, seq: &SeqKv, layer: usize, pos: usize, keys: Range<usize>, values: Range<usize>) {
        let (k, v, _) = self.block(seq, layer, pos);
        let (bs, v_row) = (self.block_size, self.groups[self.layer_slot[layer].0].v_row);
        k.prefetch(keys.start * bs..keys.end * bs);
        for r in 0..bs {
            v.prefetch(r * v_row + values.start..r * v_row + values.end);
        }
    }

    /// The sliding window of `layer`, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.groups[self.layer_slot[layer].0].window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One position's key goes down exactly its lane of the transposed tile and its value into its row of the value
    /// tile, at any key width (including more than one conversion run of 64), and nothing else is touched.
    fn check_store<T: KvElem + PartialEq + std::fmt::Debug>(zero: T, from: impl Fn(f32) -> T) {
        const BS: usize = 16;
        const V: usize = 5;
        for k_len in [1, 63, 64, 65, 192, 200] {
            for lane in [0, 7, BS - 1] {
                let k: Vec<f32> = (0..k_len).map(|i| 1.0 + i as f32).collect();
                let v: Vec<f32> = (0..V).map(|i| -1.0 - i as f32).collect();
                let mut k_tile = vec![zero; k_len * BS];
                let mut v_tile = vec![zero; V * BS];
                T::store(&mut k_tile, &mut v_tile, lane, BS, &k, &v);
                for (i, x) in k_tile.iter().enumerate() {
                    let want = if i % BS == lane { from(k[i / BS]) } else { zero };
                    assert_eq!(*x, want, "k_len {k_len} lane {lane} key element {i}");
                }
                for (i, x) in v_tile.iter().enumerate() {
                    let want = if i / V == lane { from(v[i % V]) } else { zero };
                    assert_eq!(*x, want, "lane {lane} value element {i}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "do not fit tiles")]
    fn store_rejects_a_key_wider_than_its_tile() {
        let (mut k_tile, mut v_tile) = (vec![0f32; 4 * 16], vec![0f32; 2 * 16]);
        f32::store(&mut k_tile, &mut v_tile, 0, 16, &[1.0; 5], &[1.0; 2]);
    }

    #[test]
    fn store_writes_one_lane_and_one_row() {
        check_store(0f32, |x| x);
        check_store(f16::ZERO, f16::from_f32);
    }
}
