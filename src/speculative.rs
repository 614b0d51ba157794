//! Speculative decoding by prompt lookup: guess the next few tokens from the text so far, and check the guesses
//! in the same forward pass that decodes the token just sampled.
//!
//! # Why it is faster
//!
//! Decoding one token reads every weight once. A pass over a handful of tokens also reads them once, so while the
//! matrix products are bound by memory rather than arithmetic it costs little more than a pass over one. When the
//! continuation can be guessed, feeding the guesses along with the sampled token lets one pass yield several
//! tokens. The guesses here need no second model: when the last few tokens occurred earlier in the prompt or the
//! output, the tokens that followed them there are proposed ("prompt lookup decoding"; llama.cpp calls its
//! version `ngram-simple`). That pays where the output copies from the input or from itself: quoting and
//! summarizing a document, editing code, extracting fields, reformatting, lists with a repeated shape.
//!
//! # Why the output does not change
//!
//! The session samples the positions of a pass one after another, each from the logits the pass computed for it,
//! with the same sampler, history and structured-output mask it would use without speculation. A guess stands
//! while it equals the token drawn; the first token drawn that differs is kept (so every pass yields at least one
//! token), and the cache positions of the guesses after it are dropped. For a draft that proposes one token with
//! certainty, this is exactly the acceptance rule of speculative sampling (Leviathan et al., 2023; Chen et al.,
//! 2023): accept the guess `d` with probability `min(1, p(d) / 1) = p(d)`, and on rejection draw from `p` with
//! `d` removed and renormalized. Drawing from `p` and comparing with `d` does both at once. So the tokens are the
//! ones plain decoding samples from the same logits, draw for draw, at any temperature and with the same seed.
//! One caveat: the logits themselves come from a pass over several positions of one sequence, whose attention
//! runs as a prompt's does, and those can differ from a one-token pass's in the last bits (SmolLM2: below 1e-4
//! relative, `model::real_model_prefill_equals_decode`). Only a near-tie between two tokens could turn on that;
//! every comparison made so far gave the same tokens (`tests/speculative.rs`, `scripts/spec-speed.py`).

/// How the session guesses ahead. `max == 0` turns speculation off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftParams {
    /// Most tokens proposed per pass.
    pub max: usize,
    /// Fewest tokens worth proposing: a shorter continuation is not fed (a pass over two tokens costs more than a
    /// pass over one, and a lone guess may not repay it).
    pub min: usize,
    /// Longest suffix of the text looked up; shorter suffixes down to two tokens are tried when it has no match.
    pub ngram: usize,
    /// Feed every proposal in full instead of what [`DraftPolicy`] expects to pay (to measure the cost of
    /// guessing, and in tests).
    pub always: bool,
}

impl DraftParams {
    /// No speculation.
    pub const OFF: DraftParams = DraftParams { max: 0, min: 1, ngram: 3, always: false };

    /// Prompt lookup with `max` tokens per pass and the default match lengths.
    pub fn lookup(max: usize) -> DraftParams {
        DraftParams { max, ..DraftParams::OFF }
    }

    pub fn is_off(&self) -> bool {
        self.max == 0
    }
}

/// Most guesses per pass the flags allow: beyond a few dozen tokens a pass is bound by arithmetic, not memory, and
/// a long guess rarely stands to its end.
pub const MAX_DRAFT: usize = 32;

/// A suffix of one token matches nearly everywhere in a long text and predicts little; two is the shortest tried.
pub const MIN_NGRAM: usize = 2;

