//! The serving engine on tiny synthetic models (and once on SmolLM2): batch invariance (alone, with fifteen others,
//! sharing a cached prefix, through preemption), a block allocator that leaks nothing, chunked prefill that keeps
//! everyone's tokens coming, stop strings and cancellation.

use std::sync::Arc;

use infer::engine::{
    Completion, Engine, EngineConfig, Event, FinishReason, KvBudget, OutputFormat, PREFILL_MIN, PREFILL_PER_DECODE,
    Request, RequestError, RequestStream, Scheduler,
};
use infer::gguf::GgufFile;
use infer::kernels::GgmlType;
use infer::model::{KvDtype, Model};
use infer::sampling::SamplingParams;
use infer::session::{GenerateRequest, Session};
use infer::tokenizer::Tokenizer;

use crate::synthetic::{Rng, Spec, build};

pub fn load(spec: Spec) -> (Model, Tokenizer) {
    let model = Model::from_file(Arc::new(GgufFile::from_bytes(build(spec, 7).to_bytes().unwrap()).unwrap())).unwrap();
    let tokenizer = Tokenizer::from_gguf(model.file()).unwrap();
    (model, tokenizer)
}

/// Random ids among the synthetic vocabulary's byte tokens (3..259), so they decode to text.
fn tokens(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 3 + (rng.next_u64() % 256) as u32).collect()
}

pub fn config() -> EngineConfig {
    EngineConfig {
        n_ctx: 512,
        max_seqs: 16,
        max_batch_tokens: 64,
        max_queue: 10_000,
        kv: KvBudget::Blocks(256),
        kv_dtype: KvDtype::F16,
        prefix_cache: true,
        threads: 2,
    }
}

pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        sampling: SamplingParams::GREEDY,
        stop: Vec::new(),
        ignore_eos: true,
        logprobs: true,
        top_logprobs: 0,
        format: OutputFormat::Text,
        logit_bias: Default::default(),
        dry_breakers: None,
    }
}

/// The tokens a session generates from `prompt` with `sampling` (and DRY's `breakers`), `max_tokens` of them, the
/// end of text ignored: the reference the engine's draws are compared with.
pub fn session_tokens(
    session: &mut Session,
    prompt: &[u32],
    max_tokens: usize,
    sampling: SamplingParams,
    dry_breakers: Option<Vec<String>>,
) -> Vec<u32> {
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling,
        stop: Vec::new(),
        ignore_eos: true,
        format: OutputFormat::Text,
        logit_bias: Default::default(),
        dry_breakers,
        draft: infer::speculative::DraftParams::OFF,
    };
    session.reset();
    session.generate(&req, &std::sync::atomic::AtomicBool::new(false), &mut |_| Ok(())).unwrap().tokens
}

/// Runs `reqs` through one scheduler, submitted together, stepping until all are done; audits the pool after
/// every step.
pub fn run_all(model: &Model, tok: &Tokenizer, cfg: EngineConfig, reqs: &[Request]) -> (Vec<Completion>, u64) {
    let mut sched = Scheduler::new(model, tok, cfg).unwrap();
    let streams: Vec<RequestStream> = reqs.iter().map(|r| sched.submit(r.clone()).unwrap()).collect();
    while !sched.is_idle() {
        sched.step();
        sched.audit().unwrap();
    }
    let preemptions = sched.stats().preemptions;
    (streams.into_iter().map(|s| s.collect().unwrap()).collect(), preemptions)
}

/// Each request alone in its own engine.
fn alone(model: &Model, tok: &Tokenizer, reqs: &[Request]) -> Vec<Completion> {
    reqs.iter()
        .map(|r| {
            run_all(model, tok, EngineConfig { prefix_cache: false, ..config() }, std::slice::from_ref(r)).0.remove(0)
        })
        .collect()
}

/// Sixteen requests whose prompts share a 40-token prefix (more than two blocks) and end differently.
fn sixteen(rng: &mut Rng) -> Vec<Request> {
    let shared = tokens(rng, 40);
    (0..16)
        .map(|i| {
            let mut p = if i % 4 == 3 { Vec::new() } else { shared.clone() };
            let n = 3 + (rng.next_u64() % 30) as usize;
            p.extend(tokens(rng, n));
            greedy(p, 10 + i % 7)
        })
        .collect()
}

