//! Parallel sampling: a request for `n` choices (OpenAI's `n`) runs its prompt through the model once, and the
//! choices fork from it, sharing its KV blocks. Choice `i` must be exactly a request of one choice with seed
//! `seed + i` (tokens, log-probabilities bit for bit, text), alone or beside others, through preemption, and when
//! its siblings are cancelled; the pool's holds must add up after every step.

use infer::engine::{Completion, EngineConfig, KvBudget, Request, RequestError, RequestStream, Scheduler};
use infer::kernels::GgmlType;
use infer::model::Model;
use infer::sampling::SamplingParams;
use infer::tokenizer::Tokenizer;

use crate::engine::{config, greedy, load, run_all};
use crate::synthetic::{Rng, Spec};

fn prompt(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 3 + (rng.next_u64() % 256) as u32).collect()
}

/// A request sampled hot with no filter, so that choices differ (the synthetic models are sure of themselves).
fn sampled(prompt: Vec<u32>, max_tokens: usize, seed: u64) -> Request {
    let mut r = greedy(prompt, max_tokens);
    r.sampling = SamplingParams { temperature: 8.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplingParams::DEFAULT };
    r
}

/// What a request of one choice with seed `seed + i` gives, for each of `n` choices, each alone in an engine.
fn singles(model: &Model, tok: &Tokenizer, req: &Request, n: usize) -> Vec<Completion> {
    (0..n as u64)
        .map(|i| {
            let mut r = req.clone();
            r.sampling.seed += i;
            run_all(model, tok, EngineConfig { prefix_cache: false, ..config() }, &[r]).0.remove(0)
        })
        .collect()
}

fn assert_same(what: &str, want: &[Completion], got: &[Completion]) {
    assert_eq!(want.len(), got.len(), "{what}: choices");
    let bits = |c: &Completion| c.logprobs.iter().map(|l| l.to_bits()).collect::<Vec<u32>>();
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert_eq!(w.tokens, g.tokens, "{what}: choice {i}'s tokens");
        assert_eq!(bits(w), bits(g), "{what}: choice {i}'s log-probabilities");
        assert_eq!(w.text, g.text, "{what}: choice {i}'s text");
    }
}

/// Steps `sched` until idle, auditing the pool and the batch limit after every step; returns the tokens the
/// forward passes carried.
fn drain(sched: &mut Scheduler<'_>) -> usize {
    let mut carried = 0;
    while !sched.is_idle() {
        carried += sched.step().batch_tokens;
        sched.audit().unwrap();
        assert!(sched.running() <= sched.config().max_seqs, "{} running", sched.running());
    }
    carried
}

fn collect(streams: Vec<RequestStream>) -> Vec<Completion> {
    streams.into_iter().map(|s| s.collect().unwrap()).collect()
}

#[test]
fn each_choice_is_the_request_with_its_seed_and_the_prompt_runs_once() {
    for spec in [Spec::llama(GgmlType::Q4_1), Spec::gemma(GgmlType::Q8_0)] {
        let (model, tok) = load(spec);
        let mut rng = Rng::new(5);
        // Two full blocks and a partly filled third, which the choices share until each writes to it.
        let req = sampled(prompt(&mut rng, 37), 12, 100);
        let want = singles(&model, &tok, &req, 4);
        // Without the prefix cache: the sharing is the fork's own.
        let mut sched = Scheduler::new(&model, &tok, EngineConfig { prefix_cache: false, ..config() }).unwrap();
        let streams = sched.submit_n(req.clone(), 4).unwrap();
        let carried = drain(&mut sched);
        let got = collect(streams);
        assert_same(spec_name(&spec), &want, &got);
        // The prompt once, then each choice's tokens but its last (the first comes from the prompt's logits).
        assert_eq!(carried, 37 + 4 * 11, "tokens through the model");
        let stats = sched.stats();
        assert_eq!(stats.prompt_tokens, 37, "prompt tokens counted once");
        assert_eq!(stats.requests_finished, 4);
        assert!(got.iter().any(|c| c.tokens != got[0].tokens), "the choices differ at temperature 8");
        for c in &got {
            let done = c.done.as_ref().unwrap();
            assert_eq!((done.usage.prompt_tokens, done.usage.completion_tokens), (37, 12));
        }
        // All blocks are back (no prefix cache holds any).
        for g in 0..sched.pool().n_groups() {
            assert_eq!(sched.pool().blocks_free(g), sched.pool().blocks_total(g), "group {g}");
        }
    }
}

