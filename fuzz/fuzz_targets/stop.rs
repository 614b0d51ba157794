//! The `--stop` escape parser on arbitrary text, and the stop matcher on what it accepts: the streamed output,
//! however the text is cut into chunks, is the text up to the first stop string.
#![no_main]

use arbitrary::Arbitrary;
use infer::stop::parse_stop;
use infer::stop::{StopMatcher, StopStep};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    flags: Vec<String>,
    text: String,
    cuts: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let stops: Vec<String> = input.flags.iter().take(4).filter_map(|f| parse_stop(f).ok()).collect();
    let Ok(mut m) = StopMatcher::new(stops.iter().cloned()) else { return };
    let mut out = String::new();
    let mut rest = input.text.as_str();
    let mut stopped = false;
    for &c in input.cuts.iter().chain(std::iter::repeat(&255u8)) {
        if rest.is_empty() || stopped {
            break;
        }
        let mut at = (c as usize).min(rest.len()).max(1);
        while !rest.is_char_boundary(at) {
            at += 1;
        }
        let (chunk, tail) = rest.split_at(at);
        rest = tail;
        match m.push(chunk) {
            StopStep::Continue(t) => out.push_str(t),
            StopStep::Stopped { text, .. } => {
                out.push_str(text);
                stopped = true;
            }
        }
    }
    if !stopped {
        out.push_str(m.finish());
    }
    assert!(input.text.starts_with(&out), "output {out:?} is not a prefix of {:?}", input.text);
    if !stopped {
        assert_eq!(out, input.text);
    }
});
