//! The kernel handles of the GPU backend: those every model launches, resolved when the device
//! opens; a weight type's and the experts', resolved when first needed — their units are loaded
//! then, and compiled first if the model's scope (`ComputeOptions::kernels`) left them out, so a
//! type or an expert op that was not foreseen still runs, one compile later.

use std::collections::HashMap;

use super::plan::{TYPE_TABLE, TypeKernels, type_kernels};
use super::units::{self, KernelScope};
use super::{BackendError, GpuCompute, Result, gpu_err, invalid};
use crate::gpu::backend::KvType;
use crate::gpu::device::GpuError;
use crate::gpu::handle::{Gpu, KernelFn};
use crate::gpu::kernels::{self, CompileMode, CompileProgress, KernelCache, KernelSources};
use crate::gpu::quant::GgmlType;

/// Kernel handles resolved at open: the ones of the sources every model launches.
pub(super) struct Kernels {
    pub rms_norm: KernelFn,
    pub rms_norm_add: KernelFn,
    pub add_bias: KernelFn,
    pub add: KernelFn,
    pub swiglu: KernelFn,
    pub geglu: KernelFn,
    pub scale: KernelFn,
    pub rope: KernelFn,
    pub kv_store_f32: KernelFn,
    pub kv_store_f16: KernelFn,
    pub rope_kv_store_f32: KernelFn,
    pub rope_kv_store_f16: KernelFn,
    pub attention_f32: KernelFn,
    pub attention_f16: KernelFn,
    pub attention_split_f32: KernelFn,
    pub attention_split_f16: KernelFn,
    pub attention_combine: KernelFn,
    /// The tiled prompt kernels, per cache type, head dimension and whether on the matrix
    /// units, once first needed.
    pub attention_tiled: HashMap<(&'static str, usize, bool), KernelFn>,
    pub quantize: KernelFn,
    pub quantize_f16: KernelFn,
    /// RMS norm that also quantizes its output for the products that follow.
    pub rms_norm_q8: KernelFn,
    /// Per weight type, once first needed.
    pub types: super::FastMap<GgmlType, TypeFns>,
    /// Per weight type, the experts' gate/up kernel, once first needed.
    pub gate_up: super::FastMap<GgmlType, KernelFn>,
    /// The mixture-of-experts kernels, once first needed.
    pub moe: Option<MoeFns>,
}

impl Kernels {
    pub fn resolve(gpu: &Gpu) -> std::result::Result<Kernels, GpuError> {
        Ok(Kernels {
            rms_norm: gpu.function("hs_rms_norm_rows")?,
            rms_norm_add: gpu.function("hs_rms_norm_add_rows")?,
            add_bias: gpu.function("hs_add_bias_rows")?,
            add: gpu.function("hs_add_inplace")?,
            swiglu: gpu.function("hs_swiglu_inplace")?,
            geglu: gpu.function("hs_geglu_inplace")?,
            scale: gpu.function("hs_scale_inplace")?,
            rope: gpu.function("hs_rope")?,
            kv_store_f32: gpu.function("hs_kv_store_f32")?,
            kv_store_f16: gpu.function("hs_kv_store_f16")?,
            rope_kv_store_f32: gpu.function("hs_rope_kv_store_f32")?,
            rope_kv_store_f16: gpu.function("hs_rope_kv_store_f16")?,
            attention_f32: gpu.function("hs_attention_f32")?,
            attention_f16: gpu.function("hs_attention_f16")?,
            attention_split_f32: gpu.function("hs_attention_split_f32")?,
            attention_split_f16: gpu.function("hs_attention_split_f16")?,
            attention_combine: gpu.function("hs_attention_combine")?,
            attention_tiled: HashMap::new(),
            quantize: gpu.function("hs_quantize_act")?,
            quantize_f16: gpu.function("hs_quantize_act_f16")?,
            rms_norm_q8: gpu.function("hs_rms_norm_q8")?,
            types: Default::default(),
            gate_up: Default::default(),
            moe: None,
        })
    }
}

/// The one-token kernels of a quantized type: mv1, qkv, swiglu.
#[derive(Clone, Copy)]
pub(super) struct OneToken {
    pub mv1: KernelFn,
    pub qkv: KernelFn,
    pub swiglu: KernelFn,
    /// The activation-precision study's variants (`ComputeOptions::mv_act_f32`, where the type has
    /// them): they take the f32 input where the others take its Q8 quants.
    pub f32: Option<[KernelFn; 3]>,
}

/// The kernels of one weight type, and its table row (names, labels, activation format).
#[derive(Clone, Copy)]
pub(super) struct TypeFns {
    pub k: TypeKernels,
    pub mv: KernelFn,
    /// Quantized types only.
    pub one: Option<OneToken>,
    pub dequant_rows: KernelFn,
    pub dequant_tile: KernelFn,
}

impl TypeFns {
    fn resolve(gpu: &Gpu, k: TypeKernels) -> std::result::Result<TypeFns, GpuError> {
        let n = &k.names;
        let one = if k.quantized() {
            Some(OneToken {
                mv1: gpu.function(n.mv1)?,
                qkv: gpu.function(n.qkv)?,
                swiglu: gpu.function(n.swiglu)?,
                f32: None,
            })
        } else {
            None
        };
        Ok(TypeFns {
            k,
            mv: gpu.function(n.mv)?,
            one,
            dequant_rows: gpu.function(n.dequant_rows)?,
            dequant_tile: gpu.function(n.dequant_tile)?,
        })
    }

