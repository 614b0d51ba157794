//! The KV pool's reference counts: sequences share blocks, a shared partly filled block is copied before it is
//! written (copy-on-write), and every hold is given back.

use std::sync::Arc;

use infer::gguf::GgufFile;
use infer::kernels::GgmlType;
use infer::model::kv_cache::BlockRef;
use infer::model::{ForwardScratch, KvDtype, KvPool, Logits, Model, SeqKv, SeqStep};

use crate::synthetic::{Rng, Spec, build};

fn load(spec: Spec) -> Model {
    Model::from_file(Arc::new(GgufFile::from_bytes(build(spec, 7).to_bytes().unwrap()).unwrap())).unwrap()
}

fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() % n_vocab as u64) as u32).collect()
}

/// Runs `tokens` through `kv` in one call and returns the last position's logits.
fn feed(model: &Model, pool: &mut KvPool, kv: &mut SeqKv, tokens: &[u32], s: &mut ForwardScratch) -> Vec<f32> {
    let mut items = [SeqStep { tokens, kv, logits: Logits::Last }];
    model.forward(&mut items, pool, s).unwrap();
    s.logits(0, model.config.n_vocab).to_vec()
}

/// The block starts among `positions` (stepping by the block size) where, in any of `layers`, the block does not
/// lie right after the one before it in the pool ([`KvPool::follows`]).
fn breaks(pool: &KvPool, kv: &SeqKv, layers: &[usize], positions: std::ops::Range<usize>) -> Vec<usize> {
    positions.step_by(pool.block_size).filter(|&pos| layers.iter().any(|&l| !pool.follows(kv, l, pos))).collect()
}

/// Two sequences share a 20-position prefix (one full block and a partly filled one), then each writes a different
/// token at position 20: the second writer must not see the first one's key and value, so both get exactly the
/// logits of an unshared run, and the blocks' holders add up at every stage.
#[test]
fn a_shared_partial_block_is_copied_before_it_is_written() {
    // The gemma spec's heads (32) also fit the 8-bit cache, whose copies carry the scales along.
    for (spec, dtype) in [
        (Spec::llama(GgmlType::Q8_0), KvDtype::F32),
        (Spec::gemma(GgmlType::Q8_0), KvDtype::F32),
        (Spec::gemma(GgmlType::Q8_0), KvDtype::Q8_0),
    ] {
        let model = load(spec);
        let c = &model.config;
        let mut s = ForwardScratch::new(&model);
        let prefix = tokens(20, spec.n_vocab, 1);
        let (x, y) = (5u32, 9u32);
        let alone = |next: u32| {
            let mut pool = KvPool::new(c, dtype, 64, 64);
            let mut kv = SeqKv::new();
            let mut s = ForwardScratch::new(&model);
            feed(&model, &mut pool, &mut kv, &prefix, &mut s);
            feed(&model, &mut pool, &mut kv, &[next], &mut s)
        };
        let (want_x, want_y) = (alone(x), alone(y));
        assert_ne!(want_x, want_y);

        let mut pool = KvPool::new(c, dtype, 64, 64);
        let (mut a, mut b) = (SeqKv::new(), SeqKv::new());
        feed(&model, &mut pool, &mut a, &prefix, &mut s);
        let shared: Vec<BlockRef> = (0..2).map(|i| pool.block_ref(&a, i)).collect();
        pool.adopt(&mut b, &shared, prefix.len());
        pool.audit([&a, &b], []).unwrap();
        let used = |pool: &KvPool| (0..pool.n_groups()).map(|g| pool.blocks_total(g) - pool.blocks_free(g)).sum();
        let before: usize = used(&pool);
        // B writes first: it copies the shared block; A then owns the original alone and writes in place.
        assert_eq!(pool.blocks_needed(&b, 1).iter().sum::<usize>(), pool.n_groups());
        let got_x = feed(&model, &mut pool, &mut b, &[x], &mut s);
        assert_eq!(used(&pool), before + pool.n_groups(), "one copy per layer group");
        assert_eq!(pool.blocks_needed(&a, 1), [0, 0]);
        let got_y = feed(&model, &mut pool, &mut a, &[y], &mut s);
        assert_eq!(got_x, want_x, "{:?}: the sequence that copied", c.arch);
        assert_eq!(got_y, want_y, "{:?}: the sequence that kept the original", c.arch);
        pool.audit([&a, &b], []).unwrap();
        // An extra hold (as the prefix cache keeps) outlives both sequences, then everything is free again.
        let kept = pool.block_ref(&a, 0);
        pool.retain(&kept);
        pool.release(&mut a);
        pool.release(&mut b);
        pool.audit([], [&kept]).unwrap();
        pool.release_ref(&kept);
        pool.audit([], []).unwrap();
        for g in 0..pool.n_groups() {
            assert_eq!(pool.blocks_free(g), pool.blocks_total(g));
        }
    }
}