fn assert_same(what: &str, want: &[Completion], got: &[Completion]) {
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.tokens, g.tokens, "{what}: request {i}'s tokens differ");
        // Log-probabilities bit for bit: the whole distribution, not only its top token, is unchanged.
        let bits = |c: &Completion| c.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(w), bits(g), "{what}: request {i}'s log-probabilities differ");
        assert_eq!(w.text, g.text, "{what}: request {i}'s text differs");
    }
}

#[test]
fn greedy_tokens_are_the_same_alone_batched_shared_and_preempted() {
    for spec in [Spec::llama(GgmlType::Q4_1), Spec::gemma(GgmlType::Q8_0)] {
        let (model, tok) = load(spec);
        let reqs = sixteen(&mut Rng::new(5));
        let want = alone(&model, &tok, &reqs);
        for w in &want {
            let done = w.done.as_ref().unwrap();
            assert_eq!(done.finish, FinishReason::Length);
            assert!(!w.tokens.is_empty());
        }
        // Together, without and with the prefix cache.
        let (got, _) = run_all(&model, &tok, EngineConfig { prefix_cache: false, ..config() }, &reqs);
        assert_same("16 at once", &want, &got);
        let (got, _) = run_all(&model, &tok, config(), &reqs);
        assert_same("16 at once sharing a prefix", &want, &got);
        let cached: usize = got.iter().map(|c| c.done.as_ref().unwrap().usage.cached_tokens).sum();
        assert!(cached >= 11 * 32, "{:?}: only {cached} prompt tokens came from the cache", model.config.arch);
        // A pool of six blocks holds the longest request (88 positions) alone, but not two at once: requests are
        // preempted and recomputed.
        for prefix_cache in [false, true] {
            let cfg = EngineConfig { kv: KvBudget::Blocks(6), prefix_cache, ..config() };
            let (got, preemptions) = run_all(&model, &tok, cfg, &reqs);
            assert!(preemptions > 0, "a 6-block pool should preempt");
            assert_same(&format!("6-block pool (prefix cache {prefix_cache})"), &want, &got);
        }
    }
}

/// The engine's greedy text equals a single-sequence session's, stop strings and UTF-8 included (the synthetic
/// vocabulary's tokens are single bytes, so characters span tokens).
#[test]
fn text_and_stop_strings_match_a_session() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let mut rng = Rng::new(9);
    let prompt = tokens(&mut rng, 24);
    let mut session = Session::new(&model, &tok, 512, KvDtype::F16);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let mut generate = |stop: Vec<String>| {
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 40,
            sampling: SamplingParams::GREEDY,
            stop,
            ignore_eos: true,
            format: OutputFormat::Text,
            logit_bias: Default::default(),
            dry_breakers: None,
            draft: infer::speculative::DraftParams::OFF,
        };
        session.reset();
        session.generate(&req, &cancel, &mut |_| Ok(())).unwrap()
    };
    let plain = generate(Vec::new());
    let chars: Vec<char> = plain.text.chars().collect();
    assert!(chars.len() > 8, "{:?}", plain.text);
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let stopped = generate(vec![stop.clone()]);
    assert!(stopped.text.len() < plain.text.len());
    for (stops, want) in [(Vec::new(), &plain), (vec![stop], &stopped)] {
        let req = Request { stop: stops, ..greedy(prompt.clone(), 40) };
        let (got, _) = run_all(&model, &tok, config(), &[req]);
        assert_eq!(got[0].text, want.text);
        assert_eq!(got[0].done.as_ref().unwrap().finish, want.finish);
    }
}

