//! Character classes the pre-tokenizers need, and GPT-2's byte ↔ character mapping.
//!
//! The split rules speak of `\p{L}` (letters: general categories Lu, Ll, Lt, Lm, Lo), `\p{N}` (numbers: Nd, Nl, No),
//! `\p{P}` (punctuation: Pc, Pd, Ps, Pe, Pi, Pf, Po) and `\s` (the Unicode `White_Space` property, which is what
//! `char::is_whitespace` tests). Categories come from the `unicode-general-category` tables, with an ASCII fast path.

use unicode_general_category::{GeneralCategory, get_general_category};

/// What a pre-tokenizer needs to know about one character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Letter,
    Number,
    Whitespace,
    /// Anything else: punctuation, symbols, marks, controls that are not white space.
    Other,
}

const fn ascii_class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Number,
        b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Class::Whitespace,
        _ => Class::Other,
    }
}

static ASCII_CLASS: [Class; 128] = {
    let mut table = [Class::Other; 128];
    let mut i = 0;
    while i < 128 {
        table[i] = ascii_class(i as u8);
        i += 1;
    }
    table
};

/// The class of `c`. White space wins over the general category (U+00A0 is Zs and white space; U+0085 is Cc and
/// white space).
#[inline]
pub fn class(c: char) -> Class {
    if c.is_ascii() {
        return ASCII_CLASS[c as usize];
    }
    if c.is_whitespace() {
        return Class::Whitespace;
    }
    use GeneralCategory::*;
    match get_general_category(c) {
        UppercaseLetter | LowercaseLetter | TitlecaseLetter | ModifierLetter | OtherLetter => Class::Letter,
        DecimalNumber | LetterNumber | OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// `\p{P}`: whether `c` is punctuation (any P* category).
#[inline]
pub fn is_punctuation(c: char) -> bool {
    use GeneralCategory::*;
    matches!(
        get_general_category(c),
        ConnectorPunctuation
            | DashPunctuation
            | OpenPunctuation
            | ClosePunctuation
            | InitialPunctuation
            | FinalPunctuation
            | OtherPunctuation
    )
}

/// GPT-2's reversible byte → character table (from OpenAI's `encoder.py`, `bytes_to_unicode`): the printable bytes
/// `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves; the other 68 bytes, in increasing order, get U+0100,
/// U+0101, ... so that every byte has a visible, non-space character.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`]: the byte a byte-level character stands for, if it is one.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The 68 remapped bytes in increasing order: 0x00..=0x20, 0x7F..=0xA0, 0xAD.
            let n = cp - 0x100;
            Some(match n {
                0..=32 => n as u8,
                33..=66 => (0x7F + (n - 33)) as u8,
                _ => 0xAD,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_round_trips() {
        let table = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(table[b as usize]), Some(b), "byte {b:#04x}");
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn classes() {
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('日'), Class::Letter);
        assert_eq!(class('٣'), Class::Number);
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('\u{a0}'), Class::Whitespace);
        assert_eq!(class('\u{3000}'), Class::Whitespace);
        assert_eq!(class('\u{301}'), Class::Other);
        assert_eq!(class('😀'), Class::Other);
        assert!(is_punctuation('…'));
        assert!(!is_punctuation('$'));
    }
}
