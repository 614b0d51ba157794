//! The KV cache, in fixed-size blocks (PagedAttention, Kwon et al., SOSP 2023).
//!
//! Keys and values live in a pool of blocks of `block_size` positions. Each sequence owns a block table that maps
//! its positions to blocks, so sequences of any length share one pool without fragmentation and a finished sequence
//! returns its blocks at once.
//!
//! Blocks are reference-counted: sequences with a common prefix hold the same blocks (the serving engine's prefix
//! cache holds references too, see `crate::engine`), and a block returns to the free list when its last holder lets
//! go. A sequence about to write into a block someone else also holds (a shared, partly filled last block) gets its
//! own copy first ([`KvPool::reserve`]: copy-on-write).
//!
//! Layers are split into groups with their own block tables. A group of sliding-window layers (gemma3) frees a
//! sequence's blocks once every position in them has left the window (and an optional rewind margin behind it), so
//! those layers keep a cache bounded by the window rather than by the context.
//!
//! Storage per group, f32, f16 or 8-bit ([`KvDtype::Q8_0`]), one tile per (layer, block):
//! - keys `[n_layers_in_group][n_blocks][k_row][block_size]`: each tile transposed, so one key dimension's values
//!   for the block's positions are contiguous and attention scores come out as column sums
//!   ([`infer_kernels::vec_f32::dot_cols`]), with no horizontal additions;
//! - values `[n_layers_in_group][n_blocks][n_head_kv][block_size][head_dim_v]`: per key head, rows, as the weighted
//!   sum streams them.
//!
//! The 8-bit cache quantizes in blocks of 32 values with an f32 scale each (llama.cpp's `q8_0` with a full-precision
//! scale: 36 bytes per 32 values against its 34, and no conversion where attention applies it). A value row's
//! blocks are its own 32 consecutive values; a key's run down its lane of the transposed tile, 32 key dimensions at
//! a time, and the tile's scales are rows of `block_size` (one per lane) per 32 key rows. The scales of every tile
//! live in a second array beside the values, tile `i`'s at `i · tile / 32`.
//!
//! Key rows hold `n_head_kv · head_dim` values, head after head, so one key head's share of a tile is contiguous
//! in both stores. A layer's tiles follow one another block after block, and a sequence takes the block right
//! after its last one whenever that is free ([`super::free_blocks`]), so decoding attention reads a layer's cache
//! as a few long ascending runs, which the hardware prefetcher follows (tiles in block-major order put every block
//! of a layer on its own pages, a layer's tiles a whole block's worth of layers apart, and decode at 4,096
//! positions waited on memory). Taken from a free list instead, blocks came in descending order for every other
//! sequence of a process (SmolLM2 at 4,096 positions: ~78 t/s against ~125, Zen 4), and interleaved or in no
//! order at all for sequences a server runs side by side.

use std::ops::Range;

use half::f16;
use half::slice::HalfFloatSliceExt;
use infer_kernels::vec_f32::{self, prefetch_l2};

use super::config::ModelConfig;
use super::free_blocks::FreeBlocks;

/// Element type of cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    /// 8-bit values in blocks of 32 with an f32 scale each (see the module documentation): 0.56× the bytes of f16.
    Q8_0,
}

/// Values per scale of [`KvDtype::Q8_0`].
pub const Q8_BLOCK: usize = 32;

/// Why a model cannot have a KV cache of some element type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvDtypeError {
    #[error(
        "the q8_0 KV cache quantizes heads in blocks of {Q8_BLOCK} values, and this model's {what} is {width} \
         (not a multiple of {Q8_BLOCK}); use --kv-type f16"
    )]
    HeadNotBlocks { what: &'static str, width: usize },
}

impl KvDtype {
    /// Bytes of `n` cached values (whole blocks of 32 for [`KvDtype::Q8_0`]); `None` past 64 bits.
    pub fn bytes(self, n: u64) -> Option<u64> {
        match self {
            KvDtype::F32 => n.checked_mul(4),
            KvDtype::F16 => n.checked_mul(2),
            KvDtype::Q8_0 => n.checked_add((n / Q8_BLOCK as u64).checked_mul(4)?),
        }
    }

    pub fn parse(s: &str) -> Option<KvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(KvDtype::F32),
            "f16" => Some(KvDtype::F16),
            "q8_0" => Some(KvDtype::Q8_0),
            _ => None,
        }
    }

    /// Whether `config`'s heads can be cached in this type: the 8-bit cache needs key and value heads of whole
    /// blocks, so that no block straddles two heads (attention reads one key head's share of a tile at a time).
    pub fn check(self, config: &ModelConfig) -> Result<(), KvDtypeError> {
        if self == KvDtype::Q8_0 {
            for (what, width) in [("key head width", config.head_dim), ("value head width", config.head_dim_v)] {
                if width == 0 || !width.is_multiple_of(Q8_BLOCK) {
                    return Err(KvDtypeError::HeadNotBlocks { what, width });
                }
            }
        }
        Ok(())
    }
}

