//! A list of strings stored as one text buffer plus end offsets.
//!
//! A GGUF vocabulary is an array of 262,144 short strings (Gemma 3). As a `Vec<String>` it cost a 24-byte header
//! and a heap allocation per entry (about 14 MB for Gemma's, against 2.6 MB of text), and each holder (the file's
//! metadata, the tokenizer) had its own copy. Here the text and the offsets sit in two shared, immutable buffers:
//! cloning a list shares them, so the metadata and the tokenizer hold one copy between them.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

/// An immutable list of strings; `clone` is cheap (the buffers are shared).
#[derive(Clone, Default)]
pub struct StrList {
    /// Every string, concatenated.
    text: Arc<str>,
    /// `ends[i]`: where string `i` ends in `text` (string `i` starts where `i - 1` ends, the first at 0).
    ends: Arc<[u32]>,
}

/// Collects strings into a [`StrList`].
#[derive(Default)]
pub struct StrListBuilder {
    /// The strings' bytes, checked for UTF-8 once for all of them by [`StrListBuilder::finish`].
    text: Vec<u8>,
    ends: Vec<u32>,
}

/// The strings' total length passed what 32-bit offsets can address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrListFull;

impl StrListBuilder {
    pub fn with_capacity(n: usize, text_bytes: usize) -> StrListBuilder {
        StrListBuilder { text: Vec::with_capacity(text_bytes), ends: Vec::with_capacity(n) }
    }

    /// Appends `s`; fails, changing nothing, when the text would pass 4 GiB.
    pub fn push(&mut self, s: &str) -> Result<(), StrListFull> {
        self.push_bytes(s.as_bytes())
    }

    /// Appends `bytes` as text; invalid UTF-8 is replaced by U+FFFD (as `String::from_utf8_lossy`) when the list
    /// is finished. Fails, changing nothing, when the bytes would pass 4 GiB.
    pub fn push_lossy(&mut self, bytes: &[u8]) -> Result<(), StrListFull> {
        self.push_bytes(bytes)
    }

    fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), StrListFull> {
        let end = self.text.len().checked_add(bytes.len()).and_then(|e| u32::try_from(e).ok()).ok_or(StrListFull)?;
        self.text.extend_from_slice(bytes);
        self.ends.push(end);
        Ok(())
    }

    /// The list. Its text is checked as UTF-8 in one pass: when the whole buffer is valid and every string ends on
    /// a character boundary, each string is valid on its own. (One check per string took a third of the time to
    /// open Gemma 3's file: 262k calls for strings of ~10 bytes.) Otherwise the strings are rebuilt one by one
    /// with invalid bytes replaced, which fails if the replacements take the text past 4 GiB.
    pub fn finish(self) -> Result<StrList, StrListFull> {
        let StrListBuilder { text, ends } = self;
        // simdutf8 checks the mostly non-ASCII text of a large vocabulary several times faster than `str::from_utf8`
        // (Gemma 3: ~6 ms of the file's open).
        if let Ok(valid) = simdutf8::basic::from_utf8(&text)
            && ends.iter().all(|&e| valid.is_char_boundary(e as usize))
        {
            return Ok(StrList { text: Arc::from(valid), ends: Arc::from(ends) });
        }
        let mut lossy = StrListBuilder::with_capacity(ends.len(), text.len());
        let mut start = 0;
        for &end in ends.iter() {
            let piece = text.get(start..end as usize).unwrap_or_default();
            lossy.push(&String::from_utf8_lossy(piece))?;
            start = end as usize;
        }
        // Every piece is valid UTF-8 now, so this pass ends in the first arm.
        lossy.finish()
    }
}

impl StrList {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)? as usize,
            None => 0,
        };
        // Every boundary was a string's end when it was pushed, so it is a char boundary and `get` succeeds.
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + Clone + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// The position of the first string equal to `s`.
    pub fn position(&self, s: &str) -> Option<usize> {
        self.iter().position(|t| t == s)
    }

    /// Bytes held: the text and the offsets.
    pub fn heap_bytes(&self) -> usize {
        self.text.len().saturating_add(self.ends.len().saturating_mul(4))
    }

    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StrList {
    /// Panics if the strings pass 4 GiB in total; untrusted input goes through [`StrListBuilder::push`].
    #[allow(clippy::expect_used)]
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> StrList {
        let mut b = StrListBuilder::default();
        for s in iter {
            b.push(s.as_ref()).expect("a string list holds at most 4 GiB of text");
        }
        b.finish().expect("valid strings are kept as they are")
    }
}

impl From<Vec<String>> for StrList {
    fn from(v: Vec<String>) -> StrList {
        v.iter().collect()
    }
}

impl PartialEq for StrList {
    fn eq(&self, other: &StrList) -> bool {
        self.ends == other.ends && self.text == other.text
    }
}

impl std::fmt::Debug for StrList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_lossy() {
        let mut b = StrListBuilder::default();
        for s in ["a", "", "▁the", "<|im_end|>"] {
            b.push(s).unwrap();
        }
        b.push_lossy(b"x\xffy").unwrap();
        let l = b.finish().unwrap();
        assert_eq!(l.len(), 5);
        assert_eq!(l.to_vec(), ["a", "", "▁the", "<|im_end|>", "x\u{fffd}y"]);
        assert_eq!(l.get(5), None);
        assert_eq!(l.position("<|im_end|>"), Some(3));
        assert_eq!(l.clone(), l);
        assert_eq!(StrList::from(vec!["a".to_string()]), ["a"].into_iter().collect::<StrList>());
    }

    /// The text is checked as a whole, so a character split across two strings must still make both invalid.
    #[test]
    fn a_character_split_between_strings_is_replaced_in_both() {
        let mut b = StrListBuilder::default();
        for s in [&b"ok"[..], b"\xe2\x96", b"\x81", "▁".as_bytes()] {
            b.push_lossy(s).unwrap();
        }
        assert_eq!(b.finish().unwrap().to_vec(), ["ok", "\u{fffd}", "\u{fffd}", "▁"]);
    }
}