/// The audit notices a hold nobody accounts for.
#[test]
fn the_audit_catches_a_leaked_hold() {
    let model = load(Spec::llama(GgmlType::Q8_0));
    let mut pool = KvPool::new(&model.config, KvDtype::F16, 64, 64);
    let mut kv = SeqKv::new();
    let mut s = ForwardScratch::new(&model);
    feed(&model, &mut pool, &mut kv, &[1, 2, 3], &mut s);
    let r = pool.block_ref(&kv, 0);
    pool.retain(&r);
    let err = pool.audit([&kv], []).unwrap_err();
    assert!(err.contains("reference count 2, but 1 holders"), "{err}");
    pool.release_ref(&r);
    pool.release(&mut kv);
    pool.audit([], []).unwrap();
}

/// Each layer's tiles of a sequence follow one another in the pool (decode reads them as one run, which the
/// hardware prefetcher follows), also for the sequences after one that was released or truncated: when free blocks
/// were a stack, blocks given back first to last came out in reverse order for the next sequence, and at 4,096
/// cached positions every other benchmark repetition then decoded ~35% slower.
#[test]
fn blocks_come_back_in_the_order_they_were_taken() {
    let spec = Spec::llama(GgmlType::Q8_0);
    let model = load(spec);
    let c = &model.config;
    let mut s = ForwardScratch::new(&model);
    let mut pool = KvPool::new(c, KvDtype::F32, 256, 256);
    let layers: Vec<usize> = (0..c.n_layer).collect();
    let one_run = |pool: &KvPool, kv: &SeqKv, len: usize| {
        let b = breaks(pool, kv, &layers, pool.block_size..len);
        assert!(b.is_empty(), "the blocks of positions {b:?} do not follow the one before");
    };
    let prompt = tokens(200, spec.n_vocab, 3);
    for round in 0..3 {
        let mut kv = SeqKv::new();
        feed(&model, &mut pool, &mut kv, &prompt, &mut s);
        one_run(&pool, &kv, 200);
        // Back to 50 positions (as a chat rewind does) and on again: still one run.
        pool.truncate(&mut kv, 50);
        feed(&model, &mut pool, &mut kv, &prompt[50..], &mut s);
        one_run(&pool, &kv, 200);
        pool.release(&mut kv);
        pool.audit([], []).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
}

/// The same for a sliding-window group, whose blocks go back as the window passes them: a long prompt's window
/// passes many at once, and the blocks the sequence takes next must follow one another, not run backwards through
/// the ones just given back.
#[test]
fn blocks_a_window_passed_come_back_in_order() {
    let spec = Spec { sliding_window: 64, ..Spec::gemma(GgmlType::Q8_0) };
    let model = load(spec);
    let c = &model.config;
    let mut s = ForwardScratch::new(&model);
    let mut pool = KvPool::new(c, KvDtype::F32, 512, 512);
    let windowed: Vec<usize> = (0..c.n_layer).filter(|&l| pool.window(l).is_some()).collect();
    assert!(!windowed.is_empty(), "the spec has sliding-window layers");
    let mut kv = SeqKv::new();
    // 200 positions: the window (64) has passed blocks 0..8 of the table, given back together.
    feed(&model, &mut pool, &mut kv, &tokens(200, spec.n_vocab, 4), &mut s);
    // 100 more take 6 new blocks at once; the window then starts at position 237 (block 14 of the table).
    feed(&model, &mut pool, &mut kv, &tokens(100, spec.n_vocab, 5), &mut s);
    let b = breaks(&pool, &kv, &windowed, 240..300);
    assert!(b.is_empty(), "the blocks of positions {b:?} do not follow the one before");
    pool.release(&mut kv);
    pool.audit([], []).unwrap();
}

/// Sequences that grow side by side, a token each per step as the serving engine decodes them, each keep their
/// blocks in one ascending run: with a free list (a stack) they took turns and every block of each lay a few
/// blocks past the previous one, a scattered layout on which decode at 4,096 positions ran ~35% slower. After
/// some finish and others of different lengths take their place, each sequence still breaks its run at most
/// once (where it grew into a neighbour and started again in the longest free run).
#[test]
fn sequences_decoding_side_by_side_keep_their_blocks_in_runs() {
    let spec = Spec::llama(GgmlType::Q8_0);
    let model = load(spec);
    let c = &model.config;
    let mut pool = KvPool::new(c, KvDtype::F16, 8192, 8192);
    let layers: Vec<usize> = (0..c.n_layer).collect();
    // The blocks of `kv` that do not follow the one before, in any layer.
    let broken = |pool: &KvPool, kv: &SeqKv| breaks(pool, kv, &layers, pool.block_size..kv.len()).len();
    let grow = |pool: &mut KvPool, kv: &mut SeqKv, n: usize| {
        pool.reserve(kv, n).unwrap();
        pool.advance(kv, n);
    };
    let mut seqs: Vec<SeqKv> = Vec::new();
    for prompt in [40, 7, 100, 33] {
        let mut kv = SeqKv::new();
        grow(&mut pool, &mut kv, prompt);
        seqs.push(kv);
    }
    for _ in 0..600 {
        for kv in &mut seqs {
            grow(&mut pool, kv, 1);
        }
    }
    for (i, kv) in seqs.iter().enumerate() {
        assert_eq!(broken(&pool, kv), 0, "sequence {i} ({} positions)", kv.len());
    }
    // Two finish; two new ones of other lengths start while the others go on.
    for i in [2, 0] {
        let mut kv = seqs.remove(i);
        pool.release(&mut kv);
    }
    for prompt in [300, 5] {
        let mut kv = SeqKv::new();
        grow(&mut pool, &mut kv, prompt);
        seqs.push(kv);
    }
    for _ in 0..700 {
        for kv in &mut seqs {
            grow(&mut pool, kv, 1);
        }
    }
    for (i, kv) in seqs.iter().enumerate() {
        assert!(broken(&pool, kv) <= 1, "sequence {i} ({} positions): {} breaks", kv.len(), broken(&pool, kv));
    }
    for kv in &mut seqs {
        pool.release(kv);
    }
    pool.audit([], []).unwrap();
}

/// A fork holds every block of its parent once more (sliding-window groups included) and costs no block until one
/// of the two writes into the block they share; then each continues exactly as an unshared run would, and dropping
/// both gives every block back.
#[test]
fn a_fork_shares_every_block_until_one_side_writes() {
    for spec in [Spec::llama(GgmlType::Q8_0), Spec::gemma(GgmlType::Q8_0)] {
        let model = load(spec);
        let c = &model.config;
        let mut s = ForwardScratch::new(&model);
        // 37 positions: two full blocks and a partly filled third; in the gemma spec's sliding-window layers (8
        // positions) the first blocks have already left the window, so the fork copies their empty table slots.
        let prompt = tokens(37, spec.n_vocab, 3);
        let alone = |next: u32| {
            let mut pool = KvPool::new(c, KvDtype::F16, 128, 128);
            let mut kv = SeqKv::new();
            let mut s = ForwardScratch::new(&model);
            feed(&model, &mut pool, &mut kv, &prompt, &mut s);
            feed(&model, &mut pool, &mut kv, &[next], &mut s)
        };
        let mut pool = KvPool::new(c, KvDtype::F16, 128, 128);
        let mut parent = SeqKv::new();
        feed(&model, &mut pool, &mut parent, &prompt, &mut s);
        let free_before: Vec<usize> = (0..pool.n_groups()).map(|g| pool.blocks_free(g)).collect();
        let mut child = pool.fork(&parent);
        assert_eq!(child.len(), parent.len());
        let free_after: Vec<usize> = (0..pool.n_groups()).map(|g| pool.blocks_free(g)).collect();
        assert_eq!(free_before, free_after, "a fork takes no block");
        pool.audit([&parent, &child], []).unwrap();
        let got_child = feed(&model, &mut pool, &mut child, &[11], &mut s);
        let got_parent = feed(&model, &mut pool, &mut parent, &[4], &mut s);
        assert_eq!(got_child, alone(11), "the fork continues as an unshared run");
        assert_eq!(got_parent, alone(4), "the parent does not see the fork's write");
        pool.audit([&parent, &child], []).unwrap();
        pool.release(&mut parent);
        pool.release(&mut child);
        pool.audit([], []).unwrap();
        for g in 0..pool.n_groups() {
            assert_eq!(pool.blocks_free(g), pool.blocks_total(g), "group {g}: every block is back");
        }
    }
}
