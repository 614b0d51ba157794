//! Decoding token by token without ever emitting half a character.
//!
//! A token can end in the middle of a UTF-8 sequence (byte-level BPE and byte-fallback tokens split characters).
//! The decoder holds such bytes back until the character completes. Invalid bytes become U+FFFD exactly as
//! `String::from_utf8_lossy` would replace them in the whole output, so the concatenation of everything it emits
//! equals [`Tokenizer::decode_with`](super::Tokenizer::decode_with) of the whole sequence; [`StreamDecoder::finish`]
//! flushes a trailing incomplete character as U+FFFD.

use super::Tokenizer;

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    pending: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder { tok, skip_special, pending: Vec::new(), first: true }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let mut out = String::new();
        self.push_into(id, &mut out);
        out
    }

    /// As [`push`](Self::push), appending the completed text to `out`: a decode loop that reuses one buffer does not
    /// allocate per token.
    pub fn push_into(&mut self, id: u32, out: &mut String) {
        let piece = self.tok.piece_for_decode(id, self.skip_special, self.first);
        self.first = false;
        self.pending.extend_from_slice(piece);
        self.drain_complete(out);
    }

    /// Ends the stream: whatever is held back (an incomplete character) comes out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.first = true;
        out
    }

    /// Whether bytes are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn drain_complete(&mut self, out: &mut String) {
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix is valid UTF-8 by the error's own account.
                    out.push_str(std::str::from_utf8(&self.pending[start..start + valid]).unwrap_or_default());
                    start += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start += n;
                        }
                        // An incomplete character at the end: keep it for the next token.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}