/// Storage of keys or values for one layer group.
#[derive(Debug)]
pub enum KvStore {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Values, and one scale per 32 of them (see the module documentation).
    Q8 {
        q: Vec<i8>,
        d: Vec<f32>,
    },
}

/// A borrowed row of cached keys or values.
#[derive(Clone, Copy)]
pub enum KvRow<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Values and their scales: `d[i]` scales the values of block `i` of the row (see [`KvStore::Q8`]).
    Q8 {
        q: &'a [i8],
        d: &'a [f32],
    },
}

impl KvRow<'_> {
    /// Asks the CPU to fetch elements `range` into L2 (see [`infer_kernels::vec_f32::prefetch_l2`]).
    fn prefetch(&self, range: Range<usize>) {
        match self {
            KvRow::F32(s) => prefetch_l2(&s[range]),
            KvRow::F16(s) => prefetch_l2(&s[range]),
            KvRow::Q8 { q, d } => {
                prefetch_l2(&q[range.clone()]);
                prefetch_l2(&d[range.start / Q8_BLOCK..range.end.div_ceil(Q8_BLOCK)]);
            }
        }
    }

    /// Elements `range` (whole blocks of 32 for [`KvRow::Q8`]) as f32: borrowed where they are f32 already, else
    /// converted into `buf` (at least `range.len()` long). `lanes`: 1 for a row of value blocks, the block size
    /// for a range of a transposed key tile (see [`infer_kernels::vec_f32::dequant_q8`]). Every conversion is
    /// exact given the stored values, so each attention kernel sees the same f32 values.
    pub fn as_f32<'b>(&'b self, range: Range<usize>, lanes: usize, buf: &'b mut [f32]) -> &'b [f32] {
        let out = &mut buf[..range.len()];
        match self {
            KvRow::F32(s) => &s[range],
            KvRow::F16(s) => {
                vec_f32::f16_to_f32(&s[range], out);
                out
            }
            KvRow::Q8 { q, d } => {
                debug_assert!(range.start.is_multiple_of(Q8_BLOCK * lanes), "a range inside a block");
                let scales = range.start / Q8_BLOCK..range.end / Q8_BLOCK;
                vec_f32::dequant_q8(&q[range], &d[scales], lanes, out);
                out
            }
        }
    }
}

impl KvStore {
    fn new(dtype: KvDtype, len: usize) -> KvStore {
        match dtype {
            // Both come from zeroed pages that the OS maps on first touch: `vec![f16::ZERO; len]` would write
            // every element (f16 is not a type the standard library knows to be zero-bit), so a pool sized for a
            // server touched all of its memory before the first request.
            KvDtype::F32 => KvStore::F32(vec![0.0; len]),
            KvDtype::F16 => KvStore::F16(bytemuck::zeroed_vec(len)),
            KvDtype::Q8_0 => KvStore::Q8 { q: vec![0; len], d: vec![0.0; len / Q8_BLOCK] },
        }
    }