/// A thousand requests of random lengths (many sharing prefixes, some of several choices), a fifth of the streams
/// cancelled at a random moment, through a pool small enough to preempt and evict: the reference counts match the
/// holders after every step, each step's report accounts for its batch and agrees with the engine's counters, and
/// once the prefix cache lets go every block is free.
#[test]
fn the_allocator_leaks_nothing_after_a_thousand_requests_with_cancellations() {
    for spec in [Spec::llama(GgmlType::Q8_0), Spec::gemma(GgmlType::Q8_0)] {
        let (model, tok) = load(spec);
        let cfg = EngineConfig { kv: KvBudget::Blocks(24), max_batch_tokens: 48, ..config() };
        let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
        let mut rng = Rng::new(77);
        let prefixes: Vec<Vec<u32>> = (0..4).map(|_| tokens(&mut rng, 37)).collect();
        let mut live: Vec<(RequestStream, Option<usize>)> = Vec::new();
        let (mut submitted, mut steps, mut cancelled, mut completed, mut streams) = (0, 0, 0, 0, 0);
        let (mut admitted_prompt, mut admitted_cached, mut preempted, mut forked, mut evicted) = (0, 0, 0, 0, 0);
        while submitted < 1000 || !sched.is_idle() {
            for _ in 0..(rng.next_u64() % 4) {
                if submitted == 1000 {
                    break;
                }
                let mut prompt = match rng.next_u64() % 3 {
                    0 => Vec::new(),
                    k => prefixes[(k as usize + submitted) % 4][..5 + (rng.next_u64() % 33) as usize].to_vec(),
                };
                let n = 1 + (rng.next_u64() % 40) as usize;
                prompt.extend(tokens(&mut rng, n));
                let sampling = SamplingParams { seed: rng.next_u64(), ..SamplingParams::DEFAULT };
                let req = Request { sampling, ..greedy(prompt, 1 + (rng.next_u64() % 64) as usize) };
                let n = if rng.next_u64().is_multiple_of(8) { 2 + (rng.next_u64() % 3) as usize } else { 1 };
                for stream in sched.submit_n(req, n).unwrap() {
                    let cancel_after = rng.next_u64().is_multiple_of(5).then(|| (rng.next_u64() % 12) as usize);
                    live.push((stream, cancel_after));
                    streams += 1;
                }
                submitted += 1;
            }
            let r = sched.step();
            steps += 1;
            sched.audit().unwrap_or_else(|e| panic!("step {steps}: {e}"));
            assert_eq!(r.batch.iter().map(|e| e.tokens).sum::<usize>(), r.batch_tokens, "step {steps}");
            assert_eq!(r.batch.iter().filter(|e| e.decode).count(), r.decode_tokens, "step {steps}");
            assert_eq!(r.batch.len(), r.batch_requests, "step {steps}");
            assert_eq!((r.running, r.waiting), (sched.running(), sched.waiting()), "step {steps}");
            let snap = sched.stats();
            assert_eq!((r.kv_blocks_used as u64, r.cached_blocks), (snap.kv_blocks_used, sched.cached_blocks()));
            assert!(r.kv_blocks_shared <= r.kv_blocks_used && r.admitted_cached_tokens <= r.admitted_prompt_tokens);
            admitted_prompt += r.admitted_prompt_tokens;
            admitted_cached += r.admitted_cached_tokens;
            preempted += r.preempted;
            forked += r.forked;
            evicted += r.evicted_blocks;
            // Read what arrived; drop the streams whose time has come.
            live.retain_mut(|(stream, cancel_after)| {
                if let Some(n) = cancel_after {
                    if *n == 0 {
                        cancelled += 1;
                        return false;
                    }
                    *n -= 1;
                }
                loop {
                    match stream.try_next() {
                        Some(Event::Done(_)) => {
                            completed += 1;
                            return false;
                        }
                        Some(Event::Failed(e)) => panic!("request failed: {e}"),
                        Some(Event::Token { .. }) => {}
                        None => return true,
                    }
                }
            });
        }
        let stats = sched.stats();
        eprintln!(
            "{:?}: {steps} steps, {completed} completed, {cancelled} cancelled, {} preemptions, {} prefix-cache hit \
             tokens, {} cached blocks",
            model.config.arch,
            stats.preemptions,
            stats.prefix_cache_hit_tokens,
            sched.cached_blocks()
        );
        assert_eq!(completed + cancelled, streams);
        assert!(streams > 1100, "{streams} streams: some requests had several choices");
        assert!(cancelled > 100 && stats.preemptions > 0 && stats.prefix_cache_hit_tokens > 0);
        assert_eq!(admitted_prompt as u64, stats.prompt_tokens);
        assert_eq!(admitted_cached as u64, stats.prefix_cache_hit_tokens);
        assert_eq!(preempted as u64, stats.preemptions);
        assert!(forked > 100 && evicted > 0, "{forked} forks, {evicted} evicted blocks");
        sched.clear_prefix_cache();
        sched.audit().unwrap();
        let pool = sched.pool();
        for g in 0..pool.n_groups() {
            assert_eq!(pool.blocks_free(g), pool.blocks_total(g), "group {g} still has blocks held");
        }
    }
}

