//! One resolver for every command's settings: flags › environment › config file › defaults.
//!
//! [`Settings::resolve`] finds the settings file (`--config FILE`, before or after the
//! subcommand; else `HIPSCOPE_CONFIG`; else `config.toml` in the config folder of
//! [`Dirs::from_env`]), reads it over the defaults ([`Config::load`]), and adds the tuning knobs
//! that only the environment sets ([`Tuning::from_env`]). Each command then lays its own flags on
//! top (`ChatArgs::apply`, `cmd/model_args.rs`). A file or knob that cannot be used is a
//! [`ConfigError`]: exit code 2 for every command, before anything is started.
//!
//! The environment stays the only way in for what tests and child processes need
//! (`HIPSCOPE_HOME`, `HIPSCOPE_SYSFS_ROOT`/`PROCFS_ROOT`/`DEV_ROOT`, `HIPSCOPE_FAULT`; the runtime
//! library overrides `HIPSCOPE_*_LIBRARY`, `HIPSCOPE_KERNELS`, `HIPSCOPE_FORCE_COMPILE` and
//! `HIPSCOPE_ROCBLAS_TRUST_ARCH`): the kernel compiler and `doctor`'s checks run in child
//! processes, which inherit the environment and no flags.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::config::{Config, ConfigError};
pub use super::tuning::Tuning;
use crate::gpu::dirs::Dirs;
use crate::gpu::quant::dot::Isa;
use crate::gpu::trace::device::TraceEvents;
use crate::model::split::{SplitMode, SplitOptions, TensorSplit};

/// Everything a command starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// hipscope's folders: under `HIPSCOPE_HOME`, else the platform's, else `.hipscope/`.
    pub dirs: Dirs,
    /// The settings file read (it need not exist: then the defaults apply).
    pub config_path: PathBuf,
    /// Whether the file was named (`--config`, `HIPSCOPE_CONFIG`) rather than the default one.
    pub named: bool,
    /// The file's settings over the defaults, with the environment's tuning knobs.
    pub config: Config,
    /// What the user should hear about the environment (a knob this CPU cannot honour).
    pub notes: Vec<String>,
}

impl Settings {
    /// The settings of this process: `flag` is `--config FILE`.
    pub fn resolve(flag: Option<&Path>) -> Result<Settings, ConfigError> {
        Settings::resolve_with(flag, Dirs::from_env(), &|k| std::env::var_os(k))
    }

