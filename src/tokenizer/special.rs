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
}

impl Matcher {
    /// `cands` must already be in priority order.
    fn new(cands: &[(u32, &str)]) -> Option<Matcher> {
        if cands.is_empty() {
            return None;
        }
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .build(cands.iter().map(|&(_, t)| t.as_bytes()))
            .ok()?;
        Some(Matcher { ac, ids: cands.iter().map(|&(id, _)| id).collect() })
    }
}

pub struct SpecialMatcher {
    /// Control, unknown and user-defined tokens.
    all: Option<Matcher>,
    /// User-defined tokens only.
    user: Option<Matcher>,
}

impl SpecialMatcher {
    /// `specials`: (id, text, is_user_defined) of every control, unknown and user-defined token with non-empty text.
    pub fn new(mut specials: Vec<(u32, &str, bool)>) -> SpecialMatcher {
        // Longest first; equal lengths by id, so that the order is deterministic.
        specials.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let all: Vec<(u32, &str)> = specials.iter().map(|&(id, t, _)| (id, t)).collect();
        let user: Vec<(u32, &str)> = specials.iter().filter(|s| s.2).map(|&(id, t, _)| (id, t)).collect();
        SpecialMatcher { all: Matcher::new(&all), user: Matcher::new(&user) }
    }

    /// Splits `text` into fragments.
    pub fn partition(&self, text: &str, parse_special: bool, out: &mut Vec<Fragment>) {
        let matcher = if parse_special { self.all.as_ref() } else { self.user.as_ref() };
        let Some(m) = matcher else {
            if !text.is_empty() {
                out.push(Fragment::Text(0, text.len()));
            }
            return;
        };
        // (priority, start, end) of every occurrence, overlapping ones included.
        let mut occ: Vec<(u32, usize, usize)> =
            m.ac.find_overlapping_iter(text.as_bytes()).map(|h| (h.pattern().as_u32(), h.start(), h.end())).collect();
        if occ.is_empty() {
            if !text.is_empty() {
                out.push(Fragment::Text(0, text.len()));
            }
            return;
        }
        occ.sort_unstable();
        let mut claimed = vec![false; text.len()];
        let mut spans: Vec<(usize, usize, u32)> = Vec::new();
        let mut current = u32::MAX;
        let mut last_end = 0usize;
        for &(p, s, e) in &occ {
            if p != current {
                current = p;
                last_end = 0;
            }
            if s < last_end || claimed[s..e].iter().any(|&c| c) {
                continue;
            }
            claimed[s..e].iter_mut().for_each(|c| *c = true);
            last_end = e;
            spans.push((s, e, m.ids[p as usize]));
        }
        spans.sort_unstable();
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

#[cfg(test)]
mod tests {
    use super::*;

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
