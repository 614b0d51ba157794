//! The REPL's `/commands`: parsing them, and `/set` on the chat's settings. Every mistake is one line of error.

use std::path::PathBuf;

use crate::chat::ChatSettings;
use crate::cli::args::{
    parse_count, parse_dry_base, parse_float, parse_grammar, parse_grammar_file, parse_json_schema,
    parse_json_schema_file, parse_last_n, parse_mass, parse_min_p, parse_mirostat, parse_n_predict, parse_non_negative,
    parse_penalty, parse_positive_float, parse_repeat_penalty, parse_seed, parse_temperature, parse_top_p, parse_unit,
};
use crate::sampling::SamplerOrder;
use crate::structured::OutputFormat;

/// A parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    Exit,
    Clear,
    /// `/system` alone shows the system prompt; with text, sets it.
    System(Option<String>),
    Regen,
    Undo,
    Save(PathBuf),
    Load(PathBuf),
    /// `/set` alone shows every setting; `/set NAME VALUE` changes one.
    Set(Option<(String, String)>),
    Context,
    Stats,
}

/// The commands, for `/help`.
pub const HELP: &str = "\
/help               this list
/exit               leave (also Ctrl-D, or Ctrl-C twice at an empty prompt)
/clear              start a new conversation (the system prompt stays)
/system [TEXT]      show or set the system prompt
/regen              generate the last reply again
/undo               drop the last exchange (your message and the reply)
/save FILE          save the conversation and the settings as JSON
/load FILE          load a conversation saved with /save
/set [NAME VALUE]   show the settings, or set temp, top-k, top-p, min-p, repeat-penalty, repeat-last-n,
                    presence-penalty, frequency-penalty, samplers (their order, e.g. top_k;temperature),
                    seed (a number, or random),
                    n (most tokens per reply; -1 = no limit),
                    format (text, or json: each reply is one JSON object),
                    grammar GBNF or grammar-file FILE (each reply is text of the grammar),
                    json-schema SCHEMA or json-schema-file FILE (each reply is one value of the schema)
/context            how the context is spent: system, history, the reply's reserve, free
/stats              the last reply's prompt and generation speed and time to first token
\"\"\"                 start or end a message of several lines
Ctrl-C stops a reply; what was said so far is kept.";

/// Settings `/set` knows, as typed.
pub const SETTINGS: &str = "temp, top-k, top-p, min-p, top-n-sigma, repeat-penalty, repeat-last-n, presence-penalty, \
     frequency-penalty, dry-multiplier, dry-base, dry-allowed-length, dry-penalty-last-n, xtc-probability, \
     xtc-threshold, typical, dynatemp-range, dynatemp-exp, mirostat, mirostat-ent, mirostat-lr, samplers, seed, n, \
     format, grammar, grammar-file, json-schema, json-schema-file";

/// Parses a command line (without the leading `/`).
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    let (name, rest) = line.split_once(char::is_whitespace).map_or((line, ""), |(n, r)| (n, r.trim()));
    let no_args = |c: Command| if rest.is_empty() { Ok(c) } else { Err(format!("/{name} takes no arguments")) };
    let file = |c: fn(PathBuf) -> Command| {
        if rest.is_empty() { Err(format!("/{name} needs a file name")) } else { Ok(c(PathBuf::from(rest))) }
    };
    match name {
        "help" | "?" => no_args(Command::Help),
        "exit" | "quit" | "bye" => no_args(Command::Exit),
        "clear" => no_args(Command::Clear),
        "system" => Ok(Command::System((!rest.is_empty()).then(|| rest.to_string()))),
        "regen" => no_args(Command::Regen),
        "undo" => no_args(Command::Undo),
        "save" => file(Command::Save),
        "load" => file(Command::Load),
        "set" if rest.is_empty() => Ok(Command::Set(None)),
        "set" => match rest.split_once(char::is_whitespace) {
            Some((key, value)) => Ok(Command::Set(Some((key.to_string(), value.trim().to_string())))),
            None => Err(format!("/set {rest} needs a value (/set alone shows the settings)")),
        },
        "context" => no_args(Command::Context),
        "stats" => no_args(Command::Stats),
        "" => Err("a command name must follow '/': /help lists them".into()),
        other => Err(format!("unknown command /{other}: /help lists the commands")),
    }
}