    /// As [`Settings::resolve`], with the folders and the environment given (tests).
    pub fn resolve_with(
        flag: Option<&Path>,
        dirs: Dirs,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Settings, ConfigError> {
        let (config_path, named) = match (flag, env("HIPSCOPE_CONFIG").filter(|v| !v.is_empty())) {
            (Some(p), _) => (p.to_path_buf(), true),
            (None, Some(p)) => (PathBuf::from(p), true),
            (None, None) => (dirs.config.join("config.toml"), false),
        };
        let mut config = Config::load(&config_path)?;
        split_from_env(&mut config.split, env)?;
        let (tuning, notes) = Tuning::from_env(env)?;
        config.tuning = tuning;
        Ok(Settings {
            dirs,
            config_path,
            named,
            config,
            notes,
        })
    }
}

/// The value of environment variable `k`, trimmed; unset or empty: `None`.
fn env_value(env: &dyn Fn(&str) -> Option<OsString>, k: &str) -> Option<String> {
    env(k)
        .map(|v| v.to_string_lossy().trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The error for variable `key` set to `got`, with what it allows.
fn bad(key: &str, got: String, allowed: &str) -> ConfigError {
    ConfigError::Env {
        key: key.to_string(),
        got,
        allowed: allowed.to_string(),
    }
}

/// The split over several GPUs from the environment, over the config file's
/// (`HIPSCOPE_SPLIT_MODE`, `HIPSCOPE_TENSOR_SPLIT`, `HIPSCOPE_MAIN_GPU`, as llama.cpp's
/// `LLAMA_ARG_SPLIT_MODE`, …, and `HIPSCOPE_OP_OFFLOAD_MIN_BATCH`, its
/// `GGML_OP_OFFLOAD_MIN_BATCH`); a value that is not allowed names its variable.
pub fn split_from_env(
    split: &mut SplitOptions,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<(), ConfigError> {
    let get = |k: &str| env_value(env, k);
    if let Some(v) = get("HIPSCOPE_SPLIT_MODE") {
        split.mode = v
            .parse()
            .map_err(|_| bad("HIPSCOPE_SPLIT_MODE", v, SplitMode::ALLOWED))?;
    }
    if let Some(v) = get("HIPSCOPE_TENSOR_SPLIT") {
        split.tensor_split = Some(v.parse().map_err(|_| {
            bad(
                "HIPSCOPE_TENSOR_SPLIT",
                v,
                "proportions per GPU, such as 3,1",
            )
        })?);
    }
    if let Some(v) = get("HIPSCOPE_MAIN_GPU") {
        split.main_gpu = Some(
            v.parse()
                .map_err(|_| bad("HIPSCOPE_MAIN_GPU", v, "a GPU number from 0"))?,
        );
    }
    if let Some(v) = get("HIPSCOPE_OP_OFFLOAD_MIN_BATCH") {
        let n = v.parse::<usize>().ok().filter(|&n| n >= 1);
        split.offload_min_batch = Some(n.ok_or_else(|| {
            bad(
                "HIPSCOPE_OP_OFFLOAD_MIN_BATCH",
                v,
                "a whole number of tokens from 1",
            )
        })?);
    }
    Ok(())
}

/// `--split-mode`, `--tensor-split`, `--main-gpu`: every command that runs a model takes them
/// (llama.cpp's flags and meanings); laid over the settings' [`SplitOptions`] by
/// [`SplitArgs::over`].
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct SplitArgs {
    /// How a model is split over several GPUs: none (one GPU: --main-gpu, else --device, else
    /// the largest) or layer (the layers over every GPU of the runtime). Default: one GPU, or
    /// layer when the model does not fit one (also `-sm`; config `split_mode`).
    #[arg(long = "split-mode", value_name = "none|layer",
          value_parser = crate::model::split::parse_split_mode)]
    pub split_mode: Option<SplitMode>,
    /// The share of the layers each GPU takes, in the runtime's order, such as 3,1 (default: in
    /// proportion to each GPU's free memory; also `-ts`; config `tensor_split`).
    #[arg(long = "tensor-split", value_name = "A,B,…",
          value_parser = crate::model::split::parse_tensor_split)]
    pub tensor_split: Option<TensorSplit>,
    /// The GPU used with --split-mode none, as --device (also `-mg`; config `main_gpu`).
    #[arg(long = "main-gpu", value_name = "N")]
    pub main_gpu: Option<u32>,
    /// With layers on the CPU (-ngl): a prompt batch's CPU layers stay on the CPU instead of
    /// running on the GPU with their weights streamed up, as llama.cpp's --no-op-offload
    /// (config `op_offload = false`).
    #[arg(long = "no-op-offload")]
    pub no_op_offload: bool,
}

impl SplitArgs {
    /// The flags over `split` (the settings': environment over config over defaults).
    pub fn over(&self, split: &SplitOptions) -> SplitOptions {
        let mut s = split.clone();
        if let Some(m) = self.split_mode {
            s.mode = m;
        }
        if let Some(t) = &self.tensor_split {
            s.tensor_split = Some(t.clone());
        }
        if let Some(g) = self.main_gpu {
            s.main_gpu = Some(g);
        }
        s.no_op_offload |= self.no_op_offload;
        s
    }
}

/// The GPU to open first: `--device` (flag, else config), else `--main-gpu` (llama.cpp's name
/// for it); both naming different GPUs is a usage error.
pub fn first_gpu(device: Option<u32>, split: &SplitOptions) -> Result<Option<u32>, String> {
    match (device, split.main_gpu) {
        (Some(d), Some(m)) if d != m => Err(format!(
            "--device {d} and --main-gpu {m} name different GPUs; give one of them"
        )),
        (d, m) => Ok(d.or(m)),
    }
}

