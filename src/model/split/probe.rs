//! The memory plan a model load would make, found without loading it: a backend that records
//! the plan it is told and refuses to go on ([`model_plan`]).

use std::sync::{Arc, Mutex};

use crate::gpu::backend::{
    BackendError, Buf, Instrument, KvLayout, KvShift, KvType, Memory, MemoryPlan, MoeFfn, OpLabel,
    Ops, RopeParams, Weight, WeightData,
};
use crate::gpu::snapshot::{ArenaSnapshot, DeviceSummary};
use crate::model::forward::{Model, ModelError, ModelOptions};
use crate::model::gguf::GgufFile;

/// The memory plan `Model::load` will make for `file` with `options`, without loading anything:
/// the load runs until it tells its backend the plan (a probe that keeps it and stops there).
pub fn model_plan(file: &Arc<GgufFile>, options: ModelOptions) -> Result<MemoryPlan, ModelError> {
    let seen = Arc::new(Mutex::new(None));
    match Model::load(
        file.clone(),
        Box::new(PlanProbe { plan: seen.clone() }),
        options,
        &mut |_, _| {},
    ) {
        Ok(_) => {}
        Err(ModelError::Backend(BackendError::Unsupported(m))) if m == PROBE_DONE => {}
        Err(e) => return Err(e),
    }
    let plan = *seen.lock().unwrap_or_else(|e| e.into_inner());
    plan.ok_or_else(|| {
        ModelError::Backend(BackendError::Invalid(
            "loading the model made no memory plan".into(),
        ))
    })
}

const PROBE_DONE: &str = "memory plan probe: done";

/// A backend that only records the plan it is told, then refuses to go on.
struct PlanProbe {
    plan: Arc<Mutex<Option<MemoryPlan>>>,
}
impl Ops for PlanProbe {
    fn embed(&mut self, _: Weight, _: &[u32], _: Buf) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rms_norm(
        &mut self,
        _: Buf,
        _: Weight,
        _: Buf,
        _: usize,
        _: usize,
        _: f32,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn matmul(
        &mut self,
        _: Weight,
        _: Buf,
        _: Buf,
        _: usize,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn matmul_qkv(
        &mut self,
        _: [Weight; 3],
        _: [Option<Weight>; 3],
        _: Buf,
        _: [Buf; 3],
        _: usize,
        _: u32,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &mut self,
        _: Weight,
        _: Weight,
        _: Buf,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: crate::gpu::backend::Glu,
        _: u32,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_add(
        &mut self,
        _: Buf,
        _: Weight,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: f32,
        _: OpLabel,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    #[allow(clippy::too_many_arguments)]
    fn matmul_add(
        &mut self,
        _: Weight,
        _: Buf,
        _: Buf,
        _: Buf,
        _: usize,
        _: usize,
        _: OpLabel,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn moe_ffn(&mut self, _: &MoeFfn) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn add_bias(
        &mut self,
        _: Buf,
        _: Weight,
        _: usize,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rope(
        &mut self,
        _: Buf,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: &RopeParams,
        _: OpLabel,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn attention(
        &mut self,
        _: Buf,
        _: Buf,
        _: Buf,
        _: Buf,
        _: &crate::gpu::backend::AttnParams,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rope_attention(
        &mut self,
        _: Buf,
        _: Buf,
        _: Buf,
        _: Buf,
        _: &crate::gpu::backend::HeadNorms,
        _: &RopeParams,
        _: &crate::gpu::backend::AttnParams,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn rope_attention_rows(
        &mut self,
        _: Buf,
        _: Buf,
        _: Buf,
        _: Buf,
        _: &crate::gpu::backend::HeadNorms,
        _: &RopeParams,
        _: &crate::gpu::backend::AttnParams,
        _: &[crate::gpu::backend::SeqPos],
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn swiglu(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn geglu(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn scale(&mut self, _: Buf, _: usize, _: f32, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn add(&mut self, _: Buf, _: Buf, _: usize, _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn set_exact_rows_below(&mut self, _: usize) {}
    fn copy(
        &mut self,
        _: Buf,
        _: usize,
        _: Buf,
        _: usize,
        _: usize,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
}

impl Memory for PlanProbe {
    fn plan(&mut self, plan: &MemoryPlan) -> crate::gpu::backend::Result<()> {
        *self.plan.lock().unwrap_or_else(|e| e.into_inner()) = Some(*plan);
        Err(BackendError::Unsupported(PROBE_DONE.into()))
    }
    fn plan_bytes(&self, _: &MemoryPlan) -> Option<u64> {
        None
    }
    fn load_weight(&mut self, _: &WeightData) -> crate::gpu::backend::Result<Weight> {
        Err(probe())
    }
    fn alloc(&mut self, _: &'static str, _: usize) -> crate::gpu::backend::Result<Buf> {
        Err(probe())
    }
    fn stage_weights(&mut self, _: &[WeightData]) -> crate::gpu::backend::Result<Vec<Weight>> {
        Err(probe())
    }
    fn alloc_kv_cache(&mut self, _: &KvLayout) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn kv_rows_out(
        &mut self,
        _: usize,
        _: usize,
        _: std::ops::Range<usize>,
        _: &mut Vec<u8>,
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn kv_rows_in(
        &mut self,
        _: usize,
        _: usize,
        _: usize,
        _: &[u8],
    ) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn pin_host(
        &mut self,
        _: &crate::gpu::backend::SharedBytes,
        _: std::ops::Range<usize>,
    ) -> crate::gpu::backend::Result<bool> {
        Err(probe())
    }
    fn kv_type(&self) -> KvType {
        KvType::F32
    }
    fn kv_shift(&mut self, _: &KvShift) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn read(&mut self, _: Buf, _: usize, _: &mut [f32]) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn write(&mut self, _: Buf, _: usize, _: &[f32]) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn cross_out(&mut self, _: Buf, _: &mut [f32], _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn cross_in(&mut self, _: Buf, _: &[f32], _: OpLabel) -> crate::gpu::backend::Result<()> {
        Err(probe())
    }
    fn arena(&self) -> ArenaSnapshot {
        ArenaSnapshot::default()
    }
}

impl Instrument for PlanProbe {
    fn device(&self) -> DeviceSummary {
        DeviceSummary::default()
    }
}

fn probe() -> BackendError {
    BackendError::Unsupported(PROBE_DONE.into())
}