/// A 2,000-token prompt joins four generating requests: every step still carries each of their next tokens and at
/// most max(PREFILL_MIN, PREFILL_PER_DECODE × 4) prompt tokens, so the others wait one step of bounded size per
/// token (the wall-clock figures are measured on SmolLM2 by `infer bench --serve`; see the README).
#[test]
fn chunked_prefill_keeps_every_generating_request_moving() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let budget = 64;
    let cfg = EngineConfig { n_ctx: 4096, max_batch_tokens: budget, kv: KvBudget::Blocks(400), ..config() };
    let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
    let mut rng = Rng::new(3);
    let small: Vec<RequestStream> = (0..4).map(|_| sched.submit(greedy(tokens(&mut rng, 8), 200)).unwrap()).collect();
    // Let them start generating.
    for _ in 0..3 {
        sched.step();
    }
    let big = sched.submit(greedy(tokens(&mut rng, 2000), 4)).unwrap();
    let (mut steps, mut prefill_steps) = (0, 0);
    let mut big_done = false;
    while !big_done {
        let r = sched.step();
        steps += 1;
        let chunk = PREFILL_MIN.max(PREFILL_PER_DECODE * 4);
        assert!(r.batch_tokens <= 4 + chunk, "step {steps} ran {} tokens", r.batch_tokens);
        for s in &small {
            assert!(r.sampled.contains(&s.id()), "step {steps}: request {} got no token", s.id());
        }
        if r.batch_tokens > r.decode_tokens {
            prefill_steps += 1;
        }
        big_done = r.sampled.contains(&big.id());
    }
    // The prompt went in chunks of that size.
    assert_eq!(prefill_steps, 2000usize.div_ceil(PREFILL_MIN.max(PREFILL_PER_DECODE * 4)));
    drop(small);
    drop(big);
    while !sched.is_idle() {
        sched.step();
    }
}

/// A short prompt that arrives while a 2,000-token one is being prefilled beside generating requests is admitted with
/// half the prompt budget and then goes first (shortest remainder first), so it reaches its first token within a few
/// steps instead of after the whole long prompt.
#[test]
fn a_short_prompt_is_not_held_up_behind_a_long_one() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let cfg = EngineConfig { n_ctx: 4096, max_batch_tokens: 64, kv: KvBudget::Blocks(400), ..config() };
    let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
    let mut rng = Rng::new(5);
    let _small: Vec<RequestStream> = (0..4).map(|_| sched.submit(greedy(tokens(&mut rng, 8), 300)).unwrap()).collect();
    for _ in 0..3 {
        sched.step();
    }
    let big = sched.submit(greedy(tokens(&mut rng, 2000), 4)).unwrap();
    for _ in 0..10 {
        sched.step();
    }
    let short = sched.submit(greedy(tokens(&mut rng, 40), 4)).unwrap();
    let mut steps = 0;
    loop {
        let r = sched.step();
        steps += 1;
        assert!(!r.sampled.contains(&big.id()), "the long prompt finished first, after {steps} steps");
        if r.sampled.contains(&short.id()) {
            break;
        }
    }
    // 40 tokens at no less than half of max(PREFILL_MIN, PREFILL_PER_DECODE × 4) per step.
    let chunk = PREFILL_MIN.max(PREFILL_PER_DECODE * 4);
    assert!(steps <= 40usize.div_ceil(chunk / 2), "first token after {steps} steps");
}

/// With nobody generating, a prompt takes the whole budget: as large as the prompt, it runs in one step (the
/// guard above depends on the schedule, not on luck).
#[test]
fn a_budget_as_large_as_the_prompt_runs_it_in_one_step() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let cfg = EngineConfig { n_ctx: 4096, max_batch_tokens: 2048, kv: KvBudget::Blocks(400), ..config() };
    let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
    let mut rng = Rng::new(3);
    let _big = sched.submit(greedy(tokens(&mut rng, 2000), 2)).unwrap();
    assert_eq!(sched.step().batch_tokens, 2000);
}