    /// The study's f32-activation variants of mv1, qkv, swiglu.
    fn study(gpu: &Gpu, k: &TypeKernels) -> std::result::Result<[KernelFn; 3], GpuError> {
        let n = &k.names;
        Ok([
            gpu.function(n.mv1f)?,
            gpu.function(n.qkvf)?,
            gpu.function(n.swigluf)?,
        ])
    }
}

/// The mixture-of-experts kernels: routing, sorting, gather, combine, and the grouped products
/// (gate_up, down) of the types with their own and of the rest.
#[derive(Clone)]
pub(super) struct MoeFns {
    pub route: KernelFn,
    pub sort: KernelFn,
    pub gather: KernelFn,
    pub combine: KernelFn,
    mm: HashMap<&'static str, [KernelFn; 2]>,
}

impl MoeFns {
    fn resolve(gpu: &Gpu) -> std::result::Result<MoeFns, GpuError> {
        let mut mm = HashMap::new();
        let own = TYPE_TABLE
            .iter()
            .filter(|k| k.grouped_own)
            .map(|k| k.suffix);
        for sfx in own.chain(["any"]) {
            let g = |kind: &str| gpu.function(&format!("hs_moe_mm_{kind}_{sfx}"));
            mm.insert(sfx, [g("gate_up")?, g("down")?]);
        }
        Ok(MoeFns {
            route: gpu.function("hs_moe_route")?,
            sort: gpu.function("hs_moe_sort")?,
            gather: gpu.function("hs_moe_gather")?,
            combine: gpu.function("hs_moe_combine")?,
            mm,
        })
    }

    /// The grouped products (gate_up, down) of a quantized type.
    pub fn mm(&self, k: &TypeKernels) -> [KernelFn; 2] {
        self.mm[if k.grouped_own { k.suffix } else { "any" }]
    }
}

/// How the backend compiles what it loads after opening.
#[derive(Clone, Debug)]
pub(super) struct CompileCtx {
    pub cache: KernelCache,
    pub mode: CompileMode,
}

/// The units of `scope`, from the kernel sources this process compiles
/// (`HIPSCOPE_KERNELS=DIR`, else the embedded ones).
pub fn scope_units(scope: KernelScope) -> std::result::Result<Vec<kernels::KernelUnit>, GpuError> {
    units::kernel_units(&KernelSources::load()?, scope)
}

/// Compiles (or takes from the cache) `units` for the device and loads them.
pub(super) fn load_units(
    gpu: &mut Gpu,
    ctx: &CompileCtx,
    units: &[kernels::KernelUnit],
    progress: &mut dyn FnMut(&CompileProgress),
) -> std::result::Result<Vec<kernels::KernelBuild>, GpuError> {
    gpu.prepare_kernels(&ctx.cache, &ctx.mode, units, progress)
}

impl GpuCompute {
    /// The kernels of weight type `ty`, loading (and compiling) its units at first need.
    pub(super) fn type_fns(&mut self, ty: GgmlType) -> Result<TypeFns> {
        if let Some(f) = self.kernels.types.get(&ty) {
            return Ok(*f);
        }
        let k = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no GPU kernels")))?;
        let mut fns = self.resolve_or_load(
            |g| TypeFns::resolve(g, k),
            |s| units::type_units(s, ty, false, false),
        )?;
        if k.f32_study && self.opts.mv_act_f32 {
            let study = self.resolve_or_load(
                |g| TypeFns::study(g, &k),
                |s| units::type_units(s, ty, false, true),
            )?;
            if let Some(one) = fns.one.as_mut() {
                one.f32 = Some(study);
            }
        }
        self.kernels.types.insert(ty, fns);
        Ok(fns)
    }