/// Writes into `out` (cleared first) up to `limit.min(params.max)` tokens that followed the latest earlier
/// occurrence of the text's last `n` tokens, for `n` from `params.ngram` down to [`MIN_NGRAM`], and returns how
/// many tokens the text and that occurrence share going back (at least `n`, at most [`MAX_MATCH`]): a long shared
/// run means the text is copying, a run of two is often chance. Leaves `out` empty and returns 0 when no suffix
/// occurs earlier or the continuation is shorter than `params.min`.
///
/// The scan runs backwards from the end, so the most recent occurrence wins (the local pattern: the row of a
/// table being written, the function being edited). It costs a comparison per position of the text, a few
/// microseconds at 4,096 tokens: noise beside the millisecond of a forward pass.
pub fn propose(text: &[u32], params: &DraftParams, limit: usize, out: &mut Vec<u32>) -> usize {
    out.clear();
    let want = params.max.min(limit);
    if want == 0 || want < params.min {
        return 0;
    }
    for n in (MIN_NGRAM..=params.ngram.max(MIN_NGRAM)).rev() {
        if text.len() <= n {
            continue;
        }
        let key = &text[text.len() - n..];
        // Occurrences that start before the suffix itself, latest first: `start + n <= len - 1`, so at least one
        // token follows the occurrence.
        let found = (0..text.len() - n).rev().find(|&start| &text[start..start + n] == key);
        if let Some(start) = found {
            let from = start + n;
            let to = (from + want).min(text.len());
            if to - from < params.min {
                return 0;
            }
            out.extend_from_slice(&text[from..to]);
            let back =
                (1..=start.min(MAX_MATCH - n)).take_while(|&i| text[start - i] == text[text.len() - n - i]).count();
            return n + back;
        }
    }
    0
}

/// The longest shared run [`propose`] measures.
pub const MAX_MATCH: usize = 32;

/// Decides, pass by pass, how many of a proposal's guesses to feed: the number that maximizes the tokens expected
/// per second, from measured costs and acceptance rates, which may be none.
///
/// A rejected guess is not free. On a 2-core Zen 1, a pass over 9 tokens of SmolLM2 costs about five passes over
/// one (its small matrices are bound by arithmetic there), so free-form text, where two-token matches abound but
/// rarely continue, ran 34% slower with eight guesses at every match. On a model bound by memory bandwidth the
/// same guesses cost almost nothing. So the policy measures rather than assumes:
/// - **Acceptance.** Every proposal is checked against the tokens then sampled, whether or not it was fed (an
///   unfed guess costs nothing to check), giving the chance `a` that a guess stands given the one before it did.
///   It is kept per length of the shared run behind the match ([`propose`]'s return: 2, 3, 4–7, 8 or more), as
///   a decaying count with a prior of one hit in two.
/// - **Cost.** The time from one pass to the next (sampling included) gives a plain pass's time `t₁` and, from
///   passes with `k` guesses, the time `δ` each guess adds; both are moving averages. `δ` starts at a quarter of
///   `t₁`, so that guessing gets tried.
/// - **Choice.** With guesses that stand in a chain, `k` guesses yield `1 + a + … + aᵏ` tokens for `t₁ + kδ`
///   seconds; the policy feeds the `k` (0 to the proposal's length) with the most tokens per second.
#[derive(Debug, Clone)]
pub struct DraftPolicy {
    params: DraftParams,
    /// The proposal being checked against the tokens sampled, and the next guess to check.
    proposal: Vec<u32>,
    checked: usize,
    bucket: usize,
    /// Per bucket: decayed (hits, trials).
    hits: [(f64, f64); 4],
    plain_secs: Option<f64>,
    guess_secs: Option<f64>,
}

/// How fast old outcomes fade from the acceptance counts (about the last 20 count).
const HIT_DECAY: f64 = 0.95;
/// Weight of the newest pass in the moving averages of the times.
const TIME_WEIGHT: f64 = 0.25;

fn bucket(shared: usize) -> usize {
    match shared {
        0..=2 => 0,
        3 => 1,
        4..=7 => 2,
        _ => 3,
    }
}

impl DraftPolicy {
    pub fn new(params: DraftParams) -> DraftPolicy {
        DraftPolicy {
            params,
            proposal: Vec::with_capacity(params.max),
            checked: 0,
            bucket: 0,
            hits: [(1.0, 2.0); 4],
            plain_secs: None,
            guess_secs: None,
        }
    }

    pub fn params(&self) -> &DraftParams {
        &self.params
    }

    /// Forgets the last proposal (a new generation's text), keeping what was measured.
    pub fn restart(&mut self) {
        self.proposal.clear();
        self.checked = 0;
    }