    fn slice(&self, at: usize, len: usize) -> KvRow<'_> {
        match self {
            KvStore::F32(s) => KvRow::F32(&s[at..at + len]),
            KvStore::F16(s) => KvRow::F16(&s[at..at + len]),
            KvStore::Q8 { q, d } => KvRow::Q8 { q: &q[at..at + len], d: &d[at / Q8_BLOCK..(at + len) / Q8_BLOCK] },
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
    /// `bs` lanes) and each `v_head` values of its value `v` as row `lane` of that key head's part of the value
    /// tile (per head, `bs` rows of `v_head`).
    fn store(k_tile: &mut [Self], v_tile: &mut [Self], lane: usize, bs: usize, k: &[f32], v: &[f32], v_head: usize) {
        assert!(
            lane < bs && k_tile.len() == k.len() * bs && v_tile.len() == v.len() * bs && v.len().is_multiple_of(v_head),
            "a key of {} and a value of {} do not fit tiles of {} and {} at lane {lane} of {bs}",
            k.len(),
            v.len(),
            k_tile.len(),
            v_tile.len()
        );
        Self::put_strided(&mut k_tile[lane..], bs, k);
        for (h, vh) in v.chunks_exact(v_head).enumerate() {
            Self::put_row(&mut v_tile[(h * bs + lane) * v_head..][..v_head], vh);
        }
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

/// One block's tiles in the 8-bit cache, mutable: the key tile's values and scales, then the value tile's (see
/// [`KvStore::Q8`]).
pub struct Q8Tiles<'a> {
    pub kq: &'a mut [i8],
    pub kd: &'a mut [f32],
    pub vq: &'a mut [i8],
    pub vd: &'a mut [f32],
}

/// One block of 32 values in 8 bits: the scale `max |x| / 127` and each value over it, rounded to nearest (halves
/// away from zero), as llama.cpp's `q8_0` rounds. An all-zero block gets scale 0 (and zeros).
fn quantize_block(x: &[f32]) -> (f32, [i8; Q8_BLOCK]) {
    let (d, id) = infer_kernels::dispatch::block_scale(x.iter().fold(0f32, |m, v| m.max(v.abs())));
    let mut q = [0i8; Q8_BLOCK];
    for (q, &v) in q.iter_mut().zip(x) {
        // `as` saturates (and takes NaN to 0), so no input can wrap.
        *q = (v * id).round() as i8;
    }
    (d, q)
}

impl Q8Tiles<'_> {
    /// [`KvElem::store`] for the 8-bit cache: the key's blocks down lane `lane` of the transposed key tile, each
    /// scale into its row of `bs` lane scales; each value head's blocks along row `lane` of its part of the value
    /// tile, with their scales in the same order.
    pub fn store(self, lane: usize, bs: usize, k: &[f32], v: &[f32], v_head: usize) {
        let Q8Tiles { kq, kd, vq, vd } = self;
        assert!(
            lane < bs
                && kq.len() == k.len() * bs
                && vq.len() == v.len() * bs
                && kd.len() * Q8_BLOCK == kq.len()
                && vd.len() * Q8_BLOCK == vq.len()
                && k.len().is_multiple_of(Q8_BLOCK)
                && v_head.is_multiple_of(Q8_BLOCK)
                && v.len().is_multiple_of(v_head),
            "a key of {} and a value of {} (heads of {v_head}) do not fit 8-bit tiles of {} and {} at lane {lane} of {bs}",
            k.len(),
            v.len(),
            kq.len(),
            vq.len()
        );
        for (c, block) in k.chunks_exact(Q8_BLOCK).enumerate() {
            let (d, q) = quantize_block(block);
            kd[c * bs + lane] = d;
            for (i, &q) in q.iter().enumerate() {
                kq[(c * Q8_BLOCK + i) * bs + lane] = q;
            }
        }
        for (h, vh) in v.chunks_exact(v_head).enumerate() {
            let row = (h * bs + lane) * v_head;
            for (c, block) in vh.chunks_exact(Q8_BLOCK).enumerate() {
                let (d, q) = quantize_block(block);
                vd[row / Q8_BLOCK + c] = d;
                vq[row + c * Q8_BLOCK..][..Q8_BLOCK].copy_from_slice(&q);
            }
        }
    }
}

/// The key and value tiles of one layer group, mutable, for writers of many positions at once: tile `i` of the
/// keys is `k[i·k_tile..][..k_tile]`, of the values `v[i·v_tile..][..v_tile]` (see [`KvPool::tile_of`]).
pub enum TilesMut<'a> {
    F32 {
        k: &'a mut [f32],
        v: &'a mut [f32],
    },
    F16 {
        k: &'a mut [f16],
        v: &'a mut [f16],
    },
    /// Tile `i`'s scales are `kd[i·k_tile / 32..]` and `vd[i·v_tile / 32..]` (see [`Q8Tiles`]).
    Q8 {
        k: &'a mut [i8],
        kd: &'a mut [f32],
        v: &'a mut [i8],
        vd: &'a mut [f32],
    },
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
    /// Values per key head (`head_dim_v`).
    v_head: usize,
    /// Blocks nobody holds (reference count 0).
    free: FreeBlocks,
    /// Per block: how many block tables (and prefix-cache entries) hold it.
    refs: Vec<u32>,
}

impl LayerGroup {
    /// A free block, held once: the one after `after` (a sequence's last block) if that is free, else one with
    /// room for the `want` blocks the sequence needs now (see [`FreeBlocks::take`]).
    fn take(&mut self, after: Option<u32>, want: usize) -> Option<u32> {
        let b = self.free.take(after, want)?;
        debug_assert_eq!(self.refs[b as usize], 0, "a free block is held");
        self.refs[b as usize] = 1;
        Some(b)
    }

    fn retain(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "retaining block {b}, which nobody holds");
        *r += 1;
    }

    /// Drops one hold on `b`; the last one returns it to the free list.
    fn release(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "releasing block {b}, which nobody holds");
        *r -= 1;
        if *r == 0 {
            self.free.insert(b as usize);
        }
    }

    /// Copies block `src`'s keys and values (every layer's tile) into block `dst`.
    fn copy_block(&mut self, src: u32, dst: u32, bs: usize) {
        let (kn, vn) = (bs * self.k_row, bs * self.v_row);
        for slot in 0..self.n_layers {
            let (s, d) = (slot * self.n_blocks + src as usize, slot * self.n_blocks + dst as usize);
            match (&mut self.k, &mut self.v) {
                (KvStore::F32(k), KvStore::F32(v)) => {
                    k.copy_within(s * kn..(s + 1) * kn, d * kn);
                    v.copy_within(s * vn..(s + 1) * vn, d * vn);
                }
                (KvStore::F16(k), KvStore::F16(v)) => {
                    k.copy_within(s * kn..(s + 1) * kn, d * kn);
                    v.copy_within(s * vn..(s + 1) * vn, d * vn);
                }
                (KvStore::Q8 { q: kq, d: kd }, KvStore::Q8 { q: vq, d: vd }) => {
                    kq.copy_within(s * kn..(s + 1) * kn, d * kn);
                    vq.copy_within(s * vn..(s + 1) * vn, d * vn);
                    let (kb, vb) = (kn / Q8_BLOCK, vn / Q8_BLOCK);
                    kd.copy_within(s * kb..(s + 1) * kb, d * kb);
                    vd.copy_within(s * vb..(s + 1) * vb, d * vb);
                }
                _ => unreachable!("keys and values of a group share one dtype"),
            }
        }
    }
}

