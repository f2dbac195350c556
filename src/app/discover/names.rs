//! A model named rather than given as a path (`hipscope llama3.2`, `-m qwen2.5:0.5b`): looked up
//! among the models discovery finds (ollama's `name:tag`, a file's stem or the name the picker
//! shows, a Hugging Face repository), as ollama resolves a name without a tag to `:latest`. A
//! name that matches nothing gets the closest names found and a pointer to the picker.

use std::path::{Path, PathBuf};

use crate::ui::picker::ModelEntry;

/// A name that did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("no model file or known model named '{name}'{}", self.hint())]
    NotFound { name: String, closest: Vec<String> },
    #[error(
        "'{name}' names several models{}; give one of these names, or a path",
        listed(matches, "")
    )]
    Ambiguous { name: String, matches: Vec<String> },
}

impl NameError {
    /// What the user can do: the closest names found, and the picker.
    pub fn hint(&self) -> String {
        match self {
            NameError::NotFound { closest, .. } => format!(
                "{}; pick one with F2 in the chat, or give the path of a GGUF file",
                listed(closest, "the closest found")
            ),
            NameError::Ambiguous { .. } => String::new(),
        }
    }
}

fn listed(names: &[String], what: &str) -> String {
    match (names.is_empty(), what.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!(": {}", names.join(", ")),
        (false, false) => format!(" ({what}: {})", names.join(", ")),
    }
}

/// A model found by name: its file, and how it was found (`llama3.2:latest (ollama)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub label: String,
}

/// The names an entry answers to: each of ollama's `name:tag` aliases of one blob, the name the
/// picker shows, the file's stem, and a Hugging Face file's repository (`org/repo`).
fn aliases(e: &ModelEntry) -> Vec<String> {
    let mut out: Vec<String> = e.name.split(", ").map(str::to_string).collect();
    if let Some(stem) = e.path.file_stem() {
        out.push(stem.to_string_lossy().into_owned());
    }
    // `tiny-q8_0 (org/Tiny-GGUF)`: the file, and the repository.
    if let Some((file, repo)) = e.name.split_once(" (")
        && let Some(repo) = repo.strip_suffix(')')
    {
        out.push(file.to_string());
        out.push(repo.to_string());
    }
    out.retain(|a| !a.is_empty());
    out.dedup();
    out
}

fn label(e: &ModelEntry, alias: &str) -> String {
    format!("{alias} ({}, {})", e.source, e.path.display())
}

/// The entry `name` names: exactly (case-insensitive, `.gguf` optional), else ollama's
/// `name:latest`, else the one `name:TAG` there is. Remote engines are not files: skipped.
pub fn resolve(name: &str, entries: &[ModelEntry]) -> Result<Found, NameError> {
    let want = name.strip_suffix(".gguf").unwrap_or(name).to_lowercase();
    let files: Vec<&ModelEntry> = entries.iter().filter(|e| e.remote.is_none()).collect();
    let pick = |test: &dyn Fn(&str) -> bool| -> Vec<(&ModelEntry, String)> {
        let mut out: Vec<(&ModelEntry, String)> = Vec::new();
        for e in &files {
            if let Some(a) = aliases(e).into_iter().find(|a| test(&a.to_lowercase())) {
                out.push((e, a));
            }
        }
        out
    };
    let tiers: [&dyn Fn(&str) -> bool; 3] =
        [&|a| a == want, &|a| a == format!("{want}:latest"), &|a| {
            !want.contains(':') && a.starts_with(&format!("{want}:"))
        }];
    for test in tiers {
        match pick(test).as_slice() {
            [] => continue,
            [(e, a)] => {
                return Ok(Found {
                    path: e.path.clone(),
                    label: label(e, a),
                });
            }
            many => {
                return Err(NameError::Ambiguous {
                    name: name.to_string(),
                    matches: many.iter().map(|(e, a)| label(e, a)).collect(),
                });
            }
        }
    }
    Err(NameError::NotFound {
        name: name.to_string(),
        closest: closest(&want, &files),
    })
}