    /// The guesses to feed after the token just sampled (`text` ends with it): a prefix of the proposal for
    /// `text`, at most `limit` long, possibly empty.
    pub fn guesses(&mut self, text: &[u32], limit: usize) -> &[u32] {
        self.proposal.clear();
        self.checked = 0;
        if self.params.is_off() || limit == 0 {
            return &[];
        }
        let shared = propose(text, &self.params, limit, &mut self.proposal);
        self.bucket = bucket(shared);
        let k = if self.params.always { self.proposal.len() } else { self.best_len(self.proposal.len()) };
        &self.proposal[..k]
    }

    /// The chance a guess stands given the one before it did, for the current proposal's bucket.
    fn acceptance(&self) -> f64 {
        let (h, t) = self.hits[self.bucket];
        h / t
    }

    fn best_len(&self, available: usize) -> usize {
        let Some(t1) = self.plain_secs else {
            // Nothing measured yet: one plain pass first.
            return 0;
        };
        let delta = self.guess_secs.unwrap_or(t1 / 4.0);
        let a = self.acceptance();
        let (mut best, mut best_rate) = (0, 1.0 / t1);
        let (mut expected, mut chain) = (1.0, 1.0);
        for k in 1..=available {
            chain *= a;
            expected += chain;
            let rate = expected / (t1 + k as f64 * delta);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        if best < self.params.min { 0 } else { best }
    }

    /// Checks a sampled token against the proposal's next guess (fed or not).
    pub fn sampled(&mut self, token: u32) {
        let Some(&guess) = self.proposal.get(self.checked) else { return };
        let hit = guess == token;
        let (h, t) = &mut self.hits[self.bucket];
        *h = *h * HIT_DECAY + f64::from(u8::from(hit));
        *t = *t * HIT_DECAY + 1.0;
        self.checked = if hit { self.checked + 1 } else { self.proposal.len() };
    }

    /// Records a pass that fed `guesses` guesses and took `seconds` until the next pass began.
    pub fn timed(&mut self, guesses: usize, seconds: f64) {
        if self.params.is_off() || seconds.is_nan() || seconds <= 0.0 {
            return;
        }
        let average = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + TIME_WEIGHT * (new - o)));
        match (guesses, self.plain_secs) {
            (0, _) => self.plain_secs = average(self.plain_secs, seconds),
            (k, Some(t1)) => self.guess_secs = average(self.guess_secs, ((seconds - t1) / k as f64).max(0.0)),
            (_, None) => {}
        }
    }
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Guessed tokens fed to the model.
    pub drafted: usize,
    /// Guessed tokens that the sampler then drew, so their pass was not needed.
    pub accepted: usize,
    /// Forward passes that carried a draft.
    pub passes: usize,
}

