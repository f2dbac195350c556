//! Finds GGUF model files where people keep them: hipscope's cache, llama.cpp's cache, LM
//! Studio's model folders, ollama's blob store (named from its manifests), the Hugging Face hub
//! cache, and the folders named in the config. Each file's header is read for the picker. A model
//! given by name on the command line is looked up among them (`names.rs`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::model::gguf::GgufFile;
use crate::ui::picker::{ModelEntry, ModelHeader};

pub mod names;

/// The model called `name` among those found in `places` (see [`names::resolve`]).
pub fn find_named(name: &str, places: &Places) -> Result<names::Found, names::NameError> {
    let (entries, _) = scan(&places.roots());
    names::resolve(name, &entries)
}

/// How a root is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `.gguf` files anywhere below.
    Files,
    /// ollama: `manifests/<registry>/<namespace>/<model>/<tag>` naming `blobs/sha256-<hex>`.
    Ollama,
    /// Hugging Face hub cache: `models--<org>--<name>/snapshots/<rev>/**.gguf`.
    HuggingFace,
    /// One file (`dir` is the file): the model loaded now, wherever it lives.
    File,
}

/// A place to look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    pub dir: PathBuf,
    /// Shown in the picker's source column.
    pub source: &'static str,
    pub layout: Layout,
}

/// Where to look, from the environment the way each tool reads it.
#[derive(Clone, Debug, Default)]
pub struct Places {
    pub home: Option<PathBuf>,
    /// hipscope's cache directory (models are in `models/` under it).
    pub hipscope_cache: Option<PathBuf>,
    /// `LLAMA_CACHE`.
    pub llama_cache: Option<PathBuf>,
    /// `OLLAMA_MODELS`.
    pub ollama_models: Option<PathBuf>,
    /// `HF_HUB_CACHE`, or `HF_HOME/hub`.
    pub hf_hub: Option<PathBuf>,
    pub extra: Vec<PathBuf>,
    pub scan_defaults: bool,
    /// The model loaded now, listed first even if it lives outside every folder searched.
    pub current: Option<PathBuf>,
}

impl Places {
    /// From this process's environment.
    pub fn from_env(
        hipscope_cache: Option<PathBuf>,
        extra: Vec<PathBuf>,
        scan_defaults: bool,
    ) -> Places {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Places {
            home: var("HOME"),
            hipscope_cache,
            llama_cache: var("LLAMA_CACHE"),
            ollama_models: var("OLLAMA_MODELS"),
            hf_hub: var("HF_HUB_CACHE").or_else(|| var("HF_HOME").map(|h| h.join("hub"))),
            extra,
            scan_defaults,
            current: None,
        }
    }

    /// Where a model named on the command line is looked up: where the picker looks, with the
    /// search paths of the settings (`app/settings.rs`).
    pub fn for_names(config: &crate::app::config::Config) -> Places {
        Places::from_env(
            Some(crate::gpu::dirs::cache_dir()),
            config.models.search_paths.clone(),
            config.models.scan_default_locations,
        )
    }

    pub fn roots(&self) -> Vec<Root> {
        let mut roots = Vec::new();
        if let Some(c) = &self.current {
            roots.push(Root {
                dir: c.clone(),
                source: "in use",
                layout: Layout::File,
            });
        }
        let files = |dir: PathBuf, source| Root {
            dir,
            source,
            layout: Layout::Files,
        };
        for dir in &self.extra {
            roots.push(files(dir.clone(), "config"));
        }
        if !self.scan_defaults {
            return roots;
        }
        if let Some(c) = &self.hipscope_cache {
            roots.push(files(c.join("models"), "hipscope"));
        }
        let home = self.home.as_deref();
        if let Some(d) = self
            .llama_cache
            .clone()
            .or_else(|| home.map(|h| h.join(".cache/llama.cpp")))
        {
            roots.push(files(d, "llama.cpp"));
        }
        if let Some(h) = home {
            roots.push(files(h.join(".lmstudio/models"), "LM Studio"));
            roots.push(files(h.join(".cache/lm-studio/models"), "LM Studio"));
        }
        if let Some(d) = self
            .ollama_models
            .clone()
            .or_else(|| home.map(|h| h.join(".ollama/models")))
        {
            roots.push(Root {
                dir: d,
                source: "ollama",
                layout: Layout::Ollama,
            });
        }
        if let Some(d) = self
            .hf_hub
            .clone()
            .or_else(|| home.map(|h| h.join(".cache/huggingface/hub")))
        {
            roots.push(Root {
                dir: d,
                source: "Hugging Face",
                layout: Layout::HuggingFace,
            });
        }
        roots
    }
}