impl Tuning {
    /// The knobs from `env` (unset or empty: the default), and notes for the user. A value that
    /// is not one of the allowed ones is an error naming the variable.
    pub fn from_env(
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Tuning, Vec<String>), ConfigError> {
        let get = |k: &str| env_value(env, k);
        let mut t = Tuning::default();
        let mut notes = Vec::new();
        if let Some(want) = get("HIPSCOPE_CPU_ISA") {
            let isa = Isa::from_name(&want)
                .ok_or_else(|| bad("HIPSCOPE_CPU_ISA", want.clone(), "scalar, avx2 or avx512"))?;
            if isa.is_available() {
                t.cpu_isa = isa;
            } else {
                notes.push(format!(
                    "HIPSCOPE_CPU_ISA={want}: this CPU does not run it; using {}",
                    t.cpu_isa.name()
                ));
            }
        }
        if let Some(v) = get("HIPSCOPE_CPU_REPACK") {
            t.cpu_repack = match v.as_str() {
                "0" => false,
                "1" => true,
                _ => return Err(bad("HIPSCOPE_CPU_REPACK", v, "0 (off) or 1 (on)")),
            };
        }
        if let Some(v) = get("HIPSCOPE_PREFILL_GEMM") {
            t.prefill = v
                .parse()
                .map_err(|_| bad("HIPSCOPE_PREFILL_GEMM", v, "auto, blas, own or f32"))?;
        }
        if let Some(v) = get("HIPSCOPE_GEMM_MIN_TOKENS") {
            let n = v.parse::<usize>().ok().filter(|&n| n >= 1);
            t.gemm_min_tokens = Some(n.ok_or_else(|| {
                bad(
                    "HIPSCOPE_GEMM_MIN_TOKENS",
                    v,
                    "a whole number of tokens from 1",
                )
            })?);
        }
        if let Some(v) = get("HIPSCOPE_MV_ACT") {
            t.mv_act_f32 = match v.to_ascii_lowercase().as_str() {
                "f32" => true,
                "q8" => false,
                _ => return Err(bad("HIPSCOPE_MV_ACT", v, "f32 or q8")),
            };
        }
        if let Some(v) = get("HIPSCOPE_TRACE_EVENTS") {
            t.trace_events = match v.to_ascii_lowercase().as_str() {
                "stamps" => TraceEvents::Stamps,
                "ends" => TraceEvents::Ends,
                "pairs" => TraceEvents::Pairs,
                _ => return Err(bad("HIPSCOPE_TRACE_EVENTS", v, "stamps, pairs or ends")),
            };
        }
        if let Some(v) = get("HIPSCOPE_PDL") {
            t.launch_overlap = match v.as_str() {
                "0" => false,
                "1" => true,
                _ => return Err(bad("HIPSCOPE_PDL", v, "0 (off) or 1 (on)")),
            };
        }
        Ok((t, notes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::compute::{KvType, PrefillGemm};
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_flag_wins_over_the_environment_over_the_default_location() {
        let t = tempfile::tempdir().unwrap();
        let dirs = Dirs::under(t.path());
        std::fs::create_dir_all(&dirs.config).unwrap();
        std::fs::write(dirs.config.join("config.toml"), "ctx_size = 111\n").unwrap();
        let from_env = t.path().join("env.toml");
        std::fs::write(&from_env, "ctx_size = 222\n").unwrap();
        let from_flag = t.path().join("flag.toml");
        std::fs::write(&from_flag, "ctx_size = 333\n").unwrap();
        let e = env(&[("HIPSCOPE_CONFIG", from_env.to_str().unwrap())]);

        let s = Settings::resolve_with(None, dirs.clone(), &env(&[])).unwrap();
        assert_eq!((s.config.ctx_size, s.named), (Some(111), false));
        let s = Settings::resolve_with(None, dirs.clone(), &e).unwrap();
        assert_eq!((s.config.ctx_size, s.named), (Some(222), true));
        let s = Settings::resolve_with(Some(&from_flag), dirs.clone(), &e).unwrap();
        assert_eq!((s.config.ctx_size, s.config_path), (Some(333), from_flag));
        // No file at the default location: the defaults.
        let empty = Dirs::under(&t.path().join("none"));
        let s = Settings::resolve_with(None, empty, &env(&[])).unwrap();
        assert_eq!(s.config, Config::default());
    }

    #[test]
    fn tuning_knobs_come_from_the_environment_and_bad_values_name_the_variable() {
        let (t, notes) = Tuning::from_env(&env(&[
            ("HIPSCOPE_CPU_REPACK", "0"),
            ("HIPSCOPE_PREFILL_GEMM", "own"),
            ("HIPSCOPE_GEMM_MIN_TOKENS", "4"),
            ("HIPSCOPE_MV_ACT", "F32"),
            ("HIPSCOPE_CPU_ISA", "scalar"),
            ("HIPSCOPE_TRACE_EVENTS", "ends"),
            ("HIPSCOPE_PDL", "0"),
        ]))
        .unwrap();
        assert!(notes.is_empty());
        assert_eq!(
            t,
            Tuning {
                cpu_isa: Isa::Scalar,
                cpu_repack: false,
                prefill: PrefillGemm::Own,
                gemm_min_tokens: Some(4),
                mv_act_f32: true,
                trace_events: TraceEvents::Ends,
                launch_overlap: false,
            }
        );
        let c = t.compute(KvType::F32, false);
        assert_eq!(
            (c.prefill, c.gemm_min_tokens, c.mv_act_f32, c.graphs),
            (PrefillGemm::Own, 4, true, false)
        );
        assert_eq!(c.trace_events, TraceEvents::Ends);
        assert!(
            !c.launch_overlap,
            "HIPSCOPE_PDL=0 turns the default (on) off"
        );
        assert_eq!(t.cpu(3).threads, 3);
        assert!(!t.cpu(3).repack);
        assert_eq!(
            Tuning::from_env(&env(&[])).unwrap().0,
            Tuning::default(),
            "unset: the defaults"
        );
        for (k, v) in [
            ("HIPSCOPE_PREFILL_GEMM", "fast"),
            ("HIPSCOPE_GEMM_MIN_TOKENS", "0"),
            ("HIPSCOPE_CPU_ISA", "neon"),
            ("HIPSCOPE_CPU_REPACK", "no"),
            ("HIPSCOPE_TRACE_EVENTS", "all"),
            ("HIPSCOPE_PDL", "yes"),
        ] {
            let e = Tuning::from_env(&env(&[(k, v)])).unwrap_err();
            assert!(e.to_string().starts_with(&format!("{k}={v}")), "{e}");
        }
    }

    #[test]
    fn the_split_settings_come_from_flags_over_environment_over_config() {
        use crate::model::split::{SplitMode, TensorSplit};
        let t = tempfile::tempdir().unwrap();
        let dirs = Dirs::under(t.path());
        let file = t.path().join("c.toml");
        std::fs::write(
            &file,
            "split_mode = \"layer\"\ntensor_split = [3, 1]\nmain_gpu = 1\nop_offload = false\n",
        )
        .unwrap();
        let s = Settings::resolve_with(Some(&file), dirs.clone(), &env(&[])).unwrap();
        let from_file = s.config.split.clone();
        assert_eq!(
            from_file,
            SplitOptions {
                mode: SplitMode::Layer,
                tensor_split: Some(TensorSplit(vec![3.0, 1.0])),
                main_gpu: Some(1),
                no_op_offload: true,
                offload_min_batch: None,
            }
        );
        let e = env(&[
            ("HIPSCOPE_SPLIT_MODE", "none"),
            ("HIPSCOPE_TENSOR_SPLIT", "1,1"),
        ]);
        let s = Settings::resolve_with(Some(&file), dirs.clone(), &e).unwrap();
        assert_eq!(s.config.split.mode, SplitMode::None);
        assert_eq!(
            s.config.split.tensor_split,
            Some(TensorSplit(vec![1.0, 1.0]))
        );
        assert_eq!(
            s.config.split.main_gpu,
            Some(1),
            "the file's, not overridden"
        );
        // The flags over both.
        let flags = SplitArgs {
            split_mode: Some(SplitMode::Layer),
            tensor_split: None,
            main_gpu: Some(0),
            no_op_offload: false,
        };
        let o = flags.over(&s.config.split);
        assert!(
            o.no_op_offload,
            "the file's op_offload = false holds without the flag"
        );
        assert!(
            SplitArgs {
                no_op_offload: true,
                ..SplitArgs::default()
            }
            .over(&SplitOptions::default())
            .no_op_offload
        );
        assert_eq!(
            (o.mode, o.main_gpu, o.tensor_split.clone()),
            (SplitMode::Layer, Some(0), Some(TensorSplit(vec![1.0, 1.0])))
        );
        // --main-gpu picks the GPU --device would; naming two different ones is refused.
        assert_eq!(first_gpu(None, &o), Ok(Some(0)));
        assert_eq!(first_gpu(Some(0), &o), Ok(Some(0)));
        let e = first_gpu(Some(2), &o).unwrap_err();
        assert!(
            e.contains("--device 2") && e.contains("--main-gpu 0"),
            "{e}"
        );
        // A bad value names its variable or key.
        for (k, v) in [
            ("HIPSCOPE_SPLIT_MODE", "row"),
            ("HIPSCOPE_TENSOR_SPLIT", "a,b"),
            ("HIPSCOPE_MAIN_GPU", "-1"),
            ("HIPSCOPE_OP_OFFLOAD_MIN_BATCH", "0"),
        ] {
            let err = Settings::resolve_with(None, dirs.clone(), &env(&[(k, v)])).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{k}={v}")), "{err}");
        }
        std::fs::write(&file, "tensor_split = \"3;x\"\n").unwrap();
        let err = Settings::resolve_with(Some(&file), dirs, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("tensor_split"), "{err}");
    }
}