impl DraftStats {
    /// The share of guesses that stood, in [0, 1] (0 without guesses).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(text: &[u32], max: usize, limit: usize) -> Vec<u32> {
        let mut out = vec![99];
        propose(text, &DraftParams::lookup(max), limit, &mut out);
        out
    }

    #[test]
    fn proposes_what_followed_the_latest_occurrence() {
        // "1 2 3 4 5 ... 1 2 3" → the suffix "1 2 3" occurred at 0, followed by 4 5 6.
        assert_eq!(draft(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 3, 8), [4, 5, 6]);
        // The latest occurrence wins: "7 8" is followed by 1 the first time and 2 the second.
        assert_eq!(draft(&[7, 8, 1, 0, 7, 8, 2, 0, 7, 8], 1, 8), [2]);
        // The continuation stops at the end of the text (it may run into the suffix itself).
        assert_eq!(draft(&[5, 5, 5, 5], 8, 8), [5]);
        assert_eq!(draft(&[1, 2, 1, 2, 1, 2], 8, 8), [1, 2]);
    }

    #[test]
    fn longer_suffixes_first_then_shorter() {
        // The 3-gram "0 1 2" never occurred before; the 2-gram "1 2" did, followed by 3.
        assert_eq!(draft(&[1, 2, 3, 9, 0, 1, 2], 4, 8), [3, 9, 0, 1]);
        // Only the last token repeats: one-token suffixes are not tried.
        assert_eq!(draft(&[4, 1, 5, 6, 1], 4, 8), Vec::<u32>::new());
    }

    #[test]
    fn shared_run_behind_the_match() {
        let mut out = Vec::new();
        let p = DraftParams::lookup(4);
        // "5 6 7 1 2 3 ... 9 6 7 1 2 3": the 3-gram matches and the run goes back through 6 and 7, not 5.
        assert_eq!(propose(&[5, 6, 7, 1, 2, 3, 4, 9, 6, 7, 1, 2, 3], &p, 8, &mut out), 5);
        assert_eq!(out, [4, 9, 6, 7]);
        // A match at the very start has nothing behind it.
        assert_eq!(propose(&[1, 2, 3, 8, 1, 2, 3], &p, 8, &mut out), 3);
        assert_eq!(propose(&[1, 2, 3, 8], &p, 8, &mut out), 0);
        // A periodic text shares up to MAX_MATCH.
        let text: Vec<u32> = (0..100).map(|i| i % 3).collect();
        assert_eq!(propose(&text, &p, 8, &mut out), MAX_MATCH);
    }

    /// Plain passes of 10 ms; guesses that add `delta` ms each and stand with chance `a` (every sampled token is
    /// checked against the proposal). Returns the guesses fed at the end.
    fn settle(a_hits: &[bool], delta_ms: f64, shared_text: &[u32]) -> usize {
        let mut p = DraftPolicy::new(DraftParams::lookup(8));
        p.timed(0, 0.010);
        let mut fed = 0;
        for _ in 0..20 {
            fed = p.guesses(shared_text, 8).len();
            p.timed(fed, 0.010 + fed as f64 * delta_ms * 1e-3);
            let proposal = p.proposal.clone();
            for (&g, &hit) in proposal.iter().zip(a_hits) {
                p.sampled(if hit { g } else { g + 1 });
                if !hit {
                    break;
                }
            }
        }
        fed
    }

    #[test]
    fn policy_feeds_what_pays() {
        // A copying text: the proposal is 8 long and shares a long run.
        let text: Vec<u32> = (0..40).chain(0..20).collect();
        // Guesses that always stand and cost little: all eight.
        assert_eq!(settle(&[true; 8], 1.0, &text), 8);
        // Guesses that never stand: none, however cheap.
        assert_eq!(settle(&[false; 8], 1.0, &text), 0);
        // Expensive guesses (5 ms each, half a plain pass) that stand three times in four and then fail: a few.
        let some = settle(&[true, true, true, false, true, true, true, false], 5.0, &text);
        assert!((1..=4).contains(&some), "{some}");
        // Before any plain pass is timed, nothing is fed.
        let mut p = DraftPolicy::new(DraftParams::lookup(8));
        assert_eq!(p.guesses(&text, 8).len(), 0);
        // `always` feeds every proposal, measured or not.
        let mut p = DraftPolicy::new(DraftParams { always: true, ..DraftParams::lookup(8) });
        assert_eq!(p.guesses(&text, 8).len(), 8);
        // Off proposes nothing.
        let mut off = DraftPolicy::new(DraftParams::OFF);
        off.timed(0, 0.01);
        assert!(off.guesses(&text, 8).is_empty());
    }

    #[test]
    fn limits_and_minimum() {
        let text = [1, 2, 3, 4, 5, 6, 1, 2];
        assert_eq!(draft(&text, 8, 2), [3, 4]);
        assert_eq!(draft(&text, 0, 8), Vec::<u32>::new());
        assert_eq!(draft(&text, 8, 0), Vec::<u32>::new());
        let mut out = Vec::new();
        propose(&[1, 2, 3, 1, 2], &DraftParams { min: 2, ..DraftParams::lookup(8) }, 8, &mut out);
        assert_eq!(out, [3, 1, 2]);
        propose(&[1, 2, 3, 1, 2], &DraftParams { min: 4, ..DraftParams::lookup(8) }, 8, &mut out);
        assert!(out.is_empty());
        propose(&[1, 2], &DraftParams::lookup(8), 8, &mut out);
        assert!(out.is_empty());
        propose(&[], &DraftParams::lookup(8), 8, &mut out);
        assert!(out.is_empty());
    }
}