/// Applies `/set key value`, checking the value as the command-line flag of the same name would.
pub fn set(settings: &mut ChatSettings, key: &str, value: &str) -> Result<(), String> {
    let bad = |e: String| format!("/set {key}: {e}");
    match key {
        "temp" | "temperature" => settings.temperature = parse_temperature(value).map_err(bad)?,
        "top-k" => settings.top_k = parse_count(value).map_err(bad)?,
        "top-p" => settings.top_p = parse_top_p(value).map_err(bad)?,
        "min-p" => settings.min_p = parse_min_p(value).map_err(bad)?,
        "top-n-sigma" => settings.top_n_sigma = parse_float(value).map_err(bad)?,
        "repeat-penalty" => settings.repeat_penalty = parse_repeat_penalty(value).map_err(bad)?,
        "repeat-last-n" => settings.repeat_last_n = parse_count(value).map_err(bad)?,
        "presence-penalty" => settings.presence_penalty = parse_penalty(value).map_err(bad)?,
        "frequency-penalty" => settings.frequency_penalty = parse_penalty(value).map_err(bad)?,
        "dry-multiplier" => settings.dry.multiplier = parse_non_negative(value).map_err(bad)?,
        "dry-base" => settings.dry.base = parse_dry_base(value).map_err(bad)?,
        "dry-allowed-length" => settings.dry.allowed_length = parse_count(value).map_err(bad)?,
        "dry-penalty-last-n" => settings.dry.penalty_last_n = parse_last_n(value).map_err(bad)?,
        "xtc-probability" => settings.xtc.probability = parse_unit(value).map_err(bad)?,
        "xtc-threshold" => settings.xtc.threshold = parse_unit(value).map_err(bad)?,
        "typical" => settings.typical_p = parse_mass(value).map_err(bad)?,
        "dynatemp-range" => settings.dynatemp.range = parse_non_negative(value).map_err(bad)?,
        "dynatemp-exp" => settings.dynatemp.exponent = parse_positive_float(value).map_err(bad)?,
        "mirostat" => settings.mirostat.version = parse_mirostat(value).map_err(bad)?,
        "mirostat-ent" => settings.mirostat.tau = parse_non_negative(value).map_err(bad)?,
        "mirostat-lr" => settings.mirostat.eta = parse_non_negative(value).map_err(bad)?,
        "samplers" => settings.samplers = SamplerOrder::parse(value).map_err(bad)?,
        "seed" if value == "random" => settings.seed = None,
        "seed" => settings.seed = Some(parse_seed(value).map_err(bad)?),
        "n" => settings.max_tokens = usize::try_from(parse_n_predict(value).map_err(bad)?).ok(),
        "format" => {
            settings.format = OutputFormat::from_name(value)
                .ok_or_else(|| bad(format!("'{value}' is not a format (text or json)")))?
        }
        // As the command-line flags of the same names; each replaces whatever format was set.
        "grammar" => settings.format = OutputFormat::Grammar(parse_grammar(value).map_err(bad)?),
        "grammar-file" => settings.format = OutputFormat::Grammar(parse_grammar_file(value).map_err(bad)?),
        "json-schema" => settings.format = OutputFormat::JsonSchema(parse_json_schema(value).map_err(bad)?),
        "json-schema-file" => settings.format = OutputFormat::JsonSchema(parse_json_schema_file(value).map_err(bad)?),
        other => return Err(format!("/set: unknown setting '{other}' (settings: {SETTINGS})")),
    }
    Ok(())
}

