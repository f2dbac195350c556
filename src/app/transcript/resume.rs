//! What `--resume` brings back besides the turns: the model the conversation was with.

use std::path::PathBuf;

use super::Conversation;
use crate::app::config::Config;
use crate::gpu::atomic_file::same_file;

/// The conversation's model, when it is not the one about to load: loaded instead (`config.model`
/// set) when its file is still there and no model was named on the command line (`named`);
/// otherwise the note says which model it was and what goes on with it. `None`: nothing to say.
pub fn resume_model(c: &Conversation, named: bool, config: &mut Config) -> Option<String> {
    if c.turns.is_empty() || config.remote.selected.is_some() {
        return None;
    }
    let name = c.model.as_deref()?;
    let current = config
        .model
        .clone()
        .or_else(|| crate::app::fetch::default_model_path().ok());
    let current_label = current.as_ref().map_or_else(
        || "the default model".to_string(),
        |p| p.display().to_string(),
    );
    let Some(was) = c.model_path.as_deref().map(PathBuf::from) else {
        return Some(format!(
            "this conversation was with {name}, but its file (from an older hipscope) does not \
             record the model file; going on with {current_label}"
        ));
    };
    if current
        .as_ref()
        .is_some_and(|m| *m == was || same_file(m, &was))
    {
        return None;
    }
    if named {
        return Some(format!(
            "this conversation was with {name} ({}); going on with {current_label}, as asked",
            was.display()
        ));
    }
    if was.is_file() {
        config.model = Some(was.clone());
        return Some(format!(
            "this conversation was with {name}: loading it again ({})",
            was.display()
        ));
    }
    Some(format!(
        "this conversation was with {name} ({}), which is no longer there; going on with \
         {current_label}",
        was.display()
    ))
}