/// Most layer groups a model has: full attention and sliding window.
pub const MAX_GROUPS: usize = 2;

/// One block index of a sequence across the layer groups: the block holding those positions in each group (`None`
/// where a group has none, such as a sliding-window block that has left the window). The unit the prefix cache
/// stores and shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockRef {
    pub ids: [Option<u32>; MAX_GROUPS],
}

/// Why the cache could not take more positions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks of {block_size} positions needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize, block_size: usize },
}

/// Blocks per layer group (see [`KvPool::blocks_needed`]).
pub type GroupCounts = [usize; MAX_GROUPS];

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
    /// Keep sliding-window blocks that leave the window until [`KvPool::release_passed`].
    keep_passed: bool,
    /// Per group: block ids by block index; `None` where a sliding-window block has been freed.
    tables: Vec<Vec<Option<u32>>>,
}

impl SeqKv {
    pub fn new() -> SeqKv {
        SeqKv::default()
    }

    /// A sequence whose sliding-window blocks stay held after they leave the window, until its owner calls
    /// [`KvPool::release_passed`] (the serving engine first lets its prefix cache take them).
    pub fn keeping_passed_blocks() -> SeqKv {
        SeqKv { keep_passed: true, ..SeqKv::default() }
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
        let bs = DEFAULT_BLOCK_SIZE;
        let blocks = group_blocks(false, capacity, swa_capacity, rewind, bs);
        let swa_blocks = group_blocks(true, capacity, swa_capacity, rewind, bs);
        KvPool::build(config, dtype, blocks, swa_blocks, rewind)
    }

    /// A pool of `blocks` blocks for the full-attention layers and `swa_blocks` for the sliding-window ones (at
    /// least one each), as the serving engine sizes it.
    pub fn with_blocks(config: &ModelConfig, dtype: KvDtype, blocks: usize, swa_blocks: usize) -> KvPool {
        KvPool::build(config, dtype, blocks, swa_blocks, 0)
    }