/// Every setting, one per line, as `/set` alone prints them.
pub fn show(settings: &ChatSettings) -> String {
    let seed = settings.seed.map_or("random".to_string(), |s| s.to_string());
    let n = settings.max_tokens.map_or("-1 (no limit)".to_string(), |n| n.to_string());
    format!(
        "temp {}\ntop-k {}\ntop-p {}\nmin-p {}\ntop-n-sigma {}\nrepeat-penalty {}\nrepeat-last-n {}\npresence-penalty {}\n\
         frequency-penalty {}\ndry-multiplier {}\ndry-base {}\ndry-allowed-length {}\ndry-penalty-last-n {}\n\
         xtc-probability {}\nxtc-threshold {}\ntypical {}\ndynatemp-range {}\ndynatemp-exp {}\nmirostat {}\n\
         mirostat-ent {}\nmirostat-lr {}\nsamplers {}\nseed {seed}\nn {n}\nformat {}",
        settings.temperature,
        settings.top_k,
        settings.top_p,
        settings.min_p,
        settings.top_n_sigma,
        settings.repeat_penalty,
        settings.repeat_last_n,
        settings.presence_penalty,
        settings.frequency_penalty,
        settings.dry.multiplier,
        settings.dry.base,
        settings.dry.allowed_length,
        settings.dry.penalty_last_n,
        settings.xtc.probability,
        settings.xtc.threshold,
        settings.typical_p,
        settings.dynatemp.range,
        settings.dynatemp.exponent,
        settings.mirostat.version,
        settings.mirostat.tau,
        settings.mirostat.eta,
        settings.samplers,
        settings.format.name(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_and_xtc_settings_are_set_checked_and_shown() {
        let mut settings = ChatSettings::default();
        set(&mut settings, "dry-multiplier", "0.8").unwrap();
        set(&mut settings, "dry-penalty-last-n", "-1").unwrap();
        set(&mut settings, "xtc-threshold", "0.2").unwrap();
        assert_eq!((settings.dry.multiplier, settings.dry.penalty_last_n, settings.xtc.threshold), (0.8, -1, 0.2));
        assert!(set(&mut settings, "dry-base", "0.9").unwrap_err().contains("dry-base"));
        assert!(set(&mut settings, "xtc-probability", "2").unwrap_err().contains("xtc-probability"));
        let shown = show(&settings);
        assert!(shown.contains("dry-multiplier 0.8\n") && shown.contains("xtc-threshold 0.2\n"), "{shown}");
        settings.validate().unwrap();
    }

    #[test]
    fn grammars_and_schemas_are_set_checked_and_shown() {
        let mut settings = ChatSettings::default();
        set(&mut settings, "grammar", r#"root ::= item{2} item ::= "- " [a-z]+ "\n""#).unwrap();
        assert!(matches!(settings.format, OutputFormat::Grammar(_)));
        assert!(show(&settings).ends_with("format grammar"));
        let e = set(&mut settings, "grammar", r#"root ::= "a" | item"#).unwrap_err();
        assert!(e.starts_with("/set grammar: grammar: ") && e.contains("item"), "{e}");
        assert!(matches!(settings.format, OutputFormat::Grammar(_)), "a refused grammar changes nothing");
        set(&mut settings, "json-schema", r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#).unwrap();
        assert!(show(&settings).ends_with("format json-schema"));
        let e = set(&mut settings, "json-schema", r#"{"type": "string", "pattern": "a+"}"#).unwrap_err();
        assert!(e.contains("/set json-schema:") && e.contains("pattern"), "{e}");
        let e = set(&mut settings, "grammar-file", "/nonexistent/g.gbnf").unwrap_err();
        assert!(e.starts_with("/set grammar-file: ") && e.contains("/nonexistent/g.gbnf"), "{e}");
        let dir = std::env::temp_dir().join(format!("infer-set-grammar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("yes.gbnf");
        std::fs::write(&file, "root ::= \"yes\" | \"no\"\n").unwrap();
        set(&mut settings, "grammar-file", file.to_str().unwrap()).unwrap();
        assert!(matches!(settings.format, OutputFormat::Grammar(_)));
        set(&mut settings, "format", "text").unwrap();
        assert_eq!(settings.format, OutputFormat::Text);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_sampler_order_is_set_checked_and_shown() {
        let mut settings = ChatSettings::default();
        assert!(
            show(&settings).contains("samplers penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature\n")
        );
        set(&mut settings, "samplers", "min_p;temperature").unwrap();
        assert_eq!(settings.params(1).samplers.to_string(), "min_p;temperature");
        assert!(show(&settings).contains("samplers min_p;temperature\n"));
        let e = set(&mut settings, "samplers", "min_p;warmth").unwrap_err();
        assert!(e.contains("/set samplers: unknown sampler `warmth`"), "{e}");
    }

    #[test]
    fn typical_dynatemp_and_mirostat_settings_are_set_checked_and_shown() {
        let mut settings = ChatSettings::default();
        for (key, value) in [("typical", "0.9"), ("dynatemp-range", "0.5"), ("mirostat", "2"), ("mirostat-ent", "3")] {
            set(&mut settings, key, value).unwrap();
        }
        assert_eq!((settings.typical_p, settings.dynatemp.range), (0.9, 0.5));
        assert_eq!((settings.mirostat.version, settings.mirostat.tau), (2, 3.0));
        for (key, value) in [("typical", "0"), ("dynatemp-exp", "0"), ("mirostat", "3"), ("mirostat-lr", "-1")] {
            assert!(set(&mut settings, key, value).unwrap_err().contains(key), "{key} {value}");
        }
        let shown = show(&settings);
        assert!(shown.contains("typical 0.9\n") && shown.contains("mirostat 2\nmirostat-ent 3\n"), "{shown}");
        settings.validate().unwrap();
    }

    #[test]
    fn commands_parse_and_mistakes_are_one_line() {
        assert_eq!(parse("help"), Ok(Command::Help));
        assert_eq!(parse(" system  Be brief. "), Ok(Command::System(Some("Be brief.".into()))));
        assert_eq!(parse("save my chat.json"), Ok(Command::Save("my chat.json".into())));
        assert_eq!(parse("set temp 0.5"), Ok(Command::Set(Some(("temp".into(), "0.5".into())))));
        assert_eq!(parse("set"), Ok(Command::Set(None)));
        for (bad, needle) in [
            ("frobnicate", "unknown command /frobnicate"),
            ("save", "needs a file name"),
            ("set temp", "needs a value"),
            ("undo 3", "takes no arguments"),
            ("", "must follow"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn set_checks_values_like_the_flags() {
        let mut s = ChatSettings::default();
        set(&mut s, "temp", "0").unwrap();
        set(&mut s, "top-k", "5").unwrap();
        set(&mut s, "seed", "42").unwrap();
        set(&mut s, "n", "16").unwrap();
        assert_eq!((s.temperature, s.top_k, s.seed, s.max_tokens), (0.0, 5, Some(42), Some(16)));
        set(&mut s, "n", "-1").unwrap();
        set(&mut s, "seed", "random").unwrap();
        assert_eq!((s.seed, s.max_tokens), (None, None));
        set(&mut s, "format", "json").unwrap();
        assert_eq!(s.format, OutputFormat::JsonObject);
        assert!(show(&s).ends_with("format json"));
        set(&mut s, "format", "text").unwrap();
        let before = s.clone();
        for (key, value, needle) in [
            ("temp", "hot", "/set temp: 'hot' is not a number"),
            ("temp", "-1", "/set temp: the temperature must be >= 0"),
            ("top-p", "1.5", "/set top-p: top-p must be in (0, 1]"),
            ("n", "-2", "/set n: must be -1"),
            ("seed", "x", "/set seed: 'x' is not a seed"),
            ("colour", "red", "unknown setting 'colour'"),
            ("format", "yaml", "/set format: 'yaml' is not a format (text or json)"),
        ] {
            let e = set(&mut s, key, value).unwrap_err();
            assert!(e.contains(needle), "{key} {value}: {e}");
        }
        assert_eq!(s, before, "a refused value changes nothing");
        assert!(show(&s).contains("seed random\nn -1 (no limit)"));
    }
}
