//! Reading text input (prompts, files to tokenize, lines of token ids) with a size cap, so that a huge or endless
//! input is refused with a message instead of growing memory until the machine gives out.

use std::io::{BufRead, Read};
use std::path::Path;

use anyhow::{Context, bail};

/// Largest text input read whole (a prompt, a file to tokenize): 64 MiB is far beyond any context.
pub const MAX_INPUT_BYTES: usize = 64 << 20;

/// Reads all of `r` as UTF-8 text, refusing more than [`MAX_INPUT_BYTES`]; `what` names the source in errors.
pub fn read_text(r: impl Read, what: &str) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    r.take(MAX_INPUT_BYTES as u64 + 1).read_to_end(&mut bytes).with_context(|| format!("reading {what}"))?;
    if bytes.len() > MAX_INPUT_BYTES {
        bail!("{what} is larger than the {} MiB limit", MAX_INPUT_BYTES >> 20);
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!("{what} is not valid UTF-8 (the first bad byte is at offset {})", e.utf8_error().valid_up_to())
    })
}

/// Reads a file as UTF-8 text with [`read_text`]'s cap (its size is checked before reading).
pub fn read_text_file(path: &Path) -> anyhow::Result<String> {
    let what = format!("file {}", path.display());
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_INPUT_BYTES as u64 {
        bail!("{what} is {len} bytes, more than the {} MiB limit", MAX_INPUT_BYTES >> 20);
    }
    read_text(file, &what)
}

/// The next line of `r` without its newline, at most `max` bytes (`None` at the end of input); `lineno` names it in
/// errors.
pub fn read_line(r: &mut impl BufRead, max: usize, lineno: usize) -> anyhow::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let n =
        r.take(max as u64 + 1).read_until(b'\n', &mut buf).with_context(|| format!("reading stdin line {lineno}"))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > max {
        bail!("stdin line {lineno} is longer than {} MiB", max >> 20);
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped_and_text_must_be_utf8() {
        let mut r = std::io::Cursor::new(b"ab\ncd".to_vec());
        assert_eq!(read_line(&mut r, 4, 1).unwrap(), Some(b"ab".to_vec()));
        assert_eq!(read_line(&mut r, 4, 2).unwrap(), Some(b"cd".to_vec()));
        assert_eq!(read_line(&mut r, 4, 3).unwrap(), None);
        let mut long = std::io::Cursor::new(vec![b'x'; 10]);
        assert!(read_line(&mut long, 4, 7).unwrap_err().to_string().contains("stdin line 7"));
        let e = read_text(&b"ok \xff"[..], "the prompt").unwrap_err().to_string();
        assert_eq!(e, "the prompt is not valid UTF-8 (the first bad byte is at offset 3)");
    }
}
