//! Writing config.toml: the documented defaults at the first start, and `/set save`'s sampler
//! settings, each whole or not at all (`gpu::atomic_file`).

use std::path::Path;

use super::{Config, DEFAULT_CONFIG_TOML};
use crate::model::protocol::SamplerConfig;
use crate::ui::sampler;

/// Writes the documented defaults as the user's config file if there is none yet, so that
/// there is a file to edit. Failure is not an error: the defaults apply either way.
pub fn write_default_if_missing(path: &Path) -> std::io::Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::gpu::dirs::create_private_dir(dir)?;
    }
    // Whole or not at all: a full disk must not leave an empty config.toml behind.
    match crate::gpu::atomic_file::write_bytes(
        path,
        crate::gpu::atomic_file::Replace::Never,
        DEFAULT_CONFIG_TOML.as_bytes(),
    ) {
        Ok(()) => Ok(true),
        // Another instance wrote it first: theirs stays.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// `/set save`: writes the sampler settings that `/set` changed (those that differ between
/// `start`, the session's settings after the flags, and `now`) into the `[sampler]` table of the
/// config file at `path` (the documented defaults if there is none yet), and only those: a value
/// that came from a flag (`-n 16`) stays out of the file, and comments, order and every other
/// setting stay as the user left them (`toml_edit`). A symbolic link (a dotfiles link) is
/// written through: its target is replaced atomically and the link stays. The result is checked
/// to load before it replaces the file. Returns the names of the settings written (none: nothing
/// was changed, and nothing is written).
pub fn keep_sampler_defaults(
    path: &Path,
    start: &SamplerConfig,
    now: &SamplerConfig,
) -> Result<Vec<&'static str>, String> {
    let mut changed: Vec<&'static str> = sampler::FIELDS
        .iter()
        .filter(|f| (f.get)(start) != (f.get)(now))
        .map(|f| f.name)
        .collect();
    if start.stop != now.stop {
        changed.push("stop");
    }
    if changed.is_empty() {
        return Ok(changed);
    }
    let target = crate::gpu::atomic_file::through_links(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let text = match std::fs::read_to_string(&target) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DEFAULT_CONFIG_TOML.to_string(),
        Err(e) => return Err(format!("{}: cannot read it: {e}", target.display())),
    };
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| format!("{}: not valid TOML: {e}", target.display()))?;
    let table = doc
        .entry("sampler")
        .or_insert(toml_edit::table())
        .as_table_mut()
        .ok_or_else(|| format!("{}: `sampler` is not a table", target.display()))?;
    let mut put = |key: &str, mut new: toml_edit::Value| match table
        .get_mut(key)
        .and_then(|i| i.as_value_mut())
    {
        Some(old) => {
            // The old value's surroundings (a trailing comment) stay.
            *new.decor_mut() = old.decor().clone();
            *old = new;
        }
        None => table[key] = toml_edit::value(new),
    };
    for f in sampler::FIELDS.iter().filter(|f| changed.contains(&f.name)) {
        let v = (f.get)(now);
        let value = if let Ok(i) = v.parse::<i64>() {
            toml_edit::Value::from(i)
        } else if let Ok(x) = v.parse::<f64>() {
            toml_edit::Value::from(x)
        } else {
            toml_edit::Value::from(v)
        };
        put(f.name, value);
    }
    if changed.contains(&"stop") {
        put(
            "stop",
            toml_edit::Value::Array(now.stop.iter().map(String::as_str).collect()),
        );
    }
    let out = doc.to_string();
    let check = Config::parse(&out, &target).map_err(|e| e.to_string())?;
    let same = sampler::FIELDS
        .iter()
        .filter(|f| changed.contains(&f.name))
        .all(|f| (f.get)(&check.sampler) == (f.get)(now))
        && (!changed.contains(&"stop") || check.sampler.stop == now.stop);
    if !same {
        return Err(format!(
            "{}: the settings would not read back as they are",
            target.display()
        ));
    }
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::gpu::dirs::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    crate::gpu::atomic_file::write_bytes(
        &target,
        crate::gpu::atomic_file::Replace::Allow,
        out.as_bytes(),
    )
    .map_err(|e| format!("{}: {e}", target.display()))?;
    Ok(changed)
}
