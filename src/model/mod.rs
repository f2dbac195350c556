//! The engine as a service: GGUF files, tokenizer, chat template, forward pass, sampler, session,
//! synthetic models, and the worker thread with its command/event protocol.

pub mod gguf;
pub mod protocol;