    /// The experts' gate/up kernel of weight type `ty` (`hs_mv_gate_up_*`: chunks of several
    /// entries, and float experts), loading (and compiling) its unit at first need.
    pub(super) fn gate_up_fn(&mut self, ty: GgmlType) -> Result<KernelFn> {
        if let Some(f) = self.kernels.gate_up.get(&ty) {
            return Ok(*f);
        }
        let k = type_kernels(ty).ok_or_else(|| invalid(format!("{ty} has no GPU kernels")))?;
        let f = self.resolve_or_load(
            |g| g.function(k.names.gate_up),
            |s| units::type_units(s, ty, true, false),
        )?;
        self.kernels.gate_up.insert(ty, f);
        Ok(f)
    }

    /// The tiled prompt attention for a cache of `kv` and heads of `head_dim` (`mma`: the
    /// matrix units' kernel of the same unit), loading (and compiling) its unit at first need.
    pub(super) fn tiled_fn(&mut self, kv: KvType, head_dim: usize, mma: bool) -> Result<KernelFn> {
        let key = (kv.name(), head_dim, mma);
        if let Some(f) = self.kernels.attention_tiled.get(&key) {
            return Ok(*f);
        }
        let which = if mma { "mma" } else { "tiled" };
        let name = format!("hs_attention_{which}_{}_{head_dim}", kv.name());
        let f = self.resolve_or_load(
            |g| g.function(&name),
            |s| units::attention_unit(s, kv, head_dim).map(|u| vec![u]),
        )?;
        self.kernels.attention_tiled.insert(key, f);
        Ok(f)
    }

    /// The mixture-of-experts kernels, loading (and compiling) their units at first need.
    pub(super) fn moe_fns(&mut self) -> Result<MoeFns> {
        if let Some(m) = &self.kernels.moe {
            return Ok(m.clone());
        }
        let fns = self.resolve_or_load(MoeFns::resolve, units::moe_units)?;
        self.kernels.moe = Some(fns.clone());
        Ok(fns)
    }

    /// `resolve` on the loaded kernels; where one is missing, the `units` that define them loaded
    /// (compiled first where the cache has none) and `resolve` again.
    fn resolve_or_load<T>(
        &mut self,
        resolve: impl Fn(&Gpu) -> std::result::Result<T, GpuError>,
        units: impl FnOnce(&KernelSources) -> std::result::Result<Vec<kernels::KernelUnit>, GpuError>,
    ) -> Result<T> {
        match resolve(self.live()?) {
            Ok(x) => Ok(x),
            Err(GpuError::UnknownKernel { .. }) => {
                let u = units(&KernelSources::load().map_err(gpu_err)?).map_err(gpu_err)?;
                self.load_more(&u)?;
                resolve(self.live()?).map_err(gpu_err)
            }
            Err(e) => Err(gpu_err(e)),
        }
    }

    fn live(&self) -> Result<&Gpu> {
        self.gpu
            .as_ref()
            .ok_or_else(|| BackendError::Device("the device was shut down".into()))
    }

    /// Units the open did not load: compiled (a first need after the start, so said in the log)
    /// and loaded.
    fn load_more(&mut self, units: &[kernels::KernelUnit]) -> Result<()> {
        let ctx = self.compile.clone();
        let names: Vec<&str> = units.iter().map(|u| u.name.as_str()).collect();
        tracing::info!("loading kernel units {names:?} at their first use");
        let g = self.gpu_mut()?;
        let builds = load_units(g, &ctx, units, &mut |p| tracing::info!("{}", p.describe()))
            .map_err(gpu_err)?;
        self.builds.extend(builds);
        Ok(())
    }
}