fn spec_name(spec: &Spec) -> &'static str {
    if spec.gemma { "gemma" } else { "llama" }
}

/// A pool too small for everyone at once: the choices and three other requests preempt each other and are
/// recomputed, and every one still gets its own tokens; the choices count against `max_seqs` from admission on.
#[test]
fn choices_come_through_preemption_beside_other_requests() {
    for spec in [Spec::llama(GgmlType::Q4_1), Spec::gemma(GgmlType::Q8_0)] {
        let (model, tok) = load(spec);
        let mut rng = Rng::new(9);
        let req = sampled(prompt(&mut rng, 37), 40, 7);
        let others: Vec<Request> = (0..3).map(|i| sampled(prompt(&mut rng, 30 + 5 * i), 30, 50 + i as u64)).collect();
        let want = singles(&model, &tok, &req, 5);
        let want_others: Vec<Completion> = others.iter().map(|r| singles(&model, &tok, r, 1).remove(0)).collect();
        let cfg = EngineConfig { max_seqs: 6, kv: KvBudget::Blocks(12), ..config() };
        let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
        let other_streams: Vec<RequestStream> = others.iter().map(|r| sched.submit(r.clone()).unwrap()).collect();
        let streams = sched.submit_n(req, 5).unwrap();
        drain(&mut sched);
        assert!(sched.stats().preemptions > 0, "{}: the pool was meant to run short", spec_name(&spec));
        assert_same(spec_name(&spec), &want, &collect(streams));
        assert_same(spec_name(&spec), &want_others, &collect(other_streams));
    }
}

/// A client that drops the first choice before its prompt is computed hands the prompt to the next choice; one
/// that drops a later choice leaves the others alone.
#[test]
fn cancelled_choices_leave_the_others_their_tokens() {
    let (model, tok) = load(Spec::llama(GgmlType::Q4_1));
    let mut rng = Rng::new(13);
    let req = sampled(prompt(&mut rng, 40), 10, 21);
    let want = singles(&model, &tok, &req, 4);
    // The first choice goes before any step, the third after the prompt's first chunk.
    let cfg = EngineConfig { max_batch_tokens: 16, ..config() };
    let mut sched = Scheduler::new(&model, &tok, cfg).unwrap();
    let mut streams: Vec<Option<RequestStream>> = sched.submit_n(req, 4).unwrap().into_iter().map(Some).collect();
    streams[0] = None;
    sched.step();
    sched.audit().unwrap();
    streams[2] = None;
    drain(&mut sched);
    let got: Vec<Completion> = streams.into_iter().flatten().map(|s| s.collect().unwrap()).collect();
    assert_same("choices 1 and 3", &[want[1].clone(), want[3].clone()], &got);
    assert_eq!(sched.stats().requests_cancelled, 2);
    assert_eq!(sched.stats().requests_finished, 2);
    assert_eq!(sched.waiting(), 0);
}

#[test]
fn the_number_of_choices_is_checked() {
    let (model, tok) = load(Spec::llama(GgmlType::Q4_1));
    let mut sched = Scheduler::new(&model, &tok, EngineConfig { max_queue: 3, ..config() }).unwrap();
    let req = sampled(vec![5, 6, 7], 4, 1);
    for n in [0, 17] {
        let e = sched.submit_n(req.clone(), n).unwrap_err();
        assert_eq!(e, RequestError::BadChoiceCount { n, max: 16 });
        assert!(e.to_string().contains(&format!("n = {n}")), "{e}");
    }
    // Each choice takes a place in the queue.
    assert!(matches!(sched.submit_n(req.clone(), 4), Err(RequestError::QueueFull { .. })));
    let streams = sched.submit_n(req, 3).unwrap();
    drain(&mut sched);
    assert_eq!(collect(streams).len(), 3);
}