    fn build(config: &ModelConfig, dtype: KvDtype, blocks: usize, swa_blocks: usize, rewind: usize) -> KvPool {
        // Callers check first, with a message for the user (`KvDtype::check`); this stops a tile that would split
        // a block between heads.
        if let Err(e) = dtype.check(config) {
            panic!("{e}");
        }
        let block_size = DEFAULT_BLOCK_SIZE;
        let mut groups = Vec::new();
        let mut layer_slot = vec![(0, 0); config.n_layer];
        for swa in [false, true] {
            let layers: Vec<usize> = (0..config.n_layer).filter(|&il| config.layer_is_swa[il] == swa).collect();
            if layers.is_empty() {
                continue;
            }
            let n_blocks = if swa { swa_blocks } else { blocks }.max(1);
            assert!(n_blocks <= u32::MAX as usize, "{n_blocks} KV blocks: more than block ids can name");
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
                v_head: config.head_dim_v,
                free: FreeBlocks::all(n_blocks),
                refs: vec![0; n_blocks],
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
        dtype.bytes(total)
    }

    /// Bytes held by the pool.
    pub fn bytes(&self) -> usize {
        let values = self.groups.iter().map(|g| g.n_blocks * g.n_layers * self.block_size * (g.k_row + g.v_row));
        self.dtype.bytes(values.sum::<usize>() as u64).map_or(usize::MAX, |b| b as usize)
    }

    /// Bytes of one block in the full-attention layers and in the sliding-window layers (0 where a model has none),
    /// for sizing a pool to a memory budget before creating it.
    pub fn block_bytes(config: &ModelConfig, dtype: KvDtype) -> (usize, usize) {
        let values = DEFAULT_BLOCK_SIZE * (config.k_dim() + config.v_dim());
        let per_layer = dtype.bytes(values as u64).map_or(usize::MAX, |b| b as usize);
        let swa = config.layer_is_swa.iter().filter(|&&s| s).count();
        ((config.n_layer - swa) * per_layer, swa * per_layer)
    }

    /// Number of layer groups (one block table each).
    pub fn n_groups(&self) -> usize {
        self.groups.len()
    }

    /// The sliding window of group `g`'s layers, if they have one.
    pub fn group_window(&self, g: usize) -> Option<usize> {
        self.groups[g].window
    }

    /// Blocks in group `g`.
    pub fn blocks_total(&self, g: usize) -> usize {
        self.groups[g].n_blocks
    }

    /// Blocks of group `g` that nobody holds.
    pub fn blocks_free(&self, g: usize) -> usize {
        self.groups[g].free.len()
    }

    /// Blocks of group `g` that more than one holder shares (sequences, forks, the prefix cache).
    pub fn blocks_shared(&self, g: usize) -> usize {
        self.groups[g].refs.iter().filter(|&&r| r > 1).count()
    }

    /// How many holders block `b` of group `g` has.
    pub fn refcount(&self, g: usize, b: u32) -> u32 {
        self.groups[g].refs[b as usize]
    }

    /// Positions that fit in the full-attention layers' blocks.
    pub fn capacity(&self) -> usize {
        self.groups.iter().filter(|g| g.window.is_none()).map(|g| g.n_blocks).min().unwrap_or(0) * self.block_size
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

    /// Free blocks each group needs for [`reserve`](Self::reserve)`(seq, n)` to succeed: new blocks past the end
    /// of the table, plus one for a copy if the block the next position goes to is shared.
    pub fn blocks_needed(&self, seq: &SeqKv, n: usize) -> GroupCounts {
        let mut out = [0; MAX_GROUPS];
        let blocks = (seq.len + n).div_ceil(self.block_size);
        for (gi, g) in self.groups.iter().enumerate() {
            let table = seq.tables.get(gi).map_or(&[][..], Vec::as_slice);
            let shared = n > 0 && self.shared_at(g, table, seq.len).is_some();
            out[gi] = blocks.saturating_sub(table.len()) + usize::from(shared);
        }
        out
    }

    /// The block position `pos` goes to, if the table has it and someone else holds it too.
    fn shared_at(&self, g: &LayerGroup, table: &[Option<u32>], pos: usize) -> Option<(usize, u32)> {
        let i = pos / self.block_size;
        table.get(i).copied().flatten().filter(|&b| g.refs[b as usize] > 1).map(|b| (i, b))
    }

    /// Makes room for positions `seq.len() .. seq.len() + n` in every group, allocating blocks as needed. If the
    /// block the next position goes to is shared (a prefix another sequence or the prefix cache also holds), the
    /// sequence first gets a private copy of it, so the others never see its writes.
    pub fn reserve(&mut self, seq: &mut SeqKv, n: usize) -> Result<(), KvError> {
        if seq.tables.len() < self.groups.len() {
            seq.tables.resize(self.groups.len(), Vec::new());
        }
        // Check every group first so that a failure allocates nothing.
        let needed = self.blocks_needed(seq, n);
        for (g, &needed) in self.groups.iter().zip(&needed) {
            if needed > g.free.len() {
                return Err(KvError::OutOfBlocks { needed, free: g.free.len(), block_size: self.block_size });
            }
        }
        let blocks = (seq.len + n).div_ceil(self.block_size);
        let bs = self.block_size;
        for gi in 0..self.groups.len() {
            let table = &mut seq.tables[gi];
            if n > 0
                && let Some((i, shared)) = self.shared_at(&self.groups[gi], table, seq.len)
            {
                let g = &mut self.groups[gi];
                // The copy goes right after the block before it, where that is free.
                let before = i.checked_sub(1).and_then(|j| table[j]);
                let own = g.take(before, 1).expect("checked above");
                g.copy_block(shared, own, bs);
                g.release(shared);
                table[i] = Some(own);
            }
            let g = &mut self.groups[gi];
            while table.len() < blocks {
                let last = table.last().copied().flatten();
                let b = g.take(last, blocks - table.len()).expect("checked above");
                table.push(Some(b));
            }
        }
        Ok(())
    }

    /// The blocks at block index `i` of `seq` (`None` in groups where the table has no block there).
    pub fn block_ref(&self, seq: &SeqKv, i: usize) -> BlockRef {
        let mut r = BlockRef::default();
        for (gi, table) in seq.tables.iter().enumerate() {
            r.ids[gi] = table.get(i).copied().flatten();
        }
        r
    }

    /// Adds a holder to every block of `r`.
    pub fn retain(&mut self, r: &BlockRef) {
        for (g, id) in self.groups.iter_mut().zip(r.ids) {
            if let Some(b) = id {
                g.retain(b);
            }
        }
    }

    /// Drops a hold on every block of `r`.
    pub fn release_ref(&mut self, r: &BlockRef) {
        for (g, id) in self.groups.iter_mut().zip(r.ids) {
            if let Some(b) = id {
                g.release(b);
            }
        }
    }

    /// Makes the empty sequence `seq` start with `len` cached positions held in `blocks` (block `i` of the
    /// sequence = `blocks[i]`; `len` must lie in the last one), adding a holder to each block it keeps. In
    /// sliding-window groups only the blocks the next position can still see are kept, and those must be present.
    pub fn adopt(&mut self, seq: &mut SeqKv, blocks: &[BlockRef], len: usize) {
        assert!(seq.len == 0 && seq.tables.iter().all(Vec::is_empty), "adopting blocks into a non-empty sequence");
        assert!(len.div_ceil(self.block_size) == blocks.len(), "{len} positions in {} blocks", blocks.len());
        seq.tables.resize(self.groups.len(), Vec::new());
        for (gi, g) in self.groups.iter_mut().enumerate() {
            let first_visible = g.window.map_or(0, |w| (len + 1).saturating_sub(w + g.rewind) / self.block_size);
            for (i, r) in blocks.iter().enumerate() {
                let id = if i < first_visible { None } else { r.ids[gi] };
                assert!(i < first_visible || id.is_some(), "block {i} of group {gi} is missing");
                if let Some(b) = id {
                    g.retain(b);
                }
                seq.tables[gi].push(id);
            }
        }
        seq.len = len;
    }

    /// A second sequence over the same positions as `seq`, holding every one of its blocks once more (vLLM's fork
    /// for parallel sampling): nothing is copied now; whichever of the two writes next into a block they share gets
    /// its own copy of it then ([`reserve`](Self::reserve)), so a prompt computed once serves several continuations.
    pub fn fork(&mut self, seq: &SeqKv) -> SeqKv {
        for (g, table) in self.groups.iter_mut().zip(&seq.tables) {
            for &b in table.iter().flatten() {
                g.retain(b);
            }
        }
        seq.clone()
    }

    /// Checks the reference counts against the holders the caller knows of: every block's count must equal the
    /// number of times it appears in `seqs`' tables and in `extra`, and the free list must hold exactly the blocks
    /// with no holder, once each. For tests and debugging; describes the first discrepancy.
    pub fn audit<'a>(
        &self,
        seqs: impl IntoIterator<Item = &'a SeqKv>,
        extra: impl IntoIterator<Item = &'a BlockRef>,
    ) -> Result<(), String> {
        let mut counts: Vec<Vec<u32>> = self.groups.iter().map(|g| vec![0; g.n_blocks]).collect();
        for seq in seqs {
            for (gi, table) in seq.tables.iter().enumerate() {
                for b in table.iter().flatten() {
                    counts[gi][*b as usize] += 1;
                }
            }
        }
        for r in extra {
            for (gi, id) in r.ids.iter().enumerate().take(self.groups.len()) {
                if let Some(b) = id {
                    counts[gi][*b as usize] += 1;
                }
            }
        }
        for (gi, (g, want)) in self.groups.iter().zip(&counts).enumerate() {
            if let Some(b) = (0..g.n_blocks).find(|&b| g.refs[b] != want[b]) {
                return Err(format!("group {gi} block {b}: reference count {}, but {} holders", g.refs[b], want[b]));
            }
            let mut on_free = vec![false; g.n_blocks];
            let mut marked = 0;
            for b in g.free.iter() {
                on_free[b] = true;
                marked += 1;
            }
            if marked != g.free.len() {
                return Err(format!("group {gi}: {} free blocks counted, {marked} marked", g.free.len()));
            }
            if let Some(b) = (0..g.n_blocks).find(|&b| on_free[b] != (want[b] == 0)) {
                return Err(format!("group {gi} block {b}: {} holders, on the free list: {}", want[b], on_free[b]));
            }
        }
        Ok(())
    }

    /// Records that `n` positions were written (after a forward pass) and frees sliding-window blocks that no
    /// future query can see.
    pub fn advance(&mut self, seq: &mut SeqKv, n: usize) {
        seq.len += n;
        if !seq.keep_passed {
            self.release_passed(seq);
        }
    }

    /// Frees the sequence's sliding-window blocks that no future query can see (done by [`advance`](Self::advance)
    /// unless the sequence keeps them).
    pub fn release_passed(&mut self, seq: &mut SeqKv) {
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            let Some(window) = g.window else { continue };
            // The next query sits at position `len` and sees positions > len - window; `rewind` more are kept.
            let first_kept = (seq.len + 1).saturating_sub(window + g.rewind);
            let dead_blocks = first_kept / self.block_size;
            for b in table.iter_mut().take(dead_blocks).filter_map(Option::take) {
                g.release(b);
            }
        }
    }

