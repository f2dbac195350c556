use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/cfg/config.toml"))
}

#[test]
fn the_documented_file_is_exactly_the_defaults() {
    assert_eq!(parse(DEFAULT_CONFIG_TOML), Ok(Config::default()));
}

#[test]
fn the_documented_file_mentions_every_key() {
    for key in TOP_KEYS
        .iter()
        .chain(SAMPLER_KEYS)
        .chain(UI_KEYS)
        .chain(MODELS_KEYS)
        .chain(TRANSCRIPT_KEYS)
        .chain(LOG_KEYS)
        .chain(QUIT_KEYS)
        .chain(TELEMETRY_KEYS)
        .chain(FETCH_KEYS)
    {
        assert!(
            DEFAULT_CONFIG_TOML.contains(&format!("{key} ="))
                || DEFAULT_CONFIG_TOML.contains(&format!("[{key}]")),
            "config.toml does not document `{key}`"
        );
    }
}

#[test]
fn values_override_the_defaults() {
    let c = parse(
        "model = \"/m/x.gguf\"\nbackend = \"cpu\"\nctx_size = 2048\nctx_discard = 30\n\
         [sampler]\ntemp = 0.2\ntop_k = 0\nstop = [\"<|im_end|>\"]\n\
         [ui]\ntheme = \"mono\"\ndiagnostics = \"hide\"\npanels = [\"gpu\"]\n\
         [quit]\ndrain_timeout_ms = 1500\n[fetch]\nread_timeout_s = 5\ntries = 1\n",
    )
    .unwrap();
    assert_eq!(c.fetch.read_timeout, Duration::from_secs(5));
    assert_eq!(c.fetch.tries, 1);
    assert_eq!(
        c.fetch.connect_timeout,
        FetchConfig::default().connect_timeout
    );
    let e = parse("[fetch]\nread_timeout_s = 0\n").unwrap_err();
    assert!(e.to_string().contains("`fetch.read_timeout_s` = 0"), "{e}");
    assert_eq!(c.model, Some(PathBuf::from("/m/x.gguf")));
    assert_eq!(c.backend, BackendChoice::Cpu);
    assert_eq!(c.ctx_size, Some(2048));
    assert_eq!(c.ctx_discard, 30);
    assert_eq!(c.sampler.temp, 0.2);
    assert_eq!(c.sampler.top_k, 0);
    assert_eq!(c.sampler.stop, ["<|im_end|>"]);
    assert_eq!(c.ui.theme, ThemeName::Mono);
    assert_eq!(c.ui.diagnostics, Some(false));
    assert!(c.ui.panels.gpu && !c.ui.panels.streams);
    assert_eq!(c.quit.drain_deadline, Duration::from_millis(1500));
    assert_eq!(c.quit.deadline(), Duration::from_millis(3500));
}

#[test]
fn a_bad_value_names_the_key_and_what_is_allowed() {
    let e = parse("[sampler]\ntemp = \"hot\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "/cfg/config.toml: `sampler.temp` = \"hot\" is not allowed: a number from 0 to 5"
    );
    let e = parse("[sampler]\ntop_p = 1.5\n").unwrap_err();
    assert!(e.to_string().contains("`sampler.top_p` = 1.5"), "{e}");
    let e = parse("backend = \"metal\"\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("`backend` = \"metal\" is not allowed: \"auto\", \"hip\""),
        "{e}"
    );
    let e = parse("[ui]\nfps = 0\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("`ui.fps` = 0 is not allowed: a whole number from 1 to 120"),
        "{e}"
    );
    let e = parse("[ui]\npanels = [\"streams\", \"disk\"]\n").unwrap_err();
    assert!(e.to_string().contains("`ui.panels` = \"disk\""), "{e}");
}

