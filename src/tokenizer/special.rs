//! Finding special-token text (`<|im_start|>`, `<end_of_turn>`, user-defined pieces) in input text.
//!
//! The rule (llama.cpp's `tokenizer_st_partition`): tokens of type control, unknown and user-defined are taken in
//! order of decreasing text length; each in turn claims, left to right and without overlapping itself, every
//! occurrence that lies wholly in text not yet claimed. With special parsing off, only user-defined tokens are
//! looked for. All occurrences of all candidates are found in one Aho-Corasick pass and then claimed in that order,
//! which gives the same result as scanning once per token without costing a pass per token.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// A piece of the input: text still to tokenize (a byte range), or a token found by its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    Text(usize, usize),
    Token(u32),
}

struct Matcher {
    ac: AhoCorasick,
    /// Pattern index (= priority) → token id.
    ids: Vec<u32>,
    patterns: Vec<Vec<u8>>,
}

impl Matcher {
    /// `cands` must already be in priority order.
    #[deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]
    fn new(cands: &[(u32, &str)]) -> Option<Matcher> {
        if cands.is_empty() {
            return None;
        }
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .build(cands.iter().map(|&(_, t)| t.as_bytes()))
            .ok()?;
        Some(Matcher {
            ac,
            ids: cands.iter().map(|&(id, _)| id).collect(),
            patterns: cands.iter().map(|&(_, t)| t.as_bytes().to_vec()).collect(),
        })
    }
}

pub struct SpecialMatcher {
    /// Control, unknown and user-defined tokens.
    all: Option<Matcher>,
    /// User-defined tokens only.
    user: Option<Matcher>,
}

impl SpecialMatcher {
    /// Bytes held by the automata and pattern copies (approximate: allocator overhead not counted).
    pub fn heap_bytes(&self) -> usize {
        [&self.all, &self.user]
            .into_iter()
            .flatten()
            .map(|m| m.ac.memory_usage() + m.ids.len() * 4 + m.patterns.iter().map(|p| p.len() + 24).sum::<usize>())
            .sum()
    }

    /// `specials`: (id, text, is_user_defined) of every control, unknown and user-defined token with non-empty text.
    #[deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]
    pub fn new(mut specials: Vec<(u32, &str, bool)>) -> SpecialMatcher {
        // Longest first; equal lengths by id, so that the order is deterministic.
        specials.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let all: Vec<(u32, &str)> = specials.iter().map(|&(id, t, _)| (id, t)).collect();
        let user: Vec<(u32, &str)> = specials.iter().filter(|s| s.2).map(|&(id, t, _)| (id, t)).collect();
        SpecialMatcher { all: Matcher::new(&all), user: Matcher::new(&user) }
    }

    /// Splits `text` into fragments.
    pub fn partition(&self, text: &str, parse_special: bool, out: &mut Vec<Fragment>) {
        // Occurrences kept in memory at once: a long run of a character that several tokens repeat (Gemma has
        // tokens for 2..=31 spaces) overlaps itself at every position; past this many, the per-token pass runs.
        let cap = (1 << 20) + text.len() / 2;
        self.partition_capped(text, parse_special, cap, out);
    }

    fn partition_capped(&self, text: &str, parse_special: bool, cap: usize, out: &mut Vec<Fragment>) {
        let matcher = if parse_special { self.all.as_ref() } else { self.user.as_ref() };
        let Some(m) = matcher else {
            if !text.is_empty() {
                out.push(Fragment::Text(0, text.len()));
            }
            return;
        };
        // (priority, start, end) of every occurrence, overlapping ones included.
        let mut occ: Vec<(u32, usize, usize)> = Vec::new();
        let mut overflow = false;
        for h in m.ac.find_overlapping_iter(text.as_bytes()) {
            if occ.len() >= cap {
                overflow = true;
                break;
            }
            occ.push((h.pattern().as_u32(), h.start(), h.end()));
        }
        let spans = if overflow {
            drop(occ);
            claim_per_token(m, text.as_bytes())
        } else {
            claim_all(m, text.len(), occ)
        };
        let mut pos = 0;
        for (s, e, id) in spans {
            if s > pos {
                out.push(Fragment::Text(pos, s));
            }
            out.push(Fragment::Token(id));
            pos = e;
        }
        if pos < text.len() {
            out.push(Fragment::Text(pos, text.len()));
        }
    }
}