    /// Drops the sequence's hold on all its blocks (those nobody else holds return to the pool) and empties it.
    pub fn release(&mut self, seq: &mut SeqKv) {
        for (g, table) in self.groups.iter_mut().zip(&mut seq.tables) {
            for b in table.drain(..).flatten() {
                g.release(b);
            }
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
                for b in table.drain(keep..).flatten() {
                    g.release(b);
                }
            }
        }
        seq.len = new_len;
    }

    /// Where position `pos` of `layer` lives: (group, tile index = block · layers in group + slot, lane).
    fn locate(&self, seq: &SeqKv, layer: usize, pos: usize) -> (usize, usize, usize) {
        let (gi, slot) = self.layer_slot[layer];
        let block = seq.tables[gi][pos / self.block_size].expect("position within the live window");
        (gi, slot * self.groups[gi].n_blocks + block as usize, pos % self.block_size)
    }

    /// Stores the key and value rows of position `pos` (reserved beforehand) for `layer`.
    pub fn write(&mut self, seq: &SeqKv, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (tile, lane) = self.tile_of(seq, layer, pos);
        let (bs, (kn, vn), vh) = (self.block_size, self.tile_sizes(layer), self.v_head(layer));
        match self.tiles_mut(layer) {
            TilesMut::F32 { k: kt, v: vt } => {
                f32::store(&mut kt[tile * kn..][..kn], &mut vt[tile * vn..][..vn], lane, bs, k, v, vh)
            }
            TilesMut::F16 { k: kt, v: vt } => {
                f16::store(&mut kt[tile * kn..][..kn], &mut vt[tile * vn..][..vn], lane, bs, k, v, vh)
            }
            TilesMut::Q8 { k: kq, kd, v: vq, vd } => {
                let (kb, vb) = (kn / Q8_BLOCK, vn / Q8_BLOCK);
                let tiles = Q8Tiles {
                    kq: &mut kq[tile * kn..][..kn],
                    kd: &mut kd[tile * kb..][..kb],
                    vq: &mut vq[tile * vn..][..vn],
                    vd: &mut vd[tile * vb..][..vb],
                };
                tiles.store(lane, bs, k, v, vh)
            }
        }
    }

    /// The tile (index into [`KvPool::tiles_mut`]'s tiles for `layer`) and lane of position `pos` (reserved).
    pub fn tile_of(&self, seq: &SeqKv, layer: usize, pos: usize) -> (usize, usize) {
        let (_, tile, lane) = self.locate(seq, layer, pos);
        (tile, lane)
    }

    /// Values per key head in `layer`'s value tiles (see [`KvElem::store`]).
    pub fn v_head(&self, layer: usize) -> usize {
        self.groups[self.layer_slot[layer].0].v_head
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
            (KvStore::Q8 { q: k, d: kd }, KvStore::Q8 { q: v, d: vd }) => TilesMut::Q8 { k, kd, v, vd },
            _ => unreachable!("keys and values of a group share one dtype"),
        }
    }

    /// The block holding position `pos` of `layer`: its whole key tile (`k_row × block_size`, transposed) and
    /// value tile (per key head `block_size × head_dim_v`, see [`KvElem::store`]), and the position's lane in
    /// them. Lanes the sequence has not written hold
    /// stale values; callers read only the lanes of their positions.
    pub fn block(&self, seq: &SeqKv, layer: usize, pos: usize) -> (KvRow<'_>, KvRow<'_>, usize) {
        let (gi, tile, lane) = self.locate(seq, layer, pos);
        let g = &self.groups[gi];
        let bs = self.block_size;
        (g.k.slice(tile * bs * g.k_row, bs * g.k_row), g.v.slice(tile * bs * g.v_row, bs * g.v_row), lane)
    }

    /// Asks the CPU to fetch (into L2) part of the block holding position `pos` of `layer`: key rows `keys` of its
    /// transposed key tile and value columns `values` (whole key heads) of its value tile: one key head's share.
    /// A sequence's blocks need not follow one another in the pool (freed and shared blocks), where the hardware
    /// prefetcher does not follow, so attention asks for the blocks it will read next.
    pub fn prefetch(&self, seq: &SeqKv, layer: usize, pos: usize, keys: Range<usize>, values: Range<usize>) {
        let (k, v, _) = self.block(seq, layer, pos);
        let bs = self.block_size;
        debug_assert!(values.start.is_multiple_of(self.v_head(layer)) && values.end.is_multiple_of(self.v_head(layer)));
        k.prefetch(keys.start * bs..keys.end * bs);
        v.prefetch(values.start * bs..values.end * bs);
    }

    /// Whether the block holding position `pos` of `layer` lies right after the one holding `pos - block_size`
    /// in the pool (their tiles adjacent in both stores), so that reading on from the earlier block's end reads it.
    pub fn follows(&self, seq: &SeqKv, layer: usize, pos: usize) -> bool {
        pos >= self.block_size && {
            let (_, a, _) = self.locate(seq, layer, pos - self.block_size);
            let (_, b, _) = self.locate(seq, layer, pos);
            b == a + 1
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

    /// One position's key goes down exactly its lane of the transposed tile and each head's share of its value
    /// into that head's row of the value tile, at any key width (including more than one conversion run of 64),
    /// and nothing else is touched.
    fn check_store<T: KvElem + PartialEq + std::fmt::Debug>(zero: T, from: impl Fn(f32) -> T) {
        const BS: usize = 16;
        // Three value heads of two.
        const V: usize = 6;
        const VH: usize = 2;
        for k_len in [1, 63, 64, 65, 192, 200] {
            for lane in [0, 7, BS - 1] {
                let k: Vec<f32> = (0..k_len).map(|i| 1.0 + i as f32).collect();
                let v: Vec<f32> = (0..V).map(|i| -1.0 - i as f32).collect();
                let mut k_tile = vec![zero; k_len * BS];
                let mut v_tile = vec![zero; V * BS];
                T::store(&mut k_tile, &mut v_tile, lane, BS, &k, &v, VH);
                for (i, x) in k_tile.iter().enumerate() {
                    let want = if i % BS == lane { from(k[i / BS]) } else { zero };
                    assert_eq!(*x, want, "k_len {k_len} lane {lane} key element {i}");
                }
                for (i, x) in v_tile.iter().enumerate() {
                    let (head, row, col) = (i / (BS * VH), i % (BS * VH) / VH, i % VH);
                    let want = if row == lane { from(v[head * VH + col]) } else { zero };
                    assert_eq!(*x, want, "lane {lane} value element {i}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "do not fit tiles")]
    fn store_rejects_a_key_wider_than_its_tile() {
        let (mut k_tile, mut v_tile) = (vec![0f32; 4 * 16], vec![0f32; 2 * 16]);
        f32::store(&mut k_tile, &mut v_tile, 0, 16, &[1.0; 5], &[1.0; 2], 2);
    }

    #[test]
    fn store_writes_one_lane_and_one_row() {
        check_store(0f32, |x| x);
        check_store(f16::ZERO, f16::from_f32);
    }

    /// The 8-bit cache: a key of two blocks goes down its lane (each block's scale, max |x| / 127, into its row of
    /// lane scales), each value head's block into its row, every value within half a step of what was stored, and
    /// no other lane touched.
    #[test]
    fn q8_store_writes_one_lane_and_one_row_of_blocks() {
        const BS: usize = 16;
        const VH: usize = 32;
        let k: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * if i < 32 { 1.0 } else { 50.0 }).collect();
        let v: Vec<f32> = (0..2 * VH).map(|i| (i as f32 * 0.11).cos() - 0.5).collect();
        for lane in [0, 5, BS - 1] {
            let (mut kq, mut kd) = (vec![0i8; k.len() * BS], vec![0f32; k.len() * BS / Q8_BLOCK]);
            let (mut vq, mut vd) = (vec![0i8; v.len() * BS], vec![0f32; v.len() * BS / Q8_BLOCK]);
            Q8Tiles { kq: &mut kq, kd: &mut kd, vq: &mut vq, vd: &mut vd }.store(lane, BS, &k, &v, VH);
            let mut buf = vec![f32::NAN; k.len() * BS];
            let keys = KvRow::Q8 { q: &kq, d: &kd }.as_f32(0..k.len() * BS, BS, &mut buf).to_vec();
            for (i, &x) in keys.iter().enumerate() {
                let (row, j) = (i / BS, i % BS);
                if j != lane {
                    assert_eq!(x, 0.0, "lane {lane}: key element {i} of another lane");
                    continue;
                }
                let step = kd[row / Q8_BLOCK * BS + lane];
                let amax = k[row / Q8_BLOCK * Q8_BLOCK..][..Q8_BLOCK].iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!((step - amax / 127.0).abs() <= f32::EPSILON * amax, "lane {lane} block scale");
                assert!((x - k[row]).abs() <= 0.5 * step * 1.0001, "lane {lane} key {row}: {x} for {}", k[row]);
            }
            let mut buf = vec![f32::NAN; v.len() * BS];
            let values = KvRow::Q8 { q: &vq, d: &vd }.as_f32(0..v.len() * BS, 1, &mut buf).to_vec();
            for (i, &x) in values.iter().enumerate() {
                let (head, row, col) = (i / (BS * VH), i % (BS * VH) / VH, i % VH);
                if row != lane {
                    assert_eq!(x, 0.0, "lane {lane}: value element {i} of another row");
                    continue;
                }
                let want = v[head * VH + col];
                assert!((x - want).abs() <= 0.5 * vd[i / Q8_BLOCK] * 1.0001, "lane {lane} value {i}: {x} for {want}");
            }
        }
        // A block of zeros gets scale 0 and stays exactly zero.
        let (mut kq, mut kd) = (vec![1i8; 32 * BS], vec![1f32; BS]);
        let (mut vq, mut vd) = (vec![1i8; 32 * BS], vec![1f32; BS]);
        Q8Tiles { kq: &mut kq, kd: &mut kd, vq: &mut vq, vd: &mut vd }.store(3, BS, &[0.0; 32], &[0.0; 32], 32);
        assert_eq!((kd[3], kq[3], vd[3], vq[3 * 32]), (0.0, 0, 0.0, 0));
    }
}