#[test]
fn unknown_keys_are_named_with_the_known_ones() {
    let e = parse("[sampler]\ntmep = 0.5\n").unwrap_err();
    let ConfigError::UnknownKey { key, allowed, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(key, "sampler.tmep");
    assert!(allowed.contains("`temp`"));
}

#[test]
fn broken_toml_says_where() {
    let e = parse("[sampler\ntemp = 0.5\n").unwrap_err();
    let ConfigError::Syntax { message, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(message.contains("line 1"), "{message}");
}

#[test]
fn a_missing_file_gives_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("nope.toml");
    assert_eq!(Config::load(&p), Ok(Config::default()));
    assert!(write_default_if_missing(&p).unwrap());
    assert!(!write_default_if_missing(&p).unwrap());
    assert_eq!(Config::load(&p), Ok(Config::default()));
}

#[test]
fn verbosity_raises_the_level() {
    assert_eq!(LogLevel::Info.raised(0), LogLevel::Info);
    assert_eq!(LogLevel::Info.raised(1), LogLevel::Debug);
    assert_eq!(LogLevel::Warn.raised(5), LogLevel::Trace);
}

#[test]
fn kept_settings_change_only_their_values_and_keep_the_comments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    let mine = DEFAULT_CONFIG_TOML.replace("[sampler]", "# my own note, kept\n[sampler]");
    std::fs::write(&path, &mine).unwrap();
    let mut s = SamplerConfig {
        temp: 0.3,
        top_k: 12,
        seed: 42,
        stop: vec!["</s>".into()],
        ..SamplerConfig::default()
    };
    let start = SamplerConfig::default();
    keep_sampler_defaults(&path, &start, &s).unwrap();
    let after = std::fs::read_to_string(&path).unwrap();
    for line in mine.lines().filter(|l| l.trim_start().starts_with('#')) {
        assert!(after.contains(line), "lost {line:?}:\n{after}");
    }
    let c = Config::load(&path).unwrap();
    assert_eq!(c.sampler, s);
    let mut rest = c.clone();
    rest.sampler = SamplerConfig::default();
    assert_eq!(rest, Config::default(), "only the sampler changed");
    // The random seed is written as the word.
    let before = s.clone();
    s.seed = crate::model::sampler::RANDOM_SEED;
    keep_sampler_defaults(&path, &before, &s).unwrap();
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("seed = \"random\"")
    );
    // No file yet: the documented one, with these values.
    let fresh = dir.path().join("new/config.toml");
    keep_sampler_defaults(&fresh, &start, &s).unwrap();
    assert_eq!(Config::load(&fresh).unwrap().sampler, s);
}

#[test]
fn kept_settings_are_only_what_set_changed_written_through_a_link() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("dotfiles")).unwrap();
    let target = dir.path().join("dotfiles/config.toml");
    std::fs::write(&target, DEFAULT_CONFIG_TOML).unwrap();
    let link = dir.path().join("config.toml");
    std::os::unix::fs::symlink("dotfiles/config.toml", &link).unwrap();
    // `-n 16` on the command line, then `/set temp 0.3`.
    let start = SamplerConfig {
        n_predict: 16,
        ..SamplerConfig::default()
    };
    let now = SamplerConfig {
        temp: 0.3,
        ..start.clone()
    };
    assert_eq!(
        keep_sampler_defaults(&link, &start, &now).unwrap(),
        ["temp"]
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let c = Config::load(&target).unwrap();
    assert_eq!(c.sampler.temp, 0.3);
    assert_eq!(c.sampler.n_predict, SamplerConfig::default().n_predict);
    // Nothing changed: nothing written.
    let before = std::fs::read_to_string(&target).unwrap();
    assert!(keep_sampler_defaults(&link, &now, &now).unwrap().is_empty());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), before);
}

#[test]
fn ctx_size_0_is_the_whole_trained_context_unless_the_file_says_otherwise() {
    assert_eq!(parse("ctx_size = 0\n").unwrap().ctx_size, Some(0));
    assert_eq!(parse("").unwrap().ctx_size, None);
    // The first-start copy of older versions documents 0 as "at most 4096": kept so.
    let old = "# Context length in tokens. 0 uses the model's own, at most 4096.\nctx_size = 0\n";
    assert_eq!(parse(old).unwrap().ctx_size, None);
}