#[test]
fn the_engine_thread_serves_queues_and_cancels() {
    let (model, tok) = load(Spec::gemma(GgmlType::Q8_0));
    let (model, tok) = (Arc::new(model), Arc::new(tok));
    let mut rng = Rng::new(4);
    let reqs: Vec<Request> = (0..6).map(|i| greedy(tokens(&mut rng, 10 + 7 * i), 12)).collect();
    let want = alone(&model, &tok, &reqs);
    // A context (and a pool) of 100,000 positions: the request cancelled below cannot reach its end, minutes of
    // generation away, before it is dropped, however late this thread gets to drop it.
    const LONG: usize = 100_000;
    let blocks = LONG.div_ceil(infer::model::kv_cache::DEFAULT_BLOCK_SIZE) + 64;
    let cfg = EngineConfig { n_ctx: LONG, kv: KvBudget::Blocks(blocks), ..config() };
    let engine = Engine::start(model.clone(), tok.clone(), cfg).unwrap();
    let streams: Vec<RequestStream> = reqs.iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
    let got: Vec<Completion> = streams.into_iter().map(|s| s.collect().unwrap()).collect();
    assert_same("engine thread", &want, &got);

    // Bad requests are refused by name.
    let e = engine.submit(greedy(Vec::new(), 4)).unwrap_err();
    assert_eq!(e, RequestError::EmptyPrompt);
    let e = engine.submit(greedy(vec![3; LONG + 1], 4)).unwrap_err();
    assert!(matches!(e, RequestError::PromptTooLong { prompt, n_ctx: LONG } if prompt == LONG + 1), "{e}");
    let e = engine.submit(greedy(vec![9999], 4)).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");

    // A cancelled request stops early; the engine goes on.
    let mut s = engine.submit(greedy(tokens(&mut rng, 5), LONG)).unwrap();
    assert!(matches!(s.blocking_next(), Some(Event::Token { .. })));
    drop(s);
    let after = engine.submit(reqs[0].clone()).unwrap().collect().unwrap();
    assert_eq!(after.tokens, want[0].tokens);
    let start = std::time::Instant::now();
    while engine.stats().requests_cancelled == 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the dropped request was not counted as cancelled within 60 s: {:?}",
            engine.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    engine.shutdown();
    assert!(matches!(engine.submit(reqs[0].clone()), Err(RequestError::Stopped)));
}

#[test]
fn a_full_queue_refuses() {
    let (model, tok) = load(Spec::llama(GgmlType::Q8_0));
    let mut sched = Scheduler::new(&model, &tok, EngineConfig { max_queue: 2, ..config() }).unwrap();
    let _a = sched.submit(greedy(vec![5, 6], 3)).unwrap();
    let _b = sched.submit(greedy(vec![5, 6], 3)).unwrap();
    assert_eq!(sched.submit(greedy(vec![5, 6], 3)).unwrap_err(), RequestError::QueueFull { waiting: 2 });
    // Admitted requests leave the queue.
    sched.step();
    assert_eq!(sched.running(), 2);
    let _c = sched.submit(greedy(vec![5, 6], 3)).unwrap();
}