/// Deepest folder nesting searched below a root (LM Studio uses publisher/repo/file).
const MAX_DEPTH: usize = 6;
/// Most files looked at below one root, so that a root pointed at `/` cannot stall the picker.
const MAX_FILES: usize = 20_000;

/// Searches every root; returns the models found and a line per folder searched.
/// The configured remote engines as picker entries (not probed here: picking one connects).
pub fn remote_entries(specs: &[crate::model::remote::client::RemoteSpec]) -> Vec<ModelEntry> {
    specs
        .iter()
        .map(|s| ModelEntry {
            name: s.name.clone(),
            path: PathBuf::from(&s.url),
            source: "remote".into(),
            size: 0,
            header: Ok(ModelHeader {
                architecture: "remote".into(),
                name: s.model.clone(),
                ..ModelHeader::default()
            }),
            remote: Some(s.clone()),
        })
        .collect()
}

pub fn scan(roots: &[Root]) -> (Vec<ModelEntry>, Vec<String>) {
    let mut found: Vec<(PathBuf, String, &'static str)> = Vec::new();
    let mut searched = Vec::new();
    for root in roots {
        if root.layout == Layout::File {
            // The model in use: listed, not searched, so not a line in `searched`.
            if root.dir.is_file() {
                found.push((root.dir.clone(), stem(&root.dir), root.source));
            }
            continue;
        }
        let exists = root.dir.is_dir();
        searched.push(format!(
            "{} ({}){}",
            root.dir.display(),
            root.source,
            if exists { "" } else { " — not found" }
        ));
        if !exists {
            continue;
        }
        match root.layout {
            Layout::Files => {
                let mut files = Vec::new();
                walk(&root.dir, 0, &mut files, &mut 0);
                for f in files {
                    let name = stem(&f);
                    found.push((f, name, root.source));
                }
            }
            Layout::Ollama => {
                for (blob, name) in ollama(&root.dir) {
                    found.push((blob, name, root.source));
                }
            }
            Layout::HuggingFace => {
                for (f, name) in hugging_face(&root.dir) {
                    found.push((f, name, root.source));
                }
            }
            Layout::File => {}
        }
    }
    // One entry per file, whichever root found it first (LM Studio and others symlink).
    let mut seen = HashSet::new();
    let mut entries = Vec::new();
    let mut from_header = Vec::new();
    for (path, name, source) in found {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !seen.insert(key) {
            continue;
        }
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let header = inspect(&path);
        // A file known only by its stem goes by the name the chat will give it once loaded
        // (unless two files share that name: see below).
        let name = match &header {
            Ok(h) if name == stem(&path) => {
                from_header.push(entries.len());
                crate::model::loader::display_name(h.name.as_deref(), &name, &h.quant)
            }
            _ => name,
        };
        entries.push(ModelEntry {
            remote: None,
            name,
            header,
            path,
            source: source.to_string(),
            size,
        });
    }
    // Files whose headers give the same name are told apart by their stems.
    let mut count = std::collections::HashMap::new();
    for e in &entries {
        *count.entry(e.name.clone()).or_insert(0) += 1;
    }
    for i in from_header {
        let e = &mut entries[i];
        if count[&e.name] > 1 {
            e.name = stem(&e.path);
        }
    }
    (entries, searched)
}

/// Reads what the picker shows from a GGUF header.
pub fn inspect(path: &Path) -> Result<ModelHeader, String> {
    let f = GgufFile::open(path).map_err(|e| e.to_string())?;
    let architecture = f.architecture().unwrap_or("?").to_string();
    let context_length = f.get_u64(&format!("{architecture}.context_length"));
    Ok(ModelHeader {
        quant: f.type_label().unwrap_or_else(|| "?".into()),
        parameters: Some(f.parameter_count()).filter(|&n| n > 0),
        context_length,
        name: f.get_str("general.name").map(str::to_string),
        architecture,
    })
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// `x-00002-of-00003.gguf`: a shard after the first, which cannot be loaded alone.
fn is_later_shard(name: &str) -> bool {
    let Some(base) = name.strip_suffix(".gguf") else {
        return false;
    };
    let parts: Vec<&str> = base.rsplitn(4, '-').collect();
    matches!(parts.as_slice(), [total, "of", index, _]
        if total.len() == 5 && index.len() == 5
            && total.chars().all(|c| c.is_ascii_digit())
            && index.chars().all(|c| c.is_ascii_digit())
            && *index != "00001")
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>, budget: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        *budget += 1;
        if *budget > MAX_FILES {
            return;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            // Symlinked folders are not followed: they can loop.
            if depth + 1 < MAX_DEPTH {
                walk(&path, depth + 1, out, budget);
            }
        } else if name.to_ascii_lowercase().ends_with(".gguf")
            && !is_later_shard(&name)
            && path.is_file()
        {
            out.push(path);
        }
    }
}

/// ollama's models: every manifest names its model layer by digest.
fn ollama(root: &Path) -> Vec<(PathBuf, String)> {
    let mut manifests = Vec::new();
    collect_files(&root.join("manifests"), 0, &mut manifests);
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for m in manifests {
        let Ok(text) = std::fs::read_to_string(&m) else {
            continue;
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(layers) = json.get("layers").and_then(|l| l.as_array()) else {
            continue;
        };
        let digest = layers.iter().find_map(|l| {
            (l.get("mediaType")?.as_str()? == "application/vnd.ollama.image.model")
                .then(|| l.get("digest")?.as_str())
                .flatten()
        });
        let Some(digest) = digest else { continue };
        // Digests are `sha256:<hex>`; blob files are `sha256-<hex>`.
        let blob = root.join("blobs").join(digest.replace(':', "-"));
        if !blob.is_file() {
            continue;
        }
        let name = ollama_name(root, &m);
        match out.iter_mut().find(|(b, _)| *b == blob) {
            Some((_, n)) => {
                n.push_str(", ");
                n.push_str(&name);
            }
            None => out.push((blob, name)),
        }
    }
    out
}

/// `manifests/registry.ollama.ai/library/llama3/8b` → `llama3:8b`; other namespaces and
/// registries stay in the name.
fn ollama_name(root: &Path, manifest: &Path) -> String {
    let rel = manifest
        .strip_prefix(root.join("manifests"))
        .unwrap_or(manifest);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [registry, namespace, model, tag] => {
            if registry == "registry.ollama.ai" && namespace == "library" {
                format!("{model}:{tag}")
            } else if registry == "registry.ollama.ai" {
                format!("{namespace}/{model}:{tag}")
            } else {
                format!("{registry}/{namespace}/{model}:{tag}")
            }
        }
        _ => parts.join("/"),
    }
}

fn collect_files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() && depth < 5 => collect_files(&p, depth + 1, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
    out.sort();
}

/// Hugging Face hub cache: files in snapshots are symlinks into `blobs/`.
fn hugging_face(root: &Path) -> Vec<(PathBuf, String)> {
    let Ok(repos) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut repos: Vec<_> = repos.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    repos.sort();
    let mut out = Vec::new();
    for repo in repos {
        let Some(dir_name) = repo.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let Some(id) = dir_name.strip_prefix("models--") else {
            continue;
        };
        let Ok(snapshots) = std::fs::read_dir(repo.join("snapshots")) else {
            continue;
        };
        for snap in snapshots.filter_map(|e| e.ok()) {
            let mut files = Vec::new();
            walk(&snap.path(), 2, &mut files, &mut 0);
            for f in files {
                // `models--bartowski--Llama-3.2-1B-Instruct-GGUF` → `bartowski/Llama-3.2-…`.
                let repo_id = id.replacen("--", "/", 1);
                out.push((f.clone(), format!("{} ({repo_id})", stem(&f))));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::quant::GgmlType;
    use crate::model::gguf::{GgufWriter, TensorSpec, Value};

    /// A small valid GGUF (one F32 tensor) written with the project's writer.
    fn write_gguf(path: &Path, arch: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let metadata = vec![
            (
                "general.architecture".to_string(),
                Value::String(arch.into()),
            ),
            (
                "general.name".to_string(),
                Value::String("Tiny Test".into()),
            ),
            (format!("{arch}.context_length"), Value::U32(2048)),
        ];
        let tensors = [TensorSpec::new("token_embd.weight", &[4, 2], GgmlType::F32)];
        let mut w = GgufWriter::new(file, &metadata, &tensors).unwrap();
        w.write_tensor(&[0u8; 32]).unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn shards_after_the_first_are_skipped() {
        assert!(!is_later_shard("m-00001-of-00003.gguf"));
        assert!(is_later_shard("m-00002-of-00003.gguf"));
        assert!(!is_later_shard("model.gguf"));
        assert!(!is_later_shard("weird-of-x.gguf"));
    }

    #[test]
    fn finds_models_in_every_usual_place() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        write_gguf(&h.join("cache/hipscope/models/SmolLM2.gguf"), "llama");
        write_gguf(&h.join(".cache/llama.cpp/qwen.gguf"), "qwen2");
        write_gguf(&h.join(".lmstudio/models/pub/repo/lms-model.gguf"), "llama");
        // ollama: a blob named by a manifest.
        let blob = h.join(".ollama/models/blobs/sha256-abc123");
        write_gguf(&blob, "gemma");
        let manifest = h.join(".ollama/models/manifests/registry.ollama.ai/library/gemma/2b");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::write(
            &manifest,
            r#"{"layers":[{"mediaType":"application/vnd.ollama.image.license","digest":"sha256:zzz"},
                          {"mediaType":"application/vnd.ollama.image.model","digest":"sha256:abc123"}]}"#,
        )
        .unwrap();
        // Hugging Face: a snapshot file that is a symlink into blobs/.
        let hf = h.join(".cache/huggingface/hub/models--org--Tiny-GGUF");
        write_gguf(&hf.join("blobs/deadbeef"), "phi3");
        std::fs::create_dir_all(hf.join("snapshots/rev1")).unwrap();
        std::os::unix::fs::symlink(
            hf.join("blobs/deadbeef"),
            hf.join("snapshots/rev1/tiny-q8_0.gguf"),
        )
        .unwrap();
        // A config folder with a corrupt file and a later shard.
        std::fs::create_dir_all(h.join("mine")).unwrap();
        std::fs::write(h.join("mine/broken.gguf"), b"GGUF\x03\0\0\0truncated").unwrap();
        std::fs::write(h.join("mine/big-00002-of-00002.gguf"), b"").unwrap();

        // The model in use lives outside every usual place; it is listed first, once.
        write_gguf(&h.join("elsewhere/current.gguf"), "llama");
        let places = Places {
            home: Some(h.to_path_buf()),
            hipscope_cache: Some(h.join("cache/hipscope")),
            extra: vec![h.join("mine"), h.join("elsewhere")],
            scan_defaults: true,
            current: Some(h.join("elsewhere/current.gguf")),
            ..Places::default()
        };
        let (entries, searched) = scan(&places.roots());
        let summary: Vec<(String, String, String)> = entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    e.source.clone(),
                    e.header
                        .as_ref()
                        .map(|h| h.architecture.clone())
                        .unwrap_or_else(|_| "ERR".into()),
                )
            })
            .collect();
        let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            summary,
            [
                s("current", "in use", "llama"),
                s("broken", "config", "ERR"),
                s("SmolLM2", "hipscope", "llama"),
                s("qwen", "llama.cpp", "qwen2"),
                s("lms-model", "LM Studio", "llama"),
                s("gemma:2b", "ollama", "gemma"),
                s("tiny-q8_0 (org/Tiny-GGUF)", "Hugging Face", "phi3"),
            ]
        );
        let smol = entries.iter().find(|e| e.name == "SmolLM2").unwrap();
        let header = smol.header.as_ref().unwrap();
        assert_eq!(header.quant, "F32");
        assert_eq!(header.parameters, Some(8));
        assert_eq!(header.context_length, Some(2048));
        assert_eq!(header.name.as_deref(), Some("Tiny Test"));
        let broken = entries.iter().find(|e| e.name == "broken").unwrap();
        let why = broken.header.as_ref().unwrap_err();
        assert!(why.contains("broken.gguf"), "{why}");
        assert!(
            searched
                .iter()
                .any(|l| l.contains(".cache/lm-studio/models") && l.ends_with("not found"))
        );
    }

    #[test]
    fn ollama_names_keep_non_library_namespaces() {
        let root = Path::new("/o");
        let n = |p: &str| ollama_name(root, &root.join("manifests").join(p));
        assert_eq!(n("registry.ollama.ai/library/llama3/8b"), "llama3:8b");
        assert_eq!(
            n("registry.ollama.ai/user/model/latest"),
            "user/model:latest"
        );
        assert_eq!(n("hf.co/org/repo/Q4_K_M"), "hf.co/org/repo:Q4_K_M");
    }
}