/// Claims from the list of all occurrences: in priority order, then left to right, each occurrence that overlaps
/// nothing claimed yet. Returns the claimed (start, end, id), sorted.
fn claim_all(m: &Matcher, len: usize, mut occ: Vec<(u32, usize, usize)>) -> Vec<(usize, usize, u32)> {
    let mut spans = Vec::new();
    if occ.is_empty() {
        return spans;
    }
    occ.sort_unstable();
    let mut claimed = vec![false; len];
    for &(p, s, e) in &occ {
        if claimed[s..e].iter().any(|&c| c) {
            continue;
        }
        claimed[s..e].iter_mut().for_each(|c| *c = true);
        spans.push((s, e, m.ids[p as usize]));
    }
    spans.sort_unstable();
    spans
}

/// The same claims, one token at a time (llama.cpp's own order), for texts with too many overlapping occurrences to
/// list: memory stays linear in the text.
fn claim_per_token(m: &Matcher, text: &[u8]) -> Vec<(usize, usize, u32)> {
    let n = text.len();
    let mut present = vec![false; m.ids.len()];
    for h in m.ac.find_overlapping_iter(text) {
        present[h.pattern().as_usize()] = true;
    }
    let mut claimed = vec![false; n];
    // next_claimed[i]: the first claimed position at or after i (n if none).
    let mut next_claimed = vec![n; n + 1];
    let mut spans = Vec::new();
    for p in (0..present.len()).filter(|&p| present[p]) {
        let pat = m.patterns[p].as_slice();
        let Ok(finder) = AhoCorasick::new([pat]) else { continue };
        for i in (0..n).rev() {
            next_claimed[i] = if claimed[i] { i } else { next_claimed[i + 1] };
        }
        let mut pos = 0;
        while pos + pat.len() <= n {
            let Some(hit) = finder.find(&text[pos..]) else { break };
            let (s, e) = (pos + hit.start(), pos + hit.end());
            if next_claimed[s] < e {
                pos = s + 1;
                continue;
            }
            claimed[s..e].iter_mut().for_each(|c| *c = true);
            spans.push((s, e, m.ids[p]));
            pos = e;
        }
    }
    spans.sort_unstable();
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The per-token pass claims exactly what the all-occurrences pass claims.
        #[test]
        fn both_claim_orders_agree(text in "[ ab<>\\n]{0,40}", parse_special in any::<bool>()) {
            let m = SpecialMatcher::new(vec![
                (1, "  ", true), (2, "   ", true), (3, "    ", true), (4, "<a>", false), (5, "a>", false),
                (6, "<a> ", false), (7, "\n\n", true), (8, " \n", true), (9, "b b", false), (10, "<", true),
            ]);
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            m.partition_capped(&text, parse_special, usize::MAX, &mut fast);
            m.partition_capped(&text, parse_special, 0, &mut slow);
            prop_assert_eq!(fast, slow);
        }
    }

    #[test]
    fn long_whitespace_runs_stay_linear() {
        let pats: Vec<String> = (2..=31).map(|n| " ".repeat(n)).collect();
        let m = SpecialMatcher::new(pats.iter().enumerate().map(|(i, p)| (i as u32, p.as_str(), true)).collect());
        let text = " ".repeat(1_000_000);
        let mut out = Vec::new();
        m.partition(&text, true, &mut out);
        // 31-space tokens, then the rest.
        assert_eq!(out.len(), 1_000_000 / 31 + 1);
        assert!(out[..out.len() - 1].iter().all(|f| *f == Fragment::Token(29)));
    }

    #[test]
    fn longest_first_then_left_to_right() {
        let m = SpecialMatcher::new(vec![(1, "<a>", false), (2, "<a><b>", false), (3, "  ", true)]);
        let mut out = Vec::new();
        m.partition("x<a><b><a>   y", true, &mut out);
        assert_eq!(
            out,
            [Fragment::Text(0, 1), Fragment::Token(2), Fragment::Token(1), Fragment::Token(3), Fragment::Text(12, 14)]
        );
        out.clear();
        m.partition("<a>  ", false, &mut out);
        assert_eq!(out, [Fragment::Text(0, 3), Fragment::Token(3)]);
    }
}