/// Up to three names most like `want` (Jaro–Winkler, as clap's suggestions), with their source.
fn closest(want: &str, files: &[&ModelEntry]) -> Vec<String> {
    let mut scored: Vec<(f64, String)> = Vec::new();
    for e in files {
        let best = aliases(e)
            .into_iter()
            .map(|a| (strsim::jaro_winkler(want, &a.to_lowercase()), a))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((score, a)) = best.filter(|(s, _)| *s >= 0.7) {
            scored.push((score, format!("{a} ({})", e.source)));
        }
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}

/// Whether a model argument that is not a file may be a name to look up: not a path written as
/// one (absolute, `./`, `../`, `~/`) and not a `.gguf` file with folders in front.
pub fn may_be_a_name(arg: &Path) -> bool {
    let s = arg.to_string_lossy();
    let path_like = arg.is_absolute()
        || ["./", "../", "~/"].iter().any(|p| s.starts_with(p))
        || (s.contains('/') && s.to_lowercase().ends_with(".gguf"));
    !s.is_empty() && !path_like
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::picker::ModelHeader;

    fn entry(name: &str, path: &str, source: &str) -> ModelEntry {
        ModelEntry {
            name: name.into(),
            path: PathBuf::from(path),
            source: source.into(),
            size: 0,
            header: Ok(ModelHeader::default()),
            remote: None,
        }
    }

    fn entries() -> Vec<ModelEntry> {
        vec![
            entry(
                "llama3.2:latest, llama3.2:3b",
                "/o/blobs/sha256-aa",
                "ollama",
            ),
            entry("qwen2.5:0.5b", "/o/blobs/sha256-bb", "ollama"),
            entry("gemma3:270m", "/o/blobs/sha256-cc", "ollama"),
            entry("gemma3:1b", "/o/blobs/sha256-dd", "ollama"),
            entry(
                "SmolLM2 135M Instruct",
                "/c/SmolLM2-135M-Instruct.Q4_1.gguf",
                "hipscope",
            ),
            entry(
                "tiny-q8_0 (org/Tiny-GGUF)",
                "/hf/models--org--Tiny-GGUF/snapshots/r/tiny-q8_0.gguf",
                "Hugging Face",
            ),
        ]
    }

    #[test]
    fn names_resolve_as_ollama_and_the_picker_name_them() {
        let e = entries();
        let path = |n: &str| resolve(n, &e).map(|f| f.path.display().to_string());
        // ollama: a name without a tag is `:latest`; a tag picks its blob.
        assert_eq!(path("llama3.2").unwrap(), "/o/blobs/sha256-aa");
        assert_eq!(path("llama3.2:3b").unwrap(), "/o/blobs/sha256-aa");
        // The one tag there is.
        assert_eq!(path("qwen2.5").unwrap(), "/o/blobs/sha256-bb");
        // A file's stem (with or without .gguf), the picker's name, a Hugging Face repository.
        let smol = "/c/SmolLM2-135M-Instruct.Q4_1.gguf";
        assert_eq!(path("smollm2-135m-instruct.q4_1").unwrap(), smol);
        assert_eq!(path("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap(), smol);
        assert_eq!(path("SmolLM2 135M Instruct").unwrap(), smol);
        assert!(path("org/Tiny-GGUF").unwrap().ends_with("tiny-q8_0.gguf"));
        let f = resolve("llama3.2", &e).unwrap();
        assert_eq!(f.label, "llama3.2:latest (ollama, /o/blobs/sha256-aa)");
    }

    #[test]
    fn an_unknown_name_lists_the_closest_and_points_to_the_picker() {
        let e = entries();
        let err = resolve("llama3.1", &e).unwrap_err();
        let NameError::NotFound { closest, .. } = &err else {
            panic!("{err:?}")
        };
        assert!(
            closest
                .first()
                .is_some_and(|c| c.starts_with("llama3.2:") && c.ends_with("(ollama)")),
            "{closest:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("F2") && msg.contains("closest found"), "{msg}");
        // Two tags, none `latest`: which one is for the user to say.
        let err = resolve("gemma3", &e).unwrap_err();
        assert!(matches!(err, NameError::Ambiguous { ref matches, .. } if matches.len() == 2));
        assert!(err.to_string().contains("gemma3:270m"), "{err}");
        // Nothing alike: no list, still the way on.
        let err = resolve("xyzzy-unrelated", &e).unwrap_err();
        assert!(matches!(err, NameError::NotFound { ref closest, .. } if closest.is_empty()));
    }

    #[test]
    fn paths_written_as_paths_are_not_names() {
        for p in ["/m/x.gguf", "./x", "../x.gguf", "~/x", "models/x.gguf", ""] {
            assert!(!may_be_a_name(Path::new(p)), "{p}");
        }
        for n in [
            "llama3.2",
            "qwen2.5:0.5b",
            "user/model:latest",
            "org/repo",
            "x.gguf",
        ] {
            assert!(may_be_a_name(Path::new(n)), "{n}");
        }
    }
}