/// Tab completion of a path typed after `/model` or `/save`: the entries of its folder whose
/// names start with its last part, written as typed (a leading `~/` kept), folders ending with
/// `/`, hidden ones only when a `.` was typed; sorted, at most 200.
pub fn complete_path(typed: &str) -> Vec<String> {
    let (dir_typed, stem) = match typed.rfind('/') {
        Some(i) => (&typed[..=i], &typed[i + 1..]),
        None => ("", typed),
    };
    let dir = match dir_typed.strip_prefix("~/") {
        Some(rest) => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(rest),
            None => PathBuf::from(dir_typed),
        },
        None if dir_typed.is_empty() => PathBuf::from("."),
        None => PathBuf::from(dir_typed),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !name.starts_with(stem) || (name.starts_with('.') && !stem.starts_with('.')) {
                return None;
            }
            let is_dir = std::fs::metadata(e.path()).is_ok_and(|m| m.is_dir());
            Some(format!(
                "{dir_typed}{name}{}",
                if is_dir { "/" } else { "" }
            ))
        })
        .collect();
    out.sort();
    out.truncate(200);
    out
}

#[cfg(test)]
mod complete_tests {
    use super::complete_path;

    #[test]
    fn completes_files_and_folders_in_the_typed_folder() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("models")).unwrap();
        std::fs::write(d.path().join("model-a.gguf"), b"").unwrap();
        std::fs::write(d.path().join("notes.md"), b"").unwrap();
        std::fs::write(d.path().join(".hidden"), b"").unwrap();
        let base = format!("{}/", d.path().display());
        assert_eq!(
            complete_path(&format!("{base}mo")),
            [format!("{base}model-a.gguf"), format!("{base}models/")]
        );
        assert_eq!(
            complete_path(&base).len(),
            3,
            "hidden files only after a dot"
        );
        assert_eq!(
            complete_path(&format!("{base}.h")),
            [format!("{base}.hidden")]
        );
        assert!(complete_path(&format!("{base}nothing/x")).is_empty());
    }
}