/// The same property on the real SmolLM2 (Q4_1, the shipped file): its panels, its 49,152-token head and real text
/// prompts that share a system prompt. Sixteen requests give the same greedy tokens, bit-identical
/// log-probabilities and text alone, together, sharing the cached prefix, and through a pool small enough to
/// preempt.
#[test]
fn smollm2_greedy_tokens_are_the_same_alone_batched_shared_and_preempted() {
    let Some(path) = crate::common::real_model("smollm2") else { return };
    let model = Model::from_file(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    // About 50 tokens: three full 16-token blocks to share.
    let system = "You are a careful assistant for a school quiz. Answer every question in one short sentence, \
                  in plain English, without lists or headings, and never make anything up: when you do not know, \
                  say so. ";
    let questions = [
        "What is the capital of France?",
        "Name a primary colour.",
        "How many legs does a spider have?",
        "What is 2+2?",
        "Which planet is known as the red planet?",
        "What do bees make?",
        "What is the opposite of hot?",
        "Translate 'merci' into English.",
    ];
    let reqs: Vec<Request> = (0..16)
        .map(|i| {
            let q = questions[i % questions.len()];
            // Every fourth prompt has no system prompt, so shared and unshared prefixes mix in one batch.
            let text = if i % 4 == 3 { q.to_string() } else { format!("{system}{q}") };
            greedy(tok.encode(&text, true, false), 12 + i % 9)
        })
        .collect();
    let want = alone(&model, &tok, &reqs);
    let (got, _) = run_all(&model, &tok, EngineConfig { prefix_cache: false, ..config() }, &reqs);
    assert_same("SmolLM2, 16 at once", &want, &got);
    let (got, _) = run_all(&model, &tok, config(), &reqs);
    assert_same("SmolLM2, 16 at once sharing a prefix", &want, &got);
    let cached: usize = got.iter().map(|c| c.done.as_ref().unwrap().usage.cached_tokens).sum();
    assert!(cached >= 8 * 32, "only {cached} prompt tokens came from the cache");
    // A pool one block larger than the longest request holds it alone but not two at once: requests are preempted
    // and recomputed.
    let longest = reqs.iter().map(|r| r.prompt.len() + r.max_tokens).max().unwrap();
    let blocks = longest.div_ceil(16) + 1;
    let cfg = EngineConfig { kv: KvBudget::Blocks(blocks), ..config() };
    let (got, preemptions) = run_all(&model, &tok, cfg, &reqs);
    assert!(preemptions > 0, "a {blocks}-block pool should preempt");
    assert_same(&format!("SmolLM2, {blocks}-block pool"), &want, &got);
}

/// Text held back because it might begin a stop string is released when an end-of-generation token ends the reply
/// (it was dropped: SmolLM2's final "." vanished with `--stop ".QQQ"`), and a stop string that spells a control
/// token stops at that token (control tokens decode to nothing, so the text could never match it). The session and
/// the engine agree on both.
#[test]
fn smollm2_held_text_survives_the_reply_s_end_and_a_stop_string_can_name_a_control_token() {
    let Some(path) = crate::common::real_model("smollm2") else { return };
    let model = Model::from_file(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let prompt = tok.encode_prompt("<|im_start|>user\nSay hello in five words.<|im_end|>\n<|im_start|>assistant\n");
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let both = |req: Request| {
        let mut session = Session::new(&model, &tok, 512, KvDtype::F16);
        let s = session
            .generate(
                &GenerateRequest {
                    prompt: req.prompt.clone(),
                    max_tokens: req.max_tokens,
                    sampling: req.sampling,
                    stop: req.stop.clone(),
                    ignore_eos: req.ignore_eos,
                    format: OutputFormat::Text,
                    logit_bias: req.logit_bias.clone(),
                    dry_breakers: req.dry_breakers.clone(),
                    draft: infer::speculative::DraftParams::OFF,
                },
                &cancel,
                &mut |_| Ok(()),
            )
            .unwrap();
        let (e, _) = run_all(&model, &tok, config(), &[req]);
        let done = e[0].done.as_ref().unwrap();
        assert_eq!((e[0].text.as_str(), done.finish), (s.text.as_str(), s.finish), "engine and session");
        (s.text, s.finish, s.tokens.len())
    };
    let reply = Request { ignore_eos: false, ..greedy(prompt.clone(), 64) };
    let (plain, finish, _) = both(reply.clone());
    assert_eq!(finish, FinishReason::Stop, "the reply should end at <|im_end|>: {plain:?}");
    let last = plain.chars().last().unwrap();
    let (held, finish, _) = both(Request { stop: vec![format!("{last}QQQ"), "\n\nQQQ".into()], ..reply.clone() });
    assert_eq!((held.as_str(), finish), (plain.as_str(), FinishReason::Stop));

    // <|im_start|> (id 1) is a control token that does not end generation; a bias makes it the first token drawn.
    let im_start = tok.token_id("<|im_start|>").unwrap();
    assert!(!tok.is_eog(im_start));
    let forced = Request {
        logit_bias: infer::sampling::LogitBias::new([(im_start, 100.0)]).unwrap(),
        ..greedy(prompt.clone(), 4)
    };
    assert_eq!(both(forced.clone()), (String::new(), FinishReason::Length, 4), "no stop: it runs to the limit");
    let stopped = Request { stop: vec!["<|im_start|>".into()], ..forced };
    assert_eq!(both(stopped), (String::new(), FinishReason::Stop, 0), "the stop string names the token");
}
